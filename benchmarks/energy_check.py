"""How far ``--energy`` can be trusted on a GPU: the NVML counter's step, the pass's joules per
call against a pass six times longer, its power against NVML's own power reading, and the
passes' joules summed against the counter read once around all of them.

    python benchmarks/energy_check.py [--device cuda] [--json F]

Each case is a sweep's step (measure.step.make_step). Per case it prints energy_j from the
tool's pass (ENERGY_S), the same from a pass of LONG_S (the reference: its ends weigh six times
less), their ratio, the pass's power_w and the mean of nvmlDeviceGetPowerUsage polled through
the long pass. Then the sum: every case's short pass run again back to back, their joules
(energy_j x calls) summed, against the counter read before the first and after the last; the
difference is the energy of the calls run while each pass waited for a step of the counter,
and of the gaps between passes, which no pass counts.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import threading
import time
from typing import Any

from attnbench.devices import device_sync
from attnbench.measure.step import make_step
from attnbench.measure.timing.clocks import nvml_handle, pynvml_module
from attnbench.measure.timing.energy import device_energy, energy_pass
from attnbench.options import build_grid
from attnbench.spec import ENERGY_S

CASES = (  # layer, n, d: busy kernels, a launch-bound call, a recurrence, a convolution
    ("attention-sdpa", 4096, 128),
    ("attention", 2048, 128),
    ("attention", 256, 64),
    ("lstm", 1024, 128),
    ("conv", 2048, 128),
    ("ssm", 256, 64),
)
LONG_S = 6 * ENERGY_S


def counter_steps(read: Any, busy: Any, seconds: float = 1.0) -> list[float]:
    """The seconds between the counter's steps while ``busy`` runs: polled between calls."""
    times: list[float] = []
    last = read()
    begin = time.perf_counter()
    while time.perf_counter() - begin < seconds:
        busy()
        now = read()
        if now != last:
            times.append(time.perf_counter())
            last = now
    return [b - a for a, b in itertools.pairwise(times)]


def polled_power(nvml: Any, handle: Any, stop: threading.Event, into: list[float]) -> None:
    while not stop.is_set():
        try:
            into.append(nvml.nvmlDeviceGetPowerUsage(handle) / 1e3)
        except Exception:
            return
        time.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    read = device_energy(args.device)
    if read is None:
        raise SystemExit(f"no energy counter on {args.device}")
    nvml = pynvml_module()
    handle = nvml_handle(nvml, args.device)
    sync = device_sync(args.device)
    steps = []
    for layer, n, d in CASES:
        grid = build_grid({"layers": layer, "n": str(n), "d": str(d), "device": args.device})
        steps.append(((layer, n, d), make_step(grid.cases()[0], 0)))
    for _, step in steps:
        step()
    sync()

    busy_step = steps[0][1]
    gaps = counter_steps(read, lambda: (busy_step(), sync()))
    print(f"counter steps: {len(gaps)} in 1 s, median {statistics.median(gaps) * 1e3:.1f} ms "
          f"(min {min(gaps) * 1e3:.1f}, max {max(gaps) * 1e3:.1f})", flush=True)  # fmt: skip
    rows: list[dict[str, Any]] = []
    print(f"{'case':28} {'J/call':>10} {'long':>10} {'ratio':>6} {'W':>6} {'nvml W':>7}")
    for (layer, n, d), step in steps:
        short = energy_pass(step, read, sync=sync, device=args.device)
        watts: list[float] = []
        stop = threading.Event()
        poller = threading.Thread(target=polled_power, args=(nvml, handle, stop, watts))
        poller.start()
        long = energy_pass(step, read, span_s=LONG_S, sync=sync, device=args.device)
        stop.set()
        poller.join()
        ratio = short.energy_j / long.energy_j if short.energy_j and long.energy_j else None
        row = {
            "case": f"{layer} n={n} d={d}",
            "energy_j": short.energy_j,
            "long_energy_j": long.energy_j,
            "ratio": ratio,
            "power_w": short.power_w,
            "long_power_w": long.power_w,
            "nvml_power_w": statistics.mean(watts) if watts else None,
            "method": short.method,
        }
        rows.append(row)
        fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
        print(f"{row['case']:28} {fmt(short.energy_j, '10.3g')} {fmt(long.energy_j, '10.3g')} "
              f"{fmt(ratio, '6.3f')} {fmt(short.power_w, '6.0f')} "
              f"{fmt(row['nvml_power_w'], '7.0f')}", flush=True)  # fmt: skip

    # the sum: every short pass again, back to back, against the counter around all of them
    first = read()
    begin = time.perf_counter()
    summed, counted_s = 0.0, 0.0
    for _, step in steps:
        found = energy_pass(step, read, sync=sync, device=args.device)
        if found.energy_j is not None:
            summed += found.energy_j * found.calls
            counted_s += found.span_s
    whole = (read() or 0.0) - (first or 0.0)
    wall = time.perf_counter() - begin
    print(f"sum of the passes' joules {summed:.1f} J over {counted_s:.2f} s; the counter around "
          f"them {whole:.1f} J over {wall:.2f} s: ratio {summed / whole:.3f}, the passes' "
          f"share of the wall {counted_s / wall:.0%}", flush=True)  # fmt: skip
    if args.json:
        with open(args.json, "w") as handle_out:
            json.dump({"steps_s": gaps, "cases": rows, "sum_j": summed, "counter_j": whole,
                       "counted_s": counted_s, "wall_s": wall}, handle_out, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
