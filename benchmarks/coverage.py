"""Does a case's stated 95% interval hold what a re-run finds? The same grid swept in several
independent invocations of ``attnbench sweep`` (each a fresh command, one after another); for
each run and case, whether its interval holds the median of the other runs' times.

Two ways of measuring take turns, invocation by invocation, so a busy stretch of the machine
falls on both:

- ``processes``: the default (each round a fresh process, the interval over the rounds);
- ``one``: what attnbench did before, every case in the sweep's own process, one round, the
  interval from that process's samples (``--executor serial --processes 1``);
- ``nowait``: the default that never waits for the machine to read quiet (``--wait-quiet 0``):
  what the waiting buys;
- ``twothreads``: the default on torch's two threads (``--threads 2``), the CPU's default until
  2026-11-30: what one thread buys;
- ``precision5``: rounds added only while a case's interval is past 5% (``--precision 5%``), as
  ``--n auto`` adds them: whether an interval over three rounds holds as well as over six.

Then, from the ``processes`` runs' raw samples, the same question for other estimators over the
same rounds (the evidence for ``estimators.estimate``), and for fewer rounds (the evidence for
``--processes``' default): each run cut to its first k rounds.

    python benchmarks/coverage.py [--invocations 6] [--ways processes,one,nowait]
        [--layers conv,lstm,attention,attention-sdpa] [--n 512,2048] [--d 64] [--device cpu]
        [--keep DIR]
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from attnbench.estimators import estimate, kept_rounds, log_variance, median_ci, quieter
from attnbench.priors import priors_of
from attnbench.results.loader import load_results
from attnbench.results.reruns import run_level, same_state, typical_reference
from attnbench.results.run import RunResults
from attnbench.spec import spread_group

WAYS = {
    "processes": [],
    "one": ["--executor", "serial", "--processes", "1"],
    # the default, never waiting for a quiet machine: what --wait-quiet buys
    "nowait": ["--wait-quiet", "0"],
    # the default's rounds on torch's two threads of this 2-core CPU, the default until
    # 2026-11-30 (the batch that day ran the default, then two threads, against
    # "onethread": --threads 1)
    "twothreads": ["--threads", "2"],
    # rounds added only while a case would read ! (5%), as --n auto adds them since 2026-11-30:
    # most cases stop at their third round
    "precision5": ["--precision", "5%"],
}
Interval = tuple[float, float, float]  # centre, low, high


def sweep(way: str, out: Path, args: argparse.Namespace) -> float:
    """One invocation, as a user runs it; its wall seconds."""
    command = [
        *(sys.executable, "-m", "attnbench", "sweep"),
        *("--layers", args.layers, "--n", args.n, "--d", args.d),
        *("--device", args.device, "--out", str(out), "--no-charts", "--quiet"),
        *WAYS[way],
    ]
    begin = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - begin


def stated(run: RunResults) -> dict[str, Interval]:
    """Each measured case's time and interval, as the run states them."""
    rows = run.measured
    return {
        str(r.case_id): (float(r.time_s), float(r.time_ci_low_s), float(r.time_ci_high_s))
        for r in rows.itertuples()
    }


def held(runs: Sequence[dict[str, Interval]]) -> dict[str, list[bool]]:
    """Per case, for each run: does its interval hold the median of the other runs' times?"""
    out: dict[str, list[bool]] = {}
    for case in sorted(set.intersection(*(set(r) for r in runs))):
        for i, run in enumerate(runs):
            others = statistics.median(r[case][0] for j, r in enumerate(runs) if j != i)
            _, low, high = run[case]
            out.setdefault(case, []).append(bool(low <= others <= high))
    return out


def held_later(
    runs: Sequence[dict[str, Interval]], levels: Sequence[float] | None = None
) -> tuple[int, int]:
    """How many (run, later run, case) triples have the run's interval hold the later run's
    time: the re-run the interval is stated for, one at a time, never one before it; with
    ``levels``, only the later runs in the run's state of the machine."""
    hits = total = 0
    for i, run in enumerate(runs):
        for j, later in enumerate(runs[i + 1 :], start=i + 1):
            if levels is not None and not same_state(levels[i], levels[j]):
                continue
            for case, (_, low, high) in run.items():
                if case in later:
                    hits += low <= later[case][0] <= high
                    total += 1
    return hits, total


def reach(intervals: Sequence[dict[str, Interval]]) -> list[float]:
    """How far each stated interval reaches from its centre, as a share of it."""
    out = []
    for run in intervals:
        for center, low, high in run.values():
            ok = center > 0 and math.isfinite(low) and math.isfinite(high)
            out.append(max(center - low, high - center) / center if ok else math.inf)
    return out


