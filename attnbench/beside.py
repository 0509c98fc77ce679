"""Two runs of the same layers side by side: an eager run and a compiled one (``--compile``), or
any two runs of one mode. For each layer at the width both measured: where each run's calls
were overhead-bound (their kernels under half the time), the time's exponent in n in each with
whether it settled, how much faster the second run read at each length, and what its compile
cost. What ``attnbench table RUN --beside OTHER`` prints.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from attnbench.errors import AttnbenchError
from attnbench.results.run import RunResults
from attnbench.schema import numeric_column
from attnbench.table import comparison_table
from attnbench.units import fmt_exponent

COLUMNS = [
    "layer",
    "d",
    "{first}: overhead-bound to",
    "{second}: overhead-bound to",
    "{first}: time",
    "{second}: time",
    "{second} faster",
    "{second}: compile",
]


def run_label(run: RunResults) -> str:
    """How a run is named beside another: ``compiled`` or ``eager``."""
    return "compiled" if run.record.config.get("compile") else "eager"


def beside_table(first: RunResults, second: RunResults) -> pd.DataFrame:
    """One row per layer both runs measured, at the widest d both have: each run's largest
    overhead-bound length and time exponent in n, the ratio first / second of their times at
    each shared length (over 1: the second is faster), and the second's compile seconds."""
    if first.mode != second.mode:
        raise AttnbenchError(
            f"{first.path} is a {first.mode} run and {second.path} a {second.mode} run: "
            "side by side needs two runs of one mode"
        )
    tables = {
        side: comparison_table(run).set_index("layer")
        for side, run in (("first", first), ("second", second))
    }
    rows: list[dict[str, Any]] = []
    for layer in tables["first"].index.intersection(tables["second"].index):
        times = {side: _times(run, layer) for side, run in (("first", first), ("second", second))}
        shared = times["first"].index.intersection(times["second"].index)
        if shared.empty:
            continue
        d = int(max(shared.get_level_values("d")))
        at = [key for key in shared if key[1] == d]
        ratios = [times["first"][key] / times["second"][key] for key in sorted(at)]
        compile_s = _compile_seconds(second, layer, d)
        rows.append(
            {
                "layer": layer,
                "d": d,
                "overhead_bound_n_first": _largest(tables["first"].at[layer, "overhead_bound_n"]),
                "overhead_bound_n_second": _largest(tables["second"].at[layer, "overhead_bound_n"]),
                "time_exponent_n_first": _exponent(tables["first"], layer),
                "time_settled_n_first": tables["first"].at[layer, "time_settled_n"],
                "time_exponent_n_second": _exponent(tables["second"], layer),
                "time_settled_n_second": tables["second"].at[layer, "time_settled_n"],
                "ratio_by_n": {
                    int(n): round(float(r), 4) for (n, _), r in zip(sorted(at), ratios, strict=True)
                },
                "ratio_min": float(min(ratios)),
                "ratio_max": float(max(ratios)),
                "compile_s_min": min(compile_s) if compile_s else None,
                "compile_s_max": max(compile_s) if compile_s else None,
                # a compiled run's layer that compiled no graph ran eager: its "faster" is two
                # eager runs' processes, not compiling (rnn read 1.32-1.91x so)
                "no_graph_first": _no_graph(first, layer, d),
                "no_graph_second": _no_graph(second, layer, d),
                "compiled_first": bool(first.record.config.get("compile")),
                "compiled_second": bool(second.record.config.get("compile")),
            }
        )
    if not rows:
        raise AttnbenchError(
            f"{first.path} and {second.path} share no layer measured at the same n and d"
        )
    return pd.DataFrame(rows)


def display_beside(table: pd.DataFrame, first: str, second: str) -> pd.DataFrame:
    """The rows as people read them, each run's columns named by its label (``run_label``)."""
    shown = pd.DataFrame(
        {
            "layer": table["layer"],
            "d": table["d"],
            "{first}: overhead-bound to": table["overhead_bound_n_first"].map(_up_to),
            "{second}: overhead-bound to": table["overhead_bound_n_second"].map(_up_to),
            "{first}: time": _growths(table, "first"),
            "{second}: time": _growths(table, "second"),
            "{second} faster": _ranges(table, "ratio", "x"),
            "{second}: compile": _ranges(table, "compile_s", " s"),
        }
    )
    # each run's own label in its headers (a label may hold any word, "second" too)
    names = {c: c.format(first=first, second=second) for c in COLUMNS}
    return shown[COLUMNS].rename(columns=names)


