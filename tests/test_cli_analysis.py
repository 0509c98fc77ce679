"""plot, fit, report and pe through the CLI, and the charts drawn at the end of a sweep."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.render.charts import CHARTS
from attnbench.results.loader import load_results
from attnbench.results.run import RunResults

runner = CliRunner()


@pytest.fixture
def wide(wide_run: RunResults, tmp_path: Path) -> Path:
    """A private copy of the wide run, so that written charts do not leak between tests."""
    return Path(shutil.copytree(wide_run.path, tmp_path / "wide"))


@pytest.mark.slow
def test_plot_writes_the_chosen_charts_and_formats(wide: Path):
    result = runner.invoke(
        app, ["plot", str(wide), "--metric", "time,crossover", "--format", "png"]
    )
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (wide / "charts").iterdir()) == ["crossover.png", "time.png"]
    assert str(wide / "charts" / "time.png") in result.stderr


@pytest.mark.slow
def test_plot_all_charts_as_json_into_another_folder(wide: Path, tmp_path: Path):
    out = tmp_path / "figures"
    result = runner.invoke(app, ["plot", str(wide), "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    # every chart but the state, a decode run's
    assert len(payload["charts"]) == 2 * (len(CHARTS) - 1) and payload["not_drawn"] == []
    assert {Path(p).suffix for p in payload["charts"]} == {".png", ".svg"}
    assert all(Path(p).parent == out for p in payload["charts"])


@pytest.mark.slow
def test_plot_does_not_draw_an_empty_log_chart(wide: Path):
    """conv has no elementwise work: alone, its chart has nothing to draw on log axes."""
    args = ["--layers", "conv", "--metric", "time,elementwise"]
    result = runner.invoke(app, ["plot", str(wide), *args])
    assert result.exit_code == 0, result.output
    assert "not drawn: elementwise" in result.stderr


@pytest.mark.slow
def test_plot_says_which_charts_had_no_data(wide: Path):
    result = runner.invoke(
        app, ["plot", str(wide), "--layers", "rnn", "--metric", "time,crossover"]
    )
    assert result.exit_code == 0, result.output
    assert "not drawn: crossover" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--metric", "speed"], "unknown chart speed"),
        (["--format", "gif"], "unknown format gif"),
        (["--layers", "lstm"], "layer lstm is not in"),
    ],
)
def test_plot_bad_options_are_one_line_errors(wide: Path, args, message):
    result = runner.invoke(app, ["plot", str(wide), *args])
    assert result.exit_code == 2
    assert message in result.stderr and "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1


def test_plot_refuses_a_folder_that_is_not_a_run(tmp_path: Path):
    result = runner.invoke(app, ["plot", str(tmp_path)])
    assert result.exit_code == 2 and "error:" in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("keep", "why"),
    [
        ("attention", "the run has no rival family to race attention against"),
        ("rnn", "the run has no self-attention layer to race"),
    ],
)
def test_plot_says_why_the_crossover_is_not_drawn(wide: Path, keep: str, why: str):
    result = runner.invoke(
        app, ["plot", str(wide), "--metric", "time,crossover", "--format", "png", "--layers", keep]
    )
    assert result.exit_code == 0, result.output
    assert f"not drawn: crossover: {why}" in " ".join(result.stderr.split())
    assert "two sizes" not in result.stderr  # the run has them; it lacks the other side


def test_plot_of_a_run_without_measurements(wide: Path):
    # Every case marked oom: nothing is left to plot.
    frame = pd.read_csv(wide / "results.csv", keep_default_na=False)
    frame["status"] = "oom"
    frame.to_csv(wide / "results.csv", index=False)
    result = runner.invoke(app, ["plot", str(wide)])
    assert result.exit_code == 2 and "no measured cases to plot" in result.stderr


@pytest.mark.slow
def test_fit_prints_tables_and_json(wide: Path):
    result = runner.invoke(app, ["fit", str(wide)])
    assert result.exit_code == 0, result.output
    for title in ("Growth in n", "Why time grows as it does", "Cost models of time", "Crossovers"):
        assert title in result.stdout
    assert "time = work ÷ rate on the same sizes" in " ".join(result.stderr.split())
    # what the exponent table's columns mean, said where the table is printed
    assert "'chapter' is the slope of the chapter's order" in " ".join(result.stderr.split())
    payload = json.loads(runner.invoke(app, ["fit", str(wide), "--json"]).stdout)
    times = [e for e in payload["exponents"] if e["metric"] == "time_s" and e["along"] == "n"]
    assert all("order" in e for e in payload["exponents"])
    assert times and all(  # the real run's counted work splits every time exponent exactly
        e["exponent"] == pytest.approx(e["work_exponent"] - e["rate_exponent"]) for e in times
    )
    assert {"exponents", "models", "crossovers"} <= set(payload)
    assert payload["unfitted"] == {}  # every layer's own model was fitted
    assert "no cost model" not in result.stderr
    best = [m for m in payload["models"] if m["best"]]
    assert {m["layer"] for m in best} == {"conv", "rnn", "attention"}
    rnn_steps = [
        e for e in payload["exponents"]
        if (e["layer"], e["metric"], e["along"]) == ("rnn", "seq_steps", "n")
    ]  # fmt: skip
    assert rnn_steps and all(abs(e["exponent"] - 1) < 0.1 for e in rnn_steps)


@pytest.mark.slow
def test_fit_says_why_a_layer_has_no_cost_model(wide: Path):
    frame = pd.read_csv(wide / "results.csv", keep_default_na=False)
    frame[(frame["d"] == 16) | (frame["layer"] != "attention")].to_csv(
        wide / "results.csv", index=False
    )  # attention at one width, four lengths: its model, three parameters there, needs five
    result = runner.invoke(app, ["fit", str(wide)])
    assert result.exit_code == 0, result.output
    note = " ".join(result.stderr.split())
    assert "no cost model for attention: its model" in note
    assert (
        "2 a multiple of another there) and needs 5 measured cases; the run has 4, all at d=16"
        in note
    )
    payload = json.loads(runner.invoke(app, ["fit", str(wide), "--json"]).stdout)
    assert list(payload["unfitted"]) == ["attention"]


@pytest.mark.slow
def test_report_writes_markdown_and_html_with_the_charts(wide: Path):
    result = runner.invoke(app, ["report", str(wide), "--html"])
    assert result.exit_code == 0, result.output
    text = (wide / "report.md").read_text()
    for heading in ("## Environment", "## Comparison table", "## Growth in n", "## Cost models",
                    "## Crossovers", "## Charts"):  # fmt: skip
        assert heading in text
    assert "![time](charts/time.png)" in text
    assert (wide / "charts" / "time.png").exists()
    assert "| attention | O(n^2 d) |" in text
    page = (wide / "report.html").read_text()
    assert page.startswith("<!doctype html>") and "<img src='charts/time.png'" in page
    assert "<table" in page


@pytest.mark.slow
def test_report_no_charts_embeds_those_already_drawn(wide: Path):
    runner.invoke(app, ["plot", str(wide), "--metric", "memory", "--format", "svg"])
    result = runner.invoke(app, ["report", str(wide), "--no-charts"])
    assert result.exit_code == 0, result.output
    text = (wide / "report.md").read_text()
    assert "![memory](charts/memory.svg)" in text and "time.png" not in text


@pytest.mark.slow
def test_a_report_of_a_run_with_nothing_to_chart_is_written_without_charts(
    wide: Path, monkeypatch: pytest.MonkeyPatch
):
    import attnbench.cli.analysis as cli
    from attnbench.errors import NothingToPlot

    def nothing(*args, **kwargs):
        raise NothingToPlot("nothing to plot: each line at one length")

    monkeypatch.setattr(cli, "plot_run", nothing)
    result = runner.invoke(app, ["report", str(wide)])
    assert result.exit_code == 0, result.output
    assert "## Charts" not in (wide / "report.md").read_text()


@pytest.mark.slow
def test_report_without_charts(wide: Path, tmp_path: Path):
    out = tmp_path / "elsewhere" / "r.md"
    result = runner.invoke(app, ["report", str(wide), "--no-charts", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "## Charts" not in out.read_text() and not (wide / "charts").exists()


@pytest.mark.slow
def test_pe_prints_the_check_and_writes_the_figures(tmp_path: Path):
    result = runner.invoke(app, ["pe", "--out", str(tmp_path), "--format", "png", "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["relative_shift_error"]["float64"] < 1e-12
    assert payload["relative_shift_error"]["float32"] < 1e-5
    assert sorted(Path(p).name for p in payload["files"]) == [
        "pe-binary.png", "pe-columns.png", "pe-heatmap.png"
    ]  # fmt: skip
    text = runner.invoke(app, ["pe", "--out", str(tmp_path), "--format", "png"])
    assert "7 in binary is 111" in text.stdout
    assert "p[i+δ]" in text.stdout  # printed literally, not eaten as markup


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--d", "1"], "--d at least 2"),
        (["--columns", "6..40"], "P has columns 0..31"),
        (["--d", "4"], "choose --columns below 4 or a larger --d"),  # the default 6..9
        (["--columns", "six"], "--columns: expected a range"),
    ],
)
def test_pe_bad_input(tmp_path: Path, args, message):
    result = runner.invoke(app, ["pe", "--out", str(tmp_path), *args])
    assert result.exit_code == 2 and message in result.stderr


def test_pe_help_keeps_its_formula() -> None:
    """Rich reads square brackets in a help text as markup and drops them with their text."""
    result = runner.invoke(app, ["pe", "--help"], terminal_width=200)
    assert result.exit_code == 0
    assert "(p(i, 2j), p(i, 2j+1))" in result.stdout


SWEEP = ["sweep", "--layers", "conv,attention", "--n", "16,32", "--d", "8", "--heads", "2",
         "--time-budget", "0.005", "--device", "cpu", "--quiet"]  # fmt: skip


@pytest.mark.slow
def test_sweep_draws_its_charts_when_it_completes(tmp_path: Path):
    out = tmp_path / "run"
    result = runner.invoke(app, [*SWEEP, "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    charts = json.loads(result.stdout)["charts"]
    assert str(out / "charts" / "time.png") in charts
    assert (out / "charts" / "time.svg").exists()


def test_sweep_no_charts(tmp_path: Path):
    out = tmp_path / "run"
    result = runner.invoke(app, [*SWEEP, "--out", str(out), "--no-charts"])
    assert result.exit_code == 0 and not (out / "charts").exists()


def test_a_chart_failure_keeps_the_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import attnbench.cli.sweeping as cli

    def broken(*args, **kwargs):
        raise RuntimeError("no fonts")

    monkeypatch.setattr(cli, "plot_run", broken)
    out = tmp_path / "run"
    result = runner.invoke(app, [*SWEEP[:-1], "--out", str(out)])
    assert result.exit_code == 0
    assert "charts were not drawn (no fonts)" in result.stderr
    assert f"attnbench plot {out}" in result.stderr
    assert len(load_results(out).measured) == 4


def test_a_run_with_nothing_to_chart_is_told_so_not_to_try_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Every line at one length: no retry draws a chart, so the sweep does not suggest one
    (a new user's failing plugin left one length, and "try: attnbench plot" failed too)."""
    import attnbench.cli.sweeping as cli
    from attnbench.errors import NothingToPlot

    def nothing(*args, **kwargs):
        raise NothingToPlot("nothing to plot in X: each chart needs a layer measured at two sizes")

    monkeypatch.setattr(cli, "plot_run", nothing)
    result = runner.invoke(app, [*SWEEP[:-1], "--out", str(tmp_path / "run")])
    assert result.exit_code == 0
    assert "note: no charts: nothing to plot in X" in result.output
    assert "attnbench plot" not in result.output and "warning" not in result.stderr


