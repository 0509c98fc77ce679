"""Cost models: time ≈ Σ a_i · size_i + c, each formula of the table fitted by non-negative
least squares (scipy ``nnls``), with its relative RMS and which formula fits a layer best.

A layer's model has a column for each size of its FLOP formula and of its elementwise formula
(``LayerTheory.model_terms``): the softmax over b·h·n² scores costs time without a FLOP.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pandas as pd

from attnbench.layers.entry import CUSTOM, LayerEntry, LayerOption
from attnbench.layers.registry import REGISTRY
from attnbench.schema import numeric_column
from attnbench.theory import Term, sizes

# The layers an analysis reads, by name: a run's catalog (``results.theories``), which holds no
# code of a plugin's; None: the layers registered in this process.
Layers = Mapping[str, LayerEntry]


def layers_or_live(layers: Layers | None) -> Layers:
    return REGISTRY if layers is None else layers


def options_of(layers: Layers | None) -> dict[str, LayerOption]:
    """Every option some layer declares, by name (the first declaration)."""
    found: dict[str, LayerOption] = {}
    for entry in layers_or_live(layers).values():
        for option in entry.options:
            found.setdefault(option.name, option)
    return found


def numeric(frame: pd.DataFrame, column: str) -> pd.DataFrame:
    """The rows of ``frame`` whose ``column`` holds a number, that column as floats."""
    values = numeric_column(frame, column)
    kept = values.notna().to_numpy()
    out = frame[kept] if not kept.all() else frame.copy()  # a boolean mask: dropna's cost /3
    return out.assign(**{column: values[kept]})


LETTERS = "αβδεζηθκλμ"  # the coefficients' names in a formula, term by term (γ: constant)


@dataclass(frozen=True)
class CostModel:
    """One family of the formula table, as a model of time: its terms plus a constant."""

    name: str  # the table row: "self-attention"
    terms: tuple[Term, ...]
    layers: tuple[str, ...]  # the layers whose own model this is

    @property
    def formula(self) -> str:
        """Greek coefficients, since the sizes use b for batch: "α·b·n·d² + β·b·n²·d + γ"."""
        parts = [f"{LETTERS[i]}·{t.name}" for i, t in enumerate(self.terms)]
        return " + ".join([*parts, "γ"])


def cost_models(layers: Layers | None = None) -> tuple[CostModel, ...]:
    """The distinct models of the formula table (layers with the same terms share one)."""
    models: dict[tuple[str, ...], CostModel] = {}
    for layer, found in layers_or_live(layers).items():
        theory = found.theory
        terms = theory.model_terms if theory is not None else ()
        key = tuple(t.name for t in terms)
        if not key:
            continue
        if key in models:
            old = models[key]
            models[key] = CostModel(old.name, old.terms, (*old.layers, layer))
        else:
            name = found.family.row if found.family != CUSTOM else layer
            if any(m.name == name for m in models.values()):  # a family with several models
                name = f"{name} ({layer})"
            models[key] = CostModel(name, terms, (layer,))
    return tuple(models.values())


ZERO_TERM = "0"  # a twin of nothing: a term zero at every size fitted (``ModelFit.twins``)


@dataclass(frozen=True)
class ModelFit:
    """A cost model fitted to one layer's medians over all its measured sizes."""

    model: CostModel
    coefficients: tuple[float, ...]  # seconds per unit of each term's size
    constant: float  # seconds
    rms: float  # RMS of the residuals divided by the mean time, as google-benchmark reports it
    aicc: float  # corrected Akaike criterion on the relative residuals (lower is better)
    points: int
    # (term, the term or "γ" it is a multiple of over the sizes fitted): not told apart from
    # it, so not fitted apart (``_twins``); its coefficient is 0, and its time is the other's.
    # ``ZERO_TERM`` in place of the other: the term is 0 at every size (a batch of 1, a run
    # without --causal), with no time to fit.
    twins: tuple[tuple[str, str], ...] = ()

    def predict(self, sizes: np.ndarray) -> np.ndarray:
        """Time for rows of term sizes, shape (points, terms)."""
        return cast("np.ndarray", sizes @ np.array(self.coefficients) + self.constant)

    def throughput(self, unit: str, counts: Mapping[str, float] | None = None) -> dict[str, float]:
        """Each ``unit`` term's implied throughput (FLOP/s or elements/s): its count per unit
        of size over its coefficient (inf for a term the fit gave no time). ``counts``: the
        fitted layer's own count of a term, where its formula has it. Layers with the same
        terms share one model, named and counted after the first: gru's 6·b·n·d² priced at
        rnn's 2 read 1.37 GFLOP/s where its sweep ran 3.8-4.1."""
        own = counts or {}
        return {
            t.name: own.get(t.name, t.count) / a if a > 0 else math.inf
            for t, a in zip(self.model.terms, self.coefficients, strict=True)
            if t.unit == unit
        }


