"""A partition's producer state over its life: noted batch by batch, saved at each segment
roll, rebuilt off the loop after a start, a cut or a reset.

What a partition knows of its idempotent producers and transactions (`ProducerState`,
actors/producer_rebuild.py) follows its log. Every batch appended, a client's or a follower's,
is noted (`note`). At each segment roll the tables are saved in a snapshot file
(actors/producer_snapshot.py). On start, and after a Raft cut or reset (the partition's
`log_rewritten`), they are rebuilt off the loop on the read pool, from the last snapshot at or
below the log's end and the batch headers after it, while the partition holds its clients'
messages (`rebuilding`). Batches appended meanwhile are noted on the live tables, which forget
what a cut took, and on the rebuild's run as well, to be played on the rebuilt tables; a
rebuild already under way when the log is cut again is forgotten and a new one started.

The `Partition` (actors/partition.py) owns one `Producers` and is told through
`ProducersHost` when a rebuild is back (`producer_state_rebuilt`) or failed, the log being
unreadable (`producer_state_lost`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from pykka import ActorDeadError

from actors.producer_rebuild import (
    ProducerState,
    RebuildRun,
    Rebuilt,
    marker_kind,
    rebuild,
    replay,
)
from actors.producer_snapshot import Boundary, SnapshotFiles
from actors.producer_state import ProducerStateTable
from actors.services import Services
from actors.txn_state import TxnState
from storage import DiskLog
from wire.record_batch import BatchHeader, read_header

__all__ = ["Producers", "ProducersHost", "RebuildDone"]

log = logging.getLogger("actors.partition")  # the partition's lines, as they have always been


class RebuildDone(NamedTuple):
    """A producer-state rebuild is back from the read pool, to the partition's mailbox."""

    run: RebuildRun
    result: Rebuilt | None
    error: BaseException | None


class ProducersHost(Protocol):
    """What the producer state needs of its partition (actors/partition.py's Partition)."""

    services: Services

    @property
    def actor_ref(self) -> Any: ...  # RebuildDone comes back to the partition's mailbox
    @property
    def disk_log(self) -> DiskLog | None: ...
    def producer_state_rebuilt(self) -> None: ...
    def producer_state_lost(self) -> None: ...


