"""How a scenario step names a node, before the run says which one it is.

Its own module because both the file's reader (scenarios/spec.py) and the fault mixes it
plans (scenarios/chaos.py) name nodes, and the reader imports the planner: the name sits
below both.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NodeRef:
    """A node as a step names it: `id` (a number), `random` (drawn from the seed when the
    step runs) or `leader` of `topic`-`partition` (asked of the cluster when the step runs)."""

    kind: str  # "id", "random" or "leader"
    id: int | None = None
    topic: str | None = None
    partition: int | None = None

    def __str__(self) -> str:
        if self.kind == "leader":
            return f"leader of {self.topic}-{self.partition}"
        return f"node {self.id if self.kind == 'id' else 'random'}"
