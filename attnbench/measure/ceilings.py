"""The machine's own ceilings, measured on the device a run uses: what turns counts into time.

- ``peak_flops_per_s``: a large square matrix product at the run's dtype and threads, the
  fastest thing the device does with arithmetic;
- ``bandwidth_bytes_per_s``: a STREAM-like copy of arrays well beyond the last-level cache
  (4x it, STREAM's own rule, at least 64 MiB; bytes = read + written);
- ``op_latency_s``: one dispatched operation on one-element tensors, the price every op of a
  call pays before it does any work (on CUDA, that includes the kernel launch);
- ``page_fault_s``: one minor page fault (``measure.faults``; CPU only);
- ``conv_flops_per_s``, ``attention_flops_per_s``: a Conv1d's and a fused attention kernel's
  single rate, kept only as files from before the curves (below) hold them; measured now, they
  are None, and a product of unknown width reads its curve at the widest width
  (``Ceilings.rate``). Each was a kernel of its own, 0.6 s of every measurement for a figure
  the curves hold;
- ``gemm_rates``, ``conv_rates``, ``attention_rates``: each kind of product's FLOP/s by its
  narrow dimension (the smaller of a product's inner and output widths; a convolution's
  channels; an attention's head width), on operands small enough to stay in cache. A layer's
  products are narrow (d = 32..128) and run at a fraction of the large GEMM's rate: at d = 64,
  a third of it on a 2-core CPU. ``Ceilings.rate`` reads a product's rate from these curves;
- ``elementwise_rates``: elements per second of each elementwise op of a catalogue
  (``measure.rates``): an exp costs many adds;
- ``recurrent_rates``: FLOP/s of a fused LSTM kernel's steps (oneDNN's on a CPU) by width,
  which runs its small per-step products at a tenth of the GEMM's rate or less, and
  ``recurrent_call_s`` the seconds each call of it costs beyond its steps.

Each is the fastest sample of a timed run (``time_call``), as STREAM reports its best trial: a
neighbour on a shared machine only ever slows a sample. A test drives the arithmetic with a
fake clock. Measuring takes a few seconds; the result is cached per machine, torch version, device,
dtype, thread count and set of kernels (``cache_key``, ``cache_dir()``), and ``remeasure`` measures
again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnbench.devices import (
    DTYPES,
    check_dtype,
    device_kind,
    device_name,
    device_sync,
    set_threads,
)
from attnbench.errors import AttnbenchError
from attnbench.measure import rates
from attnbench.measure.allocator import release_freed
from attnbench.measure.faults import fault_cost_s
from attnbench.measure.rates import KernelTimer
from attnbench.measure.timing import Clock, TimingPolicy, time_call

# Enough samples for a stable fastest one, and a bounded wait: each kernel is timed in each of
# PASSES passes and its fastest sample kept. Time and budget halved twice (0.1 / 0.3 s, then
# 0.05 / 0.15 s; rates.CURVE_POLICY's and the latency's too): a measurement 4.9 -> 2.9 -> 2.6
# s on a 2-core CPU, as repeatable round to round (benchmarks/ceilings_check.py --policies).
# Then each kernel stops at its min_time (budget = min_time): a ceiling is the fastest sample,
# which the spread rule (sample on while IQR/median > 5%) did not steady, only lengthened on a
# busy machine. 2.7-2.9 -> 2.0 s a measurement, the median kernel's spread across rounds
# 1.23 / 1.50 against 1.24 / 1.43 (6 and 8 rounds interleaved), its 90th percentile 1.71 /
# 2.08 against 1.72 / 2.26, the same rates (median ratio 0.996 / 1.029).
CEILING_POLICY = TimingPolicy(
    warmup_calls=1, min_block_s=5e-3, min_samples=5, max_samples=50, min_time_s=0.025,
    budget_s=0.025,
)  # fmt: skip
LATENCY_POLICY = TimingPolicy(
    warmup_calls=100, min_block_s=5e-3, min_samples=10, min_time_s=0.05, budget_s=0.05
)
GEMM_SIDE = {"cpu": 1024, "cuda": 8192, "mps": 4096}
MIN_STREAM_BYTES = 64 * 2**20
# STREAM's rule: each array at least 4x the last-level cache. It was 8x: 0.2 s more of every
# measurement (1.90 -> 1.68 s, 4 rounds interleaved, a 32 MiB L3) for the same bandwidth
# (median 29.5 against 30.5 GB/s at 4x, within the rounds' spread).
STREAM_CACHE_MULTIPLE = 4
# A server's sysfs reports its socket's whole L3 (480 MiB on a 2-core VM here): 8x of it is
# 3.75 GiB an array, 6 s to map and 18 s to time, for a bandwidth within 2% of 512 MiB's.
MAX_STREAM_BYTES = 512 * 2**20
CEILING_KEYS = ("peak_flops_per_s", "bandwidth_bytes_per_s", "op_latency_s", "page_fault_s")
OPTIONAL_RATES = ("conv_flops_per_s", "attention_flops_per_s")  # absent from older files
RATE_CURVES = ("gemm_rates", "conv_rates", "attention_rates", "recurrent_rates")  # maybe absent
CALL_CURVES = ("recurrent_call_s",)  # {width: seconds a call}, maybe absent, may hold 0
# Passes over the whole set of kernels; each kernel's fastest is kept (measure_ceilings).
PASSES = 2


@dataclass(frozen=True)
class Ceilings:
    """What one device can do, and what it was measured on."""

    peak_flops_per_s: float
    bandwidth_bytes_per_s: float
    op_latency_s: float
    page_fault_s: float | None  # None where faults are not counted (CUDA, MPS, no getrusage)
    device: str
    device_name: str
    dtype: str
    threads: int
    torch_version: str
    hostname: str
    measured_at: str
    gemm_side: int
    stream_bytes: int  # the bytes one copy moves (read + written)
    # The single rates of the products that are not matrix multiplications, in files from
    # before the curves below (None since: ``rate`` reads the curves).
    conv_flops_per_s: float | None = None
    attention_flops_per_s: float | None = None
    # {narrow dimension: FLOP/s} of each kind of product (None: not measured, as in files
    # from before they were; the model then reads the single rates above).
    gemm_rates: dict[int, float] | None = None
    conv_rates: dict[int, float] | None = None
    attention_rates: dict[int, float] | None = None
    # {aten op name: elements per second} (None: not measured)
    elementwise_rates: dict[str, float] | None = None
    # {width: FLOP/s} of a fused LSTM kernel's steps, and {width: seconds} of each of its calls
    # beyond its steps (None: not measured, or none on this device)
    recurrent_rates: dict[int, float] | None = None
    recurrent_call_s: dict[int, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def rate(self, kind: str, width: int | None = None) -> float:
        """FLOP/s of a product of ``kind`` ("gemm", "conv", "attention") whose narrow
        dimension is ``width``: read off its curve (interpolated in log-log, held flat beyond
        its ends; at its widest for an unknown width, where an older file's single rate wins),
        else the kind's single rate (the GEMM's peak for a kind not measured)."""
        peak = self.peak_flops_per_s
        single = {"gemm": peak, "conv": self.conv_flops_per_s,
                  "attention": self.attention_flops_per_s}  # fmt: skip
        curve = {"gemm": self.gemm_rates, "conv": self.conv_rates,
                 "attention": self.attention_rates,
                 "recurrent": self.recurrent_rates}.get(kind)  # fmt: skip
        if not curve:
            return single.get(kind) or peak
        points = {self.gemm_side: peak, **curve} if kind == "gemm" else dict(curve)
        if width is None:  # a product from a run that kept no widths: its kind's one rate
            return single.get(kind) or points[max(points)]
        return _interpolate(points, width, log_values=True)

    def recurrent_call(self, width: int) -> float:
        """Seconds a fused LSTM call of ``width`` costs beyond its steps, read off
        ``recurrent_call_s`` (linear between its widths, flat beyond its ends); 0 where it
        was not measured."""
        if not self.recurrent_call_s:
            return 0.0
        return _interpolate(self.recurrent_call_s, width, log_values=False)

    def elementwise_rate(self, op: str) -> float | None:
        """Elements per second of the elementwise op ``op`` (its aten name); an op not
        measured runs at an add's rate; None where no rates were measured."""
        rates = self.elementwise_rates or {}
        return rates.get(op) or rates.get("add")


