"""The types a layer's theory is written in: FLOP terms, and the chapter's orders and laws.

Each layer declares its own theory beside its code (``LayerEntry.theory``); the FLOP check, the
comparison table, the fits and the charts all read it from there.

Conventions: a multiply-add is 2 FLOPs; only matrix products are counted (softmax, biases,
activations, the positional-encoding add and other elementwise work are not), which is also what
``torch.utils.flop_counter`` counts. That other work has its own formula, ``elementwise``: the
elements produced by pointwise ops and combined by reductions (``measure.counts.elementwise``).
Sizes are read from a mapping: ``b`` batch, ``n`` sequence length, ``d`` width, and each of the
layer's options by name (``k``, ``heads``, ``window``, ``causal``...).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

Sizes = Mapping[str, float]  # "b", "n", "d", and the layer's options by name
SizeFn = Callable[[Sizes], float]  # sizes -> a size such as b·n·d², or a step count


@dataclass(frozen=True)
class Term:
    """One term of a cost formula: ``count`` FLOPs per unit of ``size``, e.g. 4 · b·n²·d, or
    with ``unit="element"`` that many elements of elementwise work per unit (``elements``).

    Terms with the same name are the same column in every cost model.
    """

    count: float  # FLOPs (or elements) per unit of size
    name: str  # the size, as written in the formula: "b·n²·d"
    size: SizeFn
    unit: Literal["FLOP", "element", "value", "byte"] = "FLOP"


def elements(count: float, name: str, size: SizeFn) -> Term:
    """A term of elementwise work: ``count`` elements per unit of ``size`` (3 · b·h·n²)."""
    return Term(count, name, size, unit="element")


def values(count: float, name: str, size: SizeFn) -> Term:
    """A term of traffic: ``count`` values of the run's dtype read or written per unit of
    ``size`` (each its element size in bytes: 4 for float32)."""
    return Term(count, name, size, unit="value")


def raw_bytes(count: float, name: str, size: SizeFn) -> Term:
    """A term of traffic counted in bytes whatever the dtype (a bool mask: 1 byte a value)."""
    return Term(count, name, size, unit="byte")


def traffic_bytes(terms: tuple[Term, ...], sizes: Sizes, itemsize: int) -> float:
    """Bytes of traffic terms at these sizes: values times ``itemsize``, bytes as they are."""
    return float(
        sum(t.count * t.size(sizes) * (itemsize if t.unit == "value" else 1) for t in terms)
    )


def formula(terms: tuple[Term, ...]) -> str:
    """Terms, human-readable: "8·b·n·d² + 4·b·n²·d" ("0" for none)."""
    return " + ".join(f"{t.count:g}·{t.name}" for t in terms) or "0"


def total(terms: tuple[Term, ...], sizes: Sizes) -> float:
    """The sum of the terms at these sizes."""
    return float(sum(t.count * t.size(sizes) for t in terms))


def _zero(sizes: Sizes) -> float:
    return 0.0


def _one(sizes: Sizes) -> float:
    return 1.0


@dataclass(frozen=True)
class DecodeTheory:
    """Theoretical cost of one generation step: the token at context n (n tokens before it).

    ``terms`` are the step's FLOPs, ``elementwise`` its elementwise work (None: not said),
    ``state`` the values the state holds at context n (a key/value cache's 2·b·(n+1)·d, an
    RNN's b·d); ``compute`` and ``memory`` are the orders the generation table states, and
    ``order`` the step's leading size; ``form`` says which causal form of the layer decodes
    (a centred convolution has none: its decode form sees only the tokens before).
    """

    compute: str  # per-token compute, e.g. "O(n d)"
    memory: str  # the state's size, e.g. "O(n d)"
    terms: tuple[Term, ...]
    state: tuple[Term, ...]
    form: str
    order: SizeFn = _zero  # not stated: its fits read no chapter order
    sequential: str = "O(1)"  # sequential operations of one step
    elementwise: tuple[Term, ...] | None = None
    sequential_law: SizeFn = _one  # the step's sequential steps, up to a constant

    def flops(self, sizes: Sizes) -> float:
        """FLOPs of one step at context n."""
        return total(self.terms, sizes)

    def state_values(self, sizes: Sizes) -> float:
        """Values the state holds at context n."""
        return total(self.state, sizes)

    def elements(self, sizes: Sizes) -> float | None:
        """Elementwise work of one step (None without a formula)."""
        return None if self.elementwise is None else total(self.elementwise, sizes)


@dataclass(frozen=True)
class LayerTheory:
    """Theoretical cost of one layer (forward pass), as the chapter's table states it.

    The FLOP formula is the sum of its terms; the cost-model fits use the same terms as their
    columns, so a formula is written once for both. ``order`` is the chapter's order as a size
    (leading term, constant 1: n²·d for attention); ``sequential_law`` and ``path_law`` give
    the sequential steps and path length up to a constant. ``elementwise`` is the elementwise
    work of one forward call (None: the theory does not say; () for none at all, a convolution).
    ``traffic`` is what one forward call reads and writes, op by op (``measure.counts.traffic``),
    in values of the run's dtype and raw bytes (None: the theory does not say). ``recompute``
    is what a training call's backward computes again (``train_flops``).
    """

    complexity: str  # computational complexity, e.g. "O(k n d^2)"
    terms: tuple[Term, ...]
    sequential: str = "O(1)"  # sequential operations
    path: str = "O(1)"  # maximum path length
    order: SizeFn = _zero
    sequential_law: SizeFn = _one
    path_law: SizeFn = _one
    elementwise: tuple[Term, ...] | None = None
    traffic: tuple[Term, ...] | None = None  # bytes moved (``values`` and ``raw_bytes`` terms)
    # FLOP terms a training call's backward computes again rather than keep from the forward
    # (a fused attention kernel recomputes its scores): added to the three forward passes.
    recompute: tuple[Term, ...] = ()
    # One token at a time (``--mode decode``); None: the layer's theory does not say.
    decode: DecodeTheory | None = None

    def bytes(self, sizes: Sizes, itemsize: int) -> float | None:
        """Bytes one forward call reads and writes if nothing stays in cache (None without a
        formula), for values of ``itemsize`` bytes."""
        if self.traffic is None:
            return None
        return traffic_bytes(self.traffic, sizes, itemsize)

    def flops(self, sizes: Sizes) -> float:
        """Forward FLOPs of one call."""
        return total(self.terms, sizes)

    def train_flops(self, sizes: Sizes) -> float:
        """FLOPs of one training call (forward and backward): three forward passes, and what
        the backward recomputes."""
        return TRAIN_FLOP_FACTOR * self.flops(sizes) + total(self.recompute, sizes)

    def elements(self, sizes: Sizes) -> float | None:
        """Elementwise work of one forward call, in elements (None without a formula)."""
        if self.elementwise is None:
            return None
        return total(self.elementwise, sizes)

    def generation(self) -> LayerTheory | None:
        """The theory a decode run is read with: one step's FLOPs, elementwise work and order
        as the terms, the per-token orders as the table's (None: the theory says nothing of
        generation). Every fit, crossover and chart reads it as it reads a forward theory."""
        step = self.decode
        if step is None:
            return None
        return LayerTheory(
            step.compute,
            step.terms,
            sequential=step.sequential,
            path="–",
            order=step.order,
            sequential_law=step.sequential_law,
            elementwise=step.elementwise,
            decode=step,
        )

    @property
    def formula(self) -> str:
        """The FLOP formula, human-readable: "8·b·n·d² + 4·b·n²·d"."""
        return formula(self.terms)

    @property
    def traffic_formula(self) -> str | None:
        """The bytes formula: "(16·b·n·d + 4·d²) values + 4·causal·n² bytes"."""
        if self.traffic is None:
            return None
        words = [t for t in self.traffic if t.unit == "value"]
        raw = [t for t in self.traffic if t.unit != "value"]
        parts = [f"({formula(tuple(words))}) values"] if words else []
        parts += [f"{formula(tuple(raw))} bytes"] if raw else []
        return " + ".join(parts) or "0"

    @property
    def elementwise_formula(self) -> str | None:
        return None if self.elementwise is None else formula(self.elementwise)

    @property
    def model_terms(self) -> tuple[Term, ...]:
        """The columns of this layer's cost model: its FLOP terms, then its elementwise terms
        whose size is not already a column (a size is one column, whatever its unit)."""
        seen = {t.name for t in self.terms}
        extra = [t for t in self.elementwise or () if t.name not in seen]
        unique = {t.name: t for t in extra}  # one column per size, even if written twice
        return (*self.terms, *unique.values())


# A backward pass computes two products (input gradient and weight gradient) for each forward
# product, so forward + backward costs three forward passes.
TRAIN_FLOP_FACTOR = 3


def sizes(batch: Any, n: Any, d: Any, options: Mapping[str, Any]) -> dict[str, Any]:
    """The mapping a theory reads: batch, length and width, and the layer's options."""
    return {"b": batch, "n": n, "d": d, **options}


