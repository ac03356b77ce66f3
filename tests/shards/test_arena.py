"""The shared-memory arena's ring allocator, and arenas shared between two real processes."""

from __future__ import annotations

import itertools
import mmap
import multiprocessing
import os
import random

import pytest

from shards.arena import Arena, ArenaSet, create_arena_fds

pytestmark = pytest.mark.timeout(30)


def test_regions_are_copied_in_and_read_back_by_a_peer() -> None:
    arenas = ArenaSet.in_memory(2, 1024)
    start = arenas[0].own.put(b"hello")
    assert start == 0
    assert bytes(arenas[1].peer_view(0, start, 5)) == b"hello"
    arenas[1].peer_view(0, start, 5)[0:1] = b"j"  # the owner patches in place
    assert bytes(arenas[1].peer_view(0, start, 5)) == b"jello"


def test_full_arena_refuses_and_the_tail_moves_past_released_regions_in_order() -> None:
    arena = Arena(bytearray(100))
    a, b, c = arena.put(b"a" * 40), arena.put(b"b" * 40), arena.put(b"c" * 20)
    assert (a, b, c) == (0, 40, 80)
    assert arena.put(b"x") is None  # full
    arena.release(b)  # out of order: a is still live, so nothing can wrap yet
    assert arena.put(b"x" * 10) is None
    arena.release(a)  # tail moves past a and b
    d = arena.put(b"d" * 70)  # wraps to the start, before c
    assert d == 0
    assert arena.put(b"e" * 11) is None  # only [70, 80) is free
    assert arena.put(b"e" * 10) == 70
    assert arena.used == 100


def test_an_empty_arena_starts_again_at_the_beginning() -> None:
    arena = Arena(bytearray(100))
    for _ in range(10):
        start = arena.put(b"z" * 30)
        assert start == 0  # a lightly loaded shard keeps touching the same pages
        arena.release(start)
    assert arena.used == 0 and arena.live_regions == 0


def test_oversize_and_empty_data_are_refused() -> None:
    arena = Arena(bytearray(100))
    assert arena.put(b"x" * 101) is None
    assert arena.put(b"") is None
    with pytest.raises(KeyError):
        arena.release(0)


def test_random_put_release_never_overlaps_live_regions() -> None:
    rng = random.Random(7)
    size = 4096
    arena = Arena(bytearray(size))
    live: dict[int, bytes] = {}
    for step in range(20_000):
        if live and (rng.random() < 0.45 or len(live) > 20):
            start = rng.choice(list(live))
            data = live.pop(start)
            assert bytes(arena._view[start : start + len(data)]) == data, step
            arena.release(start)
        else:
            data = rng.randbytes(rng.randint(1, 900))
            start = arena.put(data)
            if start is not None:
                live[start] = data
        assert arena.used == sum(len(d) for d in live.values())
        spans = sorted((s, s + len(d)) for s, d in live.items())
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(spans))
        assert all(0 <= s and e <= size for s, e in spans)


def _child_patches(fds: list[int], start: int, nbytes: int) -> None:
    arenas = ArenaSet.from_fds(1, fds)
    view = arenas.peer_view(0, start, nbytes)
    view[:] = bytes(view).upper()


def test_arenas_are_shared_between_processes() -> None:
    fds = create_arena_fds(2, 1 << 20)
    try:
        assert all(os.fstat(fd).st_size == 1 << 20 for fd in fds)
        ctx = multiprocessing.get_context("fork")
        own = ArenaSet.from_fds(0, [os.dup(fd) for fd in fds])
        start = own.own.put(b"shared bytes")
        assert start is not None
        child = ctx.Process(target=_child_patches, args=(fds, start, 12))
        child.start()
        child.join(20)
        assert child.exitcode == 0
        assert bytes(own.own._view[start : start + 12]) == b"SHARED BYTES"
    finally:
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass


def test_a_lease_is_free_only_when_every_holder_released_it() -> None:
    arena = Arena(bytearray(1000))
    lease = arena.lease(600)
    assert lease is not None and lease.start == 0 and lease.view.nbytes == 600
    lease.view[:5] = b"frame"
    lease.retain()  # a produce made from the frame
    lease.retain()  # another partition's
    lease.release()  # the connection is done
    lease.release()
    assert arena.lease(600) is None and arena.used == 600  # one holder left
    lease.release()
    assert arena.used == 0 and arena.live_regions == 0
    with pytest.raises(KeyError):
        lease.release()  # released more than retained


def test_offset_of_finds_views_inside_the_arena_only() -> None:
    arena = Arena(mmap.mmap(-1, 4096))
    lease = arena.lease(1000)
    assert lease is not None
    assert arena.offset_of(lease.view) == 0
    assert arena.offset_of(lease.view[100:200]) == 100
    assert arena.offset_of(memoryview(bytearray(100))) is None  # some other buffer
    assert arena.offset_of(memoryview(b"read-only bytes")) is None
    assert arena.offset_of(lease.view[0:0]) is None
