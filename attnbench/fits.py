"""Theory against measurements: exponents, cost models and crossovers (scipy).

Three views, each a tidy table:
- ``exponent_table``: log-log exponents of every metric in n and in d, with 95% intervals,
  beside the theory's own exponent over the same points;
- ``model_fits`` / ``model_table``: each formula of the table fitted to time by non-negative
  least squares (a·n²·d + b·n·d² + c), its relative RMS, and which formula fits a layer best;
- ``crossover_table``: the n at which attention becomes slower than an RNN or a convolution,
  measured and predicted.

A measured exponent says how a metric grows: time ~ n^a at fixed d means a ~ 2 for attention
and a ~ 1 for an RNN.  Small sizes are dominated by fixed overheads, so time is fitted only where
the layer's fitted constant is under half the time (``fit_sizes``), peak memory on the upper
half of the sizes, and exact counts (FLOPs, steps, path length) on all of them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import optimize, stats

from attnbench.layers import DEFAULTS
from attnbench.results import RunResults
from attnbench.theory import THEORY, Term


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
        return f"{var}^{self.slope:.2f}"


def loglog_exponent(x: Sequence[float], y: Sequence[float]) -> Exponent | None:
    """Least-squares slope of log y on log x, with its 95% t-interval; None below two points.

    Non-positive values (a constant zero, say) cannot be logged and are left out.
    """
    pairs = [(a, b) for a, b in zip(x, y, strict=True) if a > 0 and b > 0 and np.isfinite(b)]
    xs = np.array(sorted({a for a, _ in pairs}), dtype=float)
    if len(xs) < 2:
        return None
    lx = np.log([a for a, _ in pairs])
    ly = np.log([b for _, b in pairs])
    if np.ptp(ly) == 0:  # a constant: slope exactly 0 (linregress would give nan bounds)
        return Exponent(0.0, 0.0, 0.0, len(pairs), xs[0], xs[-1])
    fit = stats.linregress(lx, ly)
    if len(pairs) > 2:
        t = stats.t.ppf(0.975, len(pairs) - 2)
        low, high = fit.slope - t * fit.stderr, fit.slope + t * fit.stderr
    else:
        low = high = math.nan
    return Exponent(float(fit.slope), float(low), float(high), len(pairs), xs[0], xs[-1])


def upper_half(values: Sequence[int], minimum: int = 3) -> list[int]:
    """The larger half of the distinct sizes (at least ``minimum`` of them, when there are)."""
    distinct = sorted(set(values))
    keep = max(minimum, math.ceil(len(distinct) / 2))
    return distinct[-keep:]


# ---------------------------------------------------------------------------------------------
# Exponents of every metric, beside the theory's exponent over the same points.

# Metrics fitted, and whether their small sizes carry fixed overheads (fit the upper part only).
METRICS: dict[str, bool] = {
    "time_s": True,
    "peak_bytes": True,
    "flops": False,
    "seq_steps": False,
    "path_len": False,
}
EXPONENT_COLUMNS = [
    "layer",
    "metric",
    "along",  # "n" (at fixed d) or "d" (at fixed n)
    "fixed",  # the value of the other size
    "exponent",
    "ci_low",
    "ci_high",
    "theory",  # the theory's log-log slope over the same points (nan: no theory for the metric)
    "agrees",  # theory in the 95% interval (or within EXACT_TOLERANCE); None: cannot tell
    "points",
    "range_from",
    "range_to",
    "range_rule",  # how the sizes were chosen
]


def fit_frame(run: RunResults) -> pd.DataFrame:
    """The run's measured rows, with k and window filled in where a layer has none.

    A rival model needs them to be evaluated on any layer's sizes (the conv model on an RNN's
    cases, say); the run's own options are used, so the coefficients read in its units.
    """
    config = run.meta.get("config", {})
    fill = {
        "k": int(config.get("k") or DEFAULTS["k"]),
        "window": int(config.get("window") or DEFAULTS["window"]),
        "batch": int(config.get("batch") or 1),
    }
    frame = run.measured.copy()
    for column, value in fill.items():
        frame[column] = frame[column].fillna(value).astype(int)
    for column in ("n", "d"):
        frame[column] = frame[column].astype(int)
    return frame


def theory_values(frame: pd.DataFrame, metric: str) -> pd.Series | None:
    """The theory's value of ``metric`` for each case row, up to a constant; None without one."""
    if metric not in ("time_s", "flops", "seq_steps", "path_len"):
        return None
    values = []
    for layer, b, n, d, k, r in zip(
        frame["layer"], frame["batch"], frame["n"], frame["d"], frame["k"], frame["window"],
        strict=True,
    ):  # fmt: skip
        theory = THEORY.get(layer)
        if theory is None:
            values.append(math.nan)
        elif metric == "seq_steps":
            values.append(theory.sequential_law(n, k, r))
        elif metric == "path_len":
            values.append(theory.path_law(n, k, r))
        else:
            values.append(theory.flops(b, n, d, k, r))
    return pd.Series(values, index=frame.index, dtype=float)


