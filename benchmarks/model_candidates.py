"""Candidate terms for the machine model, tried on a run before any is built into it.

The model (``attnbench predict``) charges every byte an op moves at the machine's STREAM
bandwidth, and every op that moves data one op latency. What it does not see:

- **where an op's bytes come from**: operands still in cache move several times faster than
  STREAM's arrays (4x the last-level cache) do;
- **views**: ``select``, ``t``, ``unbind`` move nothing, yet each is a dispatched op, and
  ``unbind`` makes n tensors, ``stack`` reads n (the tracer counts none of this).

This script re-traces every case of a run (two calls; every op of the second recorded with the
share of the pages it touches that were touched within ``--cache`` bytes of traffic before,
the first call's included, as the timed calls follow one another), measures the candidates'
ceilings on this machine now, and prints each layer's relative RMS under each:

- ``model``: ``attnbench predict``'s own prediction (the run's ceilings);
- ``stream``: the model's terms from this re-trace (should read as ``model``);
- ``footprint``: each op's bytes at an add's bandwidth measured at the op's footprint;
- ``reuse``: the bytes of pages touched again within the cache's size of traffic at the
  in-cache bandwidth (the add's best), the rest at STREAM's; the cache: ``--cache`` MiB, else
  the largest footprint at which the add still moves half its best bandwidth;
- ``views``: each view one view latency (``select`` on a small tensor) besides;
- ``lists``: and each tensor ``unbind`` makes beyond its first, and each tensor of a list
  argument, at their measured costs (per tensor over 1024);
- ``reuse+lists``: both.

Each keeps the model's compute terms, op latency and ceilings; a call that ran a fused
recurrent kernel (oneDNN's LSTM) keeps the model's prediction. Nothing is fitted.

    python benchmarks/model_candidates.py RESULTS [--layers a,b] [--cache MIB]

Read it beside a run made minutes before: the candidates' ceilings are measured now.
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from attnbench.fits.roofline import predict, relative_rms
from attnbench.layers.registry import entry
from attnbench.measure.counts.flops import formulas
from attnbench.measure.counts.ops import TracingMode, is_view, moves_data, tensors, unfused
from attnbench.measure.counts.traffic import ELEMENTWISE_PREFIX, kernel_of, op_bytes
from attnbench.measure.machine.ceilings import Ceilings
from attnbench.measure.machine.probes import CEILING_POLICY, LATENCY_POLICY
from attnbench.measure.step import make_step
from attnbench.measure.timing.allocator import set_allocator
from attnbench.measure.timing.loop import TimingPolicy, time_call
from attnbench.results.loader import load_results
from attnbench.spec import Case

FOOTPRINTS = [2**k for k in range(14, 30)]  # 16 KiB .. 512 MiB, bytes read + written


def _fastest(fn: Any, policy: TimingPolicy = LATENCY_POLICY) -> float:
    """Seconds of one call of ``fn``: the fastest of ``time_call``'s samples, as the ceilings
    read theirs."""
    return min(time_call(fn, policy).samples_s)


def bandwidth_curve() -> dict[int, float]:
    """Bytes/s of ``torch.add(x, y, out=z)`` at each footprint (3 arrays), its fastest of
    several rounds, less one add on one-element tensors (the op latency, charged apart): in
    the caches up to their size, then memory."""
    one, out = torch.ones(1), torch.empty(1)
    latency = _fastest(lambda: torch.add(one, one, out=out))
    curve = {}
    for footprint in FOOTPRINTS:
        n = max(footprint // 12, 1)
        x, y, z = torch.rand(n), torch.rand(n), torch.empty(n)
        torch.add(x, y, out=z)
        best = _fastest(lambda x=x, y=y, z=z: torch.add(x, y, out=z), CEILING_POLICY)
        curve[footprint] = 12 * n / max(best - latency, best / 20)
    return curve


def view_latency() -> float:
    """Seconds of one view (``select``) on a small tensor, the fastest of several rounds."""
    x = torch.rand(8, 8)
    return _fastest(lambda: x.select(0, 3))


def effective_cache(curve: dict[int, float]) -> int:
    """The cache a process gets: the largest footprint at which the add still moves at least
    half its best bandwidth (16 MiB on a 2-core VM whose sysfs names a 32 MiB L3)."""
    best = max(curve.values())
    return max(k for k, v in curve.items() if v >= best / 2)


def bandwidth_at(curve: dict[int, float], footprint: float) -> float:
    """The curve read at ``footprint`` (log-log interpolation, flat beyond its ends)."""
    xs = np.log([float(k) for k in curve])
    ys = np.log(list(curve.values()))
    return float(np.exp(np.interp(math.log(max(footprint, 1.0)), xs, ys)))


PAGE = 12  # log2 of the granularity at which reuse is tracked: 4 KiB, a page


def _pages(t: torch.Tensor) -> range:
    """The pages a tensor's elements span in memory."""
    if t.numel() == 0:
        return range(0)
    steps = zip(t.shape, t.stride(), strict=True)
    extent = 1 + sum((size - 1) * abs(stride) for size, stride in steps)
    start = t.data_ptr()
    return range(start >> PAGE, ((start + extent * t.element_size() - 1) >> PAGE) + 1)


