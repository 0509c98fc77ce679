"""Robust sweeps: out-of-memory, timeouts, skips, signals, resume and damaged files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from synthetic import samples_for

from attnbench.errors import AttnbenchError, SweepInterrupted
from attnbench.layers import REGISTRY, LayerEntry, LayerSource
from attnbench.measure.case import is_out_of_memory, measure_case
from attnbench.measure.record import DIED_ERROR, CaseResult
from attnbench.measure.step import release_memory
from attnbench.options import build_grid
from attnbench.results.environment import environment
from attnbench.results.files import RESULTS_FILE, RUN_FILE, SAMPLES_FILE
from attnbench.results.loader import load_results
from attnbench.results.record import process_start
from attnbench.results.store import ResultsWriter
from attnbench.run.events import Listeners, ProgressEvent, SweepStart
from attnbench.run.executors import serial as serial_module
from attnbench.run.executors import worker as worker_module
from attnbench.run.executors.serial import SerialExecutor
from attnbench.run.queue import UNCALIBRATED
from attnbench.run.sweep import resume_sweep, run_sweep
from attnbench.spec import Case, Grid


def _grid(layers: str = "conv,rnn", n: str = "8,16,32", d: str = "8", **extra: object) -> Grid:
    """One round a case unless told: these tests are about cases, not rounds."""
    options = {"layers": layers, "n": n, "d": d, "device": "cpu", "time_budget": 0.002}
    return build_grid({**options, "processes": 1, **extra})


def _ids(grid: Grid) -> list[str]:
    return [case.case_id for case in grid.cases()]


# ----------------------------------------------------------------------------- fake layers


def _register(monkeypatch: pytest.MonkeyPatch, name: str, module: type[torch.nn.Module]) -> None:
    entry = LayerEntry(name, module, source=LayerSource("python", f"tests:{name}"))
    monkeypatch.setitem(REGISTRY, name, entry)


OOM_ERRORS: dict[str, Callable[[], BaseException]] = {
    "cuda": lambda: torch.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 64.00 GiB (GPU 0; 79.1 GiB total capacity)"
    ),
    "cpu": lambda: RuntimeError(
        "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: "
        "you tried to allocate 68719476736 bytes. Error code 12 (Cannot allocate memory)"
    ),
    "python": lambda: MemoryError(),
}


def _hungry(limit: int, kind: str) -> type[torch.nn.Module]:
    """A layer that runs out of memory once n * d exceeds ``limit``."""

    class Hungry(torch.nn.Module):
        def __init__(self, d: int) -> None:
            super().__init__()
            self.d = d

        def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, n, d) -> (B, n, d)
            if x.shape[1] * x.shape[2] > limit:
                raise OOM_ERRORS[kind]()
            return x * 2

    return Hungry


@pytest.mark.parametrize("kind", sorted(OOM_ERRORS))
def test_every_kind_of_allocation_failure_makes_an_oom_case(
    monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    _register(monkeypatch, "hungry", _hungry(0, kind))
    result = measure_case(Case("hungry", 8, 8, 1, "float32", "cpu", "forward"))
    assert result.status == "oom" and result.timing is None


def test_oom_is_recorded_larger_cases_skipped_and_memory_released(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _register(monkeypatch, "hungry", _hungry(16 * 8, "cuda"))
    released: list[str] = []
    monkeypatch.setattr(worker_module, "release_memory", released.append)
    grid = build_grid(
        {"layers": "conv", "n": "8..64", "d": "8,16", "device": "cpu", "time_budget": 0.002}
    )
    grid = Grid(**{**grid.__dict__, "layers": ("hungry", "conv")})
    run = run_sweep(grid, tmp_path / "run", measuring=UNCALIBRATED)
    status = {(r.layer, r.n, r.d): r.status for r in run.frame.itertuples()}
    assert status[("hungry", 8, 8)] == "ok" and status[("hungry", 16, 8)] == "ok"
    assert status[("hungry", 32, 8)] == "oom"
    # Larger n at the same d, and larger n at a larger d, would fail too: skipped, not run.
    assert status[("hungry", 64, 8)] == "skipped"
    assert status[("hungry", 8, 16)] == "ok"  # smaller n at a larger d still runs
    assert status[("hungry", 16, 16)] == "oom"
    assert status[("hungry", 32, 16)] == "skipped" and status[("hungry", 64, 16)] == "skipped"
    assert all(s == "ok" for (layer, _, _), s in status.items() if layer == "conv")
    assert released == ["cpu", "cpu"]  # once after each out-of-memory case
    skipped = run.frame[run.frame["status"] == "skipped"]
    assert skipped["error"].str.startswith("after hungry n=").all()
    assert skipped["time_s"].isna().all()
    assert run.counts() == {"ok": 11, "oom": 2, "timeout": 0, "skipped": 3, "failed": 0}
    assert len(run.measured) == 11 and run.status == "complete"


def test_out_of_memory_is_recognised_on_every_device() -> None:
    for make in OOM_ERRORS.values():
        assert is_out_of_memory(make())
    assert is_out_of_memory(RuntimeError("MPS backend out of memory (MPS allocated: 1 GB)"))
    assert not is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_out_of_memory(ValueError("out of range"))


def test_release_memory_empties_the_cuda_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty"))
    release_memory("cuda:0")
    release_memory("cpu")
    assert calls == ["empty"]


class FakeClock:
    """Deterministic time that layers advance as they 'run'."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_slow_first_call_is_a_timeout_and_larger_cases_are_skipped(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clock = FakeClock()

    class Slow(torch.nn.Module):
        def __init__(self, d: int) -> None:
            super().__init__()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            clock.now += x.shape[1] * 0.01  # 10 ms per position
            return x

    _register(monkeypatch, "slow", Slow)
    grid = build_grid(
        {"layers": "conv", "n": "8..64", "d": "8", "device": "cpu", "max_case_seconds": 0.25}
    )
    grid = Grid(**{**grid.__dict__, "layers": ("slow",), "time_budget_s": 1.0})
    # No calibration: under a clock that never moves, its GEMM blocks would grow to their cap.
    run = run_sweep(grid, tmp_path / "run", clock=clock, measuring=UNCALIBRATED)
    status = dict(zip(run.frame["n"], run.frame["status"], strict=True))
    assert status == {8: "ok", 16: "ok", 32: "timeout", 64: "skipped"}
    timeout = run.frame[run.frame["status"] == "timeout"].iloc[0]
    assert "over --max-case-seconds" in timeout["error"] and "320 ms" in timeout["error"]
    ok = run.frame[run.frame["n"] == 16].iloc[0]
    assert ok["time_s"] == pytest.approx(0.16)  # the fake clock is what was timed
    assert run.meta["config"]["max_case_s"] == 0.25


