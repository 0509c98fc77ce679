"""Counts of long recurrent cases, extended from short traces by a law proven there: the law is
exact, refuses what it cannot prove, is labelled, and equals the full trace on every long
recurrent case of the reference runs."""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from pathlib import Path

import pytest
import torch
from synthetic import small_case

from attnbench.layers import REGISTRY, LayerEntry
from attnbench.measure.case import measure_case, memory_pass, trace_counts
from attnbench.measure.counts import countcache, extend, laws
from attnbench.measure.counts.countcache import Counting, Counts
from attnbench.measure.step import make_step
from attnbench.measure.timing.loop import TimingPolicy
from attnbench.options import grid_from_config
from attnbench.results.loader import load_results

ROOT = Path(__file__).resolve().parents[1]
FULL = Counting(full_trace=True)
QUICK = TimingPolicy(warmup_calls=0, min_block_s=0.0, min_samples=1, max_samples=1, budget_s=0.0)


def counts(n: int, **overrides: object) -> Counts:
    """Synthetic counts of a recurrent layer: affine in n, as an rnn's are."""
    values = dict(
        flops=1000 * n + 7,
        uncounted_ops="",
        seq_steps=n,
        seq_steps_method="traced",
        path_len=None,
        path_len_method="",
        elementwise=30 * n,
        elementwise_method="counted",
        bytes=400 * n + 64,
        bytes_method="counted",
        product_bytes=100 * n,
        kernels=f"conv:{6 * n}:{8 * n + 2}",
    )
    values.update(overrides)
    return Counts(**values)  # type: ignore[arg-type]


def probes(**overrides: object) -> dict[int, Counts]:
    return {m: counts(m, **overrides) for m in extend.PROBES}


def test_the_law_through_three_points_is_exact_and_knows_its_degree() -> None:
    assert laws.Law([(1, 5), (2, 7), (4, 11)])(100) == 203
    assert laws.Law([(1, 5), (2, 7), (4, 11)]).degree == 1
    square = laws.Law([(2, 4), (3, 9), (5, 25)])
    assert (square(1000), square.degree) == (1_000_000, 2)
    assert laws.Law([(1, 1), (2, 2), (4, 3)])(3) == Fraction(8, 3)


def test_a_law_is_kept_only_if_it_reproduces_the_other_probes() -> None:
    assert laws.fit_law({1: 1, 2: 2, 4: 4, 8: 8}) is not None
    # n log n: no polynomial of degree 2 through three points reproduces the fourth.
    assert laws.fit_law({m: m * m.bit_length() for m in (64, 128, 256, 512)}) is None


def test_extended_counts_equal_the_law_at_n_and_say_so() -> None:
    found = extend.extend(probes(), 8192)
    assert found is not None
    assert (found.flops, found.seq_steps, found.elementwise) == (8192007, 8192, 245760)
    assert (found.bytes, found.product_bytes) == (400 * 8192 + 64, 819200)
    assert found.kernels == f"conv:{6 * 8192}:{8 * 8192 + 2}"
    how = "extended: linear in n through n=8,16,32,64"
    assert (found.seq_steps_method, found.elementwise_method, found.bytes_method) == (how,) * 3
    assert extend.is_extended(found) and not extend.is_extended(counts(8192))


