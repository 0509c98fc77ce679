from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

import pandas as pd
import pytest
from typer.testing import CliRunner

from attnbench import __version__
from attnbench.cli import app
from attnbench.formats import FORMAT_VERSION
from attnbench.layers import BUILTIN

runner = CliRunner()
TINY = ["--n", "16", "--d", "8", "--heads", "2", "--device", "cpu", "--time-budget", "0.005"]


@pytest.mark.slow
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
    # how long the sweep took, as run.json's duration_s says (a new user found it only there)
    took = json.loads((out / "run.json").read_text())["duration_s"]
    assert f"run.json), {took:.0f} s of sweeping" in result.stderr.replace("\n", "")
    for name in ("results.csv", "samples.csv", "run.json"):
        assert (out / name).is_file()


@pytest.mark.slow
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
        # a close misspelling is named; a far one (cnn is not rnn) is not
        (["--layers", "atention"], "unknown layer 'atention' (did you mean 'attention'?); acc"),
        (["--layers", "cnn"], "unknown layer 'cnn'; accepted: conv"),
        # an abbreviation, its letters in order, is named too
        (["--layers", "attn"], "unknown layer 'attn' (did you mean 'attention'?); acc"),
        (["--layers", "ssmscan"], "unknown layer 'ssmscan' (did you mean 'ssm-scan'?); acc"),
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
        (["--config", "/"], "cannot read config file '/'"),
        (["--k", "0"], "--k must be >= 1"),
        (["--heads", "0"], "--heads must be >= 1"),
        (["--layers", "conv", "--n", "4,8", "--k", "5"], "--k 5 is larger than n=4"),
        (["--layers", ""], "--layers: cannot read ''"),
        (["--n", "64..8,"], "--n: cannot read"),
        (["--seed", "-1"], "--seed: expected an integer >= 0"),
        (["--time-budget", "0"], "--time-budget must be a positive number"),
        (["--max-case-seconds", "-2"], "--max-case-seconds must be a positive number"),
        (["--n", "64..1048576", "--d", "64..4096"], "pass --yes to run it anyway"),
        (["--force"], "--force applies only with --resume"),
        (["--retry"], "--retry applies only with --resume"),
        (["--resume", "/nonexistent/run"], "'/nonexistent/run' is not a folder"),
        (["--resume", "/"], "is not an attnbench results folder"),
        # rich's emoji codes are not read: a new user's plugin file.py:boom read "file.py💥"
        (["--layers", "nothere.py:boom:"], "--layers nothere.py:boom:: write module.path"),
        # Typer's usage errors, one line as the core's are (a new user's --layrs: five lines)
        (["--layrs", "conv"], "error: No such option: --layrs (did you mean --layers?)"),
        # only options that read alike: Click suggested --out for --bogus, --yes for --layer
        (["--bogus"], "error: No such option: --bogus\n"),
        (["--layer", "conv"], "No such option: --layer (did you mean --layers?)\n"),
        (["--n"], "error: Option '--n' requires an argument."),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["sweep", *args])
    assert result.exit_code == 2
    assert message in result.stderr
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:")


def test_an_option_given_twice_is_warned_of_and_the_last_is_used(tmp_path: Path) -> None:
    """Click keeps the last of an option given twice, as most command lines do, and said
    nothing: a new user's ``--layers mine.py:make ... --layers attention`` never swept the
    plugin. Now a warning names what was used and what dropped, once the arguments parse."""
    result = runner.invoke(
        app, ["sweep", "--layers", "mine.py:make", "--n=64", "--out", "--n", "--layers", "nosuch"]
    )
    assert result.exit_code == 2  # the last --layers was read: an unknown layer
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [
        "warning: --layers is given 2 times; the last is used (--layers nosuch), not --layers "
        "mine.py:make"
    ]  # "--out --n" is a folder named "--n", not --n given again
    assert "nosuch" in result.stderr.splitlines()[-1]
    # a usage error stays one line, with no warning beside it
    bad = runner.invoke(app, ["sweep", "--n", "1", "--n", "2", "--bogus"])
    assert bad.exit_code == 2 and len(bad.stderr.strip().splitlines()) == 1
    helped = runner.invoke(app, ["sweep", "--n", "1", "--n", "2", "--help"])
    assert helped.exit_code == 0 and "warning" not in helped.stderr
    # a group's own options, up to its subcommand
    history = runner.invoke(
        app, ["history", "--history", str(tmp_path / "a"), "--history", str(tmp_path / "b")]
    )  # fmt: skip
    assert f"the last is used (--history {tmp_path / 'b'})" in history.stderr


def test_a_repeated_short_count_or_many_valued_option_is_left_to_click():
    from types import SimpleNamespace as Param

    from attnbench.cli.app import repeated_options

    seed = Param(name="seed", opts=["--seed"], secondary_opts=[], help="The random seed.")
    count = Param(name="verbose", opts=["-v", "--verbose"], secondary_opts=[], count=True)
    pair = Param(name="size", opts=["--size"], secondary_opts=[], nargs=2)
    params = [seed, count, pair]
    args = ["--seed", "1", "-v", "-v", "--size", "1", "2", "--seed=2", "--size", "3", "4"]
    assert repeated_options(params, args) == [
        "--seed is given 2 times; the last is used (--seed 2), not --seed 1"
    ]
    assert repeated_options(params, ["--seed", "1", "go", "--seed", "2"], stop={"go"}) == []


def test_no_command_prints_the_help_and_no_error_line() -> None:
    result = runner.invoke(app, [])
    assert result.exit_code == 2 and "Usage: attnbench" in result.stdout
    assert "error" not in result.stderr
    unknown = runner.invoke(app, ["nosuch"])
    assert unknown.exit_code == 2
    assert unknown.stderr.strip() == "error: No such command 'nosuch'."


