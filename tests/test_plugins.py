"""Plugin layers: a layer written outside the package is measured, fitted, plotted, compared and
resumed like a built-in one; bad plugins are refused in one line before anything is measured."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from synthetic import registry_restored
from typer.testing import CliRunner

from attnbench import build_grid, register_layer, run_sweep
from attnbench.cli import app
from attnbench.errors import AttnbenchError
from attnbench.layers import REGISTRY
from attnbench.results.files import RESULTS_FILE
from attnbench.results.loader import load_results
from attnbench.run.queue import UNCALIBRATED

runner = CliRunner()
TINY = ["--n", "8,16", "--d", "8", "--device", "cpu", "--time-budget", "0.002"]
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "gated-conv"

# A token mixer with an option of its own (width), no theory, and a failure above fail_above.
MIXER = '''
import torch
from torch import nn


class Mixer(nn.Module):
    def __init__(self, d, width):
        super().__init__()
        self.up = nn.Linear(d, width * d)
        self.down = nn.Linear(width * d, d)

    def forward(self, x):  # (B, n, d)
        if x.shape[1] > {fail_above}:
            raise ValueError("too long for this mixer\\nsecond line")
        mixed = x + x.mean(dim=1, keepdim=True)  # every position sees every other
        return self.down(torch.relu(self.up(mixed)))  # (B, n, d)


def make(d, width=2):
    """A mixer: the mean over the sequence, then an MLP."""
    return Mixer(d, width)
'''

# The same layer declared with its theory: 2 products of d x (w·d) per position, 4·b·n·w·d².
WITH_THEORY = (
    MIXER
    + """

from attnbench.layers import LayerEntry, LayerOption, SELF_ATTENTION
from attnbench.theory import LayerTheory, Term

