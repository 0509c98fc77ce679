"""A machine model: each case's time predicted from its counts and the device's ceilings alone.

The ops of a call run one after another, so their times add up:

    products = Σ over kinds of max(FLOPs / rate, their bytes / bandwidth)
               a roofline per kind of product (matrix multiplications at the GEMM's peak,
               convolutions and fused attention kernels at their own measured rates),
               each either bound
    traffic  = (bytes - product bytes) / bandwidth                   elementwise ops and copies
               compute next to nothing per byte: memory-bound on any machine
    latency  = ops x op latency                                      every dispatched op pays it
    faults   = page faults x fault cost                              CPU only
    predicted = products + traffic + latency + faults

Each part is charged to one of four bounds: the products' time to compute or memory,
whichever is larger, the traffic to memory. ``bound`` names the largest share: where the time
goes. A run from before ``product_bytes`` was counted takes the whole call as one roofline,
max(FLOPs / peak, bytes / bandwidth).

Nothing is fitted to a layer: the counts come from tracing the call and the ceilings from
``attnbench machine``, so it predicts a layer it has never seen, and on another machine from
that machine's ceilings. ``effective_ceilings`` fits the same four terms to a whole run's times
(non-negative least squares over every layer at once): the ceilings the layers saw.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from attnbench.measure.ceilings import Ceilings
from attnbench.measure.traffic import parse_kernels

BOUNDS = ("compute", "memory", "latency", "faults")
PREDICTION_COLUMNS = ["case_id", "predicted_time_s", "bound", *(f"{b}_s" for b in BOUNDS)]


def _column(frame: pd.DataFrame, name: str) -> pd.Series:
    if name not in frame:
        return pd.Series(np.nan, index=frame.index)
    return pd.to_numeric(frame[name], errors="coerce")


def _rates(ceilings: Ceilings) -> dict[str, float]:
    """FLOP/s of each kind of product: a kind the ceilings did not measure runs at the GEMM's."""
    peak = ceilings.peak_flops_per_s
    return {
        "gemm": peak,
        "conv": ceilings.conv_flops_per_s or peak,
        "attention": ceilings.attention_flops_per_s or peak,
    }


def _kinds(rows: pd.DataFrame, flops: pd.Series, products: pd.Series) -> dict[str, pd.DataFrame]:
    """Each kind's FLOPs and bytes per case: the ``kernels`` column's convolutions and fused
    attention kernels, and the rest of the products' as GEMMs."""
    parsed = (
        rows["kernels"].map(parse_kernels)
        if "kernels" in rows
        else pd.Series([{}] * len(rows), index=rows.index)
    )
    kinds = {}
    left_f, left_b = flops.copy(), products.copy()
    for kind in ("conv", "attention"):
        f = parsed.map(lambda k, kind=kind: k.get(kind, (0.0, 0.0))[0]).astype(float)
        b = parsed.map(lambda k, kind=kind: k.get(kind, (0.0, 0.0))[1]).astype(float)
        kinds[kind] = pd.DataFrame({"flops": f, "bytes": b})
        left_f, left_b = left_f - f, left_b - b
    kinds["gemm"] = pd.DataFrame({"flops": left_f.clip(lower=0), "bytes": left_b.clip(lower=0)})
    return kinds


def predict(frame: pd.DataFrame, ceilings: Ceilings) -> pd.DataFrame:
    """One row per case of ``frame`` with the counts the model needs (flops, bytes, ops):
    its predicted seconds per call, the seconds charged to each bound, and the bound. Cases
    missing a count are left out (a layer whose bytes could not be traced)."""
    flops, moved, ops = (_column(frame, c) for c in ("flops", "bytes", "ops"))
    known = flops.notna() & moved.notna() & ops.notna()
    rows = frame[known]
    flops, moved, ops = flops[known], moved[known], ops[known]
    # Without product_bytes (an older run), the whole call is one roofline.
    products = _column(rows, "product_bytes").fillna(moved).clip(upper=moved)
    bandwidth = ceilings.bandwidth_bytes_per_s
    compute = pd.Series(0.0, index=rows.index)
    memory = (moved - products) / bandwidth
    for kind, part in _kinds(rows, flops, products).items():
        arithmetic = part["flops"] / _rates(ceilings)[kind]
        traffic = part["bytes"] / bandwidth
        bound = arithmetic >= traffic
        compute += arithmetic.where(bound, 0.0)
        memory += traffic.where(~bound, 0.0)
    terms = pd.DataFrame(
        {
            "compute_s": compute,
            "memory_s": memory,
            "latency_s": ops * ceilings.op_latency_s,
            "faults_s": _column(rows, "page_faults").fillna(0.0) * (ceilings.page_fault_s or 0.0),
        },
        index=rows.index,
    )
    predicted = terms.sum(axis=1)
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


@dataclass(frozen=True)
class EffectiveCeilings:
    """The ceilings the run's layers saw: one non-negative least-squares fit of
    time = FLOPs / peak + bytes / bandwidth + ops x latency + faults x fault cost over every
    layer at once. A term the fit drops (0 weight) reads as an infinite ceiling (None) or no
    cost (0)."""

    peak_flops_per_s: float | None
    bandwidth_bytes_per_s: float | None
    op_latency_s: float
    page_fault_s: float
    cases: int
    predicted: pd.Series  # seconds per call, by the frame's index

    def to_dict(self) -> dict[str, Any]:
        found = {f: getattr(self, f) for f in ("peak_flops_per_s", "bandwidth_bytes_per_s")}
        return {**found, "op_latency_s": self.op_latency_s, "page_fault_s": self.page_fault_s,
                "cases": self.cases}  # fmt: skip


FIT_COUNTS = ("flops", "bytes", "ops", "page_faults")


def effective_ceilings(frame: pd.DataFrame) -> EffectiveCeilings | None:
    """The four seconds-per-unit that best turn every measured case's counts into its time
    (scipy's NNLS). Each case is weighted by 1 / its layer's mean time, so that every layer's
    relative RMS counts alike, as the per-layer report reads it; None without two cases."""
    from scipy.optimize import nnls

    counts = pd.DataFrame({c: _column(frame, c) for c in FIT_COUNTS}, index=frame.index)
    counts["page_faults"] = counts["page_faults"].fillna(0.0)
    time = _column(frame, "time_s")
    known = counts.notna().all(axis=1) & time.gt(0)
    if known.sum() < 2:
        return None
    counts, time = counts[known], time[known]
    scale = time.groupby(frame.loc[known, "layer"]).transform("mean")
    a = counts.to_numpy(float) / scale.to_numpy(float)[:, None]
    norms = np.where(np.linalg.norm(a, axis=0) > 0, np.linalg.norm(a, axis=0), 1.0)
    weights, _ = nnls(a / norms, (time / scale).to_numpy(float))
    per_flop, per_byte, per_op, per_fault = weights / norms
    return EffectiveCeilings(
        peak_flops_per_s=1 / per_flop if per_flop > 0 else None,
        bandwidth_bytes_per_s=1 / per_byte if per_byte > 0 else None,
        op_latency_s=float(per_op),
        page_fault_s=float(per_fault),
        cases=int(known.sum()),
        predicted=pd.Series(counts.to_numpy(float) @ (weights / norms), index=counts.index),
    )
