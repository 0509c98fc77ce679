"""``table --beside``: two runs of the same layers side by side (an eager run and a compiled
one), read from a real run and a copy of it whose times and config were changed by known
amounts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from attnbench.beside import beside_notes, beside_table, display_beside, run_label
from attnbench.cli import app
from attnbench.errors import AttnbenchError
from attnbench.results.loader import load_results
from attnbench.results.run import RunResults


def faster_copy(run: RunResults, folder: Path, factor: float, compile_s: float) -> RunResults:
    """The run copied to ``folder`` as a compiled run whose every time is ``factor`` times
    smaller, each case's compile taking ``compile_s``."""
    shutil.copytree(run.path, folder)
    for name in ("results.csv", "samples.csv"):
        frame = pd.read_csv(folder / name)
        for column in [c for c in frame.columns if c.startswith("time_") and c.endswith("_s")]:
            frame[column] = frame[column] / factor
        if name == "results.csv":
            frame["compiled"] = "default"
            frame["compile_s"] = compile_s
        frame.to_csv(folder / name, index=False)
    meta = json.loads((folder / "run.json").read_text())
    meta["config"]["compile"] = "default"
    (folder / "run.json").write_text(json.dumps(meta))
    return load_results(folder)


def test_the_second_run_reads_faster_by_the_factor_at_every_length(
    wide_run: RunResults, tmp_path: Path
) -> None:
    compiled = faster_copy(wide_run, tmp_path / "compiled", 2.0, 3.5)
    table = beside_table(wide_run, compiled).set_index("layer")
    assert list(table.index) == ["conv", "rnn", "attention"]
    assert (table["d"] == 16).all()  # the widest d both measured
    for layer in table.index:
        assert table.at[layer, "ratio_min"] == pytest.approx(2.0)
        assert table.at[layer, "ratio_max"] == pytest.approx(2.0)
        assert sorted(table.at[layer, "ratio_by_n"]) == [16, 32, 64, 128]
        assert table.at[layer, "compile_s_min"] == table.at[layer, "compile_s_max"] == 3.5
        # the same growth: every time halved moves no exponent
        first, second = (
            table.at[layer, "time_exponent_n_first"],
            table.at[layer, "time_exponent_n_second"],
        )
        assert first == pytest.approx(second, abs=1e-6)
    assert run_label(wide_run) == "eager" and run_label(compiled) == "compiled"
    shown = display_beside(table.reset_index(), "eager", "compiled")
    assert list(shown.columns)[2:] == [
        "eager: overhead-bound to",
        "compiled: overhead-bound to",
        "eager: time",
        "compiled: time",
        "compiled faster",
        "compiled: compile",
    ]
    odd = display_beside(table.reset_index(), "second run", "{x}")  # labels read as they are
    assert list(odd.columns)[2] == "second run: overhead-bound to"
    assert list(odd.columns)[6] == "{x} faster"
    assert set(shown["compiled faster"]) == {"2.00x"} and set(shown["compiled: compile"]) == {
        "3.50 s"
    }


def test_the_command_prints_both_runs_and_json(wide_run: RunResults, tmp_path: Path) -> None:
    compiled = faster_copy(wide_run, tmp_path / "compiled", 4.0, 1.0)
    runner = CliRunner()
    done = runner.invoke(app, ["table", str(compiled.path), "--beside", str(wide_run.path)])
    assert done.exit_code == 0, done.output
    assert "(compiled) beside" in done.output and "4.00x" in done.output
    done = runner.invoke(
        app, ["table", str(compiled.path), "--beside", str(wide_run.path), "--json"]
    )
    rows = json.loads(done.stdout)
    assert [r["layer"] for r in rows] == ["conv", "rnn", "attention"]
    assert rows[0]["ratio_by_n"]["16"] == pytest.approx(4.0)


def test_runs_that_cannot_stand_side_by_side_are_refused(
    wide_run: RunResults, tiny_run: RunResults, tmp_path: Path
) -> None:
    other = wide_run.frame.assign(layer="ssm")
    only_ssm = faster_copy(wide_run, tmp_path / "ssm", 1.0, 1.0)
    other.to_csv(only_ssm.path / "results.csv", index=False)
    with pytest.raises(AttnbenchError, match="share no layer"):
        beside_table(wide_run, load_results(only_ssm.path))
    decode = faster_copy(wide_run, tmp_path / "decode", 1.0, 1.0)
    frame = pd.read_csv(decode.path / "results.csv").assign(mode="decode")
    frame.to_csv(decode.path / "results.csv", index=False)
    with pytest.raises(AttnbenchError, match="two runs of one mode"):
        beside_table(wide_run, load_results(decode.path))
    done = CliRunner().invoke(app, ["table", str(tiny_run.path), "--beside", str(tmp_path / "x")])
    assert done.exit_code != 0 and "Traceback" not in done.output


def test_a_layer_that_compiled_no_graph_is_named_beside_its_faster_column(
    wide_run: RunResults, tmp_path: Path
) -> None:
    """A new user read rnn 'compiled faster 1.32-1.91x' where rnn compiled no graph and ran
    eager: two eager runs' processes apart. The note names it, and says the runs are unpaired."""
    compiled = faster_copy(wide_run, tmp_path / "compiled", 1.5, 0.1)
    frame = pd.read_csv(compiled.path / "results.csv")
    frame["compile_graphs"] = (frame["layer"] != "rnn").astype(int)  # rnn: 0 graphs
    frame.to_csv(compiled.path / "results.csv", index=False)
    table = beside_table(wide_run, load_results(compiled.path)).set_index("layer")
    assert list(table["no_graph_second"]) == [False, True, False]
    assert not table["no_graph_first"].any()  # the eager run compiles nothing to miss
    done = CliRunner().invoke(app, ["table", str(compiled.path), "--beside", str(wide_run.path)])
    assert done.exit_code == 0, done.output
    said = " ".join(done.output.split())
    assert "note: rnn compiled no graph in the compiled run and ran eager there" in said
    assert "conv compiled no graph" not in said
    assert "attnbench ab --base-compile none --compile MODE races eager against compiled" in said
    assert "its 'compiled faster' is two eager runs apart" in said
    # both runs compiled, rnn's graph only in the other: one side ran eager, not two
    other = faster_copy(wide_run, tmp_path / "other", 1.0, 0.1)
    table = beside_table(other, load_results(compiled.path))
    assert "eager beside compiled code" in " ".join(beside_notes(table, "other", "compiled"))
    done = CliRunner().invoke(
        app, ["table", str(compiled.path), "--beside", str(wide_run.path), "--json"]
    )  # the notes go to stderr with --json too; stdout stays the JSON alone
    assert json.loads(done.stdout)[1]["no_graph_second"] is True
    assert "rnn compiled no graph" in " ".join(done.stderr.split())
