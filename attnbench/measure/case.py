"""One case, measured: build the layer, then time, count and profile its real call.

Everything here runs where the case runs (this process for a serial sweep, a worker for another
executor), so it depends on nothing but the case, the seed and the timing policy.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import TypeVar

import torch
from torch import nn

from attnbench.devices import device_kind, device_sync
from attnbench.errors import AttnbenchError, first_line
from attnbench.layers.registry import entry
from attnbench.measure.compiled import finished, first_call, with_compile
from attnbench.measure.counts import countcache, extend
from attnbench.measure.counts.census import prime_instruments, take_census
from attnbench.measure.counts.chains import sequential_steps
from attnbench.measure.counts.countcache import DEFAULT_COUNTING, Counting
from attnbench.measure.counts.elementwise import ELEMENTWISE_METHOD, count_elementwise
from attnbench.measure.counts.flops import FlopCount, trace_flops
from attnbench.measure.counts.instructions import InstructionCounter
from attnbench.measure.counts.ops import (
    ATTENTION_FAST_PATHS,
    BACKENDS,
    COUNTED_ON_CPU,
    describe_backend,
    describe_fused,
    explicit_attention,
    recording_fused,
)
from attnbench.measure.counts.probecache import probes_on_disk
from attnbench.measure.counts.structure import PATH_NONE, SEQ_METHOD, path_length
from attnbench.measure.counts.traffic import TRAFFIC_METHOD, Traffic, count_traffic
from attnbench.measure.decode import Decoded, decode_check, drift, held_bytes, judged
from attnbench.measure.memory import is_out_of_memory, oom_text, profile_call
from attnbench.measure.record import CaseResult
from attnbench.measure.step import NoDecodeStep, Step, layer_builder, make_step, release_memory
from attnbench.measure.timing.clocks import device_clock_max
from attnbench.measure.timing.energy import Energy, energy_columns, energy_of
from attnbench.measure.timing.faults import FaultCounter
from attnbench.measure.timing.gputimers import Timed, device_split, time_step
from attnbench.measure.timing.loop import DEFAULT_POLICY, Clock, TimingPolicy, TimingStats
from attnbench.measure.timing.reference import referenced
from attnbench.measure.timing.split import KernelSplit, kernel_share
from attnbench.provenance import CACHED_MARK, Provenance, Source
from attnbench.schema import Status
from attnbench.spec import Case
from attnbench.units import fmt_seconds


def measure_case(
    case: Case,
    *,
    seed: int = 0,
    policy: TimingPolicy = DEFAULT_POLICY,
    clock: Clock = time.perf_counter,
    max_case_s: float | None = None,
    counter: InstructionCounter | None = None,
    faults: FaultCounter | None = None,
    counting: Counting = DEFAULT_COUNTING,
) -> CaseResult:
    """Measure one case: time (many calls), then FLOPs and elementwise work (counted),
    sequential steps and path length (traced) and peak memory (one call), or
    with a Callgrind ``counter`` the instructions of one call instead of its time. ``counting``
    says whether the counts go through the count cache and whether a long recurrence's come
    from its probes.

    A first call slower than ``max_case_s`` ends the case as ``timeout`` before the many timed
    calls; an allocation failure ends it as ``oom``; any other error as ``failed``.
    """
    # The exact counts and the memory pass depend on the code and the case only: read from the
    # count cache when this code measured this case before.
    try:
        cached = cached_counts(case, seed, counting)
        cached_memory = cached_profile(case, seed, counting)
    except AttnbenchError:  # an unknown layer: the case fails below, as it would uncached
        cached = cached_memory = None
    start = clock()
    threads = torch.get_num_threads()
    sync = device_sync(case.device)
    try:
        step = make_step(case, seed)
        sync()
        # first call: lazy initialisation (positional table, kernels, a compile) unmeasured
        first, compiling = first_call(step, clock, sync)
        if max_case_s is not None and first > max_case_s:
            return CaseResult(
                case=case,
                status=Status.TIMEOUT,
                threads=threads,
                wall_s=clock() - start,
                error=f"one call took {fmt_seconds(first)}, over --max-case-seconds "
                f"{fmt_seconds(max_case_s)}",
            )
        # Timed first, in the state every later round of the case times it in: a process that
        # has made the layer and called it once; the counts' traces come after.
        timed = None
        if counter is None:
            timed = referenced(
                lambda: time_step(step, policy, case.device, clock=clock, sync=sync, faults=faults),
                clock,
                policy,
            )
        compiled = finished(step, compiling)  # its recompiles: the timed calls' own
        energy = energy_of(step, case.device, policy.energy_s, sync) if timed else None
        counts, source, memory = exact_counts(case, seed, step, cached, cached_memory, counting)
        split: tuple[KernelSplit | None, str] = (None, "")
        instructions = None
        if timed is not None:
            median, ops, replays = timed.stats.median_s, memory.ops, timed.replays
            split = auxiliary(
                lambda: device_split(step, case.device, median, ops, clock, sync, replays)
            )
        elif counter is not None:  # counted in its own process, under Callgrind
            instructions = counter.count(case, seed)
        decoded = None
        if step.state is not None:
            decoded = Decoded(held_bytes(step), decode_check(case, step), drift(step))
    except NoDecodeStep as exc:  # a layer without a step: a stated skip, the sweep goes on
        return CaseResult(case, Status.SKIPPED, threads, wall_s=clock() - start, error=str(exc))
    except Exception as exc:  # a case that breaks is recorded; the sweep goes on
        status = Status.OOM if is_out_of_memory(exc) else Status.FAILED
        return _failed(case, status, exc, threads, clock() - start)
    taken = _Taken(counts, source, memory, timed, instructions, split, decoded, energy)
    waited = timed.stats.waited_s if timed is not None else 0.0  # the machine's, not the case's
    measured = _measured(case, threads, clock() - start - waited, taken, policy)
    return with_compile(judged(measured, decoded), compiled)


@dataclasses.dataclass(frozen=True)
class _Taken:
    """What measuring a case took: its counts (and how), its memory pass, its time (or its
    instructions, under Callgrind) and the time's split."""

    counts: countcache.Counts
    source: str
    memory: countcache.Profile
    timed: Timed | None
    instructions: int | None
    split: tuple[KernelSplit | None, str]
    decoded: Decoded | None = None
    energy: Energy | None = None


