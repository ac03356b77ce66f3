"""Every limit and default of the Raft machine, as a named constant with its unit last."""

from __future__ import annotations

# A follower or candidate that hears no leader for a randomized number of ticks in
# [election_ticks, 2 * election_ticks) campaigns. The orchestrator's tick is its clock: with a
# 100 ms tick, 10 ticks is an election timeout of 1-2 s, Kafka's replica.lag.time.max.ms scale.
election_ticks_default = 10
# A leader sends heartbeats (to followers it sent no append since the last one) every this many
# ticks. Must be well under election_ticks: a follower's lease is one election timeout.
heartbeat_ticks_default = 1

# Append messages in flight to one follower in the replicate state before the leader waits for
# acknowledgements: a follower that is slow to flush slows its own stream, not the leader's
# memory. At a 1 ms round trip and one message per loop turn this is far from binding.
inflight_messages_max = 256
# Bytes in flight to one follower (only counted when the orchestrator gives the machine a batch
# reader that knows batch sizes): 32 MiB is ~30 ms of a 1 GB/s link.
inflight_bytes_max = 32 * 1024 * 1024
# Bytes of batches one append message names at most (asked of the batch reader; one batch
# larger than this still goes alone). Kafka's replica.fetch.max.bytes is 1 MiB.
append_bytes_max = 1024 * 1024
