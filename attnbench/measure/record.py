"""What one measured case produces: ``CaseResult``, and its row in the results table."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from attnbench.layers.registry import REGISTRY
from attnbench.measure.counts.flops import flops_agree
from attnbench.measure.timing.clocks import median_clock, throttled_share
from attnbench.measure.timing.loop import TimingStats
from attnbench.schema import COLUMN, RESULT_COLUMNS, Status
from attnbench.spec import Case

# What a process killed inside a case leaves behind; ``resume`` records that case with this error.
DIED_ERROR = "the process died while measuring this case (killed, or out of memory?)"
# How a case whose worker died on both tries is recorded (the reason follows).
WORKER_DIED_ERROR = "the worker died while measuring this case, twice"


def died_in(error: object) -> bool:
    """Whether a stored row's error says its process died in the case (results.csv has no
    column of its own for it): read once, where a run is loaded (``RunResults.died_cases``)."""
    text = error if isinstance(error, str) else ""
    return text == DIED_ERROR or text.startswith(WORKER_DIED_ERROR)


def timing_columns(timing: TimingStats | None) -> dict[str, Any]:
    """The results columns that a case's timing statistics fill (empty when it was not timed)."""
    t = timing
    low, high = t.ci_s if t else (None, None)
    found = t.estimate if t else None
    stop = t.overall_stop if t else None
    return {
        "time_s": t.median_s if t else None,
        "time_iqr_s": t.iqr_s if t else None,
        "time_ci_low_s": None if low is None or math.isnan(low) else low,
        "time_ci_high_s": None if high is None or math.isnan(high) else high,
        "time_stop": stop.value if stop else None,
        "rounds": found.groups if found else None,
        "rounds_disturbed": found.disturbed if found else None,
        "spread_between": _finite(found.between_rel) if found else None,
        "spread_within": _finite(found.within_rel) if found else None,
        "samples": t.count if t else None,
        "calls_per_sample": t.calls_per_sample if t else None,
        "time_total_s": t.total_s if t else None,
        "page_faults": t.page_faults if t else None,
        "major_faults": t.major_per_call if t else None,
    }


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _check(counted: int | None, analytic: float | None) -> str:
    """A count against its formula: ok within 1%, mismatch, "no theory", or "" (not counted)."""
    if counted is None:
        return ""
    if analytic is None:
        return "no theory"
    return "ok" if flops_agree(counted, analytic) else "mismatch"