def _interpolate(points: Mapping[int, float], width: int, *, log_values: bool) -> float:
    """``points`` ({width: value}) read at ``width``, interpolated in log2 of the width (and
    in log of the value with ``log_values``), held flat beyond its ends."""
    widths = sorted(points)
    values = [math.log(points[w]) if log_values else points[w] for w in widths]
    at = float(np.interp(math.log2(max(width, 1)), [math.log2(w) for w in widths], values))
    return math.exp(at) if log_values else at


def _side(device: str) -> int:
    return GEMM_SIDE.get(device_kind(device), GEMM_SIDE["cpu"])


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


def measure_ceilings(
    device: str = "cpu",
    dtype: str = "float32",
    threads: int | None = None,
    *,
    clock: Clock = time.perf_counter,
    sync: Callable[[], None] | None = None,
    gemm_side: int | None = None,
    stream_numel: int | None = None,
    curve_widths: Mapping[str, tuple[int, ...]] | None = None,
    elementwise_ops: tuple[str, ...] | None = None,
    fault_cost: Callable[[], float | None] = fault_cost_s,
    timer: KernelTimer | None = None,
    passes: int = PASSES,
) -> Ceilings:
    """Measure the four ceilings on ``device`` at ``dtype`` with ``threads`` CPU threads (the
    process's count where None; restored after). ``timer`` times each kernel (default: the
    fastest sample of ``time_call`` with ``clock`` and the device's ``sync``); ``curve_widths``
    gives the widths of each rate curve ({"gemm": ..., "conv": ..., "attention": ...}; default:
    ``rates.GEMM_WIDTHS`` and its kin); ``elementwise_ops`` the ops whose rates are measured
    (default: all of ``rates.CATALOGUE``). Every kernel is timed once in each
    of ``passes`` passes over the whole set and its fastest time kept: a ceiling is the best
    the device does, and a neighbour's burst of a few seconds slows one pass, not both."""
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
    side = gemm_side or _side(device)
    numel = stream_numel or stream_elements(torch_dtype.itemsize, last_level_cache_bytes(device))
    src = torch.ones(numel, dtype=torch_dtype, device=device)  # (numel,): mapped once, not a pass
    dst = torch.empty_like(src)  # (numel,)
    try:
        for _ in range(max(1, passes)):  # the last pass reads every kernel's fastest time
            gemm = _gemm_s(device, torch_dtype, side, timed)
            copy = timed("copy", lambda src=src, dst=dst: dst.copy_(src), CEILING_POLICY)
            x = torch.ones(1, dtype=torch_dtype, device=device)  # (1,)
            out = torch.empty_like(x)  # (1,)
            tiny = timed("op", lambda x=x, out=out: torch.add(x, x, out=out), LATENCY_POLICY)
            curves = rates.rate_curves(device, torch_dtype, timed, curve_widths)
            recurrent = rates.recurrent_rates(device, torch_dtype, timed, curve_widths)
            elementwise = rates.elementwise_rates(device, torch_dtype, timed, elementwise_ops)
        used = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    del src, dst
    release_freed()  # a pinned allocator would keep the copy's arrays mapped for the whole run
    return Ceilings(
        peak_flops_per_s=2 * side**3 / gemm,
        bandwidth_bytes_per_s=2 * numel * torch_dtype.itemsize / copy,
        op_latency_s=tiny,
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


def _gemm_s(device: str, dtype: torch.dtype, side: int, timed: KernelTimer) -> float:
    """Median seconds of one (side x side) @ (side x side) product."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(side, side, generator=gen).to(device=device, dtype=dtype)  # (s, s)
    b = torch.randn(side, side, generator=gen).to(device=device, dtype=dtype)  # (s, s)
    return timed("gemm", lambda: a @ b, CEILING_POLICY)


# ----------------------------------------------------------------------------- cache and files


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$ATTNBENCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/attnbench``, else ``~/.cache/attnbench``."""
    env = os.environ if environ is None else environ
    if env.get("ATTNBENCH_CACHE_DIR"):
        return Path(env["ATTNBENCH_CACHE_DIR"])
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]) / "attnbench"
    return Path.home() / ".cache" / "attnbench"


