"""The GPU's SM clock, read with each timing sample (NVML, through ``nvidia-ml-py``).

A GPU runs at the clock its power and temperature allow: a card held back by a neighbour's heat
or its power cap computes slower, and a time taken then is the card's state, not the code's.
nvbench reads the clock with each sample and flags the samples taken under 75% of the card's
maximum clock; so does attnbench. Where NVML is missing (no ``nvidia-ml-py``, no driver, not a
CUDA device) nothing is read and the columns stay empty.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

# A sample taken below this share of the device's maximum SM clock is throttled (nvbench's
# default threshold).
THROTTLED_BELOW = 0.75
# NVML is read at most this often; a sample in between carries the last reading. Read after
# every block, the H200's blocks timer read GPU-bound cases 16-22% above torch.utils.benchmark,
# which reads no clock: the query, a call into the driver between two blocks, is the one thing
# those blocks do that its blocks do not (suspected, not yet measured apart on a GPU). A card's
# clock moves over tens of milliseconds, and a median ignores the few samples beside a query.
READ_EVERY_S = 0.05

ClockProbe = Callable[[], float | None]  # the SM clock now, MHz (None: not read)


@dataclass(frozen=True)
class ClockReader:
    """Reads one device's SM clock: ``read()`` now, in MHz, and its maximum (``max_mhz``)."""

    read: ClockProbe
    max_mhz: float | None


def throttled_share(clocks_mhz: Sequence[float | None], max_mhz: float | None) -> float | None:
    """The share of samples taken under ``THROTTLED_BELOW`` of ``max_mhz`` (None: no clock
    read, or no maximum known)."""
    read = [c for c in clocks_mhz if c is not None]
    if not read or not max_mhz:
        return None
    return sum(c < THROTTLED_BELOW * max_mhz for c in read) / len(read)


def median_clock(clocks_mhz: Sequence[float | None]) -> float | None:
    read = [c for c in clocks_mhz if c is not None]
    return statistics.median(read) if read else None


def clock_reader(device: str, nvml: Any = None) -> ClockReader | None:
    """The SM clock reader of a CUDA ``device`` ("cuda:0"); None where it cannot be read.
    ``nvml``: the ``pynvml`` module (tests pass a fake)."""
    found = nvml_device(device, nvml)
    if found is None:
        return None
    nvml, handle = found
    try:
        top = float(nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM))
    except Exception:  # NVML present but unusable (no driver, a device it does not list)
        return None

    def read() -> float | None:
        try:
            return float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))
        except Exception:
            return None

    return ClockReader(read, top if top > 0 else None)


def nvml_device(device: str, nvml: Any = None) -> tuple[Any, Any] | None:
    """NVML and its handle of a CUDA ``device`` (the clock's and the energy counter's); None
    off CUDA, without NVML or a driver, or for a device NVML does not list. ``nvml``: the
    ``pynvml`` module (tests pass a fake)."""
    if not device.startswith("cuda"):
        return None
    if nvml is None:
        nvml = pynvml_module()
        if nvml is None:
            return None
    try:
        return nvml, nvml_handle(nvml, device)
    except Exception:  # NVML present but unusable (no driver, a device it does not list)
        return None


@functools.cache
def device_clock(device: str) -> ClockReader | None:
    """``clock_reader`` of ``device``, made once a process."""
    return clock_reader(device)


def clock_probe(device: str) -> ClockProbe | None:
    """The device's SM clock, read at most every ``READ_EVERY_S`` (None where it cannot be
    read: the CPU, no NVML)."""
    reader = device_clock(device)
    return None if reader is None else every(reader.read, READ_EVERY_S)


def every(
    read: ClockProbe, period_s: float, clock: Callable[[], float] = time.monotonic
) -> ClockProbe:
    """``read``, called at most once every ``period_s``; in between, its last reading."""
    last: list[Any] = [None, -math.inf]  # the reading, when it was taken

    def limited() -> float | None:
        now = clock()
        if now - last[1] >= period_s:
            last[:] = [read(), now]
        return cast("float | None", last[0])

    return limited


def device_clock_max(device: str) -> float | None:
    reader = device_clock(device)
    return None if reader is None else reader.max_mhz


@functools.cache
def pynvml_module() -> Any:
    """``pynvml``, initialised once; None without it or without a driver."""
    try:
        import pynvml  # type: ignore[import-not-found]  # optional: nvidia-ml-py

        pynvml.nvmlInit()
    except Exception:
        return None
    return pynvml


def nvml_handle(nvml: Any, device: str) -> Any:
    """NVML's handle of torch's ``device``: found by its UUID (CUDA_VISIBLE_DEVICES renumbers
    torch's devices, not NVML's), by torch's index where torch gives no UUID."""
    import torch

    index = int(device.split(":")[1]) if ":" in device else 0
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    if uuid is not None:
        text = str(uuid)
        try:
            return nvml.nvmlDeviceGetHandleByUUID(
                text if text.startswith("GPU-") else f"GPU-{text}"
            )
        except Exception:
            pass
    return nvml.nvmlDeviceGetHandleByIndex(index)