@pytest.mark.slow
def test_resume_with_retry_measures_a_failed_case_again(tmp_path: Path) -> None:
    out = tmp_path / "run"
    first = runner.invoke(app, ["sweep", *TINY, "--layers", "conv", "--out", str(out)])
    assert first.exit_code == 0, first.output
    rows = (out / "results.csv").read_text().splitlines()
    status = rows[0].split(",").index("status")
    cells = rows[1].split(",")
    cells[status] = "failed"  # as a case blamed for a kill would read
    (out / "results.csv").write_text("\n".join([rows[0], ",".join(cells), *rows[2:]]) + "\n")
    plain = runner.invoke(app, ["sweep", "--resume", str(out), "--json", "--no-charts"])
    assert [r["status"] for r in json.loads(plain.stdout)["results"]] == ["failed"]
    again = runner.invoke(app, ["sweep", "--resume", str(out), "--retry", "--json", "--no-charts"])
    assert again.exit_code == 0, again.output
    assert "(complete, 0 of 1 cases on disk, 1 to measure again)" in again.stderr
    assert [r["status"] for r in json.loads(again.stdout)["results"]] == ["ok"]


@pytest.mark.slow
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
    assert again.exit_code == 2 and "already holds a complete run" in again.stderr
    assert "--resume" not in again.stderr  # nothing to finish: a new user was sent to resume it
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


def test_no_help_shows_a_type_beside_an_on_off_flag() -> None:
    """typer 0.29 wrote "<bool>" beside every flag: a new user read ``--causal <bool>`` as
    taking a value. Options that take one keep their type."""
    names = [info.name or info.callback.__name__.replace("_", "-")  # type: ignore[union-attr]
             for info in app.registered_commands]  # fmt: skip
    for command in [[], *([name] for name in names), ["history"], ["history", "publish"]]:
        shown = runner.invoke(app, [*command, "--help"], terminal_width=200).stdout
        assert "<bool>" not in shown and "--help " in shown, command
    sweep = runner.invoke(app, ["sweep", "--help"], terminal_width=200).stdout
    assert "<int>" in next(line for line in sweep.splitlines() if "--seed" in line)
    assert "'attnbench[gpu]'" in sweep  # not read as markup (it showed 'attnbench')
    # the defaults a help states are those set (it said 60 after the CPU's became 100)
    from attnbench.options import CPU_DEFAULT_AUTO_BUDGET_S
    from attnbench.spec import Grid

    said = " ".join(sweep.split("--auto-budget", 1)[1].replace("│", " ").split())
    assert f"Default: {Grid().auto_budget_s:g}, or {CPU_DEFAULT_AUTO_BUDGET_S:g} in" in said


@pytest.mark.slow
def test_every_commands_help_wraps_at_the_terminals_width() -> None:
    """Typer keeps a docstring's line breaks: a paragraph wrapped at 96 columns in the source
    broke again at 80 ("... round after" / "round, so ..."). A line may end early only where
    the next word would not have fitted, or at a paragraph's end."""
    from attnbench.cli.app import help_text

    assert help_text("First.\n\n    One\n    paragraph.\n\n    - a\n    - list") == (
        "First.\n\nOne paragraph.\n\n- a\n- list"
    )
    names = [c.callback.__name__ for c in app.registered_commands]  # type: ignore[union-attr]
    assert len(names) >= 13
    for info in app.registered_commands:
        name = info.name or info.callback.__name__.replace("_", "-")  # type: ignore[union-attr]
        result = runner.invoke(app, [name, "--help"], terminal_width=80)
        assert result.exit_code == 0, name
        text = result.stdout.split("Usage:", 1)[1].split("╭", 1)[0]
        lines = [line.rstrip() for line in text.splitlines()[1:]]
        for line, after in itertools.pairwise(lines):
            if line.strip() and after.strip():
                word = after.split()[0]
                assert len(line) + 1 + len(word) > 78, f"{name}: {line!r} / {after!r}"
    # off a terminal (a pager, a file), no word of any command's help is cut
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "TERMINAL_WIDTH")}
    for command in (["sweep"], ["ab"], ["compare"]):
        shown = [sys.executable, "-m", "attnbench", *command, "--help"]
        piped = subprocess.run(shown, capture_output=True, text=True, env=env, check=True).stdout
        assert "…" not in piped and max(map(len, piped.splitlines())) <= 120, command
        assert "path/to/file.py:factory" in piped or command == ["compare"]


def test_a_lopsided_interval_reads_by_both_ends() -> None:
    """A busy machine's interval reaches down to a quiet re-run: "±45.0%" read as though a
    re-run might be 45% slower. A log interval's own slight lean still reads as one ±."""
    from attnbench.cli.imprecise import reach_text as _reach

    assert _reach(1.0, 0.55, 1.08) == "-45.0/+8.0%"
    assert _reach(1.0, 0.92, 1.45) == "-8.0/+45.0%"
    assert _reach(1.0, 1 / 1.1, 1.1) == "±10.0%"  # a log interval's: -9.1%/+10.0%
    # symmetric in logs, but "±80.4%" read as reaching near zero: both ends
    assert _reach(1.0, 1 / 1.804, 1.804) == "-44.6/+80.4%"
    assert _reach(1.0, 1 / 1.2, 1.2) == "±20.0%"  # -16.7/+20.0%: one ± is near enough
    assert _reach(1.0, 0.9, 1.12) == "±12.0%"
    assert _reach(1.0, 1.0, 1.2) == "-0.0/+20.0%"  # it does not reach down at all
    assert _reach(1.0, 0.99, 1.04) == "±4.0%"  # within the mark's ±5%: one figure is enough


def test_the_advice_names_only_the_cases_more_processes_narrow() -> None:
    """A new user's note: "37 had fewer than two quiet rounds ...; 2 had their processes read
    far apart; 15 ran most of their rounds on a disturbed machine. For the other 17: ...
    --max-processes 26": the 17 counted the 15 a disturbed machine widened, which more
    processes do not narrow. The advice is for the far apart and the few rounds alone."""
    from attnbench.cli.imprecise import _for_those, _reasons

    marked = pd.DataFrame({
        "rounds": [6, 2, 6, 3], "rounds_disturbed": [0, 4, 0, 0],
        "spread_between": [0.03, 0.02, 0.12, 0.01],
    })  # fmt: skip
    busy = pd.Series([True, False, False, False])
    _, disturbed, apart, few, one = _reasons(marked, busy)
    assert list(disturbed) == [False, True, False, False]
    assert list(apart | few) == [False, False, True, True] and not one.any()
    advice = "At the median spread between their processes, 6.0%, a case needs about 12."
    assert _for_those(apart | few, advice) == (
        "For the 2 that more processes would narrow: at the median spread between their "
        "processes, 6.0%, "
        "a case needs about 12."
    )
    assert _for_those(pd.Series([True, True]), advice) == advice


