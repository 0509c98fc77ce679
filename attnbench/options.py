"""The sweep's option table, and how typed or written values become a valid ``Grid``.

Everything the user types passes through here and comes out either as a valid ``Grid`` or as an
``AttnbenchError`` whose one-line message names the problem and what is accepted. ``OPTIONS`` is
the one table of sweep options: the command line, the config file, ``Grid`` and the
configuration a run records (run.json) are all read from it.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from attnbench import values as read
from attnbench.compiling import MODES as COMPILE_MODES
from attnbench.compiling import CompileSpec, compile_text
from attnbench.devices import (
    DEVICE_CHOICES,
    DTYPES,
    DeviceResolver,
    check_allocator,
    device_kind,
    local_device,
)
from attnbench.errors import AttnbenchError
from attnbench.layers import checks, plugins
from attnbench.layers.entry import LayerOption
from attnbench.layers.registry import BUILTIN, entry, known_options
from attnbench.lengths import AutoN, parse_int_list, parse_lengths
from attnbench.schema import Timer
from attnbench.spec import (
    AUTO_PRECISION,
    DEFAULT_PRECISION,
    DEFAULT_PROCESSES,
    ENERGY_S,
    MEMORY_SHARE,
    METRICS,
    MODE_HELP,
    MODES,
    MORE_PROCESSES,
    Grid,
    plain,
)
from attnbench.theory import sizes, theory_problem

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


# ----------------------------------------------------------------------------- parsing


def parse_layers(text: str | Iterable[str]) -> tuple[str, ...]:
    """Layer names, built-in or plugin (``module:factory``, ``path/to/file.py:factory``, an
    installed plugin's name); plugins are loaded and registered here."""
    if isinstance(text, str):
        items = [t.strip() for t in text.split(",")]
    elif isinstance(text, list | tuple) and all(isinstance(t, str) for t in text):
        items = [t.strip() for t in text]
    else:
        raise AttnbenchError(f"--layers: expected layer names, got {text!r}")
    if not items or any(not t for t in items):
        raise AttnbenchError(f"--layers: cannot read {text!r}; accepted: {', '.join(BUILTIN)}")
    return tuple(dict.fromkeys(plugins.resolve(item).name for item in items))


def parse_layer_options(text: Any) -> dict[str, int]:
    """``--option rank=8,depth=2`` (or a TOML table): options of plugin layers, by name."""
    if isinstance(text, Mapping):
        pairs = list(text.items())
    elif isinstance(text, str):
        try:
            pairs = [(k.strip(), int(v)) for k, v in (t.split("=", 1) for t in text.split(","))]
        except ValueError:
            raise AttnbenchError(
                f"--option {text!r}: write NAME=VALUE, comma-separated, with integer values"
            ) from None
    else:
        raise AttnbenchError(f"--option: expected NAME=VALUE pairs, got {text!r}")
    known = known_options()
    for name, _ in pairs:
        if name not in known:
            raise AttnbenchError(
                f"--option {name}: no registered layer takes it; options: {', '.join(known)} "
                "(a factory's parameter is an option where its default is an integer)"
            )
    return {
        name: known[name].check(value, "--option", (), (), given=_given(name))
        for name, value in pairs
    }


def _given(name: str) -> str:
    """How a layer option is set on the command line: its own flag (--k), or, for a plugin's,
    --option NAME."""
    layer_flag = name in OPTION and not OPTION[name].field  # --seed is the sweep's, not a layer's
    return f"--{name}" if layer_flag else f"--option {name}"


# ----------------------------------------------------------------------------- the option table


@dataclass(frozen=True)
class Option:
    """One sweep option: its key (in the config file, in ``build_grid`` and as the command
    line's ``--key``), the ``Grid`` field it sets, and how a typed or written value becomes that
    field. Its default is the ``Grid`` field's."""

    key: str
    field: str  # "" for a layer option (Grid.options holds it)
    kind: type  # what the command line reads before ``parse``: str, int or float
    parse: Callable[[Any], Any]
    help: str
    default_text: str = ""  # how the help names the default ("": the Grid default, written)
    envvar: str | None = None
    compare: bool = False  # two runs that differ in it compare something else: compare warns

    @property
    def default(self) -> Any:
        return next((f.default for f in fields(Grid) if f.name == self.field), None)

    @property
    def full_help(self) -> str:
        if self.kind is bool:  # a switch: the command line shows its default (--no-causal)
            return self.help
        shown = self.default_text or _describe(self.default)
        return f"{self.help} Default: {shown}."


def _describe(value: Any) -> str:
    """A default as the user would type it: a doubling tuple as a range, a tuple as a list."""
    if isinstance(value, tuple):
        doubling = len(value) > 2 and all(b == 2 * a for a, b in itertools.pairwise(value))
        return f"{value[0]}..{value[-1]}" if doubling else ",".join(map(str, value))
    return str(value)


def _layer_option(option: LayerOption) -> Option:
    """A layer option as a sweep option: ``--k 5``, or ``k = 5`` in a config file."""

    def parse(value: Any) -> int:
        return option.check(value, "--" + option.name, (), ())

    if option.flag:  # --causal / --no-causal
        return Option(option.name, "", bool, parse, option.help)
    return Option(option.name, "", int, parse, option.help, default_text=str(option.default))


# The CPU's default sweep: one width, and this many seconds of cases in all (where every line
# has settled sooner, less), each case charged every round it may get (``run.auto``). On this
# project's 2-core CPU, cold, on one thread, the lines taking turns by length (2026-11-30): on
# 60 s, seven sweeps read 7-10 of the 11 time exponents agreeing with the chapter (10 in four)
# in 55-74 s of wall time (benchmarks/default_sweep.py); on 100 s, four read 9-11 (median 10)
# in 57-96 s (median 78 s): no more often, for longer. On two threads (2026-11-29) 100 s had
# read 10 and 8 of 11, and 60 s 6 of 11. On 45 s (2026-12-01, taking turns with 60 s), three
# read 7-9 agreeing of 8-10 judged in 39-44 s (lstm, attention-local, conv-dilated, ssm-scan
# short of their regime), against 9-10 of 9-11 in 56-57 s on 60 s.
CPU_DEFAULT_D = (64,)
CPU_DEFAULT_AUTO_BUDGET_S = 60.0
# The CPU's threads where --threads is not given: one, as torch.utils.benchmark times by
# default. Two threads on two CPUs wait on each other at every op, and whatever else runs (the
# sweep's own driver, the system, a neighbour) stalls one of them: on this project's 2-core CPU
# (2026-11-30, 8 processes a case, two sweeps each), conv, lstm and attention-sdpa at n = 512
# and 2048 read 1-25% apart between sweeps on torch's 2 threads (lstm 2.6x once), 0.6-2% on
# one; the default sweep marked 66 of 77 cases ! on two, 23 of 70 on one.
CPU_DEFAULT_THREADS = 1


def default_threads(device: str) -> int | None:
    """The threads a measurement on ``device`` takes where none are given: one on the CPU
    (``CPU_DEFAULT_THREADS``), torch's own (None) elsewhere."""
    return CPU_DEFAULT_THREADS if device_kind(device) == "cpu" else None


# the help says both defaults, from where each is set (it said 60 after the CPU's became 100)
_AUTO_BUDGET_S = next(f.default for f in fields(Grid) if f.name == "auto_budget_s")


OPTIONS: tuple[Option, ...] = (
    Option("layers", "layers", str, parse_layers,
           f"Comma-separated layers: {', '.join(BUILTIN)}; or plugins: an installed plugin's "
           "name, module.path:factory, path/to/file.py:factory; NAME= before one names it "
           "(before=old/mine.py:make).", default_text="every built-in"),
    Option("n", "ns", str, parse_lengths,
           "Sequence lengths (in --mode decode, the context: the tokens before the step): "
           "a list 64,128, a doubling range 64..4096, or auto: for each "
           "layer and width, n doubles from 64 until the layer's time grows as its counted "
           "work (its cases' first rounds read its rate within 15%, with no trend, over four "
           "lengths; or a plateau that attnbench table fits, within 20%, that its rate then "
           "fell under at the two lengths past it), or the next case would not fit "
           "(--max-case-seconds, free memory, --auto-budget); auto:START..STOP sets the "
           "ladder. run.json says what stopped each layer.",
           default_text="auto in sweep (a fixed grid is one option away: --n 64..1024); ab "
           "needs lengths given"),
    Option("d", "ds", str, lambda v: parse_int_list(v, "d"), "Widths, as --n.",
           default_text="64 on the CPU with the default lengths, else 64,128"),
    *(_layer_option(o) for o in known_options().values()),
    Option("option", "", str, parse_layer_options,
           "Options of plugin layers, NAME=VALUE, comma-separated.", default_text="none"),
    Option("batch", "batch", int, lambda v: read.positive_int(v, "batch"), "Batch size.",
           compare=True),
    Option("dtype", "dtype", str, lambda v: read.choice(v, "dtype", DTYPES),
           f"{', '.join(DTYPES)}.",
           compare=True),
    Option("device", "device", str, str, f"{DEVICE_CHOICES}.", envvar="ATTNBENCH_DEVICE",
           compare=True),
    Option("mode", "mode", str, lambda v: read.choice(v, "mode", MODES),
           "; ".join(f"{mode}: {what}" for mode, what in MODE_HELP.items()) + ".", compare=True),
    Option("threads", "threads", int, lambda v: read.positive_int(v, "threads"),
           "CPU threads for torch (recorded): one reads the same in every process and sweep, "
           "as torch.utils.benchmark times; more, what all your cores do, shared with the "
           "system's work.", default_text="1 on the CPU (torch's with --executor ray, or a "
           "recorded run that kept torch's)"),
    Option("time_budget", "time_budget_s", float, lambda v: read.positive_seconds(v, "time-budget"),
           "Seconds of timed calls a case's rounds may take together: the --processes "
           "rounds always run, each with a share of it for its samples; more only within it, "
           "while the interval is wider than --precision."),
    Option("wait_quiet", "wait_quiet_s", float, lambda v: read.seconds(v, "wait-quiet"),
           "Seconds the sweep may wait, in all, for a busy machine to quiet down: a round "
           "whose machine reference reads the machine disturbed (a neighbour's load) waits, "
           "up to 10 s, before it times; 0 never waits. run.json records what was waited.",
           envvar="ATTNBENCH_WAIT_QUIET"),
    Option("seed", "seed", int, read.seed, "Seed for weights and inputs."),
    Option("max_case_seconds", "max_case_s", float,
           lambda v: read.positive_seconds(v, "max-case-seconds"),
           "A case whose single call takes longer is recorded as timeout and the larger cases "
           "of its layer are skipped. A call that never returns is ended with its process, "
           "which may run a minute plus twenty calls (60 + 20 x this seconds; 600 s without "
           "a limit): it also counts and warms up.", default_text="no limit"),
    Option("max_case_memory", "max_case_memory", str,
           lambda v: read.positive_bytes(v, "max-case-memory"),
           "A case whose process grows past this (4GiB, 512MiB) is ended and recorded oom, and "
           "the larger cases of its layer are skipped; the sweep goes on (--executor fork).",
           default_text=f"{MEMORY_SHARE:.0%} of the memory available as each process starts"),
    Option("processes", "processes", int, lambda v: read.positive_int(v, "processes"),
           "Time every case in at least this many rounds, each a fresh process (--executor "
           "fork), spread over the sweep in a shuffled order, sharing --time-budget: a case's "
           "time and its 95% interval are taken over its processes, so they hold what a re-run "
           "finds; a sweep adds rounds, up to --max-processes, while the interval is wider "
           "than --precision or rounds ran on a disturbed machine (within --time-budget).",
           default_text=f"{DEFAULT_PROCESSES}; in ab, the pairs its test needs (10 at alpha 0.01)"),
    Option("max_processes", "max_processes", int, lambda v: read.positive_int(v, "max-processes"),
           "The most rounds a case gets (--processes at the least).",
           default_text=f"{MORE_PROCESSES} x --processes"),
    Option("precision", "precision", str, read.precision,
           "The 95% interval a sweep adds rounds to a case to reach (5% or 0.05): ±2% on a "
           "fixed grid; with --n auto 5%, the bound of the ! mark, so there only a case that "
           "would be marked ! gets more rounds.",
           default_text=f"{DEFAULT_PRECISION:.0%}; {AUTO_PRECISION:.0%} with --n auto"),
    Option("metric", "metric", str, lambda v: read.choice(v, "metric", METRICS),
           "time: seconds per call; instructions: CPU instructions per call, counted with "
           "Valgrind's Callgrind in a worker process (repeatable to ~0.2% on a busy machine; "
           "CPU only)."),
    Option("timer", "timer", str, lambda v: read.choice(v, "timer", [t.value for t in Timer]),
           "What a sample times. blocks: synchronised blocks of back-to-back calls, what a "
           "model called in a loop pays. kernels (CUDA): the kernels alone, as a captured or "
           "compiled model pays them (replays of a CUDA graph of the call). cold (CUDA): each "
           "call's kernels with the L2 flushed before it (CUDA events around the call, its "
           "launches queued behind a held stream).", compare=True),
    Option("compile", "compile", str, compile_text,
           "torch.compile each case's layer (inductor): a mode, one of "
           f"{', '.join(COMPILE_MODES)}, then optionally dynamic or static and fullgraph, "
           "comma-separated (--compile max-autotune,fullgraph). The first call (the compile) is "
           "timed apart (compile_s), its graph breaks and recompiles recorded, and its output "
           "checked against the eager layer's (compile_check); the counts stay the layer's.",
           default_text="none (eager)", compare=True),
    Option("auto_budget", "auto_budget_s", float,
           lambda v: read.positive_seconds(v, "auto-budget"),
           "With --n auto: seconds the sweep's cases may take in all; each layer and width "
           "still going gets an equal share of what the finished ones left.",
           default_text=f"{_AUTO_BUDGET_S:g}, or {CPU_DEFAULT_AUTO_BUDGET_S:g} in the CPU's "
           "default sweep"),
    Option("energy", "energy", bool, read.switch,
           "Joules per call and the GPU's mean power (energy_j, power_w), read from its NVML "
           "energy counter while the call runs back to back for at least "
           f"{ENERGY_S:g} s after the first round's timed calls, from one step of the counter "
           "to another, after a period of calls: up to about 0.8 s a case where the counter "
           "steps every 100 ms, as an H200's does. CUDA only, with NVML (pip install "
           "'attnbench[gpu]'); empty, and energy_method says why, where it cannot be read."),
    Option("allocator", "allocator", str, check_allocator,
           "pinned: glibc keeps freed memory mapped and torch puts tensors of 2 MiB or more "
           "on huge pages, so a time does not depend on what ran before or on where a "
           "process's pages landed; system: glibc's and torch's defaults, what your own "
           "program pays (page faults)."),
)  # fmt: skip  # the option table, one option to a paragraph
OPTION = {o.key: o for o in OPTIONS}
# Keys a config file may hold: the sweep options, and where the results go.
CONFIG_KEYS = (*OPTION, "out")


def grid_from_config(config: Mapping[str, Any], resolve: DeviceResolver | None = None) -> Grid:
    """Rebuild (and re-validate) the grid a results folder recorded with ``Grid.to_dict``.

    Layer options sit among the fields (``attnbench.formats`` brought the mapping to today's
    keys)."""
    if not isinstance(config, Mapping):
        raise AttnbenchError("the recorded configuration is not a table of options")
    config = dict(config)
    by_field = {o.field: o.key for o in OPTIONS if o.field}
    layer_options = set(known_options())
    unknown = sorted(set(config) - set(by_field) - layer_options)
    if unknown:
        raise AttnbenchError(
            f"the recorded configuration has unknown key(s) {', '.join(unknown)}; "
            "was it written by a newer attnbench, or by a plugin layer not loaded?"
        )
    options = {key: value for key, value in config.items() if key in layer_options}
    fields_ = {by_field[key]: value for key, value in config.items() if key in by_field}
    return build_grid({**fields_, "option": options or None}, resolve)


def grid_options(grid: Grid) -> dict[str, Any]:
    """The grid as ``build_grid`` options (the command line's and config file's keys)."""
    found = {o.key: plain(getattr(grid, o.field)) for o in OPTIONS if o.field}
    if grid.n_auto is not None:
        found["n"] = grid.n_auto.text()
    return {**found, **dict(grid.options)}


def _default_lengths(grid: Grid, given: Mapping[str, Any]) -> Grid:
    """The lengths of a sweep that names none: ``--n auto`` on every device, since at fixed
    short lengths a layer's time is the machine's fixed cost, not its order. On the CPU, one
    width and a budget of ``CPU_DEFAULT_AUTO_BUDGET_S`` unless given."""
    grid = replace(grid, ns=AutoN().ladder(), n_auto=AutoN())
    if device_kind(grid.device) != "cpu":
        return grid
    if "d" not in given:
        grid = replace(grid, ds=CPU_DEFAULT_D)
    if "auto_budget" not in given:
        grid = replace(grid, auto_budget_s=CPU_DEFAULT_AUTO_BUDGET_S)
    return grid


def load_config(path: Path) -> dict[str, Any]:
    """Read a TOML sweep config holding the same keys as the command-line options."""
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise AttnbenchError(f"config file {str(path)!r} does not exist") from None
    except OSError as exc:
        raise AttnbenchError(f"cannot read config file {str(path)!r}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise AttnbenchError(f"config file {str(path)!r} is not valid TOML: {exc}") from None
    if "rounds" in data:
        raise AttnbenchError(
            f"config file {str(path)!r}: 'rounds' is now 'processes' (each round of a case "
            "is timed in a fresh process): rename it"
        )
    unknown = sorted(set(data) - set(CONFIG_KEYS))
    if unknown:
        raise AttnbenchError(
            f"config file {str(path)!r} has unknown key(s) {', '.join(unknown)}; "
            f"accepted: {', '.join(CONFIG_KEYS)}"
        )
    return data


def build_grid(options: Mapping[str, Any], resolve: DeviceResolver | None = None) -> Grid:
    """Make a validated ``Grid`` from option values (``OPTIONS`` keys; None means default,
    but a ``threads`` of None, torch's own thread count, where a run recorded it so).

    Each layer checks the options it takes with its own declaration (a kernel that fits in the
    sequence, heads that divide d). A plugin loaded from a module, a file or an installed
    package is built and called once on a tiny input, so a layer that fails or changes the
    shape is refused before anything is measured.
    ``resolve`` turns the device name into the device cases run on, checked to exist with the
    dtype: this machine's by default, an executor's workers' otherwise.
    """
    if "rounds" in options:
        raise AttnbenchError(
            "'rounds' is now 'processes': each round of a case is timed in a fresh process"
        )
    given = {key: v for key, v in options.items() if v is not None and key in OPTION}
    values = {key: OPTION[key].parse(v) for key, v in given.items()}
    layer_options = values.pop("option", {})
    layer_options |= {key: values.pop(key) for key in list(values) if not OPTION[key].field}
    order = list(known_options())  # as the layers declare them: k, heads, window, ...
    given_options = tuple(sorted(layer_options.items(), key=lambda kv: order.index(kv[0])))
    lengths = values.pop("n", None)
    auto = lengths if isinstance(lengths, AutoN) else None
    if auto is not None:
        values["n"] = auto.ladder()
    elif lengths is not None:
        values["n"] = lengths
    grid = replace(
        Grid(),
        **{OPTION[key].field: v for key, v in values.items()},
        options=given_options,
        n_auto=auto,
    )
    for name in grid.layers:
        found = entry(name)
        resolved = found.resolve(layer_options)
        for option in found.options:
            option.check(resolved[option.name], name, grid.ns, grid.ds, given=_given(option.name))
        if found.source.kind in plugins.CHECKED:
            small = min(min(grid.ns), max(16, 2 * found.reach(resolved) + 1))
            checks.check_output(found, min(grid.ds), (small, min(grid.ns)), resolved)
    grid = replace(grid, device=(resolve or local_device)(grid.device, grid.dtype))
    if "threads" not in options:  # a threads given as None: torch's own
        grid = replace(grid, threads=default_threads(grid.device))
    if "n" not in given:
        grid = _default_lengths(grid, given)
    if grid.n_auto is not None and "precision" not in given:
        grid = replace(grid, precision=AUTO_PRECISION)
    if grid.timer != Timer.BLOCKS and device_kind(grid.device) != "cuda":
        raise AttnbenchError(
            f"--timer {grid.timer} times CUDA kernels; --device {grid.device} is not a CUDA "
            "GPU (use --timer blocks: there kernel_time_s splits a time into kernels and "
            "overhead)"
        )
    _check_compile(grid)
    if grid.energy and device_kind(grid.device) != "cuda":
        raise AttnbenchError(
            f"--energy reads a GPU's energy counter (NVML), and this sweep's device, "
            f"{grid.device}, is not a CUDA GPU (--device cuda)"
        )
    if grid.metric == "instructions":
        if grid.device != "cpu":
            raise AttnbenchError(
                f"--metric instructions counts CPU instructions; --device {grid.device} is not "
                "the CPU (use --device cpu)"
            )
        if "processes" in given and grid.processes > 1:
            raise AttnbenchError(
                "--metric instructions: counts repeat to ~0.2%, so there is one process a case "
                f"(got --processes {grid.processes})"
            )
        grid = replace(grid, processes=1, max_processes=1)
    if grid.max_processes is not None and grid.max_processes < grid.processes:
        raise AttnbenchError(
            f"--max-processes {grid.max_processes} is below --processes {grid.processes}"
        )
    _check_theories(grid)
    return grid


def _check_theories(grid: Grid) -> None:
    """One line where a plugin's formula fails at a size the grid will measure: registering
    tries n = 64 only, and a term like sqrt(100 - n) ended a sweep at n = 128 with a traceback
    from its first time estimate."""
    for name in grid.layers:
        found = entry(name)
        if found.theory is None or name in BUILTIN:
            continue
        resolved = found.resolve(dict(grid.options))
        for n, d in itertools.product(grid.ns, grid.ds):
            problem = theory_problem(found.theory, sizes(grid.batch, n, d, resolved))
            if problem is not None:
                raise AttnbenchError(
                    f"layer {name!r} ({found.source.spec}) at n={n}, d={d}: {problem}; mend the "
                    "formula, or sweep lengths and widths where it holds"
                )


def _check_compile(grid: Grid) -> None:
    """--compile with what cannot take it: one line, before anything runs."""
    spec = CompileSpec.parse(grid.compile)
    if spec is not None and grid.timer == Timer.KERNELS and spec.replays_graphs(grid.device):
        raise AttnbenchError(
            f"--timer kernels replays a CUDA graph of the call, and --compile {spec.mode} "
            "already replays CUDA graphs (one cannot be captured inside the other): time it "
            "with --timer blocks, or use --compile default"
        )
    if grid.compile and grid.metric == "instructions":
        raise AttnbenchError(
            "--compile with --metric instructions: Callgrind would count inductor's compile "
            "(minutes under Valgrind) in every case; compare compiled times with --metric time"
        )
    if grid.compile and grid.mode == "decode":
        raise AttnbenchError(
            "--compile times forward and train calls; a decode step is not compiled yet "
            "(drop --compile, or use --mode forward)"
        )
