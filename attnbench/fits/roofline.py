"""A machine model: each case's time predicted from its counts and the device's ceilings alone.

    compute = FLOPs / peak FLOP/s          memory = bytes / bandwidth
    latency = ops x op latency             faults = page faults x fault cost
    predicted = max(compute, memory) + latency + faults

The roofline (the larger of compute and memory, since a call can overlap the two) plus what
every dispatched op and every page fault costs whatever the arithmetic. Nothing is fitted to a
layer: the counts come from tracing the call and the ceilings from ``attnbench machine``, so it
predicts a layer it has never seen, and on another machine from that machine's ceilings.
``bound`` names the largest of the four terms: where the time goes.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from attnbench.measure.ceilings import Ceilings

BOUNDS = ("compute", "memory", "latency", "faults")
PREDICTION_COLUMNS = ["case_id", "predicted_time_s", "bound", *(f"{b}_s" for b in BOUNDS)]


def _column(frame: pd.DataFrame, name: str) -> pd.Series:
    if name not in frame:
        return pd.Series(np.nan, index=frame.index)
    return pd.to_numeric(frame[name], errors="coerce")


def predict(frame: pd.DataFrame, ceilings: Ceilings) -> pd.DataFrame:
    """One row per case of ``frame`` with the counts the model needs (flops, bytes, ops):
    its predicted seconds per call, each term, and the bound. Cases missing a count are left
    out (a layer whose bytes could not be traced)."""
    flops, moved, ops = (_column(frame, c) for c in ("flops", "bytes", "ops"))
    known = flops.notna() & moved.notna() & ops.notna()
    rows = frame[known]
    terms = pd.DataFrame(
        {
            "compute_s": flops[known] / ceilings.peak_flops_per_s,
            "memory_s": moved[known] / ceilings.bandwidth_bytes_per_s,
            "latency_s": ops[known] * ceilings.op_latency_s,
            "faults_s": _column(rows, "page_faults").fillna(0.0) * (ceilings.page_fault_s or 0.0),
        },
        index=rows.index,
    )
    predicted = (
        terms[["compute_s", "memory_s"]].max(axis=1) + terms["latency_s"] + terms["faults_s"]
    )
    bound = terms.idxmax(axis=1).str.removesuffix("_s") if len(terms) else pd.Series(dtype=str)
    out = pd.DataFrame(
        {"case_id": rows["case_id"], "predicted_time_s": predicted, "bound": bound, **terms},
        index=rows.index,
    )
    return out[PREDICTION_COLUMNS]


def relative_rms(measured: pd.Series, predicted: pd.Series) -> float:
    """RMS of (predicted - measured) over the mean measured time, as the cost-model fits report
    it (google-benchmark's relative RMS)."""
    pairs = pd.DataFrame({"m": measured, "p": predicted}).dropna()
    if pairs.empty or pairs["m"].mean() <= 0:
        return math.nan
    return float(np.sqrt(((pairs["p"] - pairs["m"]) ** 2).mean()) / pairs["m"].mean())
