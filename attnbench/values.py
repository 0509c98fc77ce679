"""How a sweep option's typed or written value is read: one-line errors that name the option.

Kept apart from the option table (``attnbench.options``), which only says which of these reads
each option.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from attnbench.errors import AttnbenchError
from attnbench.thresholds import parse_fraction


def positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise AttnbenchError(f"--{name}: expected an integer, got {value!r}")
    if value < 1:
        raise AttnbenchError(f"--{name} must be >= 1, got {value}")
    return value


def precision(value: Any) -> float:
    """An interval's reach as a share of the time: over 0% and under 100%."""
    negative = str(value).strip().startswith("-")  # one message for every value out of range
    found = -1.0 if negative else parse_fraction(value, "--precision")
    if not 0 < found < 1:
        raise AttnbenchError(f"--precision {value!r} must be above 0% and below 100%")
    return found


def seed(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise AttnbenchError(f"--seed: expected an integer >= 0, got {value!r}")
    return value


def positive_seconds(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise AttnbenchError(f"--{name} must be a positive number of seconds, got {value!r}")
    return float(value)


def switch(value: Any) -> bool:
    """``--energy``: true or false (a config file's ``energy = true``)."""
    if not isinstance(value, bool):
        raise AttnbenchError(f"--energy: expected true or false, got {value!r}")
    return value


def seconds(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise AttnbenchError(f"--{name} must be a number of seconds, 0 or more, got {value!r}")
    return float(value)


SIZE_UNITS = {"": 1, "B": 1, "K": 2**10, "KIB": 2**10, "M": 2**20, "MIB": 2**20,
               "G": 2**30, "GIB": 2**30, "T": 2**40, "TIB": 2**40}  # fmt: skip


def positive_bytes(value: Any, name: str) -> int:
    """A size: bytes as an integer, or a number with a binary unit (512MiB, 4G, 1.5GiB)."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    text = str(value).strip().upper().replace(" ", "")
    number = text.rstrip("BKMGTI")
    unit = text[len(number) :]
    try:
        size = float(number) * SIZE_UNITS[unit]
    except (KeyError, ValueError):
        size = math.nan
    if not 1 <= size < math.inf:
        raise AttnbenchError(f"--{name}: expected a size such as 4GiB or 512MiB, got {value!r}")
    return int(size)


def choice(value: Any, name: str, accepted: Iterable[str]) -> str:
    accepted = tuple(accepted)
    if str(value) not in accepted:
        raise AttnbenchError(f"unknown {name} {str(value)!r}; accepted: {', '.join(accepted)}")
    return str(value)
