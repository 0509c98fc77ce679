"""The allocator's state and the page-fault accounting, driven by fakes: a libc that records
its mallopt calls, a fault counter that says what the test decides, a clock that ticks on
demand. Nothing here is timed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from io import StringIO
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console
from synthetic import case, cases_grid, make_run
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.cli.summary import fault_notes, summary_notes
from attnbench.compare import compare_runs
from attnbench.errors import AttnbenchError
from attnbench.formats import RawRun, migrate_run
from attnbench.measure.case import measure_case
from attnbench.measure.timing import allocator
from attnbench.measure.timing.allocator import (
    M_ARENA_MAX,
    M_MMAP_MAX,
    M_TRIM_THRESHOLD,
    run_state,
    set_allocator,
)
from attnbench.measure.timing.faults import fault_cost_s, fault_counter
from attnbench.measure.timing.loop import TimingPolicy, time_call
from attnbench.options import build_grid, grid_from_config

runner = CliRunner()


class FakeLibc:
    """glibc as far as the allocator module sees it: mallopt calls are recorded."""

    def __init__(self, version: bytes | None = b"2.36", accepts: bool = True) -> None:
        self.calls: list[tuple[int, int]] = []
        self.version = version
        self.accepts = accepts

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return 1 if self.accepts else 0

    def gnu_get_libc_version(self) -> bytes:
        if self.version is None:
            raise AttributeError("gnu_get_libc_version")  # not glibc
        return self.version


@pytest.fixture
def fresh_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """As if this process had never set its allocator."""
    monkeypatch.setattr(allocator, "_current", None)
    yield


def no_thp() -> str:
    return ""


def test_pinned_sets_the_three_glibc_parameters(fresh_process: None) -> None:
    libc = FakeLibc()
    state = set_allocator("pinned", libc, huge=no_thp)
    assert libc.calls == [(M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, -1), (M_ARENA_MAX, 1)]
    assert state.to_dict() == {
        "state": "pinned",
        "mechanism": "mallopt M_MMAP_MAX=0, M_TRIM_THRESHOLD=-1, M_ARENA_MAX=1",
        "libc": "glibc 2.36",
    }
    assert set_allocator("pinned", libc, huge=no_thp) is state and len(libc.calls) == 3


def test_system_touches_nothing_and_a_pinned_process_cannot_go_back(fresh_process: None) -> None:
    libc = FakeLibc()
    state = set_allocator("system", libc)
    assert libc.calls == [] and state.state == "system" and state.libc == "glibc 2.36"
    set_allocator("pinned", libc, huge=no_thp)  # system -> pinned: from now on
    with pytest.raises(AttnbenchError, match="pinned already; --allocator system needs a fresh"):
        set_allocator("system", libc)


def test_a_refused_mallopt_and_a_libc_that_is_not_glibc(fresh_process: None) -> None:
    with pytest.raises(AttnbenchError, match=r"glibc 2\.36 refused mallopt M_MMAP_MAX"):
        set_allocator("pinned", FakeLibc(accepts=False))
    elsewhere = set_allocator("pinned", FakeLibc(version=None), huge=no_thp)
    assert elsewhere.state == "system" and elsewhere.mechanism.startswith("not glibc")
    with pytest.raises(AttnbenchError, match="--allocator 'jemalloc': accepted: pinned, system"):
        set_allocator("jemalloc", FakeLibc())


def test_pinned_asks_for_huge_pages_and_records_what_took(
    fresh_process: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Six fresh processes timed ssm-scan at n = 512 24-28% apart on 4 KiB pages and 3-7% on
    huge ones: pinned asks torch for them (its THP_MEM_ALLOC_ENABLE) and says what took."""
    monkeypatch.delenv(allocator.THP_ENV, raising=False)
    took = allocator.ask_huge_pages(kernel=lambda: "madvise", probe=lambda: allocator.TAKEN)
    assert took == (
        "; huge pages for tensors of 2 MiB or more (THP_MEM_ALLOC_ENABLE=1, the kernel's "
        "THP: madvise)"
    )
    assert os.environ[allocator.THP_ENV] == "1"  # for this process's torch and its children
    never = allocator.ask_huge_pages(kernel=lambda: "never", probe=lambda: allocator.TAKEN)
    assert never == "; no huge pages (the kernel's THP: never)"
    late = allocator.ask_huge_pages(kernel=lambda: "madvise", probe=lambda: allocator.UNADVISED)
    assert "no huge pages (torch had allocated in this process before" in late
    off = allocator.ask_huge_pages(kernel=lambda: "madvise", probe=lambda: allocator.REFUSED)
    assert "no huge pages (THP is off for this process" in off  # advised, not eligible
    unread = allocator.ask_huge_pages(kernel=lambda: "madvise", probe=lambda: None)
    assert unread.startswith("; huge pages asked for (THP_MEM_ALLOC_ENABLE=1), not verified")
    monkeypatch.delenv(allocator.THP_ENV)
    assert allocator.ask_huge_pages(kernel=lambda: None, probe=lambda: allocator.TAKEN) == ""
    assert allocator.THP_ENV not in os.environ  # not Linux: nothing asked
    state = set_allocator("pinned", FakeLibc(), huge=lambda: "; huge")
    assert state.mechanism.endswith("M_ARENA_MAX=1; huge")
    monkeypatch.setattr(allocator, "_current", None)
    system = set_allocator("system", FakeLibc(), huge=lambda: "; huge").mechanism
    assert system == "glibc's defaults (dynamic mmap and trim thresholds)"  # asks for nothing
    monkeypatch.setattr(allocator, "_current", None)
    monkeypatch.setenv(allocator.THP_ENV, "1")  # the user's shell asked: the record says so
    system = set_allocator("system", FakeLibc(), huge=lambda: "; huge").mechanism
    assert system.endswith("; THP_MEM_ALLOC_ENABLE=1 from the environment")


