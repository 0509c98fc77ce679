"""Real signals to a real `attnbench sweep` process, then `--resume`: nothing is lost."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnbench import build_grid, load_results

SWEEP = ["--layers", "conv,rnn", "--n", "8..512", "--d", "8", "--device", "cpu"]
OPTIONS = {"layers": "conv,rnn", "n": "8..512", "d": "8", "device": "cpu"}


def _start(out: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "attnbench", "sweep", *SWEEP, "--time-budget", "0.02"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [*cmd, "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )


def _wait_for_rows(out: Path, rows: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        csv = out / "results.csv"
        if csv.exists() and len(csv.read_text().splitlines()) > rows:  # header + rows
            return
        time.sleep(0.02)
    pytest.fail(f"the sweep wrote fewer than {rows} cases within 60 s")


def _resume(out: Path) -> subprocess.CompletedProcess[bytes]:
    cmd = [sys.executable, "-m", "attnbench", "sweep", "--resume", str(out), "--quiet"]
    cmd.append("--no-charts")  # the charts have tests of their own
    return subprocess.run(cmd, capture_output=True, timeout=120)


def _expected_ids() -> list[str]:
    return [case.case_id for case in build_grid(OPTIONS).cases()]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_keeps_every_finished_case_and_resume_completes_the_sweep(
    tmp_path: Path, sig: int
) -> None:
    out = tmp_path / "run"
    proc = _start(out)
    try:
        _wait_for_rows(out, 3)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr.decode()
    text = stderr.decode()
    # Answered whenever the signal lands: inside a case ("stopping after ...") or between two
    # ("stopping now: no case is running").
    assert "stopping" in text and "Traceback" not in text
    assert f"attnbench sweep --resume {out}" in text.replace("\n", "")
    stopped = load_results(out)
    assert 3 <= len(stopped.frame) < 14  # 2 layers x 7 lengths were planned
    assert stopped.status == "interrupted" and (stopped.frame["status"] == "ok").all()
    for row in stopped.frame.itertuples():
        assert len(stopped.samples_for(row.case_id)) == row.samples

    resumed = _resume(out)
    assert resumed.returncode == 0, resumed.stderr.decode()
    run = load_results(out)
    assert list(run.frame["case_id"]) == _expected_ids()  # as an uninterrupted sweep
    assert (run.frame["status"] == "ok").all() and run.status == "complete"
    for row in run.frame.itertuples():
        assert len(run.samples_for(row.case_id)) == row.samples


@pytest.mark.slow
def test_sigkill_leaves_loadable_files_and_resume_completes_the_sweep(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = _start(out)
    try:
        _wait_for_rows(out, 4)
        proc.kill()  # SIGKILL: no handler runs, files are as the last write left them
        proc.wait(timeout=60)
    finally:
        proc.kill()
    killed = load_results(out)  # never a corrupt file
    assert killed.status == "running" and len(killed.frame) >= 4
    resumed = _resume(out)
    assert resumed.returncode == 0, resumed.stderr.decode()
    run = load_results(out)
    assert list(run.frame["case_id"]) == _expected_ids()
    # The case the process died in (if it was inside one) is failed, and its layer's larger
    # cases skipped; every other case is measured.
    died = run.frame[run.frame["error"].str.startswith("the process died")]
    assert len(died) <= 1
    assert set(run.frame["status"]) <= {"ok", "failed", "skipped"}
    if died.empty:
        assert (run.frame["status"] == "ok").all()
