"""Exact counts of a long recurrent case from traces at short lengths, by a law proven there.

Tracing a recurrent layer costs 1-3 ms per position (every step is its own handful of
dispatched ops), so a full trace of an rnn at n = 8192 takes longer than timing it many times.
Its counts (FLOPs, elementwise work, bytes, sequential steps) are polynomials of low degree in
n, so they are traced at four short lengths (``PROBES``; once per layer, d and options, kept
in the count cache for every longer case: ``measure.case.probe_counts``), the polynomial
through the first
three (degree 2 at most, exact rational arithmetic) must reproduce the fourth exactly, and only
then is it evaluated at the case's n. A count with no such law, a layer that refuses a probe
length, or ops the FLOP counter did not account for: the case is traced in full instead.

On the CPU the memory pass (peak bytes, the timed path's ops) costs about as much per op under
the profiler, so where the call runs no fused kernel it is taken at the same probes and
extended the same way; a fused kernel (oneDNN's lstm) is one op, profiled at n. CUDA reads its
allocator's statistics, cheap at any n.

Extended figures are never silent: their ``*_method`` columns (``peak_bytes_method`` too) read
``extended: ...`` with the law and the lengths, and ``counts_source`` is ``extended``.
``--full-trace`` (the environment's ``ATTNBENCH_FULL_TRACE=1``, which reaches worker processes)
traces and profiles every case in full.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TypeVar

from attnbench.layers.registry import entry
from attnbench.measure.counts.countcache import Counts, Profile
from attnbench.measure.counts.laws import fit_law
from attnbench.measure.counts.ops import RECURRENT_OPS
from attnbench.measure.counts.traffic import format_kernels, parse_kernels
from attnbench.measure.memory import is_out_of_memory
from attnbench.provenance import Provenance, Source
from attnbench.spec import Case

EXTENDED = (
    Source.EXTENDED.value
)  # counts_source of counts extended in this run, and their methods' word
PROBES = (8, 16, 32, 64)  # traced lengths: the law through the first three, proven on the last
EXTEND_ABOVE_STEPS = 256  # extend a plugin's case only where the probes' law gives more steps
# The counts a law carries from the probes to n (uncounted_ops must be empty; path length
# has its own probes in measure.counts.structure).
NUMBERS = ("flops", "seq_steps", "elementwise", "bytes", "product_bytes")
METHODS = {
    "seq_steps": "seq_steps_method",
    "elementwise": "elementwise_method",
    "bytes": "bytes_method",
}


def applies(case: Case, full: bool = False) -> bool:
    """Whether the case's counts are extended from the probes rather than traced at its n: it
    is longer than the probes, its layer's theory says its sequential steps grow with n (more
    than n = ``PROBES[-1]`` of them: a recurrence, not a log-depth scan or one attention step),
    and no full trace was asked for (``full``). A layer without a theory is ``probed``
    instead."""
    if not _long(case, full, vouched=True):
        return False
    theory = entry(case.layer).theory
    return theory is not None and theory.sequential_law(case.sizes()) > PROBES[-1]


def probed(case: Case, full: bool = False) -> bool:
    """Whether a long case of a layer without a theory (a plugin) asks the probes: extended
    only if they show more than ``EXTEND_ABOVE_STEPS`` steps at n and the law holds at a
    check length of n / 4 too (``extended_counts``); traced in full otherwise."""
    return _long(case, full, vouched=False) and entry(case.layer).theory is None


def is_probe(case: Case, full: bool = False) -> bool:
    """Whether the case is at a probe length of a layer whose longer cases are extended (or
    may be): its own full trace and memory pass are then the probe's, shared through the
    count cache rather than taken twice."""
    if case.n not in PROBES:
        return False
    longer = dataclasses.replace(case, n=8 * PROBES[-1])
    return applies(longer, full) or probed(longer, full)


def _long(case: Case, full: bool, *, vouched: bool) -> bool:
    """Longer than the probes (a plugin: than four times the longest, so that the law's check
    at n / 4 lies past them), and no full trace asked for. A decode step is traced at any
    context: it is one token's work, not a recurrence over n."""
    if case.mode == "decode":
        return False
    return not full and case.n > (1 if vouched else 4) * PROBES[-1]


def is_extended(counts: Counts) -> bool:
    """Whether the counts were extended from the probes (cached so, or traced so now)."""
    return any(Provenance.parse(getattr(counts, column)).extended for column in METHODS.values())


def extend(found: Mapping[int, Counts], n: int) -> Counts | None:
    """The counts at ``n`` from the counts traced at the probe lengths, or None where one count
    has no law (the caller then traces the case in full)."""
    lengths = sorted(found)
    first = found[lengths[0]]
    if any(c.uncounted_ops for c in found.values()):
        return None  # work the FLOP counter did not see has no law to trust
    degrees: set[int] = set()
    laws = _carry(found, NUMBERS, n, degrees)
    if laws is None:
        return None
    kernels = _extend_kernels({m: found[m].kernels for m in lengths}, n, degrees)
    if kernels is None:
        return None
    how = describe(degrees, lengths)
    methods = {
        column: how if laws[name] is not None else getattr(first, column)
        for name, column in METHODS.items()
    }
    return dataclasses.replace(first, **laws, **methods, kernels=kernels)  # type: ignore[arg-type]  # the laws and methods are the fields named


def describe(degrees: set[int], lengths: list[int]) -> str:
    """The *_method text of extended figures: the law's shape and the lengths that prove it."""
    shape = {0: "constant", 1: "linear", 2: "quadratic"}[max(degrees, default=0)]
    return f"{EXTENDED}: {shape} in n through n={','.join(map(str, lengths))}"