SMAPS_LINES = """\
55d0a000-55d0c000 rw-p 00000000 00:00 0                          [heap]
Size:                  8 kB
THPeligible:           0
VmFlags: rd wr mr mw me ac
7f0000000000-7f0000800000 rw-p 00000000 00:00 0
Size:               8192 kB
AnonHugePages:      8192 kB
THPeligible:           1
VmFlags: rd wr mr mw me ac hg
7f0000800000-7f0000900000 r--p 00000000 08:01 42                 /usr/lib/libc.so.6
VmFlags: rd mr mw me
""".splitlines()


def test_the_smaps_mapping_holding_an_address_is_read_field_by_field() -> None:
    fields = allocator._mapping_fields(0x7F0000400000, SMAPS_LINES)
    assert fields is not None
    assert fields["THPeligible"] == "1" and "hg" in fields["VmFlags"].split()
    assert fields["AnonHugePages"] == "8192 kB"
    heap = allocator._mapping_fields(0x55D0A100, SMAPS_LINES)
    assert heap is not None and heap["THPeligible"] == "0"
    assert allocator._mapping_fields(0x7F0000800000, SMAPS_LINES) == {"VmFlags": "rd mr mw me"}
    assert allocator._mapping_fields(0x1000, SMAPS_LINES) is None


HUGE_IN_A_FRESH_PROCESS = """
import json, torch
from attnbench.measure.timing import allocator
state = allocator.set_allocator("pinned")
print(json.dumps({"mechanism": state.mechanism, "pages": allocator._probe_pages()}))
"""


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads Linux's smaps")
def test_a_fresh_pinned_processs_large_tensors_are_marked_for_huge_pages() -> None:
    """What a job's process does, in a fresh one: its large tensors' mapping carries smaps'
    hg flag where the kernel allows THP, and the record says so either way."""
    if allocator.glibc_version(allocator._libc()) is None:
        pytest.skip("not glibc: nothing is pinned")
    env = {k: v for k, v in os.environ.items() if k != allocator.THP_ENV}
    done = subprocess.run(
        [sys.executable, "-c", HUGE_IN_A_FRESH_PROCESS],
        capture_output=True, text=True, check=True, env=env,
    )  # fmt: skip
    found = json.loads(done.stdout.strip().splitlines()[-1])
    mode = allocator._kernel_thp()
    if mode in ("madvise", "always"):
        assert found["pages"] == allocator.TAKEN
        assert "huge pages for tensors of 2 MiB" in found["mechanism"]
    else:
        assert "huge pages for" not in found["mechanism"]


