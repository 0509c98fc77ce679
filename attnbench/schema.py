"""The column registry: every column of a results table, and the statuses a row records, named once.

The writer and the loader read ``COLUMNS`` (name, type, group); the summary tables read each
column's header and format. What is fitted, judged and charted among them is the metric
registry's (``attnbench.metrics``). Adding a column means adding it here and measuring it;
nothing else spells the vocabulary.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final, Literal

import pandas as pd

from attnbench.units import fmt_bytes, fmt_count, fmt_seconds

if sys.version_info >= (3, 11):
    from enum import StrEnum as StrEnum  # re-exported: the enums elsewhere use it
else:  # Python 3.10: the same, by hand

    class StrEnum(str, Enum):
        """Members that are their values wherever printed, as 3.11's ``enum.StrEnum``."""

        def __str__(self) -> str:
            return str(self.value)

        def __format__(self, spec: str) -> str:
            return str(self.value).__format__(spec)


Kind = Literal["int", "float", "text"]
Group = Literal["case", "measure", "structure", "placement", "source"]


def numeric_column(frame: pd.DataFrame, name: str) -> pd.Series:
    """A results column as floats: text and blanks read as NaN, and an absent column as all
    NaN."""
    if name not in frame:
        return pd.Series(math.nan, index=frame.index, dtype=float)
    return pd.to_numeric(frame[name], errors="coerce")


def fmt_int(value: Any) -> str:
    """A count, or "-" when missing."""
    return "-" if value is None or pd.isna(value) else str(int(value))


def fmt_share(value: Any) -> str:
    """A share as a whole percentage, or "-" when missing."""
    return "-" if value is None or pd.isna(value) else f"{float(value):.0%}"


@dataclass(frozen=True)
class Column:
    """One column of ``results.csv`` and of the loaded table."""

    name: str
    kind: Kind
    group: Group
    doc: str
    summary: str = ""  # its header in the summary tables ("": not shown there)
    fmt: Callable[[Any], str] = str  # how the summary tables write a value


_CASE: Final = "case"
_MEASURE: Final = "measure"
_STRUCTURE: Final = "structure"
_PLACEMENT: Final = "placement"
_EXTENDED = (
    "extended: <law> (a long recurrent case traced at short lengths and extended by a law "
    "proven there; --full-trace traces it at n)"
)

