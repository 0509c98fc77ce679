"""What a neighbour that keeps one core busy does to a round, and what each check sees of it.

1. In this process, with a neighbour (a process spinning on one core) switched on and off in
   turn: the machine's reference (``measure.timing.reference``: short calls, their median),
   the cores the kernel counts other processes taking (``measure.timing.contention``), and a
   layer that runs torch's threads for milliseconds (attention at n = 1024, d = 64).
2. ``--sweeps K``: a small grid swept quiet and with the neighbour on and off in bursts (1.5 s
   each) in turn, K bursty sweeps; each bursty run is read twice, leaving out its rounds beside
   the neighbour (the default) and keeping them (``ATTNBENCH_BUSY_CORES=inf``), against the
   quiet runs either side of it.

3. ``--ab K``: K A/A runs of ``attnbench ab`` beside the neighbour in bursts, each case's
   paired ratio read over every pair (the verdict) and over its quiet pairs only.

    python benchmarks/neighbour.py [--trials 4] [--sweeps 2] [--ab 3]

Read the ratios, not the seconds: this machine is shared.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from attnbench.measure.step import make_step
from attnbench.measure.timing import contention
from attnbench.measure.timing.reference import read_reference
from attnbench.options import build_grid

HOG = [sys.executable, "-c", "while True: pass"]


def call_s(step, calls: int = 5) -> float:  # type: ignore[no-untyped-def]
    """The median seconds of one call of ``step``."""
    step()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def in_process(trials: int) -> None:
    grid = build_grid({"layers": "attention", "n": "1024", "d": "64", "device": "cpu"})
    (case,) = grid.cases()
    step = make_step(case, 0)
    rows: dict[bool, list[tuple[float, float, float]]] = {False: [], True: []}
    for _ in range(trials):
        for busy in (False, True):
            hog = subprocess.Popen(HOG) if busy else None
            time.sleep(0.3)
            start = contention.mark()
            layer = call_s(step)
            taken = contention.others_cores(start, contention.mark())
            rows[busy].append((read_reference(), taken or 0.0, layer))
            if hog is not None:
                hog.kill()
                hog.wait()
            time.sleep(0.3)
    print(f"in this process, {trials} trials, each neighbour off then on:")
    for i, name in enumerate(("the reference", "others' cores", "attention n=1024")):
        off = [r[i] for r in rows[False]]
        on = [r[i] for r in rows[True]]
        if i == 1:
            print(f"  {name:18} off {statistics.median(off):.2f}, on {statistics.median(on):.2f}")
        else:
            ratios = " ".join(f"{b / a:.2f}" for a, b in zip(off, on, strict=True))
            print(f"  {name:18} on / off: {ratios}")


def bursts(stop: threading.Event, period_s: float = 1.5) -> None:
    """The neighbour on and off in turn until ``stop``."""
    while not stop.is_set():
        hog = subprocess.Popen(HOG)
        stop.wait(period_s)
        hog.kill()
        hog.wait()
        stop.wait(period_s)


def sweep(out: Path) -> None:
    """One sweep with a cache of its own: no earlier sweep's quiet level or history judges
    its rounds (the machine changes state between sweeps here), only its own readings."""
    cache = {**os.environ, "ATTNBENCH_CACHE_DIR": tempfile.mkdtemp(prefix="attnbench-cache-")}
    subprocess.run(
        [sys.executable, "-m", "attnbench", "sweep", "--layers", "conv,lstm,attention",
         "--n", "512,2048", "--d", "64", "--out", str(out), "--no-charts", "--quiet",
         "--wait-quiet", "0"],
        check=True, stdout=subprocess.DEVNULL, env=cache,
    )  # fmt: skip


def times(folder: Path, threshold: str | None) -> dict[str, tuple[float, int]]:
    """Each case's time and rounds left out, read with the busy threshold given."""
    from attnbench.results.loader import load_results

    if threshold is None:
        os.environ.pop(contention.BUSY_ENV, None)
    else:
        os.environ[contention.BUSY_ENV] = threshold
    run = load_results(folder)
    return {
        str(r.case_id).split("/b=")[0]: (float(r.time_s), int(r.rounds_disturbed))
        for r in run.measured.itertuples()
    }


def sweeps(pairs: int) -> None:
    """Quiet and bursty sweeps in turn, each bursty one read against the quiet ones either
    side of it (the machine changes state between sweeps here: a lone pair misleads)."""
    folder = Path(tempfile.mkdtemp(prefix="attnbench-neighbour-"))
    order = ["quiet-0"]
    for i in range(pairs):
        order += [f"bursts-{i}", f"quiet-{i + 1}"]
    for name in order:
        stop = threading.Event()
        thread = threading.Thread(target=bursts, args=(stop,))
        if name.startswith("bursts"):
            thread.start()
        try:
            sweep(folder / name)
        finally:
            stop.set()
            if thread.is_alive():
                thread.join()
    print(f"\nsweeps in {folder}: each bursty run's times over its quiet neighbours' (geometric "
          "mean), its rounds beside the neighbour left out (the default) | kept")  # fmt: skip
    found: list[tuple[float, float]] = []
    for i in range(pairs):
        before, after = times(folder / f"quiet-{i}", None), times(folder / f"quiet-{i + 1}", None)
        left = times(folder / f"bursts-{i}", None)
        kept = times(folder / f"bursts-{i}", "inf")
        for case in before:
            quiet = (before[case][0] * after[case][0]) ** 0.5
            found.append((left[case][0] / quiet, kept[case][0] / quiet))
            print(f"  {i}: {case:28} {left[case][0] / quiet:.2f} ({left[case][1]} rounds left "
                  f"out) | {kept[case][0] / quiet:.2f}; the quiet runs "
                  f"{after[case][0] / before[case][0]:.2f}x apart")  # fmt: skip
    off = [abs(math.log(a)) for a, _ in found]
    off_kept = [abs(math.log(b)) for _, b in found]
    print(f"  distance from the quiet time, median and largest: "
          f"{math.expm1(statistics.median(off)):.1%} and {math.expm1(max(off)):.1%} left out, "
          f"{math.expm1(statistics.median(off_kept)):.1%} and {math.expm1(max(off_kept)):.1%} "
          "kept")  # fmt: skip


