"""A decode case's own checks: the step computes the causal layer, and its state's size.

Correct before fast: the tokens decoded one by one must equal the causal layer's parallel
output on the same tokens, or a step that computes something else would read as fast.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from attnbench.devices import relative_difference, tolerance, within_tolerance
from attnbench.layers.decoding import causal_output, decode_all, decoder, state_bytes
from attnbench.measure.record import CaseResult
from attnbench.measure.step import Step
from attnbench.schema import Status
from attnbench.spec import Case

# Tokens decoded one by one against the parallel output: a prefix, whatever the context, so
# the check costs little at any n.
PREFIX = 64
# Up to this many tokens (the n before and the stepped one) the timed step's own output is
# also checked against the parallel output at its position: a parallel call above it costs
# an attention's n x n scores.
WHOLE = 1024


def decode_check(case: Case, step: Step) -> float:
    """The largest relative difference between the decoded tokens and the causal layer's
    parallel output: on the first ``PREFIX`` tokens, and for the step the case times where
    the context is at most ``WHOLE``."""
    found = decoder(step.layer)
    if found is None:  # make_step refuses such a layer first
        raise TypeError(f"{case.layer} has no decode step")
    x = step.x  # (B, n + 1, d)
    tokens = min(case.tokens, PREFIX)
    with torch.no_grad():
        stepped = decode_all(found, x[:, :tokens])  # (B, m, d)
        worst = relative_difference(stepped, causal_output(step.layer, x[:, :tokens]))
        if case.tokens <= WHOLE:
            parallel = causal_output(step.layer, x)  # (B, n + 1, d)
            worst = max(worst, relative_difference(step(), parallel[:, case.n]))
    return worst


def drift(step: Step) -> float:
    """How far the step's output now (after its timed calls) is from its output before any:
    0 for a step that leaves the state it reads as it was, as every timed call must see the
    same context."""
    if step.first is None:
        return 0.0
    with torch.no_grad():
        return relative_difference(step(), step.first)


def held_bytes(step: Step) -> int | None:
    """The bytes the step's state holds (None outside decode mode)."""
    return None if step.state is None else state_bytes(step.state)


@dataclass(frozen=True)
class Decoded:
    """A decode case's own measurements: its state's bytes and the step's check."""

    state_bytes: int | None
    check: float
    drift: float = 0.0  # the step's output after its timed calls against before them


def judged(result: CaseResult, decoded: Decoded | None = None) -> CaseResult:
    """A decode case whose step does not compute the causal layer is failed, its
    measurements kept: a step that computes something else must not pass as fast."""
    # The same step twice rounds the same way: its drift is held to the dtype's own tolerance;
    # its tokens against the parallel layer, which cuDNN may run through TF32, to the device's.
    allowed = tolerance(result.case.dtype, result.case.device)
    if decoded is not None and decoded.drift > tolerance(result.case.dtype):
        return replace(
            result,
            status=Status.FAILED,
            error=f"its step at context {result.case.n} answered {decoded.drift:.2g} apart "
            "(relative) after its timed calls: it changes the state it reads, so they did not "
            "all see context n (write only its own slot in place, or return new tensors)",
        )
    if within_tolerance(result.decode_check, result.case.dtype, result.case.device) is not False:
        return result
    return replace(
        result,
        status=Status.FAILED,
        error=f"its decoded tokens differ from the causal layer's parallel output by "
        f"{result.decode_check:.2g} (relative; {result.case.dtype} allows "
        f"{allowed:g})",
    )


__all__ = [
    "PREFIX",
    "WHOLE",
    "Decoded",
    "decode_check",
    "drift",
    "held_bytes",
    "judged",
]
