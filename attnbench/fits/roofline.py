"""A machine model: each case's time predicted from its counts and the device's ceilings alone.

On the CPU the ops of a call run one after another, so their times add up:

    products = Σ over products of FLOPs / rate + their bytes / bandwidth
               matrix multiplications, convolutions and fused attention kernels each at
               their own measured rate, read off its curve at the product's narrow width
               (a d = 64 product runs far below a 1024³ GEMM), and its operands moved
               besides: a layer's narrow products do not hide their traffic under their
               arithmetic (timed op by op at n = 2048 on the 2-core CPU, explicit
               attention's scores 13.3 ms against 9.4 + 4.5 predicted, linear attention's
               0.147 against 0.073 + 0.069, the projections 0.54 against 0.39 + 0.14: the
               sum, where the larger of the two read 30-50% short)
    pointwise = Σ over elementwise ops of max(elements / the op's rate, their bytes / bandwidth)
               an exp or a tanh computes for longer than its bytes take to move
    (a call that ran a fused recurrent kernel, oneDNN's LSTM: its products and elementwise ops
     are that one kernel, at its own measured rate for the width; the per-step traffic the
     unfused trace shows stays inside it; the kernel's set-up, measured per call, is latency)
    traffic  = (bytes - the bytes above) / bandwidth                 copies and the rest
               compute nothing: memory-bound on any machine
    latency  = host ops x the host's cost per op                     each op Python issued
               (``host_op_s``, an op inside a module call; not measured: one bare op's)
               + the other ops x one bare op's latency                dispatched from C++
               + each fused recurrent kernel's set-up (measured per call)
               (a call that ran a recurrent op torch runs as one, ``host_ops``: the host
                issues that op once; every other op of the call is dispatched inside it)
    faults   = page faults x fault cost                              CPU only
    predicted = products + pointwise + traffic + latency + faults    on the CPU
    predicted = max(products + pointwise + traffic, latency)         on CUDA and MPS, whose
               host issues the next ops while the device runs the last

Each part is charged to one of four bounds: the products' arithmetic to compute and their
bytes to memory, an elementwise op's time to whichever of the two is larger, the traffic to
memory. ``bound`` names the largest share: where the time
goes. A case whose ``product_bytes`` were not counted takes the whole call as one roofline,
max(FLOPs / peak, bytes / bandwidth).

Nothing is fitted to a layer: the counts come from tracing the call and the ceilings from
``attnbench machine``, so it predicts a layer it has never seen, and on another machine from
that machine's ceilings. ``effective_ceilings`` fits a multiplier to each of the four terms
over a whole run's times (non-negative least squares over every layer at once): the ceilings
the layers saw.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from attnbench.devices import is_asynchronous
from attnbench.measure.counts.ops import FUSED_RECURRENT, RECURRENT_OPS, fused_names
from attnbench.measure.counts.traffic import Kernel, kernel_records
from attnbench.measure.machine.ceilings import Ceilings
from attnbench.schema import numeric_column

BOUNDS = ("compute", "memory", "latency", "faults")
PREDICTION_COLUMNS = ["case_id", "predicted_time_s", "bound", *(f"{b}_s" for b in BOUNDS)]


def _work(text: object, flops: float, product_bytes: float) -> list[Kernel]:
    """One case's kernels (``measure.counts.traffic.Kernel``), and whatever of the products' FLOPs
    and bytes they do not list as GEMMs of unknown width."""
    found = kernel_records(text)
    listed_f = sum(k.work for k in found if k.product)
    listed_b = sum(k.moved for k in found if k.product)
    rest_f, rest_b = max(flops - listed_f, 0.0), max(product_bytes - listed_b, 0.0)
    if rest_f > 0 or rest_b > 0:
        found.append(Kernel("gemm", None, "", rest_f, rest_b))
    return found


class Split(NamedTuple):
    """One case's roofline: compute and memory seconds of its kernels, the bytes they account
    for (the rest of the traffic is left to the caller), and fused kernels' set-up seconds."""

    compute: float
    memory: float
    counted: float
    set_up: float


