"""Theory against measurements: exponents, cost models and crossovers (scipy).

Three views, each a tidy table:
- ``exponent_table``: log-log exponents of every metric in n and in d, with 95% intervals,
  beside the theory's own exponent over the same points;
- ``model_fits`` / ``model_table``: each formula of the table fitted to time by non-negative
  least squares (a·n²·d + b·n·d² + ... + c, one term per size of the layer's FLOP and
  elementwise formulas), its relative RMS, and which formula fits a layer best;
- ``crossover_table``: the n at which attention becomes slower than a rival layer (an RNN, a
  convolution, a state-space scan), measured and predicted.

A measured exponent says how a metric grows: time ~ n^a at fixed d means a ~ 2 for attention
and a ~ 1 for an RNN.  Small sizes are dominated by fixed overheads, so time is fitted only where
the layer's fitted constant is under half the time (``fit_sizes``), peak memory on the upper
half of the sizes, and exact counts (FLOPs, steps, path length) on all of them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd

from attnbench.fits.agreement import agrees as agrees
from attnbench.fits.crossovers import (
    CROSSOVER_COLUMNS,
    crossover_table,
    describe_crossover,
    formula_crossover,
    measured_crossover,
    quadratic_layers,
    rival_layers,
    time_ratios,
)
from attnbench.fits.exponents import (
    EXPONENT_COLUMNS,
    Exponent,
    exponent_table,
    fit_sizes,
    loglog_exponent,
    loglog_slope,
    range_rule,
    theory_values,
    upper_half,
)
from attnbench.fits.models import (
    LETTERS,
    MODEL_COLUMNS,
    CostModel,
    Layers,
    ModelFit,
    cost_models,
    fit_cost_model,
    model_fits,
    model_table,
    options_of,
    own_fit,
    term_sizes,
    unfitted_models,
    why_unfitted,
)
from attnbench.fits.roofline import (
    PREDICTION_COLUMNS,
    EffectiveCeilings,
    effective_ceilings,
    predict,
    relative_rms,
    rounds_rms,
    split_rms,
)
from attnbench.measure.machine.ceilings import Ceilings
from attnbench.results.run import RunResults, mode_of
from attnbench.results.theories import Catalog, catalog

__all__ = [
    "CROSSOVER_COLUMNS",
    "EXPONENT_COLUMNS",
    "LETTERS",
    "MODEL_COLUMNS",
    "Analysis",
    "Catalog",
    "CostModel",
    "EffectiveCeilings",
    "Exponent",
    "Layers",
    "ModelFit",
    "agrees",
    "analyse",
    "cost_models",
    "crossover_table",
    "describe_crossover",
    "effective_ceilings",
    "exponent_table",
    "fit_cost_model",
    "fit_frame",
    "fit_sizes",
    "formula_crossover",
    "loglog_exponent",
    "loglog_slope",
    "measured_crossover",
    "model_fits",
    "model_table",
    "own_fit",
    "predict",
    "quadratic_layers",
    "range_rule",
    "relative_rms",
    "rival_layers",
    "rounds_rms",
    "run_catalog",
    "split_rms",
    "term_sizes",
    "theory_values",
    "time_ratios",
    "unfitted_models",
    "upper_half",
    "why_unfitted",
]


MACHINE_COLUMNS = [
    "layer",
    "cases",
    "bounds",
    "model_rms",
    "kernel_rms",
    "overhead_rms",
    "nnls_rms",
    "rounds_rms",
]


def run_catalog(run: RunResults) -> Catalog:
    """The layers of a run as its analysis reads them: no plugin's code, only its record."""
    return catalog(run.frame["layer"], run.theories, run.mode)


def fit_frame(run: RunResults, layers: Layers | None = None) -> pd.DataFrame:
    """The run's measured rows, with every layer option filled in where a layer has none.

    A rival model needs them to be evaluated on any layer's sizes (the conv model on an RNN's
    cases, say); the run's own options are used (an option's default where the run gave none),
    so the coefficients read in its units.
    """
    config = run.record.config
    frame = run.measured.copy()
    for name, option in options_of(layers if layers is not None else run_catalog(run)).items():
        given = config.get(name)
        value = given if isinstance(given, int) and given else option.default
        column = frame[name] if name in frame.columns else pd.Series(pd.NA, index=frame.index)
        frame[name] = column.fillna(value).astype(int)
    frame["batch"] = frame["batch"].fillna(config.get("batch") or 1).astype(int)
    for column in ("n", "d"):
        frame[column] = frame[column].astype(int)
    return frame


