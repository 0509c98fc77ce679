"""What one device can do, measured: the machine's ceilings, and the rates read off them.

- ``peak_flops_per_s``: the fastest thing the device does with arithmetic: a large square
  matrix product at the run's dtype and threads, or any product of the curves below that ran
  faster (a CPU's cache-resident GEMM can beat the square one by 2-3x);
- ``bandwidth_bytes_per_s``: a STREAM-like copy of arrays well beyond the last-level cache;
- ``op_latency_s``: one dispatched operation on one-element tensors, the price every op of a
  call pays before it does any work (on CUDA, that includes the kernel launch);
- ``page_fault_s``: one minor page fault (CPU only);
- ``host_op_s``: what the host pays per op dispatched inside a module call, with no
  synchronisation per call: on an asynchronous device, the rate at which the host can issue a
  layer's ops, which a call cannot beat however fast the device;
- ``gemm_rates``, ``conv_rates``, ``attention_rates``: each kind of product's FLOP/s by its
  narrow dimension, which ``Ceilings.rate`` reads a product's rate from;
- ``elementwise_rates``: elements per second of each elementwise op of a catalogue;
- ``recurrent_rates``, ``recurrent_call_s``: a fused LSTM kernel's FLOP/s by width, and the
  seconds each of its calls costs beyond its steps.

Measured by ``measure.machine.probes``, cached and read from files by
``measure.machine.ceilings_file``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

CEILING_KEYS = ("peak_flops_per_s", "bandwidth_bytes_per_s", "op_latency_s", "page_fault_s")
RATE_CURVES = ("gemm_rates", "conv_rates", "attention_rates", "recurrent_rates")  # maybe absent
CALL_CURVES = ("recurrent_call_s",)  # {width: seconds a call}, maybe absent, may hold 0


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
    # {narrow dimension: FLOP/s} of each kind of product (None: not measured; ``formats``
    # reads a single rate of a kind as a one-point curve).
    gemm_rates: dict[int, float] | None = None
    conv_rates: dict[int, float] | None = None
    attention_rates: dict[int, float] | None = None
    # {aten op name: elements per second} (None: not measured)
    elementwise_rates: dict[str, float] | None = None
    # {width: FLOP/s} of a fused LSTM kernel's steps, and {width: seconds} of each of its calls
    # beyond its steps (None: not measured, or none on this device)
    recurrent_rates: dict[int, float] | None = None
    recurrent_call_s: dict[int, float] | None = None
    # Seconds the host spends per op dispatched inside a module call (Python, the module, the
    # dispatcher, a launch), nothing synchronised per call (None: not measured).
    host_op_s: float | None = None
    # FLOP/s of the square GEMM (``gemm_side``) itself, which the peak may exceed (the rate
    # curves' fastest product, ``fastest_rate``); None: not measured apart.
    square_flops_per_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def curves(self) -> dict[str, dict[int, float] | None]:
        """Each kind of product's rate curve, by kind ("gemm", "conv", "attention",
        "recurrent"; None: not measured)."""
        return {
            "gemm": self.gemm_rates,
            "conv": self.conv_rates,
            "attention": self.attention_rates,
            "recurrent": self.recurrent_rates,
        }

    def rate(self, kind: str, width: int | None = None) -> float:
        """FLOP/s of a product of ``kind`` ("gemm", "conv", "attention", "recurrent") whose
        narrow dimension is ``width``: read off its curve (interpolated in log-log, held flat
        beyond its ends; for an unknown width, the large square GEMM's or the curve's widest);
        the square GEMM's for a kind not measured (not the peak: the fastest curve's, which a
        product outside the cache does not reach)."""
        square = self.square_flops_per_s or self.peak_flops_per_s  # a large GEMM's own rate
        curve = self.curves.get(kind)
        if not curve:
            return square
        points = {self.gemm_side: square, **curve} if kind == "gemm" else dict(curve)
        if width is None:  # a run that kept no widths: the large GEMM's, else the widest
            return square if kind == "gemm" else points[max(points)]
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


def fastest_rate(square: float, curves: Iterable[Mapping[Any, Any] | None]) -> float:
    """The peak: the fastest FLOP/s any product reached, the square GEMM's or a curve's past
    it. A ceiling a measured rate exceeds is no ceiling: here the 1024-side GEMM, its operands
    out of the core's cache, read 36 GFLOP/s where a (rows x 256) one read 102 and conv 99, and
    the roofline drew conv's 62 above its roof. (A curve read from a file may hold anything:
    only its positive numbers count.)"""
    rates = [square]
    for curve in curves:
        rates += [
            float(r)
            for r in (curve or {}).values()
            if isinstance(r, int | float) and not isinstance(r, bool) and math.isfinite(r) and r > 0
        ]
    return max(rates)