# ----------------------------------------------------------------------------- signals and resume


def _signal_after(done: int, *signals: int) -> Callable[[ProgressEvent], None]:
    """A progress callback that sends ``signals`` to this process after ``done`` cases."""

    def progress(event: ProgressEvent) -> None:
        if event.kind == "done" and event.completed == done:
            for sig in signals:
                os.kill(os.getpid(), sig)

    return progress


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_after_the_current_case_and_resume_finishes(
    tmp_path: Path, sig: int
) -> None:
    grid = _grid()
    out = tmp_path / "run"
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN when run in the background by a shell
    heard: list[ProgressEvent] = []
    signal_after_two = _signal_after(2, sig)

    def progress(event: ProgressEvent) -> None:
        heard.append(event)
        signal_after_two(event)

    with pytest.raises(SweepInterrupted) as info:
        run_sweep(grid, out, listeners=Listeners(progress=progress))
    # The signal came after a case was written, with none running: it is still answered.
    stopping = [e for e in heard if e.kind == "stopping"]
    assert len(stopping) == 1 and stopping[0].running == 0
    assert info.value.exit_code == 128 + sig  # 130 after SIGINT, 143 after SIGTERM
    assert f"attnbench sweep --resume {out}" in info.value.message
    stopped = load_results(out)
    assert stopped.status == "interrupted" and len(stopped.frame) == 2
    assert signal.getsignal(signal.SIGINT) is before  # handlers restored

    events: list[ProgressEvent] = []
    run = resume_sweep(out, listeners=Listeners(progress=events.append))
    assert list(run.frame["case_id"]) == _ids(grid)  # exactly the uninterrupted sweep's cases
    assert (run.frame["status"] == "ok").all() and run.status == "complete"
    assert [e.completed for e in events if e.kind == "done"] == [3, 4, 5, 6]
    for row in run.frame.itertuples():
        assert len(samples_for(run, row.case_id)) == row.samples
    assert len(run.meta["resumes"]) == 1 and not run.meta["resumes"][0]["forced"]


