"""The plugin check: a layer handed over from outside must map (batch, n, d) to (batch, n, d)
in the input's dtype. It runs once on a tiny input before anything is measured, so a layer that
would fail every case is refused in one line instead of filling results.csv with failures."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from attnbench.errors import AttnbenchError, first_line
from attnbench.layers.entry import LayerEntry
from attnbench.layers.registry import build_layer

BATCH = 2  # not 1: a layer that drops or mixes the batch dimension must show it


def output_problem(out: object, shape: tuple[int, ...], dtype: torch.dtype) -> str | None:
    """What is wrong with ``out`` as the output for an input of ``shape`` and ``dtype``."""
    if not isinstance(out, torch.Tensor):
        return f"to a {type(out).__name__}, not a tensor"
    if tuple(out.shape) != shape:
        return f"to {tuple(out.shape)}"
    if out.dtype != dtype:
        return f"to a tensor of {out.dtype} (the input is {dtype})"
    return None


def check_output(
    entry: LayerEntry, d: int, lengths: Sequence[int], options: Mapping[str, int]
) -> None:
    """Refuse a plugin that does not build, or does not map (batch, n, d) to (batch, n, d) in
    the input's dtype, before anything is measured.

    ``lengths`` are tried in order, cheapest first, ending with a length the grid asks for: a
    layer that accepts only some lengths (a multiple of its block) is refused only when it
    fails at a length it will be measured at.
    """
    dtype = torch.float32  # the sweep's, whatever torch's default dtype is
    failures: list[str] = []
    for n in dict.fromkeys(lengths):  # in order, once each
        shape = (BATCH, n, d)
        try:
            layer = build_layer(entry.name, d, **options, n=n)
        except AttnbenchError:
            raise
        except Exception as exc:  # the factory's own failure, not the call's
            failures.append(
                f"layer {entry.name}: building it for a {shape} input failed: {first_line(exc)}"
            )
            continue
        try:
            with torch.no_grad():
                out = layer(torch.randn(*shape, dtype=dtype))
        except AttnbenchError:
            raise
        except Exception as exc:
            failures.append(
                f"layer {entry.name}: calling it on a {shape} input failed: {first_line(exc)}"
            )
            continue
        problem = output_problem(out, shape, dtype)
        if problem is not None:
            raise AttnbenchError(
                f"layer {entry.name} maps a {shape} input {problem}; a layer must map "
                "(batch, n, d) to (batch, n, d) in the input's dtype"
            )
        if not bool(torch.isfinite(out).all()):  # its times would be raced as a layer's
            raise AttnbenchError(
                f"layer {entry.name} maps a {shape} input of finite values to NaN or inf "
                f"({int((~torch.isfinite(out)).sum())} of {out.numel()} values)"
            )
        return
    raise AttnbenchError(failures[-1] if failures else "no length to check the layer at")
