"""The package's shape, read from its source: no import loop, no import from a lower floor to a
higher one, no module above 500 lines, and the registries that everything else reads.

The floors follow the data flow (spec -> layer -> measurement -> results -> fit -> chart, report,
verdict -> command line). A module may import from its own floor or below, never above.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "attnbench"

# Lowest first. A module belongs to the first floor one of whose prefixes it starts with.
FLOORS: list[tuple[str, ...]] = [
    (
        "attnbench._version",
        "attnbench.errors",
        "attnbench.units",
        "attnbench.storage",
        "attnbench.vcs",
        "attnbench.priors",
    ),
    (
        "attnbench.positional",
        "attnbench.devices",
        "attnbench.schema",
        "attnbench.metrics",
        "attnbench.thresholds",
        "attnbench.values",
        "attnbench.provenance",
        "attnbench.estimators",
        "attnbench.formats",
        "attnbench.regime",
        "attnbench.lengths",
        "attnbench.compiling",
    ),
    ("attnbench.theory",),
    ("attnbench.layers",),
    ("attnbench.spec", "attnbench.options"),
    ("attnbench.measure",),
    ("attnbench.results",),
    ("attnbench.run",),
    ("attnbench.fits", "attnbench.table", "attnbench.beside", "attnbench.compare"),
    ("attnbench.render",),
    ("attnbench.cli",),
    ("attnbench.__init__", "attnbench.__main__"),
]


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1]) if parts[-1] == "__init__" and len(parts) > 2 else ".".join(parts)


def _floor(module: str) -> int:
    name = "attnbench.__init__" if module == "attnbench" else module
    for level, prefixes in enumerate(FLOORS):
        if any(name == p or name.startswith(p + ".") for p in prefixes):
            return level
    raise AssertionError(f"{module} is on no floor: add it to FLOORS")


def _imports(path: Path) -> set[str]:
    """The attnbench modules a file imports (``from attnbench.x import y`` names ``attnbench.x``,
    or ``attnbench.x.y`` when y is itself a module)."""
    modules = {_module(p) for p in PACKAGE.rglob("*.py")}
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("attnbench")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("attnbench"):
            base = str(node.module)
            subs = {f"{base}.{a.name}" for a in node.names} & modules
            found |= subs or {base}
    return found


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return [
        f"{module} (floor {_floor(module)}) imports {target} (floor {_floor(target)})"
        for module, targets in graph.items()
        for target in targets
        if _floor(target) > _floor(module)
    ]


def import_loop(graph: dict[str, set[str]]) -> list[str]:
    """One import loop of the graph (its modules, the first repeated at the end), or []."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> list[str]:
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (loop := visit(target, [*path, target])):
                return loop
        state[module] = 2
        return []

    for module in sorted(graph):
        if module not in state and (loop := visit(module, [module])):
            return loop
    return []


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return {_module(p): _imports(p) for p in PACKAGE.rglob("*.py")}


@pytest.mark.slow
def test_every_module_is_on_a_floor_and_imports_only_its_own_or_lower(graph) -> None:
    assert upward_imports(graph) == []


def test_there_is_no_import_loop(graph) -> None:
    assert import_loop(graph) == []


def test_the_checks_catch_what_they_look_for() -> None:
    """On a made-up graph: a layer importing the CLI, and two executors importing each other."""
    bad = {
        "attnbench.layers.conv": {"attnbench.cli.render"},
        "attnbench.run.executors.serial": {"attnbench.run.executors.ray"},
        "attnbench.run.executors.ray": {"attnbench.run.executors.serial"},
    }
    assert upward_imports(bad) == [
        "attnbench.layers.conv (floor 3) imports attnbench.cli.render (floor 10)"
    ]
    assert import_loop(bad) == [
        "attnbench.run.executors.ray", "attnbench.run.executors.serial",
        "attnbench.run.executors.ray",
    ]  # fmt: skip
    source = PACKAGE / "run" / "sweep.py"
    assert "attnbench.run.executors.serial" in _imports(source)  # real imports are read


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: p.name)
def test_no_module_is_longer_than_500_lines(path: Path) -> None:
    """One concern a module, in at most 500 lines: the registries too (the columns and the
    metrics are two registries, of what is stored and of what is fitted, judged and charted)."""
    assert len(path.read_text().splitlines()) <= 500


def test_every_metric_is_a_registered_column() -> None:
    """The metric registry names columns of the column registry, each once."""
    from attnbench.metrics import METRICS
    from attnbench.schema import COLUMN

    columns = [m.column for m in METRICS]
    assert len(set(columns)) == len(columns)
    assert [c for c in columns if c not in COLUMN] == []