def test_a_signal_after_the_last_round_leaves_the_run_complete(tmp_path: Path) -> None:
    """Ctrl-C heard once every case had its rows: nothing is left for a --resume (its stop
    had said to finish the run with one), so the run ends complete."""
    grid, out = _grid(layers="conv", n="8,16"), tmp_path / "run"
    before = signal.getsignal(signal.SIGINT)
    run = run_sweep(grid, out, listeners=Listeners(progress=_signal_after(2, signal.SIGINT)))
    assert run.status == "complete" and list(run.frame["status"]) == ["ok", "ok"]
    assert signal.getsignal(signal.SIGINT) is before
    # one case short of the last: the stop is a stop
    early = Listeners(progress=_signal_after(1, signal.SIGINT))
    with pytest.raises(SweepInterrupted, match="stopped with 1 of 2 cases"):
        run_sweep(grid, tmp_path / "early", listeners=early)


def test_a_second_signal_as_a_round_is_written_is_a_stop_with_rounds_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two Ctrl-C as round 2 is written: the second lands before the queue has decided the
    case's next round, with nothing queued: the run is left to --resume, not marked complete."""
    from attnbench.results.store import ResultsWriter

    real = ResultsWriter.append_round

    def twice(self, case_id, round_, *args, **kwargs):  # type: ignore[no-untyped-def]
        written = real(self, case_id, round_, *args, **kwargs)
        if round_ == 2:  # the second, held while the round is written, is raised after it
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
        return written

    monkeypatch.setattr(ResultsWriter, "append_round", twice)
    grid = _grid(layers="conv", n="8", processes=2, max_processes=6, precision="0.0001")
    with pytest.raises(SweepInterrupted, match="finish it with: attnbench sweep --resume"):
        run_sweep(grid, tmp_path / "run", measuring=UNCALIBRATED)
    assert load_results(tmp_path / "run").status == "interrupted"


def test_ctrl_c_while_the_ceilings_are_measured_is_a_recorded_stop_and_resume_records_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ceilings take seconds before the first case: a Ctrl-C there left run.json
    'running', and a resume never recorded them (no predicted times, no bounds)."""
    from attnbench.run import sweep as sweep_module

    real = SerialExecutor.ceilings

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(SerialExecutor, "ceilings", interrupted)
    grid, out = _grid(n="8"), tmp_path / "run"
    with pytest.raises(SweepInterrupted) as info:
        run_sweep(grid, out)
    assert info.value.exit_code == 130
    assert info.value.message == (
        f"SIGINT: stopped with 0 of 2 cases in {out}; "
        f"finish it with: attnbench sweep --resume {out}"
    )
    stopped = load_results(out)
    assert stopped.status == "interrupted" and stopped.frame.empty
    assert stopped.meta.get("ceilings") is None
    with pytest.raises(SweepInterrupted, match="stopped with 0 of 2 cases"):
        resume_sweep(out)  # stopped again, at the same place
    monkeypatch.setattr(SerialExecutor, "ceilings", real)
    cached = sweep_module.ceilings_cached("cpu", "float32", torch.get_num_threads())
    starts: list[SweepStart] = []
    run = resume_sweep(out, listeners=Listeners(on_start=starts.append))
    assert starts[0].ceilings_cached is cached  # the start line says when they are measured
    assert run.status == "complete" and len(run.frame) == 2
    assert run.meta["ceilings"]["peak_flops_per_s"] > 0
    assert run.ceilings is not None


def test_ceilings_that_cannot_be_measured_say_why_and_the_run_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ray driver with fewer CPUs than --threads asks of the nodes cannot measure them: the
    run was left without ceilings and without a word."""
    import io

    from rich.console import Console

    from attnbench.cli.summary import summary_notes
    from attnbench.run.executors import base as base_module

    def refused(*args: object, **kwargs: object) -> None:
        raise AttnbenchError("--threads 8: this process may use 2 CPUs; choose at most 2")

    monkeypatch.setattr(base_module, "machine_ceilings", refused)
    run = run_sweep(_grid(n="8"), tmp_path / "run")
    assert run.status == "complete" and run.ceilings is None
    assert run.meta["ceilings_error"] == (
        "--threads 8: this process may use 2 CPUs; choose at most 2"
    )
    buffer = io.StringIO()
    summary_notes(run, Console(file=buffer, width=300))
    assert "no machine ceilings, so no predicted times or bounds: --threads 8" in buffer.getvalue()