WIDTH = LayerOption("width", 2, "w", "the MLP's width, in multiples of d")
ENTRY = LayerEntry(
    "mixer", Mixer, SELF_ATTENTION, "mean over the sequence, then an MLP", (WIDTH,),
    LayerTheory(
        "O(n d^2)",
        (Term(4, "b·n·w·d²", lambda s: s["b"] * s["n"] * s["width"] * s["d"] * s["d"]),),
        order=lambda s: s["n"] * s["d"] * s["d"],
    ),
)
"""
)


@pytest.fixture(autouse=True)
def registry() -> Iterator[None]:
    """Plugins registered by a test leave with it."""
    with registry_restored():
        yield


def plugin(tmp_path: Path, text: str = MIXER, name: str = "mixer.py", fail_above: int = 99) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text.replace("{fail_above}", str(fail_above))))
    return path


def sweep(*args: str) -> object:
    return runner.invoke(app, ["sweep", *TINY, "--no-charts", *args])


@pytest.mark.slow
def test_a_file_plugin_without_theory_is_measured_in_every_column(tmp_path: Path) -> None:
    path = plugin(tmp_path)
    out = tmp_path / "run"
    result = sweep("--layers", f"{path}:make,conv", "--out", str(out), "--json")
    assert result.exit_code == 0, result.output
    run = load_results(out)
    mine = run.frame[run.frame["layer"] == "mixer:make"]
    assert list(mine["status"]) == ["ok", "ok"]
    for column in ("time_s", "peak_bytes", "flops", "seq_steps", "path_len"):
        assert mine[column].notna().all() and (mine[column] > 0).all(), column
    # Counted from the real call: two linear layers of d x 2d, 2 · 2·b·n·d·2d FLOPs (b = 1).
    assert list(mine["flops"]) == [2 * 2 * n * 8 * 16 for n in (8, 16)]
    assert mine["flops_analytic"].isna().all() and set(mine["flops_check"]) == {"no theory"}
    assert set(mine["path_len"]) == {1}  # the mean mixes every position at once
    assert mine["case_id"].iloc[0] == "mixer:make/n=8/d=8/width=2/b=1/float32/cpu/forward"
    assert list(mine["width"]) == [2, 2]  # the plugin's own option has a column
    source = mine["layer_source"].iloc[0]
    assert source.startswith(f"{path}:make (sha256 ") and len(source.split()[-1]) == 13
    assert run.meta["layers"]["mixer:make"]["kind"] == "file"


def test_a_plugin_option_is_set_with_option(tmp_path: Path) -> None:
    path = plugin(tmp_path)
    out = tmp_path / "run"
    result = sweep("--layers", f"{path}:make", "--option", "width=3", "--out", str(out))
    assert result.exit_code == 0, result.output
    run = load_results(out)
    assert set(run.frame["width"]) == {3}
    assert set(run.frame["flops"]) == {2 * 2 * 8 * 8 * 24, 2 * 2 * 16 * 8 * 24}
    bad = sweep("--layers", f"{path}:make", "--option", "depth=3")
    assert bad.exit_code == 2 and "--option depth: no registered layer takes it" in bad.stderr
    # a float parameter (scale: float = 0.5) was silently no option: the error says what is one
    said = " ".join(bad.stderr.split())
    assert "(a factory's parameter is an option where its default is an integer)" in said
    # named as it was given: a plugin's option has no flag (a new user read "--expansion")
    zero = sweep("--layers", f"{path}:make", "--option", "width=0")
    assert zero.exit_code == 2 and "error: --option width must be >= 1, got 0" in zero.stderr
    from attnbench.options import _given

    # a layer's own flag where it has one; a plugin's parameter named as a sweep flag is not it
    assert (_given("k"), _given("seed")) == ("--k", "--option seed")
    assert _given("width") == "--option width"


def test_a_layer_whose_output_is_nan_is_refused_and_its_path_not_read_as_none(
    tmp_path: Path,
) -> None:
    """A researcher's broken layer (its output times NaN) was measured `ok` at every n, and one
    mixing every position read "no output depends on another position's input"."""
    from torch import nn

    from attnbench.measure.counts.structure import NonFinite, dependency_pattern

    out = "return self.down(torch.relu(self.up(mixed)))"
    broken = MIXER.replace(out, f"{out} * float('nan')")
    assert broken != MIXER
    result = sweep("--layers", f"{plugin(tmp_path, broken)}:make")
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "to NaN or inf (" in result.stderr

    class Mixing(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:  # (1, n, d) -> (1, n, d)
            return x + x.mean(dim=1, keepdim=True) * float("nan")

    with pytest.raises(NonFinite, match="NaN or inf"):
        dependency_pattern(Mixing(), 8, 4)


def test_a_theory_that_reads_a_size_it_lacks_is_refused_in_one_line(tmp_path: Path) -> None:
    """A term read s["w"], the option's tag, where the sizes name it "width": a researcher's
    sweep stopped with a KeyError traceback from its first estimate."""
    wrong = WITH_THEORY.replace('s["width"] * s["d"] * s["d"]),)', 's["w"] * s["d"] * s["d"]),)')
    assert wrong != WITH_THEORY
    path = plugin(tmp_path, wrong)
    result = sweep("--layers", f"{path}:ENTRY", "--out", str(tmp_path / "run"))
    assert result.exit_code == 2 and "Traceback" not in result.output
    said = " ".join(result.stderr.split())
    assert "layer 'mixer'" in said
    assert (
        "its theory's term 'b·n·w·d²' fails: KeyError: 'w' (the sizes read: b, n, d, width)" in said
    )
    assert not (tmp_path / "run").exists()  # before anything is measured
    nan = WITH_THEORY.replace(
        'order=lambda s: s["n"] * s["d"] * s["d"]', 'order=lambda s: float("nan")'
    )
    result = sweep("--layers", f"{plugin(tmp_path, nan, 'nan_order.py')}:ENTRY")
    assert result.exit_code == 2 and "its theory's law 'order' gives nan" in result.stderr


@pytest.mark.parametrize("order", ["None", '"O(n d^^2 banana"', '"n d^2"'])
def test_a_theory_whose_order_is_no_order_is_refused_before_anything_is_measured(
    tmp_path: Path, order: str
) -> None:
    """A plugin's LayerTheory(None, ...) was measured beside conv, then theory.json refused to
    be written, and table, show, fit and --resume refused the whole run, conv's rows too."""
    wrong = WITH_THEORY.replace('"O(n d^2)",', f"{order},", 1)
    assert wrong != WITH_THEORY
    out = tmp_path / "run"
    result = sweep("--layers", f"{plugin(tmp_path, wrong)}:ENTRY,conv", "--out", str(out))
    assert result.exit_code == 2 and "Traceback" not in result.output
    said = " ".join(result.stderr.split())
    assert "layer 'mixer'" in said and "its theory's complexity" in said, said
    assert 'is not an order such as "O(n d^2)"' in said
    assert not out.exists()


@pytest.mark.parametrize(
    ("change", "said"),
    [  # the words the table shows, against the law the verdicts read
        (('"O(n d^2)",', '"O(n^2 d)",'), "complexity 'O(n^2 d)' grows as n^2, its order as n^1.00"),
        (
            (
                'order=lambda s: s["n"] * s["d"] * s["d"],',
                'order=lambda s: s["n"] * s["d"] * s["d"], path="O(n)",',
            ),
            "path 'O(n)' grows as n^1, its path_law as n^0.00",
        ),
    ],
)
def test_an_order_in_words_that_grows_otherwise_than_its_law_is_refused(
    tmp_path: Path, change: tuple[str, str], said: str
) -> None:
    """A plugin's "O(n^2 d)" beside an order of n·d² was shown quadratic in the table and judged
    linear; a path "O(n)" without its law was judged against a constant."""
    wrong = WITH_THEORY.replace(*change, 1)
    assert wrong != WITH_THEORY
    result = sweep("--layers", f"{plugin(tmp_path, wrong)}:ENTRY", "--out", str(tmp_path / "r"))
    assert result.exit_code == 2 and "Traceback" not in result.output
    text = " ".join(result.stderr.split())
    assert said in text and "make them agree" in text, text
    assert not (tmp_path / "r").exists()


