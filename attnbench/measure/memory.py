"""Peak memory of one call: bytes allocated above the pre-call baseline; and what an
allocation failure looks like on every device.

CUDA reads the caching allocator's peak statistics.  CPU replays the profiler's allocator events
(every allocation and free the call makes, fused kernels' scratch buffers included) and takes the
highest running total; RSS would miss memory freed and reused inside the call.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

import torch
from torch.autograd import DeviceType  # type: ignore[attr-defined]  # exported, not declared
from torch.autograd.profiler import profile

from attnbench.errors import first_line
from attnbench.units import fmt_bytes


def peak_bytes(fn: Callable[[], object], device: str) -> int | None:
    """Peak bytes above baseline allocated by one call of ``fn`` on ``device``.

    Returns None where the device exposes no allocator statistics (mps).
    """
    return profile_call(fn, device)[0]


def profile_call(fn: Callable[[], object], device: str) -> tuple[int | None, frozenset[str]]:
    """``peak_bytes`` of one call of ``fn``, and on the CPU the name of every aten op it ran,
    nested ones included (the implementation a convolution chose, ``ops.BACKENDS``), from the
    same profile; none on another device."""
    if device.startswith("cuda"):
        return _cuda_peak(fn, torch.device(device)), frozenset()
    if device == "cpu":
        return _cpu_profile(fn)
    return None, frozenset()


def _cuda_peak(fn: Callable[[], object], device: torch.device) -> int:
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    baseline = torch.cuda.memory_allocated(device)
    out = fn()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    del out
    return int(peak - baseline)


def _cpu_profile(fn: Callable[[], object]) -> tuple[int, frozenset[str]]:
    # The autograd profiler that torch.profiler.profile wraps: the wrapper's set-up asks
    # ``hasattr(torch, "_inductor")``, which imports torch._inductor and torch._dynamo (1.3 s).
    with profile(profile_memory=True) as prof:
        out = fn()
        del out
    deltas, names = [], set()
    for event in prof.kineto_results.events():
        name = event.name()
        if name == "[memory]" and event.device_type() == DeviceType.CPU:
            deltas.append((event.start_ns(), event.nbytes()))
        elif name.startswith("aten::"):
            names.add(name.removeprefix("aten::"))
    peak = peak_of_deltas(delta for _, delta in sorted(deltas, key=lambda e: e[0]))
    return peak, frozenset(names)


def peak_of_deltas(deltas: Iterable[int]) -> int:
    """Highest running total of allocation deltas (bytes; frees are negative), never below 0."""
    running = peak = 0
    for delta in deltas:
        running += delta
        peak = max(peak, running)
    return peak


# How allocation failures read when they are not torch.OutOfMemoryError: the CPU allocator's
# RuntimeError ("DefaultCPUAllocator: can't allocate memory"), MPS, and oneDNN scratchpads.
_OOM_TEXT = (
    "out of memory",
    "can't allocate memory",
    "cannot allocate memory",
    "not enough memory",
)


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation failure, on any device."""
    if isinstance(exc, torch.OutOfMemoryError | MemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(t in str(exc).lower() for t in _OOM_TEXT)


_ALLOCATION = re.compile(r"tried to allocate (\d+) bytes", re.IGNORECASE)


def oom_text(exc: BaseException) -> str:
    """An allocation failure's first line, a raw byte count written as a size ("tried to
    allocate 16 TiB", where the CPU allocator says 17592186044416 bytes) and the allocator's
    source position left out."""
    text = first_line(exc)
    text = _ALLOCATION.sub(lambda m: f"tried to allocate {fmt_bytes(int(m.group(1)))}", text)
    text = re.sub(r"\[enforce fail at [^\]]*\] err == 0\. ", "", text)
    return text[:300]
