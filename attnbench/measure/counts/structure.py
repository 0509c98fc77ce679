"""Sequential steps and maximum path length, measured from what the layer really computes.

``seq_steps``: the longest chain of dependent aten ops in one forward call, traced at the
dispatcher.  View and metadata ops (``transpose``, ``view``, ``detach``...) do not count, nor do
ops that read no tensor (creating constants).  Fused recurrent kernels (oneDNN LSTM on CPU, cuDNN
RNNs on CUDA) would hide the recurrence in one op, so the trace runs with those backends
disabled: the same layer then runs its loop step by step, and the count describes the algorithm,
not the kernel.

``path_len``: the largest, over input position j and output position i with y_i depending on
x_j, of the fewest position-mixing steps on a route from x_j to y_i.  It is computed from the
layer's **dependency pattern** D (D[i, j]: y_i depends on x_j), read from the non-zeros of the
real layer's Jacobian (one batched backward pass per length; float64 along a recurrence or
scan, float32 for a direct route, ``Route.dtype``):
- inside one application, the route follows the layer's own sequential structure, read from its
  traced steps at three probe lengths (``Route``): a recurrence (steps growing per position:
  RNNs, ssm) passes the dependency through one state update per position, i - j + 1 steps; a
  parallel scan (steps growing per doubling: ssm-scan) through all its ⌈log₂ n⌉ levels;
- any other layer is applied again (stacked) until y_i depends on x_j: the route takes that many
  applications times the layer's position-mixing stages (1, or the depth of a dilated stack, each
  stage counted only if its own pattern mixes positions).
Above ``PATH_MEASURE_MAX`` the pattern is measured at the probe lengths only; where it has the same
band or block-band shape at every probe (``patterns``), the value is extended by that shape and
marked ``extended``; where it has none, the value is empty and ``none: <why>`` says so.
"""

from __future__ import annotations

import copy
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import numpy as np
import torch
from torch import nn

from attnbench.devices import available_bytes
from attnbench.measure.counts.chains import sequential_steps
from attnbench.measure.counts.ops import unfused
from attnbench.measure.counts.patterns import BlockBand, shape_of
from attnbench.measure.counts.probecache import on_disk
from attnbench.measure.counts.routes import Route
from attnbench.measure.memory import peak_bytes
from attnbench.provenance import Source

PATH_MEASURE_MAX = 64  # measure the dependency pattern directly up to this length
PATH_FALLBACK_MAX = 256  # ... and up to this one where no law from the probes holds
# What one dependency pattern may take: its cotangents, gradients and the backward passes'
# intermediates, batched over output positions, grow as n^2 d and more (a windowed plugin's at
# n = 1024 grew past 17 GB at once). Output positions are taken in chunks that fit the smaller
# of these bytes and a share of the memory available, and a pattern predicted to take longer
# than this many seconds is not measured (its path is stated as not measured, and why).
PATTERN_BYTES = 512 * 2**20
PATTERN_MEMORY_SHARE = 0.25
PATTERN_SECONDS = 60.0
# Output positions of a pattern taken first, alone: what they cost (the process's growth, their
# seconds) sizes the chunks after them, and stops a pattern that would not fit.
FIRST_CHUNK = 8


def probe_lengths(scale: int = 0) -> tuple[int, ...]:
    """Three lengths, doubling, at which a band shape is checked before it is extended.

    They start at 16, or at the first power of two above the layer's own reach (``scale``:
    kernel or window), so a band narrower than the sequence shows as such at every probe.
    """
    start = 16
    while start <= scale + 1:
        start *= 2
    return (start, 2 * start, 4 * start)


# How each value was obtained, as the results' *_method columns say it.
SEQ_METHOD = Source.TRACED.value  # longest chain of dependent aten ops, fused RNN kernels disabled
PATH_MEASURED = "measured"  # Jacobian pattern at this n
PATH_EXTENDED = Source.EXTENDED.value  # band shape proven at the probe lengths, extended to this n
PATH_NONE = "none"  # above PATH_MEASURE_MAX with no law proven: no value
# A layer whose outputs each depend on their own position's input alone (a pointwise layer, a
# conv of kernel 1) has no path between two positions: no value, rather than the 1 that its
# self-dependencies would give, which would read as attention's.
NO_MIXING = f"{PATH_NONE}: no output depends on another position's input (it mixes no positions)"


# ----------------------------------------------------------------------------- sequential steps


# ----------------------------------------------------------------------------- path length


