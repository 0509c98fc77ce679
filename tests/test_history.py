"""attnbench history: runs filed across commits, their change points (validated on seeded
synthetic histories), the static site (in a real browser), and bad input."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from histories import history, score
from synthetic import make_run, noisy
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.compare.changes import (
    confirm_note,
    confirmable,
    exact_steps,
    find_steps,
    history_steps,
)
from attnbench.errors import AttnbenchError
from attnbench.results.history import SCHEMA, SERIES_KEYS, add_run, load_history
from attnbench.results.run import RunResults

runner = CliRunner()
CASE = "conv/n=64/d=16/k=3/b=1/float32/cpu/forward"


def entry(i: int, time_s: float, *, machine: str = "box", flops: float = 1e6) -> dict:
    return {
        "schema": SCHEMA,
        "commit": f"{i:040x}",
        "commit_time": f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}+00:00",
        "subject": f"commit {i}",
        "machine": machine,
        "series": {"device_name": "cpu", "dtype": "float32", "allocator": "pinned",
                   "mode": "forward", "batch": 1},
        "cases": [{"case_id": CASE, "layer": "conv", "n": 64, "d": 16, "time_s": time_s,
                   "time_ci_low_s": None, "time_ci_high_s": None, "flops": flops,
                   "elementwise": 0.0, "bytes": 1.0, "seq_steps": 1.0, "path_len": 63.0,
                   "peak_bytes": 10.0}],
    }  # fmt: skip


def write_history(folder: Path, times: list[float], **kw) -> Path:  # type: ignore[no-untyped-def]
    for i, t in enumerate(times):
        made = entry(i, t, **kw)
        path = folder / made["machine"] / f"{i:04d}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(made))
    return folder


def stepped(count: int = 40, at: int = 25, size: float = 0.3, seed: int = 0) -> list[float]:
    rng = np.random.default_rng(seed)
    return [1e-3 * (1 + size * (i >= at)) * math.exp(rng.normal(0, 0.02)) for i in range(count)]


def test_a_run_is_filed_under_its_commit_and_machine(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", {("conv", 64): {}, ("rnn", 64): {"status": "oom"}})
    filed = add_run(run, tmp_path / "h", commit="abc123", machine="ci box", repo=tmp_path)
    assert filed.path.parent.name == "ci-box" and filed.path.name.startswith("abc123")
    data = json.loads(filed.path.read_text())
    assert data["schema"] == SCHEMA and data["commit"] == "abc123"
    assert [c["layer"] for c in data["cases"]] == ["conv"]  # only what measured ok
    assert data["cases"][0]["time_s"] == pytest.approx(run.frame["time_s"].iloc[0])
    assert data["series"]["allocator"] == run.allocator
    assert data["series"]["threads"] == run.record.environment["torch_threads"]
    frame = load_history(tmp_path / "h", repo=tmp_path).frame
    assert list(frame["commit"]) == ["abc123"] and frame["machine"].iloc[0] == "ci box"


def test_a_run_without_a_commit_asks_for_one(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", {("conv", 64): {}}, env={"git_commit": None})
    with pytest.raises(AttnbenchError, match="--commit"):
        add_run(run, tmp_path / "h", repo=tmp_path)


def test_a_commit_its_repository_lacks_or_an_unfinished_run_is_refused(tmp_path: Path) -> None:
    """A maintainer's runs, filed from their layer's repository without --commit, went under
    attnbench's own commit (run.json's), which that repository lacks: twelve runs read as one
    commit and no step. An interrupted run's missing cases would read as gone. Both are
    refused in one line; a dirty checkout's run is filed with a note."""
    repo = new_repo(tmp_path / "repo")
    (commit,) = commit_line(repo, 1)
    run = make_run(tmp_path / "run", {("conv", 64): {}}, env={"git_commit": "474a0027f7"})
    with pytest.raises(AttnbenchError, match=r"'474a0027f7' \(that its run\.json records\) is not"):
        add_run(run, tmp_path / "h", repo=repo)
    with pytest.raises(AttnbenchError, match="'deadbeef' \\(given\\) is not in the git"):
        add_run(run, tmp_path / "h", commit="deadbeef", repo=repo)
    assert add_run(run, tmp_path / "h", commit=commit, repo=repo).commit == commit
    env = {"git_dirty": True, "git_commit": commit}  # --commit would vouch for the tree
    dirty = make_run(tmp_path / "dirty", {("conv", 64): {}}, env=env)
    done = runner.invoke(
        app, ["history", "add", str(dirty.path), "--history", str(tmp_path / "h"),
              "--repo", str(repo)],
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    assert "uncommitted changes" in done.stderr and "filed" in done.stdout
    meta = json.loads((run.path / "run.json").read_text())
    (run.path / "run.json").write_text(json.dumps({**meta, "status": "interrupted"}))
    refused = runner.invoke(
        app, ["history", "add", str(run.path), "--history", str(tmp_path / "h"),
              "--commit", commit, "--repo", str(repo)],
    )  # fmt: skip
    assert refused.exit_code == 2 and "unfinished (interrupted)" in refused.stderr
    assert refused.stderr.count("\n") == 1 and "--resume" in refused.stderr


def test_a_step_too_near_a_series_end_to_confirm_is_said_to_be() -> None:
    """A maintainer's 3.5x step at the 6th of 10 commits read "0 change points", silently: the
    exact two-sided Mann-Whitney's least p on 5 and 5 is 2/252 = 0.0079, and a step is
    confirmed under 0.003. It takes 12 commits in all, 5 or more a side (5 and 7, 6 and 6),
    which the history now says."""
    assert not confirmable(5, 5) and not confirmable(6, 5) and not confirmable(4, 20)
    assert confirmable(7, 5) and confirmable(6, 6) and confirmable(20, 5)
    assert find_steps(stepped(10, 5, 2.5)) == []  # 5 a side: no test can confirm it
    assert find_steps(stepped(11, 6, 2.5)) == []  # 6 and 5: 2/462 = 0.0043
    for count, at in ((12, 7), (12, 6), (25, 20)):  # 7 and 5, 6 and 6, 20 and 5: found
        (step,) = find_steps(stepped(count, at, 2.5))
        assert step.index == at
    frame = pd.DataFrame({"machine": "box", "case_id": "c", "commit": [f"c{i}" for i in range(10)]})
    for key in SERIES_KEYS:
        frame[key] = "x"
    note = confirm_note(frame)
    assert "at least 5 commits after it and 12 in all" in note
    assert "none can show yet in the last 4 commits of a series" in note
    assert "one 5 from the end only with 7 before it" in note
    assert "the longest series has 10 commit(s), under 12" in note
    longer = pd.concat([frame, frame.assign(commit=[f"d{i}" for i in range(10)])])
    assert "longest" not in confirm_note(longer)


def test_a_step_is_found_where_it_was_put_and_an_outlier_is_not_one() -> None:
    (step,) = find_steps(stepped())
    assert step.index == 25 and step.ratio == pytest.approx(1.3, rel=0.05)
    assert step.p_value < 1e-3
    flat = stepped(size=0.0)
    flat[17] *= 1.8  # one run on a busy machine
    assert find_steps(flat) == []


def test_runs_on_other_thread_counts_are_other_series(tmp_path: Path) -> None:
    """The CPU's default went from torch's two threads to one: a history across that commit
    keeps the two apart, not a 2x step in every case. Older entries (no count) keep theirs."""
    from attnbench.render.dashboard import series_id

    times = [1e-3] * 20 + [2e-3] * 20  # one thread: twice the time
    for i, t in enumerate(times):
        made = entry(i, t)
        made["series"]["threads"] = 2 if i < 20 else 1
        (tmp_path / "box").mkdir(exist_ok=True)
        (tmp_path / "box" / f"{i:04d}.json").write_text(json.dumps(made))
    frame = load_history(tmp_path, repo=tmp_path).frame
    steps = history_steps(frame)
    assert steps[steps["metric"] == "time_s"].empty
    row = {"machine": "box", "device_name": "cpu", "dtype": "float32", "case_id": CASE}
    assert series_id({**row, "threads": 1}) != series_id({**row, "threads": 2.0})
    assert series_id({**row, "threads": float("nan")}) == series_id(row | {"threads": None})
    assert "-t2-" in series_id({**row, "threads": 2.0})


def test_exact_counts_step_at_any_change() -> None:
    steps = exact_steps([10, 10, 12, 12, 12, 11])
    assert [(s.index, s.ratio) for s in steps] == [(2, 1.2), (5, 11 / 12)]


def test_series_of_other_machines_are_never_mixed(tmp_path: Path) -> None:
    write_history(tmp_path, stepped(), machine="a")
    write_history(tmp_path, stepped(size=0.0, seed=1), machine="b")
    steps = history_steps(load_history(tmp_path, repo=tmp_path).frame)
    times = steps[steps["metric"] == "time_s"]
    assert list(times["machine"]) == ["a"] and list(times["index"]) == [25]
    assert times["before"].iloc[0] == f"{24:040x}" and times["after"].iloc[0] == f"{25:040x}"


def test_the_cli_lists_change_points_as_a_table_and_as_json(tmp_path: Path) -> None:
    times = stepped()
    write_history(tmp_path / "h", times)
    (tmp_path / "h" / "box" / "0030.json").write_text(
        json.dumps(entry(30, times[30], flops=2e6))
    )  # one commit's FLOPs moved: a step there and back
    done = runner.invoke(app, ["history", "--history", str(tmp_path / "h"), "--json"])
    assert done.exit_code == 0, done.output
    found = json.loads(done.stdout)["change_points"]
    assert sorted((c["metric"], c["index"]) for c in found) == [
        ("flops", 30),
        ("flops", 31),
        ("time_s", 25),
    ]
    table = runner.invoke(app, ["history", "--history", str(tmp_path / "h")])
    assert table.exit_code == 0 and "3 change point(s)" in table.stdout
    # peak memory is stored and exact within a series (one machine and device): a step at the
    # 36th commit is one, as compare and ab gate on it (+89% went unreported)
    for i in range(36, len(times)):
        path = tmp_path / "h" / "box" / f"{i:04d}.json"
        made = json.loads(path.read_text())
        made["cases"][0]["peak_bytes"] = 18.9
        path.write_text(json.dumps(made))
    peak = runner.invoke(app, ["history", "--history", str(tmp_path / "h"), "--metric",
                               "peak_bytes", "--json"])  # fmt: skip
    assert peak.exit_code == 0, peak.output
    steps = json.loads(peak.stdout)["change_points"]
    assert [(c["index"], round(c["ratio"], 2)) for c in steps] == [(36, 1.89)]


START = 1767225600  # 2026-01-01T00:00:00Z, seconds since the epoch


def git(repo: Path, *args: str, when: int = START) -> str:
    """A git command in ``repo``, its commits dated ``when`` (author and committer), away from
    the user's git configuration."""
    stamp = f"@{when} +0000"
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org",
           "GIT_AUTHOR_DATE": stamp, "GIT_COMMITTER_DATE": stamp}  # fmt: skip
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          env=env, check=True)  # fmt: skip
    return done.stdout.strip()


