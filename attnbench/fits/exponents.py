"""Log-log exponents of every metric in n and in d, beside the theory's own exponent.

A measured exponent says how a metric grows: time ~ n^a at fixed d means a ~ 2 for attention
and a ~ 1 for an RNN.  Small sizes are dominated by fixed overheads, so time is fitted only where
the layer's fitted constant is under half the time (``fit_sizes``), peak memory on the upper
half of the sizes, and exact counts (FLOPs, steps, path length) on all of them.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from attnbench.devices import DTYPES
from attnbench.estimators import normal_quantile, t_quantile
from attnbench.fits.agreement import agrees, law_fits
from attnbench.fits.models import Layers, ModelFit, layers_or_live, numeric, own_fit, size_rows
from attnbench.metrics import METRIC, METRICS
from attnbench.regime import REGIME_BAND, settled_sizes
from attnbench.schema import numeric_column
from attnbench.units import fmt_exponent


@dataclass(frozen=True)
class Exponent:
    """Slope of log(y) against log(x): y ~ x^slope."""

    slope: float
    low: float  # 95% confidence interval (nan with two points)
    high: float
    points: int
    x_min: float
    x_max: float

    def label(self, var: str) -> str:
        return f"{var}^{fmt_exponent(self.slope)}"


def loglog_exponent(
    x: Sequence[float], y: Sequence[float], log_se: Sequence[float] | None = None
) -> Exponent | None:
    """Least-squares slope of log y on log x, with its 95% interval; None below two points.

    The interval is the wider of the residuals' t-interval and the one the points' own
    standard errors imply (``log_se``: of log y, one a point; a time's, from its interval over
    processes): four points that happen to fall on a line do not make the slope known better
    than each point is. Non-positive values (a constant zero, say) cannot be logged and are
    left out. Two points, one of them with no error where the others have one (a time with no
    interval), leave the slope unknown: its interval would rest on the other point alone.
    """
    from scipy import stats  # lazy: scipy costs 0.8 s to import

    points = _loggable(x, y, log_se)
    xs = np.array(sorted({a for a, _, _ in points}), dtype=float)
    if len(xs) < 2:
        return None
    lx = np.log([a for a, _, _ in points])
    ly = np.log([b for _, b, _ in points])
    if np.ptp(ly) == 0:  # a constant: slope exactly 0 (linregress would give nan bounds)
        return Exponent(0.0, 0.0, 0.0, len(points), xs[0], xs[-1])
    fit = stats.linregress(lx, ly)
    weights = (lx - lx.mean()) / np.sum((lx - lx.mean()) ** 2)  # slope = sum(w_i log y_i)
    errors = np.array([e for _, _, e in points])  # nan: a point no interval gave an error
    measured = float(np.sqrt(np.sum((weights * np.nan_to_num(errors)) ** 2)))
    reach = normal_quantile(0.975) * measured
    if len(points) > 2:
        reach = max(reach, t_quantile(0.975, len(points) - 2) * fit.stderr)
    unknown = log_se is not None and not np.isfinite(errors).all()
    known = len(points) > 2 or (measured > 0 and not unknown)  # two alone leave no residuals
    low, high = (fit.slope - reach, fit.slope + reach) if known else (math.nan, math.nan)
    return Exponent(float(fit.slope), float(low), float(high), len(points), xs[0], xs[-1])


def loglog_slope(x: Sequence[float], y: Sequence[float]) -> float | None:
    """``loglog_exponent``'s slope alone, on the same points (None where it gives None).

    It is linregress's own estimate, computed as linregress computes it (``np.cov`` with
    ``bias``: the slope is their ssxym / ssxm), so the two agree to the last bit; without
    the interval, the correlation and the p-value that linregress also works out, and its
    argument checks, which cost 0.6 ms a call. The exponent table takes four slopes (the
    theory's, the model's, the work's and the rate's) for each exponent it fits.
    """
    points = _loggable(x, y, None)
    if len({a for a, _, _ in points}) < 2:
        return None
    lx = np.log([a for a, _, _ in points])
    ly = np.log([b for _, b, _ in points])
    if np.ptp(ly) == 0:
        return 0.0
    ssxm, ssxym, _, _ = np.cov(lx, ly, bias=True).flat
    return float(ssxym / ssxm)


def _loggable(
    x: Sequence[float], y: Sequence[float], log_se: Sequence[float] | None
) -> list[tuple[float, float, float]]:
    """The points (x, y, the error of log y: nan where unknown, 0 where none is given) that
    can be logged."""
    errors = list(log_se) if log_se is not None else [0.0] * len(x)
    return [
        (a, b, e)
        for a, b, e in zip(x, y, errors, strict=True)
        if a > 0 and b > 0 and np.isfinite(b)
    ]


def log_errors(line: pd.DataFrame) -> list[float] | None:
    """Each time's error on a log scale, from its 95% interval over processes (nan where it
    has none); None for a line without intervals. That interval is where a re-run's time lands
    (``estimators.estimate``), so the error is that of this run's time against a re-run's, and
    the exponent's interval says where a re-run's exponent lands."""
    if "time_ci_low_s" not in line or "time_ci_high_s" not in line:
        return None
    low, high = numeric_column(line, "time_ci_low_s"), numeric_column(line, "time_ci_high_s")
    spread = np.log(high.where(high > 0)) - np.log(low.where(low > 0))
    return [float(v) for v in spread / (2 * 1.96)]


def upper_half(values: Sequence[int], minimum: int = 3) -> list[int]:
    """The larger half of the distinct sizes (at least ``minimum`` of them, when there are)."""
    distinct = sorted(set(values))
    keep = max(minimum, math.ceil(len(distinct) / 2))
    return distinct[-keep:]


EXPONENT_COLUMNS = [
    "layer",
    "metric",
    "along",  # "n" (at fixed d) or "d" (at fixed n)
    "fixed",  # the value of the other size
    "exponent",
    "ci_low",
    "ci_high",
    "theory",  # the theory's log-log slope over the same points (nan: no theory for the metric)
    # the chapter's order's slope over the same points (attention's time: 2 in n, 1 in d; nan:
    # a metric the table does not order): what a reader expects, beside the formula's slope
    "order",
    "agrees",  # theory in the 95% interval (or within EXACT_TOLERANCE); None: cannot tell
    # time only: the slope of the machine model's predicted time over the same points (nan:
    # another metric, or a run without ceilings): the curve the counts and the machine explain
    "model",
    # time only: the slopes of the counted work (FLOPs + elementwise work) and of the rate it
    # ran at (work per second) over the same points: time = work / rate, so on the same points
    # the time's slope is the work's minus the rate's, exactly (nan: another metric, no work)
    "work_exponent",
    "rate_exponent",
    "rate_from",  # work per second at the first and the last size of the range (median)
    "rate_to",
    "points",
    "range_from",
    "range_to",
    "range_rule",  # how the sizes were chosen
]


def theory_values(
    frame: pd.DataFrame, metric: str, layers: Layers | None = None
) -> pd.Series | None:
    """The theory's value of ``metric`` for each case row, up to a constant; None without one."""
    law = METRIC[metric].theory
    if law is None:
        return None
    known = layers_or_live(layers)
    values = []
    dtypes = frame["dtype"] if "dtype" in frame else pd.Series("float32", index=frame.index)
    for layer, case, dtype in zip(frame["layer"], size_rows(frame, known), dtypes, strict=True):
        found = known.get(layer)
        theory = found.theory if found is not None else None
        if theory is None:
            values.append(math.nan)
        elif law == "sequential":
            values.append(theory.sequential_law(case))
        elif law == "path":
            values.append(theory.path_law(case))
        elif law == "elementwise":
            elements = theory.elements(case)
            values.append(math.nan if elements is None else elements)
        elif law == "work":
            # FLOPs and elementwise work (an element an operation) together: ssm-scan's
            # n·log n scan is elementwise, beside products linear in n, and its time follows
            # both. A theory that states no elementwise work reads its FLOPs.
            values.append(theory.flops(case) + (theory.elements(case) or 0.0))
        elif law == "state":
            step, dtype_of = theory.decode, DTYPES.get(str(dtype))
            if step is None or dtype_of is None:
                values.append(math.nan)
            else:
                values.append(step.state_values(case) * dtype_of.itemsize)
        elif law == "traffic":
            dtype_of = DTYPES.get(str(dtype))
            moved = None if dtype_of is None else theory.bytes(case, dtype_of.itemsize)
            values.append(math.nan if moved is None else moved)
        else:
            values.append(theory.flops(case))
    return pd.Series(values, index=frame.index, dtype=float)


