"""A run's layers as data: what the analysis reads of each layer, recorded when the run is made.

A results folder travels (a CI artifact, a pull request's run), so reading one must never run
code. The commands that read runs (show, table, fit, plot, report, compare) therefore never
import a layer: a built-in layer is read from attnbench's own code, and a plugin layer from
``theory.json``, written by the sweep that ran it. For each plugin layer it holds the family,
the options, and the theory evaluated where the analysis needs it: every law and term at each
case of the grid (exact), and along n on a geometric grid from 1 to 2^40 at each width of the
grid, for crossovers and a chart's model line (interpolated in log-log between grid points,
which is exact for a power of n).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from attnbench.errors import AttnbenchError
from attnbench.layers.entry import CUSTOM, Family, LayerEntry, LayerOption, LayerSource
from attnbench.layers.registry import BUILTIN, REGISTRY
from attnbench.spec import Grid
from attnbench.theory import DecodeTheory, LayerTheory, SizeFn, Sizes, Term

RECORD_VERSION = 1
# Where a crossover's formulas are evaluated between the sweep's sizes: 4 points per octave.
CURVE_N = np.geomspace(1.0, 2.0**40, 161)


def _no_code(*_: Any, **__: Any) -> Any:
    raise AttnbenchError("a layer read from a results folder has no code to build")


def _value(fn: SizeFn, at: Sizes) -> float | None:
    """A law at these sizes; None where the layer's own formula cannot be evaluated."""
    try:
        found = float(fn(at))
    except Exception:  # a plugin's formula: whatever it raises, the record says "unknown"
        return None
    return found if math.isfinite(found) else None


def _laws(theory: LayerTheory) -> list[SizeFn]:
    """Every function the analysis reads, in the order a record lists their values."""
    return [
        *(t.size for t in theory.terms),
        *(t.size for t in theory.elementwise or ()),
        theory.order,
        theory.sequential_law,
        theory.path_law,
        *(t.size for t in theory.traffic or ()),  # last: a record without it reads the rest
    ]


def _key(at: Mapping[str, Any], names: Sequence[str]) -> tuple[float, ...] | None:
    try:
        return tuple(float(at[name]) for name in names)
    except (KeyError, TypeError, ValueError):
        return None


def _evaluated(entry: LayerEntry, grid: Grid, laws: Sequence[SizeFn]) -> dict[str, Any]:
    """``laws`` at each of the layer's cases (points) and along n on each of its lines
    (curves), as a record holds them."""
    own = [o.name for o in entry.options]
    points, lines = [], {}
    for case in grid.cases():
        if case.layer != entry.name:
            continue
        at = case.sizes()
        points.append({"sizes": at, "values": [_value(fn, at) for fn in laws]})
        line = {k: v for k, v in at.items() if k != "n"}
        lines[_key(line, ["b", "d", *own])] = line
    curves = []  # for a crossover and a chart's model line
    for line in lines.values():
        values = [[_value(fn, {**line, "n": float(n)}) for n in CURVE_N] for fn in laws]
        curves.append({"sizes": line, "values": values})
    return {"points": points, "curves": curves}


def _decode_laws(step: DecodeTheory) -> list[SizeFn]:
    """A generation step's functions, in the order its record lists their values."""
    return [
        *(t.size for t in step.terms),
        *(t.size for t in step.elementwise or ()),
        *(t.size for t in step.state),
        step.order,
        step.sequential_law,
    ]


def _decode_record(entry: LayerEntry, step: DecodeTheory, grid: Grid) -> dict[str, Any]:
    """A plugin's theory of one generation step (``DecodeTheory``): a decode run's table, fits
    and state check read it, as they read a built-in's from attnbench's code."""
    return {
        "compute": step.compute,
        "memory": step.memory,
        "form": step.form,
        "sequential": step.sequential,
        "terms": _term_lists(step.terms),
        "elementwise": None if step.elementwise is None else _term_lists(step.elementwise),
        "state": _term_lists(step.state),
        **_evaluated(entry, grid, _decode_laws(step)),
    }


def _term_lists(terms: Iterable[Term]) -> list[list[Any]]:
    return [[t.count, t.name, t.unit] for t in terms]


def _theory_record(entry: LayerEntry, grid: Grid) -> dict[str, Any]:
    theory = entry.theory
    assert theory is not None
    return {
        "complexity": theory.complexity,
        "sequential": theory.sequential,
        "path": theory.path,
        "terms": _term_lists(theory.terms),
        "elementwise": None if theory.elementwise is None else _term_lists(theory.elementwise),
        "traffic": None if theory.traffic is None else _term_lists(theory.traffic),
        **_evaluated(entry, grid, _laws(theory)),
        # a plugin's generation step: a decode run's table had read "?" for its orders
        **({} if theory.decode is None else {"decode": _decode_record(entry, theory.decode, grid)}),
    }


