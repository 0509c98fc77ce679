"""How one application of a layer carries a dependency from one position to another, as its
traced sequential steps show: the route a path length is counted along (``structure``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Route:
    """How one application of a layer carries a dependency from x_j to y_i, as its traced
    sequential steps show at three probe lengths:

    - ``recurrence``: the steps grow by ``per_step`` per position (RNN, GRU, LSTM, ssm): the
      route takes one state update per position it crosses, |i - j| + 1;
    - ``scan``: the steps grow by ``per_step`` per doubling of n (a parallel scan, a stack of
      log depth): every route passes all the levels, (steps - offset) / per_step of them;
    - ``direct``: the steps do not grow with n (attention, causal or not; conv): one
      application connects what its pattern connects, in one step.
    """

    kind: str
    per_step: int = 0
    offset: int = 0

    @property
    def dtype(self) -> torch.dtype:
        """What its Jacobian is read in: a recurrence or scan multiplies a derivative per
        position, which float32 can round to zero over a long route; a direct route does not."""
        return torch.float32 if self.kind == "direct" else torch.float64

    def levels(self, steps: int) -> int | None:
        """A scan's levels at a length whose traced steps are ``steps`` (None off its law)."""
        levels, rest = divmod(steps - self.offset, self.per_step)
        return levels if rest == 0 and levels >= 0 else None