def quiet_only(base, new, pairs, thresholds):  # type: ignore[no-untyped-def]
    """Each case's paired ratio over its quiet pairs only (while enough remain for the test):
    what leaving the disturbed pairs out would read."""
    from attnbench.compare.verdicts import judge_pairs
    from attnbench.estimators import kept_of
    from attnbench.thresholds import cases_to_judge

    out = {}
    for base_id, case_id in pairs:
        one, other = base.rounds_of(base_id), new.rounds_of(case_id)
        marks_one, marks_other = base.disturbed_of(base_id), new.disturbed_of(case_id)
        rounds = sorted(set(one) & set(other))
        bad = [marks_one.get(r, False) or marks_other.get(r, False) for r in rounds]
        kept = [rounds[i] for i in kept_of(bad, cases_to_judge(thresholds.alpha))]
        out[case_id] = (
            judge_pairs({r: one[r] for r in kept}, {r: other[r] for r in kept}, thresholds),
            len(rounds) - len(kept),
        )
    return out


def ab_runs(runs: int) -> None:
    """A/A runs of ``attnbench ab`` beside the bursty neighbour (the truth: every ratio 1),
    each case's paired ratio read over every pair (the verdict) and over its quiet pairs only
    (what leaving the disturbed pairs out would read)."""
    from attnbench.compare.runs import compare_runs
    from attnbench.results.loader import load_results
    from attnbench.thresholds import Thresholds

    os.environ.pop(contention.BUSY_ENV, None)
    folder = Path(tempfile.mkdtemp(prefix="attnbench-neighbour-ab-"))
    cache = {**os.environ, "ATTNBENCH_CACHE_DIR": tempfile.mkdtemp(prefix="attnbench-cache-")}
    print(f"\nA/A ab runs in {folder}, beside the neighbour in bursts: each case's paired ratio "
          "(the truth: 1) over every pair (the verdict) | its quiet pairs only")  # fmt: skip
    off: dict[str, list[float]] = {"every pair": [], "quiet pairs only": []}
    wrong = dict.fromkeys(off, 0)
    for i in range(runs):
        stop = threading.Event()
        thread = threading.Thread(target=bursts, args=(stop,))
        thread.start()
        try:
            subprocess.run(
                [sys.executable, "-m", "attnbench", "ab", "--layers", "conv,lstm,attention",
                 "--n", "512,2048", "--d", "64", "--device", "cpu", "--out",
                 str(folder / f"ab-{i}"), "--quiet", "--wait-quiet", "0"],
                stdout=subprocess.DEVNULL, env=cache,
            )  # fmt: skip  # exit 1 on a regression: read below
        finally:
            stop.set()
            thread.join()
        base = load_results(folder / f"ab-{i}" / "base")
        new = load_results(folder / f"ab-{i}" / "current")
        pairs = list(zip(base.frame["case_id"], new.frame["case_id"], strict=True))
        thresholds = Thresholds()
        every = compare_runs(base, new, thresholds, pairs=pairs, paired=True).times
        quiet = quiet_only(base, new, pairs, thresholds)
        for row in every.itertuples():
            alone, left = quiet[row.case_id]
            for way, judged in (("every pair", row), ("quiet pairs only", alone)):
                off[way].append(
                    abs(math.log(judged.ratio_judged if way == "every pair" else judged.ratio))
                )
                wrong[way] += judged.verdict in ("regression", "improvement")
            print(f"  {i}: {str(row.case_id).split('/b=')[0]:28} {row.ratio_judged:.3f} "
                  f"({row.pairs_disturbed} pairs disturbed, {row.verdict}) | {alone.ratio:.3f} "
                  f"({left} left out, {alone.verdict})")  # fmt: skip
    for way, found in off.items():
        print(f"  {way}: distance from 1, median {math.expm1(statistics.median(found)):.1%}, "
              f"largest {math.expm1(max(found)):.1%}; {wrong[way]} of {len(found)} verdicts "
              "a regression or an improvement")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--sweeps", type=int, default=0, help="bursty sweeps (between quiet)")
    parser.add_argument("--ab", type=int, default=0, help="A/A ab runs beside the neighbour")
    args = parser.parse_args()
    if args.trials:
        in_process(args.trials)
    if args.sweeps:
        sweeps(args.sweeps)
    if args.ab:
        ab_runs(args.ab)


if __name__ == "__main__":
    main()