def dependency_pattern(
    module: nn.Module, n: int, d: int, *, seed: int = 0, dtype: torch.dtype = torch.float64
) -> np.ndarray:
    """(n, n) bool: ``D[i, j]`` is True when output position i depends on input position j.

    Read from the Jacobian of a copy of ``module`` in ``dtype``: one backward pass per output
    position, batched, each with a random cotangent on that position only.  float64 keeps the
    influence of early tokens on late ones representable in long recurrences; a layer whose
    route is direct (``Route``) multiplies few derivatives along it, and float32 (half the
    time) gives the same pattern.
    """
    gen = torch.Generator().manual_seed(seed)
    module = copy.deepcopy(module).to(device="cpu", dtype=dtype)
    x = torch.randn(1, n, d, generator=gen, dtype=torch.float64)  # (1, n, d)
    x = x.to(dtype).requires_grad_(True)
    budget = pattern_budget()
    cotangents = torch.randn(n, d, generator=gen, dtype=torch.float64).to(dtype)  # (n, d)

    def rows_of(first: int, count: int) -> np.ndarray:
        at = torch.arange(first, min(n, first + count))
        # Cotangent of output i on position i only: c x d random values, not n x n x d drawn
        # and masked (a fifth of a probe's time at n = 128).
        probe = torch.zeros(len(at), 1, n, d, dtype=dtype)  # (c, 1, n, d)
        probe[torch.arange(len(at)), 0, at] = cotangents[at]
        grad = batched_vjp(y, x, probe)  # (c, 1, n_in, d)
        if not bool(torch.isfinite(grad).all()):
            raise NonFinite("its gradients hold NaN or inf: no dependency to read from them")
        return (grad[:, 0].abs().amax(dim=-1) > 0).numpy()

    with unfused():
        y = module(x)  # (1, n, d)
        if not bool(torch.isfinite(y).all()):  # NaN compares as no dependence: "mixes none"
            raise NonFinite("its output holds NaN or inf: no dependency to read from it")
        # A few positions first, under the allocator's watch: what one costs sizes the chunks
        # after them, and stops a pattern that would not fit.
        done = min(n, FIRST_CHUNK)
        start = time.perf_counter()
        found: list[np.ndarray] = []
        cost = peak_bytes(lambda: found.append(rows_of(0, done)), "cpu") or 0
        chunk = _next_chunk(n, done, time.perf_counter() - start, cost, budget)
        for first in range(done, n, chunk):
            found.append(rows_of(first, chunk))
    return np.concatenate(found)


class NonFinite(ArithmeticError):
    """A layer whose output or gradients hold NaN or inf: a NaN Jacobian read as no dependence
    at all, and a layer that mixes every position was said to mix none."""


class PatternTooCostly(RuntimeError):
    """A dependency pattern that would not fit its memory or its time (the path is then stated
    as not measured, with this message)."""


def pattern_budget() -> int:
    """Bytes one dependency pattern may take: ``PATTERN_BYTES`` or ``PATTERN_MEMORY_SHARE`` of
    the memory available, the smaller."""
    free = available_bytes()
    share = int(PATTERN_MEMORY_SHARE * free) if free is not None else PATTERN_BYTES
    return max(1, min(PATTERN_BYTES, share))


def _next_chunk(n: int, done: int, seconds: float, peak: int, budget: int) -> int:
    """After a pattern's first ``done`` output positions (``peak``: the bytes they took at
    their peak, the allocator's events): how many to take at once from there on, so a chunk
    fits the budget; ``PatternTooCostly`` where even they took more than it, or the positions
    left would take too long (their seconds include the allocator's watch)."""
    if peak > budget:
        raise PatternTooCostly(
            f"the dependency pattern at n={n} took {peak / 2**30:.2g} GiB for {done} of its "
            f"{n} output positions (over {budget / 2**30:.2g} GiB): not measured"
        )
    total = seconds / done * n
    if total > PATTERN_SECONDS:
        raise PatternTooCostly(
            f"the dependency pattern at n={n} would take about {total:.0f} s "
            f"(over {PATTERN_SECONDS:g} s): not measured"
        )
    per_position = max(peak / done, 1.0)
    return max(1, min(n, int(budget / per_position)))


