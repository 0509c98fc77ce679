"""Cost models: time ≈ Σ a_i · size_i + c, each formula of the table fitted by non-negative
least squares (scipy ``nnls``), with its relative RMS and which formula fits a layer best."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import optimize

from attnbench.layers.entry import CUSTOM
from attnbench.layers.registry import REGISTRY, known_options
from attnbench.theory import Term, sizes


def numeric(frame: pd.DataFrame, column: str) -> pd.DataFrame:
    values = pd.to_numeric(frame[column], errors="coerce")
    return frame.assign(**{column: values}).dropna(subset=[column])


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
    for layer, found in REGISTRY.items():
        theory = found.theory
        key = tuple(t.name for t in theory.terms) if theory is not None else ()
        if not key:
            continue
        if key in models:
            old = models[key]
            models[key] = CostModel(old.name, old.terms, (*old.layers, layer))
        else:
            name = found.family.row if found.family is not CUSTOM else layer
            models[key] = CostModel(name, theory.terms, (layer,))  # type: ignore[union-attr]
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


def size_rows(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Each case's sizes as its layer's theory reads them: b, n, d and every layer option."""
    names = [name for name in known_options() if name in frame.columns]
    records = frame[["batch", "n", "d", *names]].to_dict("records")
    return [sizes(r.pop("batch"), r.pop("n"), r.pop("d"), r) for r in records]


def term_sizes(frame: pd.DataFrame, terms: Sequence[Term]) -> np.ndarray:
    """The design matrix: each case's size for each term, shape (cases, terms)."""
    rows = [[t.size(s) for t in terms] for s in size_rows(frame)]
    return np.array(rows, dtype=float).reshape(len(frame), len(terms))


def fit_cost_model(
    frame: pd.DataFrame, model: CostModel, metric: str = "time_s"
) -> ModelFit | None:
    """Non-negative least squares on relative errors; None with too few points for the model.

    Times span orders of magnitude, so each row is divided by its measured time (as
    google-benchmark minimises relative error); columns are scaled to one before NNLS.
    """
    values = numeric(frame, metric)
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
