"""Malformed results: every command that reads a run answers a mangled one in one line.

Hypothesis mangles a real run (a truncated file, a value of the wrong type in run.json or
theory.json, a cell of nonsense, a missing or renamed column, a folder where a file was
expected) and every reading command must end with an exit code, never a traceback.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.layers import REGISTRY

runner = CliRunner()

PLUGIN = """
from torch import nn
from attnbench.layers import LayerEntry, RECURRENT
from attnbench.theory import LayerTheory, Term

ENTRY = LayerEntry(
    "lin", lambda d: nn.Linear(d, d), RECURRENT, "one matrix product",
    theory=LayerTheory("O(n d^2)", (Term(2, "b·n·d²", lambda s: s["b"] * s["n"] * s["d"] ** 2),),
                       order=lambda s: s["n"] * s["d"] ** 2),
)
"""
FILES = ("run.json", "results.csv", "samples.csv", "calibration.csv", "theory.json")
READERS: dict[str, list[str]] = {
    "show": ["show", "{run}", "--json"],
    "table": ["table", "{run}"],
    "fit": ["fit", "{run}", "--json"],
    "plot": ["plot", "{run}", "--metric", "time,flops", "--format", "png", "--out", "{tmp}/c"],
    "report": ["report", "{run}", "--no-charts", "--out", "{tmp}/r.md"],
    "compare": ["compare", "{good}", "{run}", "--fail-on", "none", "--format", "json"],
}


@pytest.fixture(scope="module")
def good_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("malformed")
    plugin = folder / "lin.py"
    plugin.write_text(textwrap.dedent(PLUGIN))
    before = dict(REGISTRY)
    result = runner.invoke(app, [
        "sweep", "--layers", f"{plugin}:ENTRY,attention", "--n", "8,16,32", "--d", "8",
        "--heads", "2", "--device", "cpu", "--time-budget", "0.002", "--no-charts",
        "--out", str(folder / "run"), "--processes", "2",
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    REGISTRY.clear()
    REGISTRY.update(before)
    yield folder / "run"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=3),
    max_leaves=6,
)  # fmt: skip


def _json_paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path into a JSON value (keys and indices), the value's own included."""
    paths = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            paths += _json_paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value[:4]):
            paths += _json_paths(item, (*prefix, i))
    return paths


def _set(document: Any, path: tuple, value: Any, delete: bool) -> Any:
    if not path:
        return value
    parent = document
    for key in path[:-1]:
        parent = parent[key]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return document


Mangle = Callable[[Path], None]


@st.composite
def json_mangle(draw: st.DrawFn, name: str) -> Mangle:
    pick = draw(st.integers(0, 10**6))
    value = draw(JSON)
    delete = draw(st.booleans())

    def apply(run: Path) -> None:
        try:
            document = json.loads((run / name).read_text())
        except (OSError, ValueError):  # mangled already (truncated, removed): left so
            return
        paths = _json_paths(document)
        path = paths[pick % len(paths)]
        (run / name).write_text(json.dumps(_set(document, path, value, delete and bool(path))))

    apply.__qualname__ = f"json {name} #{pick} -> {value!r} (delete={delete})"
    return apply


@st.composite
def csv_mangle(draw: st.DrawFn) -> Mangle:
    name = draw(st.sampled_from(FILES[1:4]))
    how = draw(st.sampled_from(["cell", "drop column", "rename column", "duplicate row"]))
    row, column = draw(st.integers(0, 10**6)), draw(st.integers(0, 10**6))
    text = draw(st.text(alphabet="0123456789.-eE,naxyz\"'", max_size=6))

    def apply(run: Path) -> None:
        try:
            lines = (run / name).read_text().splitlines()
        except (OSError, ValueError):  # mangled already
            return
        if not lines:
            return
        cells = [line.split(",") for line in lines]  # the test's run has no quoted commas
        width = len(cells[0])
        c = column % width
        if how == "cell" and len(cells) > 1:
            cells[1 + row % (len(cells) - 1)][c] = text
        elif how == "drop column":
            cells = [r[:c] + r[c + 1 :] for r in cells]
        elif how == "rename column":
            cells[0][c] = text or "x"
        elif how == "duplicate row" and len(cells) > 1:
            cells.append(cells[1 + row % (len(cells) - 1)])
        (run / name).write_text("\n".join(",".join(r) for r in cells) + "\n")

    apply.__qualname__ = f"csv {name} {how} r{row} c{column} {text!r}"
    return apply


