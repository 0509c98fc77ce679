"""`attnbench compare` and `sweep --baseline` through the CLI: exit codes, formats, job summary."""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import replace
from pathlib import Path

import jsonschema
import pandas as pd
import pytest
import torch
from synthetic import cases_grid, make_run, noisy
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.compare import REGRESSION, compare_runs
from attnbench.layers import REGISTRY
from attnbench.options import build_grid, load_config
from attnbench.render.verdicts import (
    STEP_SUMMARY_ENV,
    append_step_summary,
    by_length,
    github_action_benchmark,
    schema,
    to_json,
)
from attnbench.results.loader import load_results
from attnbench.results.run import RunResults
from attnbench.run.sweep import run_sweep

runner = CliRunner()


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A baseline, an identical run, and a run with one slower case and one heavier case
    (read only: the tests share them)."""
    tmp_path = tmp_path_factory.mktemp("pair")
    base = make_run(tmp_path / "base", cases_grid()).path
    same = make_run(tmp_path / "same", cases_grid()).path
    worse = make_run(
        tmp_path / "worse",
        cases_grid(rnn_128={"samples": noisy(1.5e-3, seed=9)}, conv_64={"flops": 128_000}),
    ).path
    return base, same, worse


@pytest.fixture(autouse=True)
def no_step_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests run inside GitHub Actions too: start every test without the summary variable."""
    monkeypatch.delenv(STEP_SUMMARY_ENV, raising=False)


def test_exit_0_when_nothing_regressed(pair: tuple[Path, Path, Path]) -> None:
    base, same, _ = pair
    result = runner.invoke(app, ["compare", str(base), str(same)])
    assert result.exit_code == 0, result.output
    assert "no regression" in result.stdout and "OVERALL" in result.stdout  # the product
    assert result.stderr == ""  # no warning: same grid, same environment, five rounds
    assert "no regression shown" not in result.stdout


def test_a_gate_that_could_not_decide_prints_so_and_passes(
    pair: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The terminal's last line says "no regression shown" and what was undecided, exit 0."""
    from attnbench.compare.runs import Comparison

    monkeypatch.setattr(Comparison, "undecided", lambda self, gate: "time undecided for 1")
    base, same, _ = pair
    result = runner.invoke(app, ["compare", str(base), str(same)])
    assert result.exit_code == 0, result.output
    assert "no regression shown (--fail-on all): time undecided for 1" in result.stdout


def test_exit_1_on_a_regression_with_each_named(pair: tuple[Path, Path, Path]) -> None:
    base, _, worse = pair
    result = runner.invoke(app, ["compare", str(base), str(worse)])
    assert result.exit_code == 1
    assert "2 regression(s)" in result.stdout
    assert "rnn/n=128" in result.stdout and "FLOPs 64000 -> 128000" in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    ("gate", "code"), [("time", 1), ("deterministic", 1), ("none", 0), ("all", 1)]
)
def test_fail_on_chooses_what_fails(pair: tuple[Path, Path, Path], gate: str, code: int) -> None:
    base, _, worse = pair
    result = runner.invoke(app, ["compare", str(base), str(worse), "--fail-on", gate])
    assert result.exit_code == code, result.output
    if gate == "none":  # shown, failing nothing: "no regression" misled a record job's readers
        assert "2 regression(s), not gating (--fail-on none):" in result.stdout
        assert "no regression" not in result.stdout


def test_a_generous_threshold_lets_the_slowdown_pass(pair: tuple[Path, Path, Path]) -> None:
    base, _, worse = pair
    args = ["compare", str(base), str(worse), "--fail-on", "time", "--max-slowdown", "60%"]
    assert runner.invoke(app, args).exit_code == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-slowdown", "lots"], "--max-slowdown 'lots'"),
        (["--alpha", "2"], "--alpha must lie between 0 and 1"),
        (["--fail-on", "sometimes"], "--fail-on 'sometimes'"),
        (["--format", "xml"], "--format 'xml'"),
        (["--json", "--markdown"], "choose one output"),
        (["--output", "x.md"], "--output needs"),
        (["--normalize"], "no calibration samples"),
    ],
)
def test_usage_errors_exit_2_in_one_line(
    tmp_path: Path, pair: tuple[Path, Path, Path], args: list[str], message: str
) -> None:
    base, same, _ = pair
    if "--normalize" in args:
        same = make_run(tmp_path / "uncalibrated", cases_grid(), calibration_s=None).path
    result = runner.invoke(app, ["compare", str(base), str(same), *args])
    assert result.exit_code == 2
    assert message in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.output