def _fused_recurrence(work: list[Kernel], fused_path: str, ceilings: Ceilings) -> Split | None:
    """A call whose timed path ran a fused recurrent kernel (oneDNN's LSTM): its products and
    elementwise ops are one kernel. Its FLOPs run at the fused kernel's measured rate for the
    products' width; the bytes the trace saw stay inside it (the weights are re-read at every
    step in the trace, in cache in the kernel); each fused kernel costs one call's set-up.
    None for any other call, or where the machine has no such rate."""
    names = fused_names(fused_path) & FUSED_RECURRENT
    if not names or not ceilings.recurrent_rates:
        return None
    products = [k for k in work if k.product]
    widths = [k.width for k in products if k.width is not None and k.work > 0]
    flops = sum(k.work for k in products)
    if not widths or flops <= 0:
        return None
    inside = sum(k.moved for k in work)
    width = max(widths)
    set_up = len(names) * ceilings.recurrent_call(width)
    return Split(flops / ceilings.rate("recurrent", width), 0.0, inside, set_up)


def _roofline(case: pd.Series, ceilings: Ceilings) -> Split:
    """One case's products and elementwise ops on the roofline: each product at its kind's
    rate for its width plus its bytes over the bandwidth, each elementwise op at its op's rate
    or its bytes over the bandwidth, whichever is larger. A case whose products' bytes are not
    known ``apart`` (``product_bytes`` not counted) takes its whole call as one roofline, the
    larger of the two."""
    work = _work(case["kernels"], case["flops"], case["products"])
    fused = _fused_recurrence(work, str(case["fused_path"] or ""), ceilings)
    if fused is not None:
        return fused
    compute = memory = counted = 0.0
    for kernel in work:
        if kernel.product:
            arithmetic = kernel.work / ceilings.rate(kernel.kind, kernel.width)
        else:
            rate = ceilings.elementwise_rate(kernel.op)
            arithmetic = kernel.work / rate if rate else 0.0
        traffic = kernel.moved / ceilings.bandwidth_bytes_per_s
        counted += kernel.moved
        if kernel.product and case["apart"]:
            compute += arithmetic
            memory += traffic
        elif arithmetic >= traffic:
            compute += arithmetic
        else:
            memory += traffic
    return Split(compute, memory, counted, 0.0)


def per_op(ceilings: Ceilings) -> float:
    """What the model charges each op the host issues: the host's cost per op inside a module
    call (``host_op_s``) where the ceilings have it, else one bare op's latency."""
    return ceilings.host_op_s or ceilings.op_latency_s


def host_ops(ops: float, fused_path: str) -> float:
    """How many of a call's ``ops`` its host issued: all of them, but in a call whose timed
    path ran a recurrent op torch runs as one (``fused_path``: torch's own, ``RECURRENT_OPS``,
    else its fused kernel, ``FUSED_RECURRENT``), one per such op: the rest were dispatched
    inside it by torch's C++, which pays the dispatcher's cost, not Python's."""
    names = fused_names(fused_path)
    calls = len(names & RECURRENT_OPS) or len(names & FUSED_RECURRENT)
    return float(min(ops, calls)) if calls else ops


