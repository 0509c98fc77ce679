"""Human-readable figures for tables and progress lines (pure functions)."""

from __future__ import annotations

import pandas as pd


def _missing(value: float | None) -> bool:
    """None, NaN, or pandas' NA (an empty cell of an integer column)."""
    return value is None or bool(pd.isna(value))


def fmt_seconds(value: float | None) -> str:
    if _missing(value):
        return "-"
    assert value is not None
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value / 1e-9:.3g} ns"


def fmt_bytes(value: float | None) -> str:
    if _missing(value):
        return "-"
    assert value is not None
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{int(value)} B"


def fmt_count(value: float | None, unit: str = "") -> str:
    """Decimal prefixes: 1.5e9 -> '1.5 G' + unit."""
    if _missing(value):
        return "-"
    assert value is not None
    value = float(f"{value:.3g}")  # rounded first: 999.6 M is "1 G", not "1e+03 M"
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}".rstrip()


def fmt_exponent(value: float) -> str:
    """An exponent to two decimals, with no "-0.00": a slope of -0.001 is flat, not falling
    (a new user read "rate n^-0.00" as a sign)."""
    text = f"{value:.2f}"
    return "0.00" if text == "-0.00" else text


def some_of(names: list[str], most: int = 3) -> str:
    """Up to ``most`` names, then how many more: "a, b, c and 2 more"."""
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more