def test_a_folder_that_is_not_a_run_exits_2(pair: tuple[Path, Path, Path], tmp_path: Path):
    result = runner.invoke(app, ["compare", str(pair[0]), str(tmp_path)])
    assert result.exit_code == 2 and "not an attnbench results folder" in result.stderr


def test_a_killed_run_reads_gone_not_running(pair: tuple[Path, Path, Path], tmp_path: Path):
    """A sweep SIGKILLed (a CI job's time limit) leaves status "running": on the machine that
    ran it, its recorded process is looked for, and a dead one is said to be gone."""
    import socket
    import subprocess
    import sys

    base, same, _ = pair
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    for pid, words in ((int(dead.stdout), "is gone: killed or crashed"),
                       (os.getpid(), "running: its process")):  # fmt: skip
        half = tmp_path / f"half-{pid}"
        shutil.copytree(same, half)
        meta = json.loads((half / "run.json").read_text())
        meta["environment"]["hostname"] = socket.gethostname()
        (half / "run.json").write_text(json.dumps({**meta, "status": "running", "pid": pid}))
        result = runner.invoke(app, ["compare", str(base), str(half)])
        assert result.exit_code == 2 and f"its process {pid} " in result.stderr, result.stderr
        assert words in result.stderr


def test_a_reused_pid_reads_gone(pair: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """A run killed long ago whose pid the kernel has given to another process (a sleeping
    child, here): the recorded start tells them apart. It read "running" while anything held
    the pid; a start that is recorded and matches still reads running."""
    import socket
    import subprocess

    from attnbench.results.record import process_start

    base, same, _ = pair
    with subprocess.Popen(["sleep", "60"]) as other:
        try:
            now = process_start(other.pid)
            assert now is not None and now.count(":") == 1
            for start, words in (("0-not-this-boot:1", "is gone"), (now, "still sweeping")):
                half = tmp_path / f"half-{start[:4]}"
                shutil.copytree(same, half)
                meta = json.loads((half / "run.json").read_text())
                meta["environment"]["hostname"] = socket.gethostname()
                meta.update(status="running", pid=other.pid, pid_start=start)
                (half / "run.json").write_text(json.dumps(meta))
                result = runner.invoke(app, ["compare", str(base), str(half)])
                assert result.exit_code == 2 and words in result.stderr, result.stderr
        finally:
            other.kill()


def test_an_unfinished_run_is_refused_not_judged(
    pair: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """A CI job killed part way and then compared went green: its unmeasured cases were only
    listed as in the baseline alone. Either side unfinished is one line and exit 2."""
    base, same, _ = pair
    half = tmp_path / "half"
    shutil.copytree(same, half)
    meta = json.loads((half / "run.json").read_text())
    (half / "run.json").write_text(json.dumps({**meta, "status": "interrupted"}))
    for args, role in (([base, half], "current"), ([half, base], "baseline")):
        result = runner.invoke(app, ["compare", *map(str, args)])
        assert result.exit_code == 2 and result.stderr.count("\n") == 1
        assert f"the {role} run" in result.stderr and "unfinished (interrupted)" in result.stderr
        assert f"attnbench sweep --resume {half}" in result.stderr


def test_cases_gone_from_the_current_run_are_not_a_plain_pass(
    pair: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """A maintainer's current run swept one layer of the baseline's two and read plain "no
    regression": the gate passes (nothing regressed that was judged), but says what it did
    not judge, under every gate but none."""
    base = pair[0]
    grid = cases_grid()
    partial = make_run(tmp_path / "partial", {k: v for k, v in grid.items() if k[0] != "rnn"})
    gone = sum(k[0] == "rnn" for k in grid)
    for gate in ("all", "time", "deterministic"):
        result = runner.invoke(app, ["compare", str(base), str(partial.path), "--fail-on", gate])
        assert result.exit_code == 0, result.output
        said = " ".join(result.stdout.split())
        assert f"no regression shown (--fail-on {gate}):" in said
        assert f"{gone} baseline case(s) not in the current run, not judged" in said
    quiet = runner.invoke(app, ["compare", str(base), str(partial.path), "--fail-on", "none"])
    assert quiet.exit_code == 0 and "not in the current run, not judged" in quiet.stdout


def test_json_verdicts_follow_their_schema(pair: tuple[Path, Path, Path]) -> None:
    base, _, worse = pair
    result = runner.invoke(app, ["compare", str(base), str(worse), "--json", "--quiet"])
    assert result.exit_code == 1
    payload = json.loads(result.stdout)
    jsonschema.validate(payload, schema("compare"))
    assert payload["failed"] is True and len(payload["regressions"]) == 2
    rnn = next(c for c in payload["cases"] if c["case_id"].startswith("rnn/n=128"))
    assert rnn["verdict"] == REGRESSION and rnn["p_value"] < 0.01
    conv = next(c for c in payload["cases"] if c["case_id"].startswith("conv/n=64/"))
    assert conv["metrics"]["flops"] == {
        "base": 64000.0,
        "new": 128000.0,
        "change": 1.0,
        "verdict": REGRESSION,
    }


def test_the_schema_rejects_a_broken_payload(pair: tuple[Path, Path, Path]) -> None:
    base, same, _ = pair
    payload = to_json(compare_runs(load_results(base), load_results(same)))
    payload["cases"][0]["verdict"] = "fine"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(payload, schema("compare"))


def test_github_action_benchmark_list(pair: tuple[Path, Path, Path], tmp_path: Path) -> None:
    base, _, worse = pair
    out = tmp_path / "bench" / "out.json"
    result = runner.invoke(
        app,
        [
            "compare",
            str(base),
            str(worse),
            "--format",
            "github-action-benchmark",
            "--output",
            str(out),
            "--fail-on",
            "none",
        ],
    )
    assert result.exit_code == 0, result.output
    entries = json.loads(out.read_text())
    jsonschema.validate(entries, schema("github-action-benchmark"))
    run = load_results(worse)
    assert len(entries) == 3 * len(run.measured)  # time, time in GEMMs, peak memory
    rnn = run.frame.set_index("case_id").loc["rnn/n=128/d=16/b=1/float32/cpu/forward"]
    entry = next(e for e in entries if e["name"] == f"{rnn.name} time")
    assert entry["unit"] == "ms" and entry["value"] == pytest.approx(rnn["time_s"] * 1e3)
    assert "regression" in entry["extra"]
    gemm = next(e for e in entries if e["name"] == f"{rnn.name} time in calibration GEMMs")
    assert gemm["value"] == pytest.approx(rnn["time_s"] / run.calibration_s)


def test_the_benchmark_list_skips_what_a_run_lacks(tmp_path: Path) -> None:
    base = make_run(tmp_path / "a", cases_grid(), calibration_s=None)
    new = make_run(tmp_path / "b", cases_grid(conv_32={"status": "oom"}), calibration_s=None)
    entries = github_action_benchmark(compare_runs(base, new))
    assert len(entries) == 2 * 7  # no calibration entries; the oom case has none
    assert all(e["unit"] in ("ms", "bytes") for e in entries)


def test_the_benchmark_list_reads_an_ab_case_as_its_table_does(tmp_path: Path) -> None:
    """An ab case's entry said "ratio 1.030" (current over baseline over the pairs' rounds)
    beside a value under its baseline, while the table read the pairs' median: the entry says
    the paired ratio the verdict judged, and which times it sits between."""
    base = make_run(tmp_path / "a", cases_grid(), calibration_s=None)
    new = make_run(tmp_path / "b", cases_grid(), calibration_s=None)
    comparison = compare_runs(base, new)
    times = comparison.times.assign(unit="pairs", ratio=1.265, ratio_judged=1.039)
    entries = github_action_benchmark(replace(comparison, times=times))
    extra = entries[0]["extra"]
    assert ", over the pairs' rounds, paired ratio 1.039, p " in extra and "1.265" not in extra
    plain = github_action_benchmark(comparison)[0]["extra"]
    assert "paired" not in plain and ", ratio " in plain


@pytest.mark.slow
def test_markdown_goes_to_stdout_and_to_the_job_summary_only_when_set(
    pair: tuple[Path, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, _, worse = pair
    result = runner.invoke(app, ["compare", str(base), str(worse), "--markdown", "--quiet"])
    assert result.exit_code == 1
    assert result.stdout.startswith("## attnbench compare: 2 regression(s)")
    assert (
        "| layer | n | d | baseline | current | ratio | norm. ratio | 98% CI | p | time | exact |"
        in (result.stdout)
    )
    assert "| OVERALL |" in result.stdout
    # the slower case's line carries the interval its test at 0.01 is dual to
    assert re.search(r": time x1\.\d+ \(98% CI 1\.\d\d\.\.1\.\d\d\) \(p = ", result.stdout)
    summary = tmp_path / "summary.md"
    assert not summary.exists()
    monkeypatch.setenv(STEP_SUMMARY_ENV, str(summary))
    runner.invoke(app, ["compare", str(base), str(worse), "--markdown", "--quiet"])
    runner.invoke(app, ["compare", str(base), str(worse), "--markdown", "--quiet"])
    text = summary.read_text()
    assert text.count("## attnbench compare") == 2  # appended, as GitHub expects
    runner.invoke(app, ["compare", str(base), str(worse), "--json", "--quiet"])
    assert summary.read_text() == text  # only --markdown writes the summary


def test_append_step_summary_needs_the_variable(tmp_path: Path) -> None:
    assert append_step_summary("x", {}) is None
    assert append_step_summary("x", {STEP_SUMMARY_ENV: ""}) is None
    target = tmp_path / "s.md"
    assert append_step_summary("# hi", {STEP_SUMMARY_ENV: str(target)}) == target
    assert target.read_text() == "# hi\n\n"


def test_one_side_only_cases_and_warnings_are_printed(tmp_path: Path) -> None:
    grid = cases_grid()
    base = make_run(tmp_path / "a", grid)
    more = make_run(tmp_path / "b", {**grid, ("rnn", 512): {}}, env={"torch_version": "2.12.0+cpu"})
    result = runner.invoke(app, ["compare", str(base.path), str(more.path), "--markdown"])
    assert result.exit_code == 0, result.output
    assert "only in the current run: rnn/n=512" in result.stderr
    assert "warning: torch differs" in result.stderr
    assert "Only in the current run (1):" in result.stdout


def test_cases_only_on_one_side_are_read_one_line_per_length_series() -> None:
    """A sweep compared with a shorter one has dozens of cases on one side only: one line per
    case that differs only in n, its lengths joined."""
    ids = [
        f"{layer}/n={n}/d=64/b=1/float32/cpu/forward"
        for layer in ("rnn", "conv")
        for n in (512, 1024)
    ]
    assert by_length([*ids, "odd"]) == (
        "rnn/n=512,1024/d=64/b=1/float32/cpu/forward",
        "conv/n=512,1024/d=64/b=1/float32/cpu/forward",
        "odd",
    )


# ----------------------------------------------------------------------------- sweep --baseline

TINY = ["--layers", "conv,rnn", "--n", "8,16", "--d", "4", "--device", "cpu"]
TINY += ["--time-budget", "0.002", "--no-charts", "--quiet"]


@pytest.fixture(scope="module")
def tiny_baseline(tmp_path_factory: pytest.TempPathFactory) -> RunResults:
    grid = build_grid(
        {"layers": "conv,rnn", "n": "8,16", "d": "4", "device": "cpu", "time_budget": 0.002}
    )
    return run_sweep(grid, tmp_path_factory.mktemp("baseline") / "run")


@pytest.mark.slow
def test_sweep_with_baseline_compares_when_done(tiny_baseline: RunResults, tmp_path: Path):
    out = tmp_path / "current"
    result = runner.invoke(
        app,
        [
            *("sweep", *TINY, "--out", str(out), "--baseline", str(tiny_baseline.path)),
            *("--json", "--fail-on", "deterministic"),
        ],
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    jsonschema.validate(payload["comparison"], schema("compare"))
    assert len(payload["comparison"]["cases"]) == 4
    assert {c["metrics"]["flops"]["verdict"] for c in payload["comparison"]["cases"]} == {
        "unchanged"
    }


@pytest.mark.slow
def test_sweep_with_baseline_exits_1_when_the_layer_got_heavier(
    tiny_baseline: RunResults, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real conv layer, made to compute twice: counted FLOPs double and compare says so."""
    conv = REGISTRY["conv"]

    class Twice(torch.nn.Module):
        def __init__(self, d: int, **kwargs: int) -> None:
            super().__init__()
            self.inner = conv.build(d, **kwargs)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(self.inner(x))  # (B, n, d)

    monkeypatch.setitem(REGISTRY, "conv", replace(conv, build=Twice))
    summary = tmp_path / "summary.md"
    monkeypatch.setenv(STEP_SUMMARY_ENV, str(summary))
    out = tmp_path / "current"
    result = runner.invoke(
        app,
        [
            *("sweep", *TINY, "--out", str(out), "--baseline", str(tiny_baseline.path)),
            *("--fail-on", "deterministic", "--markdown"),
        ],
    )
    assert result.exit_code == 1, result.output
    assert "conv/n=8/d=4/k=3/b=1/float32/cpu/forward: FLOPs" in result.stdout
    assert summary.read_text().startswith("## attnbench compare: ")
    assert len(load_results(out).frame) == 4  # the results stay on disk


def test_a_bad_baseline_fails_before_measuring(tmp_path: Path) -> None:
    out = tmp_path / "never"
    result = runner.invoke(app, ["sweep", *TINY, "--out", str(out), "--baseline", str(tmp_path)])
    assert result.exit_code == 2 and "not an attnbench results folder" in result.stderr
    assert not out.exists()
    bad = runner.invoke(app, ["sweep", *TINY, "--out", str(out), "--markdown"])
    assert bad.exit_code == 2 and "--markdown prints the comparison" in bad.stderr


def test_sweep_keeps_its_results_when_nothing_matches_the_baseline(
    tiny_baseline: RunResults, tmp_path: Path
) -> None:
    out = tmp_path / "other"
    args = ["sweep", "--layers", "attention", "--n", "8", "--d", "4", "--heads", "2"]
    args += ["--device", "cpu", "--time-budget", "0.002", "--no-charts", "--quiet"]
    result = runner.invoke(app, [*args, "--out", str(out), "--baseline", str(tiny_baseline.path)])
    assert result.exit_code == 2 and "no case in common" in result.stderr
    assert f"the results are saved in {out}" in result.stderr
    assert len(load_results(out).frame) == 1


@pytest.mark.slow
def test_the_committed_ci_reference_is_a_calibrated_five_round_run(tmp_path: Path) -> None:
    """What .ci/run compares against: it loads, has rounds and calibration, judges on rounds,
    and the gate fails a copy of it with one layer slower in every round or one count grown."""
    reference = Path(__file__).resolve().parents[1] / "results" / "ci-reference"
    run = load_results(reference)
    assert run.rounds == 5 and run.calibration_s is not None
    root = Path(__file__).resolve().parents[1]
    cases = build_grid(load_config(root / "ci.toml")).cases()  # the grid .ci/run sweeps
    assert len(run.frame) == len(cases)
    case = run.frame["case_id"].iloc[0]
    for what in ("slower", "counted"):
        copy = tmp_path / what
        shutil.copytree(reference, copy)
        if what == "slower":  # 3x in every round of one case: past its rounds' 2.1x spread
            samples = pd.read_csv(copy / "samples.csv")
            samples.loc[samples["case_id"] == case, "time_s"] *= 3
            samples.to_csv(copy / "samples.csv", index=False)
        else:  # one FLOP more in one case
            results = pd.read_csv(copy / "results.csv")
            results.loc[results["case_id"] == case, "flops"] += 1
            results.to_csv(copy / "results.csv", index=False)
        c = compare_runs(run, load_results(copy))
        assert set(c.times["unit"]) == {"rounds"} and len(c.times) == len(cases)
        times = c.times.set_index("case_id")["verdict"]
        if what == "slower":
            assert times[case] == REGRESSION and (times.drop(case) != REGRESSION).all()
            assert c.failed("time") and not c.failed("deterministic")
        else:
            assert (times != REGRESSION).all()  # the same samples: no time verdict moves
            assert c.failed("deterministic") and not c.failed("time")


@pytest.mark.slow
def test_sweep_with_baseline_takes_every_compare_format(
    tiny_baseline: RunResults, tmp_path: Path
) -> None:
    """One dict of renderers serves compare and sweep --baseline alike."""
    out, bench = tmp_path / "current", tmp_path / "bench.json"
    args = [*TINY, "--out", str(out), "--baseline", str(tiny_baseline.path)]
    args += ["--fail-on", "none", "--format", "github-action-benchmark", "--output", str(bench)]
    result = runner.invoke(app, ["sweep", *args])
    assert result.exit_code == 0, result.output
    entries = json.loads(bench.read_text())
    jsonschema.validate(entries, schema("github-action-benchmark"))
    assert {e["name"].split(" ")[0] for e in entries} == set(load_results(out).frame["case_id"])
    again = [*TINY, "--out", str(tmp_path / "x"), "--baseline", str(tiny_baseline.path)]
    both = runner.invoke(app, ["sweep", *again, "--json", "--format", "json"])
    assert both.exit_code == 2 and "both print on stdout: choose one" in both.stderr


@pytest.mark.slow
def test_the_product_goes_to_stdout_and_moves_aside_for_a_format(
    pair: tuple[Path, Path, Path],
) -> None:
    """Tables are the product (stdout); a machine format takes stdout, and the table then goes
    to stderr for the log; --quiet leaves only the format."""
    base, _, worse = pair
    plain = runner.invoke(app, ["compare", str(base), str(worse)])
    assert "OVERALL" in plain.stdout and "OVERALL" not in plain.stderr
    as_json = runner.invoke(app, ["compare", str(base), str(worse), "--json"])
    assert json.loads(as_json.stdout)["failed"] is True  # stdout holds the JSON alone
    assert "OVERALL" in as_json.stderr
    quiet = runner.invoke(app, ["compare", str(base), str(worse), "--json", "--quiet"])
    assert quiet.stderr == "" and json.loads(quiet.stdout)["failed"] is True


def test_the_method_note_names_the_test_that_judged() -> None:
    """The Markdown job summary said a one-sided Mann-Whitney U test judged the rounds' medians
    and printed p = 2.6e-10, which Mann-Whitney cannot give on 5 against 5: the rounds are
    judged by Welch's t-test on their logs (``judge_rounds``), and the note says so."""
    from attnbench.render.verdicts import method_note

    run = load_results(Path(__file__).parents[1] / "results" / "ci-reference")
    comparison = compare_runs(run, run)
    assert not comparison.paired
    note = method_note(comparison)
    assert "a one-sided Welch t-test with p < 0.01 on the logs of the timing rounds'" in note
    assert "else a one-sided Mann-Whitney U test on the raw samples (at least" in note


def test_sweep_json_with_output_is_pointed_at_format_json(
    pair: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """On sweep, --json prints the run: --output with it was told it needed "--markdown, --json
    or --format", --json given. It now names --format json, the verdicts as JSON."""
    args = ["sweep", "--baseline", str(pair[0]), "--json", "--output", str(tmp_path / "v.json")]
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert "--format (json for them as JSON" in result.stderr and "--json or" not in result.stderr


def test_sweep_refuses_an_unfinished_baseline_before_it_measures(
    pair: tuple[Path, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sweep --baseline refused an unfinished baseline only after the whole sweep: it is
    refused before the first case, as a mistyped one is."""
    from attnbench.cli import sweeping

    half = tmp_path / "half"
    shutil.copytree(pair[0], half)
    meta = json.loads((half / "run.json").read_text())
    (half / "run.json").write_text(json.dumps({**meta, "status": "interrupted"}))
    monkeypatch.setattr(sweeping, "run_sweep", lambda *a, **k: pytest.fail("it measured"))
    result = runner.invoke(app, ["sweep", "--baseline", str(half), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "the baseline run" in result.stderr
    assert "unfinished (interrupted)" in result.stderr