def test_the_run_records_its_workers_state() -> None:
    pinned = {"state": "pinned", "mechanism": "m", "libc": "glibc 2.36"}
    system = {"state": "system", "mechanism": "s", "libc": "glibc 2.36"}
    assert run_state([{"allocator": pinned}, {"allocator": pinned}]) == pinned
    assert run_state([{"allocator": pinned}, {"allocator": system}])["state"] == "mixed"
    assert run_state([{"pid": 1}])["state"] == "unrecorded"  # an older attnbench's worker


def test_the_grid_pins_by_default_and_an_old_run_resumes_as_it_was_measured() -> None:
    assert build_grid({"layers": "conv"}).allocator == "pinned"
    assert build_grid({"layers": "conv", "allocator": "system"}).allocator == "system"
    old = {"layers": ["conv"], "ns": [64], "ds": [64], "device": "cpu"}  # before --allocator

    def recorded(config: dict[str, object]) -> str:  # as a version-1 folder loads
        raw = RawRun({"schema_version": 1, "config": config}, *[pd.DataFrame()] * 2, None, {})
        return grid_from_config(migrate_run(raw, "old").meta["config"]).allocator

    assert recorded(old) == "system"
    assert recorded({**old, "allocator": "pinned"}) == "pinned"
    bad = runner.invoke(app, ["sweep", "--allocator", "tcmalloc", "--out", "never"])
    assert bad.exit_code == 2
    assert "--allocator 'tcmalloc': accepted: pinned, system" in bad.stderr
    assert not Path("never").exists()


# ----------------------------------------------------------------------------- fault accounting


class Ticking:
    """A clock that advances 1 ms per call of the function it times, and a fault counter that
    adds what the test says each call faults."""

    def __init__(self, faults_of_call: list[int]) -> None:
        self.now = 0.0
        self.calls = 0
        self.minor = 0
        self.major = 0
        self.faults_of_call = faults_of_call

    def fn(self) -> None:
        self.now += 1e-3
        self.minor += self.faults_of_call[min(self.calls, len(self.faults_of_call) - 1)]
        self.major += 1 if self.calls == 30 else 0
        self.calls += 1

    def clock(self) -> float:
        return self.now

    def faults(self) -> tuple[int, int]:
        return self.minor, self.major


@pytest.mark.slow
def test_faults_are_counted_per_timed_block_outside_the_warm_up() -> None:
    # Warm-up calls fault 5000 each; every later call 40, except call 42, which faults 8000.
    # 40 a call never settles the heap (``_settle_heap``): its 20 calls pass, then the samples.
    tick = Ticking([5000, 5000, *[40] * 40, 8000, *[40] * 100])
    policy = TimingPolicy(warmup_calls=2, min_block_s=2e-3, min_samples=10, budget_s=0.05)
    stats = time_call(tick.fn, policy, clock=tick.clock, faults=tick.faults)
    assert stats.calls_per_sample == 3  # 1 ms calls in blocks of 1.25 x 2 ms, rounded up
    assert stats.faults is not None and len(stats.faults) == stats.count
    assert stats.faults.count(40.0) == stats.count - 1  # every block but one: 40 per call
    assert max(stats.faults) == (8000 + 2 * 40) / 3  # the heap grew once, inside one block
    assert stats.page_faults == 40.0  # the median block's, as time is the median's
    assert stats.major_faults == 1 and stats.major_per_call == 1 / (3 * stats.count)
    other = Ticking([7])
    plain = time_call(other.fn, policy, clock=other.clock)
    assert plain.faults is None and plain.page_faults is None


