"""Real signals to a real `attnbench sweep` process, then `--resume`: nothing is lost.

The sweep cannot outrun the test: its layer holds at n >= 128 until the test releases it, so
how many cases are finished when the signal lands does not depend on the machine's speed."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from synthetic import samples_for

from attnbench import load_results

LENGTHS = (8, 16, 32, 64, 128, 256, 512)
FREE = 4  # the cases below the hold: n = 8..64
HOLD = """
import os
import time
from torch import nn


class Held(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.proj = nn.Linear(d, d)

    def forward(self, x):  # (B, n, d)
        while x.shape[1] >= 128 and not os.path.exists({release!r}):
            time.sleep(0.01)  # held until the test has sent its signal
        return self.proj(x)


def make(d):
    return Held(d)
"""


def _plugin(tmp_path: Path) -> tuple[str, Path]:
    release = tmp_path / "release"
    path = tmp_path / "held.py"
    path.write_text(HOLD.format(release=str(release)))
    return f"{path}:make", release


def _start(out: Path, layer: str, group: bool = False) -> subprocess.Popen[bytes]:
    """The sweep; ``group``: in a process group of its own, which a test signals whole."""
    cmd = [sys.executable, "-m", "attnbench", "sweep", "--layers", layer, "--n", "8..512"]
    cmd += ["--d", "8", "--device", "cpu", "--time-budget", "0.02", "--no-charts"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if group:  # the default executor's fork servers, where the tests run cases in-process
        env["ATTNBENCH_EXECUTOR"] = "fork"
    return subprocess.Popen(
        [*cmd, "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=group,
        # SIGINT as a terminal's job has it: a shell runs a background job (this test, under
        # some runners) with SIGINT ignored, which its children would inherit
        preexec_fn=_default_sigint if group else None,
    )


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait_for_rows(out: Path, rows: int) -> None:
    deadline = time.monotonic() + 300  # a margin for a machine busy on both cores
    while time.monotonic() < deadline:
        csv = out / "results.csv"
        if csv.exists() and len(csv.read_text().splitlines()) > rows:  # header + rows
            return
        time.sleep(0.02)
    pytest.fail(f"the sweep wrote fewer than {rows} cases within 300 s")


def _resume(out: Path) -> subprocess.CompletedProcess[bytes]:
    cmd = [sys.executable, "-m", "attnbench", "sweep", "--resume", str(out), "--quiet"]
    cmd.append("--no-charts")  # the charts have tests of their own
    return subprocess.run(cmd, capture_output=True, timeout=300)


def _expected_ids() -> list[str]:
    return [f"held:make/n={n}/d=8/b=1/float32/cpu/forward" for n in LENGTHS]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_keeps_every_finished_case_and_resume_completes_the_sweep(
    tmp_path: Path, sig: int
) -> None:
    out = tmp_path / "run"
    layer, release = _plugin(tmp_path)
    proc = _start(out, layer)
    try:
        _wait_for_rows(out, FREE)
        proc.send_signal(sig)  # between cases, or inside the held one
        time.sleep(0.2)
        release.touch()
        _, stderr = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 128 + sig, stderr.decode()  # 130 for SIGINT, 143 for SIGTERM
    text = stderr.decode()
    # Answered whenever the signal lands: inside a case ("stopping after ...") or between two
    # ("stopping: no round is timing").
    assert "stopping" in text and "Traceback" not in text
    assert f"attnbench sweep --resume {out}" in text.replace("\n", "")
    stopped = load_results(out)
    # The free cases, and the held one if the signal landed inside it: never the rest.
    assert len(stopped.frame) in (FREE, FREE + 1)
    assert list(stopped.frame["case_id"]) == _expected_ids()[: len(stopped.frame)]
    assert stopped.status == "interrupted" and (stopped.frame["status"] == "ok").all()
    for row in stopped.frame.itertuples():
        assert len(samples_for(stopped, row.case_id)) == row.samples

    resumed = _resume(out)
    assert resumed.returncode == 0, resumed.stderr.decode()
    run = load_results(out)
    assert list(run.frame["case_id"]) == _expected_ids()  # as an uninterrupted sweep
    assert (run.frame["status"] == "ok").all() and run.status == "complete"
    for row in run.frame.itertuples():
        assert len(samples_for(run, row.case_id)) == row.samples


@pytest.mark.slow
def test_a_terminals_ctrl_c_lets_the_case_in_flight_finish(tmp_path: Path) -> None:
    """A terminal's Ctrl-C goes to its whole foreground process group: the fork servers and
    the process timing the case got it too, and died in the case the sweep had said it would
    finish ("stopping after gru n=512 ...", then "the worker ... died ... KeyboardInterrupt",
    and no gru n=512 in results.csv). The workers are out of that group: the case finishes."""
    out = tmp_path / "run"
    layer, release = _plugin(tmp_path)
    proc = _start(out, layer, group=True)
    try:
        _wait_for_rows(out, FREE)
        time.sleep(2.0)  # every job but a held one takes milliseconds: one is in flight now
        os.killpg(proc.pid, signal.SIGINT)  # the whole group, as a terminal sends it
        time.sleep(0.3)
        release.touch()
        _, stderr = proc.communicate(timeout=300)
    finally:
        proc.kill()
    text = stderr.decode()
    assert proc.returncode == 130, text
    assert "died" not in text and "KeyboardInterrupt" not in text, text
    stopping = re.search(r"stopping after the round of \S+ n=(\d+)", text)
    assert stopping is not None, text
    stopped = load_results(out)
    assert int(stopping.group(1)) >= 128  # the held case, in flight when the signal came
    assert int(stopping.group(1)) in set(stopped.frame["n"])  # and finished, kept
    assert (stopped.frame["status"] == "ok").all()


@pytest.mark.slow
def test_sigkill_leaves_loadable_files_and_resume_completes_the_sweep(tmp_path: Path) -> None:
    out = tmp_path / "run"
    layer, release = _plugin(tmp_path)
    proc = _start(out, layer)
    try:
        _wait_for_rows(out, FREE)
        time.sleep(0.2)  # inside the held case, or about to be
        proc.kill()  # SIGKILL: no handler runs, files are as the last write left them
        proc.wait(timeout=60)
    finally:
        proc.kill()
    killed = load_results(out)  # never a corrupt file
    assert killed.status == "running" and len(killed.frame) == FREE
    release.touch()
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