class Producers:
    def __init__(self, host: ProducersHost, name: str,
                 directory_fd: Callable[[], int | None]) -> None:
        self._host = host
        self._name = name
        self.state = ProducerState()
        self._run: RebuildRun | None = None  # the rebuild out, if one is
        self._snapshots = SnapshotFiles(host.services.run_blocking, directory_fd, name)
        self._snapshot_base = -1  # the active segment's base offset at the last snapshot

    def __str__(self) -> str:
        return self._name

    @property
    def producers(self) -> ProducerStateTable:
        return self.state.producers

    @property
    def txns(self) -> TxnState:
        return self.state.txns

    @property
    def rebuilding(self) -> bool:
        return self._run is not None

    def opened(self, log_: DiskLog) -> None:
        """The log is open (recovered): forget the snapshots a power loss outlived. The
        partition then starts the rebuild."""
        self._snapshot_base = log_.active_base_offset
        self._snapshots.truncated(log_.next_offset)

    def rebuild(self) -> None:
        """Producer and transaction state from the log, off the loop: from its last usable
        snapshot, then the batch headers after it (actors/producer_rebuild.py). A rebuild
        already under way is forgotten (its log was cut again)."""
        log_ = self._host.disk_log
        assert log_ is not None
        run = self._run = RebuildRun(log_.next_offset)
        scan, dir_fd, name = log_.header_scan(run.end_offset), log_.directory_fd(), self._name
        self._submit(run, lambda: rebuild(dir_fd, scan, name))

    def _submit(self, run: RebuildRun, job: Callable[[], Rebuilt]) -> None:
        ref = self._host.actor_ref

        def done(result: Rebuilt | None, error: BaseException | None) -> None:
            try:
                ref.tell(RebuildDone(run, result, error))
            except ActorDeadError:
                pass  # stopped meanwhile: nothing to rebuild for

        self._host.services.read_blocking(job, done)

    def rebuilt(self, m: RebuildDone) -> None:
        log_ = self._host.disk_log
        if m.run is not self._run or log_ is None:
            return  # the log was cut again meanwhile: a later run is out
        if m.error is not None or m.result is None:
            self._run = None
            log.critical("%s: producer state rebuild failed: %r; partition offline until a "
                         "restart", self, m.error)
            self._host.producer_state_lost()
            return
        rebuilt = m.result
        if m.run.overflowed:  # more came meanwhile than a run keeps: read them back too
            run = self._run = RebuildRun(log_.next_offset)
            scan, start = log_.header_scan(run.end_offset), m.run.end_offset
            self._submit(run, lambda: rebuilt._replace(
                replayed=rebuilt.replayed + replay(rebuilt.state, scan, start)))
            return
        self._run = None
        for header, base_offset, kind in m.run.notes:
            rebuilt.state.note(header, base_offset, kind)
        self.state = rebuilt.state
        self.txns.log_start_moved(log_.log_start_offset)
        log.debug("%s: producer state rebuilt from %s, %d batch headers read", self,
                  "the log start" if rebuilt.snapshot_offset is None
                  else f"the snapshot at {rebuilt.snapshot_offset}", rebuilt.replayed)
        self._host.producer_state_rebuilt()

    def note(self, header: BatchHeader, base_offset: int,
             batch: Callable[[BatchHeader], bytes | memoryview]) -> None:
        """Feed the tables a batch appended at `base_offset` (the leader's own or a
        follower's); `batch(header)` gives its bytes, asked only for a transaction marker.
        During a rebuild the run notes it too, for the rebuilt tables."""
        if header.producer_id < 0:
            return
        kind = marker_kind(header, batch)
        self.state.note(header, base_offset, kind)
        if self._run is not None:
            self._run.note(header, base_offset, kind)

    def note_appended(self, records: memoryview, headers: list[BatchHeader],
                      first_base: int) -> None:
        """Note a produce's batches, appended from `first_base` on."""
        base = first_base
        for header in headers:
            self.note(header, base, lambda h: records[h.position:h.position + h.size])
            base += header.last_offset_delta + 1

    def maybe_snapshot(self, last: BatchHeader, data: bytearray | memoryview) -> None:
        """After an append whose last batch is `last` (at its position in `data`): if the log
        rolled, save the tables as of its end (actors/producer_snapshot.py). Not while a
        rebuild runs: the tables are not exact until it is back. `last` was parsed before the
        log set its offset and epoch (a new leader's no-op, a produce) and before a
        LogAppendTime stamp changed its CRC: those come from the log and the bytes."""
        log_ = self._host.disk_log
        assert log_ is not None
        if log_.active_base_offset == self._snapshot_base:
            return
        self._snapshot_base = log_.active_base_offset
        epoch = log_.last_epoch
        if self._run is None and epoch is not None:
            end = log_.next_offset
            crc = read_header(data, last.position).crc
            boundary = Boundary(end - 1 - last.last_offset_delta, epoch, crc)
            self._snapshots.write(self.state.snapshot(end, boundary))

    def cut(self, end: int, log_start_offset: int | None = None) -> None:
        """The log was cut back to `end`: forget what it took, tables and snapshots; after a
        reset (`log_start_offset`) every snapshot below the new start goes as well."""
        self.producers.forget_from(end)
        self.txns.forget_from(end)
        self._snapshots.truncated(end)
        if log_start_offset is not None:
            self._snapshots.log_start_moved(log_start_offset)

    def log_start_moved(self, log_start_offset: int) -> None:
        self.txns.log_start_moved(log_start_offset)
        self._snapshots.log_start_moved(log_start_offset)