def _numeric(frame: pd.DataFrame, column: str) -> pd.DataFrame:
    values = pd.to_numeric(frame[column], errors="coerce")
    return frame.assign(**{column: values}).dropna(subset=[column])


# A fixed overhead "dominates" a case while it is more than this share of the case's time.
OVERHEAD_SHARE = 0.5
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
    keep = [s for s in sizes if overhead <= OVERHEAD_SHARE * slowest[s]]
    return keep if len(keep) >= MIN_FIT_POINTS else sizes[-MIN_FIT_POINTS:]


def range_rule(metric: str, overhead: float | None) -> str:
    if not METRICS[metric]:
        return "all sizes (exact count)"
    if overhead is None:
        return "upper half of sizes"
    return f"sizes where the fitted overhead {overhead * 1e6:.0f} µs is under half the time"


def exponent_table(
    measured: pd.DataFrame, fits: Mapping[str, list[ModelFit]] | None = None
) -> pd.DataFrame:
    """Log-log exponents of each metric along n (for each d) and along d (for each n).

    Exact counts use every size. Time uses the sizes where the layer's own fitted cost model
    says the constant overhead is under half the time (``fits``; upper half without them), and
    peak memory the upper half. ``theory`` is the slope of the theory's law over the same
    points, so a mixed formula such as 8·n·d² + 4·n²·d is judged on the range it was measured.
    """
    rows: list[dict[str, Any]] = []
    for layer, group in measured.groupby("layer", sort=False):
        own = own_fit(fits, str(layer)) if fits else None
        for metric, overheads in METRICS.items():
            if metric not in group:
                continue
            values = _numeric(group, metric)
            law = theory_values(values, metric)
            overhead = own.constant if own is not None and metric == "time_s" else None
            for along, other in (("n", "d"), ("d", "n")):
                for fixed, line in values.groupby(other):
                    if line[along].nunique() < 2:
                        continue
                    if overheads:
                        line = line[line[along].isin(fit_sizes(line, along, metric, overhead))]
                    fit = loglog_exponent(line[along].tolist(), line[metric].astype(float).tolist())
                    if fit is None:
                        continue
                    slope = math.nan
                    if law is not None:
                        expected = law.loc[line.index].tolist()
                        theory_fit = loglog_exponent(line[along].tolist(), expected)
                        slope = theory_fit.slope if theory_fit else math.nan
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
                            "agrees": agrees(fit, slope),
                            "points": fit.points,
                            "range_from": int(fit.x_min),
                            "range_to": int(fit.x_max),
                            "range_rule": range_rule(metric, overhead),
                        }
                    )
    return pd.DataFrame(rows, columns=EXPONENT_COLUMNS)


# Exact counts carry lower-order terms (an RNN's 3n + 2 steps), which make a tiny interval miss
# the order's exponent; within this distance the order still holds.
EXACT_TOLERANCE = 0.05
# An interval this wide cannot tell n from n² apart: such a fit is reported, but not judged.
INCONCLUSIVE_WIDTH = 1.0


def agrees(fit: Exponent, theory: float) -> bool | None:
    """Whether the theory's exponent lies in the 95% interval (or within EXACT_TOLERANCE).

    None when there is nothing to judge: no theory, no interval, or an interval wider than
    ``INCONCLUSIVE_WIDTH`` (it would "agree" with almost any law).
    """
    if math.isnan(theory):
        return None
    if abs(fit.slope - theory) <= EXACT_TOLERANCE:
        return True
    if math.isnan(fit.low) or fit.high - fit.low > INCONCLUSIVE_WIDTH:
        return None
    return bool(fit.low <= theory <= fit.high)


