"""Is attnbench's time the layer's time, whatever ran before it and whoever measures it?

Three tables, every measurement in a fresh process, the sides of each pair interleaved:

1. history: does what ran before in a sweep change a layer's time? Pairs of fresh sweeps, one
   after the other (which goes first alternates): the layer swept after two others
   (``--layers A,B,LAYER``) and swept alone (``--layers LAYER``); the effect is the ratio of
   the two sweeps' times of it, median of the pairs, with a 95% interval (bootstrap of the
   pairs). Target: within 5%. ``--executor serial`` measures what it was when every case ran
   in the sweep's own process, one after another.
2. fidelity: attnbench's median (``time_call``) against torch.utils.benchmark's
   ``blocked_autorange`` on the same module and input, in one fresh process whose allocator is
   in the same state for both: four measurements each, in ABBA order twice (which starts
   alternates by process), the ratio of the two medians. Target: within 10%.
3. allocator: explicit attention swept after each history (nothing, conv, rnn, conv then rnn)
   under ``--allocator system`` and ``pinned``: time and minor page faults per call, as the
   README shows them.

    python benchmarks/timing_fidelity.py [--rounds 5] [--layers conv,attention] [--only history]
                                         [--time-budget 1] [--executor serial]

Read the ratios, not the times: this machine is shared.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BUILTIN_SIZES = {"history": (512, 2048), "fidelity": (256, 1024)}
D = 64


def sweep(
    layers: str, ns: tuple[int, ...], allocator: str, out: Path, *extra: str
) -> dict[tuple, dict]:
    """One fresh ``attnbench sweep``; its rows by (layer, n)."""
    command = [sys.executable, "-m", "attnbench", "sweep", "--layers", layers, "--d", str(D),
               "--n", ",".join(map(str, ns)), "--allocator", allocator, "--no-charts",
               "--quiet", "--out", str(out), *extra]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True)
    with open(out / "results.csv") as fh:
        return {(row["layer"], int(row["n"])): row for row in csv.DictReader(fh)}


def round_medians(out: Path, rows: dict[tuple, dict]) -> dict[tuple[str, int, int], float]:
    """The median time of each (layer, n, round) from samples.csv."""
    names = {row["case_id"]: key for key, row in rows.items()}
    times: dict[tuple[str, int, int], list[float]] = {}
    with open(out / "samples.csv") as fh:
        for sample in csv.DictReader(fh):
            layer, n = names[sample["case_id"]]
            times.setdefault((layer, n, int(sample["round"])), []).append(float(sample["time_s"]))
    return {key: statistics.median(values) for key, values in times.items()}


def interval(values: list[float], seed: int = 0) -> tuple[float, float]:
    """95% bootstrap interval of the median (scipy)."""
    from scipy.stats import bootstrap

    if len(set(values)) < 2:
        return values[0], values[0]
    found = bootstrap((values,), statistics.median, n_resamples=2000, method="percentile",
                      random_state=seed).confidence_interval  # fmt: skip
    return float(found.low), float(found.high)


def history(
    layers: list[str], pairs: int, budget: str | None = None, executor: str | None = None
) -> list[float]:
    way = f"--executor {executor}" if executor else "the default executor"
    print(f"\n1. history: a layer's time swept after two others over swept alone (d={D}, "
          f"{way}), {pairs} pairs of fresh sweeps")  # fmt: skip
    print(f"{'layer':<18} {'n':>5} {'after':>10} {'alone':>10} {'effect':>7} {'95% interval':>15}"
          "  effects")  # fmt: skip
    worst = []
    extra = (*(("--time-budget", budget) if budget else ()),
             *(("--executor", executor) if executor else ()))  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for layer in layers:
            others = [x for x in ("conv", "rnn", "attention") if x != layer][:2]
            ns = BUILTIN_SIZES["history"]
            times: dict[str, dict[int, list[float]]] = {"alone": {}, "after": {}}
            for r in range(pairs):
                for side in ("alone", "after") if r % 2 == 0 else ("after", "alone"):
                    names = layer if side == "alone" else ",".join([*others, layer])
                    out = Path(tmp) / f"{layer}-{side}-{r}"
                    rows = sweep(names, ns, "pinned", out, *extra)
                    for n in ns:
                        times[side].setdefault(n, []).append(float(rows[(layer, n)]["time_s"]))
            for n in ns:
                pairs_ = zip(times["after"][n], times["alone"][n], strict=True)
                effects = [a / b for a, b in pairs_]
                effect = statistics.median(effects)
                low, high = interval(effects)
                worst.append(abs(effect - 1))
                after, alone = (statistics.median(times[s][n]) * 1e3 for s in ("after", "alone"))
                each = " ".join(f"{x:.2f}" for x in effects)
                print(f"{layer:<18} {n:>5} {after:>7.3f} ms {alone:>7.3f} ms {effect:>7.3f} "
                      f"  [{low:.2f}, {high:.2f}]  {each}")  # fmt: skip
    return worst


def ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1e3:>7.3f} ms"


def one(layer: str, n: int, allocator: str, torch_first: bool) -> None:
    """In a fresh process: both timers on one module, in the given allocator state."""
    from attnbench.measure.timing.allocator import set_allocator

    set_allocator(allocator)  # before torch allocates anything for the layer
    import torch
    import torch.utils.benchmark as tb

    from attnbench.measure import TimingPolicy, time_call
    from attnbench.measure.step import make_step
    from attnbench.options import build_grid

    case = build_grid({"layers": layer, "n": [n], "d": [D], "device": "cpu"}).cases()[0]
    step = make_step(case, seed=0)
    for _ in range(3):
        step()  # the sweep's first call and traced passes warm the heap as much
    timer = tb.Timer(stmt="step()", globals={"step": step}, num_threads=torch.get_num_threads())
    policy = TimingPolicy(warmup_calls=1)  # a sweep's: 0.25 s of timed calls

    def ours() -> float:
        return time_call(step, policy).median_s

    def theirs() -> float:
        return timer.blocked_autorange(min_run_time=0.25).median

    # ABBA, twice: with one measurement each, whichever timer ran first in the fresh process
    # could meet a colder machine (conv read 0.87 and 1.11 at its two sizes that way), so the
    # order is balanced inside each process as well as across them.
    found: dict[str, list[float]] = {"ours": [], "theirs": []}
    order = (
        ("theirs", "ours", "ours", "theirs")
        if torch_first
        else ("ours", "theirs", "theirs", "ours")
    )
    for name in order * 2:
        found[name].append(ours() if name == "ours" else theirs())
    print(json.dumps({name: statistics.median(values) for name, values in found.items()}))


def fidelity(layers: list[str], rounds: int) -> list[float]:
    print(f"\n2. fidelity: attnbench / torch.utils.benchmark, same module, same process "
          f"(d={D}, pinned), {rounds} fresh processes")  # fmt: skip
    print(f"{'layer':<18} {'n':>5} {'attnbench':>10} {'torch':>10} {'ratio':>7}  ratios")
    worst = []
    for layer in layers:
        for n in BUILTIN_SIZES["fidelity"]:
            ours, theirs, ratios = [], [], []
            for r in range(rounds):
                command = [sys.executable, __file__, "--one", layer, str(n), "pinned", str(r % 2)]
                done = subprocess.run(command, check=True, capture_output=True, text=True)
                found = json.loads(done.stdout.strip().splitlines()[-1])
                ours.append(found["ours"])
                theirs.append(found["theirs"])
                ratios.append(found["ours"] / found["theirs"])
            ratio = statistics.median(ratios)
            worst.append(abs(ratio - 1))
            print(f"{layer:<18} {n:>5} {ms(ours)} {ms(theirs)} {ratio:>7.3f}  "
                  f"{' '.join(f'{x:.2f}' for x in ratios)}")  # fmt: skip
    return worst


def allocator_table(rounds: int) -> None:
    print(f"\n3. allocator: explicit attention (n=512 and 2048, d={D}) after a history, "
          f"median of {rounds} fresh sweeps")  # fmt: skip
    print(f"{'before it':<14} {'n':>5} {'system':>10} {'faults':>8} {'pinned':>10} {'faults':>8}")
    histories = {"nothing": "", "conv": "conv,", "rnn": "rnn,", "conv, rnn": "conv,rnn,"}
    with tempfile.TemporaryDirectory() as tmp:
        for label, before in histories.items():
            found: dict[tuple[str, int], list[tuple[float, float]]] = {}
            for r in range(rounds):
                for state in ("system", "pinned") if r % 2 == 0 else ("pinned", "system"):
                    out = Path(tmp) / f"{label}-{state}-{r}".replace(", ", "-")
                    rows = sweep(f"{before}attention", (512, 2048), state, out)
                    for n in (512, 2048):
                        row = rows[("attention", n)]
                        found.setdefault((state, n), []).append(
                            (float(row["time_s"]), float(row["page_faults"]))
                        )
            for n in (512, 2048):
                cells = []
                for state in ("system", "pinned"):
                    times = [t for t, _ in found[(state, n)]]
                    faults = statistics.median(f for _, f in found[(state, n)])
                    cells.append(f"{ms(times)} {faults:>8.0f}")
                print(f"{label:<14} {n:>5} {' '.join(cells)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--layers", default=None, help="comma-separated (default: built-in)")
    parser.add_argument("--only", choices=("history", "fidelity", "allocator"), default=None)
    parser.add_argument("--time-budget", default=None, help="history: each sweep's budget")
    parser.add_argument("--executor", default=None, help="history: each sweep's executor")
    parser.add_argument("--one", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        layer, n, state, torch_first = args.one
        one(layer, int(n), state, torch_first == "1")
        return
    from attnbench.layers import BUILTIN

    layers = args.layers.split(",") if args.layers else list(BUILTIN)
    if args.only in (None, "history"):
        worst = history(layers, args.rounds, args.time_budget, args.executor)
        print(f"largest history disagreement: {max(worst):.1%} (target < 5%)")
    if args.only in (None, "fidelity"):
        worst = fidelity(layers, args.rounds)
        print(f"largest disagreement with torch.utils.benchmark: {max(worst):.1%} (target < 10%)")
    if args.only in (None, "allocator"):
        allocator_table(args.rounds)


if __name__ == "__main__":
    main()