def predict(frame: pd.DataFrame, ceilings: Ceilings) -> pd.DataFrame:
    """One row per case of ``frame`` with the counts the model needs (flops, bytes, ops):
    its predicted seconds per call, the seconds charged to each bound, and the bound. Cases
    missing a count are left out (a layer whose bytes could not be traced)."""
    flops, moved, ops = (numeric_column(frame, c) for c in ("flops", "bytes", "ops"))
    known = flops.notna() & moved.notna() & ops.notna()
    rows = frame[known]
    flops, moved, ops = flops[known], moved[known], ops[known]
    # Without product_bytes (not counted), the whole call is one roofline.
    apart = numeric_column(rows, "product_bytes").notna()  # the products' bytes known apart
    products = numeric_column(rows, "product_bytes").fillna(moved).clip(upper=moved)
    kernels = rows["kernels"] if "kernels" in rows else pd.Series("", index=rows.index)
    bandwidth = ceilings.bandwidth_bytes_per_s
    fused = rows["fused_path"] if "fused_path" in rows else pd.Series("", index=rows.index)
    cases = pd.DataFrame(
        {
            "kernels": kernels,
            "flops": flops,
            "products": products,
            "fused_path": fused.fillna(""),
            "apart": apart,
        }
    )
    host = pd.Series(
        [host_ops(o, p) for o, p in zip(ops, cases["fused_path"], strict=True)],
        index=rows.index,
        dtype=float,
    )
    split = pd.DataFrame(
        [_roofline(case, ceilings) for _, case in cases.iterrows()],
        index=rows.index,
        columns=list(Split._fields),
        dtype=float,
    )
    compute = split["compute"]
    # the traffic no product or elementwise op accounts for (copies, the rest): memory-bound
    memory = split["memory"] + (moved - split["counted"]).clip(lower=0) / bandwidth
    terms = pd.DataFrame(
        {
            "compute_s": compute,
            "memory_s": memory,
            "latency_s": host * per_op(ceilings)
            + (ops - host) * ceilings.op_latency_s
            + split["set_up"],
            "faults_s": numeric_column(rows, "page_faults").fillna(0.0)
            * (ceilings.page_fault_s or 0.0),
        },
        index=rows.index,
    )
    if is_asynchronous(ceilings.device):  # the host issues while the device runs
        device = terms["compute_s"] + terms["memory_s"]
        predicted = pd.concat([device, terms["latency_s"] + terms["faults_s"]], axis=1).max(axis=1)
    else:
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


# The model's terms that are a call's kernels (its work, and the faults its kernels take);
# the rest, every op's latency and a fused kernel's set-up, is the overhead around them.
KERNEL_TERMS = ("compute_s", "memory_s", "faults_s")


def split_rms(frame: pd.DataFrame, machine: pd.DataFrame) -> tuple[float, float]:
    """Where the model misses the measured times of the same cases: the RMS of its kernel
    terms' miss of ``kernel_time_s``, and of its latency's miss of the rest of ``time_s``
    (the overhead), each over the mean measured time, so the two read as shares of the
    time the layer takes and a miss is located, not averaged; nan where no case measured
    its kernels."""
    time = numeric_column(frame, "time_s").reindex(machine.index)
    kernel = numeric_column(frame, "kernel_time_s").reindex(machine.index)
    known = kernel.notna() & time.gt(0)
    if not known.any():
        return math.nan, math.nan
    modelled = machine[list(KERNEL_TERMS)].astype(float).sum(axis=1)
    scale = float(time[known].mean())
    kernel_miss = modelled[known] - kernel[known]
    overhead_miss = machine.loc[known, "latency_s"].astype(float) - (time - kernel)[known]
    return (
        float(np.sqrt((kernel_miss**2).mean()) / scale),
        float(np.sqrt((overhead_miss**2).mean()) / scale),
    )


def rounds_rms(samples: pd.DataFrame, frame: pd.DataFrame) -> pd.Series:
    """Per layer of ``frame``, how far one timing round's times are from another's: the
    relative RMS (as ``relative_rms``) between two rounds' per-case median times, the median
    over every pair of rounds. The floor under the model's error: a machine whose rounds,
    minutes apart, disagree by 35% cannot check a model to 30% (on the shared 2-core VM here,
    5 to 9 of 11 layers read over 30%). NaN for a layer measured in fewer than two rounds."""
    layers = list(dict.fromkeys(frame["layer"])) if "layer" in frame else []
    found = pd.Series(math.nan, index=pd.Index(layers, name="layer"), dtype=float)
    if samples.empty or "round" not in samples:
        return found
    by_round = samples.groupby(["case_id", "round"])["time_s"].median().unstack("round")
    layer_of = frame.drop_duplicates("case_id").set_index("case_id")["layer"]
    for layer in layers:
        rounds = by_round.reindex(layer_of.index[layer_of == layer]).dropna(axis=1, how="all")
        pairs = [
            relative_rms(rounds[a], rounds[b])
            for i, a in enumerate(rounds.columns)
            for b in rounds.columns[i + 1 :]
        ]
        pairs = [p for p in pairs if not math.isnan(p)]
        if pairs:
            found[layer] = float(np.median(pairs))
    return found


