"""Every limit of the group coordinator, as a named constant with its unit last."""

from __future__ import annotations

# Kafka's group.min.session.timeout.ms / group.max.session.timeout.ms: a JoinGroup outside
# this range is answered INVALID_SESSION_TIMEOUT.
session_timeout_ms_min = 6_000
session_timeout_ms_max = 1_800_000

# Kafka's group.max.size is unbounded by default; a bound keeps one group's memory finite.
members_per_group_max = 1_000

# Requests queued while `__consumer_offsets` is created or their group's partition loads
# (then served in arrival order); beyond this they are answered COORDINATOR_LOAD_IN_PROGRESS
# and the client retries.
requests_waiting_for_load_max = 10_000

# Bytes read from an offsets partition per Read while loading it (at start, or when its
# leadership comes here).
load_read_bytes_max = 4 * 1024 * 1024

# Kafka's offset.metadata.max.bytes: longer commit metadata is OFFSET_METADATA_TOO_LARGE.
offset_metadata_chars_max = 4096