def test_a_theory_that_fails_at_a_length_the_sweep_measures_is_refused_in_one_line(
    tmp_path: Path,
) -> None:
    """Registering tries the formulas at n = 64: a term that fails only at longer lengths
    (sqrt(100 - n)) passed, then ended the sweep at n = 128 with a traceback."""
    narrow = WITH_THEORY.replace(
        's["b"] * s["n"] * s["width"] * s["d"] * s["d"]),)',
        's["b"] * s["n"] * s["width"] * s["d"] * s["d"] * math.sqrt(100 - s["n"])),)',
    ).replace("from attnbench.theory", "import math\nfrom attnbench.theory")
    assert narrow.count("math.") == 1
    path = plugin(tmp_path, narrow)
    fine = sweep("--layers", f"{path}:ENTRY", "--n", "64", "--out", str(tmp_path / "ok"))
    assert fine.exit_code == 0, fine.output  # where the formula holds, the plugin is measured
    out = tmp_path / "run"
    result = sweep("--layers", f"{path}:ENTRY", "--n", "64,128", "--out", str(out))
    assert result.exit_code == 2 and "Traceback" not in result.output
    said = " ".join(result.stderr.split())
    assert "layer 'mixer'" in said and "at n=128, d=" in said, said
    assert "fails: ValueError: math domain error" in said
    assert not out.exists()  # before anything is measured


def test_a_file_plugin_imports_a_file_beside_it(tmp_path: Path) -> None:
    """A layer split over two files: `python mixer.py` finds its sibling, and so does
    --layers path/mixer.py:make from another folder (it read ModuleNotFoundError)."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "mixer_parts.py").write_text(textwrap.dedent(MIXER.replace("{fail_above}", "99")))
    (folder / "mixer_entry.py").write_text("from mixer_parts import make\n")
    result = runner.invoke(app, ["layers", "--layers", f"{folder / 'mixer_entry.py'}:make"])
    assert result.exit_code == 0, result.output
    assert "mixer_entry:make" in result.stdout


def test_resume_sees_an_edit_to_a_file_the_plugin_imports(tmp_path: Path) -> None:
    """Only the plugin file's own text was digested: a researcher edited the module it imported
    beside it, resumed, and the run mixed rounds of old and new code without a word."""
    from attnbench.layers.digests import file_digest, siblings, text_digest
    from attnbench.layers.plugins import _now, load

    folder = tmp_path / "mine"
    (folder / "pkg").mkdir(parents=True)
    parts = folder / "mixer_parts.py"
    parts.write_text(textwrap.dedent(MIXER.replace("{fail_above}", "99")) + "import pkg.sub\n")
    (folder / "pkg" / "__init__.py").write_text("")
    (folder / "pkg" / "sub.py").write_text("X = 1\n")
    entry = folder / "mixer_entry.py"
    entry.write_text("import os\nfrom mixer_parts import make\n")
    assert siblings(entry, entry.read_text()) == sorted(
        [parts, folder / "pkg" / "__init__.py", folder / "pkg" / "sub.py"]
    )  # what it imports beside it, and what that imports in turn; os is no file beside it
    alone = folder / "alone.py"
    alone.write_text("import torch\n")
    assert file_digest(alone, alone.read_text()) == text_digest(alone.read_bytes())

    recorded = load(f"{entry}:make").source
    assert _now("mixer_entry:make", recorded)[0].digest == recorded.digest
    (folder / "pkg" / "sub.py").write_text("X = 2\n")  # two imports away
    assert _now("mixer_entry:make", recorded)[0].digest != recorded.digest


def test_a_worker_without_the_files_beside_a_plugin_gets_them_shipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ray worker on another machine has the plugin's text shipped but not the files it
    imports beside it: it read the file as "changed since it was loaded" and ran nothing."""
    from attnbench.layers import plugins as plugins_module

    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "beside_parts.py").write_text(textwrap.dedent(MIXER.replace("{fail_above}", "99")))
    entry = folder / "beside_entry.py"
    entry.write_text("from beside_parts import make\n")
    recorded = plugins_module.load(f"{entry}:make").source
    shipped = json.loads(json.dumps(plugins_module.shipment(["beside_entry:make"])))
    assert set(shipped[0]["beside"]) == {"beside_parts.py"}
    # the worker: none of the folder, a fresh registry and import state
    (folder / "beside_parts.py").unlink()
    entry.unlink()
    del REGISTRY["beside_entry:make"]
    for name in [m for m in sys.modules if m == "beside_parts" or "beside_entry" in m]:
        monkeypatch.delitem(sys.modules, name)  # the driver's run of both files, forgotten
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(folder)])
    plugins_module.receive(shipped)
    assert REGISTRY["beside_entry:make"].source.digest == recorded.digest
    assert REGISTRY["beside_entry:make"].build(8) is not None  # its sibling imported, and built
    copied = Path(sys.modules["beside_parts"].__file__ or "")
    assert copied.parent.name.startswith("attnbench-beside-") and copied.read_text() == (
        textwrap.dedent(MIXER.replace("{fail_above}", "99"))
    )
    # a sibling edited in transit is refused, as the file itself is
    edited = [{**shipped[0], "beside": {"beside_parts.py": "X = 1\n"}}]
    del REGISTRY["beside_entry:make"]
    with pytest.raises(AttnbenchError, match="the shipped file changed since it was loaded"):
        plugins_module.receive(edited)