def _measured(
    case: Case, threads: int, wall_s: float, taken: _Taken, policy: TimingPolicy
) -> CaseResult:
    """The record of a case measured in full."""
    counts, memory, split = taken.counts, taken.memory, taken.split
    timing = taken.timed.stats if taken.timed is not None else None
    return CaseResult(
        case=case,
        status=Status.OK,
        threads=threads,
        timing=timing,
        peak_bytes=memory.peak_bytes,
        peak_bytes_method=memory.method,
        flops=counts.flops,
        flops_analytic=case.analytic_flops(),
        uncounted_ops=counts.uncounted_ops,
        fused_path=describe_fused(set(memory.fused)),
        backend=describe_backend(memory.backends),
        seq_steps=counts.seq_steps,
        seq_steps_method=counts.seq_steps_method,
        path_len=counts.path_len,
        path_len_method=counts.path_len_method,
        wall_s=wall_s,
        instructions=taken.instructions,
        elementwise=counts.elementwise,
        elementwise_method=counts.elementwise_method,
        elementwise_analytic=case.analytic_elements(),
        bytes=counts.bytes,
        bytes_method=counts.bytes_method,
        bytes_analytic=case.analytic_bytes(),
        ops=memory.ops,
        product_bytes=counts.product_bytes,
        kernels=counts.kernels,
        counts_source=taken.source,
        kernel_share=kernel_share(split[0], timing, policy),
        kernel_method=split[1] if split[0] is None else split[0].method,
        time_method=taken.timed.method if taken.timed is not None else "",
        sm_clock_max_mhz=device_clock_max(case.device) if timing is not None else None,
        state_bytes=taken.decoded.state_bytes if taken.decoded else None,
        state_analytic=case.analytic_state(),
        decode_check=taken.decoded.check if taken.decoded else None,
        **energy_columns(taken.energy),
    )


