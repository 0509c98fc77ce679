"""attnbench ab and the processes behind it: worker processes (the subprocess executor), the
ABBA interleaving, paired verdicts, bad input, and instruction counts under Callgrind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.compare import REGRESSION, compare_runs
from attnbench.errors import AttnbenchError
from attnbench.options import build_grid
from attnbench.render.verdicts import schema
from attnbench.results.loader import load_results
from attnbench.run.ab import ABListeners, ABStart, describe_sides, run_ab
from attnbench.run.estimate import estimate_bounds
from attnbench.run.executors.process import SubprocessExecutor
from attnbench.run.queue import UNCALIBRATED
from attnbench.run.sweep import run_sweep

pytestmark = pytest.mark.slow
runner = CliRunner()
TINY = ["--n", "16", "--d", "8", "--device", "cpu", "--time-budget", "0.05", "--quiet"]

LINEAR = """
import time
from torch import nn


class Timed(nn.Module):
    def __init__(self, d, pause):
        super().__init__()
        self.proj = nn.Linear(d, d)
        self.pause = pause

    def forward(self, x):  # (B, n, d)
        if self.pause:
            time.sleep(self.pause)  # a floor no busy neighbour can lower: 100x the product
        return self.proj(x)


def fast(d):
    return Timed(d, 0.0)


def slow(d):
    return Timed(d, 2e-3)
"""


@pytest.fixture
def plugin(tmp_path: Path) -> Path:
    path = tmp_path / "timed.py"
    path.write_text(LINEAR)
    return path


def test_sides_are_measured_in_turn_abba_round_after_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a machine whose load is past its CPUs: the start's estimate says so, both sides scaled
    monkeypatch.setattr("attnbench.run.estimate.machine_load", lambda: 99.0)
    monkeypatch.setattr("attnbench.run.estimate.runnable_now", lambda: 99.0)
    heard: list[tuple[str, str, int]] = []
    starts: list[ABStart] = []
    grid = {"layers": "conv", "n": "8,16", "d": "4", "device": "cpu", "time_budget": 0.02,
            "wait_quiet": 1.5}  # fmt: skip
    ab = run_ab(grid, tmp_path / "ab", listeners=ABListeners(
                progress=lambda side, e: heard.append((side, e.case.case_id, e.round))
                if e.kind == "done" else None, on_start=starts.append))  # fmt: skip
    assert starts[0].waits_s == 3.0  # each side's rounds may wait its --wait-quiet
    busy = starts[0].busy
    assert busy.slowdown > 25 and busy.why.startswith("its 1-minute load is 99.0 on ")
    quiet = sum(estimate_bounds(g)[1] for g in starts[0].grids.values())
    assert starts[0].estimate_s == pytest.approx(busy.slowdown * quiet)
    sides = [side for side, _, _ in heard]
    assert sides[:8] == ["base", "current", "current", "base"] * 2  # A B, B A, ...
    for first, second in zip(heard[::2], heard[1::2], strict=True):
        assert first[1:] == second[1:]  # both halves of a pair: the same case and round
    assert [r for _, _, r in heard[::4]][:3] == [1, 2, 3]  # round after round: 2 cases, 2 sides
    for run in (ab.base, ab.current):
        assert run.rounds == 10 and set(run.frame["status"]) == {"ok"}  # enough pairs
        assert run.meta["cluster"]["executor"] == "fork"  # a fresh process every job
        assert run.meta["quiet"] == {"machine_s": None, "sweeps": 0, "waited_s": 0.0}
    c = compare_runs(ab.base, ab.current, pairs=ab.pairs, paired=True)
    assert set(c.times["unit"]) == {"pairs"} and c.paired
    assert not c.failed("deterministic")


def test_the_cli_gates_a_slowed_layer_and_passes_an_unchanged_one(
    tmp_path: Path, plugin: Path
) -> None:
    out = tmp_path / "slowed"
    layers = ["--layers", f"{plugin}:slow", "--base-layers", f"{plugin}:fast"]
    result = runner.invoke(app, ["ab", *TINY, *layers, "--out", str(out), "--json"])
    assert result.exit_code == 1, result.output
    verdicts = json.loads(result.stdout)
    jsonschema.validate(verdicts, schema("compare"))
    case = verdicts["cases"][0]
    assert case["verdict"] == REGRESSION and case["unit"] == "pairs"
    assert case["ratio_judged"] > 1.5 and case["layer"] == "timed:fast -> timed:slow"
    assert json.loads((out / "verdicts.json").read_text())["failed"] is True
    # two layers raced: their counts differ by design, so only time fails, and it says so
    assert verdicts["gate"] == "time"
    assert any("the sides run different layers" in w for w in verdicts["warnings"])
    assert "the sides run different layers" in (out / "verdicts.md").read_text()
    # ab's own heading (its job summary read "attnbench compare")
    assert (out / "verdicts.md").read_text().startswith("## attnbench ab: 1 regression(s)")
    for side in ("base", "current"):  # two ordinary results folders
        shown = runner.invoke(app, ["show", str(out / side)])
        assert shown.exit_code == 0 and "1 of 1 cases" in shown.stdout

    same = runner.invoke(app, ["ab", *TINY, "--layers", f"{plugin}:fast", "--out",
                               str(tmp_path / "same"), "--fail-on", "deterministic"])  # fmt: skip
    assert same.exit_code == 0, same.output


def test_two_versions_of_one_plugin_file_race_each_under_its_side(
    tmp_path: Path, plugin: Path
) -> None:
    """old/timed.py:fast against timed.py:fast (the file edited since): both are timed:fast,
    one name a process holds, so the base side's is timed:fast@base, and the race is run."""
    (tmp_path / "old").mkdir()
    old = tmp_path / "old" / "timed.py"
    old.write_text(LINEAR)
    plugin.write_text(LINEAR.replace("return Timed(d, 0.0)", "return Timed(d, 2e-3)"))
    out = tmp_path / "versions"
    layers = ["--layers", f"{plugin}:fast", "--base-layers", f"{old}:fast"]
    result = runner.invoke(app, ["ab", *TINY, *layers, "--out", str(out), "--json"])
    assert result.exit_code == 1, result.output  # the edit slowed it
    verdicts = json.loads(result.stdout)
    case = verdicts["cases"][0]
    assert case["layer"] == "timed:fast@base -> timed:fast" and case["verdict"] == REGRESSION
    # one layer at two versions, not two layers: its counts are gated as well as its time
    assert verdicts["gate"] != "time" and not any(
        "different layers" in w for w in verdicts["warnings"]
    )
    base = load_results(out / "base")
    assert base.meta["layers"]["timed:fast@base"]["spec"] == f"{old}:fast"
    # compare reads the two folders as ab did: the case ids differ, the pairs are recorded
    again = runner.invoke(app, ["compare", str(out / "base"), str(out / "current"), "--json"])
    assert again.exit_code == 1, again.output
    judged = json.loads(again.stdout)["cases"][0]
    assert judged["layer"] == case["layer"] and judged["unit"] == "pairs"
    assert judged["ratio_judged"] == pytest.approx(case["ratio_judged"])
    said = json.loads(again.stdout)["warnings"]  # and names the code that differs
    assert any(w.startswith("layer timed:fast differs: ") for w in said), said


