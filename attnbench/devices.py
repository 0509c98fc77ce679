"""Devices: which ones exist here, what they are called, what they compute in, how to wait for them.

A device name the user types (``auto``, ``cuda:1``) is resolved once, against this machine or an
executor's workers; everything after that works with the resolved string.
"""

from __future__ import annotations

import os
import platform
import re
import statistics
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

import torch

from attnbench.errors import AttnbenchError

T = TypeVar("T")

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
DEVICE_CHOICES = "cpu, cuda, cuda:N, mps, auto"

DeviceResolver = Callable[[str, str], str]  # (--device, --dtype) -> the device cases run on


def device_kind(device: str) -> str:
    """The kind of a resolved device, what per-device tables are keyed by: cuda for cuda:1."""
    return device.split(":")[0]


# Devices whose kernels run while the host goes on issuing the next (a queue per stream): a
# call there costs the larger of the host's time and the device's, not their sum.
ASYNCHRONOUS = frozenset({"cuda", "mps"})


def is_asynchronous(device: str) -> bool:
    return device_kind(device) in ASYNCHRONOUS


def for_kind(table: Mapping[str, T], device: str) -> T:
    """The entry of ``table`` for the kind of ``device`` ("cuda:1" reads "cuda"), else the
    CPU's."""
    return table.get(device_kind(device), table["cpu"])


def resolve_device(name: str) -> str:
    """Turn ``auto`` / ``cuda`` / ``cuda:N`` / ``mps`` / ``cpu`` into an available device string."""
    name = name.strip().lower()
    if name == "auto":
        if torch.cuda.is_available():
            return "cuda:0"
        if _mps_available():
            return "mps"
        return "cpu"
    if name == "cpu":
        return "cpu"
    if name == "mps":
        if not _mps_available():
            raise AttnbenchError("device 'mps' is not available on this machine; try cpu or auto")
        return "mps"
    match = re.fullmatch(r"cuda(?::(\d+))?", name)
    if match:
        if not torch.cuda.is_available():
            raise AttnbenchError(
                f"device {name!r} is not available: this torch build or machine has no CUDA GPU; "
                "try cpu or auto"
            )
        index = int(match.group(1) or 0)
        count = torch.cuda.device_count()
        if index >= count:
            raise AttnbenchError(
                f"device {name!r} does not exist: this machine has {count} CUDA device(s), "
                f"cuda:0..cuda:{count - 1}"
            )
        return f"cuda:{index}"
    raise AttnbenchError(f"unknown device {name!r}; accepted: {DEVICE_CHOICES}")


def local_device(name: str, dtype: str) -> str:
    """A device of this machine (resolved), checked to compute in ``dtype`` natively."""
    device = resolve_device(name)
    check_dtype(dtype, device)
    return device


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend and backend.is_available())


def check_dtype(dtype: str, device: str) -> None:
    """Refuse a dtype the device cannot compute in."""
    if dtype not in DTYPES:
        raise AttnbenchError(f"unknown dtype {dtype!r}; accepted: {', '.join(DTYPES)}")
    if dtype == "bfloat16" and device.startswith("cuda"):
        # Native bfloat16 arithmetic starts with compute capability 8.0 (Ampere); earlier GPUs
        # only emulate it, which would time the emulation, not the layer.
        major, minor = torch.cuda.get_device_capability(torch.device(device).index or 0)
        if major < 8:
            raise AttnbenchError(
                f"dtype bfloat16 is not supported natively on {device} (compute capability "
                f"{major}.{minor} < 8.0); accepted there: float32, float16"
            )
    if dtype == "bfloat16" and device == "mps":
        try:
            torch.ones(1, dtype=torch.bfloat16, device="mps")
        except (RuntimeError, TypeError) as exc:
            raise AttnbenchError(
                "dtype bfloat16 is not supported on mps here; accepted there: float32, float16"
            ) from exc


def device_sync(device: str) -> Callable[[], None]:
    """A function that waits for the device's queued work (a no-op on the CPU)."""
    if device.startswith("cuda"):
        dev = torch.device(device)
        return lambda: torch.cuda.synchronize(dev)
    if device == "mps":
        return torch.mps.synchronize
    return lambda: None


def cpu_model() -> str:
    """The CPU's model name, as /proc/cpuinfo gives it (the platform's word elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device: str) -> str:
    """The model of a resolved device: what charts and compare group cases by."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    if device == "mps":
        return f"Apple MPS ({platform.machine()})"
    return cpu_model()


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask: a container's or ``taskset``'s share,
    not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity on this platform (macOS), or unreadable
        return os.cpu_count() or 1


