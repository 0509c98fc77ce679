"""A run's times predicted on a machine, and how far the prediction is from what was
measured: the core of ``attnbench predict``.

Two methods (``fits.carry``): ``carried`` scales each case's measured time by the two
machines' ceilings, for a run with its own machine's ceilings predicted on a device of the
same kind; ``counts`` predicts from the counts and the target's ceilings alone (``fits.roofline``),
for any run on any machine. Left to choose, it carries where it can.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import pandas as pd

from attnbench.errors import AttnbenchError
from attnbench.fits import Analysis, analyse, roofline
from attnbench.fits.carry import CARRIED, COUNTS, METHODS, can_carry, carry, host_ratio
from attnbench.measure.machine.ceilings import Ceilings
from attnbench.results.run import RunResults
from attnbench.schema import OPTION_COLUMNS, numeric_column


@dataclass(frozen=True)
class LayerMiss:
    """How far one layer's predicted times are from its measured ones."""

    layer: str
    cases: int
    rms: float  # relative RMS of predicted against measured times
    kernels: float  # the kernels' part of the miss, as a share of the layer's time (nan: no split)
    overhead: float  # the overhead's part, likewise
    rounds: float  # how far its rounds are from each other (nan: one round): the noise floor
    bounds: dict[str, int]  # cases per bound


@dataclass(frozen=True)
class Prediction:
    """One run predicted on one machine: per case, its measured and predicted seconds and
    their bounds (``table``); the run as it would look there (``run``, ``analysis``); each
    layer's miss; the method used and why."""

    ceilings: Ceilings
    method: str  # CARRIED or COUNTS
    why: str  # how the method was chosen, in a sentence
    table: pd.DataFrame
    options: list[str]  # the layer-option columns ``table`` keeps
    run: RunResults
    analysis: Analysis
    misses: list[LayerMiss]


def choose_method(
    run: RunResults, ceilings: Ceilings, method: str | None
) -> tuple[str, str, Ceilings | None]:
    """The method to predict ``run`` on ``ceilings`` with, why, and the ceilings it carries
    from (None: counts): ``method`` if given (one clear error where it cannot be), else
    carried where the run can be carried."""
    if method is not None and method not in METHODS:
        raise AttnbenchError(f"--method must be one of {', '.join(METHODS)} (got {method!r})")
    device = str(run.record.config.get("device", ""))
    refused = can_carry(device, run.ceilings, ceilings)
    if method == CARRIED and refused is not None:
        raise AttnbenchError(f"cannot carry {run.path}: {refused}; --method counts predicts it")
    source = run.ceilings
    if method == COUNTS:
        return COUNTS, "asked for: the counts alone on the target's ceilings", None
    if refused is None and source is not None:
        hosts = host_ratio(source, ceilings)
        stand_in = (
            ""
            if hosts.basis == "host_op_s"
            else ": a stand-in where a machine's ceilings lack host_op_s, which can mislead "
            "by the hosts' whole difference; attnbench machine --remeasure there measures it, "
            "or --method counts predicts without it"
        )
        return (
            CARRIED,
            f"carried: the measured times scaled by the two machines' ceilings (host ratio "
            f"{hosts.ratio:.2f}, from {hosts.basis}{stand_in})",
            source,
        )
    return COUNTS, f"the counts alone on the target's ceilings ({refused})", None


def predict_run(run: RunResults, ceilings: Ceilings, method: str | None = None) -> Prediction:
    """Predict every measured case of ``run`` on the machine of ``ceilings``."""
    chosen, why, source = choose_method(run, ceilings, method)
    measured = run.measured
    if source is not None:
        found = carry(measured, source, ceilings)
    else:
        found = roofline.predict(measured, ceilings)
    if found.empty:
        raise AttnbenchError(
            f"{run.path} has no case with FLOPs, bytes and ops counted: a run that did not "
            "count bytes cannot be predicted (sweep it again)"
        )
    rows = measured.loc[found.index]
    options = [c for c in OPTION_COLUMNS if c in rows and rows[c].notna().any()]
    split = [c for c in ("kernel_time_s",) if c in rows]
    table = pd.concat([rows[["layer", "n", "d", *options, "time_s", *split]], found], axis=1)
    there = predicted_run(run, ceilings, found["predicted_time_s"])
    floor = roofline.rounds_rms(run.samples, rows)
    misses = []
    for layer, group in table.groupby("layer", sort=False):
        if chosen == COUNTS:
            kernels, overhead = roofline.split_rms(group, group)
        else:
            kernels = overhead = math.nan
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
    return Prediction(ceilings, chosen, why, table, options, there, analyse(there), misses)


def predicted_run(run: RunResults, ceilings: Ceilings, times: pd.Series) -> RunResults:
    """The run as it would time on the machine of ``ceilings``: its predicted cases with the
    predicted ``times`` (by the frame's index), no spread, no samples, that machine's
    ceilings."""
    rows = run.measured.loc[times.index].copy()
    rows["time_s"] = times
    rows["time_iqr_s"] = 0.0
    rows["flops_per_s"] = numeric_column(rows, "flops") / rows["time_s"]
    return replace(
        run,
        frame=rows.reset_index(drop=True),
        samples=run.samples.iloc[0:0],
        calibration=run.calibration.iloc[0:0],
        meta={**run.meta, "ceilings": ceilings.to_dict()},
    )
