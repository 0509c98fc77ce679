"""Fitted exponents and the comparison table."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.fits import analyse, loglog_exponent, upper_half
from attnbench.render.blocks import markdown_table
from attnbench.render.report import SPLIT_NOTE, _reading, model_notes, split_display
from attnbench.results.run import RunResults
from attnbench.schema import RESULT_COLUMNS
from attnbench.table import comparison_table, display, fit_notes

runner = CliRunner()


def test_exponent_recovers_a_noisy_power_law_and_its_interval_covers_the_truth() -> None:
    rng = np.random.default_rng(0)
    n = np.array([64, 128, 256, 512, 1024, 2048] * 3, dtype=float)
    y = 3e-9 * n**2 * rng.lognormal(0, 0.05, size=len(n))
    fit = loglog_exponent(n, y)
    assert fit is not None and fit.points == 18
    assert fit.slope == pytest.approx(2, abs=0.05)
    assert fit.low < 2 < fit.high and fit.high - fit.low < 0.2


def test_exponent_needs_two_sizes_and_skips_what_cannot_be_logged() -> None:
    assert loglog_exponent([64, 64], [1.0, 2.0]) is None
    two = loglog_exponent([64, 128, 256], [1.0, 2.0, 0.0])
    assert two is not None and two.slope == pytest.approx(1) and np.isnan(two.low)
    assert upper_half([8, 16, 32, 64, 128, 256]) == [64, 128, 256]
    assert upper_half([8, 16]) == [8, 16]


def _synthetic_run() -> RunResults:
    """Exact laws: attention time n^2 d, rnn time n d^2, each its counted work at one rate
    (settled at every size); steps and paths as the table says."""
    rows = []
    for layer in ("attention", "rnn"):
        for d in (32, 64):
            for n in (64, 128, 256, 512):
                time = 1e-9 * (n * n * d if layer == "attention" else n * d * d)
                rows.append(
                    {
                        "case_id": f"{layer}/n={n}/d={d}",
                        "layer": layer,
                        "n": n,
                        "d": d,
                        "status": "ok",
                        "time_s": time,
                        "flops": int(time * 1e9),
                        "seq_steps": 7 if layer == "attention" else 3 * n + 2,
                        "path_len": 1 if layer == "attention" else n,
                        "path_len_method": "measured",
                    }
                )
    rows.append({"case_id": "rnn/n=1024/d=64", "layer": "rnn", "n": 1024, "d": 64, "status": "oom",
                 "error": "the process grew past 4 GiB"})  # fmt: skip
    frame = pd.DataFrame(rows).reindex(columns=RESULT_COLUMNS)
    frame["path_len_method"] = frame["path_len_method"].fillna("")
    return RunResults(Path("synthetic"), frame, pd.DataFrame(), {})


def test_the_table_puts_measured_exponents_beside_the_theory() -> None:
    run = _synthetic_run()
    table = comparison_table(run).set_index("layer")
    attention, rnn = table.loc["attention"], table.loc["rnn"]
    assert attention["compute (theory)"] == "O(n^2 d)"
    # exactly n^2, where the formula's slope over these lengths is under 2 (its n d^2 term):
    # the measured law is marked, as the note says (check_notes)
    assert attention["compute (measured)"] == "n^2.00 (disagrees) d^1.00"
    assert attention["sequential ops (measured)"] == "n^0.00"
    assert attention["max path length (measured)"] == "n^0.00"
    assert rnn["compute (measured)"] == "n^1.00 d^2.00"
    assert rnn["sequential ops (theory)"] == "O(n)"
    assert rnn["max path length (measured)"] == "n^1.00"
    assert rnn["left_out_cases"] == 1  # the oom case is not fitted, and the notes say so
    # Exact laws with no overhead: the fitted constant is 0, so every size is fitted.
    assert list(rnn["time_fit_n"]) == [64, 512]
    markdown = markdown_table(display(comparison_table(run)))
    assert markdown.splitlines()[0] == (
        "| layer | complexity | measured | sequential ops | measured | max path length | measured |"
    )
    assert "| rnn | O(n d^2) | n^1.00 d^2.00 | O(n) | n^1.00 | O(n) | n^1.00 |" in markdown
    notes = fit_notes(table.reset_index(), run)  # with why, as the sweep's summary says it
    assert any(
        "1 unmeasured case(s) (oom: the process grew past 4 GiB) left out" in x for x in notes
    )


def test_the_notes_say_where_torch_changed_a_layers_convolution_kernel() -> None:
    """conv-dilated read faster at n = 512 than at 256 as oneDNN took over from torch's
    reference kernel: the backend column names it, and the notes say where the kernel changed
    along n (a bend the exponent alone hides); one kernel throughout, or none, says nothing."""
    run = _synthetic_run()
    frame = run.frame
    rnn = frame["layer"] == "rnn"
    reference = "thnn_conv2d (torch's reference convolution)"
    onednn = "mkldnn_convolution (oneDNN convolution)"
    frame["backend"] = frame["backend"].astype(object)
    frame.loc[rnn, "backend"] = np.where(frame.loc[rnn, "n"] >= 256, onednn, reference)
    table = comparison_table(run).reset_index()
    (note,) = [n for n in fit_notes(table, run) if n.startswith("rnn:")]
    assert note.endswith(
        "its convolution kernel changed with n: thnn_conv2d at n = 64..128; mkldnn_convolution "
        "at n = 256..512 (results.csv's backend column)"
    )
    (other,) = [n for n in fit_notes(table, run) if n.startswith("attention: time ~")]
    assert "kernel changed" not in other  # none recorded
    frame.loc[rnn, "backend"] = onednn
    assert not any(
        "kernel changed" in n for n in fit_notes(comparison_table(run).reset_index(), run)
    )


def test_a_path_with_no_law_beyond_the_probes_gets_no_exponent() -> None:
    """Two measured paths (3, 7) and no law above them: fitting n^1.22 on those two would be the
    probes' exponent, not the layer's; the table says there is no law, and from where."""
    run = _synthetic_run()
    frame = run.frame
    attention = frame["layer"] == "attention"
    frame.loc[attention & (frame["n"] == 64), "path_len"] = 3
    frame.loc[attention & (frame["n"] == 128), "path_len"] = 7
    beyond = attention & (frame["n"] >= 256)
    frame.loc[beyond, "path_len"] = np.nan
    frame.loc[beyond, "path_len_method"] = "none: the pattern has no single band or block shape"
    table = comparison_table(run).set_index("layer")
    row = table.loc["attention"]
    assert row["max path length (measured)"] == "no law at n ≥ 256"
    assert pd.isna(row["path_len_exponent_n"]) and pd.isna(row["path_len_agrees"])
    assert row["path_len_unproven_from"] == 256
    assert table.loc["rnn", "max path length (measured)"] == "n^1.00"  # the other layer keeps its
    notes = fit_notes(table.reset_index(), run)
    assert any(
        note.startswith("attention: max path length has no law proven at n ≥ 256") for note in notes
    )
    assert not any(note.startswith("rnn: max path length has no law") for note in notes)


def test_a_layer_that_mixes_no_positions_reads_no_path_not_no_law() -> None:
    """Every case of a layer that mixes no positions has no path (``NO_MIXING``): the table says
    there is no path, not that a law was missing, and fits no exponent; the notes say why."""
    from attnbench.measure.counts.structure import NO_MIXING

    run = _synthetic_run()
    frame = run.frame
    attention = frame["layer"] == "attention"
    frame.loc[attention, "path_len"] = np.nan
    frame.loc[attention, "path_len_method"] = NO_MIXING
    table = comparison_table(run).set_index("layer")
    row = table.loc["attention"]
    assert row["max path length (measured)"] == "no path"
    assert pd.isna(row["path_len_exponent_n"]) and pd.isna(row["path_len_unproven_from"])
    notes = fit_notes(table.reset_index(), run)
    assert any(note.startswith("attention: no output depends on another") for note in notes)
    assert not any("has no law proven" in note for note in notes)
    # one position mixes with none whatever the layer: a case at n = 1 reads path 1, measured,
    # and the layer still reads no path from its longer cases
    one = frame[attention].iloc[[0]].assign(n=1, path_len=1, path_len_method="measured")
    longer = replace(run, frame=pd.concat([frame, one], ignore_index=True))
    cell = comparison_table(longer).set_index("layer").loc["attention"]
    assert cell["max path length (measured)"] == "no path"


@pytest.mark.slow
def test_table_command(tiny_run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    result = runner.invoke(app, ["table", str(tiny_run.path), "--markdown"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    layers = tiny_run.frame["layer"].nunique()  # one row per layer the run measured
    assert lines[0].startswith("| layer | complexity |") and len(lines) == 2 + layers
    assert "| attention | O(n^2 d) |" in result.stdout
    # what a figure cannot be trusted for goes with it, on stderr, as under the plain table
    plain = runner.invoke(app, ["table", str(tiny_run.path)])
    assert result.stderr and result.stderr == plain.stderr
    json_run = runner.invoke(app, ["table", str(tiny_run.path), "--json"])
    as_json = json.loads(json_run.stdout)
    assert {row["layer"] for row in as_json} == set(tiny_run.frame["layer"])
    assert json_run.stderr == plain.stderr
    monkeypatch.chdir(tmp_path)
    none = runner.invoke(app, ["table"])
    assert none.exit_code == 2 and "no results folder under 'results'" in none.stderr
    (tmp_path / "results").mkdir()
    import shutil

    shutil.copytree(tiny_run.path, tmp_path / "results" / "latest")
    latest = runner.invoke(app, ["table"])
    assert latest.exit_code == 0 and "comparison table" in latest.stdout


@pytest.mark.slow
def test_the_notes_split_each_time_exponent_into_work_and_rate() -> None:
    """rnn's counted work grows as n·d², and the machine ran it faster as n grew (rate ~
    n^0.2): the note says time n^0.80 is that work over that rate, and the fit's table reads
    the bend as the rate's; attention's rate held, so its time follows its work."""
    run = _synthetic_run()
    frame = run.frame
    rnn, attention = frame["layer"] == "rnn", frame["layer"] == "attention"
    frame.loc[rnn, "flops"] = 2 * frame["n"] * frame["d"] ** 2
    frame.loc[rnn, "time_s"] = 1e-9 * frame["n"] ** 0.8 * frame["d"] ** 2
    frame.loc[attention, "flops"] = 4 * frame["n"] ** 2 * frame["d"]
    table = comparison_table(run)
    notes = fit_notes(table, run)
    assert any(
        note.startswith("rnn: time ~ n^0.80 = work n^1.00 ÷ rate n^0.20, fitted at n=64..512")
        for note in notes
    ), notes
    # the d fit says its exponent: "time ~ d at n=512" read as linear beside rnn's d^0.48
    assert any("; time ~ d^2.00 fitted across d at n=" in note for note in notes), notes
    # a layer without a fit makes the column float: a new user's notes read "d=64.0"
    floated = table.assign(time_fit_d_at=table["time_fit_d_at"].astype(float))
    assert all("d=64.0" not in note for note in fit_notes(floated, run))
    assert any("n=64..512, d=64 " in note for note in fit_notes(floated, run))
    shown = split_display(analyse(run)).set_index("layer")
    assert SPLIT_NOTE in model_notes(analyse(run))  # how to read the table, beside it
    assert shown.loc["rnn", "reading"] == "rate rose ×1.5 with n"  # 512/64 = 8, 8^0.2 = 1.5
    assert shown.loc["attention", "reading"] == "rate steady: time follows the work"
    assert shown.loc["rnn", "time = work ÷ rate"] == "n^0.80 = n^1.00 ÷ n^0.20"
    assert shown.loc["rnn", "sizes"] == "n=64..512, d=64"
    # A convolution implementation recorded at the ends of the range, and changed between them.
    frame["backend"] = ""
    frame.loc[rnn & (frame["n"] == 512), "backend"] = "mkldnn_convolution (oneDNN convolution)"
    frame.loc[rnn & (frame["n"] == 64), "backend"] = "thnn_conv2d (torch's reference convolution)"
    shown = split_display(analyse(run)).set_index("layer")
    assert shown.loc["rnn", "reading"].endswith("; kernel thnn_conv2d → mkldnn_convolution")
    assert "kernel" not in shown.loc["attention", "reading"]
    # Without counted work there is nothing to split: the note keeps its plain form.
    frame["flops"] = np.nan
    notes = fit_notes(comparison_table(run), run)
    assert any(note.startswith("rnn: time ~ n fitted at n=64..512") for note in notes)
    assert split_display(analyse(run)).empty
    assert SPLIT_NOTE not in model_notes(analyse(run))


def test_the_reading_says_whether_the_machine_model_follows_the_bend() -> None:
    def row(model: float) -> pd.Series:
        return pd.Series({"rate_from": 100.0, "rate_to": 50.0, "rate_exponent": -0.3,
                          "exponent": 1.3, "model": model})  # fmt: skip

    assert _reading(row(1.25)) == "rate fell ÷2 with n; model n^1.25 follows"
    assert _reading(row(1.0)) == "rate fell ÷2 with n; model n^1.00, misses it"
    assert _reading(row(np.nan)) == "rate fell ÷2 with n"  # a run without ceilings
    assert _reading(row(1.25), (0.38, 0.03)) == (
        "rate fell ÷2 with n; model n^1.25 follows (latency 38% → 3% of it)"
    )
    switched = _reading(row(np.nan), None, ("thnn_conv2d", "mkldnn_convolution"))
    assert switched == "rate fell ÷2 with n; kernel thnn_conv2d → mkldnn_convolution"
    assert _reading(row(np.nan), None, ("mkldnn_convolution",) * 2) == "rate fell ÷2 with n"
    flat = pd.Series({"rate_from": 42.6, "rate_to": 42.0, "rate_exponent": 0.01,
                      "exponent": 1.0, "model": np.nan})  # fmt: skip
    assert _reading(flat) == "rate steady: time follows the work"
    assert _reading(flat, spread=1.83) == (
        "rate moved ×1.8 inside the range, with no trend end to end"
    )  # 42.6, 78.1, ..., 42 G/s: not steady
    assert _reading(flat, settled=False) == (  # as the growth table beside it reads it
        "rate held here, but not settled as table reads it (4 lengths within 20%, no trend)"
    )


def _line(times: list[float], shares: list[float] | None, layer: str = "conv") -> RunResults:
    """One layer at d = 64 over n = 64..1024, its work doubling with n."""
    ns = [64, 128, 256, 512, 1024]
    frame = pd.DataFrame(
        {"case_id": [f"{layer}/n={n}" for n in ns], "layer": layer, "n": ns, "d": 64,
         "status": "ok", "time_s": times, "flops": [1e6 * n for n in ns],
         "kernel_share": shares or [None] * len(ns), "path_len_method": ""}
    ).reindex(columns=RESULT_COLUMNS)  # fmt: skip
    frame["path_len_method"] = frame["path_len_method"].fillna("")
    return RunResults(Path("synthetic"), frame, pd.DataFrame(), {})


def test_a_layer_whose_kernels_are_a_sliver_of_its_time_reads_overhead_bound() -> None:
    """A GPU's default grid: the time flat while the work grows 16x. With its kernels
    measured (every length under half the time), or without (the time did not follow the
    work), the table names the regime instead of reading n^0.01."""
    flat = [3.0e-4, 3.1e-4, 2.9e-4, 3.0e-4, 3.05e-4]
    for shares in ([0.02, 0.03, 0.05, 0.1, 0.2], None):
        table = comparison_table(_line(flat, shares)).set_index("layer")
        assert table.loc["conv", "compute (measured)"] == "overhead-bound"
        assert not table.loc["conv", "time_settled_n"]
    table = comparison_table(_line(flat, [0.02, 0.03, 0.05, 0.1, 0.2]))
    assert table.loc[0, "overhead_bound_n"] == [64, 128, 256, 512, 1024]
    notes = fit_notes(table, _line(flat, None))
    assert any("overhead-bound at n = 64..1024" in note for note in notes)
    assert not any("settled all the same" in note for note in notes)


def test_a_line_whose_overhead_grows_with_its_work_reads_settled_and_says_why() -> None:
    """An RNN on a CPU: its kernels a third of its time at every length, its time n as its
    work (the dispatch of each step's ops grows with the steps). The exponent stands, and the
    note says why that is not a contradiction (a new user read one)."""
    steady = [3e-6 * n for n in (64, 128, 256, 512, 1024)]
    run = _line(steady, [0.3, 0.32, 0.33, 0.33, 0.34], layer="rnn")
    table = comparison_table(run)
    assert table.loc[0, "compute (measured)"] == "n^1.00"
    (note,) = [n for n in fit_notes(table, run) if n.startswith("rnn:")]
    assert "overhead-bound at n = 64..1024" in note
    assert "its rate settled all the same: the overhead grows with the work" in note
    # a fixed overhead below the lengths where the rate settled: no such note there
    ns = [64 * 2**i for i in range(12)]  # 64..131072
    fixed = pd.DataFrame(
        {"case_id": [f"conv/n={n}" for n in ns], "layer": "conv", "n": ns, "d": 64,
         "status": "ok", "time_s": [2e-5 + 1e-8 * n for n in ns],
         "flops": [1e6 * n for n in ns], "path_len_method": "",
         "kernel_share": [1e-8 * n / (2e-5 + 1e-8 * n) for n in ns]}
    ).reindex(columns=RESULT_COLUMNS)  # fmt: skip
    fixed["path_len_method"] = fixed["path_len_method"].fillna("")
    run = RunResults(Path("synthetic"), fixed, pd.DataFrame(), {})
    table = comparison_table(run)
    (note,) = [n for n in fit_notes(table, run) if n.startswith("conv:")]
    assert "where its rate settled" in note and "overhead-bound at n = 64.." in note
    assert "settled all the same" not in note


def test_a_share_that_crosses_half_back_and_forth_says_how_far_it_ranged() -> None:
    """ssm on a CPU: its kernels about half its time at every length, read 43%, 57%, 45%, 63%
    and 46%. Its overhead-bound lengths (64, 256, 1024) read as a pattern alone; the note says
    the share ranged about the line. A share that crosses once (rising with n) says nothing
    more."""
    steady = [3e-6 * n for n in (64, 128, 256, 512, 1024)]
    run = _line(steady, [0.43, 0.57, 0.45, 0.63, 0.46], layer="ssm")
    table = comparison_table(run)
    (note,) = [n for n in fit_notes(table, run) if n.startswith("ssm:")]
    assert "overhead-bound at n = 64, 256, 1024" in note
    assert "its share read 43% to 63% at n = 64..1024, back and forth across 50%: near" in note
    rising = _line(steady, [0.3, 0.45, 0.55, 0.6, 0.7], layer="conv")
    (note,) = [n for n in fit_notes(comparison_table(rising), rising) if n.startswith("conv:")]
    assert "overhead-bound at n = 64..128" in note and "back and forth" not in note


def test_a_rate_still_climbing_reads_unsettled_and_a_settled_one_plain() -> None:
    climbing = [1e-4 * n**0.5 for n in (64, 128, 256, 512, 1024)]  # rate ~ n^0.5: not settled
    table = comparison_table(_line(climbing, [0.6, 0.7, 0.8, 0.9, 0.95])).set_index("layer")
    assert table.loc["conv", "compute (measured)"] == "n^0.50 (unsettled, disagrees)"
    assert table.loc["conv", "overhead_bound_n"] == []
    steady = [1e-8 * n for n in (64, 128, 256, 512, 1024)]
    table = comparison_table(_line(steady, [0.3, 0.3, 0.3, 0.3, 0.3])).set_index("layer")
    # a Python loop: overhead-bound at every length, yet its time grows as its work
    assert table.loc["conv", "compute (measured)"] == "n^1.00"
    assert table.loc["conv", "time_agrees_n"]


def test_a_line_that_fell_off_a_plateau_is_fitted_on_it_and_says_how_far_it_fell() -> None:
    """Past a plateau a rate can fall at longer lengths: read at its top lengths
    alone, this line had no regime and was marked unsettled. It is fitted on the plateau,
    n^1.00, and the note says how far the rate fell past it."""
    ns = [64, 128, 256, 512, 1024]
    rate = [100.0, 101.0, 99.0, 100.0, 60.0]  # a plateau over 64..512, then 0.6x
    run = _line([1e6 * n / (r * 1e9) for n, r in zip(ns, rate, strict=True)], [0.9] * 5)
    table = comparison_table(run)
    assert table.loc[0, "compute (measured)"] == "n^1.00"
    assert table.loc[0, "time_fit_n"] == [64, 512] and table.loc[0, "time_settled_n"]
    (note,) = [n for n in fit_notes(table, run) if n.startswith("conv:")]
    assert "fitted at n=64..512, d=64 (where its rate settled); past it, to n=1024, its " \
        "rate did not settle again (it ends at 0.60x its rate at n=512)" in note  # fmt: skip
    uncounted = _line(run.frame["time_s"].tolist(), [0.9] * 5)
    uncounted.frame.loc[4, "flops"] = float("nan")  # the last length's work not counted
    (note,) = [n for n in fit_notes(comparison_table(uncounted), uncounted) if "conv:" in n]
    assert "nan" not in note
    steady = _line([1e-8 * n for n in ns], [0.9] * 5)  # settled at the top: no such words
    (plain,) = [n for n in fit_notes(comparison_table(steady), steady) if n.startswith("conv:")]
    assert "past it" not in plain


def test_an_unsettled_lines_note_says_what_stopped_it_and_no_exponent_reads_minus_zero() -> None:
    """A new user read "--n auto goes on until it is" beside a line the sweep had stopped on
    its share of the budget, and "rate n^-0.00" as a falling rate. The note names what
    stopped the line, and a flat slope reads 0.00."""
    ns = [64, 128, 256, 512, 1024]
    climbing = [1e-4 * n**0.5 for n in ns]  # rate ~ n^0.5: never settles
    run = _line(climbing, [0.9] * 5, layer="attention")
    lines = [{"layer": "attention", "d": 64, "stopped": "budget", "at_n": 1024, "why": "x"}]
    stopped = RunResults(run.path, run.frame, run.samples, {"auto": {"lines": lines}})
    found = fit_notes(comparison_table(stopped), stopped)
    (note,) = [n for n in found if n.startswith("attention: time ~")]
    assert "--n auto stopped it at n=1024 on its share of the budget, and a larger " \
        "--auto-budget takes it on)" in note  # fmt: skip
    (plain,) = [n for n in fit_notes(comparison_table(run), run) if "attention: time ~" in n]
    assert plain.endswith("of each other: --n auto goes on until it is)")
    flat = _line([1e-8 * n * (1 + 1e-4 * i) for i, n in enumerate(ns)], [0.9] * 5)
    (note,) = [n for n in fit_notes(comparison_table(flat), flat) if "conv:" in n]
    assert "rate n^0.00" in note and "-0.00" not in note
    from attnbench.units import fmt_exponent

    assert (fmt_exponent(-0.001), fmt_exponent(-0.006), fmt_exponent(0.004)) == (
        "0.00", "-0.01", "0.00")  # fmt: skip


def test_a_train_runs_table_says_which_columns_stay_the_forwards(tiny_run: RunResults) -> None:
    """seq_steps and path_len are traced on the forward call in every mode (``step.forward``):
    a train run's table, its time and FLOPs forward + backward, says so, and why attention-sdpa's
    FLOPs read over 3x its forward's; a forward run's says nothing of it."""
    from attnbench.spec import TRAIN_NOTE

    table = comparison_table(tiny_run)
    assert TRAIN_NOTE not in fit_notes(table, tiny_run)
    train = replace(tiny_run, frame=tiny_run.frame.assign(mode="train"))
    assert train.mode == "train"
    assert TRAIN_NOTE in fit_notes(comparison_table(train), train)
    assert "elementwise work, sequential ops and path length are the forward call" in TRAIN_NOTE


def test_fit_marks_a_time_whose_rate_did_not_settle_as_table_does(tiny_run: RunResults) -> None:
    """table read conv-dilated "n^0.88 (unsettled)" while fit gave a firm "no: flatter" with
    nothing to say why: fit's 'where' now reads 'rate unsettled' on such a time, and only
    there (exact counts and memory keep their rule)."""
    from attnbench.fits.exponents import RangeKind
    from attnbench.render.report import exponent_display

    analysis = analyse(tiny_run)
    shown = exponent_display(analysis, "n").reset_index(drop=True)
    e = analysis.exponents[analysis.exponents["along"] == "n"].reset_index(drop=True)
    e = e[e["fixed"] == e.groupby("layer")["fixed"].transform("max")].reset_index(drop=True)
    for row, where in zip(e.itertuples(), shown["where"], strict=True):
        unsettled = row.metric == "time_s" and row.range_rule.kind != RangeKind.SETTLED
        assert (where == "rate unsettled") == unsettled
    assert (shown["where"] == "rate unsettled").any()  # the tiny run's lines are too short


def test_a_time_exponent_that_disagrees_is_said_settled_or_not() -> None:
    """`table --json` judged an unsettled line's exponent (time_agrees_n false) and the table
    marked it "(unsettled)" only: a new user read attention-linear's n^0.85 as passing. A
    disagreement is now a note whether the rate settled or not; an agreement is none."""
    from attnbench.table import check_notes

    rows = pd.DataFrame(
        {
            "layer": ["attention-linear", "conv", "rnn", "attention"],
            "compute (measured)": ["n^0.85 (unsettled)", "n^0.70", "n^1.00", "overhead-bound d^0"],
            "time_agrees_n": [False, False, True, False],
            "time_settled_n": [False, True, False, False],
            "time_exponent_n": [0.85, 0.7, 1.0, 0.0],
            "time_theory_exponent_n": [1.0, 1.0, 1.0, 1.66],
            "time_overhead_bound_n": [False, False, False, True],
        }
    )  # an overhead-bound line (a GPU's attention at small n) is not read against the theory
    assert check_notes(rows) == [
        "attention-linear: time measured n^0.85 (unsettled) disagrees with n^1.00, its complexity "
        "formula's slope over the same lengths (lower terms included)",
        "conv: time measured n^0.70 where the rate settled disagrees with n^1.00, its complexity "
        "formula's slope over the same lengths (lower terms included)",
    ]