def exact_counts(
    case: Case,
    seed: int,
    step: Step,
    cached: countcache.Counts | None,
    cached_memory: countcache.Profile | None,
    counting: Counting,
) -> tuple[countcache.Counts, str, countcache.Profile]:
    """The case's counts, how they were taken, and its memory pass: from the count cache
    where it holds them, else traced (and written to it)."""
    if cached is None or cached_memory is None:
        prime_instruments()  # the tracers' start-up, once a process, after the timing
    counts, source, memory = cached, countcache.CACHED, cached_memory
    store = counting.store
    if memory is None and case.device != "cpu":
        # On an accelerator the memory pass comes first (its allocator's statistics are cheap
        # at any n): the fused kernels the timed call ran decide where its counts are traced
        # (``trace_counts``).
        memory = memory_pass(case, seed, step)
        if store:
            store.write_profile(case, seed, memory)
    if counts is None:
        fused = memory.fused if memory is not None else attention_fast_paths(step)
        with probes_on_disk(store):  # a process a case: the line's probes kept for the next
            counts, source = trace_counts(case, step, seed, fused=fused, counting=counting)
        if store:
            store.write(case, seed, counts)
    if memory is None:
        # On the CPU the profiler, which replays every requested allocation, costs as much as
        # tracing: profiled at the short probes and extended by their law.
        if extend.is_extended(counts):
            memory = extend.extended_profile(
                case, lambda short: probe_profile(short, seed, counting=counting)
            )
        if memory is None:
            memory = (
                probe_profile(case, seed, step, counting)
                if extend.is_probe(case, counting.full_trace)
                else memory_pass(case, seed, step)
            )
        if store:
            store.write_profile(case, seed, memory)
    return counts, source, memory


def cached_counts(case: Case, seed: int, counting: Counting) -> countcache.Counts | None:
    """The case's counts from the count cache; None when there are none, or they were
    extended and ``counting`` asks for full traces."""
    found = counting.store.read(case, seed) if counting.store else None
    if found is None or (counting.full_trace and extend.is_extended(found)):
        return None
    return found


def cached_profile(case: Case, seed: int, counting: Counting) -> countcache.Profile | None:
    """The case's memory pass from the count cache, its method marked "(cache)"; None when
    there is none, or it was extended and ``counting`` asks for full traces."""
    found = counting.store.read_profile(case, seed) if counting.store else None
    if found is None or (counting.full_trace and Provenance.parse(found.method).extended):
        return None
    return dataclasses.replace(found, method=f"{found.method} {CACHED_MARK}")


def memory_pass(case: Case, seed: int, step: Step | None = None) -> countcache.Profile:
    """Peak memory of one real call, with the ops it dispatched (a fused kernel is one), the
    fused paths it took and the convolution implementations it ran (``ops.BACKENDS``, on the
    CPU); a fresh step is called once first, so lazy set-up stays unmeasured.

    A compiled call gives its peak alone (dynamo would trace a dispatch mode around it); its
    fused paths are the eager layer's, read from one eager call: they decide where the counts,
    which are the eager layer's, are traced (on an H200 a compiled lstm read 2n + 1 steps where
    its eager call, cuDNN's fused recurrence counted on the CPU, reads 7n + 1)."""
    step = step or _called_step(case, seed)
    if step.model is not None:
        eager: set[str] = set()
        recording_fused(step.forward, eager)()
        return countcache.Profile(profile_call(step, case.device)[0], None, frozenset(eager))
    fused: set[str] = set()
    timed_ops: list[int] = []
    peak, ran = profile_call(recording_fused(step, fused, timed_ops), case.device)
    return countcache.Profile(
        peak, timed_ops[0] if timed_ops else None, frozenset(fused), backends=ran & set(BACKENDS)
    )


def probe_counts(
    short: Case, seed: int, step: Step | None = None, counting: Counting = DEFAULT_COUNTING
) -> countcache.Counts:
    """The counts at a probe length, for a longer case's law: traced once per layer, d and
    options, then read from the count cache by every other long case (and every later sweep).
    ``step``: the case's own, called once already, where the case is at a probe length."""
    store = counting.store.probes() if counting.store else None
    found = store.read(short, seed) if store else None
    if found is None:
        found = call_counts(step or _called_step(short, seed), short.mode)
        if store:
            store.write(short, seed, found)
    return found


def probe_profile(
    short: Case, seed: int, step: Step | None = None, counting: Counting = DEFAULT_COUNTING
) -> countcache.Profile:
    """The memory pass at a probe length (CPU), cached as ``probe_counts`` are."""
    store = counting.store.probes() if counting.store else None
    found = store.read_profile(short, seed) if store else None
    if found is None:
        found = memory_pass(short, seed, step)
        if store:
            store.write_profile(short, seed, found)
    return found