def commit_line(repo: Path, count: int, *, spacing_s: int = 0, label: str = "commit") -> list[str]:
    """``count`` commits on HEAD, each ``spacing_s`` seconds after the one before (0: all in
    one second, as a script, a rebase or a batch of merges makes them); oldest first."""
    for i in range(count):
        git(repo, "commit", "-q", "--allow-empty", "-m", f"{label} {i}", when=START + i * spacing_s)
    return git(repo, "rev-list", "--reverse", f"-{count}", "HEAD").split()


def new_repo(root: Path) -> Path:
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    return root


@pytest.fixture(scope="module")
def stepped_runs(tmp_path_factory: pytest.TempPathFactory) -> list[RunResults]:
    """40 results folders of one case, its time 30% slower from the 26th (index 25) on."""
    folder = tmp_path_factory.mktemp("runs")
    return [
        make_run(folder / f"run{i}", {("conv", 64): {"samples": noisy(t, spread=0.01, seed=i)}},
                 calibration_s=None, rounds=1)
        for i, t in enumerate(stepped())
    ]  # fmt: skip


@pytest.mark.parametrize("spacing_s", [0, 60], ids=["in-one-second", "a-minute-apart"])
def test_a_step_among_commits_of_one_second_is_found_at_its_commit(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    stepped_runs: list[RunResults],
    spacing_s: int,
) -> None:
    """Issue 61: 40 commits made in one second have one commit date, which cannot order them;
    their ancestry does, and the step is found at exactly the commit it was put at, as when
    they are a minute apart. ``history`` reads the repository it is run in."""
    repo = new_repo(tmp_path / "repo")
    commits = commit_line(repo, len(stepped_runs), spacing_s=spacing_s)
    for run, commit in zip(stepped_runs, commits, strict=True):
        add_run(run, tmp_path / "h", commit=commit, machine="box", repo=repo)
    monkeypatch.chdir(repo)
    done = runner.invoke(app, ["history", "--history", str(tmp_path / "h"), "--json"])
    assert done.exit_code == 0, done.output
    found = json.loads(done.stdout)["change_points"]
    times = [c for c in found if c["metric"] == "time_s"]
    assert [(c["index"], c["before"], c["after"]) for c in times] == [
        (25, commits[24], commits[25])
    ], times
    assert times[0]["subject"] == "commit 25" and "warning" not in done.stderr


