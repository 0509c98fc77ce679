"""Results are data: reading a run never runs code, and a changed plugin is refused before it runs.

The plugin here writes a marker file when its code runs. The sweep runs it (that is what a sweep
is for); after that, no command that reads the run may, whether the plugin's file is there,
changed, gone, or shipped inside the results folder with run.json pointing at it.
"""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.errors import AttnbenchError
from attnbench.layers import REGISTRY, plugins
from attnbench.results.files import RESULTS_FILE, RUN_FILE
from attnbench.results.loader import load_results

runner = CliRunner()

# A layer with its theory in the attention family (so crossovers with conv are drawn), which
# writes the marker named by ATTNBENCH_TEST_MARKER whenever its module runs.
MARKED = """
import os
import pathlib

import torch
from torch import nn

from attnbench.layers import LayerEntry, LayerOption, SELF_ATTENTION
from attnbench.theory import LayerTheory, Term, elements

pathlib.Path(os.environ["ATTNBENCH_TEST_MARKER"]).write_text("the plugin ran")


class Mixer(nn.Module):
    def __init__(self, d, width):
        super().__init__()
        self.up = nn.Linear(d, width * d)
        self.down = nn.Linear(width * d, d)

    def forward(self, x):  # (B, n, d)
        mixed = x + x.mean(dim=1, keepdim=True)
        return self.down(torch.relu(self.up(mixed)))  # (B, n, d)


WIDTH = LayerOption("width", 2, "w", "the MLP's width, in multiples of d")
ENTRY = LayerEntry(
    "marked", Mixer, SELF_ATTENTION, "mean, then an MLP", (WIDTH,),
    LayerTheory(
        "O(n d^2)",
        (Term(4, "b·n·w·d²", lambda s: s["b"] * s["n"] * s["width"] * s["d"] * s["d"]),),
        order=lambda s: s["n"] * s["d"] * s["d"],
        path_law=lambda s: 1.0,
        elementwise=(elements(3, "b·n·w·d", lambda s: s["b"] * s["n"] * s["width"] * s["d"]),),
    ),
)
"""
GRID = ["--n", "8,16,32,64", "--d", "8,16", "--device", "cpu", "--time-budget", "0.002"]
READERS = {
    "show": ["show", "{run}", "--json"],
    "table": ["table", "{run}", "--json"],
    "fit": ["fit", "{run}", "--json"],
    "plot": [
        "plot",
        "{run}",
        "--json",
        "--out",
        "{charts}",
        "--format",
        "png",
        "--metric",
        "time,flops,crossover",
    ],
    "report": ["report", "{run}", "--json", "--out", "{report}", "--no-charts"],
    "compare": ["compare", "{run}", "{run}", "--fail-on", "none"],
}


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """The marker's path; the plugin leaves the registry and sys.modules with the test."""
    marker = tmp_path / "MARKER"
    monkeypatch.setenv("ATTNBENCH_TEST_MARKER", str(marker))
    before, modules = dict(REGISTRY), set(sys.modules)
    yield marker
    REGISTRY.clear()
    REGISTRY.update(before)
    for name in set(sys.modules) - modules:
        if name.startswith(("attnbench_plugin_", "marked_module")):
            del sys.modules[name]


def forget_plugin() -> None:
    """As a fresh process would be: the plugin is neither registered nor imported."""
    REGISTRY.pop("marked", None)
    for name in [m for m in sys.modules if m.startswith(("attnbench_plugin_", "marked_module"))]:
        del sys.modules[name]


def sweep_marked(tmp_path: Path, *extra: str) -> tuple[Path, Path]:
    plugin = tmp_path / "plugins" / "marked.py"
    plugin.parent.mkdir(exist_ok=True)
    plugin.write_text(textwrap.dedent(MARKED))
    out = tmp_path / "run"
    result = runner.invoke(
        app, ["sweep", *GRID, "--layers", f"{plugin}:ENTRY,conv", "--out", str(out), *extra]
    )
    assert result.exit_code == 0, result.output
    return plugin, out


def read_all(run: Path, tmp_path: Path, label: str) -> dict[str, str]:
    """Every reading command on ``run``: each exits 0; their stdout by command."""
    outputs = {}
    for name, args in READERS.items():
        argv = [
            a.format(run=run, charts=tmp_path / f"charts-{label}", report=tmp_path / f"{label}.md")
            for a in args
        ]
        result = runner.invoke(app, argv)
        assert result.exit_code == 0, (name, result.output)
        assert "Traceback" not in result.output
        outputs[name] = result.stdout
    return outputs


