"""A throwaway repository whose layer gets slower at one commit, for bisect's test and
``benchmarks/ab_costs.py``: 32 commits of ``timed.py`` (``timed.py:make``), each call sleeping
2 ms, ``slower_by`` times longer from commit ``step`` on."""

from __future__ import annotations

import subprocess
from pathlib import Path

LAYER = """
import time
from torch import nn

PAUSE = {pause}  # seconds a call sleeps: a floor no busy neighbour can lower
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
PAUSE_S = 2e-3
COMMITS = 32


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=True)  # fmt: skip
    return done.stdout.strip()


def layer_repository(root: Path, step: int = 20, slower_by: float = 1.5) -> list[str]:
    """The repository made at ``root``: its commits, oldest first (the one at ``step``'s
    subject ends in ": slower")."""
    root.mkdir()
    git(root, "init", "-q")
    git(root, "config", "user.email", "t@example.org")
    git(root, "config", "user.name", "t")
    commits = []
    for i in range(COMMITS):
        pause = PAUSE_S * (slower_by if i >= step else 1.0)
        (root / "timed.py").write_text(LAYER.format(pause=pause, version=i))
        git(root, "add", "timed.py")
        git(root, "commit", "-q", "-m", f"commit {i}" + (": slower" if i == step else ""))
        commits.append(git(root, "rev-parse", "HEAD"))
    return commits
