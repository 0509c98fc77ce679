"""References written outside the package, for tests that must not check the package against
itself: the chapter's own positional encoding, as its PyTorch code has it (d2l's
``PositionalEncoding``, dropout left out: it is the identity in eval mode)."""

from __future__ import annotations

import torch


def chapter_encoding(n: int, d: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The chapter's P for n positions of even width d: (n, d)."""
    P = torch.zeros((1, n, d), dtype=dtype)  # (1, n, d)
    X = torch.arange(n, dtype=dtype).reshape(-1, 1) / torch.pow(
        10000, torch.arange(0, d, 2, dtype=dtype) / d
    )  # (n, d/2)
    P[:, :, 0::2] = torch.sin(X)
    P[:, :, 1::2] = torch.cos(X)
    return P[0]