def test_a_case_that_failed_a_check_shows_the_figures_it_kept(tiny_run) -> None:  # type: ignore[no-untyped-def]
    """A decode case whose tokens differ from the parallel output keeps its time, FLOPs and
    state (results.csv has them, as the docs say); the table printed a bare "failed" row."""
    import io
    from dataclasses import replace

    from rich.console import Console

    from attnbench.cli.summary import summary_tables

    frame = tiny_run.frame.copy()
    frame.loc[0, "status"] = "failed"
    frame.loc[0, "error"] = "its decoded tokens differ from the causal layer's output by 1"
    buf = io.StringIO()
    summary_tables(replace(tiny_run, frame=frame), Console(file=buf, width=200))
    row = next(line for line in buf.getvalue().splitlines() if " failed " in line and "│" in line)
    from attnbench.units import fmt_seconds

    assert f"{fmt_seconds(float(frame.loc[0, 'time_s']))} failed" in row
    cells = [cell.strip() for cell in row.split("│")[1:-1]]
    header = next(line for line in buf.getvalue().splitlines() if "┃" in line and "FLOPs" in line)
    named = dict(zip([h.strip() for h in header.split("┃")[1:-1]], cells, strict=True))
    # its figures, kept: the between-processes cell is blank wherever that spread is no wider
    # than the within-process one, failed or not
    assert all(named[k] for k in ("n", "d", "time", "±95%", "peak mem", "FLOPs")), named
    assert "its decoded tokens differ" in buf.getvalue()


def test_summary_marks_noisy_cases_and_flop_mismatches(tiny_run) -> None:  # type: ignore[no-untyped-def]
    import io
    from dataclasses import replace

    from rich.console import Console

    from attnbench.cli.summary import summary_notes, summary_tables

    frame = tiny_run.frame.copy()
    # a real tiny run may be imprecise itself: pin every row's interval first
    frame["time_ci_low_s"] = frame["time_s"] * 0.99
    frame["time_ci_high_s"] = frame["time_s"] * 1.01
    frame["flops_check"] = "ok"
    frame.loc[0, "time_ci_high_s"] = frame.loc[0, "time_s"] * 1.5
    frame.loc[1, "flops_check"] = "mismatch"
    # a log interval of a factor of 104 each way reads as one, not as "±10300.0%"
    frame.loc[2, "time_ci_low_s"] = frame.loc[2, "time_s"] / 104
    frame.loc[2, "time_ci_high_s"] = frame.loc[2, "time_s"] * 104
    # one case's processes read further apart than its samples; the others' cells stay blank
    frame["spread_within"], frame["spread_between"] = 0.02, 0.01
    frame.loc[0, "spread_between"] = 0.04
    buf = io.StringIO()
    console = Console(file=buf, width=200)
    summary_tables(replace(tiny_run, frame=frame), console)
    summary_notes(replace(tiny_run, frame=frame), console)
    text = buf.getvalue()
    assert "2 case(s) marked ! have a 95% interval wider than ±5%" in text
    # which reason holds for how many, not a list of three to guess from
    from attnbench.cli.imprecise import _reasons, _why_imprecise

    marked = frame.loc[[0, 2]].assign(rounds=[6, 3], rounds_disturbed=[0, 0])
    marked["spread_between"] = [0.064, 0.08]
    neither = pd.Series([False, False], index=marked.index)

    def why(frame: pd.DataFrame, quiet: pd.Series = neither) -> str:
        return _why_imprecise(frame, _reasons(frame, quiet))

    assert why(marked) == (
        "Of them, 1 had its processes read far apart (±6.4%); 1 had 3 rounds or fewer, or "
        "processes that read within ±5%, which the run's typical spread widened."
    )
    # six rounds whose processes read within ±5% are wide for the run's spread, not their own
    assert why(marked.assign(spread_between=[0.04, 0.08])) == (
        "Of them, 2 had 3 rounds or fewer, or processes that read within ±5%, which the run's "
        "typical spread widened."
    )
    # 6 kept, 4 left out: under half of the 10 it ran; 3 kept, 2 left out: under half of 5
    assert "disturbed" not in why(marked.assign(rounds_disturbed=[4, 2]))
    assert why(marked.assign(rounds_disturbed=[7, 4])) == (
        "Of them, 2 ran most of their rounds on a disturbed machine, left out, so their "
        "interval is mostly the run's typical spread over the rounds kept (alike for cases "
        "that kept as many; a quieter machine narrows it)."
    )
    # every round kept, one of them read quiet: its interval reaches down, more rounds or not
    first = pd.Series([True, False], index=marked.index)
    assert why(marked.assign(rounds_disturbed=[5, 4]), first) == (
        "Of them, 1 had fewer than two quiet rounds, so its ±95% reaches down to what a quiet "
        "re-run finds (no more processes narrow that; a quieter machine does); 1 ran most of "
        "its rounds on a disturbed machine, left out, so its interval is mostly the run's "
        "typical spread over the rounds kept (alike for cases that kept as many; a quieter "
        "machine narrows it)."
    )
    # a case of one round has a reason of its own, not "3 rounds or fewer ... widened"
    assert why(marked.assign(rounds=[6, 1])) == (
        "Of them, 1 had its processes read far apart (±6.4%); 1 was timed in one process."
    )
    # an interval reaching 50% up and 1% down reads by both ends, not as ±50.0%
    assert "-1.0/+50.0% !" in text and "±50.0%" not in text
    assert "±1.0%" in text and "×/÷104 !" in text
    assert "10300" not in text
    # a new user read "1.75" faults as a count and an empty between cell as missing
    assert "faults/call" in text and text.count("±4.0%") == 1
    assert text.count("±1.0%") == len(frame) - 2  # the other rows' intervals, no between cell
    blank = "(the between column, blank for a case timed in a single process or whose processes"
    assert blank in " ".join(text.split())
    assert (
        f"counted FLOPs differ from the analytic formula by more than 1% in 1 case(s) "
        f"({frame.loc[1, 'layer']})" in text
    )