@pytest.mark.slow
def test_a_second_signal_stops_at_once_and_the_torn_case_is_measured_again(
    tmp_path: Path,
) -> None:
    grid = _grid()
    out = tmp_path / "run"
    seen: list[str] = []

    def progress(event: ProgressEvent) -> None:
        seen.append(event.kind)
        if event.kind == "start" and event.completed == 1:
            os.kill(os.getpid(), signal.SIGINT)  # asks to stop after this case ...
            os.kill(os.getpid(), signal.SIGINT)  # ... and now: the case is abandoned

    with pytest.raises(SweepInterrupted):
        run_sweep(grid, out, listeners=Listeners(progress=progress))
    assert "stopping" in seen
    stopped = load_results(out)
    assert len(stopped.frame) == 1 and stopped.status == "interrupted"
    run = resume_sweep(out)
    assert list(run.frame["case_id"]) == _ids(grid)


def test_resume_refuses_changes_unless_forced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run"
    with pytest.raises(SweepInterrupted):
        run_sweep(_grid(), out, listeners=Listeners(progress=_signal_after(1, signal.SIGINT)))
    with pytest.raises(AttnbenchError, match=r"configuration differs .*ns \[8, 16, 32\] -> \[8"):
        resume_sweep(out, {"n": "8,16"})
    real = environment

    def other_torch(device: str = "cpu") -> dict[str, object]:
        return {**real(device), "torch_version": "9.9.9"}

    monkeypatch.setattr(serial_module, "environment", other_torch)
    with pytest.raises(AttnbenchError, match=r"environment differs .*\(torch '2\..*' -> '9.9.9'"):
        resume_sweep(out)  # named as a line says it: torch, attnbench's code, not their keys
    run = resume_sweep(out, {"n": "8,16"}, force=True)
    assert list(run.frame["case_id"]) == _ids(_grid(n="8,16"))  # the forced grid
    resume = run.meta["resumes"][0]
    assert resume["forced"] and resume["environment_changes"]["torch_version"][1] == "9.9.9"
    assert run.meta["config"]["ns"] == [8, 16]