class _Ops(TracingMode):
    """Every op of one call: (kind, name, work, bytes, the share of its pages touched within
    ``cache`` bytes of traffic before) for those that move data; views, the tensors views
    made beyond one each (``unbind``'s n), and the tensors of list arguments (``stack``'s n).
    ``last``: each page's traffic clock when last touched, carried from a call traced before,
    as the timed calls follow one another."""

    def __init__(self, cache: int, last: dict[int, int] | None = None, clock: int = 0) -> None:
        super().__init__()
        self.moved: list[tuple[str, str, int, int, float]] = []
        self.views = self.view_tensors = self.list_tensors = 0
        self.formulas = formulas()
        self.cache, self.last, self.clock = cache, last if last is not None else {}, clock

    def _hot_share(self, touched: list[torch.Tensor]) -> float:
        hot = total = 0
        pages: list[range] = [_pages(t) for t in touched]
        for span in pages:
            for page in span:
                total += 1
                seen = self.last.get(page)
                if seen is not None and self.clock - seen <= self.cache:
                    hot += 1
        for span in pages:
            for page in span:
                self.last[page] = self.clock
        return hot / total if total else 1.0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if is_view(func):
            self.views += 1
            made = len(tensors(out))
            self.view_tensors += max(made - 1, 0)
        elif moves_data(func):
            self.list_tensors += sum(
                len(a) for a in args if isinstance(a, (list, tuple)) and len(a) > 1
                and all(isinstance(t, torch.Tensor) for t in a)
            )  # fmt: skip
            moved = op_bytes(func, args, kwargs, out)
            hot = self._hot_share(tensors((args, kwargs)) + tensors(out))
            self.clock += moved
            key, work, product = kernel_of(func, args, kwargs, out, self.formulas)
            self.moved.append((key, work, moved, hot, product))
        return out


def trace(case: Case, cache: int) -> _Ops:
    """The second of two traced calls, whose reuse reads the first's pages as the timed calls
    read the call before them."""
    step = make_step(case, 0)
    step()  # lazy set-up out of the trace
    first = _Ops(cache)
    with unfused(), first:
        step()
    ops = _Ops(cache, first.last, first.clock)
    with unfused(), ops:
        step()
    return ops


@dataclass(frozen=True)
class Costs:
    """The candidate ceilings: an add's bandwidth by footprint, the in-cache bandwidth (the
    curve's best), one view, one tensor a view makes beyond its first, one tensor of a list
    argument."""

    curve: dict[int, float]
    cache_bandwidth: float
    view_s: float
    view_tensor_s: float
    list_tensor_s: float


def candidate(ops: _Ops, ceilings: Ceilings, costs: Costs, terms: set[str]) -> float:
    """One case's seconds: the model's compute and op latency; memory at STREAM's bandwidth,
    by footprint (``footprint``), or by reuse (``reuse``: the share of pages touched within the
    cache's size of traffic at the in-cache bandwidth); views (``views``) and the tensors of
    views and list arguments (``lists``) at their measured costs."""
    total = 0.0
    stream = ceilings.bandwidth_bytes_per_s
    for key, work, moved, hot, product in ops.moved:
        if "footprint" in terms:
            memory = moved / bandwidth_at(costs.curve, moved)
        elif "reuse" in terms:
            memory = moved * hot / costs.cache_bandwidth + moved * (1 - hot) / stream
        else:
            memory = moved / stream
        if product:  # as the model reads the kernels column (fits.roofline)
            kind, _, width = key.partition("@")
            compute = work / ceilings.rate(kind, int(width) if width.isdigit() else None)
        else:  # an elementwise op, or a copy (no work)
            rate = ceilings.elementwise_rate(key.removeprefix(ELEMENTWISE_PREFIX))
            compute = work / rate if rate and work else 0.0
        total += max(compute, memory)
    total += len(ops.moved) * ceilings.op_latency_s
    if "views" in terms:
        total += ops.views * costs.view_s
    if "lists" in terms:
        total += ops.view_tensors * costs.view_tensor_s + ops.list_tensors * costs.list_tensor_s
    return total