def test_the_marks_note_says_how_many_processes_would_narrow_a_typical_case(  # type: ignore[no-untyped-def]
    tiny_run,
) -> None:
    """82 of a new user's 83 cases read !, their processes a median 5.4% apart: the note says
    what would narrow them (about 12 processes), from the estimator's own interval; where the
    run already gave as many, it says only that more narrow it."""
    import io
    from dataclasses import replace

    from rich.console import Console

    from attnbench.cli.summary import summary_notes

    frame = tiny_run.frame.copy()
    frame["time_ci_low_s"] = frame["time_s"] * 0.9
    frame["time_ci_high_s"] = frame["time_s"] * 1.1
    frame["rounds"], frame["spread_between"] = 6, 0.054
    frame["rounds_disturbed"] = 0  # whatever this machine read: no case a busy machine's
    frame["time_stop"] = "max rounds"
    buf = io.StringIO()
    summary_notes(replace(tiny_run, frame=frame), Console(file=buf, width=2000))
    said = "a case needs about 12 processes to reach ±5% on this machine as it was"
    assert f"between their processes, 5.4%, {said}: --max-processes 12 " in buf.getvalue()
    assert "ran out of --time-budget" not in buf.getvalue()
    # where the budget ended some of their rounds, more processes alone would not reach them
    frame["time_stop"] = ["budget", "budget", *["max rounds"] * (len(frame) - 2)]
    buf = io.StringIO()
    summary_notes(replace(tiny_run, frame=frame), Console(file=buf, width=2000))
    named = f"2 of them ({frame.loc[0, 'layer']} n={frame.loc[0, 'n']}, {frame.loc[1, 'layer']}"
    assert f"needs fewer. {named}" in buf.getvalue()
    assert "ran out of --time-budget first: raise it as well." in buf.getvalue()
    frame["rounds"] = 12
    buf = io.StringIO()
    summary_notes(replace(tiny_run, frame=frame), Console(file=buf, width=2000))
    assert "More --processes narrow them, a quieter machine more. 2 of them (" in buf.getvalue()
    frame["time_stop"] = "max rounds"
    buf = io.StringIO()
    summary_notes(replace(tiny_run, frame=frame), Console(file=buf, width=2000))
    assert "More --processes narrow them, a quieter machine more." in buf.getvalue()
    frame["rounds"], frame["spread_between"] = 2, 0.47  # a busy machine (a new user read 758)
    frame["time_stop"] = "budget"  # no "raise it as well": a budget buys processes, too many
    buf = io.StringIO()
    summary_notes(replace(tiny_run, frame=frame), Console(file=buf, width=2000))
    said = " ".join(buf.getvalue().split())
    assert "A quieter machine narrows them: at the median spread between their processes" in said
    assert "would need about 716 processes to reach ±5%, too many to give, as an" in said
    assert "--max-processes" not in said and "--time-budget" not in said


def test_summary_tables_cut_no_cell_in_a_log(
    tiny_run,  # type: ignore[no-untyped-def]
) -> None:
    """Off a terminal (a log, a file) at 120 columns a table of 14 columns was cut: "1638…"
    for 16383, "±14.3%…" for "±14.3% !". A log gets the width the table needs; a terminal
    keeps its own width (no row runs past it)."""
    import io
    from dataclasses import replace

    from rich.console import Console

    from attnbench.cli.summary import summary_tables

    frame = tiny_run.frame.copy()
    frame["time_ci_low_s"] = frame["time_s"] * 0.88
    frame["time_ci_high_s"] = frame["time_s"] * 1.143  # "±14.3% !"
    run = replace(tiny_run, frame=frame)
    log = io.StringIO()
    summary_tables(run, Console(file=log, width=60))
    assert "…" not in log.getvalue() and "±14.3% !" in log.getvalue()
    assert max(map(len, log.getvalue().splitlines())) > 60
    narrow = io.StringIO()
    summary_tables(run, Console(file=narrow, width=60, force_terminal=True, color_system=None))
    assert max(map(len, narrow.getvalue().splitlines())) <= 60
    # Rich squeezed every column, and n and d went first: at 80 and 100 columns a new user's
    # rows read "│ … │  │ 29.6… │". The last columns are left out instead, and a line says which.
    rows = [line.split("│") for line in narrow.getvalue().splitlines() if line.startswith("│")]
    assert [row[1].strip() for row in rows[:2]] == ["16", "32"]
    assert {row[2].strip() for row in rows} == {"8"} and all("±14.3% !" in r[4] for r in rows)
    said = " ".join(narrow.getvalue().split())
    # the chapter's columns (path, steps, FLOPs) and memory are the last to go
    left = said.split("columns left out to fit this terminal's 60 columns: ")[1].split(" (")[0]
    assert left.split(", ")[:2] == ["elem.", "faults/call"] and "path" not in left
    assert "…" not in said and "path" in said.split("columns left out")[0]
    # a column one table lost and another kept says whose: a new user read "between" as gone
    # from all eleven where conv's table alone had lost it
    from attnbench.cli.summary import left_out_names

    found = left_out_names(
        {"elem.": ["conv", "rnn"], "between": ["conv"]}, {"elem.": 2, "between": 11}
    )
    assert found == ["elem.", "between (in conv)"]


def test_a_layer_whose_cases_were_all_skipped_keeps_its_title_on_one_line(
    tiny_run,  # type: ignore[no-untyped-def]
) -> None:
    """Its table has three narrow columns (n, d, "skipped"), and Rich wrapped the title "(decode:
    one generated token at context n)" to their width, over three lines."""
    import io
    from dataclasses import replace

    from rich.console import Console

    from attnbench.cli.summary import summary_tables

    frame = tiny_run.frame.copy()
    first = frame["layer"] == frame["layer"].iloc[0]
    frame.loc[first, "status"] = "skipped"
    frame["mode"] = "decode"
    out = io.StringIO()
    summary_tables(replace(tiny_run, frame=frame), Console(file=out, width=120))
    lines = out.getvalue().splitlines()
    title = f"{frame['layer'].iloc[0]} (decode: one generated token at context n)"
    assert lines[0] == title and lines[1].startswith("┏━━")
    # a table wider than its title keeps the title above it, in the table
    others = [x for x in lines if "(decode: one generated token at context n)" in x]
    assert len(others) == frame["layer"].nunique()