def test_bad_ab_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    cases = [
        (["--base-python", "/nonexistent/python"], "is not a Python interpreter that exists"),
        (["--base-python", str(bare / "bin" / "python")], "has no attnbench; install attnbench"),
        (["--layers", "conv,rnn", "--base-layers", "conv"], "--base-layers has 1 layer(s)"),
        (["--layers", "conv", "--base-layers", "nosuchmodule_x:make"], "cannot import"),
        # refused before the sides start, and not pointed at a --resume ab does not have
        (["--base-python", "/nonexistent/python"], "already holds an A/B run; choose a new"),
    ]
    (tmp_path / "r4" / "base").mkdir(parents=True)
    (tmp_path / "r4" / "base" / "run.json").write_text("{}")
    for i, (args, message) in enumerate(cases):
        result = runner.invoke(app, ["ab", *TINY, *args, "--out", str(tmp_path / f"r{i}")])
        assert result.exit_code == 2, (args, result.output)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and message in lines[0], (args, result.stderr)
        assert "Traceback" not in result.output


def test_a_worker_process_that_dies_in_a_case_is_replaced(tmp_path: Path) -> None:
    marker = tmp_path / "died"
    plugin = tmp_path / "dies_once.py"
    plugin.write_text(f"""
import os
from torch import nn


class DiesOnce(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.proj = nn.Linear(d, d)

    def forward(self, x):  # (B, n, d)
        if x.shape[1] == 16 and not os.path.exists({str(marker)!r}):
            open({str(marker)!r}, "w").close()
            os._exit(9)  # the whole worker process dies, inside the case
        return self.proj(x)


def make(d):
    return DiesOnce(d)
""")
    executor = SubprocessExecutor()
    try:
        grid = build_grid({"layers": f"{plugin}:make,conv", "n": "8,16", "d": "4",
                           "device": "cpu", "time_budget": 0.01})  # fmt: skip
        uncalibrated = UNCALIBRATED
        run = run_sweep(grid, tmp_path / "run", executor=executor, measuring=uncalibrated)
    finally:
        executor.close()
    assert marker.exists() and set(run.frame["status"]) == {"ok"}  # run once more, elsewhere
    assert len(run.frame) == 4 and run.meta["environment"]["python_version"]


