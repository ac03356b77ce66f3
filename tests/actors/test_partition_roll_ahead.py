"""Rolling ahead on a replicated partition: three real Partition actors (real logs, real Raft
replicas) on one loop (tests/support/replicated_partitions.py). A produce that would roll the
log waits for its next segment's files, made on the I/O pool (storage/log.py), and so do a
follower's batches; no segment after the first is made inline, on the loop."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import storage.log
from actors.topic_config import TopicSettings
from tests.actors.test_partition_idempotence_raft import answer, send, wait_info
from tests.support.actor_loop import actor_loop
from tests.support.replicated_partitions import REPLICAS, Cluster
from wire.errors import ErrorCode

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("storage_mode")]

loop = pytest.fixture(actor_loop)


def test_segments_are_made_ahead_on_the_leader_and_on_followers(
        loop: asyncio.AbstractEventLoop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[tuple[int, bool]] = []
    real = storage.log.Segment

    def recording(directory: Path, base: int, interval: int,
                  open_indexes: bool = False) -> Any:
        made.append((base, open_indexes))
        return real(directory, base, interval, open_indexes)

    monkeypatch.setattr(storage.log, "Segment", recording)
    small = TopicSettings(2000, 1 << 40, 1 << 20, False, False)
    cluster = Cluster(loop, tmp_path, settings=small)
    try:
        leader = cluster.leader()
        for sequence in range(30):
            produced = answer(cluster, send(cluster, leader, sequence, value_bytes=300))
            assert produced.error == ErrorCode.NONE, produced
        end = cluster.info(leader)["high_watermark"]
        for address in REPLICAS:
            wait_info(cluster, address, "high_watermark", end)
            assert cluster.info(address)["segments"] >= 4
        rolled = [ahead for base, ahead in made if base > 0]
        assert len(rolled) >= 3 * 3 and all(rolled), made
    finally:
        cluster.net.close()