def test_resuming_a_complete_run_measures_nothing(tiny_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(tiny_run.path, copy)
    before = (copy / RESULTS_FILE).read_text()
    run = resume_sweep(copy)
    assert (copy / RESULTS_FILE).read_text() == before and run.status == "complete"


def test_a_resumed_run_adds_no_round_to_a_case_whose_rounds_ended(  # type: ignore[no-untyped-def]
    tiny_run, tmp_path: Path
) -> None:
    """A complete run of three rounds a case whose second rounds read 10x the others'
    reference: judged again against the resume's own quiet level, each would lack a quiet
    round of --processes. Their rounds
    ended in the first session (run.json's round_stops), so the resume measures nothing."""
    import shutil

    import pandas as pd

    copy = tmp_path / "copy"
    shutil.copytree(tiny_run.path, copy)
    samples = pd.read_csv(copy / "samples.csv")
    samples = samples[samples["round"] <= 3].copy()  # every case's --processes, no more
    samples["reference_s"] = 1e-4
    samples.loc[samples["round"] == 2, "reference_s"] = 1e-3
    samples.to_csv(copy / "samples.csv", index=False)
    assert json.loads((copy / RUN_FILE).read_text())["round_stops"]  # recorded, case by case
    run = resume_sweep(copy)
    assert len(run.samples) == len(samples) and run.status == "complete"


@pytest.fixture
def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _killed_run(out: Path, grid: Grid, pid: int, done: int, died_in: int | None) -> None:
    """What a process killed with SIGKILL leaves: ``done`` rows, status running."""
    writer = ResultsWriter.create(out, grid.to_dict(), environment("cpu"))
    writer.update(cases_total=len(grid.cases()))
    for case in grid.cases()[:done]:
        writer.append(CaseResult(case=case, status="failed", threads=1, error="x"))
    if died_in is not None:
        writer.begin(grid.cases()[died_in])
    meta = json.loads((out / RUN_FILE).read_text())
    meta["pid"] = pid  # the process that wrote it, with its start (None: gone by now)
    meta["pid_start"] = process_start(pid)
    (out / RUN_FILE).write_text(json.dumps(meta))


@pytest.fixture
def killed(tmp_path: Path, dead_pid: int) -> tuple[Grid, Path]:
    """A conv sweep over n = 8..64 killed in its second case, its first recorded failed."""
    grid = _grid(layers="conv", n="8..64")
    out = tmp_path / "run"
    _killed_run(out, grid, dead_pid, done=1, died_in=1)
    return grid, out


def test_the_case_a_killed_process_died_in_is_failed_and_blocks_larger_ones(
    killed: tuple[Grid, Path],
) -> None:
    _, out = killed
    run = resume_sweep(out)
    assert list(run.frame["status"]) == ["failed", "failed", "skipped", "skipped"]
    assert run.frame["error"].iloc[1] == DIED_ERROR
    assert run.frame["error"].iloc[2] == "after conv n=16 d=8 crashed"


def test_retry_measures_again_the_failed_and_skipped_cases_and_the_one_died_in(
    killed: tuple[Grid, Path],
) -> None:
    """A kill (or a power cut) is blamed on the case it came in; ``retry`` takes the blame back:
    every case not ok is measured again, the ok ones are kept as they were, none twice."""
    _, out = killed
    blamed = resume_sweep(out)
    assert list(blamed.frame["status"]) == ["failed", "failed", "skipped", "skipped"]

    run = resume_sweep(out, retry=True)
    assert list(run.frame["status"]) == ["ok"] * 4 and run.frame["case_id"].is_unique
    assert run.status == "complete"
    assert set(run.samples["case_id"]) == set(run.frame["case_id"])
    retried = run.meta["resumes"][-1]["retried"]
    assert sorted(retried) == sorted(blamed.frame["case_id"])
    # Nothing left to retry: a second retry measures nothing and changes no row.
    before = (out / RESULTS_FILE).read_text()
    again = resume_sweep(out, retry=True)
    assert (out / RESULTS_FILE).read_text() == before
    assert again.meta["resumes"][-1]["retried"] == []


def test_retry_straight_after_a_kill_measures_the_case_it_died_in(
    killed: tuple[Grid, Path],
) -> None:
    grid, out = killed
    run = resume_sweep(out, retry=True)
    assert list(run.frame["status"]) == ["ok"] * 4
    # the case recorded failed, then the one the process was in when it was killed
    assert run.meta["resumes"][-1]["retried"] == [c.case_id for c in grid.cases()[:2]]


def test_a_run_still_being_written_is_not_resumed(tmp_path: Path) -> None:
    grid = _grid(layers="conv")
    out = tmp_path / "run"
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _killed_run(out, grid, alive.pid, done=1, died_in=None)
        with pytest.raises(AttnbenchError, match=f"process {alive.pid} .* may still be writing"):
            resume_sweep(out)
    finally:
        alive.kill()
        alive.wait()


def test_torn_writes_are_dropped_on_reading_and_repaired_on_resume(
    tmp_path: Path, dead_pid: int
) -> None:
    grid = _grid(layers="conv", n="8,16,32")
    out = tmp_path / "run"
    writer = ResultsWriter.create(out, grid.to_dict(), environment("cpu"))
    first = run_sweep(grid, tmp_path / "reference").frame  # real rows to copy from
    del writer
    lines = (tmp_path / "reference" / RESULTS_FILE).read_text().splitlines(keepends=True)
    samples = (tmp_path / "reference" / SAMPLES_FILE).read_text().splitlines(keepends=True)
    first_id = first["case_id"].iloc[0]
    second_id = first["case_id"].iloc[1]
    mine = [line for line in samples[1:] if line.startswith(first_id + ",")]
    orphans = [line for line in samples[1:] if line.startswith(second_id + ",")]
    # A row, then the samples of a case whose row never came, then half a sample line.
    (out / RESULTS_FILE).write_text(lines[0] + lines[1] + lines[2][:25])
    (out / SAMPLES_FILE).write_text(samples[0] + "".join(mine + orphans) + orphans[0][:10])
    meta = json.loads((out / RUN_FILE).read_text())
    meta["pid"] = dead_pid
    (out / RUN_FILE).write_text(json.dumps(meta))

    loaded = load_results(out)
    assert list(loaded.frame["case_id"]) == [first_id]
    assert len(loaded.samples) == len(mine)
    assert len(loaded.warnings) == 3  # torn results line, torn samples line, orphan samples

    run = resume_sweep(out)
    assert list(run.frame["case_id"]) == _ids(grid) and run.warnings == ()
    for row in run.frame.itertuples():
        assert len(samples_for(run, row.case_id)) == row.samples
    text = (out / RESULTS_FILE).read_text()
    assert text.endswith("\n") and text.count("\n") == 4


# ----------------------------------------------------------------------------- damaged files

DAMAGE: dict[str, tuple[str, str, str]] = {
    # name: (file, new content, expected message)
    "run_json_truncated": (RUN_FILE, '{"schema_version": 1, "con', "unreadable or corrupt"),
    "run_json_not_object": (RUN_FILE, "[1, 2]", "not an attnbench run record"),
    "run_json_other_tool": (RUN_FILE, '{"tool": "asv"}', "not an attnbench run record"),
    "run_json_schema": (RUN_FILE, '{"schema_version": 99}', "schema version 99"),
    "results_columns": (RESULTS_FILE, "case_id,layer\nx,conv\n", "lacks column"),
    "results_binary": (RESULTS_FILE, "\udcff\udcfe\x00garbage", "corrupt"),
    "samples_columns": (SAMPLES_FILE, "case,when\n", "lacks column"),
}


@pytest.fixture
def saved_run(tiny_run, tmp_path: Path) -> Iterator[Path]:  # type: ignore[no-untyped-def]
    import shutil

    copy = tmp_path / "saved"
    shutil.copytree(tiny_run.path, copy)
    yield copy


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_every_damaged_file_gives_a_clear_error(saved_run: Path, damage: str) -> None:
    name, content, message = DAMAGE[damage]
    (saved_run / name).write_bytes(content.encode("utf-8", "surrogateescape"))
    with pytest.raises(AttnbenchError, match=message):
        load_results(saved_run)


@pytest.mark.parametrize(
    ("file", "column", "value", "message"),
    [
        (RESULTS_FILE, "status", "exploded", "unknown status 'exploded'"),
        (RESULTS_FILE, "n", "sixteen", "corrupt"),
        (RESULTS_FILE, "n", "16.5", "non-integer"),
        (RESULTS_FILE, "time_s", "fast", "corrupt"),
        (SAMPLES_FILE, "time_s", "1e-3s", "corrupt"),
    ],
)
def test_a_corrupted_value_gives_a_clear_error(
    saved_run: Path, file: str, column: str, value: str, message: str
) -> None:
    import csv

    path = saved_run / file
    rows = list(csv.reader(path.read_text().splitlines()))
    rows[1][rows[0].index(column)] = value
    with open(path, "w", newline="") as fh:
        csv.writer(fh, lineterminator="\n").writerows(rows)
    with pytest.raises(AttnbenchError, match=message):
        load_results(saved_run)


@pytest.mark.parametrize("keep", [25, 5])  # cut in the third row; in the header
def test_a_finished_run_cut_short_is_corruption(saved_run: Path, keep: int) -> None:
    """A kill leaves a torn line only in an unfinished run: a finished run's results.csv cut
    short passed compare's gate, its lost cases listed as in the baseline alone."""
    path = saved_run / RESULTS_FILE
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0] + lines[1] + lines[2][:keep] if keep > 5 else lines[0][:keep])
    where = "in its last row" if keep > 5 else "in its header"
    with pytest.raises(
        AttnbenchError, match=f"results.csv of a finished run is cut short .{where}"
    ):
        load_results(saved_run)
    assert len(load_results(saved_run, resuming=True).frame) == (1 if keep > 5 else 0)
    path.write_text(lines[0] + lines[1])  # rows removed whole: a run filtered by hand reads
    assert len(load_results(saved_run).frame) == 1


