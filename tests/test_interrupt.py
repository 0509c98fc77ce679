"""A real Ctrl-C in the middle of a sweep: exit 130, and every finished case stays loadable."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnbench import load_results


@pytest.mark.slow
def test_sigint_keeps_finished_cases_and_exits_130(tmp_path: Path) -> None:
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "attnbench",
        "sweep",
        "--layers",
        "conv,rnn",
        "--n",
        "8..4096",
        "--d",
        "8",
        "--device",
        "cpu",
        "--time-budget",
        "0.05",
        "--out",
        str(out),
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            csv = out / "results.csv"
            if csv.exists() and len(csv.read_text().splitlines()) >= 4:  # header + 3 cases
                break
            time.sleep(0.05)
        else:
            pytest.fail("the sweep wrote no cases within 60 s")
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130
    assert b"interrupted" in stderr and b"Traceback" not in stderr
    run = load_results(out)
    assert 3 <= len(run.frame) < 20  # 2 layers x 10 lengths were planned
    assert (run.frame["status"] == "ok").all()
    for row in run.frame.itertuples():
        assert len(run.samples_for(row.case_id)) == row.samples
    assert run.meta["end_time"] is None  # the run is marked unfinished
