"""Layers that kill the process they run in, or wait for the test to kill or freeze their node,
registered in Ray's workers by a setup hook.

``doomed`` dies in every call; ``killed-once`` writes its pid to ``$ATTNBENCH_TEST_DIR/pid``
in the first call anywhere and waits there to be killed from outside (the test does it);
every later call, in any process, is an ordinary cheap layer. ``lost-once`` and ``lost-twice``
do the same in their first one or two calls anywhere, writing "<pid> <Ray node id>" to
``<name>-1`` (and ``-2``), so that the test can end the whole node; they return once
``release`` exists. ``held`` waits while ``hold`` exists.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

from attnbench.layers import registry


class _TestLayer(torch.nn.Module):
    """A layer without weights: what matters is where and when it is called."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.d = d


class Doomed(_TestLayer):
    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, n, d) -> never returns
        os._exit(9)


class KilledOnce(_TestLayer):
    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, n, d) -> (B, n, d)
        marker = Path(os.environ["ATTNBENCH_TEST_DIR"]) / "pid"
        try:
            with open(marker, "x") as fh:  # only the first call anywhere creates it
                fh.write(str(os.getpid()))
        except FileExistsError:
            return x * 2
        time.sleep(120)  # killed long before this ends
        return x * 2


def _wait_for(done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 300  # the test ends the wait long before
    while not done() and time.monotonic() < deadline:
        time.sleep(0.05)


class Lost(_TestLayer):
    """Waits, in its first ``times`` calls anywhere, for its node to be ended."""

    name = "lost-once"
    times = 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, n, d) -> (B, n, d)
        folder = Path(os.environ["ATTNBENCH_TEST_DIR"])
        for k in range(1, self.times + 1):
            try:
                with open(folder / f"{self.name}-{k}", "x") as fh:
                    import ray  # only in a Ray worker

                    fh.write(f"{os.getpid()} {ray.get_runtime_context().get_node_id()}")
                break
            except FileExistsError:
                continue
        else:
            return x * 2
        _wait_for((folder / "release").exists)
        return x * 2


class LostTwice(Lost):
    name = "lost-twice"
    times = 2


class Held(_TestLayer):
    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, n, d) -> (B, n, d)
        hold = Path(os.environ["ATTNBENCH_TEST_DIR"]) / "hold"
        _wait_for(lambda: not hold.exists())
        return x * 2


TEST_LAYERS = {
    "doomed": Doomed,
    "killed-once": KilledOnce,
    "lost-once": Lost,
    "lost-twice": LostTwice,
    "held": Held,
}


def register() -> None:
    """Add the test layers to this process's registries (a Ray worker setup hook).

    Reached through the modules: Ray ships this function by value, and a registry named as a
    global here would travel as a copy."""
    for name, module in TEST_LAYERS.items():
        registry.register(module, name, source=registry.LayerSource("python", f"tests:{name}"))