def test_a_duplicated_case_is_corruption(saved_run: Path) -> None:
    path = saved_run / RESULTS_FILE
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join([*lines, lines[1]]))
    with pytest.raises(AttnbenchError, match="appears twice"):
        load_results(saved_run)


@pytest.mark.parametrize(
    ("running", "said"),
    [
        (0, "stopping: no round is timing, and no new one starts"),
        (1, "stopping after the round of conv n=8 d=8 k=3 now timing"),
        (2, "stopping after the 2 rounds now timing"),
    ],
)
def test_a_stop_request_is_always_answered(running: int, said: str) -> None:
    import io

    from rich.console import Console

    from attnbench.cli.render import SweepProgress

    buf = io.StringIO()
    progress = SweepProgress(Console(file=buf, width=200), quiet=True)  # answered even quiet
    case = _grid().cases()[0]
    progress(ProgressEvent("stopping", 0, 6, case, running=running))
    assert buf.getvalue().startswith(said) and "press Ctrl-C again" in buf.getvalue()


# ----------------------------------------------------------------------------- a full disk


def _disk_full_after(monkeypatch: pytest.MonkeyPatch, writes: int) -> None:
    """Every ``os.write`` of the results' files after the first ``writes`` takes 3 bytes and
    then finds the disk full, as a real full disk cuts a write short."""
    from attnbench import storage as files

    real = files.os.write
    count = {"writes": 0}

    def write(fd: int, data: bytes) -> int:
        count["writes"] += 1
        if count["writes"] <= writes:
            return real(fd, data)
        if count["writes"] % 2:
            return real(fd, bytes(data)[:3])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "write", write)