def attention_fast_paths(step: Step) -> frozenset[str]:
    """The attention fast paths (``ops.ATTENTION_FAST_PATHS``) the step's real call takes,
    which decide how its attention is counted (``trace_counts``): recorded from one call where
    the layer holds an nn.MultiheadAttention, none (and no call) otherwise."""
    if not any(isinstance(module, nn.MultiheadAttention) for module in step.layer.modules()):
        return frozenset()
    if step.model is not None:  # compiled: counted as the eager layer, which is called here
        if step.layer.training:  # (dynamo would trace a dispatch mode around the compiled one)
            return frozenset()  # a training call takes no fast path
        step = dataclasses.replace(step, call=step.forward, model=None)
    seen: set[str] = set()
    recording_fused(step, seen)()
    return frozenset(seen & ATTENTION_FAST_PATHS)


def _called_step(case: Case, seed: int) -> Step:
    """A fresh step, called once: lazy set-up stays out of a probe's trace, as out of a case's."""
    step = make_step(case, seed)
    step()
    return step


DECODE_PATH = f"{PATH_NONE}: a decode step; the layer's path length is a forward run's"


def trace_counts(
    case: Case, step: Step | None, seed: int, *, fused: frozenset[str] = frozenset(),
    counting: Counting = DEFAULT_COUNTING,
) -> tuple[countcache.Counts, str]:  # fmt: skip  # the arguments as the callers pass them
    """Every exact count of the case, traced from its real layer, and how (``counts_source``):
    in full, or for a long recurrent case at short lengths and extended by a law proven there
    (``measure.counts.extend``).

    The auxiliary counts each run in their own guard: one that fails (a probe at a length the
    layer refuses) leaves its column empty with the reason, and the case's time, memory and
    FLOPs are still measured.

    A count is the layer's, not the device's; the time and memory stay the device's. So an
    accelerator's case whose timed call took one of ``ops.COUNTED_ON_CPU`` (``fused``, the
    memory pass's) is counted on the CPU, where torch runs the recurrence as its ops and the
    layer's formulas describe it: on CUDA, cuDNN's unfused stand-in projects the input step by
    step (reading W_ih n times), and with cuDNN off an LSTM or GRU runs fused cells no counter
    can see into. The path below reads the steps of that same trace, so steps and path come
    from one computation.

    A call that took nn.MultiheadAttention's fast path (``ops.ATTENTION_FAST_PATHS``) is
    counted with its attention as that kernel computes it on the timed device
    (``ops.explicit_attention``): explicit scores on the CPU, and on CUDA at head widths where
    it cannot use a fused attention kernel; elsewhere as the unfused path runs it.
    """
    timed_on = device_kind(case.device) if fused & ATTENTION_FAST_PATHS else None
    if case.device != "cpu" and fused & COUNTED_ON_CPU:
        case, step = dataclasses.replace(case, device="cpu"), None
    with explicit_attention(timed_on):
        found, source = _call_counts(case, step, seed, counting)
    # The steps just traced at n (batch 1, as the path's own trace) spare a scan's path a trace.
    steps = Provenance.parse(found.seq_steps_method)
    traced = steps.source is Source.TRACED and not steps.cached and case.batch == 1
    if case.mode == "decode":  # a step's path is the layer's: a forward run measures it
        return dataclasses.replace(found, path_len_method=DECODE_PATH), source
    reach = entry(case.layer).reach(case.option_values)
    path, path_method = auxiliary(
        lambda: path_length(
            layer_builder(case, seed), case.n, case.d, scale=reach,
            steps=found.seq_steps if traced else None,
        )
    )  # fmt: skip  # the builder and its sizes on one line, as path_length reads them
    return dataclasses.replace(
        found,
        path_len=None if path is None else path.value,
        path_len_method=path_method if path is None else path.method,
    ), source