def batched_vjp(y: torch.Tensor, x: torch.Tensor, probe: torch.Tensor) -> torch.Tensor:
    """x's gradient for each row of ``probe`` (a cotangent of y's shape per row), as
    ``torch.autograd.grad(y, x, probe, is_grads_batched=True)`` computes it, by the two calls
    that function makes (vmap over the autograd engine's backward) without the shape check
    before them: for a tensor ``grad_outputs`` it imports sympy, 0.35 s of a cold sweep's first
    path measurement. Where this torch lacks either private function, or its engine refuses
    the call, the public function computes it (the graph is kept for it)."""
    try:
        from torch._vmap_internals import _vmap
        from torch.autograd.graph import _engine_run_backward
    except ImportError:
        _vmap = None  # type: ignore[assignment]  # a torch without them takes the loop below
    if _vmap is not None and tuple(probe.shape[1:]) == tuple(y.shape):

        def vjp(cotangent: torch.Tensor) -> tuple[torch.Tensor, ...]:
            # (outputs, grad_outputs, keep_graph, create_graph, inputs, allow_unreachable)
            return _engine_run_backward((y,), (cotangent,), True, False, (x,), False)

        try:
            (grad,) = _vmap(vjp, 0, 0, allow_none_pass_through=True)(probe)
            return cast("torch.Tensor", grad)
        except TypeError:  # a torch whose private signatures changed
            pass
    (grad,) = torch.autograd.grad(y, x, probe, is_grads_batched=True)
    return grad


DIRECT = Route("direct")  # one application connects what its pattern connects


def traced_steps(module: nn.Module, n: int, d: int) -> int:
    """``sequential_steps`` of one forward call of ``module`` on a (1, n, d) input."""
    x = torch.randn(1, n, d, generator=torch.Generator().manual_seed(0))  # (1, n, d)
    with torch.no_grad():
        module(x)  # lazy set-up (the positional table) stays out of the trace
    return sequential_steps(lambda: module(x))


@dataclass(frozen=True)
class LayerBuilder:
    """Builds a case's layer at any length n (a path's probes need several lengths), and says
    what it builds (``key``: the layer, its options and seed), so the probes' results are
    kept for every case of the same layer."""

    build: Callable[[int], nn.Module]
    key: Hashable

    def __call__(self, n: int) -> nn.Module:
        return self.build(n)


# Probe results of a keyed builder, per kind, d and probe lengths: a sweep asks the same
# question for every n of a layer. The key names the layer's code, so a later sweep in the
# same process reads only what the same code gave; the oldest go past PROBE_CACHE_SIZE.
PROBE_CACHE_SIZE = 256
_PROBE_CACHE: OrderedDict[Any, Any] = OrderedDict()
T = TypeVar("T")


def _cached(
    kind: str,
    build: Callable[[int], nn.Module],
    d: int,
    probes: tuple[Any, ...],
    compute: Callable[[], T],
) -> T:
    if not isinstance(build, LayerBuilder):  # a builder of no name: nothing to share
        return compute()
    tag = build.key
    key = (kind, tag, d, probes)
    if key in _PROBE_CACHE:
        _PROBE_CACHE.move_to_end(key)
    else:
        _PROBE_CACHE[key] = on_disk(kind, build.key, d, probes, compute)
        while len(_PROBE_CACHE) > PROBE_CACHE_SIZE:
            _PROBE_CACHE.popitem(last=False)
    return cast("T", _PROBE_CACHE[key])


def route_of(
    build: Callable[[int], nn.Module],
    d: int,
    probes: tuple[int, ...],
    known: Mapping[int, int] | None = None,
) -> Route:
    """The route law of the layer ``build`` builds, from its traced steps at the probes;
    ``known``: steps a caller traced already at some of them (a case at a probe length), the
    same count a trace here would give, so that probe is not traced again (the steps it took
    are in the key all the same: they were traced on the case's device)."""
    known = known or {}
    given = tuple((p, known[p]) for p in probes if p in known)
    return _cached("route", build, d, (*probes, *given), lambda: _route(build, d, probes, known))


def _route(
    build: Callable[[int], nn.Module], d: int, probes: tuple[int, ...], known: Mapping[int, int]
) -> Route:
    modules = [build(p) for p in probes]
    if any(len(_stages(m)) > 1 for m in modules):
        # A declared stack (a dilated conv) grows stages with n, which a trace could mistake for
        # scan levels: its route is counted stage by stage from its pattern instead.
        return DIRECT
    steps = [
        known[p] if p in known else traced_steps(m, p, d)
        for m, p in zip(modules, probes, strict=True)
    ]
    first, second = steps[1] - steps[0], steps[2] - steps[1]
    if first > 0 and second == 2 * first and first % probes[0] == 0:
        per_step = first // probes[0]
        return Route("recurrence", per_step, steps[0] - per_step * probes[0])
    if first > 0 and first == second:
        return Route("scan", first, steps[0] - first * math.ceil(math.log2(probes[0])))
    return DIRECT


