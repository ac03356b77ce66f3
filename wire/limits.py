"""Every size limit of the wire layer, as a named constant with its unit last.

A decoder checks each length it reads against one of these before it allocates or slices.
"""

from __future__ import annotations

# Frames -------------------------------------------------------------------------------

# Largest request frame a broker accepts (Kafka's socket.request.max.bytes default: 100 MiB).
frame_bytes_max = 100 * 1024 * 1024

# Kafka primitives ----------------------------------------------------------------------

# A string's length is an int16 (non-flexible) or varint (flexible); Kafka caps both at 32767.
string_bytes_max = 32767
# Arrays in a request: no real client sends more elements than this many (topics x partitions).
array_length_max = 1_000_000
# bytes/records fields cannot be longer than the frame that holds them.
bytes_field_bytes_max = frame_bytes_max
# Tagged fields per struct and bytes per tagged field.
tagged_fields_max = 1024
tagged_field_bytes_max = 1024 * 1024

# Record batches -------------------------------------------------------------------------

# The v2 batch header is 61 bytes; a batch shorter than that is corrupt.
batch_header_bytes = 61
# Largest single record batch accepted (Kafka's message.max.bytes default is 1 MiB + overhead;
# the broker's configured limit applies on top of this absolute ceiling).
batch_bytes_max = 64 * 1024 * 1024
# Records in one batch (bounds the decode loop and the per-record allocations).
batch_records_max = 10_000_000
# Decompressed size of one batch's record area (guards against compression bombs).
decompressed_bytes_max = 256 * 1024 * 1024
# Headers on one record.
record_headers_max = 100_000