def test_runs_are_ordered_by_ancestry_and_by_date_where_git_cannot_place_them(
    tmp_path: Path,
) -> None:
    """Commits of two branches, all made in one second, come each after its parents; a commit
    the repository lacks goes by its date, with a warning naming it; and with no repository
    at all, every run goes by date, with one warning line on stderr."""
    repo = new_repo(tmp_path / "repo")
    base = commit_line(repo, 3, label="base")
    git(repo, "checkout", "-q", "-b", "side")
    side = commit_line(repo, 3, label="side")
    git(repo, "checkout", "-q", "main")
    main = commit_line(repo, 3, label="main")
    git(repo, "merge", "-q", "--no-ff", "-m", "merge side", "side")
    merge = git(repo, "rev-parse", "HEAD")
    known = [*base, *side, *main, merge]
    early, late = f"{1:040x}", f"{2:040x}"  # in no repository: one a day before, one after
    dates = {early: "2025-12-31", late: "2026-01-02"}
    for i, commit in enumerate([merge, *reversed(known[:-1]), late, early]):
        when = f"{dates.get(commit, '2026-01-01')}T00:00:00+00:00"
        made = {**entry(i, 1e-3), "commit": commit, "commit_time": when}
        path = tmp_path / "h" / "box" / f"{i:04d}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(made))
    loaded = load_history(tmp_path / "h", repo=repo)
    order = list(loaded.frame.drop_duplicates("commit")["commit"])
    assert order[0] == early and order[-1] == late and order[-2] == merge
    for line in git(repo, "rev-list", "--parents", "HEAD").splitlines():
        child, *parents = line.split()
        assert all(order.index(p) < order.index(child) for p in parents), (child, order)
    (warning,) = loaded.warnings
    assert "2 of 12 commit(s) are not in the git repository" in warning
    assert early[:10] in warning and late[:10] in warning

    (tmp_path / "plain").mkdir()
    done = runner.invoke(app, ["history", "--history", str(tmp_path / "h"), "--repo",
                               str(tmp_path / "plain"), "--json"])  # fmt: skip
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["runs"] == 12
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("warning:") and "is not a git repository" in line
    # a mistyped --repo is an error, not a warning over a table ordered by date
    typo = runner.invoke(app, ["history", "--history", str(tmp_path / "h"), "--repo",
                               str(tmp_path / "nowhere")])  # fmt: skip
    assert typo.exit_code == 2 and "--repo" in typo.stderr and "does not exist" in typo.stderr


