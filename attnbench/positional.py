"""Sinusoidal positional encoding, as in the chapter (Vaswani et al. 2017).

p[i, 2j] = sin(i / 10000^(2j/d)),  p[i, 2j+1] = cos(i / 10000^(2j/d)).
Works for odd d (the last column is a sine) and any n (no max_len: the table grows on demand).
"""

from __future__ import annotations

import torch
from torch import nn


def frequencies(d: int, *, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """omega_j = 1 / 10000^(2j/d) for j = 0 .. ceil(d/2)-1; shape (ceil(d/2),)."""
    two_j = torch.arange(0, d, 2, dtype=dtype)
    return torch.pow(10000.0, -two_j / d)


def sinusoidal_table(
    n: int, d: int, *, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """The (n, d) matrix P.  Computed in float64, then cast, so large positions stay accurate."""
    pos = torch.arange(n, dtype=torch.float64).unsqueeze(1)  # (n, 1)
    angles = pos * frequencies(d).unsqueeze(0)  # (n, ceil(d/2))
    table = torch.empty(n, d, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angles)  # (n, ceil(d/2))
    table[:, 1::2] = torch.cos(angles[:, : d // 2])  # (n, floor(d/2))
    return table.to(device=device, dtype=dtype)


def shift_rotation(delta: float, d: int) -> torch.Tensor:
    """The 2x2 matrices that map (p[i,2j], p[i,2j+1]) to (p[i+delta,2j], p[i+delta,2j+1]).

    Shape (d // 2, 2, 2); they do not depend on i, which is the relative-position property.
    """
    w = frequencies(d)[: d // 2] * delta  # (d//2,)
    c, s = torch.cos(w), torch.sin(w)
    return torch.stack([torch.stack([c, s], -1), torch.stack([-s, c], -1)], -2)  # (d//2, 2, 2)


class SinusoidalPositionalEncoding(nn.Module):
    """Adds P to a (batch, n, d) input.

    P is a registered (non-persistent) buffer, so it follows ``.to(device, dtype)``; it is
    rebuilt, on the same device and dtype, whenever a longer sequence arrives.
    """

    P: torch.Tensor  # (n, d), a buffer

    def __init__(self, d: int, initial_len: int = 0) -> None:
        super().__init__()
        self.d = d
        self.register_buffer("P", sinusoidal_table(initial_len, d), persistent=False)

    def extend(self, n: int) -> None:
        """Make the table cover positions 0 .. n-1 (rebuilt longer on its device and dtype;
        each row is computed on its own, so a longer table has the same first rows)."""
        if n > self.P.shape[0]:
            self.P = sinusoidal_table(n, self.d, dtype=self.P.dtype, device=self.P.device)

    def row(self, position: int) -> torch.Tensor:
        """p[position], shape (d,): what ``forward`` adds to the token at that position (a
        decode step adds it to one token)."""
        self.extend(position + 1)
        return self.P[position]  # (d,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, n, d)
        n = x.shape[1]
        self.extend(n)
        return x + self.P[:n]  # (B, n, d)


def relative_shift_error(
    n: int, d: int, deltas: range | None = None, *, dtype: torch.dtype = torch.float64
) -> float:
    """Largest |R(δ) p[i] - p[i+δ]| over positions i < n, column pairs j and offsets δ.

    The chapter's relative-position property says it is zero: the 2x2 rotation of each pair
    depends on δ only. Measured on this package's own table, in ``dtype`` (offsets 1..n by
    default), so a wrong frequency or a swapped sine shows up as an error of order one.
    """
    deltas = deltas if deltas is not None else range(1, n + 1)
    half = d // 2
    table = sinusoidal_table(n + max(deltas) + 1, d, dtype=dtype)  # (n + δmax + 1, d)
    pairs = table[:n, : 2 * half].reshape(n, half, 2)  # (n, d//2, 2)
    worst = 0.0
    for delta in deltas:
        rot = shift_rotation(delta, d).to(dtype)  # (d//2, 2, 2)
        shifted = torch.einsum("jab,ijb->ija", rot, pairs)  # (n, d//2, 2)
        target = table[delta : n + delta, : 2 * half].reshape(n, half, 2)  # (n, d//2, 2)
        worst = max(worst, (shifted - target).abs().max().item())
    return worst


def binary_digits(n: int, bits: int) -> torch.Tensor:
    """Bits of 0..n-1, lowest first: shape (n, bits). The chapter's analogy for the columns."""
    i = torch.arange(n).unsqueeze(1)  # (n, 1)
    return ((i >> torch.arange(bits)) & 1).to(torch.float32)  # (n, bits)