def test_a_heap_still_growing_is_settled_before_the_samples() -> None:
    """A fresh process's heap grows over its first calls: explicit attention at n = 1024
    faulted its 16 MiB of weights (4,098 pages) in four of its first five calls. The calls
    after the warm-up go on until two in a row fault no more than a few pages; the samples
    then pay none. Without settling (settle_s 0) the first samples pay the growth."""
    from attnbench.measure.timing.loop import SETTLE_MAX_CALLS

    growing = [4048, 4099, 4098, 2, 4098, 13, 0, 0, 0, 8, 4, *[0] * 200]
    policy = TimingPolicy(warmup_calls=1, min_block_s=1e-3, min_samples=5, budget_s=0.01)
    tick = Ticking(growing)
    stats = time_call(tick.fn, policy, clock=tick.clock, faults=tick.faults)
    assert stats.faults is not None and max(stats.faults) <= 16
    unsettled = Ticking(growing)
    plain = time_call(
        unsettled.fn, replace(policy, settle_s=0.0), clock=unsettled.clock, faults=unsettled.faults
    )
    assert plain.faults is not None and max(plain.faults) >= 4000
    # a heap that faults on every call is not waited for past the limit
    counted = []
    for settle_s in (1.0, 0.0):
        steady = Ticking([300])
        time_call(
            steady.fn, replace(policy, settle_s=settle_s), clock=steady.clock, faults=steady.faults
        )
        counted.append(steady.calls)
    assert counted[0] - counted[1] == SETTLE_MAX_CALLS


def test_a_settled_heap_that_grows_again_is_warm_up_not_a_sample() -> None:
    """A settled heap can grow again (a small block splits a freed tensor's place, and the next
    call carves it past the top): 5-14 of 48 rounds of attention and ssm-scan had a block of
    500-4,100 faults a call. Such a block is not a sample, up to three a round; a heap that
    grows more often than that grows as the layer runs, and every block is a sample again; a
    heap that never settled (faults every call) keeps its every block."""
    from attnbench.measure.timing.loop import MAX_GREW

    policy = TimingPolicy(warmup_calls=1, min_block_s=1e-3, min_samples=8, budget_s=1.0,
                          min_time_s=0.0, target_rel_ci=1.0)  # fmt: skip
    regrows = [4098, 0, 0, 0, 0, 0, 1025, 0, 0, 0, 1025, 0, *[0] * 300]  # twice, after settling
    tick = Ticking(regrows)
    stats = time_call(tick.fn, policy, clock=tick.clock, faults=tick.faults)
    assert stats.faults is not None and max(stats.faults) <= 16 and stats.count == 8
    assert stats.calls_per_sample == 1  # 1 ms calls: a block is one
    assert tick.calls == 1 + 2 + 8 + 2  # warm-up, settle, 8 samples and 2 blocks left out
    assert stats.left_out == 2  # and the round says so (samples.csv's blocks_left_out)
    often = Ticking([4098, 0, 0, *[0, 1025] * 300])  # grows every other call: all kept
    stats = time_call(often.fn, policy, clock=often.clock, faults=often.faults)
    assert stats.faults is not None and stats.count == 8 and often.calls == 1 + 2 + 8
    assert stats.faults == (0.0, 1025.0) * 4  # past the third, the three held come back
    assert stats.left_out == 0
    assert MAX_GREW == 3
    probe = Ticking([4098, 0, 0, 1025, *[0] * 300])  # the block that sizes the blocks grew
    stats = time_call(probe.fn, policy, clock=probe.clock, faults=probe.faults)
    assert stats.faults is not None and max(stats.faults) == 0 and probe.calls == 1 + 2 + 1 + 8
    assert stats.left_out == 1  # the probe block
    never = Ticking([300])  # never settles: every block a sample
    stats = time_call(never.fn, policy, clock=never.clock, faults=never.faults)
    assert stats.faults is not None and min(stats.faults) == 300 and never.calls == 1 + 20 + 8
    assert stats.left_out == 0


