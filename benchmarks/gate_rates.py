"""The gate and instruction experiments of regression_rates.py (--suite gate, instructions).

Each experiment is a real CLI run in its own process, as in CI; with --neighbour, a second
process keeps one core busy 2-5 s at a time, on and off, for the whole repetition.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
SLOWED = HERE / "slowed_layer.py"
CLI = [sys.executable, "-m", "attnbench"]

NEIGHBOUR = """
import random, sys, time
rng = random.Random(int(sys.argv[1]))
while True:
    end = time.monotonic() + rng.uniform(2, 5)
    while time.monotonic() < end:
        pass
    time.sleep(rng.uniform(2, 5))
"""


@contextlib.contextmanager
def neighbour(on: bool, seed: int) -> Iterator[None]:
    """A process that keeps one core busy for a few seconds at a time, on and off."""
    process = subprocess.Popen([sys.executable, "-c", NEIGHBOUR, str(seed)]) if on else None
    try:
        yield
    finally:
        if process is not None:
            process.kill()
            process.wait()


def cli(*args: str) -> tuple[int, dict[str, Any] | None, float]:
    """Exit code, the --json output (when given) and the wall seconds of one CLI run."""
    start = time.perf_counter()
    done = subprocess.run([*CLI, *args], capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise SystemExit(f"attnbench {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    payload = json.loads(done.stdout) if "--json" in args and done.stdout.strip() else None
    return done.returncode, payload, wall


def regressions(verdicts: dict[str, Any], layer: str | None = None) -> tuple[int, int]:
    """(time regressions, cases) among the cases whose layer contains ``layer`` (all: None)."""
    cases = [c for c in verdicts["cases"] if layer is None or layer in c["layer"]]
    return sum(c["verdict"] == "regression" for c in cases), len(cases)


def grid(args: argparse.Namespace) -> list[str]:
    return ["--n", args.n, "--d", args.d, "--time-budget", str(args.time_budget), "--quiet"]


def gate_rep(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """One repetition: two sweeps, an ab A/A and an ab with one layer slowed, each a CLI run
    that keeps its folder under ``root``; then judged as ``judge_rep`` judges a kept one."""
    g = grid(args)
    layers = args.layers.split(",")
    slowed = [f"{SLOWED}:slowed" if x == args.slow_layer else x for x in layers]
    percent = ["--option", f"percent={round(args.slowdown * 100)}"]
    gate = ["--max-slowdown", args.max_slowdown, "--fail-on", "time"]
    sweep = ["sweep", *g, "--layers", args.layers, "--processes", str(args.rounds), "--no-charts"]
    walls = {name: cli(*sweep, "--out", str(root / name))[2] for name in ("A1", "A2")}
    walls["ab-aa"] = cli(
        "ab", *g, "--layers", args.layers, "--json", "--out", str(root / "ab-aa"), *gate
    )[2]
    walls["ab-ab"] = cli(
        "ab",
        *g,
        "--base-layers",
        args.layers,
        "--layers",
        ",".join(slowed),
        *percent,
        "--json",
        "--out",
        str(root / "ab-ab"),
        *gate,
    )[2]
    judged = judge_rep(args, root, walls)
    assert judged is not None
    return judged


def _seconds(first: Path, last: Path | None = None) -> float:
    """Wall seconds from one run.json's start to (another's) end, to the second they keep."""
    start = json.loads((first / "run.json").read_text())["start_time"]
    end = json.loads(((last or first) / "run.json").read_text())["end_time"]
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def judge_rep(
    args: argparse.Namespace, root: Path, walls: dict[str, float] | None = None
) -> dict[str, Any] | None:
    """A repetition's record from the folders it kept (None if it was cut short): compare is
    run on the two sweeps, the ab verdicts are read back. Walls: as measured when given, else
    from run.json (to the second)."""
    needed = [
        root / "A1" / "run.json",
        root / "A2" / "run.json",
        root / "ab-aa" / "verdicts.json",
        root / "ab-ab" / "verdicts.json",
    ]
    if not all(p.exists() for p in needed):
        return None
    walls = walls or {
        "A1": _seconds(root / "A1"),
        "A2": _seconds(root / "A2"),
        **{ab: _seconds(root / ab / "base", root / ab / "current") for ab in ("ab-aa", "ab-ab")},
    }
    out: dict[str, Any] = {}
    for basis, extra in (("raw", []), ("normalised", ["--normalize"])):
        code, verdicts, _ = cli(
            "compare",
            str(root / "A1"),
            str(root / "A2"),
            "--json",
            "--max-slowdown",
            args.max_slowdown,
            "--fail-on",
            "time",
            *extra,
        )
        out[f"compare_{basis}"] = {"exit": code, "flagged": regressions(verdicts)}
    out["sweep_wall"] = [walls["A1"], walls["A2"]]
    aa = json.loads((root / "ab-aa" / "verdicts.json").read_text())
    out["ab_aa"] = {
        "exit": int(aa["failed"]),
        "flagged": regressions(aa),
        "wall": walls["ab-aa"],
        "ratios": [c["ratio_judged"] for c in aa["cases"]],
    }
    ab = json.loads((root / "ab-ab" / "verdicts.json").read_text())
    hit, everyone = regressions(ab, "slowed"), regressions(ab)
    out["ab_slowed"] = {
        "exit": int(ab["failed"]),
        "hit": hit,
        "wall": walls["ab-ab"],
        "others": (everyone[0] - hit[0], everyone[1] - hit[1]),
        "ratios": [c["ratio_judged"] for c in ab["cases"] if "slowed" in c["layer"]],
    }
    return out


def analyse_kept(args: argparse.Namespace) -> None:
    """Summarise the repetitions kept under ``args.analyse`` (a run cut short included)."""
    reps = sorted(args.analyse.glob("rep*"), key=lambda p: int(p.name[3:]))
    record = [r for p in reps if (r := judge_rep(args, p)) is not None]
    print(f"{len(record)} complete repetitions of {len(reps)} kept in {args.analyse}")
    summarise(args, record)


def instructions_rep(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    g = ["--n", args.count_n, "--d", args.count_d, "--quiet", "--metric", "instructions"]
    out: dict[str, Any] = {}
    code, verdicts, wall = cli(
        "ab", *g, "--layers", args.count_layers, "--json", "--out", str(root / "count-aa")
    )
    ratios = [c["metrics"]["instructions"]["change"] for c in verdicts["cases"]]
    out["aa"] = {"exit": code, "wall": wall, "changes": ratios}
    layers = args.count_layers.split(",")
    plain = [f"{SLOWED}:plain_work" if x == "attention" else x for x in layers]
    extra = [f"{SLOWED}:extra_work" if x == "attention" else x for x in layers]
    code, verdicts, wall = cli(
        "ab",
        *g,
        "--base-layers",
        ",".join(plain),
        "--layers",
        ",".join(extra),
        "--json",
        "--out",
        str(root / "count-ab"),
    )
    hits = [c["metrics"]["instructions"] for c in verdicts["cases"] if "extra" in c["layer"]]
    out["extra"] = {
        "exit": code,
        "wall": wall,
        "hit": (sum(h["verdict"] == "regression" for h in hits), len(hits)),
        "changes": [h["change"] for h in hits],
    }
    return out


def run_suite(args: argparse.Namespace) -> None:
    args.count_layers = getattr(args, "count_layers", None) or "conv,rnn,attention"
    args.count_n, args.count_d = "32,64", "16"
    tmp = tempfile.TemporaryDirectory()
    root = args.keep or Path(tmp.name)
    record = []
    rep_fn = gate_rep if args.suite == "gate" else instructions_rep
    for rep in range(args.reps):
        folder = root / f"rep{rep}"
        folder.mkdir(parents=True, exist_ok=True)
        with neighbour(args.neighbour, seed=rep):
            record.append(rep_fn(args, folder))
        print(f"rep {rep}: {json.dumps(record[-1], default=str)[:400]}", flush=True)
    if args.suite == "instructions":
        ci = HERE.parent / "ci.toml"
        with neighbour(args.neighbour, seed=99):
            _, _, wall = cli(
                "sweep",
                "--config",
                str(ci),
                "--metric",
                "instructions",
                "--processes",
                "1",
                "--no-charts",
                "--quiet",
                "--out",
                str(root / "ci-instructions"),
            )
        print(f"\nan instruction-count sweep of ci.toml's grid took {wall:.0f} s")
    summarise(args, record)
    if args.keep:
        (args.keep / f"{args.suite}.json").write_text(json.dumps(record, indent=1))


def _runs(record: list[dict[str, Any]], key: str) -> str:
    return f"{sum(r[key]['exit'] == 1 for r in record)}/{len(record)}"


def _rate(pairs: list[tuple[int, int]]) -> str:
    hits, total = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
    return f"{hits}/{total}"


def summarise(args: argparse.Namespace, record: list[dict[str, Any]]) -> None:
    reps = len(record)
    noise = "with a busy neighbour on and off" if args.neighbour else "on a quiet machine"
    if args.suite == "gate":
        print(
            f"\n{reps} repetitions {noise}; grid {args.layers} n={args.n} d={args.d}, "
            f"budget {args.time_budget} s/case; --max-slowdown {args.max_slowdown}"
        )
        print(
            f"  stored baseline (two sweeps, --rounds {args.rounds}, compare): runs failing "
            f"{_runs(record, 'compare_raw')} raw, {_runs(record, 'compare_normalised')} "
            f"normalised; cases flagged {_rate([r['compare_raw']['flagged'] for r in record])} "
            f"raw, {_rate([r['compare_normalised']['flagged'] for r in record])} normalised"
        )
        aa = np.array([x for r in record for x in r["ab_aa"]["ratios"]])
        print(
            f"  ab A/A: runs failing {_runs(record, 'ab_aa')}; cases flagged "
            f"{_rate([r['ab_aa']['flagged'] for r in record])}; paired ratio |r - 1| median "
            f"{np.median(np.abs(aa - 1)):.1%}, max {np.max(np.abs(aa - 1)):.1%}; one run "
            f"{np.median([r['ab_aa']['wall'] for r in record]):.0f} s"
        )
        sl = np.array([x for r in record for x in r["ab_slowed"]["ratios"]])
        print(
            f"  ab, {args.slow_layer} {args.slowdown:.0%} slower: runs failing (detected) "
            f"{_runs(record, 'ab_slowed')}; slowed cases flagged "
            f"{_rate([r['ab_slowed']['hit'] for r in record])}, others "
            f"{_rate([r['ab_slowed']['others'] for r in record])}; measured ratio median "
            f"{np.median(sl):.3f}"
        )
    else:
        changes = np.abs([x for r in record for x in r["aa"]["changes"]])
        print(
            f"\n{reps} repetitions {noise}; ab --metric instructions on "
            f"{args.count_layers} n={args.count_n} d={args.count_d}"
        )
        print(
            f"  A/A: runs failing {_runs(record, 'aa')}; runs with every count within 1%: "
            f"{sum(max(map(abs, r['aa']['changes'])) < 0.01 for r in record)}/{reps}; "
            f"|change| median {np.median(changes):.3%}, max {np.max(changes):.3%}; one run "
            f"{np.median([r['aa']['wall'] for r in record]):.0f} s"
        )
        extra = [x for r in record for x in r["extra"]["changes"]]
        print(
            f"  attention computing 1 call in 10 twice: runs failing (detected) "
            f"{_runs(record, 'extra')}; cases flagged "
            f"{_rate([r['extra']['hit'] for r in record])}; instruction change median "
            f"{np.median(extra):+.2%}"
        )