def _call_counts(
    case: Case, step: Step | None, seed: int, counting: Counting = DEFAULT_COUNTING
) -> tuple[countcache.Counts, str]:
    """The counts of one call on the case's own device, traced or extended, without the path;
    ``step`` None: a fresh one where a trace needs it."""
    found, source = None, extend.EXTENDED
    full = counting.full_trace
    vouched = extend.applies(case, full)  # the theory says the case is long; else the probes
    if vouched or extend.probed(case, full):
        found = extend.extended_counts(
            case, lambda short: probe_counts(short, seed, counting=counting), check=not vouched
        )
    if found is None:
        source = countcache.TRACED
        # A case at a probe length is the probe: one trace serves it and the longer cases.
        found = (
            probe_counts(case, seed, step, counting)
            if extend.is_probe(case, full)
            else call_counts(step or _called_step(case, seed), case.mode)
        )
    return found, source


def call_counts(step: Step, mode: str) -> countcache.Counts:
    """The counts of the step's call (no path length: it is not a count of one call, and
    ``trace_counts`` adds it)."""
    flop_count, (steps, steps_method), (elements, elements_method), traced = traced_counts(
        step, mode
    )
    traffic, traffic_method = traced
    return countcache.Counts(
        flops=flop_count.total,
        uncounted_ops=flop_count.uncounted,
        seq_steps=steps,
        seq_steps_method=steps_method,
        path_len=None,
        path_len_method="",
        elementwise=elements,
        elementwise_method=elements_method,
        bytes=None if traffic is None else traffic.bytes,
        bytes_method=traffic_method,
        product_bytes=None if traffic is None else traffic.product_bytes,
        kernels="" if traffic is None else traffic.kernels_text(),
    )


T = TypeVar("T")
Counted = tuple[T | None, str]  # a count and how it was taken (its *_method column)


def traced_counts(
    step: Step, mode: str
) -> tuple[FlopCount, Counted[int], Counted[int], Counted[Traffic]]:
    """FLOPs, sequential steps, elementwise work and bytes of the case's call.

    In forward mode the four are one call, traced once (``census``). In train mode FLOPs and
    bytes describe forward and backward and the other two the forward pass, so they are
    traced apart, each in its own guard.
    """
    if mode != "train":  # a forward call, or a decode step: one call without gradients
        found = take_census(step.forward, tuple((step.state or {}).values()))
        errors = found.errors
        return (
            found.flops,
            (found.steps, errors.get("steps", SEQ_METHOD)),
            (found.elementwise, errors.get("elementwise", ELEMENTWISE_METHOD)),
            (found.traffic, errors.get("traffic", TRAFFIC_METHOD)),
        )
    steps = auxiliary(lambda: sequential_steps(step.forward), SEQ_METHOD)
    flop_count = trace_flops(step)
    elements = auxiliary(lambda: count_elementwise(step.forward), ELEMENTWISE_METHOD)
    traffic = auxiliary(lambda: count_traffic(step), TRAFFIC_METHOD)
    return flop_count, steps, elements, traffic


def auxiliary(count: Callable[[], T], method: str = "") -> tuple[T | None, str]:
    """An auxiliary count and how it was taken: ``(value, method)``, or ``(None, "none: why")``
    when it cannot be taken. An allocation failure still ends the case (as ``oom``)."""
    try:
        return count(), method
    except Exception as exc:
        if is_out_of_memory(exc):
            raise
        release_memory("cpu")
        return None, f"{PATH_NONE}: {first_line(exc)}"[:300]


def _failed(case: Case, status: Status, e: BaseException, threads: int, wall: float) -> CaseResult:
    error = oom_text(e) if status is Status.OOM else first_line(e)[:300]
    return CaseResult(case=case, status=status, threads=threads, wall_s=wall, error=error)


def retime_case(
    case: Case,
    *,
    seed: int,
    policy: TimingPolicy,
    clock: Clock = time.perf_counter,
    faults: FaultCounter | None = None,
) -> TimingStats | None:
    """Another timing round of a case measured before: a fresh layer, one untimed call, then
    the timed calls. None when it fails this time (the round is left out, the case kept)."""
    sync = device_sync(case.device)
    try:
        step = make_step(case, seed)
        step()  # (B, n, d): lazy initialisation stays unmeasured, as in the first round
        sync()
        return referenced(
            lambda: time_step(step, policy, case.device, clock=clock, sync=sync, faults=faults),
            clock,
            policy,
        ).stats
    except Exception:
        release_memory(case.device)
        return None