def test_config_with_wrong_types_or_unknown_keys_is_one_line(tmp_path: Path) -> None:
    for text, message in [
        ("layers = 5\n", "--layers: expected layer names, got 5"),
        ("n = 64.5\n", "--n: expected a list like 64,128"),
        ('k = "3"\n', "--k: expected an integer, got '3'"),
        ("seed = 1.5\n", "--seed: expected an integer >= 0"),
        ("windows = 3\n", "unknown key(s) windows; accepted: layers"),
        ("n = [64\n", "is not valid TOML"),
    ]:
        config = tmp_path / "sweep.toml"
        config.write_text(text)
        result = runner.invoke(app, ["sweep", "--config", str(config)])
        assert result.exit_code == 2, text
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and message in lines[0], (text, result.stderr)


def test_yes_lets_a_large_sweep_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from attnbench.errors import AttnbenchError
    from attnbench.run.executors.serial import SerialExecutor

    started: list[int] = []

    def fake_start(self, grid):  # type: ignore[no-untyped-def]
        started.append(len(grid.cases()))
        raise AttnbenchError("stop here")

    monkeypatch.setattr(SerialExecutor, "start", fake_start)
    big = ["--n", "64..1048576", "--d", "64..4096", "--device", "cpu", "--out", str(tmp_path / "r")]
    refused = runner.invoke(app, ["sweep", *big])
    assert refused.exit_code == 2 and "would take at least about" in refused.stderr
    assert started == []  # refused before any worker started
    accepted = runner.invoke(app, ["sweep", *big, "--yes"])
    assert "stop here" in accepted.stderr and started == [15 * 7 * len(BUILTIN)]


def test_a_stop_without_charts_is_resumed_without_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run.json keeps the grid, not the command's display flags: the --resume a stopped
    --no-charts sweep printed drew the charts its first command had declined."""
    from attnbench.cli import sweeping
    from attnbench.run.executors.serial import SerialExecutor

    def stopped(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(SerialExecutor, "ceilings", stopped)
    out = tmp_path / "r"
    args = ["sweep", *TINY, "--layers", "conv", "--n", "8", "--out", str(out)]
    declined = runner.invoke(app, [*args, "--no-charts"])
    assert declined.exit_code == 130
    assert declined.stderr.rstrip().endswith(f"--resume {out} --no-charts"), declined.stderr
    drawn = runner.invoke(app, [*args[:-1], str(tmp_path / "s")])
    assert drawn.exit_code == 130
    assert drawn.stderr.rstrip().endswith(f"--resume {tmp_path / 's'}"), drawn.stderr
    # a CI job's gate is not in run.json either: its resume compared nothing and exited 0
    base = tmp_path / "base dir"
    gated = [*args[:-1], str(tmp_path / "g"), "--baseline", str(base), "--fail-on=time"]
    monkeypatch.setattr(sweeping, "load_results", lambda path: None)  # no baseline to read
    stopped_ci = runner.invoke(app, [*gated, "--strict", "--no-charts", "--quiet"])
    assert stopped_ci.exit_code == 130
    assert stopped_ci.stderr.rstrip().endswith(
        f"--resume {tmp_path / 'g'} --baseline '{base}' --fail-on=time --strict --no-charts --quiet"
    ), stopped_ci.stderr


@pytest.mark.slow
def test_resume_through_the_cli(tmp_path: Path) -> None:
    out = tmp_path / "run"
    first = runner.invoke(
        app, ["sweep", *TINY, "--layers", "conv", "--n", "8,16", "--out", str(out)]
    )
    assert first.exit_code == 0
    # Drop the last case, as if the sweep had been stopped before it.
    csv = out / "results.csv"
    csv.write_text("".join(csv.read_text().splitlines(keepends=True)[:-1]))
    changed = runner.invoke(app, ["sweep", "--resume", str(out), "--n", "8,16,32"])
    assert changed.exit_code == 2 and "pass --force" in changed.stderr
    with_out = runner.invoke(app, ["sweep", "--resume", str(out), "--out", str(tmp_path / "x")])
    assert with_out.exit_code == 2 and "leave out --out" in with_out.stderr
    resumed = runner.invoke(app, ["sweep", "--resume", str(out), "--json"])
    assert resumed.exit_code == 0, resumed.output
    assert "resuming" in resumed.stderr and "1 of 2 cases on disk" in resumed.stderr
    assert [r["n"] for r in json.loads(resumed.stdout)["results"]] == [8, 16]
    assert "2 of 2 cases: 2 measured, 0 oom, 0 timeout, 0 skipped, 0 failed" in resumed.stderr


@pytest.mark.slow
def test_oom_cases_are_counted_and_the_exit_code_stays_0(tmp_path: Path, add_layer) -> None:  # type: ignore[no-untyped-def]
    import torch

    class Hungry(torch.nn.Module):
        def __init__(self, d: int) -> None:
            super().__init__()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.shape[1] > 8:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            return x

    add_layer("hungry", Hungry)
    out = tmp_path / "run"
    args = ["--layers", "hungry", "--n", "8..32", "--d", "8", "--device", "cpu"]
    result = runner.invoke(app, ["sweep", *args, "--time-budget", "0.002", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "[2/3] hungry n=16 d=8  OOM: OutOfMemoryError: CUDA out of memory" in result.stderr
    assert "[3/3] hungry n=32 d=8  SKIPPED: after hungry n=16 d=8 ran out of memory" in (
        result.stderr
    )
    # The summary is the command's product (stdout); notes go to stderr with the progress.
    assert "3 of 3 cases: 1 measured, 1 oom, 0 timeout, 1 skipped, 0 failed" in result.stdout
    assert "2 case(s) have no measurements" in result.stderr
    # and each layer's first reason, which a new user's decode sweep found only in results.csv
    assert "\n  hungry: OutOfMemoryError: CUDA out of memory" in result.stderr


@pytest.mark.slow
def test_show_prints_a_saved_run_and_refuses_what_is_not_one(  # type: ignore[no-untyped-def]
    tiny_run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shown = runner.invoke(app, ["show", str(tiny_run.path)])
    assert shown.exit_code == 0
    assert f"results in {tiny_run.path}" in shown.stderr.replace("\n", "")
    assert f"{len(tiny_run.frame)} of {len(tiny_run.frame)} cases" in shown.stdout
    # named or not, as table and fit read a run: the newest under results/
    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny_run.path, tmp_path / "results" / "newest")
    newest = runner.invoke(app, ["show"])
    assert newest.exit_code == 0 and newest.stdout == shown.stdout
    assert "committed to this repository" not in newest.stderr
    # a fresh clone's newest run is one the manual shows, not the user's: table read it as
    # though it were, before any sweep of theirs; a note says so (the output is the same)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    git += ["-C", str(tmp_path)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "results"], check=True)
    subprocess.run([*git, "commit", "-qm", "runs"], check=True)
    committed = runner.invoke(app, ["show"])
    assert committed.exit_code == 0 and committed.stdout == shown.stdout
    said = " ".join(committed.stderr.split())
    assert "note: results/newest, the newest run under results, is one committed to this" in said
    assert "(in a fresh clone, a run the manual shows, not yours): name a results folder" in said
    as_json = runner.invoke(app, ["show", str(tiny_run.path), "--json"])
    assert json.loads(as_json.stdout)["status"] == "complete"
    for folder, message in [
        (tmp_path / "missing", "is not a folder"),
        (tmp_path, "is not an attnbench results folder"),
    ]:
        result = runner.invoke(app, ["show", str(folder)])
        assert result.exit_code == 2 and message in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    broken = tmp_path / "broken"

    shutil.copytree(tiny_run.path, broken)
    (broken / "run.json").write_text('{"schema_version": 0}')
    result = runner.invoke(app, ["show", str(broken)])
    says = f"schema version 0; this attnbench reads versions 1 to {FORMAT_VERSION}"
    assert result.exit_code == 2 and says in result.stderr


@pytest.mark.slow
def test_the_cli_stands_without_click() -> None:
    """Typer 0.29 no longer installs Click: `pip install attnbench` alone has none, and a
    command must still run and refuse bad input in one line."""
    block = "import sys; sys.modules['click'] = None; from attnbench.cli import main; main()"
    ok = subprocess.run([sys.executable, "-c", block, "--version"], capture_output=True, text=True)
    assert ok.returncode == 0 and ok.stdout.strip().startswith("attnbench"), ok.stderr
    bad = subprocess.run(
        [sys.executable, "-c", block, "sweep", "--n", "0"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr
    assert len([line for line in bad.stderr.splitlines() if line.strip()]) == 1


def test_a_narrow_terminal_folds_cells_and_keeps_layer_names_whole() -> None:
    """`layers` in a narrow terminal cut a plugin's name to 'plugins:perform…' and its source
    path with it; a table now folds long cells onto more lines and cuts none."""
    import io

    import pandas as pd
    from rich.console import Console

    from attnbench.cli.render import frame_table

    name = "plugins:performer_with_a_long_name"
    source = "/home/someone/projects/attention/variants/plugins.py:performer (sha256 9752be681a90)"
    frame = pd.DataFrame(
        [{"layer": name, "family": "custom", "FLOPs (forward)": "no theory" * 4, "source": source}]
    )
    buffer = io.StringIO()
    frame_table(frame, Console(file=buffer, width=70, color_system=None), title="layers")
    text = buffer.getvalue()
    assert "…" not in text
    rows = [line.split("│")[1:-1] for line in text.splitlines() if line.startswith("│")]
    column = ["".join(row[i] for row in rows).replace(" ", "") for i in range(4)]  # unfolded
    assert column[0] == name
    assert column[3] == source.replace(" ", "")


def test_drawing_the_charts_after_a_sweep_is_said_in_a_terminal(tiny_run, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Ten seconds or more of charts after the tables (the default run) looked hung: a
    terminal shows a status while they are drawn; a log gets only the line after."""
    import io
    from pathlib import Path

    from rich.console import Console
    from rich.text import Text

    from attnbench.cli import sweeping
    from attnbench.cli.render import Streams

    seen: list[bool] = []

    def plot(run, analysis=None):  # type: ignore[no-untyped-def]
        seen.append(bool(shown))  # a status was up while they were drawn
        return [Path("run/charts/time.png")]

    monkeypatch.setattr(sweeping, "plot_run", plot)
    for terminal in (True, False):
        buffer = io.StringIO()
        notes = Console(file=buffer, force_terminal=terminal, width=100)
        shown: list[str] = []
        real_status = notes.status

        def status(message, real_status=real_status, shown=shown):  # type: ignore[no-untyped-def]
            shown.append(message)
            return real_status(message)

        notes.status = status  # type: ignore[method-assign]
        streams = Streams(out=notes, err=notes, notes=notes, human=notes)
        paths, _ = sweeping._charts_after_sweep(tiny_run, streams)
        assert paths == ["run/charts/time.png"]
        assert seen[-1] is terminal
        text = Text.from_ansi(buffer.getvalue()).plain
        assert bool(shown) is terminal and all("drawing the charts" in m for m in shown)
        assert "charts: 1 files in run/charts" in text


