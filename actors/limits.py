"""Every limit of the actor layer, as a named constant with its unit last."""

from __future__ import annotations

# Messages one actor handles per loop turn before yielding: keeps sockets and other actors fed.
inbox_drain_messages_max = 64

# Requests a connection decodes and dispatches while earlier responses are still pending.
# librdkafka pipelines up to max.in.flight (5 by default, 1M max); this bounds memory per socket.
connection_inflight_requests_max = 1000
# Bytes of encoded responses queued on one socket before the connection stops reading
# (the client is not draining its socket).
connection_send_queue_bytes_max = 64 * 1024 * 1024
# Largest response body a connection keeps to send again (an idle consumer's repeated
# answer): one per connection, so 10,000 connections hold at most ~650 MB in the worst case
# and a few MB in practice (a fetch answer of 48 idle partitions: 2 KB).
connection_memo_bytes_max = 64 * 1024
# Bytes the connection reads per recv call (one syscall per this many bytes at most).
connection_recv_bytes_max = 256 * 1024

# A read that missed the page cache is retried after the I/O pool reads its range in; one that
# misses this many times (memory too tight to keep what was read) reads from the disk.
cold_read_attempts_max = 3

# Fetch long-poll ceiling: clients send fetch.wait.max.ms (500 ms by default); cap it.
fetch_wait_ms_max = 30_000
# Bytes one fetch response may carry, whatever the client asks (Kafka's fetch.max.bytes: 50 MiB).
fetch_response_bytes_max = 55 * 1024 * 1024

# Idempotent producers: Kafka keeps the last 5 batches per producer for duplicate detection
# (max.in.flight.requests.per.connection <= 5 with idempotence).
producer_batches_remembered = 5
# Idempotent producers one partition remembers (each: its epoch and last 5 batches, a few
# hundred bytes); past it the one that wrote least recently is forgotten. Producers that
# InitProducerId again and again cannot grow a partition's memory without end.
producer_ids_per_partition_max = 1000
# Transactions open at once on one partition (each: a producer id and an offset). A
# transactional batch that would open one more is refused CONCURRENT_TRANSACTIONS
# (retriable); the coordinator's transaction timeout aborts the ones left open.
transactions_open_per_partition_max = 1000
# Record errors one produce answer lists (KIP-467: each a keyless record of a compacted topic,
# ~100 bytes with its message, so ~1 MB at most). A batch with more fails the rest of them as
# librdkafka fails the batch's other records: "an invalid record in the same batch".
record_errors_max = 10_000
# Aborted transactions one partition lists for read_committed fetches (each: three ints,
# ~100 bytes, so 10 MB at most); past it the oldest is forgotten (actors/txn_state.py).
aborted_transactions_per_partition_max = 100_000
# Producer-state snapshots (actors/producer_snapshot.py) a partition keeps, the newest: a
# Raft cut takes only an uncommitted tail, rarely more than the active segment, and one below
# the oldest kept rebuilds from the log start (slower, as correct).
producer_snapshots_max = 8
# Largest snapshot file written or read: the tables' bounds above make ~2.6 MB at most
# (1,000 producers of 5 batches, 1,000 open and 100,000 aborted transactions).
producer_snapshot_bytes_max = 16 * 1024 * 1024
# Batches appended while a producer-state rebuild runs, kept to replay once it is back; past
# it they are dropped and read back from the log by one more pass off the loop.
producer_rebuild_notes_max = 10_000
# A partition whose recovery sync (the first fdatasync of what recovery kept) failed tries
# again after this long; its clients' messages wait meanwhile.
recovery_sync_retry_ms = 1000
# Client messages a partition holds while it starts (the recovery sync, the producer state)
# or rebuilds its producer state after a cut; past it they are refused REQUEST_TIMED_OUT
# (retriable) rather than queued without end.
partition_held_messages_max = 10_000
# Producer ids handed out per persisted block (the next block is written before use).
producer_id_block_size = 1000
# Requests the controller holds while a metadata write is out (a few ms); past it they are
# refused with a retriable error instead of queueing without end.
controller_requests_waiting_max = 10_000

# Topic and partition limits.
topic_name_chars_max = 249  # Kafka's limit (file system name length with suffixes)
partitions_per_topic_max = 100_000

# A replicated partition's leader that is not its preferred replica hands leadership back to
# it once it is caught up, looking every this many election timeouts (Kafka's
# leader.imbalance.check.interval, 300 s there; here seconds, so a restarted node takes its
# share of leaders back soon after it has caught up).
preferred_leader_check_timeouts = 5

# A moved partition's leader whose group's members are the move's target asks the controller
# to complete the move (actors/partition_replication.py), again every this many election
# timeouts until the controller's table says it is done.
move_complete_retry_timeouts = 2

# CreateTopics on a cluster answers once this shard knows a leader of every partition it
# created (Kafka names leaders at creation; tools produce or ask Metadata right after), for at
# most this long or the request's timeout_ms, asking every step.
create_topics_leaders_wait_s = 5.0
create_topics_leaders_step_s = 0.02

# A replicated partition's leader answers DeleteRecords once every follower whose node is
# heard from has moved its log start past the offset (Kafka's low watermark), or
# REQUEST_TIMED_OUT after this long (Kafka waits the request's timeout, 30 s by default in
# its admin client). A live follower takes it within a round trip; a dead one stops counting
# after an election timeout.
delete_records_replicas_wait_ms = 30_000

# Outgoing messages a Raft group holds while its term and vote are not yet durable (a write of
# them out, or failed and to be retried at the next tick): vote, heartbeat and append answers,
# small. Past it the oldest go (Raft takes lost messages). A leader's appends are never held:
# its term and vote were durable before its vote requests left, so before it could win.
replica_held_messages_max = 1024

# The in-sync replica set (actors/isr.py): a leader keeps its log's end at past times as
# samples at least (replica.lag.time.max.ms / this) apart, to tell when each follower last
# caught up: this many plus two for a busy partition (~2 KB), one for an idle one. A follower
# lagging just under the limit may leave the ISR up to one such span (~2 s of Kafka's 30 s)
# early, never late.
isr_end_samples_max = 16
# While produces are traced (actors/trace.py), each partition keeps this many of its last
# flushes' times, to stamp a traced produce with the flush that covered it.
traced_flushes_kept = 16
