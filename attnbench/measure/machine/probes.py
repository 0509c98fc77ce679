"""Measuring a device's ceilings: a large GEMM, a STREAM-like copy, one tiny op, a page
fault, and the rate curves of narrow products and elementwise ops (``measure.machine.rates``).

Each is the fastest sample of a timed run (``time_call``), as STREAM reports its best trial: a
neighbour on a shared machine only ever slows a sample. A test drives the arithmetic with a
fake clock. What each policy and size was chosen on is in docs/machine.md.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from torch import nn

from attnbench.devices import (
    DTYPES,
    check_dtype,
    device_name,
    device_sync,
    for_kind,
    set_threads,
)
from attnbench.measure.counts.ops import recording_fused
from attnbench.measure.machine import rates
from attnbench.measure.machine.ceilings import Ceilings, fastest_rate
from attnbench.measure.machine.rates import KernelTimer
from attnbench.measure.timing.allocator import release_freed
from attnbench.measure.timing.faults import fault_cost_s
from attnbench.measure.timing.loop import Clock, TimingPolicy, time_call

# Each kernel is timed in each of PASSES passes, for its min_time, and its fastest sample
# kept (benchmarks/ceilings_check.py --policies measures the choice).
CEILING_POLICY = TimingPolicy(
    warmup_calls=1,
    min_block_s=5e-3,
    min_samples=5,
    max_samples=50,
    min_time_s=0.025,
    budget_s=0.025,
)
LATENCY_POLICY = TimingPolicy(
    warmup_calls=100, min_block_s=5e-3, min_samples=10, min_time_s=0.05, budget_s=0.05
)
GEMM_SIDE = {"cpu": 1024, "cuda": 8192, "mps": 4096}
MIN_STREAM_BYTES = 64 * 2**20
STREAM_CACHE_MULTIPLE = 4  # STREAM's rule: each array at least 4x the last-level cache
# ... and at most this: a server's sysfs reports its socket's whole L3, far beyond the VM's
MAX_STREAM_BYTES = 512 * 2**20
# Passes over the whole set of kernels; each kernel's fastest is kept (measure_ceilings).
PASSES = 2


def last_level_cache_bytes(device: str = "cpu") -> int | None:
    """The largest cache: a CUDA device's L2, else the CPU's largest from sysfs (None where it
    cannot be read)."""
    if device.startswith("cuda"):
        properties = torch.cuda.get_device_properties(torch.device(device))
        return getattr(properties, "L2_cache_size", None)
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip().upper()
        units = {"K": 2**10, "M": 2**20, "G": 2**30}
        try:
            sizes.append(int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text))
        except (ValueError, IndexError):
            continue
    return max(sizes) if sizes else None


def stream_elements(element_size: int, cache: int | None) -> int:
    """Elements of one array of the copy: 4x the last-level cache (STREAM's rule), at least
    64 MiB and at most 512 MiB (two arrays of 512 MiB are over twice any cache a copy could
    reuse)."""
    target = min(MAX_STREAM_BYTES, max(MIN_STREAM_BYTES, STREAM_CACHE_MULTIPLE * (cache or 0)))
    return target // element_size


@dataclass(frozen=True)
class Probes:
    """What the ceilings are read on (None: the device's own sizes). ``gemm_side``: the square
    product's side (``GEMM_SIDE``); ``stream_numel``: the copy's elements (past the last-level
    cache); ``curve_widths``: the widths of each rate curve ({"gemm": ..., "conv": ...,
    "attention": ...}; default: ``rates.GEMM_WIDTHS`` and its kin); ``elementwise_ops``: the
    ops whose rates are measured (default: all of ``rates.CATALOGUE``); ``passes``: every
    kernel is timed once in each pass over the whole set and its fastest time kept: a ceiling
    is the best the device does, and a neighbour's burst of a few seconds slows one pass, not
    both."""

    gemm_side: int | None = None
    stream_numel: int | None = None
    curve_widths: Mapping[str, tuple[int, ...]] | None = None
    elementwise_ops: tuple[str, ...] | None = None
    passes: int = PASSES


DEFAULT_PROBES = Probes()


def measure_ceilings(
    device: str = "cpu",
    dtype: str = "float32",
    threads: int | None = None,
    *,
    probes: Probes = DEFAULT_PROBES,
    clock: Clock = time.perf_counter,
    sync: Callable[[], None] | None = None,
    fault_cost: Callable[[], float | None] = fault_cost_s,
    timer: KernelTimer | None = None,
) -> Ceilings:
    """Measure the four ceilings on ``device`` at ``dtype`` with ``threads`` CPU threads (the
    process's count where None; restored after), on ``probes``. ``timer`` times each kernel
    (default: the fastest sample of ``time_call`` with ``clock`` and the device's ``sync``)."""
    curve_widths, elementwise_ops = probes.curve_widths, probes.elementwise_ops
    check_dtype(dtype, device)
    torch_dtype = DTYPES[dtype]
    waits = sync or device_sync(device)

    def fastest_s(name: str, fn: Callable[[], object], policy: TimingPolicy) -> float:
        return min(time_call(fn, policy, clock=clock, sync=waits).samples_s)

    fastest: dict[str, float] = {}

    def timed(name: str, fn: Callable[[], object], policy: TimingPolicy) -> float:
        seconds = (timer or fastest_s)(name, fn, policy)
        fastest[name] = min(seconds, fastest.get(name, seconds))
        return fastest[name]

    before = torch.get_num_threads()
    if threads is not None:
        set_threads(threads)
    side = probes.gemm_side or for_kind(GEMM_SIDE, device)
    numel = probes.stream_numel or stream_elements(
        torch_dtype.itemsize, last_level_cache_bytes(device)
    )
    src = torch.ones(numel, dtype=torch_dtype, device=device)  # (numel,): mapped once, not a pass
    dst = torch.empty_like(src)  # (numel,)
    try:
        for _ in range(max(1, probes.passes)):  # the last pass reads every kernel's fastest
            gemm = _gemm_s(device, torch_dtype, side, timed)
            copy = timed("copy", partial(dst.copy_, src), CEILING_POLICY)
            tiny = _tiny_op_s(device, torch_dtype, timed)
            host = host_op_s(device, torch_dtype, timed)
            curves = rates.rate_curves(device, torch_dtype, timed, curve_widths)
            recurrent = rates.recurrent_rates(device, torch_dtype, timed, curve_widths)
            elementwise = rates.elementwise_rates(device, torch_dtype, timed, elementwise_ops)
        used = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    del src, dst
    release_freed()  # a pinned allocator would keep the copy's arrays mapped for the whole run
    return Ceilings(
        peak_flops_per_s=fastest_rate(
            2 * side**3 / gemm, [*curves.values(), recurrent and recurrent[0]]
        ),
        square_flops_per_s=2 * side**3 / gemm,
        bandwidth_bytes_per_s=2 * numel * torch_dtype.itemsize / copy,
        op_latency_s=tiny,
        host_op_s=host,
        page_fault_s=fault_cost() if device == "cpu" else None,
        device=device,
        device_name=device_name(device),
        dtype=dtype,
        threads=used,
        torch_version=torch.__version__,
        hostname=socket.gethostname(),
        measured_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        gemm_side=side,
        stream_bytes=2 * numel * torch_dtype.itemsize,
        **curves,
        elementwise_rates=elementwise,
        recurrent_rates=recurrent[0] if recurrent else None,
        recurrent_call_s=recurrent[1] if recurrent else None,
    )


def _tiny_op_s(device: str, dtype: torch.dtype, timed: KernelTimer) -> float:
    """One op on one element, into a tensor it already has: an op's latency."""
    x = torch.ones(1, dtype=dtype, device=device)  # (1,)
    out = torch.empty_like(x)  # (1,)
    return timed("op", lambda: torch.add(x, x, out=out), LATENCY_POLICY)


HOST_PROBE_DEPTH = 16  # module calls in one call of the host probe
HOST_PROBE_WIDTH = 8


class HostProbe(nn.Module):
    """A call that is all host work: ``HOST_PROBE_DEPTH`` blocks, each a module call of a
    Linear and an activation on a few features, as a layer's Python issues its ops."""

    def __init__(self) -> None:
        super().__init__()
        width = HOST_PROBE_WIDTH
        self.blocks = nn.ModuleList(nn.Linear(width, width) for _ in range(HOST_PROBE_DEPTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (1, width)
        for block in self.blocks:
            x = torch.tanh(block(x))  # (1, width)
        return x


def host_op_s(device: str, dtype: torch.dtype, timed: KernelTimer) -> float:
    """Seconds per op the host spends inside module calls: the probe's time per call, its
    calls not synchronised one by one (``time_call`` waits per block), over the ops it
    dispatches. On an asynchronous device its kernels are too small to hold the host back."""
    probe = HostProbe().to(device=device, dtype=dtype)
    x = torch.ones(1, HOST_PROBE_WIDTH, device=device, dtype=dtype)  # (1, width)
    ops: list[int] = []
    with torch.no_grad():
        recording_fused(lambda: probe(x), set(), ops)()
        seconds = timed("host", lambda: probe(x), LATENCY_POLICY)
    return seconds / max(ops[0], 1)


def _gemm_s(device: str, dtype: torch.dtype, side: int, timed: KernelTimer) -> float:
    """Median seconds of one (side x side) @ (side x side) product."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(side, side, generator=gen).to(device=device, dtype=dtype)  # (s, s)
    b = torch.randn(side, side, generator=gen).to(device=device, dtype=dtype)  # (s, s)
    return timed("gemm", lambda: a @ b, CEILING_POLICY)
