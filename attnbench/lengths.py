"""Sequence lengths and widths as the user writes them: lists, doubling ranges, and ``auto``.

``--n auto`` is a ladder of lengths the sweep may climb (``AutoN``); which of them each layer
reaches is decided as its cases finish (``run.auto``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from attnbench.errors import AttnbenchError

AUTO = "auto"


@dataclass(frozen=True)
class AutoN:
    """``--n auto``: for each layer and width, n doubles from ``start`` until the layer's rate
    (work per second) settles (``attnbench.regime``), or the next case would not fit (its
    predicted call time, peak memory, the sweep's budget), up to ``stop``."""

    start: int = 64
    stop: int = 2**20

    def ladder(self) -> tuple[int, ...]:
        """Every length the sweep may reach: start, 2·start, ... up to stop."""
        return parse_int_list(f"{self.start}..{self.stop}", "n")

    def text(self) -> str:
        """As the user writes it, and as run.json records it."""
        return AUTO if self == AutoN() else f"{AUTO}:{self.start}..{self.stop}"


_RANGE = re.compile(r"^\s*(\d+)\s*\.\.\s*(\d+)\s*$")


def parse_int_list(text: str | int | Iterable[int], name: str) -> tuple[int, ...]:
    """Parse ``"64,128,256"`` or the doubling range ``"64..4096"`` (64, 128, ..., 4096).

    A range keeps start * 2^i while it does not exceed the end.  Values must be >= 1.
    """
    if isinstance(text, bool):
        raise AttnbenchError(f"--{name}: expected integers, got {text!r}")
    if isinstance(text, int):
        values: list[int] = [text]
    elif isinstance(text, str):
        text = text.strip()
        match = _RANGE.match(text)
        if match:
            start, end = int(match.group(1)), int(match.group(2))
            if start < 1:
                raise AttnbenchError(f"--{name}: range start must be >= 1, got {start}")
            if end < start:
                raise AttnbenchError(
                    f"--{name}: range {text!r} runs backwards; write START..END with START <= END"
                )
            values = []
            v = start
            while v <= end:
                values.append(v)
                v *= 2
            if len(values) == 1 and end != start:  # a range that ran one length, unsaid
                raise AttnbenchError(
                    f"--{name}: range {text!r} holds {start} alone (it doubles, and "
                    f"{2 * start} is past {end}); write {start} for one length, or an end of "
                    f"{2 * start} or more"
                )
        else:
            items = [t.strip() for t in text.split(",")]
            if not text or any(not re.fullmatch(r"-?\d+", t) for t in items):
                raise AttnbenchError(
                    f"--{name}: cannot read {text!r}; use a list like 64,128,256 "
                    "or a doubling range like 64..4096"
                )
            values = [int(t) for t in items]
    elif isinstance(text, list | tuple):
        values = list(text)
        if not values or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise AttnbenchError(f"--{name}: expected a list of integers, got {text!r}")
    else:
        raise AttnbenchError(
            f"--{name}: expected a list like 64,128 or a range like 64..4096, got {text!r}"
        )
    for v in values:
        if v < 1:
            raise AttnbenchError(f"--{name}: values must be >= 1, got {v}")
    return tuple(sorted(set(values)))


_AUTO = re.compile(r"^\s*auto\s*(?::\s*(\d+)\s*\.\.\s*(\d+))?\s*$")


def parse_lengths(text: Any) -> tuple[int, ...] | AutoN:
    """``--n``: a list or a doubling range (``parse_int_list``), or ``auto`` /
    ``auto:START..STOP`` (``AutoN``)."""
    if isinstance(text, str) and text.strip().startswith(AUTO):
        match = _AUTO.match(text)
        if match is None:
            raise AttnbenchError(
                f"--n: cannot read {text!r}; write auto, or auto:START..STOP (a doubling range)"
            )
        if match.group(1) is None:
            return AutoN()
        start, stop = int(match.group(1)), int(match.group(2))
        if not 1 <= start <= stop:
            raise AttnbenchError(f"--n {text!r}: write auto:START..STOP with 1 <= START <= STOP")
        return AutoN(start, stop)
    return parse_int_list(text, "n")
