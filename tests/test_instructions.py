"""Instruction counts: gated like an exact metric within a tolerance, CPU only, one round, and a
clear error without Valgrind. (Real counts under Callgrind: tests/test_ab.py, marked slow.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from synthetic import cases_grid, make_run
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.compare import IMPROVEMENT, NOT_COMPARED, REGRESSION, UNCHANGED, compare_runs
from attnbench.errors import AttnbenchError
from attnbench.measure.counts import instructions
from attnbench.options import build_grid
from attnbench.thresholds import Thresholds

runner = CliRunner()


def _counted(tmp_path: Path, name: str, factor: float):  # type: ignore[no-untyped-def]
    grid = {key: {"instructions": round(1_000_000 * factor)} for key in cases_grid()}
    return make_run(tmp_path / name, grid)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("factor", "verdict"),
    [(1.0, UNCHANGED), (1.005, UNCHANGED), (1.02, REGRESSION), (0.97, IMPROVEMENT)],
)
def test_instructions_are_gated_within_their_tolerance(
    tmp_path: Path, factor: float, verdict: str
) -> None:
    c = compare_runs(_counted(tmp_path, "a", 1.0), _counted(tmp_path, "b", factor))
    counts = c.counts[c.counts["metric"] == "instructions"]
    assert set(counts["verdict"]) == {verdict}
    assert c.failed("deterministic") == (verdict == REGRESSION)
    looser = compare_runs(
        _counted(tmp_path, "c", 1.0), _counted(tmp_path, "d", factor),
        Thresholds(instructions_tolerance=0.05),
    )  # fmt: skip
    assert not looser.failed("deterministic")


def test_a_time_run_has_no_instructions_to_compare(tmp_path: Path) -> None:
    c = compare_runs(make_run(tmp_path / "a", cases_grid()), _counted(tmp_path, "b", 1.0))
    assert set(c.counts.loc[c.counts["metric"] == "instructions", "verdict"]) == {NOT_COMPARED}


def test_instructions_are_counted_on_the_cpu_in_one_round() -> None:
    with pytest.raises(AttnbenchError, match="counts CPU instructions; --device cuda:0"):
        build_grid({"layers": "conv", "metric": "instructions"}, lambda name, dtype: "cuda:0")
    with pytest.raises(AttnbenchError, match="there is one process a case"):
        build_grid({"layers": "conv", "metric": "instructions", "processes": 3, "device": "cpu"})
    with pytest.raises(AttnbenchError, match="unknown metric 'cycles'"):
        build_grid({"metric": "cycles", "device": "cpu"})


def test_without_valgrind_it_is_one_line_and_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(instructions.shutil, "which", lambda name: None)
    out = tmp_path / "run"
    args = ["sweep", "--layers", "conv", "--n", "8", "--d", "4", "--device", "cpu"]
    result = runner.invoke(app, [*args, "--metric", "instructions", "--out", str(out)])
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "apt-get install valgrind" in lines[0]
    assert "Traceback" not in result.output


def test_a_run_measured_under_load_says_so(tmp_path: Path) -> None:
    """Every round records the 1-minute load; above the CPU count, the summary warns."""
    from rich.console import Console

    from attnbench.cli.summary import summary_notes

    quiet = make_run(tmp_path / "quiet", cases_grid())
    busy = make_run(tmp_path / "busy", cases_grid(conv_64={"load": 3.5}, rnn_128={"load": 2.6}))
    assert quiet.busy().empty
    assert set(busy.busy()["case_id"]) == {
        "conv/n=64/d=16/k=3/b=1/float32/cpu/forward", "rnn/n=128/d=16/b=1/float32/cpu/forward",
    }  # fmt: skip
    assert set(busy.frame["load_1m"].dropna()) == {0.5, 2.6, 3.5}
    import io

    buf = io.StringIO()
    summary_notes(busy, Console(file=buf, width=300))
    said = " ".join(buf.getvalue().split())
    assert "load average exceeded its 2 CPUs by more than 0.5" in said
    assert "in 2 timing round(s) of 2 case(s) (up to 3.5)" in said


def test_a_load_just_past_the_cpus_is_the_sweeps_own_not_a_neighbour(tmp_path: Path) -> None:
    """A new user's quiet sweep read a load of 1.78-2.02 on 2 CPUs, its own threads, and was
    told other processes shared the machine ("up to 2.0"): half a core past them is allowed."""
    from attnbench.results.run import LOAD_SLACK

    own = make_run(tmp_path / "own", cases_grid(conv_64={"load": 2.0 + LOAD_SLACK}))
    assert own.busy().empty
    past = make_run(tmp_path / "past", cases_grid(conv_64={"load": 2.0 + LOAD_SLACK + 0.01}))
    assert len(past.busy()) == 1