@pytest.mark.slow
def test_reading_a_run_never_runs_its_plugin(tmp_path: Path, fresh: Path) -> None:
    plugin, run = sweep_marked(tmp_path)
    assert fresh.exists()  # the sweep ran it
    drawn = {p.name: p.read_bytes() for p in (run / "charts").glob("*.png")}
    swept = {name: drawn[name] for name in ("time.png", "flops.png", "crossover.png")}
    # What the sweep's own process reads, with the plugin loaded: the reference.
    before = read_all(run, tmp_path, "loaded")
    fresh.unlink()
    forget_plugin()
    for state in ("present", "changed", "removed", "shipped"):
        if state == "changed":
            plugin.write_text(plugin.read_text().replace("mean, then an MLP", "changed"))
        elif state == "removed":
            shipped = plugin.read_text()
            plugin.unlink()
        elif state == "shipped":  # the folder carries the code, and its record points at it
            (run / "evil.py").write_text(shipped + "\n# shipped\n")
            meta = json.loads((run / RUN_FILE).read_text())
            meta["layers"]["marked"]["spec"] = f"{run}/evil.py:ENTRY"
            (run / RUN_FILE).write_text(json.dumps(meta))
        after = read_all(run, tmp_path, state)
        assert not fresh.exists(), f"{state}: reading the run ran the plugin"
        # The same tables and fits without the code: its theory is read from the run's record.
        for name in ("table", "fit", "show"):
            assert json.loads(after[name]) == json.loads(before[name]), (state, name)
        # The same charts, byte for byte, as the sweep drew with the plugin loaded.
        replotted = {p.name: p.read_bytes() for p in (tmp_path / f"charts-{state}").glob("*.png")}
        assert replotted == swept, state
    fitted = json.loads(after["fit"])
    own = [m for m in fitted["models"] if m["layer"] == "marked" and m["own"]]
    assert own and own[0]["formula"] == "α·b·n·w·d² + β·b·n·w·d + γ"
    assert {(c["layer"], c["versus"]) for c in fitted["crossovers"]} == {("marked", "conv")}
    table = {row["layer"]: row for row in json.loads(after["table"])}
    assert table["marked"]["compute (theory)"] == "O(n d^2)"
    exponents = [
        e for e in fitted["exponents"] if e["layer"] == "marked" and e["metric"] == "flops"
    ]
    assert exponents and all(e["agrees"] for e in exponents)  # the recorded law, judged


def test_a_run_without_a_record_reads_without_the_theory(tmp_path: Path, fresh: Path) -> None:
    """A run made before theory.json existed: its plugin's theory is left out, with a note."""
    _, run = sweep_marked(tmp_path, "--n", "8,16", "--d", "8", "--no-charts")
    (run / "theory.json").unlink()
    fresh.unlink()
    forget_plugin()
    result = runner.invoke(app, ["table", str(run), "--json"])
    assert result.exit_code == 0, result.output
    assert "layer marked is a plugin this run has no record of" in result.stderr
    rows = {row["layer"]: row for row in json.loads(result.stdout)}
    assert rows["marked"]["compute (theory)"] == "?" and rows["conv"]["compute (theory)"] != "?"
    assert not fresh.exists()


def truncate_last_row(run: Path) -> None:
    lines = (run / RESULTS_FILE).read_text().splitlines(keepends=True)
    (run / RESULTS_FILE).write_text("".join(lines[:-1]))


def resume(run: Path, *extra: str) -> object:
    return runner.invoke(app, ["sweep", "--resume", str(run), "--no-charts", *extra])


@pytest.mark.slow
def test_resume_refuses_a_changed_plugin_file_before_it_runs(tmp_path: Path, fresh: Path) -> None:
    plugin, run = sweep_marked(tmp_path, "--n", "8,16", "--d", "8", "--no-charts")
    truncate_last_row(run)
    plugin.write_text(plugin.read_text() + "\n# changed\n")
    fresh.unlink()
    forget_plugin()
    refused = resume(run)
    assert refused.exit_code == 2, refused.output
    assert "layer marked: its code changed since the run" in refused.stderr
    assert "it was not run: pass --force" in refused.stderr
    assert not fresh.exists()
    forced = resume(run, "--force")
    assert forced.exit_code == 0, forced.output
    assert fresh.exists()  # the user asked for the new code
    changes = load_results(run).meta["resumes"][-1]["environment_changes"]
    assert "layer marked" in changes