@pytest.mark.slow
def test_the_split_reads_the_models_latency_share_at_both_ends_of_a_range(wide: Path):
    """Where the run recorded its ceilings, the reading gives the share of the machine model's
    time that is latency at the first and last size fitted: what makes a rate rise when the
    model follows it (lstm's set-up), and its absence when the model misses (conv)."""
    from attnbench.fits import analyse
    from attnbench.render.report import _latency_shares, split_display

    analysis = analyse(load_results(wide))
    assert not analysis.machine.empty
    e = analysis.exponents
    rows = e[(e.metric == "time_s") & (e.along == "n")]
    row = rows[rows.fixed == rows.fixed.max()].iloc[0]
    first, last = _latency_shares(analysis, row)
    frame = analysis.frame.join(analysis.machine.drop(columns="case_id"), how="inner")
    line = frame[(frame.layer == row.layer) & (frame.d == row.fixed)]

    def share(n: int) -> float:
        at = line[line.n == n]
        return float(((at.latency_s + at.faults_s) / at.predicted_time_s).median())

    assert (first, last) == (
        pytest.approx(share(row.range_from)),
        pytest.approx(share(row.range_to)),
    )
    readings = split_display(analysis)["reading"]
    assert readings.str.contains(r"\(latency \d+% → \d+% of it\)").all()