def test_commits_of_one_second_outside_git_go_by_when_their_runs_started(tmp_path: Path) -> None:
    """With no repository to order them, commits of one commit date follow their runs' start
    times (a scripted series benchmarked in turn), not their files' names."""
    for i in range(4):
        made = {**entry(i, 1e-3), "commit_time": "2026-01-01T00:00:00+00:00",
                "run": {"start_time": f"2026-01-02T00:00:0{i}+00:00"}}  # fmt: skip
        path = tmp_path / "h" / "box" / f"{9 - i:04d}.json"  # names in the other order
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(made))
    (tmp_path / "plain").mkdir()
    loaded = load_history(tmp_path / "h", repo=tmp_path / "plain")
    assert list(loaded.frame["commit"]) == [f"{i:040x}" for i in range(4)]


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("{not json", "unreadable"),
        (json.dumps({"schema": "other"}), "malformed: schema"),
        (json.dumps({**entry(0, 1.0), "cases": [{"case_id": "x", "time_s": "fast"}]}),
         "time_s is not a number"),
        (json.dumps([1, 2]), "not a JSON object"),
    ],
)  # fmt: skip
def test_a_mangled_history_file_is_one_line_and_exit_2(
    tmp_path: Path, content: str, says: str
) -> None:
    write_history(tmp_path / "h", stepped(count=12))
    (tmp_path / "h" / "box" / "9999.json").write_text(content)
    for command in (["history"], ["history", "publish", str(tmp_path / "site")]):
        done = runner.invoke(app, [*command, "--history", str(tmp_path / "h")])
        assert done.exit_code == 2, done.output
        assert says in done.output and "9999.json" in done.output
        assert "Traceback" not in done.output and len(done.output.strip().splitlines()) <= 2
    missing = runner.invoke(app, ["history", "--history", str(tmp_path / "nowhere")])
    assert missing.exit_code == 2 and "is not a folder" in missing.output