# ---------------------------------------------------------------------------------------------
# Cost models: time ≈ Σ a_i · size_i + c, fitted with non-negative least squares.


@dataclass(frozen=True)
class CostModel:
    """One family of the formula table, as a model of time: its terms plus a constant."""

    name: str  # the table row: "self-attention"
    terms: tuple[Term, ...]
    layers: tuple[str, ...]  # the layers whose own model this is

    @property
    def formula(self) -> str:
        """Greek coefficients, since the sizes use b for batch: "α·b·n·d² + β·b·n²·d + γ"."""
        letters = "αβδεζ"
        parts = [f"{letters[i]}·{t.name}" for i, t in enumerate(self.terms)]
        return " + ".join([*parts, "γ"])


def cost_models() -> tuple[CostModel, ...]:
    """The distinct models of the formula table (layers with the same terms share one)."""
    models: dict[tuple[str, ...], CostModel] = {}
    for layer, theory in THEORY.items():
        key = tuple(t.name for t in theory.terms)
        if not key:
            continue
        if key in models:
            old = models[key]
            models[key] = CostModel(old.name, old.terms, (*old.layers, layer))
        else:
            models[key] = CostModel(theory.row or layer, theory.terms, (layer,))
    return tuple(models.values())


@dataclass(frozen=True)
class ModelFit:
    """A cost model fitted to one layer's medians over all its measured sizes."""

    model: CostModel
    coefficients: tuple[float, ...]  # seconds per unit of each term's size
    constant: float  # seconds
    rms: float  # RMS of the residuals divided by the mean time, as google-benchmark reports it
    aicc: float  # corrected Akaike criterion on the relative residuals (lower is better)
    points: int

    def predict(self, sizes: np.ndarray) -> np.ndarray:
        """Time for rows of term sizes, shape (points, terms)."""
        return sizes @ np.array(self.coefficients) + self.constant

    def flops_per_s(self) -> tuple[float, ...]:
        """Each term's implied throughput: its FLOPs per unit of size over its coefficient."""
        return tuple(
            t.flops / a if a > 0 else math.inf
            for t, a in zip(self.model.terms, self.coefficients, strict=True)
        )


def term_sizes(frame: pd.DataFrame, terms: Sequence[Term]) -> np.ndarray:
    """The design matrix: each case's size for each term, shape (cases, terms)."""
    cases = zip(frame["batch"], frame["n"], frame["d"], frame["k"], frame["window"], strict=True)
    rows = [[t.size(b, n, d, k, r) for t in terms] for b, n, d, k, r in cases]
    return np.array(rows, dtype=float).reshape(len(frame), len(terms))


def fit_cost_model(
    frame: pd.DataFrame, model: CostModel, metric: str = "time_s"
) -> ModelFit | None:
    """Non-negative least squares on relative errors; None with too few points for the model.

    Times span orders of magnitude, so each row is divided by its measured time (as
    google-benchmark minimises relative error); columns are scaled to one before NNLS.
    """
    values = _numeric(frame, metric)
    y = values[metric].to_numpy(dtype=float)
    params = len(model.terms) + 1
    if len(y) < params + 2 or (y <= 0).any():
        return None
    design = np.column_stack([term_sizes(values, model.terms), np.ones(len(y))])  # (N, p)
    weighted = design / y[:, None]
    scale = np.abs(weighted).max(axis=0)
    scale[scale == 0] = 1.0
    solution, _ = optimize.nnls(weighted / scale, np.ones(len(y)))
    coef = solution / scale
    fitted = design @ coef
    rms = math.sqrt(float(np.mean((y - fitted) ** 2))) / float(np.mean(y))
    rss = max(float(np.sum(((y - fitted) / y) ** 2)), 1e-300)
    n = len(y)
    aicc = n * math.log(rss / n) + 2 * params + 2 * params * (params + 1) / (n - params - 1)
    return ModelFit(model, tuple(float(a) for a in coef[:-1]), float(coef[-1]), rms, aicc, n)


MODEL_COLUMNS = [
    "layer",
    "model",
    "formula",
    "own",  # the layer's own model
    "best",  # lowest AICc among the models fitted to this layer
    "rms",
    "aicc",
    "coefficients",  # {term: seconds per unit}
    "constant_s",
    "gflops_per_s",  # {term: implied GFLOP/s}
    "points",
]


