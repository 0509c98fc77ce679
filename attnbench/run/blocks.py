"""What a failed case says of the larger cases of its layer: a case as long and as wide, of
the same layer, would fail the same way (out of memory, out of time, a dead process), so the
queue writes it skipped instead of running it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnbench.schema import BLOCKING, Status
from attnbench.spec import Case


@dataclass(frozen=True)
class Block:
    layer: str
    n: int
    d: int
    why: str

    def covers(self, case: Case) -> bool:
        """A case at least as long and as wide, of the same layer, would fail the same way."""
        return case.layer == self.layer and case.n >= self.n and case.d >= self.d


def block_of(case: Case | Any, status: Status, died: bool) -> Block | None:
    """What a case's outcome says of the larger cases of its layer: they would fail the same
    way (out of memory, out of time, a dead process); None when it says nothing of them."""
    why = BLOCKING.get(status, "crashed" if died else None)
    if why is None:
        return None
    layer, n, d = case.layer, int(case.n), int(case.d)
    return Block(layer, n, d, f"{layer} n={n} d={d} {why}")
