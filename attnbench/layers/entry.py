"""One entry per layer: everything attnbench knows about a layer, declared beside its code.

A ``LayerEntry`` holds the builder, the layer's options (defaults, validation, how case ids
write them), its family (the row of the chapter's table, and how crossovers treat it), its
theory (optional) and where it came from. Fits, crossovers, charts, the table and the command
line read the entry; nothing chooses a layer by its name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from attnbench.errors import AttnbenchError
from attnbench.theory import LayerTheory


@dataclass(frozen=True)
class LayerOption:
    """An integer option of a layer, declared once and shared by the layers that take it."""

    name: str  # its key: ``--name`` on the command line, a column of the results
    default: int
    tag: str  # how case ids and labels write it: "k" (k=3), "h" (h=4), "r" (r=16)
    help: str
    minimum: int = 1
    divides_d: bool = False  # d must be a multiple of it (attention heads)
    at_most_n: bool = False  # it must not exceed the smallest n (a kernel, a window)
    reach: bool = False  # it sets how far one application reaches (path probes start above it)
    flag: bool = False  # on (1) or off (0): a switch on the command line, in case ids when on

    def check(
        self,
        value: Any,
        layer: str,
        ns: Iterable[int],
        ds: Iterable[int],
        given: str = "",
    ) -> int:
        """The value, or a one-line error naming the layer that refuses it. ``given``: how
        the user set it ("--option width" for a plugin's, which has no flag of its own; a new
        user's --option expansion=0 read "--expansion must be >= 1"), by default its flag."""
        said = given or f"--{self.name}"
        if self.flag:
            if value not in (0, 1):  # True and False are 1 and 0
                raise AttnbenchError(f"{said}: expected on or off (1 or 0), got {value!r}")
            return int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise AttnbenchError(f"{said}: expected an integer, got {value!r}")
        if value < self.minimum:
            if self.minimum == 1:
                raise AttnbenchError(f"{said} must be >= 1, got {value}")
            raise AttnbenchError(f"{said} {value}: {layer} needs {self.name} >= {self.minimum}")
        bad = [d for d in ds if self.divides_d and d % value]
        if bad:
            raise AttnbenchError(
                f"d={bad[0]} is not divisible by {self.name}={value}; "
                f"{layer} needs d % {self.name} == 0"
            )
        shortest = min(ns, default=value)
        if self.at_most_n and value > shortest:
            raise AttnbenchError(
                f"{said} {value} is larger than n={shortest}; {layer} needs "
                f"{self.name} <= the smallest n"
            )
        return value


@dataclass(frozen=True)
class Family:
    """A row of the chapter's table, and what a crossover makes of its layers."""

    row: str  # the table's row, and the name of its cost model: "recurrent"
    rank: int  # where its layers stand among the built-in ones (the default order)
    pairwise: bool = False  # every position meets every other: the quadratic side of a crossover
    rival: bool = False  # the chapter sets attention against it: crossovers are reported
    chapter: bool = False  # a row of the chapter's own table (convolutional, recurrent, attention)
    kin: str = ""  # the charts' panel it shares with kindred families (empty: its row)

    @property
    def panel(self) -> str:
        """The title of the chart panel its layers are drawn in, beside their kin."""
        return self.kin or self.row


CUSTOM = Family("custom", rank=1000, kin="your layers")


@dataclass(frozen=True)
class LayerSource:
    """Where a layer's code came from, so a reader can tell which implementation was measured.

    ``kind`` is builtin, module, file, entry point or python (registered from Python); ``spec``
    is what loads it again (a module path, ``path/to/file.py:factory``, ``pkg.mod:factory``).
    """

    kind: str
    spec: str
    digest: str = ""  # sha256 of the defining source file, first 12 hex digits
    distribution: str = ""  # the installed package and its version: "mypkg 1.2.0"

    def describe(self) -> str:
        """One line for the results' ``layer_source`` column: its digest always (two builds of
        one package version, an edit under ``pip install -e``, differ there alone), its
        distribution where it has one."""
        found = [f"sha256 {self.digest}"] if self.digest else []
        found += [self.distribution] if self.distribution else []
        return f"{self.spec} ({', '.join(found)})" if found else self.spec

    def to_dict(self) -> dict[str, str]:
        return {
            "kind": self.kind,
            "spec": self.spec,
            "digest": self.digest,
            "distribution": self.distribution,
        }


@dataclass(frozen=True)
class LayerEntry:
    """A layer: ``build(d, **options)`` returns a module mapping (batch, n, d) to (batch, n, d).

    ``options`` are the layer's own, in the order case ids write them; a layer built for a
    length (``needs_length``) also gets ``n``. Without ``theory`` the layer is measured all the
    same, and its analytic FLOPs are empty.
    """

    name: str
    build: Callable[..., nn.Module]
    family: Family = CUSTOM
    description: str = ""
    options: tuple[LayerOption, ...] = ()
    theory: LayerTheory | None = None
    needs_length: bool = False
    source: LayerSource = field(default_factory=lambda: LayerSource("python", ""))

    def option(self, name: str) -> LayerOption | None:
        return next((o for o in self.options if o.name == name), None)

    def resolve(self, given: Mapping[str, Any]) -> dict[str, int]:
        """This layer's option values: the given ones it takes, the defaults for the rest."""
        return {o.name: given.get(o.name, o.default) for o in self.options}

    def tags(self, options: Mapping[str, int]) -> list[str]:
        """How case ids and labels write these option values: "h=4", and "causal" when on."""
        out = []
        for option in self.options:
            value = options.get(option.name, option.default)
            if option.flag:
                out += [option.tag] if value else []
            else:
                out.append(f"{option.tag}={value}")
        return out

    def reach(self, options: Mapping[str, int]) -> int:
        """How far one application reaches (its kernel or window; 0 for none)."""
        return max((options[o.name] for o in self.options if o.reach), default=0)