def model_fits(measured: pd.DataFrame, metric: str = "time_s") -> dict[str, list[ModelFit]]:
    """Every model of the table fitted to every layer, best first (ties go to the own model)."""
    fits: dict[str, list[ModelFit]] = {}
    for layer, group in measured.groupby("layer", sort=False):
        found = [f for m in cost_models() if (f := fit_cost_model(group, m, metric)) is not None]
        found.sort(key=lambda f: (round(f.aicc, 6), str(layer) not in f.model.layers))
        if found:
            fits[str(layer)] = found
    return fits


def model_table(fits: Mapping[str, list[ModelFit]]) -> pd.DataFrame:
    """One row per (layer, model): coefficients, relative RMS, AICc, and which fits best."""
    rows = []
    for layer, found in fits.items():
        for rank, f in enumerate(found):
            rows.append(
                {
                    "layer": layer,
                    "model": f.model.name,
                    "formula": f.model.formula,
                    "own": layer in f.model.layers,
                    "best": rank == 0,
                    "rms": f.rms,
                    "aicc": f.aicc,
                    "coefficients": {
                        t.name: a for t, a in zip(f.model.terms, f.coefficients, strict=True)
                    },
                    "constant_s": f.constant,
                    "gflops_per_s": {
                        t.name: g / 1e9 for t, g in zip(f.model.terms, f.flops_per_s(), strict=True)
                    },
                    "points": f.points,
                }
            )
    return pd.DataFrame(rows, columns=MODEL_COLUMNS)


def own_fit(fits: Mapping[str, list[ModelFit]], layer: str) -> ModelFit | None:
    """The layer's own model among its fits."""
    return next((f for f in fits.get(layer, []) if layer in f.model.layers), None)


# ---------------------------------------------------------------------------------------------
# Crossovers: the n at which attention becomes more expensive than a recurrent or conv layer.

CROSSOVER_COLUMNS = [
    "d",
    "layer",
    "versus",
    "measured_n",  # interpolated in log-log between the sweep's sizes (nan: not inside the range)
    "measured",  # the same, in words: "≈ 362", "below 64", "above 1024"
    "theory_flops_n",  # where the full FLOP formulas cross (0: from n = 1 on; nan: never)
    "theory_flops",
    "theory_order_n",  # where the chapter's orders cross: n²·d = n·d² gives n = d
    "theory_order",
]

QUADRATIC = "b·n²·d"  # the term that makes a layer's cost quadratic in n


def quadratic_layers(layers: Sequence[str]) -> list[str]:
    return [x for x in layers if x in THEORY and QUADRATIC in (t.name for t in THEORY[x].terms)]


def rival_layers(layers: Sequence[str]) -> list[str]:
    """Recurrent and convolutional layers: the ones attention is set against in the chapter."""
    rows = ("recurrent", "convolutional", "convolutional (dilated)")
    return [x for x in layers if x in THEORY and THEORY[x].row in rows]


def measured_crossover(ns: Sequence[float], ratio: Sequence[float]) -> float:
    """The n where ``ratio`` (attention time / rival time) last rises through 1, log-log.

    -inf when attention is already slower at the smallest n; inf when it is faster throughout,
    or faster again at the largest n.
    """
    logs = np.log(np.asarray(ratio, dtype=float))
    if (logs >= 0).all():
        return -math.inf
    if (logs < 0).all():
        return math.inf
    rises = [i for i in range(1, len(logs)) if logs[i - 1] < 0 <= logs[i]]
    if not rises or logs[-1] < 0:
        return math.inf
    last = rises[-1]
    x0, x1 = math.log(ns[last - 1]), math.log(ns[last])
    y0, y1 = logs[last - 1], logs[last]
    return math.exp(x0 + (x1 - x0) * (0 - y0) / (y1 - y0))


def formula_crossover(cost: Callable[[float], float], upper: float = 2.0**40) -> float:
    """The smallest n ≥ 1 where ``cost(n)`` (attention minus rival) turns positive; nan if never.

    0 when it is positive from n = 1 on.
    """
    grid = np.geomspace(1, upper, 481)
    values = np.array([cost(n) for n in grid])
    if values[0] > 0:
        return 0.0
    above = np.nonzero(values > 0)[0]
    if not len(above):
        return math.nan
    i = int(above[0])
    return float(optimize.brentq(cost, grid[i - 1], grid[i], xtol=1e-9, rtol=1e-12))