def order_values(
    frame: pd.DataFrame, metric: str, layers: Layers | None = None
) -> pd.Series | None:
    """The chapter's order of ``metric`` for each case row (attention's time: n²·d), up to a
    constant: the slope a reader expects from the table, where ``theory_values`` gives the
    whole formula's (8·n·d² + 4·n²·d grows slower than n² at short n). None for a metric the
    chapter's table does not order (memory, bytes, elementwise work)."""
    law = METRIC[metric].theory
    if law in ("sequential", "path"):
        return theory_values(frame, metric, layers)  # the chapter's laws themselves
    if law not in ("work", "flops"):
        return None
    known = layers_or_live(layers)
    values = []
    for layer, case in zip(frame["layer"], size_rows(frame, known), strict=True):
        found = known.get(layer)
        theory = found.theory if found is not None else None
        order = math.nan if theory is None else float(theory.order(case))
        values.append(order if order > 0 else math.nan)  # a layer whose order is not stated
    return pd.Series(values, index=frame.index, dtype=float)


# A fitted fixed cost "dominates" a case while it is more than this share of the case's time
# (not ``regime.OVERHEAD_SHARE``, the kernels' measured share a case is overhead-bound under).
FIXED_COST_SHARE = 0.5
MIN_FIT_POINTS = 3