def test_the_warm_ups_quiet_calls_count_toward_a_settled_heap() -> None:
    """A warm-up call that faulted no more than a few pages is one of the two in a row that
    settle the heap: a 30 ms call (ssm-scan at n = 1024) is not called twice more for it."""
    policy = TimingPolicy(warmup_calls=2, min_block_s=1e-3, min_samples=4, budget_s=1.0,
                          min_time_s=0.0, target_rel_ci=1.0)  # fmt: skip
    quiet = Ticking([0])  # a heap that never grows: the warm-up's two calls settle it
    stats = time_call(quiet.fn, policy, clock=quiet.clock, faults=quiet.faults)
    assert stats.calls_per_sample == 1 and quiet.calls == 2 + stats.count  # no call between
    grew = Ticking([4098, 4098, 0])  # both warm-up calls grew it: two calls settle it after
    time_call(grew.fn, policy, clock=grew.clock, faults=grew.faults)
    assert grew.calls == quiet.calls + 2
    last = Ticking([4098, 0])  # the last warm-up call was quiet: one more
    time_call(last.fn, policy, clock=last.clock, faults=last.faults)
    assert last.calls == quiet.calls + 1


def test_the_cost_of_a_fault_is_the_first_touch_less_the_second() -> None:
    ticks = iter([0.0, 0.010, 0.010, 0.012])  # touched fresh: 10 ms; resident: 2 ms
    counts = iter([(100, 0), (4196, 0)])  # 4096 faults
    cost = fault_cost_s(4096, clock=lambda: next(ticks), faults=lambda: next(counts))
    assert cost == pytest.approx(0.008 / 4096)
    none = iter([(5, 0), (5, 0)])
    ticks = iter([0.0, 0.01, 0.01, 0.02])
    assert fault_cost_s(16, clock=lambda: next(ticks), faults=lambda: next(none)) is None


def test_faults_are_counted_on_the_cpu_only() -> None:
    assert fault_counter("cpu") is not None
    assert fault_counter("cuda:0") is None and fault_counter("mps") is None


def test_a_measured_case_carries_the_counters_faults_to_its_row(tmp_path: Path) -> None:
    (case,) = build_grid({"layers": "conv", "n": "16", "d": "8", "device": "cpu"}).cases()
    minor = iter(range(0, 10**9, 300))  # 300 more at every reading: 300 per block
    result = measure_case(
        case, policy=TimingPolicy(min_samples=3, budget_s=0.01), faults=lambda: (next(minor), 0)
    )
    assert result.status == "ok" and result.timing is not None
    calls = result.timing.calls_per_sample
    assert result.to_row()["page_faults"] == 300 / calls
    assert result.to_row()["major_faults"] == 0
    untimed = measure_case(case, policy=TimingPolicy(min_samples=3, budget_s=0.01), faults=None)
    assert untimed.to_row()["page_faults"] is None  # a device whose faults are not counted


# ----------------------------------------------------------------------------- what users see


def _run(tmp_path: Path, name: str, state: str, faults: float, cost: float | None = 2e-6):
    allocator_record = {"state": state, "mechanism": "", "libc": "glibc 2.36"}
    return make_run(
        tmp_path / name,
        cases_grid(conv_64={"faults": faults}),
        meta={"allocator": allocator_record, "fault_cost_s": cost},
    )


def test_the_summary_flags_a_case_whose_faults_cost_much_of_its_time(tmp_path: Path) -> None:
    # 500 faults at 2 µs on 2 threads: 0.5 ms of a 1 ms call.
    system = _run(tmp_path, "system", "system", 500.0)
    notes = fault_notes(system)
    assert len(notes) == 1
    assert notes[0].startswith("1 case(s) spent over 20% of their time in page faults (up to 50%")
    assert "conv) with the allocator system: --allocator pinned (the default)" in notes[0]
    assert fault_notes(_run(tmp_path, "few", "system", 150.0)) == []  # 15%: not flagged
    assert fault_notes(_run(tmp_path, "uncosted", "system", 500.0, cost=None)) == []
    pinned = fault_notes(_run(tmp_path, "pinned", "pinned", 500.0))
    assert "with the allocator pinned: the layer touches memory it never touched" in pinned[0]
    buf = StringIO()
    summary_notes(system, Console(file=buf, width=400))
    assert "spent over 20% of their time in page faults" in buf.getvalue()
    assert system.frame.set_index("layer").loc["conv"]["page_faults"].tolist()[1] == 500.0
    on_gpu = system.frame.assign(device="cuda:0", page_faults=None)
    gpu = type(system)(system.path, on_gpu, system.samples, system.meta)
    assert fault_notes(gpu) == [
        "page faults are not counted on cuda:0: its tensors live in device memory"
    ]