def report(title: str, runs: Sequence[dict[str, Interval]]) -> None:
    found = held(runs)
    total = sum(len(v) for v in found.values())
    hits = sum(sum(v) for v in found.values())
    widths = reach(runs)
    wide = sum(w > 0.05 for w in widths)
    print(f"{title}: {hits} of {total} intervals hold the others' median ({hits / total:.0%}); "
          f"median reach ±{100 * statistics.median(widths):.1f}%, {wide} of {len(widths)} "
          "wider than ±5%")  # fmt: skip
    for case, marks in found.items():
        centers = [r[case][0] for r in runs]
        spread = max(centers) / min(centers)
        print(f"  {case.split('/b=')[0]:32} {sum(marks)}/{len(marks)} hold; "
              f"the runs' times {spread:.3f}x apart")  # fmt: skip


# ----------------------------------------------------------------------------- estimators


Rounds = tuple[list[list[float]], list[float | None], float | None]  # samples, refs, quiet


def rounds_of(run: RunResults, case_id: str, first: int | None = None) -> Rounds:
    """A case's rounds' samples and machine references, and the run's quiet level."""
    mine = run.samples[run.samples["case_id"] == case_id]
    groups, refs = [], []
    for _, group in mine.groupby("round", sort=True):
        groups.append(group["time_s"].tolist())
        ref = group["reference_s"].iloc[0]
        refs.append(None if math.isnan(ref) else float(ref))
    own = run_level(run.samples)
    quiet = quieter(None if math.isnan(own) else own, run.record.machine_quiet_s)
    cut = slice(0, first)
    return groups[cut], refs[cut], quiet


def over(run: RunResults, rule: Callable[[Rounds], Interval], first: int | None = None):  # type: ignore[no-untyped-def]
    return {str(c): rule(rounds_of(run, str(c), first)) for c in run.measured["case_id"]}


def attnbench_over(run: RunResults, first: int | None = None) -> dict[str, Interval]:
    """attnbench's estimate of every case over its first rounds: disturbed rounds out, each
    case's spread moderated by the run's (``estimators.Prior``)."""
    cases = [str(c) for c in run.measured["case_id"]]
    rounds = {c: rounds_of(run, c, first) for c in cases}
    kept = {c: kept_rounds(*r)[0] for c, r in rounds.items()}
    priors = priors_of((spread_group(c), log_variance(k), len(k) - 1.0) for c, k in kept.items())
    out = {}
    for case, (groups, refs, quiet) in rounds.items():
        found = estimate(groups, refs, quiet, priors.of(spread_group(case)))
        out[case] = (found.center_s, found.low_s, found.high_s)
    return out


def t_every_round(rounds: Rounds) -> Interval:
    found = estimate(rounds[0])  # every round kept, unmoderated: still a re-run's interval
    return found.center_s, found.low_s, found.high_s


def yuen(rounds: Rounds, trim: float = 0.2) -> Interval:
    """The 20%-trimmed mean of the rounds' log medians and Yuen's interval (Wilcox, 2012)."""
    from scipy import stats

    x = np.sort(np.log([statistics.median(g) for g in rounds[0]]))
    n = x.size
    g = int(trim * n)
    center = x[g : n - g].mean()
    w = np.clip(x, x[g], x[n - g - 1])
    se = w.std(ddof=1) / ((1 - 2 * trim) * math.sqrt(n)) if g else x.std(ddof=1) / math.sqrt(n)
    reach = float(stats.t.ppf(0.975, n - 2 * g - 1)) * se
    return math.exp(center), math.exp(center - reach), math.exp(center + reach)


def order_of_medians(rounds: Rounds) -> Interval:
    medians = [statistics.median(g) for g in rounds[0]]
    low, high = median_ci(medians)
    return statistics.median(medians), low, high


def pooled(rounds: Rounds) -> Interval:
    flat = [s for g in rounds[0] for s in g]
    low, high = median_ci(flat)
    return statistics.median(flat), low, high


def bootstrap(rounds: Rounds, draws: int = 2000) -> Interval:
    """Hierarchical: resample the rounds, then each round's samples; the median of the rounds'
    medians, its 2.5 and 97.5 percentiles."""
    rng = np.random.default_rng(0)
    arrays = [np.asarray(g) for g in rounds[0]]
    values = []
    for _ in range(draws):
        picked = rng.integers(0, len(arrays), len(arrays))
        values.append(np.median([np.median(rng.choice(arrays[i], arrays[i].size)) for i in picked]))
    center = float(np.median([np.median(a) for a in arrays]))
    return center, float(np.quantile(values, 0.025)), float(np.quantile(values, 0.975))