def fit_sizes(line: pd.DataFrame, along: str, metric: str, overhead: float | None) -> list[int]:
    """The sizes to fit an exponent on, per ``range_rule``.

    With a fitted constant overhead (seconds), the sizes whose median time is at least twice it;
    without one, the upper half. Either way at least ``MIN_FIT_POINTS`` sizes, the largest.
    """
    sizes = sorted(set(line[along]))
    if overhead is None:
        return upper_half(sizes, MIN_FIT_POINTS)
    slowest = line.groupby(along)[metric].min()
    keep = [s for s in sizes if overhead <= FIXED_COST_SHARE * slowest[s]]
    return keep if len(keep) >= MIN_FIT_POINTS else sizes[-MIN_FIT_POINTS:]


def counted_work(frame: pd.DataFrame) -> pd.Series:
    """Each case's counted work, FLOPs plus elementwise work (an element an operation), as the
    theory's "work" law has it: what a time is the work of (nan where FLOPs were not counted)."""
    if "flops" not in frame:
        return pd.Series(math.nan, index=frame.index)
    flops = numeric_column(frame, "flops")
    if "elementwise" not in frame:
        return flops
    return flops + numeric_column(frame, "elementwise").fillna(0.0)


NO_SPLIT = {
    "work_exponent": math.nan,
    "rate_exponent": math.nan,
    "rate_from": math.nan,
    "rate_to": math.nan,
}