COLUMNS: tuple[Column, ...] = (
    Column("case_id", "text", _CASE, "the case's identity: layer, sizes, options, device"),
    Column("layer", "text", _CASE, "layer name"),
    Column("n", "int", _CASE, "sequence length"),
    Column("d", "int", _CASE, "width"),
    Column("k", "int", _CASE, "convolution kernel (empty for layers without one)"),
    Column("heads", "int", _CASE, "attention heads (empty for layers without them)"),
    Column("window", "int", _CASE, "restricted attention: neighbours each side"),
    Column("batch", "int", _CASE, "batch size"),
    Column("dtype", "text", _CASE, "float32, float16 or bfloat16"),
    Column("device", "text", _CASE, "the device the case was asked for"),
    Column("mode", "text", _CASE,
           "forward, train (forward + backward) or decode (one generation step after n tokens)"),
    Column(
        "compiled", "text", _CASE,
        "torch.compile's arguments the layer was compiled with (--compile: its mode, and "
        "dynamic, static or fullgraph); empty: eager",
    ),
    Column("threads", "int", _MEASURE, "CPU threads torch used"),
    Column("status", "text", _MEASURE, "ok, oom, timeout, skipped or failed (STATUSES)"),
    Column(
        "time_s", "float", _MEASURE,
        "seconds per call: the samples' median in one round; over several rounds (each a "
        "fresh process), the geometric mean of the rounds' medians, rounds taken on a "
        "disturbed machine left out (estimators.estimate)",
        summary="time", fmt=fmt_seconds,
    ),
    Column(
        "time_iqr_s", "float", _MEASURE, "interquartile range of the samples, seconds",
    ),
    Column(
        "time_ci_low_s", "float", _MEASURE,
        "the 95% interval a re-run's time lands in, lower end, seconds: a Student-t "
        "prediction interval on the logs of the rounds' medians (one round: order statistics "
        "of its samples, empty under 6)",
    ),
    Column(
        "time_ci_high_s", "float", _MEASURE, "its upper end, seconds",
        summary="±95%", fmt=fmt_seconds,
    ),
    Column(
        "time_stop", "text", _MEASURE,
        "which rule ended the sampling: precise (the 95% interval within the target of the "
        "time), budget (--time-budget spent first), max samples, max rounds (as many "
        "rounds as a sweep adds, the interval still wider than the target), or code changed "
        "(a resume found its layer's code changed since its rounds began)",
    ),
    Column(
        "rounds", "int", _MEASURE,
        "timing rounds the time is over, each a fresh process under --executor fork "
        "(samples.csv's process column names them)",
    ),
    Column(
        "rounds_disturbed", "int", _MEASURE,
        "rounds whose machine reference read the machine disturbed (a neighbour slowing "
        "small ops) or whose threads waited over a quarter of a core's worth for a CPU "
        "(samples.csv's others_cores), left out of the time while two quiet rounds remain",
    ),
    Column(
        "spread_between", "float", _MEASURE,
        "how far the rounds' medians spread: the standard deviation of their logs (about a "
        "relative spread)", summary="between", fmt=fmt_share,
    ),
    Column(
        "spread_within", "float", _MEASURE,
        "how far one round's samples spread: its IQR / 1.349 over its median (the median "
        "round's)",
    ),
    Column(
        "kernel_time_s", "float", _MEASURE,
        "seconds per call the call's kernels ran (CPU: the computing aten ops' own time; "
        "CUDA: the device kernels' busy time), from profiled calls outside the timed blocks, "
        "the profiler's own cost taken out; the rest of time_s is overhead",
    ),
    Column(
        "kernel_share", "float", _MEASURE,
        "kernel_time_s / time_s: near 1 where the kernels are the time, low where Python, "
        "module calls, the dispatcher and launches are",
        summary="kernels", fmt=fmt_share,
    ),
    Column(
        "kernel_method", "text", _MEASURE,
        "how kernel_time_s was taken (the profiler, its calls and its correction), or "
        "none: <why>",
    ),
    Column(
        "time_method", "text", _MEASURE,
        "what a sample timed (--timer): blocks (synchronised blocks of back-to-back calls), "
        "kernels (CUDA graph replays, or events behind a held stream where the call cannot "
        "be captured) or cold (each call between CUDA events, the L2 flushed before it)",
    ),
    Column(
        "sm_clock_mhz", "float", _MEASURE,
        "the GPU's SM clock (NVML) over the samples, their median, MHz; empty where it "
        "cannot be read (the CPU, no nvidia-ml-py)",
    ),
    Column(
        "sm_clock_max_mhz", "float", _MEASURE, "the device's maximum SM clock, MHz",
    ),
    Column(
        "throttled_share", "float", _MEASURE,
        "the share of samples taken below 75% of the maximum SM clock (nvbench's threshold): "
        "a time taken there is the card's state, and ab does not call it a regression",
    ),
    Column("samples", "int", _MEASURE, "timing samples, every round together"),
    Column("calls_per_sample", "int", _MEASURE, "calls per timed block (a sample is its mean)"),
    Column("time_total_s", "float", _MEASURE, "seconds spent inside timed calls"),
    Column(
        "peak_bytes", "int", _MEASURE, "peak bytes allocated above the pre-call baseline",
        summary="peak mem", fmt=fmt_bytes,
    ),
    Column(
        "flops", "int", _MEASURE, "FLOPs counted from the real call",
        summary="FLOPs", fmt=fmt_count,
    ),
    Column("flops_analytic", "float", _MEASURE, "FLOPs from the layer's theory"),
    Column(
        "flops_check", "text", _MEASURE,
        "ok, mismatch (counted vs analytic beyond 1%), no theory, or incomplete (ops with no "
        "FLOP formula ran: see uncounted_ops)",
        summary="check",
    ),
    Column(
        "flops_per_s", "float", _MEASURE, "counted FLOPs / median time",
        summary="FLOP/s", fmt=fmt_count,
    ),
    Column("wall_s", "float", _MEASURE,
           "wall seconds for the whole case, overheads included, a wait for a quiet machine not"),
    Column("error", "text", _MEASURE, "first line of the error, when status is not ok"),
    Column(
        "seq_steps", "int", _STRUCTURE, "longest chain of dependent ops in one forward call",
        summary="steps", fmt=fmt_int,
    ),
    Column(
        "seq_steps_method", "text", _STRUCTURE,
        f"traced; {_EXTENDED}; or none: <why>",
    ),
    Column(
        "path_len", "int", _STRUCTURE, "maximum path length in position-mixing steps",
        summary="path", fmt=fmt_int,
    ),
    Column(
        "path_len_method", "text", _STRUCTURE, "measured, extended: <law>, or none: <why>",
    ),
    Column("node", "text", _PLACEMENT, "host name of the machine it ran on"),
    Column("device_id", "text", _PLACEMENT, "the device there: cuda:<i> or cpu"),
    Column(
        "device_name", "text", _PLACEMENT, "its model: what charts and compare group by",
    ),
    Column(
        "attempts", "int", _PLACEMENT,
        "workers that measured it: 1, or 2 when the first died in it (--executor ray) and the "
        "case ran again on another",
    ),
    Column(
        "layer_source", "text", "source",
        "where the layer's code came from: its module or file and version or sha256",
    ),
    Column(
        "instructions", "int", _MEASURE,
        "CPU instructions per call, counted by Valgrind's Callgrind (--metric instructions)",
        summary="instr.", fmt=fmt_count,
    ),
    Column("load_1m", "float", _MEASURE, "the machine's 1-minute load average when the case "
           "was measured"),
    Column("cpu_count", "int", _MEASURE, "CPUs of the machine it was measured on"),
    Column(
        "elementwise", "int", _MEASURE,
        "elementwise work of one forward call: elements of the pointwise ops, and read by the "
        "reductions and softmaxes (counted from the real call)",
        summary="elem.", fmt=fmt_count,
    ),
    Column("elementwise_analytic", "float", _MEASURE, "elementwise work from the layer's theory"),
    Column(
        "elementwise_check", "text", _MEASURE,
        "ok, or mismatch (counted vs analytic beyond 1%)",
    ),
    Column(
        "elementwise_method", "text", _MEASURE,
        f"traced; {_EXTENDED}; or none: <why> when the count could not be taken "
        "(the case is kept)",
    ),
    Column(
        "uncounted_ops", "text", _MEASURE,
        "ops of the call that computed on floating values with no FLOP formula and are not "
        "elementwise work, views, copies or data movement: name xcalls (elements touched)",
    ),
    Column(
        "fused_path", "text", _MEASURE,
        "fused ops the timed call ran (MultiheadAttention fast path, oneDNN/cuDNN RNN kernels) "
        "whose work the counts read on the unfused path, and the one op nn.RNN, nn.GRU or "
        "nn.LSTM issues (rnn_tanh, gru, lstm: its steps run in C++); empty when none ran",
    ),
    Column(
        "backend", "text", _MEASURE,
        "the convolution implementations the timed call ran on the CPU (oneDNN's "
        "mkldnn_convolution, or torch's reference thnn_conv2d / slow_conv_dilated2d, which it "
        "chooses for small inputs), from the memory pass's profile; empty where none ran",
    ),
    Column(
        "bytes", "int", _MEASURE,
        "bytes one call reads and writes, over its aten ops (views excluded; in-place ops read "
        "and write; fused kernels at their boundary): the traffic if nothing stays in cache",
    ),
    Column("bytes_analytic", "float", _MEASURE,
           "bytes one forward call moves by the layer's traffic formula"),
    Column("bytes_check", "text", _MEASURE,
           "ok, or mismatch (counted bytes vs the formula beyond 1%)"),
    Column(
        "product_bytes", "int", _MEASURE,
        "the part of bytes the matrix products (the ops with a FLOP formula) read and write; "
        "the rest is elementwise and copy traffic, memory-bound on any machine",
    ),
    Column(
        "kernels", "text", _MEASURE,
        "every product as kind@width:FLOPs:bytes (gemm, conv, attention: a fused attention "
        "kernel; width: its narrow dimension) and every elementwise op as ew.op:elements:"
        "bytes; each runs at its own measured rate (a product's read at its width)",
    ),
    Column(
        "bytes_method", "text", _MEASURE,
        f"traced; {_EXTENDED}; or none: <why> when the count could not be taken "
        "(the case is kept)",
    ),
    Column(
        "ops", "int", _MEASURE,
        "aten operations the timed call dispatches (views excluded; a fused kernel is one): "
        "each pays the device's per-op latency",
    ),
    Column(
        "intensity", "float", _MEASURE,
        "arithmetic intensity: counted FLOPs per counted byte (the roofline's x axis)",
    ),
    Column(
        "counts_source", "text", _MEASURE,
        "traced: the exact counts (FLOPs, elementwise work, bytes, steps, path length) were "
        "traced for this case; cache: read from the count cache, where the same code traced "
        "the same case before (--no-cache traces every case); extended: traced at short "
        "lengths and extended by a law proven there (the *_method columns say which)",
    ),
    Column(
        "peak_bytes_method", "text", _MEASURE,
        "measured: one call at n; extended: <law> (a long recurrent case's memory pass taken at "
        "short lengths and extended by a law proven there, as its counts are)",
    ),
    Column(
        "state_bytes", "int", _MEASURE,
        "decode mode: the bytes a step's state holds at context n (a key/value cache, an RNN's "
        "hidden state), summed over the state's own tensors",
        summary="state", fmt=fmt_bytes,
    ),
    Column("state_analytic", "float", _MEASURE,
           "decode mode: the state's bytes by the layer's decode theory"),
    Column("state_check", "text", _MEASURE,
           "ok, or mismatch (the state's bytes vs the formula beyond 1%)"),
    Column(
        "decode_check", "float", _MEASURE,
        "decode mode: the largest difference between tokens decoded one by one and the causal "
        "layer's parallel output on the same tokens (a prefix, and the timed step where n is "
        "at most 1023), relative to the output's largest value; over the dtype's tolerance "
        "(1e-4 in float32) the case fails, its measurements kept",
    ),
    Column(
        "compile_s", "float", _MEASURE,
        "--compile: seconds of the first call, the compile included, timed once apart from the "
        "samples (in the first round's process)",
    ),
    Column(
        "compile_cache", "text", _MEASURE,
        "--compile: hit where inductor's on-disk cache held the compiled graphs (compile_s is "
        "then a load, not a compile), miss where it compiled them, empty where it did not say",
    ),
    Column(
        "compile_graphs", "int", _MEASURE,
        "--compile: graphs dynamo compiled in the first two calls (a layer whose first call "
        "changes its own state, as a positional table grown on demand, is compiled again on "
        "the second)",
    ),
    Column(
        "compile_breaks", "int", _MEASURE,
        "--compile: graph breaks (dynamo split the call where it could not trace: each piece "
        "runs compiled, the break between them in Python)",
    ),
    Column(
        "compile_break_reasons", "text", _MEASURE,
        "--compile: why dynamo broke the graph, each reason's first line and count",
    ),
    Column(
        "compile_recompiles", "int", _MEASURE,
        "--compile: graphs compiled again during the timed calls (a guard failed): each a "
        "compile inside the time",
    ),
    Column(
        "compile_check", "float", _MEASURE,
        "--compile: the largest difference between the compiled and the eager layer's output "
        "on the case's input, relative to its largest value; over the dtype's tolerance (1e-4 "
        "in float32) the case fails, its measurements kept",
    ),
    Column(
        "energy_j", "float", _MEASURE,
        "--energy: joules one call draws, from the GPU's NVML energy counter while the call "
        "runs back to back for about half a second after the first round's timed calls (from "
        "one step of the counter to another); empty on the CPU and where the counter cannot "
        "be read",
        summary="J/call", fmt=lambda v: "-" if v is None or pd.isna(v) else f"{float(v):.3g}",
    ),
    Column("power_w", "float", _MEASURE,
           "--energy: the GPU's mean draw in watts over that pass (its idle draw included)"),
    Column("energy_method", "text", _MEASURE,
           "--energy: how energy_j was read, or none: <why> (no counter, a counter that did "
           "not move)"),
    Column(
        "page_faults", "float", _MEASURE,
        "minor page faults per call in the median timed block (getrusage, every thread; "
        "empty on CUDA and MPS, whose tensors live in device memory)",
        summary="faults/call", fmt=fmt_count,  # a mean: 0.5 is a fault every other call
    ),
    Column(
        "major_faults", "float", _MEASURE,
        "major page faults (pages read from disk) per call over the timed blocks",
    ),
)  # fmt: skip  # the registry, one entry to a paragraph
COLUMN = {c.name: c for c in COLUMNS}
RESULT_COLUMNS = [c.name for c in COLUMNS]
# Layer options with a column of their own since the first release; a layer's other options
# get columns after the registry's (``option_columns``).
OPTION_COLUMNS = ["k", "heads", "window"]
SUMMARY_COLUMNS = [c for c in COLUMNS if c.summary]


