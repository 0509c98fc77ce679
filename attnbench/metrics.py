"""The metric registry: every measured quantity that is fitted, judged or charted, named once.

Fits, compare, the CI outputs, the report, the charts and the JSON schemas read ``METRICS``
(display and short names, unit, whether it is exact, what law of the theory predicts it, which
chart draws it). Each metric names a column of the results table (``schema.COLUMNS``, where
what is stored is registered); adding one means adding its column there, its entry here, and
measuring it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Chart:
    """A chart that draws one metric against n, one panel per d (or at the largest d)."""

    name: str  # the file stem and the --metric choice
    description: str
    ylabel: str
    title: str
    theory_note: str = ""  # what the dashed line is ("": no theory line)
    per_d: bool = True  # one panel per d, or one panel at the largest d
    scale_theory: bool = False  # the theory is an order: draw it through the last point


@dataclass(frozen=True)
class Metric:
    """A measured quantity that is fitted, judged and charted."""

    column: str
    display: str  # in words: "peak memory"
    short: str  # in a crowded table cell: "peak"
    unit: str
    exact: bool = False  # the same code measures the same value: compare fails on any increase
    device_bound: bool = False  # exact only between runs on the same device model
    overheads: bool = False  # small sizes carry fixed costs: fit the larger sizes only
    # Which law of a layer's theory predicts it, up to a constant: the FLOP formula, the
    # elementwise formula, their sum (``work``: all the arithmetic of a call, which its time
    # and instructions follow), the bytes formula, the sequential-step law or the path law
    # (None: the theory says nothing of it).
    theory: (
        Literal["flops", "elementwise", "work", "traffic", "sequential", "path", "state"] | None
    ) = None
    chart: Chart | None = None  # its own chart against n (time has several, drawn apart)
    tolerance: str = ""  # the Thresholds field giving the growth allowed ("": none at all)


METRICS: tuple[Metric, ...] = (
    Metric("time_s", "time", "time", "s", overheads=True, theory="work"),
    Metric(
        "peak_bytes", "peak memory", "peak", "bytes", exact=True, device_bound=True,
        overheads=True, tolerance="memory_tolerance",
        chart=Chart(
            "memory",
            "peak memory above baseline against n, a panel per kin of layers at each d",
            "peak memory above baseline [bytes]",
            "Peak memory of one call against sequence length",
        ),
    ),
    Metric(
        "flops", "FLOPs", "FLOPs", "FLOPs", exact=True, theory="flops",
        chart=Chart(
            "flops",
            "counted FLOPs against n, a panel per kin of layers at each d, with the analytic "
            "formula",
            "FLOPs per call (counted)", "FLOPs against sequence length",
            theory_note="analytic formula",
        ),
    ),
    Metric(
        "elementwise", "elementwise work", "elem.", "elements", exact=True, theory="elementwise",
        chart=Chart(
            "elementwise",
            "counted elementwise work against n, a panel per kin of layers at each d, with the "
            "analytic formula",
            "elements per call (counted)", "Elementwise work against sequence length",
            theory_note="analytic formula",
        ),
    ),
    Metric("bytes", "bytes moved", "bytes", "bytes", exact=True, theory="traffic"),
    Metric(
        "state_bytes", "state memory", "state", "bytes", exact=True, theory="state",
        chart=Chart(
            "state", "decode mode: the bytes a step's state holds against the context n, with "
            "the decode theory's formula", "state held at context n [bytes]",
            "State memory of one generation step against context length",
            theory_note="analytic formula",
        ),
    ),
    Metric(
        "seq_steps", "sequential steps", "steps", "steps", exact=True, theory="sequential",
        chart=Chart(
            "seq_steps", "traced sequential steps against n, with the theory's order",
            "sequential steps (traced)", "Sequential operations against sequence length",
            theory_note="theory's order, through the last point", per_d=False,
            scale_theory=True,
        ),
    ),
    Metric(
        "path_len", "path length", "path", "steps", exact=True, theory="path",
        chart=Chart(
            "path_len", "maximum path length against n, with the theory's order",
            "maximum path length (steps)", "Maximum path length against sequence length",
            theory_note="theory's order, through the last point", per_d=False,
            scale_theory=True,
        ),
    ),
    # Counted, not timed: the same code on the same CPU model executes the same instructions,
    # to about 0.2%, however busy the machine is.
    Metric(
        "instructions", "instructions", "instr.", "instructions", exact=True,
        device_bound=True, tolerance="instructions_tolerance", theory="work",
    ),
)  # fmt: skip  # the registry, one entry to a paragraph
METRIC = {m.column: m for m in METRICS}
# What compare judges exactly: device-independent counts first, then what depends on the device.
EXACT_METRICS = [m for m in METRICS if m.exact and not m.device_bound] + [
    m for m in METRICS if m.exact and m.device_bound
]
# The counts that read the same on any device (the same code counted): where any step in a
# history is a change of the code, and a difference between two runs is one too.
DEVICE_FREE_COUNTS = tuple(m.column for m in METRICS if m.exact and not m.device_bound)