@pytest.mark.slow
def test_change_points_on_seeded_histories_meet_the_targets() -> None:
    """200 seeded histories (tests/histories.py): at most 5% of the steps found are false and
    at most 5% of the steps of 10% or more are missed (Mozilla's t-test alerts: 12.5%, 6.8%)."""
    made = [history(seed) for seed in range(200)]
    result = score([[s.index for s in find_steps(h.times)] for h in made], made)
    assert result["steps_10pct"] > 150 and result["found"] > 150
    assert result["false_positive"] <= 0.05, result
    assert result["missed"] <= 0.05, result


def test_the_site_has_a_page_per_layer_and_the_change_points(tmp_path: Path) -> None:
    write_history(tmp_path / "h", stepped())
    done = runner.invoke(app, ["history", "publish", str(tmp_path / "site"), "--history",
                               str(tmp_path / "h"), "--commit-url",
                               "https://example.org/c/{commit}"])  # fmt: skip
    assert done.exit_code == 0, done.output
    index = (tmp_path / "site" / "index.html").read_text()
    page = (tmp_path / "site" / "layer-conv.html").read_text()
    assert 'href="layer-conv.html' in index and "x1.3" in index
    assert f"https://example.org/c/{25:040x}" in index  # the first commit after the step
    assert page.count("<svg") == 1 and 'id="step-' in page and "<script" not in page


BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
# Where the site is tested in a browser (CI installs Debian's chromium), its absence fails.
NEED_BROWSER = os.environ.get("ATTNBENCH_REQUIRE_BROWSER") == "1"

PROBE = """<!DOCTYPE html><html><body>
<iframe id="page" src="%s" width="1200" height="900"></iframe>
<script>
document.getElementById('page').addEventListener('load', () => {
  const doc = document.getElementById('page').contentDocument;
  const box = (el) => { const r = el.getBoundingClientRect(); return [r.x, r.width, r.height]; };
  const svgs = [...doc.querySelectorAll('svg')].map(box);
  const axes = doc.querySelector('[id^="area-"]');
  const steps = [...doc.querySelectorAll('[id^="step-"]')].map(el => [el.id, box(el)]);
  const lines = [...doc.querySelectorAll('[id^="axes-"] path')].length;
  document.body.dataset.found = JSON.stringify({
    title: doc.title, svgs, axes: axes ? box(axes) : null, steps, lines});
});
</script></body></html>"""


@pytest.mark.skipif(BROWSER is None and not NEED_BROWSER, reason="needs chromium")
def test_the_site_renders_in_a_browser_with_the_step_where_the_data_put_it(
    tmp_path: Path,
) -> None:
    assert BROWSER is not None, "ATTNBENCH_REQUIRE_BROWSER=1 and no chromium on PATH"
    count, at = 40, 25
    write_history(tmp_path / "h", stepped(count=count, at=at))
    done = runner.invoke(app, ["history", "publish", str(tmp_path / "site"), "--history",
                               str(tmp_path / "h")])  # fmt: skip
    assert done.exit_code == 0, done.output
    page = tmp_path / "site" / "layer-conv.html"
    probe = tmp_path / "probe.html"
    probe.write_text(PROBE % page.as_uri())
    shown = subprocess.run(
        [BROWSER, "--headless=new", "--no-sandbox", "--disable-gpu",
         "--allow-file-access-from-files", "--virtual-time-budget=5000", "--dump-dom",
         probe.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    dom = shown.stdout
    start = dom.index('data-found="') + len('data-found="')
    found = json.loads(dom[start : dom.index('"', start)].replace("&quot;", '"'))
    assert found["title"] == "conv: time over commits"
    assert found["svgs"] and all(w > 300 and h > 100 for _, w, h in found["svgs"])  # drawn
    assert found["lines"] > 0
    ((step_id, (x, _, height)),) = found["steps"]
    assert step_id.endswith(f"-{at}") and height > 50
    # the axes span commits -0.5 .. count - 0.5: the step lies between commit at-1 and at
    left, width, _ = found["axes"]
    commit = (x - left) / width * count - 0.5
    assert abs(commit - (at - 0.5)) < 0.5, (commit, found)