def columns_of(kind: Kind) -> list[str]:
    return [c.name for c in COLUMNS if c.kind == kind]


# load_1m: the 1-minute load average at the end of the sample's round; page_faults: the
# sample's minor page faults per call; sm_clock_mhz: the GPU's SM clock read after the sample.
# ``process``: the sweep's number for the process that took the sample (0, 1, ... in the order
# processes first measured; every round of a case in one process under --executor serial);
# ``reference_s``: the machine's reference read around the sample's round
# (measure.timing.reference); ``others_cores``: how many cores' worth of the round's threads
# waited for a CPU while it timed, on average, capped past the cores the process left unused
# (measure.timing.contention); ``blocks_left_out``: how many of the round's timed blocks were
# left out of its samples as warm-up, its settled heap grown again in them (over 16 page
# faults a call, measure.timing.loop; empty: not recorded).
SAMPLE_COLUMNS = [
    "case_id", "sample", "time_s", "round", "load_1m", "page_faults", "sm_clock_mhz", "process",
    "reference_s", "others_cores", "blocks_left_out",
]  # fmt: skip
CALIBRATION_COLUMNS = ["point", "before_case", "sample", "time_s"]


class Timer(StrEnum):
    """What a sample times (``--timer``; ``measure.timing.gputimers`` holds the CUDA ones;
    results.csv's ``time_method`` begins with its value).

    ``blocks``: synchronised blocks of back-to-back calls, what a model called in a loop pays
    (torch.utils.benchmark's way). ``kernels``: the kernels alone, as a compiled or captured
    model pays them: replays of a CUDA graph of the call (Triton's ``do_bench_cudagraph``).
    ``cold``: the kernels of one call with a cold L2, the cache flushed before each call and
    its launches queued behind a held stream (Triton's ``do_bench``, nvbench's cold samples).
    """

    BLOCKS = "blocks"
    KERNELS = "kernels"
    COLD = "cold"