def term_counts(layer: str, layers: Layers | None = None) -> dict[str, float]:
    """A layer's own count of each term of its cost model, by name ({} without a theory)."""
    found = layers_or_live(layers).get(layer)
    theory = found.theory if found is not None else None
    return {t.name: t.count for t in theory.model_terms} if theory is not None else {}


def size_rows(frame: pd.DataFrame, layers: Layers | None = None) -> list[dict[str, Any]]:
    """Each case's sizes as its layer's theory reads them: b, n, d and every layer option
    (its default where the frame has no column for it)."""
    options = options_of(layers)
    names = [name for name in options if name in frame.columns]
    defaults = {name: o.default for name, o in options.items() if name not in frame.columns}
    records = frame[["batch", "n", "d", *names]].to_dict("records")
    return [sizes(r.pop("batch"), r.pop("n"), r.pop("d"), {**defaults, **r}) for r in records]


def term_sizes(
    frame: pd.DataFrame, terms: Sequence[Term], layers: Layers | None = None
) -> np.ndarray:
    """The design matrix: each case's size for each term, shape (cases, terms); NaN where a
    recorded term was not evaluated (a plugin's term at another layer's sizes)."""
    rows = [[t.size(s) for t in terms] for s in size_rows(frame, layers)]
    return np.array(rows, dtype=float).reshape(len(frame), len(terms))


def _system(
    frame: pd.DataFrame, model: CostModel, metric: str, layers: Layers | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[int, int]]:
    """The times y (N,), the design matrix with a constant column (N, p), which columns can
    be fitted, and the twins left out of them (``_twins``): a term that is zero on every case
    (the causal mask of a run without --causal) keeps a zero coefficient and does not count
    as a parameter, nor does a multiple of another."""
    values = numeric(frame, metric)
    y = values[metric].to_numpy(dtype=float)
    design = np.column_stack([term_sizes(values, model.terms, layers), np.ones(len(y))])  # (N, p)
    present = np.abs(design).max(axis=0) > 0 if len(y) else np.ones(design.shape[1], bool)
    present[-1] = True
    twins = _twins(design, present) if np.isfinite(design).all() else {}
    present[list(twins)] = False
    return y, design, present, twins


def _twins(design: np.ndarray, present: np.ndarray) -> dict[int, int]:
    """Each column that is a multiple of another over these cases, to that one (the constant
    first, then the terms in order): at one width b·n·d is b·n·d² over d, and d·N a constant,
    so no fit can tell their times apart. NNLS had split it anyway and "no time seen" was
    said of the term it left at zero: attention's five parameters at one d are three."""
    if not len(design):
        return {}
    order = [design.shape[1] - 1, *range(design.shape[1] - 1)]  # (p,): the constant's first
    unit = design / np.where(present, np.abs(design).max(axis=0), 1.0)  # (N, p)
    kept: list[int] = []
    twins: dict[int, int] = {}
    for j in (j for j in order if present[j]):
        same = [i for i in kept if np.allclose(unit[:, j], unit[:, i], rtol=1e-9, atol=1e-12)]
        if same:
            twins[j] = same[0]
        else:
            kept.append(j)
    return twins


def fit_cost_model(
    frame: pd.DataFrame, model: CostModel, metric: str = "time_s", layers: Layers | None = None
) -> ModelFit | None:
    """Non-negative least squares on relative errors; None with too few points for the model,
    or where its terms are not known at every point (``why_unfitted`` says which).

    Times span orders of magnitude, so each row is divided by its measured time (as
    google-benchmark minimises relative error); columns are scaled to one before NNLS.
    """
    from scipy import optimize  # lazy: scipy costs 0.8 s to import

    y, design, present, twins = _system(frame, model, metric, layers)
    if not np.isfinite(design).all():
        return None
    params = int(present.sum())
    if len(y) < params + 2 or (y <= 0).any():
        return None
    weighted = design[:, present] / y[:, None]
    scale = np.abs(weighted).max(axis=0)
    solution, _ = optimize.nnls(weighted / scale, np.ones(len(y)))
    coef = np.zeros(design.shape[1])
    coef[present] = solution / scale
    fitted = design @ coef
    rms = math.sqrt(float(np.mean((y - fitted) ** 2))) / float(np.mean(y))
    rss = max(float(np.sum(((y - fitted) / y) ** 2)), 1e-300)
    n = len(y)
    # AICc counts the coefficients NNLS left positive: a term held at zero spends no degree of
    # freedom. NNLS projects onto a convex cone, whose degrees of freedom are the expected
    # dimension of the face it lands on, here its active set (Meyer & Woodroofe, "On the
    # degrees of freedom in shape-restricted regression", Ann. Statist. 2000; the lasso's
    # nonzero coefficients likewise, Zou, Hastie & Tibshirani 2007). Counted as present,
    # attention's model, fitted with two terms, lost to a two-term model 5x its RMS.
    k = max(1, int(np.count_nonzero(solution)))
    aicc = n * math.log(rss / n) + 2 * k + 2 * k * (k + 1) / (n - k - 1)
    names = [t.name for t in model.terms] + ["γ"]
    other = {j: names[i] for j, i in twins.items()}
    other |= {int(j): ZERO_TERM for j in np.flatnonzero(~present) if j not in twins}  # b = 1
    paired = tuple((names[j], other[j]) for j in sorted(other))
    return ModelFit(
        model, tuple(float(a) for a in coef[:-1]), float(coef[-1]), rms, aicc, n, paired
    )


