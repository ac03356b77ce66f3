"""The generator of `wire.messages` from Kafka's JSON message specs (see `generate.py`)."""
