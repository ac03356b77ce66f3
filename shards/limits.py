"""Every limit of the shard layer, as a named constant with its unit last."""

from __future__ import annotations

# Threads per shard for blocking calls (fdatasync, large reads). fdatasyncs of different
# partitions run in parallel on the device; more threads than this only add GIL churn.
io_threads = 4
# Threads per shard for bulk reads from the disk (cold data brought into the page cache,
# large Spark reads): apart from the fdatasync threads, so no flush queues behind a read.
# Two keep a second cold reader from waiting behind the first; more only add seeks.
read_io_threads = 2
# Threads of the shard's log cleaner (compaction): one, as Redpanda's one compaction per shard.
cleaner_threads = 1
# Calls (fdatasyncs) one I/O job takes before another thread is woken for the rest: up to
# this many partitions flushed in one loop turn cost one wake-up (shards/io_pool.py).
io_calls_per_job = 4
# A loop stall's stack is logged at most once per this long (shards/loop_watch.py); the stalls
# between are counted, and the count is in the next line logged.
loop_stall_log_interval_s = 10.0
# Pending connections the kernel queues per shard before accept.
listen_backlog = 1024
# Connections accepted per readiness event before the loop serves other work.
accepts_per_turn_max = 64
# Kafka connections one node keeps open (node setting kafka_connections_max): each holds a
# socket, a frame buffer and up to connection_inflight_requests_max requests; split evenly
# over the accepting shards, well inside open_files_wanted.
kafka_connections_max = 10_000
# Partitions one shard may own (node setting topic_partitions_per_shard, Redpanda's default):
# each is an actor with open segment files; a client creating topics without end is refused.
topic_partitions_per_shard = 1000
# One log line per this many connections refused over the limit (the first one included).
refused_connections_log_every = 1000
# Time a shard has to flush and close its logs on SIGTERM before the supervisor kills it.
shard_stop_timeout_s = 30.0
# The supervisor looks at its shards this often even without a signal (SIGCHLD wakes it).
supervisor_poll_s = 1.0
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

# Free space on the data disk (storage/free_space.py) -----------------------------------------
# Produces are refused with KAFKA_STORAGE_ERROR while the data directory's filesystem has less
# than this free (node setting storage_min_free_bytes). Redpanda's default is 5 GiB; 1 GiB
# holds what every shard can append between two looks many times over (a full memory budget,
# 256 MiB, of produces in flight), room for a clean or a segment swap, and still fits the
# small disks of CI machines and laptops.
storage_min_free_bytes = 1024 * 1024 * 1024
# Each shard looks at its data directory's free space (statvfs, on its read pool) this often;
# between looks it counts what it appends.
disk_space_check_interval_s = 1.0

# Pipes between shards (shards/pipes.py) ---------------------------------------------------
# Messages ZeroMQ queues on each end of one pipe (SNDHWM on the writer, RCVHWM on the reader).
# Messages carry batches (up to message_max_bytes), so this bounds a pipe's memory to a few
# hundred batches; past it the writer's local backlog takes over and the shard slows down.
pipe_high_water_mark_messages = 128
# Messages a reader hands to the shard per loop turn before yielding to sockets and actors.
pipe_receive_messages_per_turn_max = 256
# Backlogged messages a writer pushes into ZeroMQ per loop turn before yielding.
pipe_flush_messages_per_turn_max = 256
# Messages for one peer gathered into one pipe message per loop turn (their headers share
# the pipe's header limit below: ~100 bytes each).
pipe_batch_messages_max = 256
# Longest a produce's phase-one answer ("dispatched") waits for another pipe message to the
# same shard to ride with (shards/router.py). It frees the source's arena region; a flush
# (phase two) usually takes it along sooner.
pipe_lazy_answer_delay_s = 0.005
# A header carries type, correlation, partition and sizes: anything bigger is our bug.
pipe_header_bytes_max = 64 * 1024
# Each shard's shared-memory arena (shards/arena.py): large produce frames are received into
# it, and batches cross to other shards from it. A region lives until every partition's phase
# one, a few ms at most; this holds a dozen full 1 MiB requests in flight. A frame or batch
# that finds no room gets a fresh buffer or goes as a pipe frame instead.
pipe_arena_bytes = 16 * 1024 * 1024
# One log line per this many batches that found the arena full (the first one included).
arena_miss_log_every = 10_000
# sun_path is 108 bytes on Linux; keep a margin so a long run_dir fails here, loudly.
pipe_path_chars_max = 100