def why_unfitted(
    frame: pd.DataFrame, model: CostModel, metric: str = "time_s", layers: Layers | None = None
) -> str | None:
    """Why ``fit_cost_model`` gives no fit of ``model`` to these cases, in words (None: it fits).

    The fit needs two more measured cases than parameters (terms present, and the constant),
    so the residual has degrees of freedom left for AICc.
    """
    y, design, present, twins = _system(frame, model, metric, layers)
    if not np.isfinite(design).all():
        return "its terms are not known at every measured size"
    if (y <= 0).any():
        return "a measured time is not positive"
    params = int(present.sum())
    if len(y) >= params + 2:
        return None
    widths = sorted({int(d) for d in frame["d"]})
    where = f", all at d={widths[0]}" if len(widths) == 1 else ""
    zero = int((~present).sum()) - len(twins)  # zero at every case (a batch of 1, no --causal)
    why = [f"{zero} of its terms zero at every size measured"] if zero else []
    why += [f"{len(twins)} a multiple of another there"] if twins else []
    held = f" here ({'; '.join(why)})" if why else ""
    return (
        f"its model {model.formula} has {params} parameters{held} and needs {params + 2} "
        f"measured cases; the run has {len(y)}{where}: more lengths (--n) or widths (--d) give "
        "it enough"
    )


def unfitted_models(
    measured: pd.DataFrame, fits: Mapping[str, list[ModelFit]], layers: Layers | None = None
) -> dict[str, str]:
    """Each measured layer whose own cost model was not fitted, and why."""
    models = cost_models(layers)
    why: dict[str, str] = {}
    for layer, group in measured.groupby("layer", sort=False):
        own = next((m for m in models if layer in m.layers), None)
        if own is None:
            why[str(layer)] = "it declares no FLOP or elementwise terms, so it has no cost model"
        elif not any(f.model == own for f in fits.get(str(layer), [])):
            why[str(layer)] = why_unfitted(group, own, layers=layers) or "no fit"
    return why


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
    "gflops_per_s",  # {FLOP term: implied GFLOP/s}
    "gelements_per_s",  # {elementwise term: implied billions of elements/s}
    "points",
    "twins",  # {term: the term or "γ" it was not told apart from, or "0": zero at every size}
]


def model_fits(
    measured: pd.DataFrame, metric: str = "time_s", layers: Layers | None = None
) -> dict[str, list[ModelFit]]:
    """Every model of the table fitted to every layer, best first (ties go to the own model)."""
    fits: dict[str, list[ModelFit]] = {}
    models = cost_models(layers)
    for layer, group in measured.groupby("layer", sort=False):
        found = [f for m in models if (f := fit_cost_model(group, m, metric, layers)) is not None]
        found.sort(key=lambda f: (round(f.aicc, 6), str(layer) not in f.model.layers))
        if found:
            fits[str(layer)] = found
    return fits


def model_table(fits: Mapping[str, list[ModelFit]], layers: Layers | None = None) -> pd.DataFrame:
    """One row per (layer, model): coefficients, relative RMS, AICc, and which fits best; each
    term's throughput read with the layer's own count of it (``ModelFit.throughput``)."""
    rows = []
    for layer, found in fits.items():
        counts = term_counts(layer, layers)
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
                    "gflops_per_s": {t: g / 1e9 for t, g in f.throughput("FLOP", counts).items()},
                    "gelements_per_s": {
                        t: g / 1e9 for t, g in f.throughput("element", counts).items()
                    },
                    "points": f.points,
                    "twins": dict(f.twins),
                }
            )
    return pd.DataFrame(rows, columns=MODEL_COLUMNS)


def own_fit(fits: Mapping[str, list[ModelFit]], layer: str) -> ModelFit | None:
    """The layer's own model among its fits."""
    return next((f for f in fits.get(layer, []) if layer in f.model.layers), None)
