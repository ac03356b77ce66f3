"""forget_segments, and the fd cache it keeps: other shards' segment files, open for sendfile.

A cross-shard read answers with a file's place (calls/read.py); the source opens that file
by path and keeps it open for the next fetch (`SegmentFiles`). When the owner removes segment
files (retention, compaction) it tells every other shard of the node to let go of them:

    ForgetSegmentsCall(paths)  -->  every other shard: close its cached fds   (no answer)

so their disk space is freed when the owner deletes them, not when the cache would have
evicted them (up to `remote_segment_fds_max` segments' worth).
"""

from __future__ import annotations

import collections
import os
from typing import Any, NamedTuple

from shards import limits
from shards.calls.base import Caller, Request
from storage.page_cache import no_readahead
from storage.segment import OpenFile

__all__ = ["KIND", "ForgetSegmentsCall", "SegmentFiles", "broadcast_removed", "serve"]

KIND = 11


class ForgetSegmentsCall(NamedTuple):
    paths: list[str]


def broadcast_removed(router: Caller, paths: list[str]) -> None:
    """Segment files this shard removed: every other shard of the node lets go of them."""
    for peer in router.peers():
        router.call(peer, KIND, ForgetSegmentsCall(paths), [], None)


def serve(request: Request, body: Any, _frames: list[Any]) -> None:
    request.router.segment_files.forget(ForgetSegmentsCall._make(body).paths)


class SegmentFiles:
    """Segment files other shards own, open for sendfile: path -> (file, inode), least
    recently used first, at most `remote_segment_fds_max`."""

    def __init__(self) -> None:
        self._files: collections.OrderedDict[str, tuple[OpenFile, int]]
        self._files = collections.OrderedDict()

    def open(self, path: str, inode: int) -> OpenFile | None:
        """The open file, cached; None if that file is gone (deleted, or another file at its
        path: a topic deleted and made again). The fd stays open while a FileSlice holds the
        OpenFile, though the cache let it go."""
        cached = self._files.get(path)
        if cached is not None:
            if cached[1] == inode:
                self._files.move_to_end(path)
                return cached[0]
            del self._files[path]
        try:
            file = OpenFile(os.open(path, os.O_RDONLY))
        except FileNotFoundError:
            return None
        no_readahead(file.fd)  # as the owner's own fd (storage/page_cache.py)
        if os.fstat(file.fd).st_ino != inode:
            return None
        self._files[path] = (file, inode)
        if len(self._files) > limits.remote_segment_fds_max:
            self._files.popitem(last=False)
        return file

    def forget(self, paths: list[str]) -> None:
        for path in paths:
            self._files.pop(path, None)

    def forget_under(self, prefix: str) -> None:
        """Let go of cached files under `prefix` (a deleted topic's partition directory)."""
        for path in [p for p in self._files if p.startswith(prefix)]:
            del self._files[path]

    def clear(self) -> None:
        self._files.clear()