def theory_problem(theory: LayerTheory, at: Sizes) -> str | None:
    """The first of a theory's formulas that fails at the sizes ``at`` (or gives no finite
    number), in words, else None: a plugin's term reading ``s["h"]`` where the sizes say
    ``heads`` stopped a sweep with a traceback from its first estimate."""
    if (shape := _shape_problem(theory)) is not None:
        return shape
    step = theory.decode
    formulas: list[tuple[str, str, SizeFn]] = [
        *(("term", t.name, t.size) for t in theory.terms),
        *(("elementwise term", t.name, t.size) for t in theory.elementwise or ()),
        *(("traffic term", t.name, t.size) for t in theory.traffic or ()),
        *(("recompute term", t.name, t.size) for t in theory.recompute),
        ("law", "order", theory.order),
        ("law", "sequential_law", theory.sequential_law),
        ("law", "path_law", theory.path_law),
    ]
    if step is not None:
        formulas += [("decode term", t.name, t.size) for t in (*step.terms, *step.state)]
        formulas += [("decode term", t.name, t.size) for t in step.elementwise or ()]
        formulas += [("decode law", "order", step.order)]
        formulas += [("decode law", "sequential_law", step.sequential_law)]
    for kind, name, size in formulas:
        try:
            value = float(size(at))
        except Exception as exc:  # a plugin's own code: any error is its formula's
            found = f"{type(exc).__name__}: {exc}"
            return f"its theory's {kind} {name!r} fails: {found} (the sizes read: {', '.join(at)})"
        if value != value or value in (float("inf"), float("-inf")):
            return f"its theory's {kind} {name!r} gives {value} at {dict(at)}"
    return None


