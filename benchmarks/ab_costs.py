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
SMALL = ["--n", "16", "--d", "8", "--device", "cpu"]
LAYER = """
import time
from torch import nn

PAUSE = {pause}  # seconds a call sleeps
VERSION = {version}


class Timed(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.proj = nn.Linear(d, d)

    def forward(self, x):  # (B, n, d)
        time.sleep(PAUSE)
        return self.proj(x)


def make(d):
    return Timed(d)
"""


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=True)  # fmt: skip
    return done.stdout.strip()


def layer_repository(root: Path) -> tuple[str, str]:
    """32 commits, the layer 30% slower from index 20 on: the first and the last commit."""
    root.mkdir()
    git(root, "init", "-q")
    git(root, "config", "user.email", "bench@example.org")
    git(root, "config", "user.name", "bench")
    for i in range(32):
        (root / "timed.py").write_text(LAYER.format(pause=2.6e-3 if i >= 20 else 2e-3, version=i))
        git(root, "add", "timed.py")
        git(root, "commit", "-q", "-m", f"commit {i}")
    return git(root, "rev-list", "--max-parents=0", "HEAD"), git(root, "rev-parse", "HEAD")


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
        good, bad = layer_repository(work / "layers")
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