@st.composite
def file_mangle(draw: st.DrawFn) -> Mangle:
    name = draw(st.sampled_from(FILES))
    how = draw(st.sampled_from(["truncate", "folder", "remove", "binary"]))
    fraction = draw(st.floats(0, 1))

    def apply(run: Path) -> None:
        path = run / name
        if not path.is_file():  # mangled already
            return
        if how == "truncate":
            data = path.read_bytes()
            path.write_bytes(data[: int(len(data) * fraction)])
        elif how == "folder":
            path.unlink()
            path.mkdir()
        elif how == "remove":
            path.unlink()
        else:
            path.write_bytes(bytes(range(256)))

    apply.__qualname__ = f"file {name} {how} {fraction:.2f}"
    return apply


MANGLES = st.one_of(
    json_mangle("run.json"), json_mangle("theory.json"), csv_mangle(), file_mangle()
)


def read_mangled(good: Path, mangles: list[Mangle]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        shutil.copytree(good, run)
        for mangle in mangles:
            mangle(run)
        for name, args in READERS.items():
            argv = [a.format(run=run, good=good, tmp=tmp) for a in args]
            result = runner.invoke(app, argv)
            described = f"{name} after {[m.__qualname__ for m in mangles]}: {result.output[-600:]}"
            assert result.exception is None or isinstance(result.exception, SystemExit), (
                f"{described}\n{result.exception!r}"
            )
            assert "Traceback" not in result.output, described
            if result.exit_code not in (0, 1):
                lines = [line for line in result.stderr.splitlines() if line.strip()]
                assert lines and lines[-1].startswith("error:"), described


@pytest.mark.slow
@settings(
    max_examples=20,  # a slow test already; 500 more were run while the loader was written
    # the list replaces the suite's profile's (conftest: too_slow), so it names it again
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(mangles=st.lists(MANGLES, min_size=1, max_size=2))
def test_a_mangled_run_gets_one_line_from_every_reading_command(
    good_run: Path, mangles: list[Mangle]
) -> None:
    read_mangled(good_run, mangles)


@pytest.mark.slow
@pytest.mark.parametrize(
    "mangle",
    [
        lambda run: (run / "run.json").write_text('{"schema_version": 1, "config": []}'),
        lambda run: (run / "run.json").write_text("[1, 2]"),
        lambda run: (run / "theory.json").write_text('{"layers": {"lin": {"theory": 3}}}'),
        lambda run: (run / "results.csv").write_text("case_id,layer\n"),
        lambda run: ((run / "samples.csv").unlink(), (run / "samples.csv").mkdir()),
    ],
    ids=["config a list", "run.json a list", "theory a number", "columns missing", "a folder"],
)
def test_known_malformations_get_one_line(good_run: Path, mangle: Mangle) -> None:
    read_mangled(good_run, [mangle])


def test_what_slips_past_the_loader_is_still_one_line(
    good_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last guard of the reading commands: an unforeseen error in one line, exit 2, and
    the traceback only when asked for (ATTNBENCH_DEBUG=1)."""
    import attnbench.cli.analysis as analysis

    def broken(*_: Any, **__: Any) -> None:
        raise ValueError("a shape nobody foresaw\nsecond line")

    monkeypatch.setattr(analysis, "analyse", broken)
    result = runner.invoke(app, ["fit", str(good_run)])
    assert result.exit_code == 2 and result.exception is not None  # SystemExit
    assert result.stderr.strip().splitlines() == [
        "error: cannot read these results (ValueError: a shape nobody foresaw); a file of the "
        "results folder is malformed (ATTNBENCH_DEBUG=1 shows where it broke)"
    ]
    monkeypatch.setenv("ATTNBENCH_DEBUG", "1")
    debug = runner.invoke(app, ["fit", str(good_run)])
    assert isinstance(debug.exception, ValueError)
