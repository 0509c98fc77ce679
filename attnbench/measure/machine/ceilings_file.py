"""Ceilings on disk: the per-machine cache, and the files ``attnbench machine --json`` writes.

One file per machine, torch version, device, dtype, set of kernels and thread count
(``cache_key``), under ``cache_dir()``; ``machine_ceilings`` reads it or measures and writes it.
``ceilings_from`` reads today's shape, which ``attnbench.formats`` makes of any other.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
from collections.abc import Callable, Mapping
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import torch

from attnbench.devices import device_name
from attnbench.errors import AttnbenchError
from attnbench.formats import migrate_ceilings
from attnbench.measure.machine import rates
from attnbench.measure.machine.ceilings import (
    CALL_CURVES,
    CEILING_KEYS,
    RATE_CURVES,
    Ceilings,
    fastest_rate,
)
from attnbench.measure.machine.probes import PASSES, Probes, measure_ceilings
from attnbench.storage import write_text_atomic


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$ATTNBENCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/attnbench``, else ``~/.cache/attnbench``."""
    env = os.environ if environ is None else environ
    if env.get("ATTNBENCH_CACHE_DIR"):
        return Path(env["ATTNBENCH_CACHE_DIR"])
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]) / "attnbench"
    return Path.home() / ".cache" / "attnbench"


def kernels_digest() -> str:
    """A short digest of what a measurement times: the elementwise catalogue and each curve's
    widths. An attnbench whose catalogue gained an op reads no entry measured without it
    (the model would read that op at an add's rate) and measures again."""
    kernels = [
        *sorted(rates.CATALOGUE),
        rates.GEMM_WIDTHS,
        rates.CONV_WIDTHS,
        rates.HEAD_WIDTHS,
        rates.RECURRENT_WIDTHS,
    ]
    return hashlib.sha256(repr(kernels).encode()).hexdigest()[:8]


def cache_key(device: str, dtype: str, threads: int) -> str:
    """One file per machine, torch version, device, dtype, set of kernels and thread count."""
    parts = [
        socket.gethostname(),
        device_name(device),
        platform.machine(),
        torch.__version__,
        device,
        dtype,
        f"k{kernels_digest()}",
        f"{threads}t",
    ]
    return "-".join("".join(c if c.isalnum() or c in "._" else "_" for c in p) for p in parts)


def machine_ceilings(
    device: str = "cpu",
    dtype: str = "float32",
    threads: int | None = None,
    *,
    remeasure: bool = False,
    folder: Path | None = None,
    measure: Callable[..., Ceilings] | None = None,
    passes: int = PASSES,
) -> tuple[Ceilings, bool]:
    """The ceilings from the cache, or measured in ``passes`` passes (and cached); and whether
    they were cached."""
    threads = threads or torch.get_num_threads()
    path = _cache_path(device, dtype, threads, folder)
    cached = None if remeasure else _cached_entry(path)
    if cached is not None:
        return cached, True
    if measure is None:
        found = measure_ceilings(device, dtype, threads, probes=Probes(passes=passes))
    else:
        found = measure(device, dtype, threads)
    try:  # an unwritable cache costs a measurement next time, nothing else
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(found.to_dict(), indent=2))
    except (OSError, AttnbenchError):
        pass
    return found, False


def ceilings_cached(
    device: str, dtype: str, threads: int | None = None, folder: Path | None = None
) -> bool:
    """Whether ``machine_ceilings`` would read these ceilings from the cache (a whole entry,
    curves included) rather than measure them."""
    path = _cache_path(device, dtype, threads or torch.get_num_threads(), folder)
    return _cached_entry(path) is not None


def _cache_path(device: str, dtype: str, threads: int, folder: Path | None) -> Path:
    return (folder or cache_dir()) / "ceilings" / f"{cache_key(device, dtype, threads)}.json"


def _cached_entry(path: Path) -> Ceilings | None:
    """The cache entry at ``path``, if whole: a damaged entry, or one without the rate curves,
    the fused LSTM's call cost or the host's cost per op, reads as none (and is measured again,
    all of it)."""
    try:
        found = read_ceilings(path)
    except AttnbenchError:
        return None
    stale = (
        found.gemm_rates is None
        or found.elementwise_rates is None
        or (found.recurrent_rates is not None and found.recurrent_call_s is None)
        or found.host_op_s is None
    )
    return None if stale else found


def read_ceilings(path: Path) -> Ceilings:
    """A ceilings file (``attnbench machine --json`` wrote it); one clear error if it is not."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not JSON"
        raise AttnbenchError(f"cannot read ceilings file {str(path)!r}: {reason}") from None
    return ceilings_from(data, str(path))


def ceilings_from(data: Any, where: str = "ceilings") -> Ceilings:
    """Ceilings from their JSON (a file, or run.json's record), checked, in today's shape
    whatever shape it was written in; one clear error if they are not ceilings."""
    if not isinstance(data, dict):
        raise AttnbenchError(f"{where}: not a JSON object of ceilings")
    square_apart = "square_flops_per_s" in data
    data = migrate_ceilings(data, where)
    for key in CEILING_KEYS:
        value = data.get(key)
        allowed_none = key == "page_fault_s" and value is None
        if not allowed_none and (
            isinstance(value, bool) or not isinstance(value, int | float) or not value > 0
        ):
            raise AttnbenchError(f"{where}: {key} must be a positive number (got {value!r})")
    names = {f.name for f in fields(Ceilings)}
    missing = sorted(names - set(data))
    if missing:
        raise AttnbenchError(f"{where}: missing {', '.join(missing)}")
    curves = {key: _curve(data.get(key), f"{where}: {key}") for key in RATE_CURVES}
    for key in CALL_CURVES:
        curves[key] = _curve(data.get(key), f"{where}: {key}", positive=False)
    rates = data.get("elementwise_rates")
    if rates is not None and (
        not isinstance(rates, dict)
        or not all(
            isinstance(r, int | float) and not isinstance(r, bool) and r > 0 for r in rates.values()
        )
    ):
        raise AttnbenchError(f"{where}: elementwise_rates must map op names to positive rates")
    host = data.get("host_op_s")
    if host is not None and (
        isinstance(host, bool) or not isinstance(host, int | float) or host <= 0
    ):
        raise AttnbenchError(f"{where}: host_op_s must be a positive number (got {host!r})")
    found = Ceilings(**{**{k: data[k] for k in names if k in data}, **curves})
    if square_apart or found.square_flops_per_s is None:
        return found
    # a file whose peak was the square's own: the peak by today's rule, the fastest product
    return replace(
        found, peak_flops_per_s=fastest_rate(found.square_flops_per_s, found.curves.values())
    )


def _curve(value: Any, where: str, positive: bool = True) -> dict[int, float] | None:
    """A rate curve as JSON writes it ({"64": FLOP/s, ...}) back as {64: FLOP/s}; with
    ``positive`` False, a curve of seconds that may hold 0 (a call cost)."""
    if value is None:
        return None
    if not isinstance(value, dict) or not value:
        raise AttnbenchError(f"{where} must be an object of width: FLOP/s")
    found = {}
    for width, rate in value.items():
        try:
            w = int(width)
        except ValueError:
            raise AttnbenchError(f"{where}: width {width!r} is not a whole number") from None
        number = not isinstance(rate, bool) and isinstance(rate, int | float)
        if not number or not (rate > 0 if positive else rate >= 0) or w < 1:
            what = "a positive rate" if positive else "seconds, 0 or more"
            raise AttnbenchError(f"{where}: {width}: must be {what} (got {rate!r})")
        found[w] = float(rate)
    return found
