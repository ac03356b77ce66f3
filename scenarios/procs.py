"""Child processes from ``/proc/<pid>/task/*/children`` (Linux, no psutil).

A thread or process can end between listing and reading, so every read tolerates the
file being gone: a walk returns what was alive while it looked.
"""

from __future__ import annotations

import os


def child_pids(pid: int) -> list[int]:
    """The live children of ``pid`` (empty when ``pid`` has gone)."""
    kids: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return kids
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids.extend(int(x) for x in f.read().split())
        except (OSError, ValueError):  # the thread ended while we looked
            pass
    return kids


def process_tree(root: int) -> list[int]:
    """``root`` and all its live descendants (breadth first)."""
    seen: list[int] = []
    todo = [root]
    while todo:
        pid = todo.pop(0)
        if pid in seen or not os.path.exists(f"/proc/{pid}"):
            continue
        seen.append(pid)
        todo.extend(child_pids(pid))
    return seen
