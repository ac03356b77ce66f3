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

# Transactional ids one coordinator remembers (Kafka has no bound). At this many, a new id
# makes the oldest completed one be forgotten (tombstoned); if none is completed, the new id's
# InitProducerId is answered COORDINATOR_NOT_AVAILABLE and the client retries (an Ongoing
# transaction ends within transaction.max.timeout.ms).
transactional_ids_max = 20_000

# Partitions in one transaction (Kafka has no bound): its record in `__consumer_offsets`
# stays far below message.max.bytes. Beyond it AddPartitionsToTxn is an INVALID_REQUEST.
partitions_per_transaction_max = 10_000

# A transaction marker a partition refused with a retriable error (its leader moving) is
# sent again after this, doubled per try up to the max, for as long as the transaction is
# this coordinator's (Kafka's marker channel retries for ever too).
marker_retry_backoff_ms_min = 50
marker_retry_backoff_ms_max = 2_000

# A failed append of the coordinator's own transition (CompleteCommit after the markers) is
# tried again after this.
txn_persist_retry_ms = 500

# How often the coordinator looks for Ongoing transactions past their timeout and idle ids
# past their expiration, at most (it wakes at the next such deadline, or after this).
txn_check_interval_ms_max = 10_000

# Transactional offset commits (TxnOffsetCommit) are pending until their transaction's marker
# lands on the group's offsets partition (actors/group/txn_offsets.py). Partitions pending per
# producer, across its groups (Kafka has no bound; as `partitions_per_transaction_max`): past
# it TxnOffsetCommit is an INVALID_REQUEST.
txn_offsets_per_producer_max = 10_000

# Producers with pending transactional offsets in one coordinator (Kafka has no bound): past
# it a new producer's TxnOffsetCommit is answered COORDINATOR_NOT_AVAILABLE and the client
# retries; the open ones end within transaction.max.timeout.ms.
txn_offset_producers_max = 10_000

# Transaction markers that land on an offsets partition while it loads, past the log end the
# load replays up to: applied once the load has replayed. Past this the load starts again
# (its new log end includes them).
load_late_markers_max = 10_000