def test_the_summary_counts_the_blocks_left_out_and_samples_csv_keeps_them(
    tmp_path: Path,
) -> None:
    """A round that leaves blocks out of its samples (its heap grew again in them) records how
    many in samples.csv, for each of its samples; the summary counts them, and says nothing
    where none was, or none was recorded (an older folder)."""
    grid = cases_grid(conv_64={"left_out": [2, 0, 1, 0, 0]}, rnn_128={"left_out": [0, 3, 0, 0, 0]})
    run = make_run(tmp_path / "left", grid)
    conv = run.samples[run.samples["case_id"] == case("conv", 64).case_id]
    assert conv.groupby("round")["blocks_left_out"].unique().map(list).tolist() == [
        [2.0],
        [0.0],
        [1.0],
        [0.0],
        [0.0],
    ]
    (note,) = [n for n in fault_notes(run) if "left out" in n]
    assert note.startswith("6 timed block(s) in 3 round(s) of 2 case(s) were left out")
    assert "(samples.csv's blocks_left_out)" in note
    none = make_run(tmp_path / "none", cases_grid(conv_64={"left_out": [0] * 5}))
    assert not [n for n in fault_notes(none) if "left out" in n]
    unrecorded = make_run(tmp_path / "old", cases_grid())  # written without a count
    assert unrecorded.samples["blocks_left_out"].isna().all()
    assert not [n for n in fault_notes(unrecorded) if "left out" in n]


def test_compare_warns_when_the_two_runs_measured_in_different_states(tmp_path: Path) -> None:
    base = _run(tmp_path, "base", "system", 0.0)
    same = _run(tmp_path, "same", "system", 0.0)
    pinned = _run(tmp_path, "pinned", "pinned", 0.0)
    assert not [w for w in compare_runs(base, same).warnings if "allocator" in w]
    (warning,) = [w for w in compare_runs(base, pinned).warnings if "allocator" in w]
    assert warning.startswith("allocator differs: 'system' in the baseline, 'pinned' in the")
    old = make_run(tmp_path / "old", cases_grid())  # before the record existed
    assert old.allocator == "unrecorded"
    assert any("'unrecorded' in the baseline" in w for w in compare_runs(old, pinned).warnings)


