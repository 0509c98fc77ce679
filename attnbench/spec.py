"""What to measure: frozen case and grid specs, their parsing and validation.

Everything the user types passes through here and comes out either as a valid ``Grid`` or as an
``AttnbenchError`` whose one-line message names the problem and what is accepted.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch

from attnbench.errors import AttnbenchError
from attnbench.layers import LAYERS
from attnbench.theory import analytic_flops

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
MODES = ("forward", "train")
DEVICE_CHOICES = "cpu, cuda, cuda:N, mps, auto"


@dataclass(frozen=True)
class Case:
    """One measurement: a layer at one (n, d) with everything that changes its cost.

    ``k``, ``heads`` and ``window`` are None for layers that do not take them, so a case names
    only what matters to it.
    """

    layer: str
    n: int
    d: int
    k: int | None
    heads: int | None
    batch: int
    dtype: str
    device: str
    mode: str
    window: int | None = None

    def analytic_flops(self) -> float:
        """FLOPs of one call from the formula table in ``attnbench.theory``."""
        return analytic_flops(
            self.layer,
            batch=self.batch,
            n=self.n,
            d=self.d,
            k=self.k or 0,
            window=self.window or 0,
            mode=self.mode,
        )

    def layer_options(self) -> dict[str, int]:
        """The options ``build_layer`` takes for this case (the length too, for layers built
        for one)."""
        given = {"k": self.k, "heads": self.heads, "window": self.window}
        return {"n": self.n, **{key: v for key, v in given.items() if v is not None}}

    @property
    def case_id(self) -> str:
        parts = [self.layer, f"n={self.n}", f"d={self.d}"]
        if self.k is not None:
            parts.append(f"k={self.k}")
        if self.heads is not None:
            parts.append(f"h={self.heads}")
        if self.window is not None:
            parts.append(f"r={self.window}")
        parts += [f"b={self.batch}", self.dtype, self.device, self.mode]
        return "/".join(parts)

    def label(self) -> str:
        """Short human label for progress lines."""
        extra = f" k={self.k}" if self.k is not None else ""
        extra += f" h={self.heads}" if self.heads is not None else ""
        extra += f" r={self.window}" if self.window is not None else ""
        return f"{self.layer} n={self.n} d={self.d}{extra}"


DEFAULT_LAYERS = tuple(LAYERS)
DEFAULT_NS = (64, 128, 256, 512, 1024)
DEFAULT_DS = (64, 128)


@dataclass(frozen=True)
class Grid:
    """A sweep: the cross product of layers, n and d at fixed k, heads, batch, dtype, device."""

    layers: tuple[str, ...] = DEFAULT_LAYERS
    ns: tuple[int, ...] = DEFAULT_NS
    ds: tuple[int, ...] = DEFAULT_DS
    k: int = 3
    heads: int = 4
    window: int = 16  # restricted attention: neighbours on each side
    batch: int = 1
    dtype: str = "float32"
    device: str = "auto"
    mode: str = "forward"
    threads: int | None = None  # CPU threads; None keeps torch's default (and records it)
    time_budget_s: float = 0.25  # timing budget per case, seconds
    seed: int = 0
    max_case_s: float | None = None  # a first call slower than this is a timeout; None: no limit
    # Timing rounds: each case is timed once per round, the rounds spread over the whole sweep,
    # so its samples see the machine at several moments (what compare tests across runs).
    rounds: int = 1

    def cases(self) -> list[Case]:
        """Cases ordered layer, d, then n ascending (so a larger n always comes later)."""
        out = []
        for layer in self.layers:
            opts = LAYERS[layer].options
            for d in self.ds:
                for n in self.ns:
                    out.append(
                        Case(
                            layer=layer,
                            n=n,
                            d=d,
                            k=self.k if "k" in opts else None,
                            heads=self.heads if "heads" in opts else None,
                            batch=self.batch,
                            dtype=self.dtype,
                            device=self.device,
                            mode=self.mode,
                            window=self.window if "window" in opts else None,
                        )
                    )
        return out

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("layers", "ns", "ds"):
            out[key] = list(out[key])
        return out

    def to_options(self) -> dict[str, Any]:
        """The grid as ``build_grid`` options (the CLI and config key names)."""
        return {
            "layers": list(self.layers),
            "n": list(self.ns),
            "d": list(self.ds),
            "k": self.k,
            "heads": self.heads,
            "window": self.window,
            "batch": self.batch,
            "dtype": self.dtype,
            "device": self.device,
            "mode": self.mode,
            "threads": self.threads,
            "time_budget": self.time_budget_s,
            "seed": self.seed,
            "max_case_seconds": self.max_case_s,
            "rounds": self.rounds,
        }


def grid_from_config(config: Mapping[str, Any], resolve: DeviceResolver | None = None) -> Grid:
    """Rebuild (and re-validate) the grid a results folder recorded with ``Grid.to_dict``."""
    if not isinstance(config, Mapping):
        raise AttnbenchError("the recorded configuration is not a table of options")
    names = {"ns": "n", "ds": "d", "time_budget_s": "time_budget", "max_case_s": "max_case_seconds"}
    unknown = sorted(set(config) - {f.name for f in fields(Grid)})
    if unknown:
        raise AttnbenchError(
            f"the recorded configuration has unknown key(s) {', '.join(unknown)}; "
            "was it written by a newer attnbench?"
        )
    return build_grid({names.get(key, key): value for key, value in config.items()}, resolve)


# ----------------------------------------------------------------------------- parsing

_RANGE = re.compile(r"^\s*(\d+)\s*\.\.\s*(\d+)\s*$")


def parse_int_list(text: str | int | Iterable[int], name: str) -> tuple[int, ...]:
    """Parse ``"64,128,256"`` or the doubling range ``"64..4096"`` (64, 128, ..., 4096).

    A range keeps start * 2^i while it does not exceed the end.  Values must be >= 1.
    """
    if isinstance(text, bool):
        raise AttnbenchError(f"--{name}: expected integers, got {text!r}")
    if isinstance(text, int):
        values: list[int] = [text]
    elif isinstance(text, str):
        text = text.strip()
        match = _RANGE.match(text)
        if match:
            start, end = int(match.group(1)), int(match.group(2))
            if start < 1:
                raise AttnbenchError(f"--{name}: range start must be >= 1, got {start}")
            if end < start:
                raise AttnbenchError(
                    f"--{name}: range {text!r} runs backwards; write START..END with START <= END"
                )
            values = []
            v = start
            while v <= end:
                values.append(v)
                v *= 2
        else:
            items = [t.strip() for t in text.split(",")]
            if not text or any(not re.fullmatch(r"-?\d+", t) for t in items):
                raise AttnbenchError(
                    f"--{name}: cannot read {text!r}; use a list like 64,128,256 "
                    "or a doubling range like 64..4096"
                )
            values = [int(t) for t in items]
    elif isinstance(text, list | tuple):
        values = list(text)
        if not values or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise AttnbenchError(f"--{name}: expected a list of integers, got {text!r}")
    else:
        raise AttnbenchError(
            f"--{name}: expected a list like 64,128 or a range like 64..4096, got {text!r}"
        )
    for v in values:
        if v < 1:
            raise AttnbenchError(f"--{name}: values must be >= 1, got {v}")
    return tuple(sorted(set(values)))


def parse_layers(text: str | Iterable[str]) -> tuple[str, ...]:
    if isinstance(text, str):
        items = [t.strip() for t in text.split(",")]
    elif isinstance(text, list | tuple) and all(isinstance(t, str) for t in text):
        items = [t.strip() for t in text]
    else:
        raise AttnbenchError(f"--layers: expected layer names, got {text!r}")
    if not items or any(not t for t in items):
        raise AttnbenchError(f"--layers: cannot read {text!r}; accepted: {', '.join(LAYERS)}")
    for item in items:
        if item not in LAYERS:
            raise AttnbenchError(f"unknown layer {item!r}; accepted: {', '.join(LAYERS)}")
    return tuple(dict.fromkeys(items))


# ----------------------------------------------------------------------------- devices


def resolve_device(name: str) -> str:
    """Turn ``auto`` / ``cuda`` / ``cuda:N`` / ``mps`` / ``cpu`` into an available device string."""
    name = name.strip().lower()
    if name == "auto":
        if torch.cuda.is_available():
            return "cuda:0"
        if _mps_available():
            return "mps"
        return "cpu"
    if name == "cpu":
        return "cpu"
    if name == "mps":
        if not _mps_available():
            raise AttnbenchError("device 'mps' is not available on this machine; try cpu or auto")
        return "mps"
    match = re.fullmatch(r"cuda(?::(\d+))?", name)
    if match:
        if not torch.cuda.is_available():
            raise AttnbenchError(
                f"device {name!r} is not available: this torch build or machine has no CUDA GPU; "
                "try cpu or auto"
            )
        index = int(match.group(1) or 0)
        count = torch.cuda.device_count()
        if index >= count:
            raise AttnbenchError(
                f"device {name!r} does not exist: this machine has {count} CUDA device(s), "
                f"cuda:0..cuda:{count - 1}"
            )
        return f"cuda:{index}"
    raise AttnbenchError(f"unknown device {name!r}; accepted: {DEVICE_CHOICES}")


def local_device(name: str, dtype: str) -> str:
    """A device of this machine (resolved), checked to compute in ``dtype`` natively."""
    device = resolve_device(name)
    check_dtype(dtype, device)
    return device


DeviceResolver = Callable[[str, str], str]  # (--device, --dtype) -> the device cases run on


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend and backend.is_available())


def check_dtype(dtype: str, device: str) -> None:
    """Refuse a dtype the device cannot compute in."""
    if dtype not in DTYPES:
        raise AttnbenchError(f"unknown dtype {dtype!r}; accepted: {', '.join(DTYPES)}")
    if dtype == "bfloat16" and device.startswith("cuda"):
        # Native bfloat16 arithmetic starts with compute capability 8.0 (Ampere); older GPUs only
        # emulate it, which would time the emulation, not the layer.
        major, minor = torch.cuda.get_device_capability(torch.device(device).index or 0)
        if major < 8:
            raise AttnbenchError(
                f"dtype bfloat16 is not supported natively on {device} (compute capability "
                f"{major}.{minor} < 8.0); accepted there: float32, float16"
            )
    if dtype == "bfloat16" and device == "mps":
        try:
            torch.ones(1, dtype=torch.bfloat16, device="mps")
        except (RuntimeError, TypeError) as exc:
            raise AttnbenchError(
                "dtype bfloat16 is not supported on mps here; accepted there: float32, float16"
            ) from exc


# ----------------------------------------------------------------------------- grid building

CONFIG_KEYS = (
    "layers",
    "n",
    "d",
    "k",
    "heads",
    "window",
    "batch",
    "dtype",
    "device",
    "mode",
    "threads",
    "time_budget",
    "seed",
    "max_case_seconds",
    "rounds",
    "out",
)


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
    unknown = sorted(set(data) - set(CONFIG_KEYS))
    if unknown:
        raise AttnbenchError(
            f"config file {str(path)!r} has unknown key(s) {', '.join(unknown)}; "
            f"accepted: {', '.join(CONFIG_KEYS)}"
        )
    return data


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise AttnbenchError(f"--{name}: expected an integer, got {value!r}")
    if value < 1:
        raise AttnbenchError(f"--{name} must be >= 1, got {value}")
    return value


def _seed(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise AttnbenchError(f"--seed: expected an integer >= 0, got {value!r}")
    return value


def _positive_seconds(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise AttnbenchError(f"--{name} must be a positive number of seconds, got {value!r}")
    return float(value)


def build_grid(options: Mapping[str, Any], resolve: DeviceResolver | None = None) -> Grid:
    """Make a validated ``Grid`` from option values (CLI or config keys; None means default).

    ``resolve`` turns the device name into the device cases run on, checked to exist with the
    dtype: this machine's by default, an executor's workers' otherwise.
    """
    opts = {k: v for k, v in options.items() if v is not None}
    base = Grid()
    grid = replace(
        base,
        layers=parse_layers(opts["layers"]) if "layers" in opts else base.layers,
        ns=parse_int_list(opts["n"], "n") if "n" in opts else base.ns,
        ds=parse_int_list(opts["d"], "d") if "d" in opts else base.ds,
        k=_positive_int(opts.get("k", base.k), "k"),
        heads=_positive_int(opts.get("heads", base.heads), "heads"),
        window=_positive_int(opts.get("window", base.window), "window"),
        batch=_positive_int(opts.get("batch", base.batch), "batch"),
        threads=_positive_int(opts["threads"], "threads") if "threads" in opts else None,
        seed=_seed(opts.get("seed", base.seed)),
        rounds=_positive_int(opts.get("rounds", base.rounds), "rounds"),
        max_case_s=(
            _positive_seconds(opts["max_case_seconds"], "max-case-seconds")
            if "max_case_seconds" in opts
            else None
        ),
    )
    mode = str(opts.get("mode", base.mode))
    if mode not in MODES:
        raise AttnbenchError(f"unknown mode {mode!r}; accepted: {', '.join(MODES)}")
    budget = _positive_seconds(opts.get("time_budget", base.time_budget_s), "time-budget")
    dtype = str(opts.get("dtype", base.dtype))
    if dtype not in DTYPES:
        raise AttnbenchError(f"unknown dtype {dtype!r}; accepted: {', '.join(DTYPES)}")
    if any("heads" in LAYERS[name].options for name in grid.layers):
        bad = [d for d in grid.ds if d % grid.heads]
        if bad:
            raise AttnbenchError(
                f"d={bad[0]} is not divisible by heads={grid.heads}; attention needs d % heads == 0"
            )
    if any("k" in LAYERS[name].options for name in grid.layers) and grid.k > min(grid.ns):
        raise AttnbenchError(
            f"--k {grid.k} is larger than n={min(grid.ns)}; a kernel must fit in the sequence "
            f"(use k <= the smallest n)"
        )
    if "conv-dilated" in grid.layers and grid.k < 2:
        raise AttnbenchError(
            f"--k {grid.k}: conv-dilated needs k >= 2 (dilations k^i must grow to cover n)"
        )
    if any("window" in LAYERS[name].options for name in grid.layers) and grid.window > min(grid.ns):
        raise AttnbenchError(
            f"--window {grid.window} is larger than n={min(grid.ns)}; restricted attention needs "
            "r <= the smallest n (r >= n is full attention)"
        )
    device = (resolve or local_device)(str(opts.get("device", base.device)), dtype)
    return replace(grid, mode=mode, time_budget_s=budget, dtype=dtype, device=device)


# ----------------------------------------------------------------------------- size guard

# Rough throughputs, used only to warn before an absurd sweep starts; never reported as measured.
_ASSUMED_FLOP_PER_S = {"cpu": 2e10, "cuda": 2e13, "mps": 2e12}
MAX_CASES = 2000  # more cases than this need --yes
MAX_ESTIMATED_S = 3600.0  # a longer estimated sweep needs --yes


def estimate_seconds(grid: Grid) -> float:
    """A rough lower estimate of a sweep's duration from the analytic FLOPs of each case.

    Per case: about four untimed calls (first call, FLOP count, memory profile, warm-up) plus
    the timing, which lasts the time budget or at least eleven calls; each further round adds a
    rebuild, two untimed calls and at least 0.1 s of timing.
    """
    rate = _ASSUMED_FLOP_PER_S[grid.device.split(":")[0]]
    total = 0.0
    for case in grid.cases():
        call = case.analytic_flops() / rate
        if grid.max_case_s is not None and call > grid.max_case_s:
            total += grid.max_case_s  # it would stop as a timeout after its first call
            continue
        total += 0.05 + 4 * call + max(grid.time_budget_s, 11 * call)
        total += (grid.rounds - 1) * (0.02 + 2 * call + max(0.1, 11 * call))
    return total


def size_warning(grid: Grid) -> str | None:
    """Why this grid is too large to start without confirmation, or None when it is not."""
    cases = len(grid.cases())
    seconds = estimate_seconds(grid)
    if cases <= MAX_CASES and seconds <= MAX_ESTIMATED_S:
        return None
    hours = seconds / 3600
    return (
        f"this sweep has {cases} cases and would take at least about {hours:.1f} h on "
        f"{grid.device}; pass --yes to run it anyway, or narrow --n / --d / --layers "
        f"(limits without --yes: {MAX_CASES} cases, {MAX_ESTIMATED_S / 3600:.0f} h)"
    )


def parse_columns(text: str) -> tuple[int, ...]:
    """``--columns`` of ``attnbench pe``: "6..9" (every column from 6 to 9) or "0,2,4"."""
    text = text.strip()
    try:
        if ".." in text:
            first, last = (int(x) for x in text.split("..", 1))
            values = tuple(range(first, last + 1))
        else:
            values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise AttnbenchError(
            f"--columns: expected a range such as 6..9 or a list such as 0,2,4, got {text!r}"
        ) from None
    if not values or min(values) < 0:
        raise AttnbenchError(f"--columns: expected columns 0 or more, got {text!r}")
    return values
