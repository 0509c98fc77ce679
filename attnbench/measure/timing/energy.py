"""Joules per call from the GPU's own energy counter (NVML, through ``nvidia-ml-py``).

Volta and newer GPUs count the energy they have drawn since the driver loaded
(``nvmlDeviceGetTotalEnergyConsumption``, millijoules): Zeus reads it, and MLPerf Power reports
energy per query. The counter moves in steps, tens of milliseconds apart, so a reading around
a short span says little. ``energy_pass`` (``--energy``) runs the call back to back after the
timed calls, from one step of the counter to the first step after ``ENERGY_S``: the energy
between two steps is the energy of the calls run between them, known to a block of calls at
each end rather than to the counter's period. Where no counter can be read (the CPU, no NVML,
a card before Volta) the columns stay empty and ``energy_method`` says why.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from attnbench.measure.timing.clocks import nvml_device
from attnbench.spec import ENERGY_S

BLOCK_S = 5e-3  # calls run in synchronised blocks of about this long between counter reads
# The longest the pass waits for the counter to step (documented periods are 20-100 ms): a
# counter that has not moved by then cannot be read, and the case says so.
STEP_WAIT_S = 1.0
# The counter's period on an H200 (100 ms; 20-100 ms documented): a wait for a step, at most.
STEP_S = 0.1
# Past this share of the span, where the steps fell among a call's blocks is too unsure
# for a reading (a call of a tenth of a second or more): none is given.
MAX_MISALIGNED = 0.25

EnergyProbe = Callable[[], float | None]  # the device's energy counter now, joules (None: unread)


@dataclass(frozen=True)
class Energy:
    """One case's energy pass: joules per call, the device's mean draw over the pass in watts,
    and how they were read (``none: <why>`` where they were not)."""

    energy_j: float | None
    power_w: float | None
    method: str
    calls: int = 0  # the calls between the counter's two steps
    span_s: float = 0.0  # the seconds between them


def energy_probe(device: str, nvml: Any = None) -> EnergyProbe | None:
    """The energy counter of a CUDA ``device`` in joules; None where it cannot be read.
    ``nvml``: the ``pynvml`` module (tests pass a fake)."""
    found = nvml_device(device, nvml)
    if found is None:
        return None
    nvml, handle = found
    try:
        nvml.nvmlDeviceGetTotalEnergyConsumption(handle)  # refused before Volta
    except Exception:
        return None

    def read() -> float | None:
        try:
            return float(nvml.nvmlDeviceGetTotalEnergyConsumption(handle)) * 1e-3
        except Exception:
            return None

    return read


@functools.cache
def device_energy(device: str) -> EnergyProbe | None:
    """``energy_probe`` of ``device``, made once a process."""
    return energy_probe(device)


def energy_pass(
    fn: Callable[[], object],
    read: EnergyProbe | None,
    *,
    span_s: float = ENERGY_S,
    clock: Callable[[], float] = time.perf_counter,
    sync: Callable[[], None] = lambda: None,
    device: str = "",
) -> Energy:
    """Joules per call of ``fn``: its calls run back to back in synchronised blocks from one
    step of the counter ``read`` to the first step after ``span_s``. Each end is known to a
    block (the step came during the block before it was seen), so the reading is within
    about two blocks over the span of the truth."""
    if read is None:
        where = f"on {device}" if device else "here"
        return Energy(
            None,
            None,
            f"none: no GPU energy counter {where} (it needs a CUDA GPU and NVML: pip install "
            "'attnbench[gpu]')",
        )
    sync()
    begin = clock()
    fn()
    sync()
    block = max(1, math.ceil(BLOCK_S / max(clock() - begin, 1e-7)))  # sized on one call

    def run_block() -> None:
        for _ in range(block):
            fn()
        sync()

    begin = clock()
    run_block()  # a block timed: a first call is no sure guide to the next ones
    per_call = (clock() - begin) / block
    block = max(1, math.ceil(BLOCK_S / max(per_call, 1e-7)))
    block_s = block * per_call
    if 2 * block_s / span_s > MAX_MISALIGNED:  # refused before the pass, not after it
        return Energy(
            None,
            None,
            f"none: one call ({block_s / block:.2g} s) is too long to align to the counter's "
            f"steps over {span_s:g} s",
        )

    begin = clock()
    while clock() - begin < STEP_S:  # a period of calls first: the device busy as it will be,
        run_block()  # so a counter whose value lags its step reads none of the idle before
    first, _, why = next_step(read, run_block, clock)
    if first is None:
        return Energy(None, None, f"none: {why}")
    start, calls = clock(), 0
    while clock() - start < span_s:
        run_block()
        calls += block
    last, blocks, why = next_step(read, run_block, clock)
    calls += blocks * block
    took = clock() - start
    if last is None:
        return Energy(None, None, f"none: {why} after its first step")
    if last < first:
        return Energy(None, None, "none: the energy counter went back (a driver reset?)")
    within = 2 * block / calls  # a block each end, where the step fell unseen
    joules = last - first
    return Energy(
        joules / calls,
        joules / took,
        f"NVML energy counter: {calls} calls back to back, {took / calls * 1e6:.4g} µs a call, "
        f"over {took:.2f} s between two of its steps (its ends aligned to them within "
        f"{within:.1%} of the span)",
        calls,
        took,
    )


def next_step(
    read: EnergyProbe, run_block: Callable[[], None], clock: Callable[[], float]
) -> tuple[float | None, int, str]:
    """Blocks of calls run until the counter steps: its reading after the step, the blocks
    run, and why there is none (a counter that cannot be read, or did not move within
    ``STEP_WAIT_S``). A step is a change between two reads in a row that did not fail: after
    a failed read the counter may have stepped unseen, and the next reading is only a new
    baseline."""
    waited, blocks, before = clock(), 0, read()
    read_any = before is not None
    while True:
        if clock() - waited > STEP_WAIT_S:
            moved = "did not move in" if read_any else "could not be read for"
            return None, blocks, f"the energy counter {moved} {STEP_WAIT_S:g} s"
        now = read()
        read_any = read_any or now is not None
        if before is not None and now is not None and now != before:
            return now, blocks, ""
        before = now
        run_block()
        blocks += 1


def energy_of(
    fn: Callable[[], object], device: str, span_s: float, sync: Callable[[], None]
) -> Energy | None:
    """A case's energy pass where ``span_s`` asks for one (``--energy``), else None."""
    if span_s <= 0:
        return None
    return energy_pass(fn, device_energy(device), span_s=span_s, sync=sync, device=device)


def energy_columns(found: Energy | None) -> dict[str, Any]:
    """The results columns an energy pass fills (empty without one)."""
    if found is None:
        return {"energy_j": None, "power_w": None, "energy_method": ""}
    return {"energy_j": found.energy_j, "power_w": found.power_w, "energy_method": found.method}
