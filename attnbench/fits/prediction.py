"""A run's times predicted on a machine from its counts and that machine's ceilings, and how
far the prediction is from what was measured: the core of ``attnbench predict``."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import pandas as pd

from attnbench.errors import AttnbenchError
from attnbench.fits import Analysis, analyse, roofline
from attnbench.measure.ceilings import Ceilings
from attnbench.results.run import RunResults
from attnbench.schema import OPTION_COLUMNS


@dataclass(frozen=True)
class LayerMiss:
    """How far one layer's predicted times are from its measured ones."""

    layer: str
    cases: int
    rms: float  # relative RMS of predicted against measured times
    kernels: float  # the kernels' part of the miss, as a share of the layer's time (nan: no split)
    overhead: float  # the overhead's part, likewise
    rounds: float  # how far its rounds are from each other (nan: one round): the noise floor
    bounds: dict[str, int]  # cases per bound (compute, memory, latency, faults)


@dataclass(frozen=True)
class Prediction:
    """One run predicted on one machine: per case, its measured and predicted seconds and their
    bounds (``table``); the run as it would look there (``run``, ``analysis``); each layer's
    miss."""

    ceilings: Ceilings
    table: pd.DataFrame
    options: list[str]  # the layer-option columns ``table`` keeps
    run: RunResults
    analysis: Analysis
    misses: list[LayerMiss]


def predict_run(run: RunResults, ceilings: Ceilings) -> Prediction:
    """Predict every measured case of ``run`` on the machine of ``ceilings``."""
    measured = run.measured
    found = roofline.predict(measured, ceilings)
    if found.empty:
        raise AttnbenchError(
            f"{run.path} has no case with FLOPs, bytes and ops counted: a run made before "
            "attnbench counted bytes cannot be predicted (sweep it again)"
        )
    rows = measured.loc[found.index]
    options = [c for c in OPTION_COLUMNS if c in rows and rows[c].notna().any()]
    split = [c for c in ("kernel_time_s",) if c in rows]
    table = pd.concat([rows[["layer", "n", "d", *options, "time_s", *split]], found], axis=1)
    there = predicted_run(run, ceilings)
    floor = roofline.rounds_rms(run.samples, rows)
    misses = []
    for layer, group in table.groupby("layer", sort=False):
        kernels, overhead = roofline.split_rms(group, group)
        misses.append(
            LayerMiss(
                layer=str(layer),
                cases=len(group),
                rms=roofline.relative_rms(group["time_s"], group["predicted_time_s"]),
                kernels=kernels,
                overhead=overhead,
                rounds=float(floor.get(layer, math.nan)),
                bounds={str(b): int(c) for b, c in group["bound"].value_counts().items()},
            )
        )
    return Prediction(ceilings, table, options, there, analyse(there), misses)


def predicted_run(run: RunResults, ceilings: Ceilings) -> RunResults:
    """The run as the model says it would time on the machine of ``ceilings``: its measured
    cases with the predicted times, no samples, that machine's ceilings."""
    frame = roofline.predicted_frame(run.measured, ceilings).reset_index(drop=True)
    return replace(
        run,
        frame=frame,
        samples=run.samples.iloc[0:0],
        calibration=run.calibration.iloc[0:0],
        meta={**run.meta, "ceilings": ceilings.to_dict()},
    )
