"""Wall time of the commands that start worker processes for both sides: `ab` on one small case,
`ab --metric instructions` (a Callgrind counter a side), and `bisect` over 31 commits of a
throwaway repository (a layer 30% slower from the 21st on), each taken as the real command.

With ``--against REV`` the same commands run with REV's attnbench too (a git worktree of it put
first on PYTHONPATH, for the driver and every process it starts), taking turns, so the two read
the same moment of this shared machine.

    python benchmarks/ab_costs.py [--against REV] [--repeat 1] [--only ab,instructions,bisect]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from layer_history import git, layer_repository  # noqa: E402  (the bisect test's repository)

SMALL = ["--n", "16", "--d", "8", "--device", "cpu"]


@contextlib.contextmanager
def worktree(rev: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="attnbench-against-") as tmp:
        path = Path(tmp) / "tree"
        git(ROOT, "worktree", "add", "--detach", "--quiet", str(path), rev)
        try:
            yield path
        finally:
            git(ROOT, "worktree", "remove", "--force", str(path))


def timed(command: list[str], tree: Path, cwd: Path) -> float:
    """Seconds the command took with ``tree``'s attnbench first on the path."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "attnbench", *command], cwd=cwd, env=env,
                          capture_output=True, text=True)  # fmt: skip
    took = time.perf_counter() - start
    if done.returncode not in (0, 1):  # 1: ab's gate found a regression, as bisect's race does
        sys.exit(f"{' '.join(command[:2])} failed ({done.returncode}): {done.stderr.strip()}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", help="a git revision to time beside this checkout")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--only", default="ab,instructions,bisect")
    args = parser.parse_args()
    chosen = [x.strip() for x in args.only.split(",") if x.strip()]
    with (
        tempfile.TemporaryDirectory(prefix="attnbench-ab-costs-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        work = Path(tmp)
        commits = layer_repository(work / "layers", step=20, slower_by=1.3)
        good, bad = commits[0], commits[-1]
        trees = {"this checkout": ROOT}
        if args.against:
            trees[args.against] = stack.enter_context(worktree(args.against))
        commands = {
            "ab": ["ab", "--layers", "conv", *SMALL, "--time-budget", "0.05", "--quiet"],
            "instructions": [
                "ab",
                "--layers",
                "conv,rnn",
                *SMALL,
                "--metric",
                "instructions",
                "--quiet",
            ],
            "bisect": [
                "bisect",
                good,
                bad,
                "--layers",
                "timed.py:make",
                *SMALL,
                "--time-budget",
                "0.1",
                "--repo",
                str(work / "layers"),
            ],
        }
        print(f"{'command':<14}" + "".join(f"{name:>18}" for name in trees) + "   (seconds)")
        for name in chosen:
            took: dict[str, list[float]] = {tree: [] for tree in trees}
            for i in range(args.repeat):
                for label, tree in trees.items():  # taking turns
                    out = ["--out", str(work / f"{name}-{len(took[label])}-{i}-{id(tree)}")]
                    extra = out if name != "bisect" else []
                    took[label].append(timed([*commands[name], *extra], tree, work))
            print(f"{name:<14}" + "".join(f"{statistics.median(v):>18.1f}" for v in took.values()))


if __name__ == "__main__":
    main()