def _pattern_of(
    build: Callable[[int], nn.Module], n: int, d: int, route: Route, module: nn.Module | None = None
) -> np.ndarray:
    """``dependency_pattern`` of ``module`` (``build(n)``, built here when not given) in the
    route's dtype, once per layer, d and n: a case at a probe length and the longer cases
    probing it share one."""
    return _cached(
        "pattern",
        build,
        d,
        (n, route.dtype),
        lambda: dependency_pattern(
            module if module is not None else build(n), n, d, dtype=route.dtype
        ),
    )


def _path_of(build: Callable[[int], nn.Module], n: int, d: int, route: Route) -> int | None:
    """``path_from_pattern`` of ``build(n)``, once per layer, d, n and route: a stack's
    stage-by-stage mixing checks are Jacobians too; None where no output depends on another
    position (``NO_MIXING``; one position alone mixes with none, whatever the layer). The layer
    is built only when computed: a build is a millisecond, and a sweep asks again for every n
    of a layer. Kept in the count cache with the verdict, so a process that reads it takes no
    pattern."""

    def compute() -> int | None:
        module = build(n)
        pattern = _pattern_of(build, n, d, route, module)
        if n > 1 and not _mixes_positions(pattern):
            return None
        return path_from_pattern(module, pattern, d, route)

    return _cached("path", build, d, (n, route), compute)


def _stage_count(build: Callable[[int], nn.Module], n: int, d: int) -> int:
    """How many stages ``build(n)`` stacks (1 for a single application), once per layer and n."""
    return _cached("stages", build, d, (n,), lambda: len(_stages(build(n))))


def _stages(module: nn.Module) -> list[nn.Module]:
    stages = getattr(module, "mixing_stages", None)
    return list(stages()) if callable(stages) else [module]


def _applications(pattern: np.ndarray) -> int:
    """Fewest stacked applications after which each reachable (i, j) is reached, maximised."""
    step = pattern.astype(np.int64)
    reach = pattern.copy()
    dist = np.where(reach, 1, 0)
    apps = 1
    while True:
        grown = (step @ reach.astype(np.int64)) > 0
        new = grown & ~reach
        if not new.any():
            return int(dist.max())
        apps += 1
        dist[new] = apps
        reach = grown


def _mixes(module: nn.Module, n: int, d: int) -> bool:
    """Whether one stage (of a direct route's stack) makes any output depend on another
    position."""
    return _mixes_positions(dependency_pattern(module, n, d, dtype=DIRECT.dtype))


def _mixes_positions(pattern: np.ndarray) -> bool:
    """Whether some output depends on another position's input (D off its diagonal)."""
    return bool(np.count_nonzero(pattern) > np.count_nonzero(np.diagonal(pattern)))


def path_from_pattern(module: nn.Module, pattern: np.ndarray, d: int, route: Route = DIRECT) -> int:
    """Maximum path length of ``module`` given its measured pattern at n = len(pattern), for a
    recurrence or a direct route (a scan's levels come from its trace, ``path_length``)."""
    n = len(pattern)
    if route.kind == "recurrence":
        i, j = np.nonzero(pattern)
        return int((np.abs(i - j) + 1).max())
    stages = _stages(module)
    mixing = stages if len(stages) == 1 else [s for s in stages if _mixes(s, n, d)]
    return _applications(pattern) * max(len(mixing), 1)


@dataclass(frozen=True)
class PathLength:
    value: int | None
    method: str  # "measured", "extended: <law>", or "none: <why>"