def split_time(line: pd.DataFrame, along: str, work: pd.Series | None) -> dict[str, float]:
    """A time line's exponent split in two, time = work / rate: the slope of the counted work
    and of the rate it ran at (work per second) over the line's points, and that rate at the
    first and the last size. Where the time's exponent leaves the chapter's order while the
    work's keeps it, the machine ran the layer faster (or slower) per unit of work as n grew.
    ``work`` is None for a line of another metric: nothing to split."""
    if work is None:
        return dict(NO_SPLIT)
    seconds = line["time_s"].astype(float)
    done = work.reindex(line.index).astype(float)
    timed = seconds > 0  # the time's own fit leaves the rest out
    usable = timed & done.notna() & (done > 0)
    if usable.sum() < 2 or usable.sum() < timed.sum():  # on the time's points, or not at all
        return dict(NO_SPLIT)
    sizes = line.loc[usable, along].tolist()
    rate = done[usable] / seconds[usable]
    work_slope = loglog_slope(sizes, done[usable].tolist())
    rate_slope = loglog_slope(sizes, rate.tolist())
    if work_slope is None or rate_slope is None:
        return dict(NO_SPLIT)
    by_size = rate.groupby(line.loc[usable, along]).median()
    return {
        "work_exponent": work_slope,
        "rate_exponent": rate_slope,
        "rate_from": float(by_size.iloc[0]),
        "rate_to": float(by_size.iloc[-1]),
    }


# The range rule of a time line fitted where its rate settled (``attnbench.regime``).
SETTLED_RULE = f"the largest sizes where the rate settled (within {REGIME_BAND:.0%})"


def line_rates(line: pd.DataFrame, along: str, work: pd.Series) -> pd.Series:
    """A time line's rate (counted work per second) at each size, the median of its cases',
    by size ascending; sizes without a finite positive rate left out."""
    rate = work.reindex(line.index).astype(float) / line["time_s"].astype(float)
    rate = rate[np.isfinite(rate) & (rate > 0)]
    return rate.groupby(line.loc[rate.index, along]).median().sort_index()


def settled_line(line: pd.DataFrame, along: str, work: pd.Series) -> pd.DataFrame | None:
    """The rows of a time line where its rate (counted work per second) settled: its longest
    run of sizes within the regime's band, the largest such (``regime.settled_sizes``); None
    with too few such sizes."""
    rate = line_rates(line, along, work)
    sizes = settled_sizes(rate.index.tolist(), rate.tolist())
    return line[line[along].isin(sizes)] if sizes else None


class RangeKind(enum.StrEnum):
    """Which sizes an exponent was fitted on."""

    EXACT = "exact"  # every size: an exact count
    SETTLED = "settled"  # where the rate settled (``regime``)
    OVERHEAD = "overhead"  # where the fitted overhead is under half the time
    UPPER_HALF = "upper half"  # the upper half of the sizes


class RangeRule(str):
    """A range rule: the words the exponent table carries (``fit --json``, the report), and
    its ``kind``, which is what code reads."""

    kind: RangeKind

    def __new__(cls, kind: RangeKind, text: str) -> RangeRule:
        rule = super().__new__(cls, text)
        rule.kind = kind
        return rule


def range_rule(metric: str, overhead: float | None, settled: bool = False) -> RangeRule:
    if not METRIC[metric].overheads:
        return RangeRule(RangeKind.EXACT, "all sizes (exact count)")
    if settled:
        return RangeRule(RangeKind.SETTLED, SETTLED_RULE)
    if overhead is None:
        return RangeRule(RangeKind.UPPER_HALF, "upper half of sizes")
    return RangeRule(
        RangeKind.OVERHEAD,
        f"sizes where the fitted overhead {overhead * 1e6:.0f} µs is under half the time",
    )


def _agrees(
    fit: Exponent,
    slope: float,
    line: pd.DataFrame,
    along: str,
    metric: str,
    law: pd.Series | None,
) -> bool | None:
    """The verdict on a fitted exponent (``agreement.agrees``); exact counts that miss the
    law's slope agree all the same where they are the law plus a constant (``law_fits``)."""
    verdict = agrees(fit, slope)
    if verdict is not False or law is None or not METRIC[metric].exact:
        return verdict
    ordered = line.sort_values(along)
    values = law.reindex(ordered.index).astype(float).tolist()
    return law_fits(ordered[metric].astype(float).tolist(), values) or False