@dataclass(frozen=True)
class Analysis:
    """Everything fitted from one run, computed once for the charts, the report and the CLI."""

    frame: pd.DataFrame  # measured rows, options filled (fit_frame)
    fits: dict[str, list[ModelFit]]  # per layer, best first
    exponents: pd.DataFrame  # EXPONENT_COLUMNS
    models: pd.DataFrame  # MODEL_COLUMNS
    crossovers: pd.DataFrame  # CROSSOVER_COLUMNS
    layers: Catalog  # the layers read (no plugin code: their recorded theory)
    unfitted: dict[str, str]  # layer -> why its own cost model was not fitted
    # The machine model (fits.roofline) from the ceilings the run recorded: PREDICTION_COLUMNS
    # by the frame's index (empty without ceilings), and the all-layer NNLS fit of its terms.
    machine: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=PREDICTION_COLUMNS))
    effective: EffectiveCeilings | None = None
    ceilings: Ceilings | None = None  # the machine the run recorded (None: not recorded)
    # Per layer, how far the run's timing rounds are from each other (``roofline.rounds_rms``):
    # the floor under the model's error; empty where the run did not keep rounds.
    rounds: pd.Series = field(default_factory=lambda: pd.Series(dtype=float))

    @property
    def mode(self) -> str:
        """What the run's calls were: forward, train or decode (one generation step)."""
        return mode_of(self.frame)

    def machine_table(self) -> pd.DataFrame:
        """Per layer: cases, the bound of most of them, how far the machine model (nothing
        fitted) and the all-layer NNLS fit are from the measured times (relative RMS), the
        model's kernel terms from the measured kernels' time and its latency from the
        overhead (``roofline.split_rms``: a miss located), and how far the run's rounds are
        from each other (the floor under all of them)."""
        rows = []
        if self.machine.empty:
            return pd.DataFrame(columns=MACHINE_COLUMNS)
        split = [c for c in ("kernel_time_s",) if c in self.frame]
        joined = self.frame[["layer", "time_s", *split]].join(self.machine, how="inner")
        nnls = self.effective.predicted if self.effective is not None else None
        for layer, group in joined.groupby("layer", sort=False):
            bounds = group["bound"].value_counts()
            fitted = (
                relative_rms(group["time_s"], nnls.reindex(group.index))
                if nnls is not None
                else float("nan")
            )
            kernel_rms, overhead_rms = split_rms(group, group)
            rows.append(
                {
                    "layer": layer,
                    "cases": len(group),
                    "bounds": ", ".join(f"{b} {c}" for b, c in bounds.items()),
                    "model_rms": relative_rms(group["time_s"], group["predicted_time_s"]),
                    "kernel_rms": kernel_rms,
                    "overhead_rms": overhead_rms,
                    "nnls_rms": fitted,
                    "rounds_rms": float(self.rounds.get(layer, math.nan)),
                }
            )
        return pd.DataFrame(rows, columns=MACHINE_COLUMNS)

    def exponent(self, layer: str, metric: str, along: str, fixed: int) -> pd.Series | None:
        e = self.exponents
        hit = e[(e.layer == layer) & (e.metric == metric) & (e.along == along) & (e.fixed == fixed)]
        return None if hit.empty else hit.iloc[0]


def analyse(run: RunResults, layers: Sequence[str] | None = None) -> Analysis:
    """Fit a run's measured cases (optionally only some layers), reading no layer's code."""
    known = run_catalog(run)
    frame = fit_frame(run, known)
    if layers:
        frame = frame[frame["layer"].isin(layers)]
    found = model_fits(frame, layers=known)
    # The machine model prices whole calls' products at the widths its ceilings were measured
    # at; a decode step's one-row products fall below them (it read 24-159x off): not applied.
    ceilings = run.ceilings if run.mode != "decode" else None
    machine = (
        predict(frame, ceilings)
        if ceilings is not None
        else pd.DataFrame(columns=PREDICTION_COLUMNS)
    )
    predicted = machine["predicted_time_s"].astype(float) if len(machine) else None
    return Analysis(
        frame=frame,
        fits=found,
        exponents=exponent_table(frame, found, known, predicted),
        models=model_table(found, known),
        crossovers=crossover_table(frame, known)
        if len(frame)
        else pd.DataFrame(columns=CROSSOVER_COLUMNS),
        layers=known,
        unfitted=unfitted_models(frame, found, known),
        machine=machine,
        effective=effective_ceilings(frame, ceilings) if ceilings is not None else None,
        ceilings=ceilings,
        rounds=rounds_rms(run.samples, frame),
    )