def test_a_plugin_without_a_family_is_named_where_the_crossover_is_not_drawn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A new user raced a factory-only plugin against attention and read "no rival family"
    alone: the reason names the plugin and how to declare it a rival."""
    from types import SimpleNamespace

    from attnbench.layers import CUSTOM
    from attnbench.layers.registry import REGISTRY
    from attnbench.render import charts

    known = {"attention": REGISTRY["attention"], "mine:make": SimpleNamespace(family=CUSTOM)}
    monkeypatch.setattr(charts, "run_catalog", lambda run: known)
    run = SimpleNamespace(measured=pd.DataFrame({"layer": ["mine:make", "attention"]}))
    why = charts.not_drawn_reason("crossover", run)  # type: ignore[arg-type]
    assert why.startswith("the run has no rival family to race attention against")
    assert "(mine:make: a plugin without a family, as a factory alone is; a LayerEntry" in why
    known["mine:make"] = SimpleNamespace(family=REGISTRY["attention-local"].family)
    assert "LayerEntry" not in charts.not_drawn_reason("crossover", run)  # type: ignore[arg-type]


def test_an_unfinished_run_is_said_to_be_one_where_it_is_read(wide: Path):
    """A new user's table of an interrupted sweep read as final; show said so and table did
    not. Every command that reads a saved run says it, once, with the --resume."""
    meta = json.loads((wide / "run.json").read_text())
    (wide / "run.json").write_text(json.dumps({**meta, "status": "interrupted"}))
    for command in (["table"], ["fit"], ["show"]):
        result = runner.invoke(app, [*command, str(wide)])
        assert result.exit_code == 0, result.output
        said = " ".join(result.stderr.split())
        assert said.count("this run is unfinished (interrupted)") == 1, command
        assert f"attnbench sweep --resume {wide}" in said