@pytest.mark.slow
def test_a_sweep_records_its_state_and_system_shows_the_faults(tmp_path: Path) -> None:
    """Fresh processes, as a user runs them: the state in run.json, the faults in results.csv.
    Whether a given case faults is the allocator's business; what is pinned here is that the
    record follows the option and the column is filled on the CPU."""
    rows = {}
    for state in ("pinned", "system"):
        out = tmp_path / state
        done = subprocess.run(
            [sys.executable, "-m", "attnbench", "sweep", "--layers", "attention", "--n", "256",
             "--d", "32", "--time-budget", "0.02", "--no-charts", "--quiet",
             "--allocator", state, "--out", str(out)],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        meta = json.loads((out / "run.json").read_text())
        assert meta["allocator"]["state"] == state and meta["config"]["allocator"] == state
        assert meta["cluster"]["workers"][0]["allocator"]["state"] == state
        assert isinstance(meta["fault_cost_s"], float) and meta["fault_cost_s"] > 0
        rows[state] = (out / "results.csv").read_text()
        samples = (out / "samples.csv").read_text().splitlines()
        column = samples[0].split(",").index("page_faults")
        assert all(line.split(",")[column] != "" for line in samples[1:])
    assert "page_faults" in rows["pinned"].splitlines()[0]


class TrimmingLibc(FakeLibc):
    def __init__(self, version: bytes | None = b"2.36") -> None:
        super().__init__(version)
        self.trims: list[int] = []

    def malloc_trim(self, pad: int) -> int:
        self.trims.append(pad)
        return 1


def test_freed_memory_is_given_back_only_where_glibc_can() -> None:
    libc = TrimmingLibc()
    assert allocator.release_freed(libc) and libc.trims == [0]
    assert not allocator.release_freed(FakeLibc())  # a glibc without malloc_trim
    elsewhere = TrimmingLibc(version=None)  # not glibc
    assert not allocator.release_freed(elsewhere) and elsewhere.trims == []


RSS_AFTER_CEILINGS = """
import json
import torch
from attnbench.measure.timing.allocator import set_allocator
from attnbench.measure.machine.probes import Probes, measure_ceilings

def rss() -> int:
    line = next(l for l in open("/proc/self/status") if l.startswith("VmRSS"))
    return int(line.split()[1]) * 1024

set_allocator("pinned")
before = rss()
measure_ceilings("cpu", "float32", 1, probes=Probes(
    gemm_side=64, stream_numel=2**26, elementwise_ops=("add",), passes=1,
    curve_widths={"gemm": (8,), "conv": (8,), "attention": (8,), "recurrent": (8,)},
))
print(json.dumps({"grew": rss() - before}))
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads Linux's VmRSS")
def test_a_pinned_process_keeps_nothing_of_the_ceilings_copy() -> None:
    """Two 256 MiB arrays are copied; a pinned heap would keep them (512 MiB) for the run."""
    if allocator.glibc_version(allocator._libc()) is None:
        pytest.skip("not glibc: nothing is pinned")
    done = subprocess.run(
        [sys.executable, "-c", RSS_AFTER_CEILINGS], capture_output=True, text=True, check=True
    )
    grew = json.loads(done.stdout.strip().splitlines()[-1])["grew"]
    assert grew < 128 * 2**20


def test_compare_warns_when_one_run_had_huge_pages_and_the_other_not(tmp_path: Path) -> None:
    """A baseline from before attnbench asked for huge pages reads memory-bound cases slower:
    the comparison says so, and says nothing when both runs took the same pages."""
    huge = "mallopt M_MMAP_MAX=0; huge pages for tensors of 2 MiB or more (THP_MEM_ALLOC_ENABLE=1)"
    runs = {}
    never = "mallopt M_MMAP_MAX=0; no huge pages (the kernel's THP: never)"
    mechanisms = (("old", "mallopt M_MMAP_MAX=0"), ("new", huge), ("again", huge), ("off", never))
    for name, mechanism in mechanisms:
        record = {"state": "pinned", "mechanism": mechanism, "libc": "glibc 2.36"}
        runs[name] = make_run(tmp_path / name, cases_grid(), meta={"allocator": record})
    (warning,) = [w for w in compare_runs(runs["old"], runs["new"]).warnings if "huge" in w]
    assert warning.startswith(
        "huge pages differ: not taken in the baseline, taken in the current run"
    )
    assert not [w for w in compare_runs(runs["new"], runs["again"]).warnings if "huge" in w]
    assert not [w for w in compare_runs(runs["old"], runs["off"]).warnings if "huge" in w]


def test_the_record_of_huge_pages_is_read_back_in_its_own_words(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What ask_huge_pages writes, huge_pages reads: one set of words for both."""
    monkeypatch.delenv(allocator.THP_ENV, raising=False)  # restored after the test
    written = {
        "taken": allocator.ask_huge_pages(lambda: "madvise", lambda: allocator.TAKEN),
        "asked, not verified": allocator.ask_huge_pages(lambda: "madvise", lambda: None),
        "not taken": allocator.ask_huge_pages(lambda: "never", lambda: allocator.TAKEN),
    }
    for read, words in written.items():
        assert allocator.huge_pages({"mechanism": "mallopt M_MMAP_MAX=0" + words}) == read
    assert allocator.huge_pages({}) == "not taken"  # an older record