def _slope_over(line: pd.DataFrame, along: str, values: pd.Series | None) -> float:
    """The log-log slope of ``values`` (by the frame's index: the theory's law, the machine
    model's seconds) over a fitted line's sizes; nan without them."""
    if values is None:
        return math.nan
    found = loglog_slope(line[along].tolist(), values.reindex(line.index).astype(float).tolist())
    return math.nan if found is None else found


def exponent_table(
    measured: pd.DataFrame,
    fits: Mapping[str, list[ModelFit]] | None = None,
    layers: Layers | None = None,
    predicted: pd.Series | None = None,
) -> pd.DataFrame:
    """Log-log exponents of each metric along n (for each d) and along d (for each n).

    A time line whose rate settled over at least ``regime.REGIME_SIZES`` sizes (the largest
    such, at the top or below a later fall in the rate) is fitted there alone
    (``settled_line``): the regime where the time is the work's, not the machine's fixed costs
    or a rate still changing with size.

    Exact counts use every size. Any other time line uses the sizes where the layer's own
    fitted cost model says the constant overhead is under half the time (``fits``; upper half
    without them), and peak memory the upper half. ``theory`` is the slope of the theory's law
    over the same points, so a mixed formula such as 8·n·d² + 4·n²·d is judged on the range
    it was measured.
    ``model`` (time, with ``predicted``: the machine model's seconds by the frame's index) is
    the slope of the predicted time over the same points: where it sits near the measured
    exponent and away from the theory's, the machine bends the curve, not the layer.
    ``work_exponent`` and ``rate_exponent`` split a time exponent into the counted work's growth
    and the growth of the rate the machine ran it at (``split_time``).
    """
    rows: list[dict[str, Any]] = []
    for layer, group in measured.groupby("layer", sort=False):
        own = own_fit(fits, str(layer)) if fits else None
        for metric in (m.column for m in METRICS):
            if metric not in group:
                continue
            overheads = METRIC[metric].overheads
            values = numeric(group, metric)
            law = theory_values(values, metric, layers)
            order = order_values(values, metric, layers)
            work = counted_work(values) if metric == "time_s" else None
            kept = ["n", "d", metric]  # the lines below take rows: no other column
            if metric == "time_s":  # and the intervals a time's exponent's reads
                kept += [c for c in ("time_ci_low_s", "time_ci_high_s") if c in group]
            values = values.reindex(columns=kept)
            overhead = own.constant if own is not None and metric == "time_s" else None
            for along, other in (("n", "d"), ("d", "n")):
                for fixed, line in values.groupby(other):
                    if line[along].nunique() < 2:
                        continue
                    settled = settled_line(line, along, work) if work is not None else None
                    if settled is not None:
                        line = settled
                    elif overheads:
                        line = line[line[along].isin(fit_sizes(line, along, metric, overhead))]
                    errors = log_errors(line) if metric == "time_s" else None
                    fit = loglog_exponent(
                        line[along].tolist(), line[metric].astype(float).tolist(), errors
                    )
                    if fit is None:
                        continue
                    slope = _slope_over(line, along, law)
                    split = split_time(line, along, work)
                    model = _slope_over(line, along, predicted if metric == "time_s" else None)
                    rows.append(
                        {
                            "layer": layer,
                            "metric": metric,
                            "along": along,
                            "fixed": int(fixed),
                            "exponent": fit.slope,
                            "ci_low": fit.low,
                            "ci_high": fit.high,
                            "theory": slope,
                            "order": _slope_over(line, along, order),
                            "agrees": _agrees(fit, slope, line, along, metric, law),
                            "model": model,
                            **split,
                            "points": fit.points,
                            "range_from": int(fit.x_min),
                            "range_to": int(fit.x_max),
                            "range_rule": range_rule(metric, overhead, settled is not None),
                        }
                    )
    return pd.DataFrame(rows, columns=EXPONENT_COLUMNS)
