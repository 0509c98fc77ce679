"""What to measure: the frozen ``Case`` and ``Grid`` specs every later floor reads.

A ``Grid`` is made only by ``attnbench.options.build_grid``, from the option table the command
line, the config file and run.json share; here is what it holds and the cases it spans.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from attnbench.devices import DEFAULT_ALLOCATOR, DTYPES
from attnbench.estimators import IMPRECISE_REL_CI
from attnbench.layers.registry import BUILTIN, entry
from attnbench.lengths import AutoN
from attnbench.schema import OPTION_COLUMNS, Timer
from attnbench.theory import sizes

MODES = ("forward", "train", "decode")
# What each mode times: --help and the tables say it in these words.
MODE_HELP = {
    "forward": "one forward call over n tokens",
    "train": "forward + backward over n tokens",
    "decode": "one generation step: the token after n, its state holding the n before",
}
# What a train run's table says of the columns that stay the forward's (``step.forward``).
TRAIN_NOTE = (
    "train mode: time, FLOPs, bytes moved and memory are of forward + backward (FLOPs about "
    "three forward passes, and what a fused kernel's backward computes again: attention-sdpa's "
    "scores, so its FLOPs read over 3x its forward's); elementwise work, sequential ops and "
    "path length are the forward call's, as the chapter's table and each layer's elementwise "
    "formula state them (the backward is not traced for them), so the work a time is read "
    "against is the forward's elementwise work beside the whole step's FLOPs"
)
# Rounds a case is timed in at the least (``--processes``), and how many times that a sweep may
# reach while the case's interval is still wider than its target (``run.queue``).
DEFAULT_PROCESSES = 3
MORE_PROCESSES = 2
# The interval a sweep adds rounds to a case to reach (``--precision``): ±2% on a fixed grid;
# --n auto, which is after the regime, adds them only to a case whose time would read ! (its
# interval past ``IMPRECISE_REL_CI``). In two default sweeps here (2026-11-30) no case reached ±2%:
# each took its most rounds (or what --time-budget left); at 5%, 51-64 of 71-76 stop at their least.
DEFAULT_PRECISION = 0.02
AUTO_PRECISION = IMPRECISE_REL_CI
# --energy: seconds of calls the energy pass runs, between two steps of the GPU's counter
# (``measure.timing.energy``).
ENERGY_S = 0.5
# The share of the memory available as a case's process starts that it may take, unless
# --max-case-memory says otherwise (``run.executors.fresh`` watches it).
MEMORY_SHARE = 0.85
METRICS = ("time", "instructions")  # what a sweep measures of each call


def spread_group(case_id: str) -> str:
    """The cases whose rounds share a typical spread (``priors.Priors``): a case's id without
    its sizes (``Case.case_id``'s n and d), a layer with its options, dtype, device and mode."""
    parts = case_id.split("/")
    return "/".join(parts[:1] + parts[3:])


@dataclass(frozen=True)
class Case:
    """One measurement: a layer at one (n, d) with everything that changes its cost.

    ``options`` are the layer's own options (name, value), in the order its entry declares
    them, so a case names only what matters to it.
    """

    layer: str
    n: int
    d: int
    batch: int
    dtype: str
    device: str
    mode: str
    options: tuple[tuple[str, int], ...] = ()
    compiled: str = ""  # torch.compile's arguments (``compiling.CompileSpec.text``); "": eager

    @property
    def option_values(self) -> dict[str, int]:
        return dict(self.options)

    def sizes(self) -> dict[str, Any]:
        """What the layer's theory reads: b, n, d and its options (defaults for any the case
        leaves out, as a case built by hand may)."""
        return sizes(self.batch, self.n, self.d, entry(self.layer).resolve(self.option_values))

    def analytic_flops(self) -> float | None:
        """FLOPs of one call from the layer's theory; None for a layer without one."""
        theory = entry(self.layer).theory
        if theory is None:
            return None
        found = self.sizes()
        if self.mode == "decode":
            return None if theory.decode is None else theory.decode.flops(found)
        return theory.train_flops(found) if self.mode == "train" else theory.flops(found)

    def analytic_elements(self) -> float | None:
        """Elementwise work of one forward call from the layer's theory (any mode: the count
        traces the forward pass); None without a formula."""
        theory = entry(self.layer).theory
        if theory is not None and self.mode == "decode":
            return None if theory.decode is None else theory.decode.elements(self.sizes())
        return None if theory is None else theory.elements(self.sizes())

    def analytic_bytes(self) -> float | None:
        """Bytes one forward call moves, from the layer's theory (forward mode only: the
        backward pass has no formula); None without one."""
        theory = entry(self.layer).theory
        if theory is None or self.mode != "forward":
            return None
        return theory.bytes(self.sizes(), DTYPES[self.dtype].itemsize)

    def analytic_state(self) -> float | None:
        """Bytes a decode step's state holds at context n, from the layer's theory (decode
        mode only); None without one."""
        theory = entry(self.layer).theory
        if theory is None or theory.decode is None or self.mode != "decode":
            return None
        return theory.decode.state_values(self.sizes()) * DTYPES[self.dtype].itemsize

    @property
    def tokens(self) -> int:
        """Tokens the layer sees: n, or in decode mode the n before and the one it steps."""
        return self.n + 1 if self.mode == "decode" else self.n

    def layer_options(self) -> dict[str, int]:
        """The options ``build_layer`` takes for this case (the length too, for layers built
        for one: in decode mode, for the n tokens before and the one it steps)."""
        return {"n": self.tokens, **self.option_values}

    def _tags(self) -> list[str]:
        return entry(self.layer).tags(self.option_values)

    @functools.cached_property
    def case_id(self) -> str:
        """The case's key in every table (computed once: a sweep's bookkeeping reads it for
        every case at every event, 0.4 s of a 231-case warm sweep)."""
        parts = [self.layer, f"n={self.n}", f"d={self.d}", *self._tags()]
        parts += [f"b={self.batch}", self.dtype, self.device, self.mode]
        parts += [f"compiled={self.compiled}"] if self.compiled else []
        return "/".join(parts)

    def columns(self) -> dict[str, Any]:
        """The case's own columns of the results table: its id, its fields and its options
        (the options with a column of their own are empty where the layer has none)."""
        fixed = {key: value for key, value in asdict(self).items() if key != "options"}
        unset = dict.fromkeys(OPTION_COLUMNS)
        return {"case_id": self.case_id, **fixed, **unset, **self.option_values}

    def label(self) -> str:
        """Short human label for progress lines."""
        return " ".join([self.layer, f"n={self.n}", f"d={self.d}", *self._tags()])

    def to_dict(self) -> dict[str, Any]:
        """The case as plain JSON data (for another process)."""
        return {**asdict(self), "options": [list(pair) for pair in self.options]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Case:
        return cls(**{**data, "options": tuple((name, value) for name, value in data["options"])})


@dataclass(frozen=True)
class Grid:
    """A sweep: the cross product of layers, n and d at fixed options, batch, dtype, device.

    The defaults here are the defaults of the command line and the config file
    (``options.OPTIONS``);
    ``options`` holds the layer options given (a layer takes its own default for the rest).
    """

    layers: tuple[str, ...] = BUILTIN
    ns: tuple[int, ...] = (64, 128, 256, 512, 1024)
    ds: tuple[int, ...] = (64, 128)
    options: tuple[tuple[str, int], ...] = ()
    batch: int = 1
    dtype: str = "float32"
    device: str = "auto"
    mode: str = "forward"
    threads: int | None = None  # CPU threads; None keeps torch's default (and records it)
    time_budget_s: float = 0.3  # seconds of timed calls a case's rounds may take together
    # Seconds a sweep may wait, in all, for a disturbed machine to read quiet before a round
    # (``measure.timing.reference.settle``); 0: never wait.
    wait_quiet_s: float = 60.0
    seed: int = 0
    max_case_s: float | None = None  # a first call slower than this is a timeout; None: no limit
    # A case's process that grows past this many bytes is ended and the case recorded oom (a
    # fresh process a round: the fork executor); None: a share of the memory free when it starts.
    max_case_memory: int | None = None
    # Timing rounds: each case is timed in at least this many rounds, spread over the sweep,
    # each (under the fork executor) a fresh process; its time and interval are over them.
    processes: int = DEFAULT_PROCESSES
    # At most this many rounds a case (None: MORE_PROCESSES times ``processes``).
    max_processes: int | None = None
    # Rounds are added to a case while its 95% interval reaches further than this share of its
    # time (``run.rounds.Replication``): DEFAULT_PRECISION, or AUTO_PRECISION under --n auto.
    precision: float = DEFAULT_PRECISION
    metric: str = "time"  # or "instructions": counted with Callgrind instead of timed
    timer: str = Timer.BLOCKS.value  # what a sample times (``schema.Timer``)
    allocator: str = DEFAULT_ALLOCATOR  # its state in every measuring process: pinned or system
    # --n auto: ``ns`` is the ladder of lengths the sweep may reach, and each layer and width
    # stops where its rate settles or the next case would not fit (``run.auto``)
    n_auto: AutoN | None = None
    auto_budget_s: float = 300.0  # --n auto: seconds of cases the whole sweep may spend
    compile: str = ""  # torch.compile's arguments for every case (``compiling``); "": eager
    energy: bool = False  # read joules per call from the GPU's energy counter (a pass a case)

    @property
    def most_rounds(self) -> int:
        """The most timing rounds a case gets: ``max_processes``, else ``MORE_PROCESSES``
        times ``processes`` (one where that is one: a single round is never added to)."""
        if self.max_processes is not None:
            return max(self.processes, self.max_processes)
        return self.processes * MORE_PROCESSES if self.processes > 1 else 1

    def cases(self) -> list[Case]:
        """Cases ordered layer, d, then n ascending (so a larger n always comes later)."""
        given = dict(self.options)
        out = []
        for layer in self.layers:
            options = tuple(entry(layer).resolve(given).items())
            for d in self.ds:
                for n in self.ns:
                    out.append(
                        Case(
                            layer,
                            n,
                            d,
                            self.batch,
                            self.dtype,
                            self.device,
                            self.mode,
                            options,
                            self.compile,
                        )
                    )
        return out

    def option_names(self) -> list[str]:
        """Every option the grid's layers take, in the order they declare them."""
        names = (option.name for layer in self.layers for option in entry(layer).options)
        return list(dict.fromkeys(names))

    def sources(self) -> dict[str, dict[str, str]]:
        """Where each of the grid's layers came from (run.json's ``layers``)."""
        return {layer: entry(layer).source.to_dict() for layer in self.layers}

    def to_dict(self) -> dict[str, Any]:
        """The grid by field, as run.json records it, the layer options given among the fields
        (``grid_from_config`` reads it back); an auto grid's lengths as ``auto``."""
        skip = ("options", "n_auto")
        out = {key: plain(getattr(self, key)) for key in _field_names() if key not in skip}
        if self.n_auto is not None:
            out["ns"] = self.n_auto.text()
        at = list(out).index("ds") + 1
        items = list(out.items())
        return dict([*items[:at], *self.options, *items[at:]])


def _field_names() -> list[str]:
    return [f.name for f in fields(Grid)]


def plain(value: Any) -> Any:
    """A field as run.json and the options write it: a tuple as a list."""
    return list(value) if isinstance(value, tuple) else value