def _shape_problem(theory: object) -> str | None:
    """What a theory's declaration gets wrong before any formula runs: an order that is not
    an "O(...)" string (a plugin's None was written into theory.json, and every command then
    refused the whole run, built-in layers' rows included), or a term that is not a ``Term``."""
    if not isinstance(theory, LayerTheory):
        return f"its theory is a {type(theory).__name__}, not a LayerTheory"
    step: object = theory.decode  # a plugin's, whatever it holds
    orders = [("complexity", theory.complexity), ("sequential", theory.sequential),
              ("path", theory.path)]  # fmt: skip
    if isinstance(step, DecodeTheory):  # the generation table's orders
        orders += [("decode compute", step.compute), ("decode memory", step.memory),
                   ("decode sequential", step.sequential)]  # fmt: skip
    elif step is not None:
        return f"its theory's decode is a {type(step).__name__}, not a DecodeTheory"
    for label, order in orders:
        if not _big_o(order):
            return f'its theory\'s {label} {order!r} is not an order such as "O(n d^2)"'
    groups = (theory.terms, theory.elementwise or (), theory.traffic or (), theory.recompute)
    if not all(isinstance(group, tuple) for group in groups):
        return "its theory's terms are not tuples of Term"
    if not all(isinstance(t, Term) and callable(t.size) for group in groups for t in group):
        return "its theory's terms are not all Term(count, name, size)"
    return None


def _big_o(text: object) -> bool:
    """``text`` reads "O(...)" with its brackets balanced: what the table prints as the
    chapter's order."""
    if not isinstance(text, str) or not (text.startswith("O(") and text.endswith(")")):
        return False
    depth = 0
    for char in text[1:]:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0:
            return False
    return depth == 0 and text[2:-1].strip() != ""


def order_problem(theory: LayerTheory, at: Sizes) -> str | None:
    """Where an order written in words grows in n otherwise than the law judged against it: the
    table prints the words ("O(n^2 d)") and the verdicts read the law (``order``, ``path_law``,
    ``sequential_law``), so a plugin's "O(n^2 d)" beside an order of n·d² was shown quadratic
    and judged linear. Compared over n = 2^16..2^17 at ``at``'s other sizes, within a quarter
    (a log n factor adds 0.09 there); an order whose words do not read, or a law not given
    (an order of 0), is not compared."""
    pairs = (
        ("complexity", theory.complexity, "order", theory.order),
        ("sequential", theory.sequential, "sequential_law", theory.sequential_law),
        ("path", theory.path, "path_law", theory.path_law),
    )
    for label, words, name, law in pairs:
        written, grown = n_power(words), _slope(law, at)
        if written is not None and grown is not None and abs(written - grown) > 0.25:
            return (
                f"its theory's {label} {words!r} grows as n^{written:g}, its {name} as "
                f"n^{grown:.2f}: the table shows the one and the verdicts read the other; "
                f"make them agree (a {name} not given is a constant)"
            )
    return None


# n, n^2, n^1.5, /n: a power of n in a product; log n and log_k n are left out before
_N_POWER = re.compile(r"(/\s*)?(?<![A-Za-z_])n(?:\^(\d+(?:\.\d+)?))?(?![A-Za-z_0-9^²³])")
_LOG = re.compile(r"(?:log|lg|ln)(?:_?\{?[A-Za-z0-9]+\}?)?(?:\^\d+|[²³])?\s*\(?\s*n\s*\)?")


def n_power(words: str) -> float | None:
    """The power of n an order in words grows as ("O(k n d^2 log_k n)": 1; "O(n^2 d + n d^2)":
    2), None where its words do not read so (a superscript, a bracket inside)."""
    if not _big_o(words):
        return None
    inner = _LOG.sub("", words[2:-1])
    if any(char in inner for char in "()√-−"):  # a root, a difference: not read here
        return None
    powers = []
    for term in inner.split("+"):
        found = _N_POWER.findall(term)
        rest = _N_POWER.sub(" ", term)
        if "n" in rest.replace("N", ""):
            return None  # an n not read as a power ("n²", "kn")
        powers.append(sum(((-1.0 if slash else 1.0) * float(p or 1) for slash, p in found), 0.0))
    return max(powers)


def _slope(law: SizeFn, at: Sizes) -> float | None:
    try:
        low, high = float(law({**at, "n": 2.0**16})), float(law({**at, "n": 2.0**17}))
    except Exception:  # a formula's own failure is theory_problem's to say
        return None
    if not (low > 0 and high > 0 and math.isfinite(low) and math.isfinite(high)):
        return None
    return math.log2(high / low)