def test_a_full_disk_leaves_no_row_half_written_and_no_file_torn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from attnbench.storage import append_synced, create_synced, write_text_atomic

    table, meta, fresh = tmp_path / "rows.csv", tmp_path / "run.json", tmp_path / "new.csv"
    table.write_text("a,b\n1,2\n")
    meta.write_text('{"status": "running"}\n')
    _disk_full_after(monkeypatch, 0)
    for write, path in ((append_synced, table), (write_text_atomic, meta),
                        (create_synced, fresh)):  # fmt: skip
        with pytest.raises(AttnbenchError, match=f"cannot write {path}: No space left on device"):
            write(path, "3,4\n")
    assert table.read_text() == "a,b\n1,2\n"  # cut back to where it ended
    assert meta.read_text() == '{"status": "running"}\n'  # the old file, whole
    assert not fresh.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.csv", "run.json"]  # no temp file
    with pytest.raises(FileExistsError):
        create_synced(table, "x\n")


@pytest.mark.slow
def test_a_disk_that_fills_during_a_sweep_is_one_line_and_resume_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from attnbench.cli.app import app

    grid = _grid()
    out = tmp_path / "run"
    monkeypatch.setattr(
        "attnbench.run.sweep.ResultsWriter.append",
        _failing_after(ResultsWriter.append, 2, monkeypatch),
    )
    args = ["sweep", "--layers", "conv,rnn", "--n", "8,16,32", "--d", "8", "--device", "cpu",
            "--time-budget", "0.002", "--no-charts", "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    message = " ".join(result.output.split())
    assert "Traceback" not in result.output
    assert "No space left on device" in message
    # the line repeats the flag run.json does not hold, as a signal's stop does
    resume = f"attnbench sweep --resume {out} --no-charts"
    assert f"the 2 finished case(s) are saved: {resume}" in message
    stopped = load_results(out)
    # The two rows before the full disk, whole; run.json could not be marked (the disk is
    # still full), and a run whose writer is gone is resumed as it is.
    assert len(stopped.frame) == 2 and stopped.status == "running"
    monkeypatch.undo()
    run = resume_sweep(out)
    assert list(run.frame["case_id"]) == _ids(grid) and run.status == "complete"


def _failing_after(append, cases: int, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """``ResultsWriter.append`` whose (cases + 1)-th call finds the disk full mid-row."""
    seen = {"cases": 0}

    def wrapped(self, result, calibration=None, process=""):  # type: ignore[no-untyped-def]
        seen["cases"] += 1
        if seen["cases"] > cases:
            _disk_full_after(monkeypatch, 0)
        return append(self, result, calibration, process)

    return wrapped


def test_the_bar_follows_the_cases_an_auto_sweep_may_still_measure() -> None:
    """A new user's bar planned 495 units (165 cases, 3 rounds) at its first event and ended
    the sweep at 168 of them: --n auto drops the lengths a settled line will not reach. The
    total follows each event's, so a finished sweep ends its bar full."""
    import io

    from rich.console import Console

    from attnbench.cli.render import SweepProgress

    console = Console(file=io.StringIO(), width=200, force_terminal=True)
    case = _grid().cases()[0]
    with SweepProgress(console) as progress:
        assert progress.bar is not None
        progress(ProgressEvent("start", 0, 165, case, rounds=3))
        task = progress.bar.tasks[0]
        assert task.total == 495
        progress(ProgressEvent("done", 0, 56, case, rounds=3, units_done=168))
        task = progress.bar.tasks[0]
        assert task.total == 168 and task.completed == 168  # full: every planned unit done
