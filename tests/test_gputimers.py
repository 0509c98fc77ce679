"""The timers beside the default blocks (kernels, cold) and the GPU's clock on record, driven by
fakes: a fake CUDA device whose kernels take a set time on a fake clock, and a fake NVML."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from attnbench.compare.verdicts import (
    IMPROVEMENT,
    NOT_SIGNIFICANT,
    REGRESSION,
    THROTTLED,
    UNCHANGED,
    TimeVerdict,
    throttle,
)
from attnbench.errors import AttnbenchError
from attnbench.measure.timing import gputimers
from attnbench.measure.timing.clocks import clock_reader, median_clock, throttled_share
from attnbench.measure.timing.gputimers import BLOCKS_METHOD, time_step
from attnbench.measure.timing.loop import Stop, TimingPolicy, sample_until
from attnbench.options import build_grid
from attnbench.schema import Timer


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeDevice:
    """A call costs ``host_s`` of the host's time and ``kernel_s`` of the device's; the eager
    call's time is their larger (the host issues while the device runs). A graph replay costs
    only its kernels; events see the kernels alone once the stream is held at least the host's
    time, and a cold call costs ``cold_extra_s`` more."""

    def __init__(
        self,
        clock: FakeClock,
        host_s: float,
        kernel_s: float,
        *,
        capturable: bool = True,
        cold_extra_s: float = 0.0,
        launch_s: float = 0.0,
    ) -> None:
        self.clock, self.host_s, self.kernel_s = clock, host_s, kernel_s
        self.capturable, self.cold_extra_s = capturable, cold_extra_s
        self.launch_s = launch_s  # a graph's own launch, seen by events around a lone replay
        self.captured: list[int] = []
        self.flushes = 0
        self.holds: list[float] = []

    def call(self) -> None:
        self.clock.advance(max(self.host_s, self.kernel_s))

    def capture(self, fn: Callable[[], object], calls: int) -> Callable[[], object]:
        if not self.capturable:
            raise RuntimeError("operation not permitted when stream is capturing\nmore")
        self.captured.append(calls)
        return lambda: self.clock.advance(calls * self.kernel_s)

    def event_time(self, fn: Callable[[], object], hold_s: float, cold: bool) -> float:
        self.holds.append(hold_s)
        self.flushes += cold
        self.clock.advance(hold_s + max(self.host_s, self.kernel_s))
        launches = max(0.0, self.host_s - hold_s)  # the host still issuing when the hold ends
        return max(self.kernel_s, launches) + (self.cold_extra_s if cold else 0.0)

    def replay_time(self, replay: Callable[[], object]) -> float:
        start = self.clock()
        replay()
        self.clock.advance(self.launch_s)
        return self.clock() - start

    def flush_bytes(self) -> int:
        return 100_000_000


POLICY = TimingPolicy(warmup_calls=1, budget_s=0.05, min_time_s=0.0)


def timed(device: FakeDevice, clock: FakeClock, timer: Timer, **kw):  # type: ignore[no-untyped-def]
    policy = TimingPolicy(**{**POLICY.__dict__, "timer": timer.value, **kw})
    return time_step(device.call, policy, device="cuda:0", clock=clock, timers=device)


def test_the_blocks_timer_pays_the_host_where_the_host_is_slower() -> None:
    clock = FakeClock()
    device = FakeDevice(clock, host_s=50e-6, kernel_s=10e-6)
    found = timed(device, clock, Timer.BLOCKS)
    assert found.method == BLOCKS_METHOD
    assert found.stats.median_s == pytest.approx(50e-6)


def test_the_kernels_timer_replays_a_graph_and_reads_the_kernels_alone() -> None:
    clock = FakeClock()
    device = FakeDevice(clock, host_s=50e-6, kernel_s=10e-6)
    found = timed(device, clock, Timer.KERNELS)
    assert found.stats.median_s == pytest.approx(10e-6)
    # one call's graph, then one of enough calls for a replay of about GRAPH_S
    calls = min(gputimers.MAX_GRAPH_CALLS, math.ceil(gputimers.GRAPH_S / 10e-6))
    assert device.captured == [1, calls]
    assert found.method == (
        f"kernels: CUDA graph replays, {device.captured[-1]} call(s) a graph, each replay "
        "between CUDA events"
    )
    assert found.stats.calls_per_sample == device.captured[-1]


def test_the_kernels_timer_keeps_each_replays_own_launch_shared_by_its_calls() -> None:
    # as do_bench_cudagraph: one replay between events on an idle device pays the graph's
    # launch; replays queued back to back would hide it
    clock = FakeClock()
    device = FakeDevice(clock, host_s=50e-6, kernel_s=10e-6, launch_s=64e-6)
    found = timed(device, clock, Timer.KERNELS)
    calls = device.captured[-1]
    assert found.stats.median_s == pytest.approx(10e-6 + 64e-6 / calls)
    assert found.stats.median_s > 10e-6 * 1.05


def test_a_call_longer_than_a_graphs_target_is_captured_once() -> None:
    clock = FakeClock()
    device = FakeDevice(clock, host_s=1e-3, kernel_s=5e-3)
    found = timed(device, clock, Timer.KERNELS)
    assert device.captured == [1]
    assert found.stats.median_s == pytest.approx(5e-3)


def test_a_call_that_cannot_be_captured_is_timed_by_events_behind_a_held_stream() -> None:
    clock = FakeClock()
    device = FakeDevice(clock, host_s=50e-6, kernel_s=10e-6, capturable=False)
    found = timed(device, clock, Timer.KERNELS)
    # held longer than the host's time for a call, the events see the kernels alone
    assert all(h >= device.host_s for h in device.holds)
    assert found.stats.median_s == pytest.approx(10e-6)
    assert device.flushes == 0
    assert "behind a" in found.method
    assert "no graph: RuntimeError: operation not permitted" in found.method
    assert "\n" not in found.method


def test_the_cold_timer_flushes_before_every_sample_and_reads_the_cold_call() -> None:
    clock = FakeClock()
    device = FakeDevice(clock, host_s=50e-6, kernel_s=10e-6, cold_extra_s=4e-6)
    found = timed(device, clock, Timer.COLD)
    assert found.stats.median_s == pytest.approx(14e-6)
    assert device.flushes == found.stats.count + POLICY.warmup_calls
    assert found.method.startswith("cold: CUDA events") and "100 MB" in found.method


def test_a_hold_is_capped_so_a_slow_host_shows_in_the_time() -> None:
    clock = FakeClock()
    device = FakeDevice(clock, host_s=1.0, kernel_s=1e-3)
    found = timed(device, clock, Timer.COLD)
    assert max(device.holds) == gputimers.MAX_HOLD_S
    assert found.stats.median_s == pytest.approx(1.0 - gputimers.MAX_HOLD_S)


def test_the_gpu_timers_refuse_the_cpu() -> None:
    clock = FakeClock()
    device = FakeDevice(clock, 1e-6, 1e-6)
    policy = TimingPolicy(timer=Timer.KERNELS.value)
    with pytest.raises(ValueError, match="CUDA"):
        time_step(device.call, policy, device="cpu", clock=clock, timers=device)
    with pytest.raises(AttnbenchError, match="--timer kernels times CUDA kernels"):
        build_grid({"device": "cpu", "timer": "kernels", "n": "64", "d": "32"})
    with pytest.raises(AttnbenchError, match="unknown timer 'hot'"):
        build_grid({"device": "cpu", "timer": "hot", "n": "64", "d": "32"})
    assert build_grid({"device": "cpu", "n": "64", "d": "32"}).timer == "blocks"


def test_sample_until_stops_when_precise_and_throws_the_warm_up_away() -> None:
    clock = FakeClock()
    values = iter([9.0] + [1e-3] * 1000)

    def sample() -> float:
        clock.advance(2e-3)
        return next(values)

    stats = sample_until(sample, POLICY, clock=clock)
    assert 9.0 not in stats.samples_s
    assert stats.stop == Stop.PRECISE and stats.count == POLICY.min_samples
    assert stats.median_s == 1e-3


def test_sample_until_stops_when_holds_cost_more_than_the_budget_allows() -> None:
    clock = FakeClock()
    spread = iter([1e-6 * (1 + (i % 7)) for i in range(10_000)])

    def sample() -> float:  # noisy samples, never precise; each costs 10 ms of waiting
        clock.advance(10e-3)
        return next(spread)

    policy = TimingPolicy(warmup_calls=0, budget_s=0.05, min_time_s=0.0)
    stats = sample_until(sample, policy, clock=clock)
    assert stats.stop == Stop.BUDGET
    assert stats.count == 20  # 4 x the budget of waiting, at 10 ms a sample


def test_the_clock_is_read_after_every_sample_but_not_the_calibration() -> None:
    clock = FakeClock()
    device = FakeDevice(clock, host_s=20e-6, kernel_s=10e-6)
    readings = iter(range(1, 100_000))
    policy = TimingPolicy(**{**POLICY.__dict__})
    found = time_step(
        device.call,
        policy,
        device="cuda:0",
        clock=clock,
        timers=device,
        read_clock=lambda: float(next(readings)),
    )
    clocks = found.stats.clocks_mhz
    assert clocks is not None and len(clocks) == found.stats.count
    assert list(clocks) == sorted(clocks)  # one reading a sample, in order


class FakeNvml:
    NVML_CLOCK_SM = 1

    def __init__(self, clocks: list[float], top: float = 1980.0, fail: bool = False) -> None:
        self.clocks, self.top, self.fail = iter(clocks), top, fail

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:  # NVML's names
        raise RuntimeError("not found")

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        if self.fail:
            raise RuntimeError("NVML_ERROR_UNINITIALIZED")
        return f"gpu{index}"

    def nvmlDeviceGetMaxClockInfo(self, handle: str, kind: int) -> float:
        return self.top

    def nvmlDeviceGetClockInfo(self, handle: str, kind: int) -> float:
        return next(self.clocks)


def test_the_clock_reader_reads_nvml_and_none_where_it_cannot(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import torch

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: object())
    reader = clock_reader("cuda:0", FakeNvml([1980.0, 1410.0]))
    assert reader is not None and reader.max_mhz == 1980.0
    assert [reader.read(), reader.read()] == [1980.0, 1410.0]
    assert clock_reader("cpu", FakeNvml([])) is None
    assert clock_reader("cuda:0", FakeNvml([], fail=True)) is None


def test_samples_under_three_quarters_of_the_maximum_clock_are_throttled() -> None:
    clocks = [1980.0, 1980.0, 1400.0, None, 1500.0]
    assert throttled_share(clocks, 1980.0) == pytest.approx(1 / 4)  # 1400 < 1485 <= 1500
    assert throttled_share(clocks, None) is None
    assert throttled_share([None, None], 1980.0) is None
    assert median_clock(clocks) == pytest.approx(1740.0)


@pytest.mark.parametrize(
    ("verdict", "clock_ratio", "shares", "expected"),
    [
        (REGRESSION, 0.80, (None, None), THROTTLED),  # the card ran 20% slower on the new side
        (IMPROVEMENT, 1.25, (None, None), THROTTLED),
        (NOT_SIGNIFICANT, 0.9, (None, None), THROTTLED),
        (REGRESSION, 0.98, (None, None), REGRESSION),  # within the tolerance: the code's
        (REGRESSION, math.nan, (None, None), REGRESSION),  # no clock read (the CPU)
        (REGRESSION, 1.0, (0.0, 0.6), THROTTLED),  # most of a side's samples throttled
        (REGRESSION, 1.0, (0.2, 0.1), REGRESSION),
        (UNCHANGED, 0.5, (1.0, 1.0), UNCHANGED),  # nothing moved: nothing to explain
        (REGRESSION, 1.0, (0.5, None), THROTTLED),  # half its samples: most, at the edge
        (REGRESSION, 0.0, (None, None), REGRESSION),  # no clock (a ratio that reads nothing)
        (REGRESSION, math.inf, (None, None), REGRESSION),
    ],
)
def test_a_move_the_gpus_clock_explains_is_throttled(
    verdict: str, clock_ratio: float, shares: tuple[float | None, float | None], expected: str
) -> None:
    judged = throttle(TimeVerdict(1.3, 1e-4, verdict), clock_ratio, shares)
    assert judged.verdict == expected
    assert judged.ratio == 1.3 and judged.p_value == 1e-4


def test_the_split_on_cuda_reads_the_kernels_from_graph_replays() -> None:
    clock = FakeClock()
    device = FakeDevice(clock, host_s=50e-6, kernel_s=10e-6)
    found = gputimers.device_split(device.call, "cuda:0", 50e-6, clock=clock, timers=device)
    assert found.kernel_s == pytest.approx(10e-6)
    assert found.share == pytest.approx(0.2)
    assert found.method.startswith("CUDA graph replays")


def test_a_split_of_a_call_that_cannot_be_captured_falls_back_to_the_profiler(
    monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    from attnbench.measure.timing import split

    clock = FakeClock()
    device = FakeDevice(clock, host_s=50e-6, kernel_s=10e-6, capturable=False)
    profiled = split.KernelSplit(0.3, 15e-6, 50e-6, 3, "profiled: the device's kernels")
    monkeypatch.setattr(gputimers, "kernel_split", lambda *a, **k: profiled)
    found = gputimers.device_split(device.call, "cuda:0", 50e-6, clock=clock, timers=device)
    assert found.share == 0.3
    assert found.method.startswith("profiled") and "(no graph: RuntimeError" in found.method


def test_a_profile_with_ops_and_no_device_kernel_is_no_split() -> None:
    from attnbench.measure.timing.split import OpEvent, Profiled, ProfilerCost, kernel_split

    empty = Profiled(2, 1e-4, 1e-4, [OpEvent("aten::mm", 5e-6, 0)], [])
    with pytest.raises(ValueError, match="no kernel on the device"):
        kernel_split(
            lambda: None, "cuda:0", 1e-4, 1, cost=ProfilerCost(1e-6, 1e-6),
            record=lambda fn, calls, device: empty,
        )  # fmt: skip


def test_the_clock_is_read_at_most_every_period_and_carried_between() -> None:
    from attnbench.measure.timing.clocks import every

    now = [0.0]
    reads = iter([1980.0, 1410.0, 1755.0])
    limited = every(lambda: next(reads), 0.05, clock=lambda: now[0])
    seen = []
    for t in (0.0, 0.01, 0.049, 0.05, 0.07, 0.2):
        now[0] = t
        seen.append(limited())
    assert seen == [1980.0, 1980.0, 1980.0, 1410.0, 1410.0, 1755.0]


def test_a_time_taken_from_graph_replays_is_not_split_again() -> None:
    clock = FakeClock()
    device = FakeDevice(clock, host_s=50e-6, kernel_s=10e-6)
    timed = time_step(device.call, TimingPolicy(**{**POLICY.__dict__, "timer": "kernels"}),
                               "cuda:0", clock=clock, timers=device)  # fmt: skip
    captured = list(device.captured)
    found = gputimers.device_split(device.call, "cuda:0", timed.stats.median_s, clock=clock,
                                   replays=timed.replays, timers=device)  # fmt: skip
    assert device.captured == captured  # no graph captured again
    assert found.share == 1.0 and found.kernel_s == timed.stats.median_s