def test_instruction_counts_repeat_and_gate_an_ab_run(tmp_path: Path) -> None:
    """Real counts under Callgrind: the same code counts the same within the 1% tolerance."""
    out = tmp_path / "ab"
    args = ["ab", "--layers", "conv,rnn", "--n", "16", "--d", "8", "--device", "cpu", "--quiet"]
    result = runner.invoke(app, [*args, "--metric", "instructions", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    base, current = load_results(out / "base"), load_results(out / "current")
    for run in (base, current):
        assert run.frame["instructions"].notna().all() and run.frame["time_s"].isna().all()
        assert (run.frame["flops_check"] == "ok").all() and run.rounds == 1
    ratio = current.frame["instructions"].to_numpy() / base.frame["instructions"].to_numpy()
    assert (abs(ratio - 1) < 0.01).all(), ratio
    metrics = [c["metrics"]["instructions"]["verdict"] for c in json.loads(result.stdout)["cases"]]
    assert set(metrics) == {"unchanged"}


@pytest.mark.parametrize(
    ("rounds", "says"),
    [(10, None), (9, "'not significant'"), (7, "'not significant'"), (6, "'too few samples'")],
)
def test_too_few_rounds_are_announced_with_what_they_mean(rounds: int, says: str | None) -> None:
    from attnbench.run.ab import _too_few

    notes = _too_few(build_grid({"layers": "conv", "processes": rounds}), 0.01)
    if says is None:
        assert notes == ()
    else:
        assert len(notes) == 1 and f"--processes {rounds}" in notes[0] and says in notes[0]
    counted = build_grid({"layers": "conv", "processes": 1, "metric": "instructions"})
    assert _too_few(counted, 0.01) == ()


def test_a_gate_on_time_that_could_never_fail_is_refused(tmp_path: Path) -> None:
    """--processes 3 --fail-on time: every time verdict is "too few samples", and a
    maintainer's 2x step passed with a note its only word. Refused before anything runs; a
    gate on the counts too (all) still gates them, with the note."""
    args = ["ab", "--layers", "conv", "--n", "16", "--d", "8", "--out", str(tmp_path / "ab")]
    refused = runner.invoke(app, [*args, "--processes", "6", "--fail-on", "time"])
    assert refused.exit_code == 2 and "Traceback" not in refused.output
    said = " ".join(refused.stderr.split())
    assert "--processes 6 with --fail-on time: the paired test cannot reach alpha 0.01 with" in said
    assert "fewer than 7 pairs, so no time could ever fail" in said
    assert not (tmp_path / "ab").exists()
    # the default gate (all) judges time too, and so does a config file's --processes
    (tmp_path / "few.toml").write_text("processes = 3\n")
    for more in (["--processes", "3"], ["--config", str(tmp_path / "few.toml")]):
        refused = runner.invoke(app, [*args, *more])
        assert refused.exit_code == 2, refused.output
        assert "--processes 3 with the default gate" in " ".join(refused.stderr.split())
    raced = runner.invoke(app, [*args, "--processes", "3", "--base-layers", "rnn"])
    assert "the default gate (time: the sides run different layers)" in " ".join(
        raced.stderr.split()
    )
    assert not (tmp_path / "ab").exists()


def test_a_gate_on_the_counts_alone_runs_with_few_pairs() -> None:
    from attnbench.cli.ab import _can_fail

    for gate in ("deterministic", "none"):
        _can_fail(gate, {"processes": 2, "fail_on": gate}, 0.01, None)  # no error
    _can_fail("all", {"processes": 7}, 0.01, None)  # enough pairs
    _can_fail("all", {"processes": 1, "metric": "instructions"}, 0.01, None)
    with pytest.raises(AttnbenchError, match="--fail-on deterministic to gate the exact"):
        _can_fail("all", {"processes": 6, "fail_on": "all"}, 0.01, None)


def test_an_interleaved_runs_overall_is_judged_on_its_pairs(tmp_path: Path) -> None:
    """Every round of every case reads the same on both sides (each pair's ratio is 1), but
    the sides took their samples in other proportions across three rounds of another speed:
    their pooled medians differ threefold. Judged on the pooled medians, the whole run read as
    an improvement (p = 0.004, all 8 cases one way), as an A/A run on an H100 once did; a time
    over its rounds (the geometric mean of their medians) weighs each round once, and reads
    the two sides the same, paired or not."""
    from synthetic import make_run

    base_rounds, new_rounds = (5, 5, 10), (10, 5, 5)
    speeds = (1e-3, 1e-3, 3e-3)  # the machine's state in each round

    def side(sizes: tuple[int, ...]) -> list[float]:
        return [speed for speed, size in zip(speeds, sizes, strict=True) for _ in range(size)]

    lengths = (64, 128, 256, 512, 1024, 2048, 4096, 8192)
    base = make_run(tmp_path / "base", {("conv", n): {"samples": side(base_rounds),
                                                      "round_sizes": base_rounds}
                                        for n in lengths})  # fmt: skip
    new = make_run(tmp_path / "new", {("conv", n): {"samples": side(new_rounds),
                                                    "round_sizes": new_rounds}
                                      for n in lengths})  # fmt: skip
    unpaired = compare_runs(base, new)
    assert unpaired.times["ratio"].tolist() == pytest.approx([1.0] * 8)  # not 1/3: pooled
    assert unpaired.overall_verdict.verdict == "unchanged"
    paired = compare_runs(base, new, paired=True)
    assert set(paired.times["ratio_judged"]) == {1.0}
    assert paired.overall_verdict.verdict == "unchanged"
    assert paired.overall_verdict.ratio == 1.0


def test_every_job_of_either_side_is_a_fresh_process(tmp_path: Path) -> None:
    """A process has a speed of its own: each pair's halves run in processes of their own,
    so a fast process weighs on one pair, and every case is still measured every round."""
    grid = {"layers": "conv", "n": "8,16", "d": "4", "device": "cpu", "time_budget": 0.02,
            "processes": 3}  # fmt: skip
    ab = run_ab(grid, tmp_path / "ab")
    numbers = []
    for run in (ab.base, ab.current):
        assert run.rounds == 3 and set(run.frame["status"]) == {"ok"}
        per_job = run.samples.groupby(["case_id", "round"])["process"]
        assert len(per_job) == 6 and (per_job.nunique() == 1).all()  # 2 cases x 3 rounds
        numbers.append(per_job.first().tolist())
        assert len(set(numbers[-1])) == 6  # six processes a side
        assert run.meta["cluster"]["executor"] == "fork"
    with pytest.raises(Exception, match="--processes must be >= 1"):
        run_ab({**grid, "processes": 0}, tmp_path / "ab0")


def test_the_start_names_the_code_each_side_ran_where_one_name_is_two_copies() -> None:
    """A module plugin installed in each side's interpreter is one name and two codes: the
    start line says which each side ran (it named the layer alone, twice)."""
    grid = build_grid({"layers": "conv", "n": [8], "d": [8]})
    ran = {"base": "d5559a9b8dd8", "current": "d6fd2d1eb0b6"}
    start = ABStart(
        grids={"base": grid, "current": grid},
        out_dir=Path("unused"),
        clusters={
            side: {"python": side, "layers": {"conv": {"kind": "module", "digest": code}}}
            for side, code in ran.items()
        },
        environments={side: {} for side in ran},
        estimate_s=0.0,
    )
    base, current = describe_sides(start)
    assert base.endswith("layers conv (sha256 d5559a9b8dd8)")
    assert current.endswith("layers conv (sha256 d6fd2d1eb0b6)")
    start.clusters["base"]["layers"] = {}  # a built-in: its name alone
    assert describe_sides(start)[0].endswith("layers conv")
    # two checkouts of one version, attention edited on one, read alike: where the sides'
    # code differs, each line gives its digest and commit
    start.environments["base"] = {"code_digest": "aa" * 32, "git_commit": "474a0027f7e1"}
    start.environments["current"] = {"code_digest": "bb" * 32, "git_commit": "474a0027f7e1",
                                     "git_dirty": True}  # fmt: skip
    base, current = describe_sides(start)
    assert "(code sha256 aaaaaaaaaaaa, commit 474a0027f7)," in base
    assert "(code sha256 bbbbbbbbbbbb, commit 474a0027f7, with changes)," in current
    start.environments["current"] = start.environments["base"]
    assert "sha256 aaaa" not in describe_sides(start)[0]  # the same code: not said