def _growths(table: pd.DataFrame, side: str) -> list[str]:
    exponents, settled = table[f"time_exponent_n_{side}"], table[f"time_settled_n_{side}"]
    return [_growth(e, s) for e, s in zip(exponents, settled, strict=True)]


def _ranges(table: pd.DataFrame, column: str, unit: str) -> list[str]:
    lows, highs = table[f"{column}_min"], table[f"{column}_max"]
    return [_range(lo, hi, unit) for lo, hi in zip(lows, highs, strict=True)]


def _times(run: RunResults, layer: str) -> pd.Series:
    """The layer's measured times by (n, d)."""
    rows = run.measured[run.measured["layer"] == layer]
    times = numeric_column(rows, "time_s")
    keep = times.notna() & (times > 0)
    index = pd.MultiIndex.from_arrays([rows["n"][keep].astype(int), rows["d"][keep].astype(int)])
    return pd.Series(times[keep].to_numpy(), index=index, name="time_s")


def _compile_seconds(run: RunResults, layer: str, d: int) -> list[float]:
    rows = run.measured[(run.measured["layer"] == layer) & (run.measured["d"] == d)]
    if "compile_s" not in rows:
        return []
    return [float(x) for x in numeric_column(rows, "compile_s").dropna()]


def _no_graph(run: RunResults, layer: str, d: int) -> bool:
    """Whether a compiled run's layer compiled no graph at any of its lengths at ``d``."""
    rows = run.measured[(run.measured["layer"] == layer) & (run.measured["d"] == d)]
    if not run.record.config.get("compile") or "compile_graphs" not in rows:
        return False
    graphs = numeric_column(rows, "compile_graphs").dropna()
    return bool(len(graphs)) and bool((graphs == 0).all())


def beside_notes(table: pd.DataFrame, first: str, second: str) -> list[str]:
    """What the side-by-side's "faster" column does not say: a compiled side that compiled no
    graph, and that two runs swept apart are not a paired race."""
    notes = []
    for side, other, label in (("first", "second", first), ("second", "first", second)):
        eager = table[f"no_graph_{side}"]
        # two eager runs where the other side ran eager too (an eager run, or no graph there)
        both = eager & (table[f"no_graph_{other}"] | ~table[f"compiled_{other}"])
        for layers, apart in (
            (both, "two eager runs apart"),
            (eager & ~both, "eager beside compiled code"),
        ):
            if layers.any():
                notes.append(
                    f"{', '.join(table.loc[layers, 'layer'])} compiled no graph in the {label} "
                    f"run and ran eager there: its '{second} faster' is {apart}, not what "
                    "compiling does"
                )
    notes.append(
        "the two runs were swept apart, each process at a speed of its own: a ratio near 1 may "
        "be theirs, not the code's; attnbench ab --base-compile none --compile MODE races "
        "eager against compiled, paired"
    )
    return notes


def _largest(lengths: Any) -> int | None:
    return max(lengths) if isinstance(lengths, list) and lengths else None


def _exponent(table: pd.DataFrame, layer: str) -> float | None:
    value = table.at[layer, "time_exponent_n"]
    return None if value is None or not math.isfinite(float(value)) else float(value)


def _up_to(n: Any) -> str:
    return "none" if n is None or pd.isna(n) else f"n={int(n)}"


def _growth(exponent: Any, settled: Any) -> str:
    if exponent is None or pd.isna(exponent):
        return "–"
    return f"n^{fmt_exponent(float(exponent))}" + ("" if settled is True else " unsettled")


def _range(low: Any, high: Any, unit: str) -> str:
    if low is None or pd.isna(low):
        return "–"
    if f"{low:.2f}" == f"{high:.2f}":
        return f"{low:.2f}{unit}"
    return f"{low:.2f}-{high:.2f}{unit}"
