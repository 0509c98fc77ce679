"""Every older format attnbench reads, brought to today's here, once, as it is read (pyperf's
way: a file carries its format's version and loading migrates it step by step).

What an older attnbench wrote, and how each shape becomes today's:

- **A results folder** carries ``schema_version`` in run.json. Version 7 added the samples'
  ``blocks_left_out`` (``V6_LATER_SAMPLES``: not recorded before). Version 6 added the energy
  columns (``V5_LATER_RESULTS``: empty, as a run without ``--energy`` writes them). Version 5
  added the samples' ``others_cores`` (``V4_LATER_SAMPLES``: not recorded before). Version 4
  added the compile's columns (``V3_LATER_RESULTS``: a version-3 folder's cases were
  eager), version 3 the decode step's (``V2_LATER_RESULTS``), each filled empty. Version 1
  grew columns and entries over its life without a new version, so a version-1 folder may
  lack any of the
  columns listed in ``V1_LATER_RESULTS``, the samples' later columns, the calibration file,
  a theory's traffic terms, and several run.json entries. ``migrate_run`` fills each with what
  "not recorded" reads as, and stamps the folder ``FORMAT_VERSION``; a folder of today's
  version that lacks a column is damaged, not old.
- **A ceilings file** (or run.json's ceilings) from before the rate curves holds one rate for a
  convolution and one for a fused attention: ``migrate_ceilings`` reads each as a one-point
  curve, and gives the entries added since their "not measured".
- **A partner process of another version** (``ab --base-python`` drives an older attnbench):
  ``partner_message`` gives what it does not send its "not recorded".

No other module handles an older shape: each reads today's (where an entry may be absent in
today's format too, the reader gives it its default, as for any record).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd

from attnbench.errors import AttnbenchError
from attnbench.schema import CALIBRATION_COLUMNS

FORMAT_VERSION = 7  # of a results folder, in run.json's ``schema_version``
# samples.csv's column version 5 added: the cores of other processes' CPU beside the round.
V4_LATER_SAMPLES = ("others_cores",)

# The columns of results.csv added during version 1 (its first release wrote the others).
V1_LATER_RESULTS = (
    "window", "time_ci_low_s", "time_ci_high_s", "time_stop", "rounds", "rounds_disturbed",
    "spread_between", "spread_within", "kernel_time_s", "kernel_share", "kernel_method",
    "time_method", "sm_clock_mhz", "sm_clock_max_mhz", "throttled_share", "seq_steps",
    "seq_steps_method", "path_len", "path_len_method", "node", "device_id", "device_name",
    "attempts", "layer_source", "instructions", "load_1m", "cpu_count", "elementwise",
    "elementwise_analytic", "elementwise_check", "elementwise_method", "uncounted_ops",
    "fused_path", "backend", "bytes", "bytes_analytic", "bytes_check", "product_bytes",
    "kernels", "bytes_method", "ops", "intensity", "counts_source", "peak_bytes_method",
    "page_faults", "major_faults",
)  # fmt: skip
# samples.csv's columns added during version 1, and what a sample without them reads as: its
# case's one round, in the one process a run then had; the rest not recorded.
V1_LATER_SAMPLES = {
    "round": "1",
    "load_1m": "",
    "page_faults": "",
    "sm_clock_mhz": "",
    "process": "0",
    "reference_s": "",
}
# run.json's allocator entry of a run made before it was recorded: glibc's defaults, unnamed.
# The columns version 3 added: a decode step's state and its check (--mode decode).
V2_LATER_RESULTS = ("state_bytes", "state_analytic", "state_check", "decode_check")
# The columns version 4 added: --compile's (every case before it was eager).
V3_LATER_RESULTS = (
    "compiled", "compile_s", "compile_cache", "compile_graphs", "compile_breaks",
    "compile_break_reasons", "compile_recompiles", "compile_check",
)  # fmt: skip
# The columns version 6 added: --energy's (no run before it read the energy counter).
V5_LATER_RESULTS = ("energy_j", "power_w", "energy_method")
# samples.csv's column version 7 added: the blocks a round left out as its heap grew again.
V6_LATER_SAMPLES = ("blocks_left_out",)
UNRECORDED_ALLOCATOR = {"state": "unrecorded", "mechanism": "", "libc": ""}


@dataclass(frozen=True)
class RawRun:
    """A results folder's files as read, before any is typed: run.json, the three tables as text
    (``calibration`` None where the folder has no such file) and theory.json ({}: none)."""

    meta: dict[str, Any]
    results: pd.DataFrame
    samples: pd.DataFrame
    calibration: pd.DataFrame | None
    theories: dict[str, Any]


def folder_version(meta: Mapping[str, Any], where: str) -> int:
    """The format version run.json states, checked to be one this attnbench reads."""
    version = meta.get("schema_version")
    if (
        isinstance(version, bool)
        or not isinstance(version, int)
        or not (1 <= version <= FORMAT_VERSION)
    ):
        newer = isinstance(version, int) and not isinstance(version, bool) and version > 1
        raise AttnbenchError(
            f"{where!r} has results schema version {version!r}; this attnbench reads versions "
            f"1 to {FORMAT_VERSION}" + (" (was it written by a newer attnbench?)" if newer else "")
        )
    return version


def migrate_run(raw: RawRun, where: str) -> RawRun:
    """A folder's files in today's format, whatever version wrote them (one step a version)."""
    version = folder_version(raw.meta, where)
    for step in _STEPS[version - 1 :]:
        raw = step(raw)
    return _with_config_since(raw)


# Keys a sweep's recorded grid gained within a version, with what every run before them ran
# with: --precision (2026-11-30), the interval rounds were added to, ±2% for every run before.
CONFIG_SINCE: dict[str, Any] = {"precision": 0.02}


def _with_config_since(raw: RawRun) -> RawRun:
    config = raw.meta.get("config")
    if not isinstance(config, dict) or CONFIG_SINCE.keys() <= config.keys():
        return raw
    return replace(raw, meta={**raw.meta, "config": {**CONFIG_SINCE, **config}})


def _v1_to_v2(raw: RawRun) -> RawRun:
    results = raw.results.copy()
    unrecorded = [c for c in V1_LATER_RESULTS if c not in results.columns]
    for column in unrecorded:
        results[column] = ""
    samples = raw.samples.copy()
    for column, value in V1_LATER_SAMPLES.items():
        if column not in samples.columns:
            samples[column] = value
    calibration = raw.calibration
    if calibration is None:  # the file came later than the folder
        calibration = pd.DataFrame(columns=CALIBRATION_COLUMNS)
    meta = dict(raw.meta)
    config = dict(meta.get("config") or {})
    rounds = config.pop("rounds", None)  # rounds became processes: one each
    if rounds is not None:  # as many rounds as asked, never more
        config.setdefault("processes", rounds)
        config.setdefault("max_processes", rounds)
    config.setdefault("allocator", "system")  # before --allocator: glibc's defaults
    meta["config"] = config
    if "status" not in meta:  # before the status was written: a finished run has an end
        meta["status"] = "complete" if meta.get("end_time") else "running"
    meta.setdefault("resumes", [])
    meta.setdefault("layers", {})
    meta.setdefault("ab", 0)
    if not meta.get("allocator"):
        meta["allocator"] = dict(UNRECORDED_ALLOCATOR)
    meta["unrecorded"] = unrecorded  # a run says which columns it did not record
    meta["schema_version"] = 2
    layers = raw.theories.get("layers")
    theories = raw.theories
    if isinstance(layers, dict):  # a theory's traffic terms came with the bytes' formulas
        theories = {**theories, "layers": {k: _with_traffic(v) for k, v in layers.items()}}
    return replace(
        raw,
        meta=meta,
        results=results,
        samples=samples,
        calibration=calibration,
        theories=theories,
    )


def _with_traffic(entry: Any) -> Any:
    theory = entry.get("theory") if isinstance(entry, dict) else None
    if not isinstance(theory, dict):
        return entry
    return {**entry, "theory": {"traffic": None, **theory}}


def _with_columns(raw: RawRun, columns: tuple[str, ...], version: int, known: str = "") -> RawRun:
    """The folder with ``columns`` it lacks added empty and said unrecorded (but ``known``,
    whose empty value is what such a folder meant), stamped ``version``."""
    results = raw.results.copy()
    added = [c for c in columns if c not in results.columns]
    for column in added:
        results[column] = ""
    meta = dict(raw.meta)
    meta["unrecorded"] = [*meta.get("unrecorded", []), *(c for c in added if c != known)]
    meta["schema_version"] = version
    return replace(raw, meta=meta, results=results)


def _v2_to_v3(raw: RawRun) -> RawRun:
    return _with_columns(raw, V2_LATER_RESULTS, 3)


def _v3_to_v4(raw: RawRun) -> RawRun:
    # every case of such a run was eager: "compiled" empty is known, the rest not recorded
    return _with_columns(raw, V3_LATER_RESULTS, 4, known="compiled")


def _v4_to_v5(raw: RawRun) -> RawRun:
    samples = raw.samples.copy()
    for column in V4_LATER_SAMPLES:  # not read before: no round is left out for it
        if column not in samples.columns:
            samples[column] = ""
    meta = {**raw.meta, "schema_version": 5}
    return replace(raw, meta=meta, samples=samples)


def _v5_to_v6(raw: RawRun) -> RawRun:
    # no run before read the energy counter: empty is what it would have written, not unknown
    results = raw.results.copy()
    for column in V5_LATER_RESULTS:
        if column not in results.columns:
            results[column] = ""
    return replace(raw, meta={**raw.meta, "schema_version": 6}, results=results)


def _v6_to_v7(raw: RawRun) -> RawRun:
    samples = raw.samples.copy()
    for column in V6_LATER_SAMPLES:  # left out before too, but not counted: not recorded
        if column not in samples.columns:
            samples[column] = ""
    return replace(raw, meta={**raw.meta, "schema_version": 7}, samples=samples)


_STEPS = (
    _v1_to_v2,
    _v2_to_v3,
    _v3_to_v4,
    _v4_to_v5,
    _v5_to_v6,
    _v6_to_v7,
)  # _STEPS[v - 1] takes v to v + 1
assert len(_STEPS) == FORMAT_VERSION - 1


# ----------------------------------------------------------------------------- ceilings

# Before the rate curves: a convolution's and a fused attention's single rate, each read as a
# one-point curve of its kind (null in files written since, and not written now).
SINGLE_RATES = {"conv_flops_per_s": "conv_rates", "attention_flops_per_s": "attention_rates"}
# The entries added since the first ceilings files (None: not measured).
LATER_CEILINGS = (
    "gemm_rates", "conv_rates", "attention_rates", "recurrent_rates", "recurrent_call_s",
    "elementwise_rates", "host_op_s",
)  # fmt: skip


def migrate_ceilings(data: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Ceilings' JSON (a file, or run.json's record) in today's shape; one clear error for a
    single rate that is not a positive number."""
    found = dict(data)
    for single, curve in SINGLE_RATES.items():
        rate = found.pop(single, None)
        if rate is None:
            continue
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not rate > 0:
            raise AttnbenchError(f"{where}: {single} must be a positive number (got {rate!r})")
        if found.get(curve) is None:
            found[curve] = {"1": rate}
    for key in LATER_CEILINGS:
        found.setdefault(key, None)
    # Until 2026-12-02 the peak was the square GEMM's own rate, which a curve could beat: it
    # is the square's (``ceilings_file.ceilings_from`` reads the peak by today's rule).
    found.setdefault("square_flops_per_s", found.get("peak_flops_per_s"))
    return found


# ----------------------------------------------------------------------------- partners

# What a partner of another version may not send, by message, and what it reads as: a
# timing's stop, clocks, faults and references, a result's load and process, not recorded; a
# worker's allocator, unrecorded. (A calibration it describes by its size alone: the kernel's
# other fields take their defaults.)
_PARTNER_DEFAULTS: dict[str, dict[str, Any]] = {
    "timing": {
        "stop": None,
        "clocks_mhz": None,
        "faults": None,
        "major_faults": None,
        "references_s": None,
        "others_cores": None,
        "waited_s": 0.0,
        "left_out": None,
    },
    "done": {"load_1m": None, "process": "", "ended": ""},
    "worker": {"allocator": UNRECORDED_ALLOCATOR},
}


def partner_message(kind: str, data: Mapping[str, Any]) -> dict[str, Any]:
    """A message of ``kind`` from a partner process with every entry today's reader reads
    (those it did not send take what "not recorded" reads as)."""
    defaults = _PARTNER_DEFAULTS[kind]
    found = dict(data)
    for key, value in defaults.items():
        if found.get(key) is None:
            found[key] = value.copy() if isinstance(value, dict) else value
    return found