def record(grid: Grid) -> dict[str, Any]:
    """theory.json for ``grid``: every plugin layer's family, options and evaluated theory
    (built-in layers are read from attnbench's own code)."""
    layers = {}
    for name in grid.layers:
        entry = REGISTRY[name]
        if entry.source.kind == "builtin":
            continue
        layers[name] = {
            "description": entry.description,
            "family": asdict(entry.family),
            "options": [asdict(o) for o in entry.options],
            "needs_length": entry.needs_length,
            "source": entry.source.to_dict(),
            "theory": None if entry.theory is None else _theory_record(entry, grid),
        }
    return {"version": RECORD_VERSION, "layers": layers}


def merge(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """A resumed run's record: the new grid's layers over those its first session recorded."""
    return {"version": RECORD_VERSION, "layers": {**old.get("layers", {}), **new["layers"]}}


# ----------------------------------------------------------------------------- reading


def _numbers(values: Any, size: int | None, nulls: bool = True) -> bool:
    return (
        isinstance(values, list)
        and (size is None or len(values) == size)
        and all(
            (v is None and nulls) or (isinstance(v, int | float) and not isinstance(v, bool))
            for v in values
        )
    )


def _sizes_ok(found: Any) -> bool:
    return isinstance(found, dict) and _numbers(list(found.values()), None, nulls=False)


def _terms_ok(found: Any, units: tuple[str, ...] = ("FLOP", "element")) -> bool:
    return isinstance(found, list) and all(
        isinstance(t, list)
        and len(t) == 3
        and _numbers(t[:1], 1, nulls=False)
        and isinstance(t[1], str)
        and t[2] in units
        for t in found
    )


def _law_count(theory: Mapping[str, Any]) -> int:
    """How many laws a record's points and curves hold: its terms, elementwise terms, the three
    orders, and its traffic terms (None: the layer has no traffic formula)."""
    traffic = theory.get("traffic") or ()
    return len(theory["terms"]) + len(theory["elementwise"] or ()) + 3 + len(traffic)


def _theory_problem(theory: Any) -> str | None:
    if not isinstance(theory, dict):
        return "its theory is not an object"
    if any(not isinstance(theory.get(k), str) for k in ("complexity", "sequential", "path")):
        return "its orders are not strings"
    if not _terms_ok(theory.get("terms")) or not (
        theory.get("elementwise") is None or _terms_ok(theory.get("elementwise"))
    ):
        return "its terms are not [count, name, unit] lists"
    if "elementwise" not in theory:
        return "it lacks an elementwise entry"
    if not (theory.get("traffic") is None or _terms_ok(theory["traffic"], ("value", "byte"))):
        return "its traffic terms are not [count, name, value or byte] lists"
    problem = _evaluations_problem(theory, _law_count(theory))
    if problem is None and theory.get("decode") is not None:
        problem = _decode_problem(theory["decode"])
    return problem


def _decode_problem(step: Any) -> str | None:
    """What is wrong with a recorded generation step, in words; None when it reads."""
    if not isinstance(step, dict):
        return "its decode theory is not an object"
    words = ("compute", "memory", "form", "sequential")
    if any(not isinstance(step.get(k), str) for k in words):
        return "its decode theory's orders are not strings"
    if "elementwise" not in step:
        return "its decode theory lacks an elementwise entry"
    units = ("FLOP", "element", "value", "byte")
    elementwise = step.get("elementwise")
    if not (
        _terms_ok(step.get("terms"))
        and _terms_ok(step.get("state"), units)
        and (elementwise is None or _terms_ok(elementwise))
    ):
        return "its decode theory's terms are not [count, name, unit] lists"
    problem = _evaluations_problem(step, _decode_count(step))
    return None if problem is None else f"its decode theory: {problem}"


def _decode_count(step: Mapping[str, Any]) -> int:
    """How many laws a recorded generation step holds: its terms, elementwise and state terms,
    its order and its sequential law."""
    return len(step["terms"]) + len(step["elementwise"] or ()) + len(step["state"]) + 2


def _evaluations_problem(theory: Mapping[str, Any], count: int) -> str | None:
    """What is wrong with a record's points and curves of ``count`` laws; None if nothing."""
    for point in _list(theory.get("points")):
        if not isinstance(point, dict) or not _sizes_ok(point.get("sizes")):
            return "a point's sizes are not numbers"
        if not _numbers(point.get("values"), count):
            return f"a point does not hold {count} values"
    for curve in _list(theory.get("curves")):
        if not isinstance(curve, dict) or not _sizes_ok(curve.get("sizes")):
            return "a curve's sizes are not numbers"
        values = curve.get("values")
        if not isinstance(values, list) or len(values) != count:
            return f"a curve does not hold {count} laws"
        if not all(_numbers(v, len(CURVE_N)) for v in values):
            return f"a curve's law does not hold {len(CURVE_N)} values"
    if not isinstance(theory.get("points"), list) or not isinstance(theory.get("curves"), list):
        return "its points or curves are not lists"
    return None


def _list(found: Any) -> list[Any]:
    return found if isinstance(found, list) else []


def record_problem(payload: Any) -> str | None:
    """What is wrong with a theory.json, in words; None when every record reads."""
    if not isinstance(payload, dict) or not isinstance(payload.get("layers", {}), dict):
        return "it is not an object with a 'layers' object"
    for name, found in payload.get("layers", {}).items():
        problem = _layer_problem(found)
        if problem:
            return f"layer {name!r}: {problem}"
    return None


def _layer_problem(found: Any) -> str | None:
    if not isinstance(found, dict):
        return "its record is not an object"
    try:
        Family(**found["family"])
        for o in found["options"]:
            LayerOption(**o)
        LayerSource(**found["source"])
    except (KeyError, TypeError) as exc:
        return f"its family, options or source do not read ({exc})"
    family = found["family"]
    if not isinstance(family.get("row"), str) or _wrong_flags(family, ("pairwise", "rival")):
        return "its family is malformed"
    for raw in found["options"]:  # LayerOption(**raw) checks the names, not the types
        if not isinstance(raw.get("name"), str) or not isinstance(raw.get("default"), int):
            return "an option is malformed"
    if not isinstance(found.get("description"), str):
        return "its description is not a string"
    if not isinstance(found.get("needs_length"), bool) or "theory" not in found:
        return "it lacks needs_length or theory"
    return None if found.get("theory") is None else _theory_problem(found["theory"])


def _wrong_flags(record: Mapping[str, Any], keys: Sequence[str]) -> bool:
    return any(not isinstance(record.get(k), bool) for k in keys)


class _Lookup:
    """One law of a recorded layer as a function of sizes: exact at the recorded cases,
    interpolated along n on a recorded curve, NaN anywhere else."""

    def __init__(
        self, names: Sequence[str], points: dict[Any, Any], curves: dict[Any, Any], index: int
    ) -> None:
        self.names, self.points, self.curves, self.index = names, points, curves, index

    def __call__(self, at: Sizes) -> float:
        key = _key(at, self.names)
        if key is None:
            return math.nan
        if key in self.points:
            found = self.points[key][self.index]
            return math.nan if found is None else float(found)
        curve = self.curves.get(key[:1] + key[2:])  # the same line: all sizes but n
        if curve is None:
            return math.nan
        return _interpolate(float(at["n"]), curve[self.index])

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        return (_Lookup, (self.names, self.points, self.curves, self.index))


def _interpolate(n: float, values: Sequence[float | None]) -> float:
    """A law between the points of ``CURVE_N``: log-log where both ends are positive."""
    if not CURVE_N[0] <= n <= CURVE_N[-1]:
        return math.nan
    i = min(int(np.searchsorted(CURVE_N, n, side="right")), len(CURVE_N) - 1)
    lo, hi = values[i - 1], values[i]
    if lo is None or hi is None:
        return math.nan
    x0, x1, x = math.log(CURVE_N[i - 1]), math.log(CURVE_N[i]), math.log(n)
    t = (x - x0) / (x1 - x0)
    if lo > 0 and hi > 0:
        return math.exp(math.log(lo) + t * (math.log(hi) - math.log(lo)))
    return float(lo + t * (hi - lo))


def _terms(items: Iterable[Sequence[Any]], fns: Iterator[_Lookup]) -> tuple[Term, ...]:
    return tuple(Term(float(c), str(name), next(fns), unit) for c, name, unit in items)


def _lookups(
    record: Mapping[str, Any], options: Sequence[LayerOption], count: int
) -> Iterator[_Lookup]:
    """The ``count`` laws of a record's points and curves, as functions of sizes, in order."""
    names = ["b", "n", "d", *(o.name for o in options)]
    points = {}
    for point in record["points"]:
        key = _key(point["sizes"], names)
        if key is not None:
            points[key] = list(point["values"])
    curves = {}
    for curve in record["curves"]:
        key = _key({**curve["sizes"], "n": 0}, names)
        if key is not None:
            curves[key[:1] + key[2:]] = [list(v) for v in curve["values"]]
    return iter([_Lookup(names, points, curves, i) for i in range(count)])


def _decode(record: Mapping[str, Any], options: Sequence[LayerOption]) -> DecodeTheory:
    fns = _lookups(record, options, _decode_count(record))
    terms = _terms(record["terms"], fns)
    elementwise = None if record["elementwise"] is None else _terms(record["elementwise"], fns)
    state = _terms(record["state"], fns)
    return DecodeTheory(
        str(record["compute"]),
        str(record["memory"]),
        terms,
        state,
        str(record["form"]),
        order=next(fns),
        sequential=str(record["sequential"]),
        elementwise=elementwise,
        sequential_law=next(fns),
    )


def _theory(record: Mapping[str, Any], options: Sequence[LayerOption]) -> LayerTheory:
    fns = _lookups(record, options, _law_count(record))
    terms = _terms(record["terms"], fns)
    elementwise = None if record["elementwise"] is None else _terms(record["elementwise"], fns)
    order, sequential_law, path_law = next(fns), next(fns), next(fns)
    traffic = record.get("traffic")
    return LayerTheory(
        str(record["complexity"]),
        terms,
        str(record["sequential"]),
        str(record["path"]),
        order=order,
        sequential_law=sequential_law,
        path_law=path_law,
        elementwise=elementwise,
        traffic=None if traffic is None else _terms(traffic, fns),
        decode=None if record.get("decode") is None else _decode(record["decode"], options),
    )


def _entry(name: str, record: Mapping[str, Any]) -> LayerEntry:
    options = tuple(LayerOption(**o) for o in record["options"])
    theory = None if record["theory"] is None else _theory(record["theory"], options)
    return LayerEntry(
        name,
        _no_code,
        Family(**record["family"]),
        str(record["description"]),
        options,
        theory,
        bool(record["needs_length"]),
        LayerSource(**record["source"]),
    )


@dataclass(frozen=True)
class Catalog(Mapping[str, LayerEntry]):
    """The layers an analysis reads, by name, with no code of theirs: built-in layers from
    attnbench, plugin layers from a run's record. ``notes``: what could not be read."""

    entries: Mapping[str, LayerEntry]
    notes: tuple[str, ...] = field(default=())

    def __getitem__(self, name: str) -> LayerEntry:
        return self.entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def theory(self, name: str) -> LayerTheory | None:
        found = self.entries.get(name)
        return found.theory if found is not None else None

    def family(self, name: str) -> Family:
        found = self.entries.get(name)
        return found.family if found is not None else CUSTOM

    def options(self) -> dict[str, LayerOption]:
        """Every option some layer declares, by name (the first declaration), built-in first."""
        found: dict[str, LayerOption] = {}
        for entry in self.entries.values():
            for option in entry.options:
                found.setdefault(option.name, option)
        return found


def _generation(theory: LayerTheory | None) -> LayerTheory | None:
    return None if theory is None else theory.generation()


def live() -> Catalog:
    """The layers registered in this process (code loaded by the caller): the Python API's
    view of layers registered from Python."""
    return Catalog(dict(REGISTRY))


def catalog(layers: Iterable[str], recorded: Mapping[str, Any], mode: str = "forward") -> Catalog:
    """The layers of a run: every built-in layer (their cost models compete on every run), and
    the run's plugin layers from ``recorded`` (theory.json). A decode run reads each layer's
    theory of one generation step (``LayerTheory.generation``; a plugin's as recorded)."""
    if mode == "decode":
        found = catalog(layers, recorded)
        steps = {n: replace(e, theory=_generation(e.theory)) for n, e in found.items()}
        return Catalog(steps, found.notes)
    entries: dict[str, LayerEntry] = {name: REGISTRY[name] for name in BUILTIN}
    notes = []
    records = recorded.get("layers", {}) if isinstance(recorded, Mapping) else {}
    for name in dict.fromkeys(layers):
        if name in entries:
            continue
        found = records.get(name)
        if found is None:
            notes.append(
                f"layer {name} is a plugin this run has no record of (theory.json, written by "
                "attnbench sweep since 0.1.0); its theory is left out"
            )
            continue
        problem = _layer_problem(found)
        if problem:
            notes.append(f"layer {name}: its record in theory.json is unreadable ({problem})")
            continue
        entries[name] = _entry(name, found)
    return Catalog(entries, tuple(notes))


__all__ = ["CURVE_N", "Catalog", "catalog", "live", "merge", "record"]