@pytest.mark.slow
def test_a_forced_resume_names_the_code_its_cases_ran(tmp_path: Path, fresh: Path) -> None:
    """A --resume --force of a finished run after an edit rewrote run.json's layers, measuring
    nothing, and compare against a baseline of the new code named no difference."""
    plugin, run = sweep_marked(tmp_path, "--n", "8,16", "--d", "8", "--no-charts")
    ran = load_results(run).record.layers["marked"]["digest"]
    plugin.write_text(plugin.read_text() + "\n# changed\n")
    forget_plugin()
    assert resume(run, "--force").exit_code == 0
    assert load_results(run).record.layers["marked"]["digest"] == ran  # nothing ran the edit
    assert load_results(run).theories["layers"]["marked"]["source"]["digest"] == ran
    forget_plugin()
    grown = resume(run, "--force", "--n", "8,16,32")  # a case more: the edit runs
    assert grown.exit_code == 0, grown.output
    after = load_results(run)
    assert after.record.layers["marked"]["digest"] not in ("", ran)
    assert after.theories["layers"]["marked"]["source"] == after.record.layers["marked"]
    (mixed,) = after.mixed_code()
    assert mixed.startswith("layer marked's cases ran 2 codes (") and ran in mixed
    forget_plugin()
    told = runner.invoke(app, ["fit", str(run)])
    assert told.exit_code == 0 and "layer marked's cases ran 2 codes" in told.stderr


@pytest.mark.slow
def test_a_forced_resume_that_runs_none_of_the_edit_names_the_code_that_ran(
    tmp_path: Path, fresh: Path
) -> None:
    """A row a resume writes without running it (the case the process died in) switched
    run.json to the edit and read as a second code; a round a resume added ran the edit
    inside a case of the earlier code, which nothing could tell (found by a review)."""
    plugin, run = sweep_marked(tmp_path, "--n", "8,16", "--d", "8", "--no-charts")
    ran = load_results(run).record.layers["marked"]["digest"]
    lines = (run / RESULTS_FILE).read_text().splitlines(keepends=True)
    died = min(i for i, line in enumerate(lines) if line.startswith("marked/"))
    (run / RESULTS_FILE).write_text("".join(lines[:died] + lines[died + 1 :]))
    meta = json.loads((run / RUN_FILE).read_text())
    rounds_left = "marked/n=16/d=8/w=2/b=1/float32/cpu/forward"  # its rounds not ended
    meta["round_stops"].pop(rounds_left)
    meta.update(status="running", current_case=lines[died].split(",")[0], pid=999999)
    (run / RUN_FILE).write_text(json.dumps(meta))
    samples = (run / "samples.csv").read_text().splitlines(keepends=True)
    kept = [s for s in samples if not (s.startswith(rounds_left) and s.split(",")[3] == "3")]
    (run / "samples.csv").write_text("".join(kept))
    rounds = set(load_results(run).samples.query("case_id == @rounds_left")["round"])
    plugin.write_text(plugin.read_text() + "\n# changed\n")
    forget_plugin()
    assert resume(run, "--force").exit_code == 0
    after = load_results(run)
    assert after.record.layers["marked"]["digest"] == ran
    assert after.mixed_code() == []
    assert set(after.samples.query("case_id == @rounds_left")["round"]) == rounds  # none added
    assert after.record.round_stops[rounds_left] == "code changed"
    # a plain resume of the run after a forced one (its record now the edit's, as a run made
    # before round_stops said why) had gone on with the edit's rounds in the case (a new user)
    assert resume(run, "--force", "--retry").exit_code == 0  # the died case runs the edit
    assert load_results(run).record.layers["marked"]["digest"] != ran
    meta = json.loads((run / RUN_FILE).read_text())
    del meta["round_stops"][rounds_left]
    meta.update(status="interrupted")
    (run / RUN_FILE).write_text(json.dumps(meta))
    forget_plugin()
    plain = resume(run)
    assert plain.exit_code == 0, plain.output
    again = load_results(run)
    assert set(again.samples.query("case_id == @rounds_left")["round"]) == rounds
    assert again.record.round_stops[rounds_left] == "code changed"


@pytest.mark.slow
def test_resume_refuses_a_changed_module_before_importing_it(
    tmp_path: Path, fresh: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "marked_module.py").write_text(textwrap.dedent(MARKED))
    args = ["sweep", "--n", "8,16", "--d", "8", "--device", "cpu", "--time-budget", "0.002"]
    result = runner.invoke(app, [*args, "--layers", "marked_module:ENTRY", "--out", "run"])
    assert result.exit_code == 0, result.output
    run = tmp_path / "run"
    truncate_last_row(run)
    (tmp_path / "marked_module.py").write_text(textwrap.dedent(MARKED) + "\n# changed\n")
    fresh.unlink()
    forget_plugin()
    refused = resume(run)
    assert refused.exit_code == 2 and "layer marked: its code changed" in refused.stderr
    assert not fresh.exists()