def test_a_worker_runs_each_version_with_its_own_shipped_helper(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two versions side by side, shipped to a worker that has neither folder: each runs the
    helper shipped beside it, each from a copy of its own."""
    from attnbench.layers import plugins as plugins_module

    for version, helper in (("old", OLD_HELPER), ("new", NEW_HELPER)):
        (tmp_path / version).mkdir()
        plugin(tmp_path / version, USES_HELPER, "mine.py")
        plugin(tmp_path / version, helper, "mixhelp.py")
    plugins_module.resolve(f"before={tmp_path / 'old' / 'mine.py'}:make")
    plugins_module.resolve(f"after={tmp_path / 'new' / 'mine.py'}:make")
    shipped = json.loads(json.dumps(plugins_module.shipment(["before", "after"])))
    for version in ("old", "new"):  # the worker: none of the folders, a fresh import state
        for file in (tmp_path / version).iterdir():
            file.unlink()
    for name in ("before", "after"):
        del REGISTRY[name]
    for name in [m for m in sys.modules if m == "mixhelp" or "attnbench_plugin_mine" in m]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "path", list(sys.path))
    plugins_module.receive(shipped)
    x = torch.ones(1, 3, 2)  # (B, n, d)
    mixed = {name: REGISTRY[name].build.__globals__["mix"](x) for name in ("before", "after")}
    assert torch.equal(mixed["before"], x) and torch.equal(mixed["after"], 3 * x)


@pytest.mark.slow
def test_a_module_plugin_from_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin(tmp_path, name="mixer_module.py")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "mixer_module", raising=False)
    result = sweep("--layers", "mixer_module:make", "--out", "run", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["results"]
    assert {r["layer"] for r in rows} == {"mixer_module:make"}
    assert rows[0]["layer_source"].startswith("mixer_module:make (sha256 ")


@pytest.mark.slow
def test_a_plugin_that_fails_in_a_case_fails_that_case_only(tmp_path: Path) -> None:
    path = plugin(tmp_path, fail_above=8)
    out = tmp_path / "run"
    result = sweep("--layers", f"{path}:make,conv", "--out", str(out))
    assert result.exit_code == 0, result.output
    status = dict(zip(load_results(out).frame["case_id"], load_results(out).frame["status"],
                      strict=True))  # fmt: skip
    assert status["mixer:make/n=16/d=8/width=2/b=1/float32/cpu/forward"] == "failed"
    assert status["mixer:make/n=8/d=8/width=2/b=1/float32/cpu/forward"] == "ok"
    assert all(s == "ok" for case, s in status.items() if case.startswith("conv"))
    failed = load_results(out).frame.set_index("status").loc["failed", "error"]
    assert failed == "ValueError: too long for this mixer"  # the error's first line


def test_strict_fails_a_sweep_in_which_a_case_broke(tmp_path: Path) -> None:
    """A CI job gating on a sweep passed while a layer failed at every n past the first (the
    sweep exits 0 when it measured anything, as asv run does): --strict exits 1 then, in one
    line naming the count and where the reasons are, and the cases measured stay saved."""
    path = plugin(tmp_path, fail_above=8)
    out = tmp_path / "run"
    result = sweep("--layers", f"{path}:make", "--out", str(out), "--strict")
    assert result.exit_code == 1, result.output
    said = " ".join(result.stderr.split())
    reasons = f"(each one's reason is in its row's error: attnbench show {out})"
    assert f"--strict: 1 failed {reasons}" in said
    assert "Traceback" not in result.output
    assert sorted(load_results(out).frame["status"]) == ["failed", "ok"]
    healthy = plugin(tmp_path, name="fine.py")
    fine = sweep("--layers", f"{healthy}:make", "--out", str(tmp_path / "fine"), "--strict")
    assert fine.exit_code == 0, fine.output  # nothing broke: --strict changes nothing


BAD = {
    "no module": ("nosuchmodule_xyz:make", "cannot import 'nosuchmodule_xyz': ModuleNotFoundError"),
    "import fails": ("{broken}:make", "failed: ModuleNotFoundError: No module named 'nonexistent_"),
    "no attribute": ("{mixer}:nope", "has no attribute 'nope'"),
    "not a module": ("{odd}:number", "its factory returned int, not an nn.Module"),
    "wrong shape": ("{odd}:wider", "maps a (2, 8, 8) input to (2, 8, 9); a layer must map"),
    "changes n": ("{odd}:longer", "maps a (2, 8, 8) input to (2, 16, 8); a layer must map"),
    "changes batch": ("{odd}:first", "maps a (2, 8, 8) input to (1, 8, 8); a layer must map"),
    "tuple": ("{odd}:pair", "maps a (2, 8, 8) input to a tuple, not a tensor"),
    "dtype": (
        "{odd}:double",
        "to a tensor of torch.float64 (the input is torch.float32); a layer must map",
    ),
    "not callable": ("{odd}:WORD", "str is neither a factory"),
    "clash": ("{odd}:ENTRY", "'attention' ({odd}:ENTRY) clashes with a built-in layer"),
    "no spec": ("mixer.py", "unknown layer 'mixer.py': a plugin file is named with the function"),
    "no spec, a path": ("{mixer}", "as {mixer}:make (path/to/file.py:factory)"),
    # two versions of one file (an old copy to race): one name, and the way out named
    "two copies": ("{mixer}:make,{copy}:make", "a name of its own: --layers mixer-2={copy}:make"),
    "no alias": ("={mixer}:make", "--layers ={mixer}:make: NAME= names a plugin given by its"),
    "alias of a built-in": ("fast=attention", "as fast=path/to/file.py:factory or fast=module"),
    "alias a built-in's": ("conv={mixer}:make", "'conv' ({mixer}:make) clashes with a built-in"),
    "alias with a slash": ("a/b={mixer}:make", "there is no file"),  # a path, as lr=0.1/
}


def test_two_versions_of_one_file_sweep_side_by_side_under_names_of_their_own(
    tmp_path: Path,
) -> None:
    """old/mixer.py and mixer.py are both mixer:make: NAME= before a spec names each, and the
    run, read again in a process that never loaded them, is of both, each with its own code."""
    from attnbench.layers import plugins

    (tmp_path / "old").mkdir()
    new, old = plugin(tmp_path), plugin(tmp_path / "old", MIXER.replace("width=2", "width=1"))
    out = tmp_path / "run"
    result = sweep("--layers", f"before={old}:make,after={new}:make", "--out", str(out))
    assert result.exit_code == 0, result.output
    run = load_results(out)
    assert sorted(run.frame["layer"].unique()) == ["after", "before"]
    flops = run.frame.set_index(["layer", "n"])["flops"]
    assert flops["after", 16] == 2 * flops["before", 16] > 0  # width 2 against width 1
    sources = run.meta["layers"]
    assert sources["before"]["spec"] == f"{old}:make" and sources["after"]["spec"] == f"{new}:make"
    assert sources["before"]["digest"] != sources["after"]["digest"]
    with registry_restored():  # a fresh process: restored under the recorded names
        for name in ("before", "after"):
            REGISTRY.pop(name, None)
        plugins.restore(sources)
        assert REGISTRY["before"].source.spec == f"{old}:make"
    # an A/B side's spec: renamed where the other side's layer holds its own name
    plugins.load(f"{new}:make")
    assert plugins.side_named(f"{new}:make") == f"{new}:make"  # the same code
    assert plugins.side_named(f"{old}:make") == f"mixer:make@base={old}:make"
    assert plugins.side_named("conv") == "conv"
    assert plugins.unversioned("mixer:make@base") == plugins.unversioned("mixer:make")


USES_HELPER = """
from torch import nn
from mixhelp import mix


class Mixed(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.proj = nn.Linear(d, d)

    def forward(self, x):  # (B, n, d)
        return self.proj(mix(x))


def make(d):
    return Mixed(d)
"""
# the old helper mixes nothing; the new one mixes every position into each: 2·n²·d FLOPs more
OLD_HELPER, NEW_HELPER = (
    "def mix(x):\n    return x\n",
    (
        "import torch\n\n\ndef mix(x):  # (B, n, d)\n"
        "    return torch.ones(x.shape[1], x.shape[1]) @ x\n"
    ),
)


def test_a_path_that_holds_an_equals_sign_names_a_file_not_a_layer(tmp_path: Path) -> None:
    """A Hydra run's folder (outputs/lr=0.1/) is a path: NAME= is read only where the part
    before '=' holds no '/' and the whole is no file (a name holds no '/')."""
    from attnbench.layers import plugins

    folder = tmp_path / "lr=0.1"
    folder.mkdir()
    mine = plugin(folder)
    assert plugins.split_alias(f"{mine}:make") == (None, f"{mine}:make")
    assert plugins.split_alias(f"fast={mine}:make") == ("fast", f"{mine}:make")
    assert plugins.split_alias("conv") == (None, "conv")
    assert plugins.resolve(f"{mine}:make").name == "mixer:make"
    assert plugins.resolve(f"fast={mine}:make").source.spec == f"{mine}:make"
    assert plugins.named_files([f"fast={mine}:make", f"{mine}:make"]) == {mine.resolve()}


def test_two_versions_each_run_the_helper_beside_it_and_none_other(tmp_path: Path) -> None:
    """old/mine.py and mine.py each import mixhelp.py beside them: each runs its own, in
    either order (both had run the first one loaded, with two digests recorded), and a
    version whose helper is not beside it is refused, where it had run the other's."""
    (tmp_path / "old").mkdir()
    new, old = (
        plugin(tmp_path, USES_HELPER, "mine.py"),
        plugin(tmp_path / "old", USES_HELPER, "mine.py"),
    )
    plugin(tmp_path, NEW_HELPER, "mixhelp.py")
    helper = plugin(tmp_path / "old", OLD_HELPER, "mixhelp.py")
    for order, name in (
        (f"before={old}:make,after={new}:make", "a"),
        (f"after={new}:make,before={old}:make", "b"),
    ):
        result = sweep("--layers", order, "--out", str(tmp_path / name), "--no-cache")
        assert result.exit_code == 0, result.output
        flops = load_results(tmp_path / name).frame.set_index(["layer", "n"])["flops"]
        for n in (8, 16):
            assert flops["after", n] - flops["before", n] == 2 * n * n * 8  # the mixing
    helper.unlink()  # old/ holds the layer without its helper: not run with the new one's
    # (the console script, as a user runs it: `python -m` puts the current directory first)
    for layers in (f"after={new}:make,older={old}:make", f"older={old}:make"):
        found = subprocess.run(
            [Path(sys.executable).parent / "attnbench", "layers", "--layers", layers],
            capture_output=True, text=True, cwd=tmp_path,
        )  # fmt: skip
        assert found.returncode == 2 and "Traceback" not in found.stderr
        said = " ".join(found.stderr.split())
        if "after" in layers:  # mixhelp is loaded, from beside another plugin
            assert "it imports mixhelp, which is not beside it; the mixhelp loaded is" in said
        else:  # none loaded: it is in the current directory, not beside it
            assert "No module named 'mixhelp' (mixhelp.py is in the current directory" in said


@pytest.mark.parametrize("case", sorted(BAD))
def test_every_bad_plugin_is_one_line_and_exit_2_before_measuring(tmp_path: Path, case: str):
    (tmp_path / "old").mkdir()
    files = {
        "mixer": plugin(tmp_path),
        "copy": plugin(tmp_path / "old", MIXER + "\n# the old version\n"),
        "broken": plugin(tmp_path, "import nonexistent_pkg_xyz\n", "broken.py"),
        "odd": plugin(
            tmp_path,
            "import torch\nfrom torch import nn\nfrom attnbench.layers import LayerEntry\n"
            "class Fn(nn.Module):\n"
            "    def __init__(self, fn):\n        super().__init__()\n        self.fn = fn\n"
            "    def forward(self, x):\n        return self.fn(x)\n"
            "def number(d):\n    return 42\n"
            "def wider(d):\n    return nn.Linear(d, d + 1)\n"
            "def longer(d):\n    return Fn(lambda x: torch.cat([x, x], dim=1))\n"
            "def first(d):\n    return Fn(lambda x: x[:1])\n"
            "def pair(d):\n    return Fn(lambda x: (x, x))\n"
            "def double(d):\n    return Fn(lambda x: x.double())\n"
            "WORD = 'layer'\n"
            "ENTRY = LayerEntry('attention', wider)\n",
            "odd.py",
        ),
    }
    spec, message = BAD[case]
    spec = spec.format(**files)
    out = tmp_path / "never"
    result = sweep("--layers", spec, "--out", str(out))
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    assert message.format(**files) in result.stderr.replace("\n", "")
    assert "Traceback" not in result.output
    assert not out.exists()  # refused before a folder was made


@pytest.mark.slow
def test_a_plugin_with_theory_fits_plots_compares_and_resumes(tmp_path: Path) -> None:
    path = plugin(tmp_path, WITH_THEORY, "entry.py")
    spec = f"{path}:ENTRY"
    base, out = tmp_path / "base", tmp_path / "run"
    args = ["--layers", f"{spec},rnn", "--n", "8,16,32", "--d", "8,16", "--heads", "2"]
    assert sweep(*args, "--out", str(base)).exit_code == 0
    first = sweep(*args, "--out", str(out))
    assert first.exit_code == 0, first.output
    run = load_results(out)
    mixer = run.frame[run.frame["layer"] == "mixer"]
    assert set(mixer["flops_check"]) == {"ok"}  # counted equals its declared formula
    assert (mixer["flops"] == mixer["flops_analytic"]).all()

    REGISTRY.pop("mixer")  # a fresh process: the saved run loads its plugin again
    fitted = runner.invoke(app, ["fit", str(out), "--json"])
    assert fitted.exit_code == 0, fitted.output
    models = json.loads(fitted.stdout)["models"]
    own = [m for m in models if m["layer"] == "mixer" and m["own"]]
    assert own and own[0]["formula"] == "α·b·n·w·d² + γ"
    crossovers = json.loads(fitted.stdout)["crossovers"]
    assert {(c["layer"], c["versus"]) for c in crossovers} == {("mixer", "rnn")}  # its family's

    plotted = runner.invoke(app, ["plot", str(out), "--metric", "time,flops", "--json"])
    assert plotted.exit_code == 0, plotted.output
    assert {Path(p).name for p in json.loads(plotted.stdout)["charts"]} >= {"time.png"}

    same = runner.invoke(app, ["compare", str(base), str(out), "--fail-on", "deterministic"])
    assert same.exit_code == 0, same.output

    lines = (out / RESULTS_FILE).read_text().splitlines(keepends=True)
    (out / RESULTS_FILE).write_text("".join(lines[:-1]))  # as if stopped before the last case
    REGISTRY.pop("mixer", None)
    resumed = runner.invoke(app, ["sweep", "--resume", str(out), "--no-charts", "--json"])
    assert resumed.exit_code == 0, resumed.output
    assert len(json.loads(resumed.stdout)["results"]) == len(run.frame)

    path.write_text(path.read_text() + "\n# changed\n")  # the plugin's code changed since
    last_mixer = max(i for i, line in enumerate(lines) if line.startswith("mixer/"))
    (out / RESULTS_FILE).write_text("".join(lines[:last_mixer] + lines[last_mixer + 1 :]))
    REGISTRY.pop("mixer", None)
    refused = runner.invoke(app, ["sweep", "--resume", str(out), "--no-charts"])
    assert refused.exit_code == 2 and "layer mixer" in refused.stderr
    assert "pass --force" in refused.stderr
    REGISTRY.pop("mixer", None)
    forced = runner.invoke(app, ["sweep", "--resume", str(out), "--no-charts", "--force"])
    assert forced.exit_code == 0, forced.output
    assert "layer mixer" in load_results(out).meta["resumes"][-1]["environment_changes"]
    REGISTRY.pop("mixer", None)
    changed = runner.invoke(app, ["compare", str(base), str(out), "--fail-on", "none"])
    assert "layer mixer differs" in changed.stderr  # what is compared is named
    assert "layer mixer's cases ran 2 codes" in changed.stderr  # and that the run mixes them


def test_a_layer_registered_from_python_sweeps(tmp_path: Path) -> None:
    class Scale(torch.nn.Module):
        def __init__(self, d: int, factor: int = 2) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(d) * factor)

        def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, n, d) -> (B, n, d)
            return x * self.w

    entry = register_layer(Scale, "scale")
    assert [o.name for o in entry.options] == ["factor"] and entry.theory is None
    grid = build_grid({"layers": "scale,conv", "n": "8", "d": "4", "device": "cpu"})
    run = run_sweep(grid, tmp_path / "run", measuring=UNCALIBRATED)
    assert set(run.frame["status"]) == {"ok"}
    assert run.frame.set_index("layer").loc["scale", "layer_source"].startswith("test_plugins:")