# Node RPC between nodes (shards/node_mesh.py) ---------------------------------------------
# Messages ZeroMQ queues toward one peer shard (SNDHWM) and from each peer into one shard
# (RCVHWM). A message is one loop turn's traffic to one shard (up to pipe_batch_messages_max
# calls), so with the kernel's socket buffers this keeps a link busy; past it the local
# backlog below takes over. Lower than the pipes': a dead peer holds what it holds here
# until it comes back or is removed.
node_rpc_high_water_mark_messages = 64
# Messages, and bytes, waiting in one peer shard's local backlog once ZeroMQ's queue is full.
# Past either, a send to that peer is refused and the peer reported unreachable: Raft stops
# pipelining to it (actors/raft: report_unreachable) and probes later. 64 MiB is two of
# Raft's in-flight windows to one follower (actors/raft/limits.py: inflight_bytes_max).
node_rpc_backlog_messages_max = 256
node_rpc_backlog_bytes_max = 64 * 1024 * 1024
# The largest frame a peer may send (ZMQ_MAXMSGSIZE, checked per frame): a payload frame is
# one record batch, and Kafka's max.message.bytes is a topic setting that may be raised; a
# connection that sends more is dropped rather than allocated for.
node_rpc_frame_bytes_max = 128 * 1024 * 1024
# Messages the inbound socket hands to the shard per loop turn before yielding, and backlogged
# messages a writer pushes into ZeroMQ per turn (as the pipes).
node_rpc_receive_messages_per_turn_max = 256
node_rpc_flush_messages_per_turn_max = 256
# A call to another node's shard that has had no answer for this long (since it was sent or
# since its last answer) is answered UNREACHABLE (shards/router.py): ZeroMQ reconnects by
# itself, but a message lost with a connection, or a node that is gone, would leave its
# caller waiting forever. Well past an fdatasync's worst case and Raft's election timeout
# (1-2 s), so a slow peer is not mistaken for a dead one.
node_rpc_call_timeout_s = 5.0
# ZeroMQ's reconnect to a peer: first after this, doubling up to the maximum, so a dead node
# costs its peers a connection attempt twice a second, not ten times.
node_rpc_reconnect_interval_s = 0.1
# At most half a second: a restarted node is a Raft follower to catch up, and each of its
# leaders' shards reconnects on its own (bench cluster_catch_up waited 1.4-1.9 s at 2 s);
# a dead node costs one refused TCP connect per peer shard twice a second.
node_rpc_reconnect_interval_max_s = 0.5
# A TCP connect that has not completed in this long is abandoned and retried (a host that
# drops SYNs would otherwise hold it for the kernel's ~2 minutes).
node_rpc_connect_timeout_s = 2.0
# A dead peer is found by the kernel, not by ZMTP heartbeats (which make libzmq 4.3.5 abort
# a shard resumed after a pause: shards/node_mesh.py says why). TCP_USER_TIMEOUT
# (ZMQ_TCP_MAXRT): a connection whose sent bytes have gone unacknowledged this long is closed
# and reconnected, where a half-open connection to a crashed host would otherwise wait for
# its retransmissions to give up (~15 minutes). The heartbeats' old timeout.
node_rpc_tcp_user_timeout_s = 3.0
# TCP keepalive on every node RPC connection, for one with nothing unacknowledged (a PULL
# end sends nothing; an idle PUSH): probed after this long idle, then every interval (whole
# seconds); the user timeout above, not a probe count, closes it once the probes go
# unanswered that long (tcp(7)). A paused peer's kernel still answers them.
node_rpc_keepalive_idle_s = 1
node_rpc_keepalive_interval_s = 1
# One log line per this many refused sends, and per this many unreadable messages, from one
# peer node (the first one included).
node_rpc_log_every = 1000

# The Spark reader endpoint (shards/reader.py) -----------------------------------------------
# Requests taken off the socket per loop turn before the shard serves its other work.
reader_requests_per_turn_max = 64
# Requests waiting on partitions at once; past it a request gets ERROR_BUSY. With replies of
# up to protocol.fetch_bytes_max this bounds the endpoint's memory to ~2 GiB worst case, in
# practice a few clients with one or two requests each.
reader_requests_in_flight_max = 256
# Messages ZeroMQ queues per client (both ways). A client waits for each reply, so a handful
# is plenty; past it ROUTER drops the reply and that client's request times out.
reader_high_water_mark_messages = 64
# Slices up to this size are pread on the loop thread (page cache: a few µs); larger ones go
# to the I/O pool so a big fetch never stalls the shard's other work.
reader_inline_read_bytes_max = 256 * 1024

# The stats endpoint (shards/stats.py), read by the supervisor's admin server -----------------
# Only the supervisor asks, one request per scrape per shard: a handful in flight at most.
stats_requests_per_turn_max = 8
stats_high_water_mark_messages = 16
stats_request_bytes_max = 4096
# How long the admin server waits for a shard's snapshot before it reports it unready.
stats_timeout_s = 5.0
# Admin HTTP requests (shards/admin.py) served at once; past it a request gets 503 at once.
# Each may ask every shard for a snapshot, so a flood of scrapes must not queue without end.
admin_requests_in_flight_max = 16
# An admin connection that sends nothing for this long is closed (it holds a thread).
admin_socket_timeout_s = 10.0
# Longest delay a failure probe may add to each fdatasync (/v1/failure-probes): a minute
# keeps a mistyped figure from hanging a node's flushes for hours.
failure_probe_delay_ms_max = 60_000
# Leaderless partitions /v1/cluster/health_overview lists by name (all are counted).
health_partitions_listed_max = 100

# Every shard tells every other shard of the cluster who leads the partitions it leads this
# often, besides at once on each change: a node that starts, or missed a report while cut off,
# learns every leader within this long.
leader_refresh_interval_s = 2.0
# Leader reports in one message at most (a shard leading thousands sends several).
leader_updates_per_message_max = 500
# A cluster's node stopping cleanly hands the leadership of every group its shard leads to a
# follower first (shards/shard_cluster.py); it waits this long for the transfers, then stops anyway.
leadership_transfer_timeout_s = 1.0

# The learner recovery throttle's burst (actors/recovery_throttle.py): this many seconds of its
# rate, and at least this many bytes (one append of a catching-up learner goes at once).
recovery_burst_s = 0.1
recovery_burst_bytes_min = 1 << 20