@dataclass(frozen=True)
class EffectiveCeilings:
    """The ceilings the run's layers saw: one non-negative least-squares fit over every layer
    at once of time = c·compute + m·memory + l·latency + f·faults, the model's own terms, read
    back as ceilings (the peak over c, the bandwidth over m, the op latency times l, the fault
    cost times f); or, without measured ceilings, of time = FLOPs / peak + bytes / bandwidth
    + ops x latency + faults x fault cost. A term the fit drops (0 weight) reads as an
    infinite ceiling (None) or no cost (0)."""

    peak_flops_per_s: float | None
    bandwidth_bytes_per_s: float | None
    op_latency_s: float
    page_fault_s: float
    cases: int
    predicted: pd.Series  # seconds per call, by the frame's index

    def to_dict(self) -> dict[str, Any]:
        found = {f: getattr(self, f) for f in ("peak_flops_per_s", "bandwidth_bytes_per_s")}
        return {
            **found,
            "op_latency_s": self.op_latency_s,
            "page_fault_s": self.page_fault_s,
            "cases": self.cases,
        }


FIT_COUNTS = ("flops", "bytes", "ops", "page_faults")


def effective_ceilings(
    frame: pd.DataFrame, ceilings: Ceilings | None = None
) -> EffectiveCeilings | None:
    """The four multipliers that best turn every measured case's terms into its time (scipy's
    NNLS). With ``ceilings``, the terms are the model's own (compute, memory, latency and
    faults seconds, each product and elementwise op at its measured rate), and the fit scales
    each: the effective peak is the GEMM's peak over the compute multiplier, and so on. Without
    them, the raw counts (FLOPs, bytes, ops, faults): seconds per unit. Each case is weighted
    by 1 / its layer's mean time, so that every layer's relative RMS counts alike, as the
    per-layer report reads it; None without two cases."""
    from scipy.optimize import nnls

    if ceilings is not None:
        found = predict(frame, ceilings)
        terms = found[[f"{b}_s" for b in BOUNDS]].astype(float)
        units = {
            # the large GEMM's rate, which the effective peak is read against (not the fastest
            # curve's, ``Ceilings.peak_flops_per_s``: a unit, the compute terms its own rates)
            "compute_s": ceilings.square_flops_per_s or ceilings.peak_flops_per_s,
            "memory_s": ceilings.bandwidth_bytes_per_s,
            "latency_s": ceilings.op_latency_s,
            "faults_s": ceilings.page_fault_s or 0.0,
        }
    else:
        terms = pd.DataFrame({c: numeric_column(frame, c) for c in FIT_COUNTS}, index=frame.index)
        terms["page_faults"] = terms["page_faults"].fillna(0.0)
    time = numeric_column(frame, "time_s").reindex(terms.index)
    known = terms.notna().all(axis=1) & time.gt(0)
    if known.sum() < 2:
        return None
    terms, time = terms[known], time[known]
    scale = time.groupby(frame.loc[terms.index, "layer"]).transform("mean")
    a = terms.to_numpy(float) / scale.to_numpy(float)[:, None]
    norms = np.where(np.linalg.norm(a, axis=0) > 0, np.linalg.norm(a, axis=0), 1.0)
    weights, _ = nnls(a / norms, (time / scale).to_numpy(float))
    weights = weights / norms
    predicted = pd.Series(terms.to_numpy(float) @ weights, index=terms.index)
    if ceilings is not None:
        compute, memory, latency, faults = weights
        return EffectiveCeilings(
            peak_flops_per_s=units["compute_s"] / compute if compute > 0 else None,
            bandwidth_bytes_per_s=units["memory_s"] / memory if memory > 0 else None,
            op_latency_s=float(units["latency_s"] * latency),
            page_fault_s=float(units["faults_s"] * faults),
            cases=int(known.sum()),
            predicted=predicted,
        )
    per_flop, per_byte, per_op, per_fault = weights
    return EffectiveCeilings(
        peak_flops_per_s=1 / per_flop if per_flop > 0 else None,
        bandwidth_bytes_per_s=1 / per_byte if per_byte > 0 else None,
        op_latency_s=float(per_op),
        page_fault_s=float(per_fault),
        cases=int(known.sum()),
        predicted=predicted,
    )
