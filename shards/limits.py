"""Every limit of the shard layer, as a named constant with its unit last."""

from __future__ import annotations

# Threads per shard for blocking calls (fdatasync, large reads). fdatasyncs of different
# partitions run in parallel on the device; more threads than this only add GIL churn.
io_threads = 4
# Pending connections the kernel queues per shard before accept.
listen_backlog = 1024
# Connections accepted per readiness event before the loop serves other work.
accepts_per_turn_max = 64
# Time a shard has to flush and close its logs on SIGTERM before the supervisor kills it.
shard_stop_timeout_s = 30.0
# Time the shard's loop keeps running after the stop request to let actors finish.
shard_drain_timeout_s = 10.0
# Open files a shard asks for (segments keep their files open while the log is open).
open_files_wanted = 65536
# Segment files of other shards kept open for sendfile (cross-core fetches), least recently
# used closed first. A cached fd keeps a deleted segment's disk space until it is closed.
remote_segment_fds_max = 1024
# Bytes in flight per shard (requests read but not answered, plus pipe backlog) before its
# connections stop reading: bounds memory under any load. A few full-size produce requests
# per connection fit many times over.
shard_memory_budget_bytes = 256 * 1024 * 1024