@dataclass(frozen=True)
class CaseResult:
    """Everything measured for one case; ``timing`` keeps the raw samples.

    A field named like a results column fills that column (see ``to_row``).
    """

    case: Case
    status: Status
    threads: int
    timing: TimingStats | None = None
    peak_bytes: int | None = None
    flops: int | None = None
    flops_analytic: float | None = None
    seq_steps: int | None = None
    seq_steps_method: str = ""
    path_len: int | None = None
    path_len_method: str = ""
    wall_s: float | None = None
    error: str = ""
    node: str = ""
    device_id: str = ""
    device_name: str = ""
    layer_source: str = ""
    instructions: int | None = None  # per call, counted by Callgrind (--metric instructions)
    load_1m: float | None = None  # the machine's 1-minute load average when it was measured
    cpu_count: int | None = None
    elementwise: int | None = None  # elements, one forward call (measure.counts.elementwise)
    elementwise_analytic: float | None = None
    elementwise_method: str = ""  # "traced", or "none: <why>" when it could not be counted
    uncounted_ops: str = ""  # ops no counter could read (measure.counts.ops.Uncounted.describe)
    fused_path: str = ""  # fused ops the timed call ran, which the counts saw through
    backend: str = ""  # the convolution implementations it ran (measure.counts.ops.BACKENDS)
    bytes: int | None = None  # read and written by one call (measure.counts.traffic)
    bytes_method: str = ""  # "traced", or "none: <why>" when it could not be counted
    ops: int | None = None  # aten ops one call dispatched, views excluded (measure.counts.traffic)
    product_bytes: int | None = None  # the part of bytes the matrix products moved
    bytes_analytic: float | None = None  # from the layer's traffic formula (forward only)
    kernels: str = ""  # products, kind@width:FLOPs:bytes; elementwise ops, ew.op:elements:bytes
    counts_source: str = ""  # "traced", "cache" (measure.counts.countcache) or "extended"
    peak_bytes_method: str = ""  # "measured" at n, or "extended: <law>" (measure.counts.extend)
    attempts: int | None = None  # workers that measured it: 2 when the first died in it
    kernel_share: float | None = None  # the kernels' share of a call (measure.timing.split)
    kernel_method: str = ""  # how it was read, or "none: <why>"
    died: bool = False  # its process died in it (not a column: the error says so)
    time_method: str = ""  # what a sample timed (measure.timing.gputimers)
    sm_clock_max_mhz: float | None = None  # the device's maximum SM clock (measure.timing.clocks)
    state_bytes: int | None = None  # a decode step's state, from its tensors (measure.decode)
    state_analytic: float | None = None  # the same from the layer's decode theory
    decode_check: float | None = None  # decoded tokens against the parallel causal output
    compile_s: float | None = None  # --compile: the first call, the compile included
    compile_cache: str = ""  # hit, miss or mixed: inductor's on-disk cache (measure.compiled)
    compile_graphs: int | None = None
    compile_breaks: int | None = None
    compile_break_reasons: str = ""
    compile_recompiles: int | None = None  # graphs compiled again while it was timed
    compile_check: float | None = None  # the compiled output against the eager layer's
    energy_j: float | None = None  # joules a call, from the GPU's counter (measure.timing.energy)
    power_w: float | None = None  # the GPU's mean draw over the energy pass
    energy_method: str = ""  # how they were read, or "none: <why>"; "" without --energy

    @property
    def sm_clock_mhz(self) -> float | None:
        """The median SM clock over the timed samples (None: not read)."""
        return None if self.timing is None else median_clock(self.timing.clocks_mhz or ())

    @property
    def throttled_share(self) -> float | None:
        """The share of samples taken below ``THROTTLED_BELOW`` of the maximum clock."""
        if self.timing is None:
            return None
        return throttled_share(self.timing.clocks_mhz or (), self.sm_clock_max_mhz)

    @property
    def flops_per_s(self) -> float | None:
        if self.timing is None or self.flops is None or self.timing.median_s <= 0:
            return None
        return self.flops / self.timing.median_s

    @property
    def kernel_time_s(self) -> float | None:
        """Seconds per call the kernels ran: their measured share of the median time."""
        if self.timing is None or self.kernel_share is None:
            return None
        return self.kernel_share * self.timing.median_s

    @property
    def intensity(self) -> float | None:
        """Counted FLOPs per counted byte (None without both, or with no bytes)."""
        if self.flops is None or not self.bytes:
            return None
        return self.flops / self.bytes

    @property
    def flops_check(self) -> str:
        """ok or mismatch (counted against analytic); "no theory" for a layer without one;
        "incomplete" when ops with no formula went uncounted, whatever the theory says."""
        if self.flops is not None and self.uncounted_ops:
            return "incomplete"
        return _check(self.flops, self.flops_analytic)

    @property
    def elementwise_check(self) -> str:
        """The same check for the elementwise work."""
        return _check(self.elementwise, self.elementwise_analytic)

    @property
    def bytes_check(self) -> str:
        """The same check for the bytes moved."""
        return _check(self.bytes, self.bytes_analytic)

    @property
    def state_check(self) -> str:
        """The same check for a decode step's state."""
        return _check(self.state_bytes, self.state_analytic)

    def to_row(self) -> dict[str, Any]:
        """The case's row: ``RESULT_COLUMNS`` in order (the case's own columns, its timing's,
        the derived ones, every field named like a column), then its layer's options."""
        values: dict[str, Any] = {
            **self.case.columns(),
            **timing_columns(self.timing),
            "flops_per_s": self.flops_per_s,
            "flops_check": self.flops_check,
            "elementwise_check": self.elementwise_check,
            "bytes_check": self.bytes_check,
            "state_check": self.state_check,
            "intensity": self.intensity,
            "kernel_time_s": self.kernel_time_s,
            "sm_clock_mhz": self.sm_clock_mhz,
            "throttled_share": self.throttled_share,
        }
        values.update({f.name: getattr(self, f.name) for f in fields(self) if f.name in COLUMN})
        known = REGISTRY.get(self.case.layer)
        if not values["layer_source"] and known is not None:
            values["layer_source"] = known.source.describe()
        missing = [name for name in RESULT_COLUMNS if name not in values]
        if missing:  # a column added to the registry that nothing measures yet
            raise KeyError(f"no value for results column(s) {', '.join(missing)}")
        options = self.case.option_values  # a plugin's own options, beyond the fixed columns
        return {**{name: values[name] for name in RESULT_COLUMNS}, **options}