def _commands() -> set[str]:
    """The Typer command functions (registered in cli/app.py or by a decorator): a command
    takes one parameter an option, which is what reads as a long signature."""
    found: set[str] = set()
    for path in (PACKAGE / "cli").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                found.add(node.attr)  # app.py: handles_errors(module.command), (module.x, ...)
            if isinstance(node, ast.FunctionDef) and any(
                isinstance(d, ast.Call)
                and isinstance(d.func, ast.Attribute)
                and d.func.attr in ("command", "callback")
                for d in node.decorator_list
            ):
                found.add(node.name)
    return found


def long_functions(root: Path) -> list[str]:
    """Functions with more than 8 parameters (self and Typer commands aside) or a body over 80
    lines: a record or a step of their own reads better."""
    commands = _commands() if root == PACKAGE else set()
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            args = node.args
            names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
            names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
            names = [n for n in names if n not in ("self", "cls")]
            where = f"{path.relative_to(root)}:{node.lineno} {node.name}"
            command = "cli" in path.relative_to(root).parts and node.name in commands
            if len(names) > 8 and not command:
                found.append(f"{where} takes {len(names)} parameters")
            lines = (node.end_lineno or node.lineno) - node.body[0].lineno + 1  # its body
            if lines > 80:
                found.append(f"{where} runs {lines} lines")
    return found


def test_no_function_takes_more_than_8_parameters_or_runs_over_80_lines(tmp_path: Path) -> None:
    assert long_functions(PACKAGE) == []
    many = ", ".join(f"a{i}" for i in range(9))
    body = "\n".join(["    x = 1"] * 81)
    (tmp_path / "m.py").write_text(f"def wide({many}):\n    pass\n\ndef tall():\n{body}\n")
    assert long_functions(tmp_path) == [
        "m.py:1 wide takes 9 parameters",
        "m.py:4 tall runs 81 lines",
    ]


def test_the_shipped_compare_schema_names_the_registrys_exact_metrics() -> None:
    """The JSON schema users read and the one the tests validate against agree with the
    registry: a new exact metric is required in every case's ``metrics``."""
    from attnbench.metrics import EXACT_METRICS
    from attnbench.render.verdicts import schema

    shipped = json.loads((PACKAGE / "schemas" / "compare.schema.json").read_text())
    metrics = shipped["properties"]["cases"]["items"]["properties"]["metrics"]
    expected = [m.column for m in EXACT_METRICS]
    assert metrics["required"] == expected
    served = schema("compare")["properties"]["cases"]["items"]["properties"]["metrics"]
    assert served["required"] == expected


@pytest.mark.slow
def test_a_case_result_row_fills_exactly_the_registrys_columns(tiny_run) -> None:  # type: ignore[no-untyped-def]
    from attnbench.measure.record import CaseResult
    from attnbench.schema import RESULT_COLUMNS
    from attnbench.spec import Case

    case = Case("conv", 8, 4, 1, "float32", "cpu", "forward", (("k", 3),))
    row = CaseResult(case=case, status="failed", threads=1, error="x").to_row()
    assert list(row) == RESULT_COLUMNS
    # Options without a fixed column follow the registry's, in the order the layers declare them.
    assert list(tiny_run.frame.columns) == [*RESULT_COLUMNS, "causal", "state"]


def test_the_development_map_names_every_module() -> None:
    """docs/development.md's map lists each module of the package, so a newcomer finds it."""
    text = (PACKAGE.parent / "docs" / "development.md").read_text()
    missing = [
        str(p.relative_to(PACKAGE))
        for p in sorted(PACKAGE.rglob("*.py"))
        if f"`{p.relative_to(PACKAGE)}`" not in text
    ]
    assert not missing, f"add to docs/development.md's map: {missing}"


def test_measure_is_in_rooms_of_one_concern_each() -> None:
    """measure/ holds one case, its call, its memory and its record at the top, and its
    timing, counting and machine probes in rooms of their own, each saying its concern first;
    a new module goes into its room, not beside them."""
    measure = PACKAGE / "measure"
    top = sorted(
        p.name for p in measure.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()
    )
    assert len(top) <= 10, top
    rooms = {p.name: p for p in measure.iterdir() if (p / "__init__.py").exists()}
    assert set(rooms) == {"timing", "counts", "machine"}
    for name, room in rooms.items():
        concern = ast.get_docstring(ast.parse((room / "__init__.py").read_text()))
        assert concern and concern.split()[0] in {"Timing", "Counting", "Measuring"}, name
        assert not list(room.glob("*/__init__.py")), f"measure/{name} has rooms of its own"