def extend_profile(found: Mapping[int, Profile], n: int) -> Profile | None:
    """The memory pass at ``n`` from the passes at the probe lengths: peak bytes and the timed
    path's ops each by its law; None without a law, or where a fused kernel or a convolution
    ran."""
    lengths = sorted(found)
    # torch's recurrent op whose steps the dispatcher sees (rnn_tanh, gru) follows the law
    if any(p.fused - RECURRENT_OPS or p.backends for p in found.values()):
        # A fused kernel's scratch memory follows its own rules (oneDNN's lstm at d = 64: a law
        # proven at n = 8..64 misses n = 1024 by 60 kB); it is one op, cheap to profile at n.
        # A convolution's implementation is chosen by its size: the probes' is not n's.
        return None
    degrees: set[int] = set()
    values = _carry(found, ("peak_bytes", "ops"), n, degrees)
    if values is None:
        return None
    recurrent = found[lengths[0]].fused  # only RECURRENT_OPS get here: the same at every n
    return Profile(values["peak_bytes"], values["ops"], recurrent, describe(degrees, lengths))


def _carry(
    found: Mapping[int, Counts] | Mapping[int, Profile],
    names: tuple[str, ...],
    n: int,
    degrees: set[int],
) -> dict[str, int | None] | None:
    """Each named figure at ``n`` by its law through the probes; None where one has no law.
    A figure missing at a probe (a count that failed, a device without statistics) stays
    missing at n, with the probe's reason."""
    carried: dict[str, int | None] = {}
    for name in names:
        points = {m: getattr(found[m], name) for m in sorted(found)}
        if any(v is None for v in points.values()):
            carried[name] = None
            continue
        value = _extended(points, n, degrees)
        if value is None:
            return None
        carried[name] = value
    return carried


def _extended(values: Mapping[int, int], n: int, degrees: set[int]) -> int | None:
    law = fit_law(values)
    if law is None:
        return None
    value = law(n)
    if value.denominator != 1 or value < 0:
        return None
    degrees.add(law.degree)
    return int(value)


def _extend_kernels(texts: Mapping[int, str], n: int, degrees: set[int]) -> str | None:
    """Each kind of product's FLOPs and bytes, extended like the other counts."""
    parsed = {m: parse_kernels(text) for m, text in texts.items()}
    kinds = {tuple(sorted(p)) for p in parsed.values()}
    if len(kinds) != 1:
        return None  # a kind of product that appears only at some lengths has no law
    result: dict[str, tuple[int, int]] = {}
    for kind in next(iter(kinds)):
        pair = []
        for index in (0, 1):
            value = _extended({m: int(p[kind][index]) for m, p in parsed.items()}, n, degrees)
            if value is None:
                return None
            pair.append(value)
        result[kind] = (pair[0], pair[1])
    return format_kernels(result)


def extended_counts(
    case: Case, trace: Callable[[Case], Counts], *, check: bool = False
) -> Counts | None:
    """The case's counts extended from ``trace`` at the probe lengths, or None when the layer
    refuses a probe or a count has no law there (trace it in full then).

    With ``check`` (a layer no theory vouches for) the probes must show more than
    ``EXTEND_ABOVE_STEPS`` steps at n, else a full trace is cheap, and the law must also
    give exactly what ``trace`` counts at ``check_length(n)``: a law that holds at short
    lengths only (steps that stop growing past a chunk) is caught there, at a quarter of
    the full trace's cost."""
    found = _at_probes(case, trace)
    if found is None:
        return None
    counts = extend(found, case.n)
    if counts is None or not check:
        return counts
    if counts.seq_steps is None or counts.seq_steps <= EXTEND_ABOVE_STEPS:
        return None
    m = check_length(case.n)
    predicted = extend(found, m)
    try:
        traced = trace(dataclasses.replace(case, n=m))
    except Exception as exc:  # the layer refuses the check length: measure the case at n
        if is_out_of_memory(exc):
            raise
        return None
    if predicted is None or any(
        getattr(predicted, name) != getattr(traced, name) for name in (*NUMBERS, "kernels")
    ):
        return None
    checked = {
        column: f"{value}, checked at n={m}" if Provenance.parse(value).extended else value
        for column in METHODS.values()
        if (value := getattr(counts, column)) is not None
    }
    return dataclasses.replace(counts, **checked)  # type: ignore[arg-type]  # the checked methods are the fields named


def check_length(n: int) -> int:
    """Where a plugin's law is checked: n / 4 (at least past the probes)."""
    return max(n // 4, 2 * PROBES[-1])


def extended_profile(case: Case, profile: Callable[[Case], Profile]) -> Profile | None:
    """The case's memory pass extended from ``profile`` at the probe lengths (the profiler
    costs about as much per op as tracing), or None where it has no law (profile at n). A
    compiled case has none: its memory is the compiled call's, and a fused kernel that the
    eager probes would name (oneDNN's lstm) is not seen through the compiled call, so a law
    at the probes read its peak 0.9-2.6% low at n = 128..4096 (profile it at n)."""
    if case.compiled:
        return None
    found = _at_probes(case, profile)
    return None if found is None else extend_profile(found, case.n)


T = TypeVar("T")


def _at_probes(case: Case, take: Callable[[Case], T]) -> dict[int, T] | None:
    found: dict[int, T] = {}
    for m in PROBES:
        try:
            found[m] = take(dataclasses.replace(case, n=m))
        except Exception as exc:  # the layer refuses this length: measure the case at n
            if is_out_of_memory(exc):
                raise
            return None
    return found
