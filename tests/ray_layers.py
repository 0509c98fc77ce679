"""Layers that kill the process they run in, registered in Ray's workers by a setup hook.

``doomed`` dies in every call; ``killed-once`` writes its pid to ``$ATTNBENCH_TEST_DIR/pid``
in the first call anywhere and waits there to be killed from outside (the test does it);
every later call, in any process, is an ordinary cheap layer.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from attnbench.layers import registry


class Doomed(torch.nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.d = d

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, n, d) -> never returns
        os._exit(9)


class KilledOnce(torch.nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.d = d

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, n, d) -> (B, n, d)
        marker = Path(os.environ["ATTNBENCH_TEST_DIR"]) / "pid"
        try:
            with open(marker, "x") as fh:  # only the first call anywhere creates it
                fh.write(str(os.getpid()))
        except FileExistsError:
            return x * 2
        time.sleep(120)  # killed long before this ends
        return x * 2


TEST_LAYERS = {"doomed": Doomed, "killed-once": KilledOnce}


def register() -> None:
    """Add the test layers to this process's registries (a Ray worker setup hook).

    Reached through the modules: Ray ships this function by value, and a registry named as a
    global here would travel as a copy."""
    for name, module in TEST_LAYERS.items():
        registry.register(module, name, source=registry.LayerSource("python", f"tests:{name}"))