def path_length(
    build: Callable[[int], nn.Module], n: int, d: int, *, scale: int = 0, steps: int | None = None
) -> PathLength:
    """Maximum path length of the layer ``build(n)`` (a builder, since depth may depend on n).

    The route inside one application comes from the traced steps at the probe lengths
    (``route_of``); ``scale`` (the layer's kernel or window) only chooses those lengths.
    ``steps``: the layer's sequential steps at n on a batch of one, where the caller traced
    them already (a scan's levels are read from them rather than from a trace of its own, and
    a route probed at n reads them too).
    """
    probes = probe_lengths(scale)
    # Below the probes the route is read at lengths up to n, so a short case never builds a
    # longer layer than its own (one that would not fit is the longer case's to find).
    small = max(1, n // 4)
    known = {} if steps is None else {n: steps}
    route, probes = _accepted_route(
        build, d, probes if n >= probes[-1] else (small, 2 * small, 4 * small), n, known
    )
    if route.kind == "scan":  # every route passes all the levels: counted from the trace at n
        levels = route.levels(steps if steps is not None else traced_steps(build(n), n, d))
        if levels is None:
            return PathLength(None, f"{PATH_NONE}: the steps traced at n leave the scan's law")
        return PathLength(max(levels, 1), PATH_MEASURED)
    if n <= PATH_MEASURE_MAX or n in probes:
        value = _path_of(build, n, d, route)
        return PathLength(None, NO_MIXING) if value is None else PathLength(value, PATH_MEASURED)
    shape, probe_paths = _probe(build, d, tuple(probes), route)
    if all(path is None for path in probe_paths.values()):  # no probe mixed: nor does n
        return PathLength(None, NO_MIXING)
    if shape is None:
        return _measured_at(build, n, d, route, "no single band or block shape at the probes")
    recurrent = route.kind == "recurrence"
    # The law must reproduce every probe's measured path before it is trusted at n.
    for p, measured in probe_paths.items():
        if shape.path(p, recurrent, _stage_count(build, p, d)) != measured:
            why = f"the {'band' if shape.is_band else 'block'} law does not reproduce the probes"
            return _measured_at(build, n, d, route, why)
    stages = _stage_count(build, n, d)
    value = shape.path(n, recurrent, stages)
    span = f"n={probes[0]}..{probes[-1]}"
    if value is None:
        return PathLength(None, f"{PATH_NONE}: no path law for {shape.describe()} at {span}")
    law = f"{shape.describe()} at {span}, {stages} stage(s) at n={n}"
    return PathLength(value, f"{PATH_EXTENDED}: {law}")


def _measured_at(
    build: Callable[[int], nn.Module], n: int, d: int, route: Route, why: str
) -> PathLength:
    """The path at n from the pattern measured at n, where no law from the probes holds (a
    multi-scale convolution's band has gaps: offsets 0, 1, 2, 4); "none" only where that
    pattern would not fit its memory or time (``PatternTooCostly``)."""
    if n > PATH_FALLBACK_MAX:  # the closure over n x n grows about as n^4 (45 s at 512)
        return PathLength(None, f"{PATH_NONE}: {why}, and n > {PATH_FALLBACK_MAX} to measure")
    try:
        value = _path_of(build, n, d, route)
    except PatternTooCostly as exc:
        return PathLength(None, f"{PATH_NONE}: {why}, and {exc}")
    return PathLength(None, NO_MIXING) if value is None else PathLength(value, PATH_MEASURED)


def fallback_probes(n: int) -> list[tuple[int, ...]]:
    """Doubling probe lengths for a layer that refuses the usual ones (a length that must be a
    multiple of its block or window), shortest first, so the probes cost least: powers of two
    from 32 below n, then triples built from the case's own n (its divisors, then multiples)."""
    triples: list[tuple[int, ...]] = []
    start = 32
    while 4 * start < n:
        triples.append((start, 2 * start, 4 * start))
        start *= 2
    if n % 4 == 0:
        triples.append((n // 4, n // 2, n))
    if n % 2 == 0:
        triples.append((n // 2, n, 2 * n))
    triples.append((n, 2 * n, 4 * n))
    return list(dict.fromkeys(triples))


def _accepted_route(
    build: Callable[[int], nn.Module],
    d: int,
    preferred: tuple[int, ...],
    n: int,
    known: Mapping[int, int],
) -> tuple[Route, tuple[int, ...]]:
    """The route law, read at the preferred probes or, where the layer refuses one of them,
    at the first ``fallback_probes`` it accepts (the last refusal is raised when none is)."""
    candidates = [preferred, *(t for t in fallback_probes(n) if t != preferred and t[0] > 0)]
    for i, probes in enumerate(candidates):
        try:
            return route_of(build, d, probes, known), probes
        except Exception:
            if i == len(candidates) - 1:
                raise
    raise AssertionError("unreachable: the last candidate raises")


def _probe(
    build: Callable[[int], nn.Module], d: int, probes: tuple[int, ...], route: Route
) -> tuple[BlockBand | None, dict[int, int | None]]:
    def compute() -> tuple[BlockBand | None, dict[int, int | None]]:
        patterns: dict[int, np.ndarray] = {}
        paths: dict[int, int | None] = {}
        for p in probes:
            patterns[p] = _pattern_of(build, p, d, route)
            paths[p] = _path_of(build, p, d, route)
        return shape_of(patterns), paths

    return _cached("band", build, d, (*probes, route), compute)
