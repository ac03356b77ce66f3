"""Every size limit and on-disk format constant of the storage layer, unit last.

The log checks what it reads back from disk against these before trusting a length, and the
defaults here are what `LogConfig` starts from.
"""

from __future__ import annotations

from wire import limits as wire_limits

# Segments ---------------------------------------------------------------------------------

# Roll the active segment when the next batch would take it past this (Kafka log.segment.bytes).
segment_bytes_default = 128 * 1024 * 1024
# Roll the active segment when its first append is older than this (Kafka log.roll.ms, 7 days).
segment_ms_default = 7 * 24 * 3600 * 1000
# Roll the active segment when either of its index files would pass this (Kafka
# segment.index.bytes, 10 MiB).
segment_index_bytes_default = 10 * 1024 * 1024
# One offset-index entry per this many bytes of log (Kafka log.index.interval.bytes).
index_interval_bytes_default = 4096
# Index entries hold file positions as int32, so a segment cannot grow past this.
segment_bytes_max = 2**31 - 1
# Index entries hold offsets relative to the segment base as int32; roll before overflowing.
relative_offset_max = 2**31 - 1
# Segment files are named by their base offset, zero-padded to this many digits (as Kafka does).
segment_name_digits = 20

# Batches read back from disk --------------------------------------------------------------

# A v2 batch header; scans read this much per batch and never decode the records.
batch_header_bytes = wire_limits.batch_header_bytes
# A batch on disk larger than this is corruption, not data (the produce path never accepts one).
batch_bytes_max = wire_limits.batch_bytes_max

# Index files ------------------------------------------------------------------------------

# .index entry: relative offset int32, file position int32.
offset_index_entry_bytes = 8
# .timeindex entry: max timestamp int64, relative offset int32.
time_index_entry_bytes = 12
# An index file larger than this cannot describe a segment of at most segment_bytes_max
# (one entry per batch at worst, a batch being at least a header).
index_file_bytes_max = (segment_bytes_max // batch_header_bytes + 1) * time_index_entry_bytes

# Reads on a shard's loop (storage/page_cache.py) -------------------------------------------

# A batch header missing from the page cache brings in this much from there on the I/O pool:
# the headers a lookup scans next and, usually, the batches a fetch then sends.
cold_read_ahead_bytes = 1024 * 1024
# Bytes one warming read call takes (each I/O thread keeps one buffer this large).
warm_read_bytes = 256 * 1024

# Recovery ---------------------------------------------------------------------------------

# Recovery reads a segment in chunks this large to check CRCs without loading the whole file.
recovery_read_bytes = 1024 * 1024

# Compaction (storage/compaction.py) -------------------------------------------------------

# Distinct keys one clean can deduplicate. The key map holds a 16-byte digest and an offset per
# key, ~150 bytes an entry in a Python dict, so this stands for ~75 MiB (Kafka's default
# log.cleaner.dedupe.buffer.size, 128 MiB, holds ~5M keys at 24 bytes). A dirty range with more
# keys is cleaned over several passes.
cleaner_key_map_entries_max = 500_000
# Bytes a clean reads plus writes per second, compressed batches counted at what they decode
# to (Kafka log.cleaner.io.max.bytes.per.second, unlimited by default). A clean decodes and
# encodes every record under the GIL its shard's loop needs too: this keeps it to about a fifth
# of a core.
cleaner_io_bytes_per_second_default = 8 * 1024 * 1024
# A clean reads segments in chunks this large (a larger batch is read whole).
cleaner_read_bytes = 1024 * 1024
# A clean writes a cleaned segment out whenever this much has gathered.
cleaner_write_bytes = 1024 * 1024
# The throttle sleeps only once it is this far ahead: fewer, longer sleeps.
cleaner_sleep_min_ms = 10
# Kafka's topic defaults: delete.retention.ms (tombstones stay a day after their first clean),
# min.cleanable.dirty.ratio, and max.compaction.lag.ms (no limit).
delete_retention_ms_default = 24 * 3600 * 1000
min_cleanable_dirty_ratio_default = 0.5
max_compaction_lag_ms_default = 2**63 - 1

# Direct mode (storage/appender.py): a shard's write memory, in chunks of this size...
direct_chunk_bytes = 128 * 1024
# ... and in all (`direct_memory_bytes`, a node setting, defaults to this).
direct_memory_bytes_default = 64 * 1024 * 1024
# Blocks reserved ahead of a segment's end (fallocate): the first step, the largest, and how
# soon a step must be used up for the next to double.
direct_reserve_min_bytes = 1024 * 1024
direct_reserve_max_bytes = 32 * 1024 * 1024
direct_reserve_grow_s = 1.0
# Direct-mode reads of what the writer no longer holds (storage/direct_read.py): a shard's
# read windows in all, and a miss's read: at least the first size, doubling for a sequential
# reader up to the second.
direct_read_memory_bytes = 16 * 1024 * 1024
direct_read_ahead_min_bytes = 64 * 1024
direct_read_ahead_max_bytes = 1024 * 1024