def list_costs() -> tuple[float, float]:
    """Seconds per tensor of ``unbind`` (the tensors it makes) and of ``stack`` (the tensors it
    reads) over 1024 small tensors, each the fastest of several rounds."""
    x = torch.rand(1024, 16)
    parts = list(x.unbind(0))
    unbind = _fastest(lambda: x.unbind(0), CEILING_POLICY)
    return unbind / 1024, _fastest(lambda: torch.stack(parts), CEILING_POLICY) / 1024


CANDIDATES = {
    "stream": set(),  # the model's terms, re-traced: should read as the model does
    "footprint": {"footprint"},
    "reuse": {"reuse"},
    "views": {"views"},
    "lists": {"views", "lists"},
    "reuse+lists": {"reuse", "views", "lists"},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--layers", default=None)
    parser.add_argument(
        "--cache", type=float, default=None,
        help="MiB of traffic within which a page is still in cache (default: measured)",
    )  # fmt: skip
    args = parser.parse_args()
    run = load_results(args.results)
    ceilings = run.ceilings
    if ceilings is None:
        raise SystemExit(f"{args.results}: no ceilings in run.json")
    set_allocator("pinned")
    frame = run.measured
    if args.layers:
        frame = frame[frame["layer"].isin(args.layers.split(","))]
    curve = bandwidth_curve()
    view_tensor_s, list_tensor_s = list_costs()
    costs = Costs(curve, max(curve.values()), view_latency(), view_tensor_s, list_tensor_s)
    cache = int(args.cache * 2**20) if args.cache else effective_cache(curve)
    print("add's bandwidth by footprint (GB/s): " + ", ".join(
        f"{k >> 10} KiB {v / 1e9:.0f}" for k, v in curve.items()))  # fmt: skip
    print(f"one view {costs.view_s * 1e6:.2f} µs, a tensor unbind makes "
          f"{view_tensor_s * 1e6:.2f} µs, a tensor stack reads {list_tensor_s * 1e6:.2f} µs; "
          f"in cache: {cache >> 20} MiB of traffic at {costs.cache_bandwidth / 1e9:.0f} GB/s; "
          f"the run's op latency {ceilings.op_latency_s * 1e6:.2f} µs, STREAM "
          f"{ceilings.bandwidth_bytes_per_s / 1e9:.1f} GB/s")  # fmt: skip
    model = predict(frame, ceilings)["predicted_time_s"]
    rows: dict[str, list[float]] = defaultdict(list)
    options = [c for c in ("k", "heads", "window", "state", "causal") if c in frame]
    for index, row in frame.iterrows():
        given = {o: int(row[o]) for o in options if pd.notna(row[o])}
        case = Case(
            str(row["layer"]), int(row["n"]), int(row["d"]), int(row["batch"]),
            str(row["dtype"]), str(row["device"]), str(row["mode"]),
            tuple(entry(str(row["layer"])).resolve(given).items()),
        )  # fmt: skip
        ops = trace(case, cache)
        fused = str(row.get("fused_path") or "")
        keep = model.get(index, math.nan) if fused and fused != "nan" else None
        rows["index"].append(index)
        rows["model"].append(model.get(index, math.nan))
        for name, terms in CANDIDATES.items():
            rows[name].append(keep if keep is not None else candidate(ops, ceilings, costs, terms))
    table = pd.DataFrame(rows).set_index("index")
    table["layer"] = frame["layer"]
    table["time_s"] = pd.to_numeric(frame["time_s"])
    names = ["model", *CANDIDATES]
    out = {
        layer: {name: relative_rms(group["time_s"], group[name]) for name in names}
        for layer, group in table.groupby("layer", sort=False)
    }
    result = pd.DataFrame(out).T
    print(result.map(lambda v: f"{v:.0%}").to_string())
    within = (result <= 0.30).sum()
    print("layers within 30%: " + ", ".join(f"{k} {v}" for k, v in within.items()))


if __name__ == "__main__":
    main()