@pytest.mark.usefixtures("read_as_a_user_reads")
def test_a_finished_sweep_says_how_many_time_exponents_agree_with_the_chapter(
    tiny_run,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A new user could not tell from the notes whether the first sweep worked: its last
    line says how many time exponents agree with the theory, as table reads them: an
    overhead-bound layer (no exponent in the table) and one not judged counted apart, not as
    disagreeing. It is read from the one analysis the charts were drawn from."""
    import io

    import pandas as pd
    from rich.console import Console

    from attnbench.cli import sweeping
    from attnbench.cli.render import Streams
    from attnbench.fits import analyse
    from attnbench.results.loader import load_results

    # ci-reference: most of its eleven layers overhead-bound on the CI runner's short lengths
    committed = load_results(Path(__file__).parents[1] / "results" / "ci-reference")
    line = sweeping.chapter_line(committed, analyse(committed)) or ""
    shown = runner.invoke(app, ["table", str(committed.path)]).stdout
    bound = shown.count("overhead-bound")
    assert bound >= 5 and f"{bound} overhead-bound (" in line
    assert line.startswith("the chapter's table: ")  # some judged, or none: either is said
    assert " time exponents in n agree" in line or "no time exponent in n judged" in line
    rows = pd.DataFrame(
        {
            "layer": ["a", "b", "c", "d", "e", "f"],
            "time_agrees_n": [True, False, None, True, False, None],
            "time_overhead_bound_n": [False, False, False, False, True, False],
            "time_exponent_n": [1.0, 0.812, 1.5, 2.0, 1.0, 1.2],
            "time_theory_exponent_n": [1.0, 1.0, 1.0, 2.0, 1.0, None],
            "compute (theory)": ["O(n d^2)", "O(n d^2)", "O(n d^2)", "O(n^2 d)", "", ""],
        }
    )
    used: list[object] = []

    def table(run, analysis):  # type: ignore[no-untyped-def]
        used.append(analysis)
        return rows

    monkeypatch.setattr(sweeping, "comparison_table", table)
    said = sweeping.chapter_line(tiny_run, analyse(tiny_run)) or ""
    assert "table: 2 of 3 time exponents in n agree with their complexity formula's slope" in said
    # by name: "9 of 10 agree" sent a new user looking for the one that did not
    assert "past d) (not: b n^0.81 against n^1.00), 1 overhead-bound (e), 1 not" in said
    # each reason with its own layers (a plugin without a theory read beside a wide interval)
    assert "interval too wide to tell (c), 1 not judged: no theory (f) (attnbench table" in said
    # attention's lower term is said only where a quadratic layer was judged (d, here)
    rows.loc[3, "compute (theory)"] = "O(n d^2)"
    assert "n²·d + n·d²" not in (sweeping.chapter_line(tiny_run, analyse(tiny_run)) or "")
    rows.loc[3, "compute (theory)"] = "O(n^2 d)"
    none = pd.DataFrame({"layer": ["a", "b"], "time_agrees_n": [None, False],
                         "time_overhead_bound_n": [False, True],
                         "time_exponent_n": [None, 0.1], "time_theory_exponent_n": [None, 1.0],
                         "compute (theory)": ["O(n d^2)", "O(n d^2)"]})  # fmt: skip
    monkeypatch.setattr(sweeping, "comparison_table", lambda run, analysis: none)
    # none judged: the line the README promises still ends the sweep, and says why
    assert (sweeping.chapter_line(tiny_run, analyse(tiny_run)) or "").startswith(
        "the chapter's table: no time exponent in n judged: 1 overhead-bound (b), 1 no exponent "
        "fitted (too few lengths) (a) (attnbench table "
    )
    # a layer whose every case was skipped (a decode run's layer without a step) read "no theory"
    import dataclasses

    frame = tiny_run.frame.copy()
    frame["layer"] = frame["layer"].where(frame["layer"] != "conv", "a")
    frame.loc[frame["layer"] == "a", "status"] = "skipped"
    skipped = dataclasses.replace(tiny_run, frame=frame)
    assert "1 no case measured (a)" in (sweeping.chapter_line(skipped, None) or "")  # type: ignore[arg-type]
    monkeypatch.setattr(sweeping, "comparison_table", table)
    drawn: list[object] = []
    monkeypatch.setattr(
        sweeping,
        "plot_run",
        lambda run, analysis=None: drawn.append(analysis) or [Path("run/charts/time.png")],
    )
    buffer = io.StringIO()
    notes = Console(file=buffer, width=300)
    judging = sweeping._Judging(None, None, "time", "table", None)  # type: ignore[arg-type]
    streams = Streams(out=notes, err=notes, notes=notes, human=None)
    used.clear()
    sweeping._finished(tiny_run, streams, judging, charts=True, as_json=False)
    assert drawn[0] is not None and used == drawn  # one analysis: the charts' is the line's
    assert "the chapter's table: 2 of 3 time exponents" in buffer.getvalue()
    buffer.truncate(0)
    drawn.clear()
    sweeping._finished(tiny_run, streams, judging, charts=False, as_json=False)
    assert not drawn and "the chapter's table" not in buffer.getvalue()  # --no-charts: none


def test_ctrl_c_while_the_results_print_says_the_run_is_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run is complete on disk before its tables print: a Ctrl-C there ends with 130
    and one line saying where it is and how to see it, not Typer's bare "Aborted."."""
    from attnbench.cli import sweeping

    def stopped(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(sweeping, "summary_notes", stopped)
    out = tmp_path / "run"
    result = runner.invoke(app, ["sweep", *TINY, "--layers", "conv", "--out", str(out)])
    assert result.exit_code == 130, result.output
    line = result.stderr.replace("\n", "").split("interrupted:")[1]
    assert line.startswith(" while showing the results; the run is complete, saved in")
    assert f"attnbench plot {out} draws its charts" in line and "Aborted" not in result.stderr
    assert load_complete(out)


def load_complete(out: Path) -> bool:
    from attnbench import load_results

    run = load_results(out)
    return run.status == "complete" and len(run.measured) == 1


def test_a_sweep_that_measured_no_case_exits_2_and_keeps_its_rows(tmp_path: Path) -> None:
    from attnbench.results.loader import load_results

    """A new user's only case ran out of memory and the sweep exited 0: now its row is kept,
    its tables shown, and one line says nothing was measured, exit 2."""
    out = tmp_path / "run"
    args = [
        "sweep",
        "--layers",
        "attention",
        "--n",
        "256",
        "--d",
        "32",
        "--no-charts",
        "--executor",
    ]
    args += ["fork"]
    result = runner.invoke(app, [*args, "--max-case-memory", "1MiB", "--out", str(out)])
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert "no case measured (1 oom): each one's reason is in its row's error" in said
    assert "smaller --n, --d or --batch, or a larger --max-case-memory, may fit" in said
    assert "past the 1 MiB it may take" in said
    assert list(load_results(out).frame["status"]) == ["oom"]


def test_a_decode_sweep_of_layers_without_a_step_is_a_stated_skip_and_exits_0(
    tmp_path: Path,
) -> None:
    """Skipped for want of a step is what --mode decode does with such a layer, never a
    failure: the sweep that measured none of them still exits 0, and says why."""
    plugin = tmp_path / "lin.py"
    plugin.write_text(
        "from torch import nn\n\ndef make(d):\n    return nn.Linear(d, d)\n", encoding="utf-8"
    )
    out = tmp_path / "run"
    args = ["sweep", "--layers", f"{plugin}:make", "--n", "16", "--d", "8", "--mode", "decode"]
    result = runner.invoke(app, [*args, "--no-charts", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "has no decode step" in result.output and "no case measured" not in result.output


def test_a_table_under_the_chapters_headers_folds_cells_too() -> None:
    """The chapter's table (headers given) kept each column on one line and cut what did not
    fit at 120 columns: a wide run's table read 'attention-linea', 'O(k n d^2 log_k n' and
    'd^-1.0' (for d^-1.07). Its cells fold now, as every other table's."""
    import io

    import pandas as pd
    from rich.console import Console

    from attnbench.cli.render import frame_table
    from attnbench.table import HEADERS

    cells = ["attention-linear", "O(k n d^2 log_k n)", "n^0.79 (unsettled) d^-1.07", "O(log_k n)",
             "n^0.15", "O(log_k n)", "n^0.15"]  # fmt: skip
    frame = pd.DataFrame([cells])
    buffer = io.StringIO()
    frame_table(frame, Console(file=buffer, width=110, color_system=None), headers=HEADERS)
    text = buffer.getvalue()
    assert max(map(len, text.splitlines())) <= 110 and "…" not in text
    rows = [line.split("│")[1:-1] for line in text.splitlines() if line.startswith("│")]
    column = ["".join(row[i] for row in rows).replace(" ", "") for i in range(len(cells))]
    assert column == [cell.replace(" ", "") for cell in cells]  # each cell whole, unfolded
    # no word split where the table has room for every word: Rich narrowed the widest columns
    # first, and a student's table read "complexi ty" and "(exac t)"
    lines = "\n".join(line for line in text.splitlines())
    for word in ("complexity", "(unsettled)", "attention-linear", "sequential"):
        assert word in lines
    # a terminal too narrow for every word gets a row at a time, each cell named
    narrow = io.StringIO()
    frame_table(frame, Console(file=narrow, width=60, force_terminal=True, color_system=None),
                headers=HEADERS)  # fmt: skip
    said = narrow.getvalue().splitlines()
    assert said[0] == "attention-linear" and "  complexity: O(k n d^2 log_k n)" in said
    assert "  sequential ops, measured: n^0.15" in said


class _Ended(Exception):
    """What the fake ``os._exit`` raises, with the status it was given."""


def _end(status: int) -> NoReturn:
    raise _Ended(status)


@pytest.mark.parametrize(("code", "status"), [(None, 0), (0, 0), (3, 3), ("bad", 1)])
def test_a_command_ends_with_its_code_after_its_atexit_handlers(
    code: object, status: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """``exit_now`` skips the interpreter's teardown (0.4-0.5 s after torch), not what a
    command asked to run at exit, and keeps SystemExit's meaning of its code."""
    from attnbench.cli.app import exit_now

    ran: list[str] = []
    with pytest.raises(_Ended) as ended:
        exit_now(code, finish=lambda: ran.append("atexit"), end=_end, running=lambda: 0)
    assert ended.value.args == (status,) and ran == ["atexit"]
    assert capsys.readouterr().err == ("bad\n" if code == "bad" else "")


def test_a_command_with_a_thread_still_running_ends_as_usual() -> None:
    """The interpreter waits for a running (non-daemon) thread; ``os._exit`` would kill it. A
    daemon it does not wait for, and neither does ``exit_now``."""
    import threading

    from attnbench.cli.app import exit_now, running_threads

    with pytest.raises(SystemExit) as raised:
        exit_now(4, finish=lambda: None, end=_end, running=lambda: 1)
    assert raised.value.code == 4
    release = threading.Event()
    before = running_threads()  # what earlier tests left running, if anything
    daemon = threading.Thread(target=release.wait, daemon=True)
    worker = threading.Thread(target=release.wait)
    daemon.start()
    try:
        assert running_threads() == before
        worker.start()
        assert running_threads() == before + 1
    finally:
        release.set()
        worker.join()
        daemon.join()
    assert running_threads() == before


@pytest.mark.slow
def test_the_real_exit_runs_atexit_and_flushes_its_output(tmp_path: Path) -> None:
    """Through ``main``: an atexit handler registered by the process still writes its file,
    the buffered output arrives whole when piped, and the status is the command's; the
    interpreter's teardown, which would collect a module's objects, did not run."""
    marker, torn = tmp_path / "atexit", tmp_path / "torn"
    block = (
        "import atexit, pathlib, sys\n"
        f"atexit.register(pathlib.Path({str(marker)!r}).write_text, 'ran')\n"
        "class Kept:\n"
        f"    def __del__(self, p=pathlib.Path({str(torn)!r})): p.write_text('torn')\n"
        "kept = Kept()  # collected by the teardown, which a sys.exit runs\n"
        "from attnbench.cli import main; main()\n"
    )
    ok = subprocess.run([sys.executable, "-c", block, "layers"], capture_output=True, text=True)
    assert ok.returncode == 0 and "attention-sdpa" in ok.stdout, ok.stderr
    assert marker.read_text() == "ran" and not torn.exists()
    plain = block.replace("from attnbench.cli import main; main()", "sys.exit(0)")
    assert subprocess.run([sys.executable, "-c", plain]).returncode == 0
    assert torn.read_text() == "torn"  # the marker itself tells a teardown apart
    bad = subprocess.run(
        [sys.executable, "-c", block, "table", str(tmp_path / "none")],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "is not a folder" in bad.stderr


def test_a_misspelled_layer_of_a_saved_run_is_offered_the_one_meant(  # type: ignore[no-untyped-def]
    tiny_run,
) -> None:
    """plot and fit --layers named the run's layers but not the one a typo meant."""
    result = runner.invoke(app, ["plot", str(tiny_run.path), "--layers", "atention"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    said = " ".join(result.stderr.split())
    assert f"layer atention is not in {tiny_run.path} (did you mean 'attention'?); it has" in said
    far = runner.invoke(app, ["plot", str(tiny_run.path), "--layers", "transformer"])
    assert far.exit_code == 2 and "did you mean" not in far.stderr


def test_a_first_rounds_line_reads_an_interval_past_100_percent_as_a_factor() -> None:
    """A progress line read "365 µs ±777.7%" where the table beside it read "×/÷8.78"."""
    from attnbench.cli.imprecise import interval_text
    from attnbench.cli.render import _timed
    from attnbench.measure.timing.loop import TimingStats

    assert interval_text(1.0, 0.5, 3.0) == "×/÷3"
    assert interval_text(1.0, 0.97, 1.03) == "±3.0%"
    spread = TimingStats((1e-4,) * 3 + (1e-2,) * 3 + (1e-3,) * 6, 1, 0.03)
    line = _timed(spread)
    assert "×/÷" in line and "%" not in line, line