class Status(StrEnum):
    """A case's outcome, as the results' ``status`` column holds it."""

    OK = "ok"
    OOM = "oom"
    TIMEOUT = "timeout"
    SKIPPED = "skipped"
    FAILED = "failed"


# The outcomes of a case that broke (a skip is a consequence of one, or a stated skip).
BROKEN = (Status.FAILED, Status.OOM, Status.TIMEOUT)

STATUSES: dict[Status, str] = {
    Status.OK: "measured",
    Status.OOM: "ran out of memory",
    Status.TIMEOUT: "one call took longer than --max-case-seconds",
    Status.SKIPPED: "not run: a smaller case of the same layer broke (failed, crashed, ran out "
    "of memory or time; its error says which), or (decode mode) the layer has no decode step",
    Status.FAILED: "raised an error (see the error column)",
}


def failed_a_check(frame: pd.DataFrame) -> pd.Series:
    """The rows that failed a correctness check (decoded tokens, a compiled output) and keep
    their measurements: failed, with a time (any other failure leaves none)."""
    return (frame["status"] == Status.FAILED) & numeric_column(frame, "time_s").notna()


def first_reasons(frame: pd.DataFrame) -> pd.DataFrame:
    """Each layer's first row without measurements whose error says why (a new user's decode
    sweep said only "skipped": the layer had no decode step)."""
    if "error" not in frame:
        return frame.iloc[0:0]
    errors = frame["error"].where(frame["error"].notna(), "").astype(str)
    unmeasured = (frame["status"] != Status.OK) & numeric_column(frame, "time_s").isna()
    return frame[unmeasured & (errors != "")].drop_duplicates("layer")


# What a smaller case's outcome says of larger ones of its layer: they would fail the same way.
BLOCKING: dict[Status, str] = {Status.OOM: "ran out of memory", Status.TIMEOUT: "ran out of time"}


class RunStatus(StrEnum):
    """A run's state, as run.json's ``status`` holds it."""

    RUNNING = "running"
    COMPLETE = "complete"
    INTERRUPTED = "interrupted"