def test_what_cannot_be_extended_is_traced_in_full() -> None:
    wobbly = probes()
    last = extend.PROBES[-1]
    wobbly[last] = dataclasses.replace(wobbly[last], flops=wobbly[last].flops + 1)
    assert extend.extend(wobbly, 8192) is None  # the fourth probe leaves the law
    assert extend.extend(probes(uncounted_ops="aten.foo x3 (9 elements)"), 8192) is None
    halves = {m: dataclasses.replace(c, bytes=c.bytes + m // 2) for m, c in probes().items()}
    assert extend.extend(halves, 8191) is None  # n / 2 at an odd n: no whole count of bytes
    kinds = probes()
    kinds[64] = dataclasses.replace(kinds[64], kernels="")
    assert extend.extend(kinds, 8192) is None  # a kind of product only at some lengths


def test_a_count_that_failed_at_the_probes_stays_empty_with_their_reason() -> None:
    found = extend.extend(probes(elementwise=None, elementwise_method="none: odd op"), 4096)
    assert found is not None
    assert (found.elementwise, found.elementwise_method) == (None, "none: odd op")
    assert found.bytes_method.startswith("extended")


def test_only_long_sequential_cases_are_extended_and_full_trace_turns_it_off() -> None:
    assert extend.applies(small_case("rnn", n=4096))
    assert extend.applies(small_case("rnn", n=128))  # past the probes: n steps
    assert not extend.applies(small_case("rnn", n=64))  # a probe length: traced in full
    assert not extend.applies(small_case("attention", n=4096))  # one step: cheap to trace
    assert not extend.applies(small_case("ssm-scan", n=4096))  # log n steps
    assert not extend.applies(small_case("rnn", n=4096), full=True)


def test_a_case_at_a_probe_length_of_an_extended_layer_is_its_probe() -> None:
    """Its full trace is the probe's: shared, not taken twice (tests/test_countcache.py)."""
    assert extend.is_probe(small_case("rnn", n=64)) and extend.is_probe(small_case("ssm", n=8))
    assert not extend.is_probe(small_case("rnn", n=48))  # not a probe length
    assert not extend.is_probe(small_case("attention", n=64))  # never extended
    assert not extend.is_probe(small_case("rnn", n=64), full=True)


def test_the_memory_pass_is_extended_by_its_own_law() -> None:
    found = {m: countcache.Profile(4 * 64 * m + 512, 3 * m + 2, frozenset()) for m in extend.PROBES}
    profile = extend.extend_profile(found, 8192)
    assert profile is not None
    assert (profile.peak_bytes, profile.ops) == (4 * 64 * 8192 + 512, 24578)
    assert profile.method == "extended: linear in n through n=8,16,32,64"
    on_mps = {m: countcache.Profile(None, m, frozenset()) for m in extend.PROBES}
    extended = extend.extend_profile(on_mps, 4096)
    assert extended is not None and (extended.peak_bytes, extended.ops) == (None, 4096)


def test_a_fused_kernel_is_profiled_at_n() -> None:
    # oneDNN's lstm: its scratch memory is linear at n = 8..64 and not at n = 1024 (d = 64).
    fused = frozenset({"mkldnn_rnn_layer"})
    found = {m: countcache.Profile(4 * m, 5, fused) for m in extend.PROBES}
    assert extend.extend_profile(found, 8192) is None


def test_torch_s_recurrent_op_whose_steps_the_dispatcher_sees_is_extended() -> None:
    """nn.GRU's one op (``ops.RECURRENT_OPS``) dispatches each step's ops, which follow the
    law: the profile is extended, and keeps the op's name at n."""
    found = {m: countcache.Profile(4 * m, 11 * m + 4, frozenset({"gru"})) for m in extend.PROBES}
    profile = extend.extend_profile(found, 8192)
    assert profile is not None and (profile.ops, profile.fused) == (11 * 8192 + 4, {"gru"})


def test_a_convolution_is_profiled_at_n() -> None:
    # torch chooses a convolution's implementation by its size: the probes' is not n's.
    ran = frozenset({"thnn_conv2d"})
    found = {m: countcache.Profile(4 * m, 5, frozenset(), backends=ran) for m in extend.PROBES}
    assert extend.extend_profile(found, 8192) is None


def test_a_case_whose_layer_refuses_a_probe_length_is_traced_in_full() -> None:
    def refuse(case: object) -> Counts:
        raise ValueError("n must be a multiple of 100")

    assert extend.extended_counts(small_case("rnn", n=4096), refuse) is None


@pytest.mark.slow
def test_a_long_rnn_case_is_extended_and_equals_its_full_trace() -> None:
    case = small_case("rnn", n=1024, d=4)
    short, how = trace_counts(case, make_step(case, 0), 0)
    full, full_how = trace_counts(case, make_step(case, 0), 0, counting=FULL)
    assert (how, full_how) == (extend.EXTENDED, countcache.TRACED)
    assert short.bytes_method.startswith("extended") and not extend.is_extended(full)
    assert short == dataclasses.replace(
        full, **{c: getattr(short, c) for c in extend.METHODS.values()}
    )
    profile = extend.extended_profile(case, lambda probe: memory_pass(probe, 0))
    assert profile is not None and profile.method.startswith("extended")
    assert dataclasses.replace(profile, method="measured") == memory_pass(case, 0)


@pytest.mark.slow
def test_full_trace_does_not_read_an_extended_entry_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ATTNBENCH_CACHE_DIR", str(tmp_path))
    case = small_case("rnn", n=1024, d=4)
    cached = Counting(cache=True)
    first = measure_case(case, policy=QUICK, counting=cached)
    assert (first.counts_source, first.bytes_method[:8]) == (extend.EXTENDED, "extended")
    assert first.peak_bytes_method.startswith("extended")
    assert measure_case(case, policy=QUICK, counting=cached).counts_source == countcache.CACHED
    full = measure_case(case, policy=QUICK, counting=Counting(cache=True, full_trace=True))
    assert full.counts_source == countcache.TRACED
    assert not full.bytes_method.startswith("extended") and full.bytes == first.bytes
    assert (full.peak_bytes_method, full.peak_bytes) == ("measured", first.peak_bytes)


def reference_long_cases() -> list[object]:
    """Every case of the committed CPU reference runs whose counts are extended (a GPU run's
    cases need its device; their counts are the CPU's, tests/test_cuda.py)."""
    found = {}
    # the committed runs (the golden files name them): never a user's own sweep under results/,
    # whose plugin layers this process cannot import
    committed = sorted(p.stem for p in (ROOT / "tests" / "golden").glob("*.json"))
    for run in [ROOT / "results" / name / "run.json" for name in committed]:
        if not run.is_file():
            continue
        loaded = load_results(run.parent)  # its config in today's format
        config = loaded.record.config
        if config.get("device", "cpu") != "cpu":
            continue
        measured = set(loaded.frame["case_id"])  # an auto run's, not its ladder
        for case in grid_from_config(config).cases():
            # up to the fixed grids' longest: a full trace of an auto run's n = 8192 takes minutes
            if case.case_id in measured and case.n <= 2048 and extend.applies(case, {}):
                found[case.case_id] = case
    return list(found.values())


@pytest.mark.slow
@pytest.mark.parametrize("layer", ["rnn", "gru", "lstm", "ssm"])  # the sequential ones
def test_extended_counts_equal_full_traces_on_the_long_cases_of_the_reference_runs(
    layer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every length of the reference runs at their width of 64, compiled or not, and the other
    widths at n = 256: a full trace takes time in proportion to n, and all 75 cases took a
    minute of the suite's time."""
    every = reference_long_cases()
    cases = [c for c in every if c.layer == layer and (c.d == 64 or c.n == 256)]
    assert {c.d for c in cases} == {32, 64, 128} and {c.n for c in cases} >= {128, 2048}
    unproven = False
    for case in cases:
        short, how = trace_counts(case, make_step(case, 0), 0)
        full, _ = trace_counts(case, make_step(case, 0), 0, counting=FULL)
        assert how == extend.EXTENDED, case.case_id
        methods = {c: getattr(full, c) for c in extend.METHODS.values()}
        assert dataclasses.replace(short, **methods) == full, case.case_id
        # The memory pass: extended where the probes prove a law and no fused kernel ran (a
        # sweep profiles those at n: oneDNN's lstm), never for a compiled call (its own memory)
        profile = extend.extended_profile(case, lambda probe: memory_pass(probe, 0))
        if case.compiled:
            assert profile is None, case.case_id
            continue
        if profile is None:
            unproven = True
            continue
        assert dataclasses.replace(profile, method="measured") == memory_pass(case, 0), case.case_id
    assert unproven == (layer == "lstm")
    assert len(every) == 75  # the cases this samples from: a run added needs a look here


class LoopRecurrence(torch.nn.Module):
    """A researcher's recurrence, written as a Python loop: one step per position (up to
    ``chunk`` positions; the rest are mixed in one parallel op)."""

    chunk: int | None = None

    def __init__(self, d: int) -> None:
        super().__init__()
        self.step = torch.nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, n, d) -> (B, n, d)
        n = x.shape[1]
        h = torch.zeros_like(x[:, 0])  # (B, d)
        for t in range(n if self.chunk is None else min(n, self.chunk)):
            h = torch.tanh(self.step(h) + x[:, t])  # (B, d)
        return x + h[:, None]  # (B, n, d)


class ChunkedRecurrence(LoopRecurrence):
    """Steps grow with n up to 128 positions, then stop: a law proven at n = 8..64 is wrong
    beyond, and the check at n / 4 must catch it."""

    chunk = 128


@pytest.fixture
def plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    """The two recurrences and an nn.Linear as plugin layers: no theory vouches for them."""
    for name, module in (
        ("loop-rnn", LoopRecurrence),
        ("chunked-rnn", ChunkedRecurrence),
        ("plain-linear", torch.nn.Linear),
    ):
        build = (lambda d: torch.nn.Linear(d, d)) if module is torch.nn.Linear else module
        monkeypatch.setitem(REGISTRY, name, LayerEntry(name, build))


def _both(case: object, monkeypatch: pytest.MonkeyPatch) -> tuple[Counts, str, Counts]:
    short, how = trace_counts(case, make_step(case, 0), 0)
    full, _ = trace_counts(case, make_step(case, 0), 0, counting=FULL)
    return short, how, full


@pytest.mark.slow
def test_a_plugin_recurrence_is_extended_once_the_law_holds_at_a_quarter_of_n(
    plugin: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = small_case("loop-rnn", n=1024, d=8, batch=1)
    assert extend.probed(case) and not extend.applies(case)
    short, how, full = _both(case, monkeypatch)
    assert how == extend.EXTENDED
    assert short.seq_steps_method.endswith("checked at n=256")
    methods = {c: getattr(full, c) for c in extend.METHODS.values()}
    assert dataclasses.replace(short, **methods) == full  # every count as the full trace's
    measured = measure_case(case, policy=QUICK)  # the memory pass follows the counts' lead
    assert measured.counts_source == extend.EXTENDED
    assert measured.peak_bytes_method.startswith("extended")
    profile = memory_pass(case, 0)
    assert (measured.peak_bytes, measured.ops) == (profile.peak_bytes, profile.ops)


def test_a_law_that_stops_holding_past_the_probes_is_traced_in_full(
    plugin: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = small_case("chunked-rnn", n=1024, d=8, batch=1)
    short, how, full = _both(case, monkeypatch)
    assert how == countcache.TRACED and short == full
    at_probes = {
        m: trace_counts(
            dataclasses.replace(case, n=m), make_step(dataclasses.replace(case, n=m), 0), 0
        )[0]
        for m in extend.PROBES
    }
    law = extend.extend(at_probes, 1024)
    assert law is not None and law.seq_steps > 2 * full.seq_steps  # the probes' law, wrong here


def test_a_plugin_with_few_steps_is_traced_in_full_and_a_short_case_never_probed(
    plugin: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = small_case("plain-linear", n=1024, d=8, batch=1)
    short, how, full = _both(case, monkeypatch)
    assert how == countcache.TRACED and short == full
    assert not extend.probed(small_case("loop-rnn", n=256, d=8, batch=1))
    assert not extend.probed(case, full=True)
    assert extend.check_length(1024) == 256 and extend.check_length(300) == 128
