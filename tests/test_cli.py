from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench import __version__
from attnbench.cli import app

runner = CliRunner()
TINY = ["--n", "16", "--d", "8", "--heads", "2", "--device", "cpu", "--time-budget", "0.005"]


def test_sweep_writes_results_prints_progress_and_json(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = runner.invoke(
        app, ["sweep", *TINY, "--layers", "conv,attention", "--out", str(out), "--json"]
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)  # stdout holds JSON only
    assert payload["path"] == str(out)
    assert [r["layer"] for r in payload["results"]] == ["conv", "attention"]
    assert all(r["status"] == "ok" and r["time_s"] > 0 for r in payload["results"])
    # not a terminal: one plain line per finished case, on stderr
    assert "[1/2] conv n=16 d=8 k=3" in result.stderr
    assert "[2/2] attention n=16 d=8 h=2" in result.stderr
    assert f"results written to {out}" in result.stderr.replace("\n", "")
    for name in ("results.csv", "samples.csv", "run.json"):
        assert (out / name).is_file()


def test_config_file_with_options_overriding_it(tmp_path: Path) -> None:
    config = tmp_path / "sweep.toml"
    out = tmp_path / "run"
    config.write_text(
        f'layers = "rnn"\nn = "8..16"\nd = [8]\ndevice = "cpu"\ntime_budget = 0.005\n'
        f'out = "{out}"\n'
    )
    result = runner.invoke(app, ["sweep", "--config", str(config), "--n", "8", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["results"]
    assert [(r["layer"], r["n"]) for r in rows] == [("rnn", 8)]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--layers", "transformer"], "unknown layer 'transformer'; accepted: conv"),
        (["--n", "64.."], "--n: cannot read '64..'"),
        (["--n", "a,b"], "--n: cannot read 'a,b'"),
        (["--d", "4096..64"], "runs backwards"),
        (["--n", "0"], "values must be >= 1"),
        (["--d", "30"], "d=30 is not divisible by heads=4"),
        (["--device", "cuda:7"], "device 'cuda:7'"),
        (["--device", "tpu"], "unknown device 'tpu'"),
        (["--dtype", "int8"], "unknown dtype 'int8'"),
        (["--batch", "0"], "--batch must be >= 1"),
        (["--mode", "eval"], "unknown mode 'eval'"),
        (["--config", "/nonexistent/sweep.toml"], "does not exist"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["sweep", *args])
    assert result.exit_code == 2
    assert message in result.stderr
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:")


def test_unwritable_or_taken_out_is_refused(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = runner.invoke(app, ["sweep", *TINY, "--out", str(blocker / "sub")])
    assert result.exit_code == 2 and "not writable" in result.stderr

    out = tmp_path / "run"
    assert (
        runner.invoke(app, ["sweep", *TINY, "--layers", "conv", "--out", str(out)]).exit_code == 0
    )
    before = (out / "results.csv").read_text()
    again = runner.invoke(app, ["sweep", *TINY, "--layers", "conv", "--out", str(out)])
    assert again.exit_code == 2 and "already holds a run" in again.stderr
    assert (out / "results.csv").read_text() == before


def test_env_json_and_version() -> None:
    result = runner.invoke(app, ["env", "--device", "cpu", "--json"])
    assert result.exit_code == 0
    assert json.loads(result.stdout)["device"] == "cpu"
    version = runner.invoke(app, ["--version"])
    assert version.exit_code == 0 and version.stdout.strip() == f"attnbench {__version__}"


def test_help_explains_the_commands() -> None:
    result = runner.invoke(app, ["sweep", "--help"])
    assert result.exit_code == 0
    for option in ("--layers", "--n", "--d", "--dtype", "--device", "--config", "--json"):
        assert option in result.stdout


def test_summary_marks_noisy_cases_and_flop_mismatches(tiny_run) -> None:  # type: ignore[no-untyped-def]
    import io
    from dataclasses import replace

    from rich.console import Console

    from attnbench.cli import _summary_tables

    frame = tiny_run.frame.copy()
    frame["time_iqr_s"] = 0.0  # a real tiny run may be noisy itself: pin every row first
    frame["flops_check"] = "ok"
    frame.loc[0, "time_iqr_s"] = frame.loc[0, "time_s"] * 0.5
    frame.loc[1, "flops_check"] = "mismatch"
    buf = io.StringIO()
    _summary_tables(replace(tiny_run, frame=frame), Console(file=buf, width=200))
    text = buf.getvalue()
    assert "1 case(s) marked ! have IQR/median above 10%" in text
    assert (
        f"counted FLOPs differ from the analytic formula by more than 1% in 1 case(s) "
        f"({frame.loc[1, 'layer']})" in text
    )