def test_the_layers_command_lists_built_in_and_plugin_layers(tmp_path: Path) -> None:
    path = plugin(tmp_path, WITH_THEORY, "entry.py")
    result = runner.invoke(app, ["layers", "--layers", f"{path}:ENTRY", "--json"])
    assert result.exit_code == 0, result.output
    found = {layer["name"]: layer for layer in json.loads(result.stdout)["layers"]}
    assert found["attention"]["flops"] == "8·b·n·d² + 4·b·n²·d"
    assert found["attention"]["family"] == "self-attention"
    assert found["attention"]["options"] == {"heads": 4, "causal": 0}
    assert found["attention"]["elementwise"] == "1·b·n·d + 2·b·h·n² + 1·causal·b·h·n²"
    assert found["ssm-scan"]["options"] == {"state": 16}
    assert found["mixer"]["options"] == {"width": 2} and found["mixer"]["source"]["kind"] == "file"
    table = runner.invoke(app, ["layers"])
    assert "conv-dilated" in table.stdout and "L·b·n·k·d²" in table.stdout


def test_the_example_package_is_found_through_its_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The example plugin, installed as metadata says (a dist-info folder on the path)."""
    import tomllib

    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    info = tmp_path / f"attnbench_gated_conv-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Name: {project['name']}\nVersion: {project['version']}\n")
    points = project["entry-points"]["attnbench.layers"]
    lines = "".join(f"{name} = {value}\n" for name, value in points.items())
    (info / "entry_points.txt").write_text(f"[attnbench.layers]\n{lines}")
    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.syspath_prepend(str(tmp_path))

    listed = runner.invoke(app, ["layers", "--json"])
    found = {layer["name"]: layer for layer in json.loads(listed.stdout)["layers"]}
    assert found["gated-conv"]["source"]["distribution"] == "attnbench-gated-conv 0.1.0"
    out = tmp_path / "run"
    result = sweep("--layers", "gated-conv,conv", "--k", "3", "--out", str(out))
    assert result.exit_code == 0, result.output
    run = load_results(out)
    gated = run.frame[run.frame["layer"] == "gated-conv"]
    assert set(gated["flops_check"]) == {"ok"} and set(gated["k"]) == {3}
    assert set(gated["elementwise_check"]) == {"ok"}  # its formula, checked like a built-in's
    assert set(gated["layer_source"]) == {"attnbench_gated_conv:ENTRY (attnbench-gated-conv 0.1.0)"}
    # Its family is convolutional: as a rival of attention, on the table like conv.
    assert list(gated["path_len"]) == [7, 15]  # (n - 1) / ((k - 1) / 2), as conv's


LINEAR = """
from torch import nn