def check_threads(threads: int) -> int:
    """``threads``, refused above this process's CPUs: more threads than CPUs time the
    scheduler's sharing, not the layer, and past a few thousand libgomp cannot start them (it
    aborts the process). The Ray executor refuses a node without them in the same way."""
    cpus = usable_cpus()
    if threads > cpus:
        raise AttnbenchError(
            f"--threads {threads}: this process may use {cpus} CPU{'s' if cpus != 1 else ''}; "
            f"choose at most {cpus}"
        )
    return threads


def machine_load() -> float | None:
    """The 1-minute load average of the machine (None where the OS does not say)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def runnable_now(looks: int = 5, every_s: float = 0.02) -> float | None:
    """The tasks runnable on the machine now besides this process (Linux's /proc/loadavg),
    the median of a few looks ``every_s`` apart; None where the system does not say. The
    1-minute load lags: it read 3.5 on 2 CPUs 20 s after three busy processes had ended."""
    seen = []
    for look in range(looks):
        if look:
            time.sleep(every_s)
        try:
            with open("/proc/loadavg", encoding="ascii") as found:
                running = found.read().split()[3].split("/")[0]
            seen.append(max(0, int(running) - 1))  # less this process, which reads it
        except (OSError, IndexError, ValueError):
            return None
    return float(statistics.median(seen))


def set_threads(threads: int) -> None:
    """``torch.set_num_threads``, for a count ``check_threads`` accepts."""
    torch.set_num_threads(check_threads(threads))


# The memory allocator's states a sweep can measure in (measure.timing.allocator puts a process
# in one).
PINNED, SYSTEM = "pinned", "system"
ALLOCATORS = {
    PINNED: "glibc keeps freed memory mapped (no mmap, no trim, one arena): no history",
    SYSTEM: "the allocator as the platform sets it: what your own program pays",
}
DEFAULT_ALLOCATOR = PINNED


def check_allocator(state: str) -> str:
    if not isinstance(state, str) or state not in ALLOCATORS:
        raise AttnbenchError(f"--allocator {state!r}: accepted: {', '.join(ALLOCATORS)}")
    return state


def available_bytes() -> int | None:
    """The machine's memory available to a new process (MemAvailable in /proc/meminfo), bytes;
    None where there is no /proc."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def process_bytes(key: str, pid: int | str = "self") -> int | None:
    """A memory figure of a live process from /proc/PID/status (VmRSS, VmHWM), bytes; None
    where unreadable."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


# How far a computed output may sit from its reference, relative to the reference's largest
# value, per dtype: rounding of a reordered sum or a fused op, not another function (a decode
# step against the parallel layer, a compiled layer against the eager one).
TOLERANCE = {"float32": 1e-4, "float64": 1e-10, "float16": 2e-2, "bfloat16": 2e-2}
# float32 on a CUDA device where cuDNN or cuBLAS may round its inputs to TF32 (a 10-bit
# mantissa, unit roundoff 2^-11 = 4.9e-4): PyTorch lets cuDNN's convolutions and recurrences
# do so by default (torch.backends.cudnn.allow_tf32). On an H200 cuDNN's LSTM, GRU and RNN
# read 3.7e-4 to 7.7e-4 from the same cells stepped one token at a time.
TF32_TOLERANCE = 5e-3


def rounds_through_tf32(device: str) -> bool:
    """Whether float32 work on ``device`` may round through TF32 in this process."""
    return device_kind(device) == "cuda" and bool(
        torch.backends.cudnn.allow_tf32 or torch.backends.cuda.matmul.allow_tf32
    )


def tolerance(dtype: str, device: str = "cpu") -> float:
    """The relative difference ``dtype`` allows on ``device`` (the half-precision one for
    another dtype, TF32's for float32 where cuDNN or cuBLAS may use it)."""
    if dtype == "float32" and rounds_through_tf32(device):
        return TF32_TOLERANCE
    return TOLERANCE.get(dtype, TOLERANCE["float16"])


def relative_difference(got: torch.Tensor, want: torch.Tensor) -> float:
    """The largest |got - want| over the largest |want|."""
    scale = want.abs().max().clamp_min(torch.finfo(want.dtype).tiny)
    return float((got - want).abs().max() / scale)


def within_tolerance(check: float | None, dtype: str, device: str = "cpu") -> bool | None:
    """Whether a relative difference is one ``dtype`` allows on ``device`` (None: it was not
    checked)."""
    return None if check is None else check <= tolerance(dtype, device)