ESTIMATORS = {
    "t on every round's log median, unmoderated": t_every_round,
    "Yuen's trimmed mean of the rounds' log medians": yuen,
    "order statistics of the rounds' medians": order_of_medians,
    "hierarchical bootstrap over the rounds": bootstrap,
    "the samples pooled, order statistics": pooled,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--invocations", type=int, default=6)
    parser.add_argument("--ways", default="processes,one")
    parser.add_argument("--layers", default="conv,lstm,attention,attention-sdpa")
    parser.add_argument("--n", default="512,2048")
    parser.add_argument("--d", default="64")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--keep", type=Path, help="keep the runs here (default: a temporary folder)"
    )
    parser.add_argument("--analyse", type=Path, help="only read the runs kept in this folder")
    args = parser.parse_args()
    ways = args.ways.split(",")
    folder = args.analyse or args.keep or Path(tempfile.mkdtemp(prefix="attnbench-coverage-"))
    if args.analyse is None:
        for i in range(args.invocations):
            for way in ways if i % 2 == 0 else ways[::-1]:
                seconds = sweep(way, folder / f"{way}-{i}", args)
                print(f"{way} {i + 1}/{args.invocations}: {seconds:.1f} s", file=sys.stderr)
    runs = {
        way: [load_results(p) for p in sorted(folder.glob(f"{way}-*"))]
        for way in ways
        if any(folder.glob(f"{way}-*"))
    }
    counts = ", ".join(f"{len(v)} {k}" for k, v in runs.items())
    print(f"invocations: {counts}; runs in {folder}")
    runs = {way: loaded for way, loaded in runs.items() if len(loaded) >= 2}
    if not runs:
        sys.exit("coverage needs at least two runs of a way (--invocations 2)")
    for way, loaded in runs.items():
        waits = [f"{r.record.waited_s:.0f}" for r in loaded]
        print(f"{way}: seconds waited for a quiet machine, by invocation: {', '.join(waits)}")
    for way, loaded in runs.items():
        report(f"{way}: as stated", [stated(r) for r in loaded])
        # the runs whose intervals hold a spread between sweeps (their code's earlier sweeps,
        # run.json's reruns, or the machine's typical from other code's, reruns_other), held
        # to the median of every other run of the way
        found = [i for i, r in enumerate(loaded) if r.between]
        if found and len(found) < len(loaded):
            whole = held([stated(r) for r in loaded])
            hits = sum(marks[i] for marks in whole.values() for i in found)
            total = len(found) * len(whole)
            width = statistics.median(reach([stated(loaded[i]) for i in found]))
            print(f"{way}, the {len(found)} runs that found earlier sweeps: {hits} of {total} "
                  f"hold ({hits / total:.0%}); median reach ±{100 * width:.1f}%")  # fmt: skip
    for way, loaded in runs.items():
        # what the interval claims: one re-run's time (the others' median is steadier than
        # one run, so it is held more often than 95% by an interval that is right)
        hits, total = held_later([stated(r) for r in loaded])
        print(f"{way}: against each later run alone, {hits} of {total} ({hits / total:.0%})")
        # the first run: what its code's first sweep on this machine claims
        first, whence = loaded[0], "none"
        if first.record.reruns:
            whence = "its code's earlier sweeps"
        elif first.between:
            whence = "the machine's typical, from other code's sweeps"
        mine, laters = stated(first), [stated(r) for r in loaded[1:]]
        alone = sum(
            low <= later[case][0] <= high
            for later in laters
            for case, (_, low, high) in mine.items()
            if case in later
        )
        pairs = sum(case in later for later in laters for case in mine)
        width = statistics.median(reach([mine]))
        print(f"{way}: the first run (its spread between sweeps: {whence}) against each later "
              f"run, {alone} of {pairs} ({alone / max(pairs, 1):.0%}); median reach "
              f"±{100 * width:.1f}%")  # fmt: skip
        # the claim as the summary scopes it: a re-run in the machine's same state
        levels = [typical_reference(r.samples) for r in loaded]
        hits, total = held_later([stated(r) for r in loaded], levels)
        apart = held_later([stated(r) for r in loaded])[1] - total
        print(f"{way}: against each later run in the same state of the machine, {hits} of "
              f"{total} ({hits / max(total, 1):.0%}); {apart} pairs in another state")  # fmt: skip
    if "processes" in runs:
        loaded = runs["processes"]
        rounds = [int(r.samples.groupby("case_id")["round"].nunique().median()) for r in loaded]
        print(f"\nthe processes runs' rounds a case: median {statistics.median(rounds)}")
        for name, rule in ESTIMATORS.items():
            report(f"same rounds, {name}", [over(r, rule) for r in loaded])
        for first in (2, 3, 4, 5):
            report(f"first {first} rounds, attnbench", [attnbench_over(r, first) for r in loaded])


if __name__ == "__main__":
    main()