@pytest.mark.slow
def test_resume_refuses_code_inside_the_results_folder(tmp_path: Path, fresh: Path) -> None:
    plugin, run = sweep_marked(tmp_path, "--n", "8,16", "--d", "8", "--no-charts")
    truncate_last_row(run)
    shipped = run / "marked.py"
    shipped.write_bytes(plugin.read_bytes())  # the same code: its digest even matches
    meta = json.loads((run / RUN_FILE).read_text())
    meta["layers"]["marked"]["spec"] = f"{shipped}:ENTRY"
    (run / RUN_FILE).write_text(json.dumps(meta))
    fresh.unlink()
    forget_plugin()
    refused = resume(run)
    assert refused.exit_code == 2, refused.output
    assert "inside the results folder" in refused.stderr and "--layers" in refused.stderr
    assert not fresh.exists()
    named = resume(run, "--layers", f"{shipped}:ENTRY,conv")  # the user vouches for it
    assert named.exit_code == 0, named.output
    assert fresh.exists()


def test_a_worker_refuses_shipped_code_that_is_not_what_the_driver_recorded(
    tmp_path: Path, fresh: Path
) -> None:
    _, _ = sweep_marked(tmp_path, "--n", "8", "--d", "8", "--no-charts")
    shipped = plugins.shipment(["marked"], portable=True)
    fresh.unlink()
    forget_plugin()
    tampered = [{**shipped[0], "text": shipped[0]["text"] + "\n# another\n"}]
    with pytest.raises(AttnbenchError, match="the shipped file changed since it was loaded"):
        plugins.receive(tampered)
    assert not fresh.exists() and "marked" not in REGISTRY
    plugins.receive(shipped)  # the recorded code: registered
    assert "marked" in REGISTRY and fresh.exists()


def test_the_driver_refuses_to_ship_a_file_that_changed_since_it_was_loaded(
    tmp_path: Path,
) -> None:
    plugin, _ = sweep_marked(tmp_path, "--n", "8", "--d", "8", "--no-charts")
    plugin.write_text(plugin.read_text() + "\n# edited during the run\n")
    with pytest.raises(AttnbenchError, match="its file changed since it was loaded"):
        plugins.shipment(["marked"])


def test_a_worker_refuses_a_module_that_is_not_the_drivers(
    tmp_path: Path, fresh: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    module = tmp_path / "marked_module.py"
    module.write_text(textwrap.dedent(MARKED))
    plugins.load("marked_module:ENTRY")
    shipped = plugins.shipment(["marked"])
    forget_plugin()
    fresh.unlink()
    module.write_text(textwrap.dedent(MARKED) + "\n# the worker's copy\n")
    with pytest.raises(AttnbenchError, match="module marked_module changed since it was loaded"):
        plugins.receive(shipped)
    assert not fresh.exists()
    plugins.receive(shipped, verify_modules=False)  # an ab side in another interpreter
    assert fresh.exists()
    # ... which records, and keys the count cache by, the copy it ran, not the driver's: a
    # base side recorded the current side's digest, and each side read the other's counts
    ran = REGISTRY["marked"].source
    assert ran.digest == plugins.digest(module) != shipped[0]["source"]["digest"]


def test_locating_a_module_runs_none_of_its_packages(tmp_path: Path, fresh: Path) -> None:
    package = tmp_path / "pkg_marked"
    package.mkdir()
    (package / "__init__.py").write_text(
        "import os, pathlib\npathlib.Path(os.environ['ATTNBENCH_TEST_MARKER']).write_text('x')\n"
    )
    (package / "layer.py").write_text("X = 1\n")
    sys.path.insert(0, str(tmp_path))
    try:
        assert plugins.locate_module("pkg_marked.layer") == package / "layer.py"
        assert plugins.locate_module("pkg_marked.nothing") is None
    finally:
        sys.path.remove(str(tmp_path))
    assert not fresh.exists()


def test_two_rows_name_one_code_by_their_digest_or_else_what_they_name() -> None:
    """A resume ends the rounds of a case other code began (``JobQueue``): a row written before
    a module's digest was named beside its distribution, or by a Ray worker's shipped copy
    elsewhere, names the same code."""
    from attnbench.run.resumed import same_code

    now = "/a/mine.py:make (sha256 09cd0bf5789e, mypkg 1.0)"
    assert same_code(now, "/b/mine.py:make (sha256 09cd0bf5789e, mypkg 1.0)")  # elsewhere
    assert not same_code(now, "/a/mine.py:make (sha256 c246b67e8be3, mypkg 1.0)")  # edited
    assert same_code(now, "mypkg.mine:make (mypkg 1.0)")  # written before the digest was named
    assert not same_code(now, "mypkg.mine:make (mypkg 1.1)")
    built_in = "attnbench.layers.conv (attnbench 0.1.0)"
    assert same_code(built_in, built_in)
    assert same_code("test_plugins:Scale", "test_plugins:Scale")  # registered from Python
