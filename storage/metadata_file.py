"""Small metadata files written atomically: temp file, fsync, rename, fsync of the directory.

A crash at any moment leaves either the old file or the new one, never a torn mix
(DESIGN.md §6). Used for the topic table, the cluster id and producer-id blocks.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["fsync_directory", "write_json_atomic", "write_atomic_at", "read_json"]


def write_json_atomic(path: str | Path, value: Any) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(value, indent=1, sort_keys=True).encode()
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        write_atomic_at(dir_fd, path.name, data)
    finally:
        os.close(dir_fd)


def fsync_directory(directory: str | Path) -> None:
    """Make the names created, renamed or removed in `directory` durable."""
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_atomic_at(dir_fd: int, name: str, data: bytes) -> None:
    """The same, in the directory open as `dir_fd` (which may have been renamed meanwhile)."""
    temp = name + ".tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=dir_fd)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    os.fsync(dir_fd)


def read_json(path: str | Path, default: Any = None) -> Any:
    """The file's value, or `default` if it does not exist. A leftover temp file is ignored."""
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except FileNotFoundError:
        return default