def kernels_digest() -> str:
    """A short digest of what a measurement times: the elementwise catalogue and each curve's
    widths. An attnbench whose catalogue gained an op reads no entry measured without it
    (the model would read that op at an add's rate) and measures again."""
    kernels = [*sorted(rates.CATALOGUE), rates.GEMM_WIDTHS, rates.CONV_WIDTHS,
               rates.HEAD_WIDTHS, rates.RECURRENT_WIDTHS]  # fmt: skip
    return hashlib.sha256(repr(kernels).encode()).hexdigest()[:8]


def cache_key(device: str, dtype: str, threads: int) -> str:
    """One file per machine, torch version, device, dtype, set of kernels and thread count."""
    parts = [socket.gethostname(), device_name(device), platform.machine(), torch.__version__,
             device, dtype, f"k{kernels_digest()}", f"{threads}t"]  # fmt: skip
    return "-".join("".join(c if c.isalnum() or c in "._" else "_" for c in p) for p in parts)


def machine_ceilings(
    device: str = "cpu",
    dtype: str = "float32",
    threads: int | None = None,
    *,
    remeasure: bool = False,
    folder: Path | None = None,
    measure: Callable[..., Ceilings] | None = None,
    passes: int = PASSES,
) -> tuple[Ceilings, bool]:
    """The ceilings from the cache, or measured in ``passes`` passes (and cached); and whether
    they were cached."""
    threads = threads or torch.get_num_threads()
    path = _cache_path(device, dtype, threads, folder)
    cached = None if remeasure else _cached_entry(path)
    if cached is not None:
        return cached, True
    if measure is None:
        found = measure_ceilings(device, dtype, threads, passes=passes)
    else:
        found = measure(device, dtype, threads)
    tmp = path.with_suffix(".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(found.to_dict(), indent=2))
        tmp.replace(path)
    except OSError:  # an unwritable cache costs a measurement next time, nothing else
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
    return found, False


def ceilings_cached(
    device: str, dtype: str, threads: int | None = None, folder: Path | None = None
) -> bool:
    """Whether ``machine_ceilings`` would read these ceilings from the cache (a whole entry,
    curves included) rather than measure them."""
    path = _cache_path(device, dtype, threads or torch.get_num_threads(), folder)
    return _cached_entry(path) is not None


def _cache_path(device: str, dtype: str, threads: int, folder: Path | None) -> Path:
    return (folder or cache_dir()) / "ceilings" / f"{cache_key(device, dtype, threads)}.json"


def _cached_entry(path: Path) -> Ceilings | None:
    """The cache entry at ``path``, if whole: a damaged entry, or one from before the rate
    curves or the fused LSTM's call cost, reads as none (and is measured again, all of it)."""
    try:
        found = read_ceilings(path)
    except AttnbenchError:
        return None
    stale = (
        found.gemm_rates is None
        or found.elementwise_rates is None
        or (found.recurrent_rates is not None and found.recurrent_call_s is None)
    )
    return None if stale else found


def read_ceilings(path: Path) -> Ceilings:
    """A ceilings file (``attnbench machine --json`` wrote it); one clear error if it is not."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not JSON"
        raise AttnbenchError(f"cannot read ceilings file {str(path)!r}: {reason}") from None
    return ceilings_from(data, str(path))


def ceilings_from(data: Any, where: str = "ceilings") -> Ceilings:
    if not isinstance(data, dict):
        raise AttnbenchError(f"{where}: not a JSON object of ceilings")
    for key in (*CEILING_KEYS, *OPTIONAL_RATES):
        value = data.get(key)
        allowed_none = key in ("page_fault_s", *OPTIONAL_RATES) and value is None
        if not allowed_none and (
            isinstance(value, bool) or not isinstance(value, int | float) or not value > 0
        ):
            raise AttnbenchError(f"{where}: {key} must be a positive number (got {value!r})")
    names = {f.name for f in fields(Ceilings)}
    missing = sorted(
        names - set(data) - {*OPTIONAL_RATES, *RATE_CURVES, *CALL_CURVES, "elementwise_rates"}
    )
    if missing:
        raise AttnbenchError(f"{where}: missing {', '.join(missing)}")
    curves = {key: _curve(data.get(key), f"{where}: {key}") for key in RATE_CURVES}
    for key in CALL_CURVES:
        curves[key] = _curve(data.get(key), f"{where}: {key}", positive=False)
    rates = data.get("elementwise_rates")
    if rates is not None and (
        not isinstance(rates, dict)
        or not all(
            isinstance(r, int | float) and not isinstance(r, bool) and r > 0 for r in rates.values()
        )
    ):
        raise AttnbenchError(f"{where}: elementwise_rates must map op names to positive rates")
    return Ceilings(**{**{k: data[k] for k in names if k in data}, **curves})


def _curve(value: Any, where: str, positive: bool = True) -> dict[int, float] | None:
    """A rate curve as JSON writes it ({"64": FLOP/s, ...}) back as {64: FLOP/s}; with
    ``positive`` False, a curve of seconds that may hold 0 (a call cost)."""
    if value is None:
        return None
    if not isinstance(value, dict) or not value:
        raise AttnbenchError(f"{where} must be an object of width: FLOP/s")
    found = {}
    for width, rate in value.items():
        try:
            w = int(width)
        except ValueError:
            raise AttnbenchError(f"{where}: width {width!r} is not a whole number") from None
        number = not isinstance(rate, bool) and isinstance(rate, int | float)
        if not number or not (rate > 0 if positive else rate >= 0) or w < 1:
            what = "a positive rate" if positive else "seconds, 0 or more"
            raise AttnbenchError(f"{where}: {width}: must be {what} (got {rate!r})")
        found[w] = float(rate)
    return found