from attnbench.layers import CUSTOM, LayerEntry
from attnbench.theory import LayerTheory, Term, values


def _tokens(s):
    return s["b"] * s["n"] * s["d"]


# One matrix product: x (b·n, d) and W (d, d) and the bias (d) read, y (b·n, d) written.
ENTRY = LayerEntry(
    "lin", lambda d: nn.Linear(d, d), CUSTOM, "one nn.Linear", (),
    LayerTheory(
        "O(n d^2)",
        (Term(2, "b·n·d²", lambda s: _tokens(s) * s["d"]),),
        order=lambda s: s["n"] * s["d"] * s["d"],
        traffic=(values(2, "b·n·d", _tokens), values(1, "d²", lambda s: s["d"] * s["d"]),
                 values(1, "d", lambda s: s["d"])),
    ),
)
"""


def test_a_plugins_bytes_formula_is_checked_recorded_and_read_back(tmp_path: Path) -> None:
    """An nn.Linear moves exactly what its one product reads and writes; the formula travels in
    theory.json, so the analysis reads it without the plugin's code."""
    path = plugin(tmp_path, LINEAR, name="lin.py")
    out = tmp_path / "run"
    result = sweep("--layers", f"{path}:ENTRY", "--n", "8,16,32", "--out", str(out))
    assert result.exit_code == 0, result.output
    run = load_results(out)
    rows = run.measured.sort_values("n")
    d = 8
    assert list(rows["bytes"]) == [4 * (2 * n * d + d * d + d) for n in (8, 16, 32)]
    assert set(rows["bytes_check"]) == {"ok"}
    recorded = json.loads((out / "theory.json").read_text())["layers"]["lin"]["theory"]
    assert recorded["traffic"] == [[2, "b·n·d", "value"], [1, "d²", "value"], [1, "d", "value"]]
    from attnbench.fits import analyse, run_catalog

    REGISTRY.pop("lin", None)  # read back from the record, not from the plugin
    theory = run_catalog(run).theory("lin")
    assert theory is not None and theory.traffic is not None
    sizes = {"b": 1, "n": 16, "d": d}
    assert theory.bytes(sizes, 4) == 4 * (2 * 16 * d + d * d + d)
    bytes_n = analyse(run).exponent("lin", "bytes", "n", d)
    assert bytes_n is not None and bytes_n["agrees"]


def test_a_factory_that_takes_n_is_built_for_each_cases_length(tmp_path: Path) -> None:
    """A layer built for one length (Linformer's projections along n, a learned positional
    table) names ``n`` among its factory's parameters: it is given each case's n, and n is not
    one of its options."""
    from torch import nn

    from attnbench.layers.registry import build_layer

    class LearnedPositions(nn.Module):
        def __init__(self, d: int, n: int) -> None:
            super().__init__()
            self.table = nn.Parameter(torch.zeros(n, d))  # (n, d)

        def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, n, d)
            return x + self.table

    def positions(d: int, n: int, scale: int = 1) -> nn.Module:
        return LearnedPositions(d, n)

    with registry_restored():
        found = register_layer(positions, "learned-positions")
        assert found.needs_length and [o.name for o in found.options] == ["scale"]
        layer = build_layer("learned-positions", 8, n=48)
        assert tuple(layer.table.shape) == (48, 8)
        grid = {"layers": "learned-positions", "n": [16, 32], "d": [8], "time_budget": 0.01}
        run = run_sweep(build_grid(grid), tmp_path / "run")
    assert run.frame["status"].tolist() == ["ok", "ok"]