def _predicted(n: float) -> str:
    if n == 0:
        return "every n"
    return "never" if math.isnan(n) else f"≈ {n:.0f}"


def _describe(n: float, ns: Sequence[int]) -> str:
    if n == -math.inf:
        return f"below {min(ns)}"
    if n == math.inf:
        return f"above {max(ns)}"
    return f"≈ {n:.0f}"


def time_ratios(measured: pd.DataFrame) -> dict[tuple[int, str, str], pd.Series]:
    """Attention's median time over each rival's, per d, indexed by the n both measured.

    Keyed by (d, attention layer, rival); the crossover table and chart both read these.
    """
    layers = list(dict.fromkeys(measured["layer"]))
    ratios = {}
    for d, at_d in measured.groupby("d"):
        medians = at_d.pivot_table(index="n", columns="layer", values="time_s")
        for layer in quadratic_layers(layers):
            for rival in rival_layers(layers):
                if layer in medians and rival in medians:
                    both = medians[[layer, rival]].dropna()
                    ratios[(int(d), layer, rival)] = both[layer] / both[rival]
    return ratios


def crossover_table(measured: pd.DataFrame) -> pd.DataFrame:
    """For each d and each (attention, rival) pair: measured and predicted crossover n."""
    rows = []
    for (d, layer, rival), ratio in time_ratios(measured).items():
        at_d = measured[measured["d"] == d]
        mine = at_d[at_d["layer"] == layer].iloc[0]
        theirs = at_d[at_d["layer"] == rival].iloc[0]
        a, o = THEORY[layer], THEORY[rival]
        b, d_ = int(mine.batch), int(d)
        ka, ra, ko, ro = int(mine.k), int(mine.window), int(theirs.k), int(theirs.window)

        def flops_gap(n: float, a=a, o=o, b=b, d_=d_, k=(ka, ko), r=(ra, ro)) -> float:
            return a.flops(b, n, d_, k[0], r[0]) - o.flops(b, n, d_, k[1], r[1])

        def order_gap(n: float, a=a, o=o, b=b, d_=d_, k=(ka, ko), r=(ra, ro)) -> float:
            return a.order(b, n, d_, k[0], r[0]) - o.order(b, n, d_, k[1], r[1])

        found = math.nan
        words = "no common n"
        if len(ratio) >= 2:
            ns = ratio.index.tolist()
            found = measured_crossover(ns, ratio.tolist())
            words = _describe(found, ns)
        rows.append(
            {
                "d": d_,
                "layer": layer,
                "versus": rival,
                "measured_n": found if math.isfinite(found) else math.nan,
                "measured": words,
                "theory_flops_n": (by_flops := formula_crossover(flops_gap)),
                "theory_flops": _predicted(by_flops),
                "theory_order_n": (by_order := formula_crossover(order_gap)),
                "theory_order": _predicted(by_order),
            }
        )
    return pd.DataFrame(rows, columns=CROSSOVER_COLUMNS)


# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Analysis:
    """Everything fitted from one run, computed once for the charts, the report and the CLI."""

    frame: pd.DataFrame  # measured rows, options filled (fit_frame)
    fits: dict[str, list[ModelFit]]  # per layer, best first
    exponents: pd.DataFrame  # EXPONENT_COLUMNS
    models: pd.DataFrame  # MODEL_COLUMNS
    crossovers: pd.DataFrame  # CROSSOVER_COLUMNS

    def exponent(self, layer: str, metric: str, along: str, fixed: int) -> pd.Series | None:
        e = self.exponents
        hit = e[(e.layer == layer) & (e.metric == metric) & (e.along == along) & (e.fixed == fixed)]
        return None if hit.empty else hit.iloc[0]


def analyse(run: RunResults, layers: Sequence[str] | None = None) -> Analysis:
    """Fit a run's measured cases (optionally only some layers)."""
    frame = fit_frame(run)
    if layers:
        frame = frame[frame["layer"].isin(layers)]
    found = model_fits(frame)
    return Analysis(
        frame=frame,
        fits=found,
        exponents=exponent_table(frame, found),
        models=model_table(found),
        crossovers=crossover_table(frame)
        if len(frame)
        else pd.DataFrame(columns=CROSSOVER_COLUMNS),
    )
