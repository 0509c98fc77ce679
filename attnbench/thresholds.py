"""The regression gate's settings: when a difference counts, and what makes a comparison fail.

``Thresholds`` holds the allowed slowdown, the test's alpha, the fewest samples, the allowed
memory growth and whether times are normalised; ``GATE_OPTIONS`` is the table of the command
line's gate options (``compare``, ``sweep --baseline``), with their defaults read from
``Thresholds``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from attnbench.errors import AttnbenchError

# Which verdicts make a comparison fail, by --fail-on.
GATES = ("all", "deterministic", "time", "none")


def check_gate(gate: str) -> str:
    """``gate`` when it is one of ``GATES``; a one-line error naming them otherwise."""
    if gate not in GATES:
        raise AttnbenchError(f"--fail-on {gate!r}: accepted: {', '.join(GATES)}")
    return gate


@dataclass(frozen=True)
class Thresholds:
    """When a difference counts: the allowed slowdown (a fraction), the test's alpha, the
    fewest samples per side, the allowed peak-memory growth, and whether to normalise."""

    max_slowdown: float = 0.10
    alpha: float = 0.01
    min_samples: int = 5
    memory_tolerance: float = 0.0
    normalize: bool = False
    # Instruction counts repeat to about 0.2%: a growth within this is not a regression.
    instructions_tolerance: float = 0.01

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 1:
            raise AttnbenchError(f"--alpha must lie between 0 and 1, got {self.alpha}")
        if min(self.max_slowdown, self.memory_tolerance, self.instructions_tolerance) < 0:
            raise AttnbenchError(
                "--max-slowdown, --memory-tolerance and --instructions-tolerance cannot be negative"
            )
        if self.min_samples < 2:
            raise AttnbenchError(f"--min-samples must be at least 2, got {self.min_samples}")


DEFAULT_THRESHOLDS = Thresholds()


def parse_fraction(text: str | float, name: str) -> float:
    """``10%`` or ``0.1`` as 0.1; anything else is a one-line error naming the option."""
    raw = str(text).strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        value = math.nan
    # 1.5 is a ratio (50%) or 150%: ask, not guess (a fraction is under 1)
    if math.isfinite(value) and not raw.endswith("%") and value >= 1:
        # a ratio past 10 is no one's threshold: "200" is 200 percent, not a ratio of 200
        percent = f"{value:g}% for {value:g} percent"  # "--precision 2" meant 2% most likely
        hint = (
            f"write {percent}, {value - 1:.0%} for a ratio of {value:g}, or {value:.0%}"
            if value < 10
            else f"write {percent}"
        )
        raise AttnbenchError(f"{name} {raw!r}: a fraction is under 1 (0.05 is 5%); {hint}")
    if not math.isfinite(value):
        raise AttnbenchError(
            f"{name} {raw!r}: write a percentage such as 10% (or a fraction such as 0.1)"
        )
    if value < 0:
        raise AttnbenchError(f"{name} {raw!r} must be a percentage of at least 0%")
    return value


def _percent(value: float) -> str:
    return f"{value:.0%}"


@dataclass(frozen=True)
class GateOption:
    """One option of the regression gate (``compare``, ``sweep --baseline``): its key (and
    ``--key``), what the command line reads, how that becomes a ``Thresholds`` field, and help.
    Its default is the ``Thresholds`` field's (``--fail-on``'s: ``GATES[0]``)."""

    key: str
    kind: type
    parse: Callable[[Any], Any]
    help: str
    show: Callable[[Any], str] | None = str  # how the help writes the default (None: not at all)

    @property
    def default(self) -> Any:
        found = [f.default for f in fields(Thresholds) if f.name == self.key]
        return found[0] if found else GATES[0]

    @property
    def full_help(self) -> str:
        if self.show is None:
            return self.help
        return f"{self.help} Default: {self.show(self.default)}."


GATE_OPTIONS: tuple[GateOption, ...] = (
    GateOption(
        "max_slowdown",
        str,
        lambda v: parse_fraction(v, "--max-slowdown"),
        "Allowed time growth before a case can regress: a percentage (10%) or fraction.",
        _percent,
    ),
    GateOption(
        "alpha", float, float, "Significance level of the one-sided test on the samples or rounds."
    ),
    GateOption(
        "min_samples", int, int, "Fewest timing samples a side for a time verdict (else: too few)."
    ),
    GateOption(
        "memory_tolerance",
        str,
        lambda v: parse_fraction(v, "--memory-tolerance"),
        "Allowed peak-memory growth (same device only).",
        _percent,
    ),
    GateOption(
        "instructions_tolerance",
        str,
        lambda v: parse_fraction(v, "--instructions-tolerance"),
        "Allowed growth of instructions per call (--metric instructions).",
        _percent,
    ),
    GateOption(
        "normalize",
        bool,
        bool,
        "Judge times divided by each run's calibration GEMM, so runs on different "
        "machines compare (both ratios are shown either way).",
        None,
    ),
    GateOption(
        "fail_on",
        str,
        check_gate,
        "What fails (exit 1): all; deterministic (FLOPs, steps, path, memory); time; "
        "none (report only). A case that stops measuring fails all but none.",
    ),
)


def gate_from(options: Mapping[str, Any]) -> tuple[Thresholds, str]:
    """The thresholds and the ``--fail-on`` gate from gate option values (None: default)."""
    given = {o.key: o.parse(options[o.key]) for o in GATE_OPTIONS if options.get(o.key) is not None}
    gate = given.pop("fail_on", GATES[0])
    return Thresholds(**given), gate


def cases_to_judge(alpha: float) -> int:
    """The fewest pairs (or cases) whose one-sided signed-rank test can reach ``alpha``: its
    smallest p over k of them is 0.5^k, and a verdict needs p under alpha (5 at 0.05, 7 at
    0.01, 8 at 2^-7). Below it every time verdict is "too few samples" (``judge_pairs``,
    ``judge_overall``)."""
    cases = 1
    while 0.5**cases >= alpha:  # alpha is above 0 (``Thresholds``): 0.5^k falls under it
        cases += 1
    return cases


def rounds_to_reach(alpha: float, slack: float = 8) -> int:
    """Pairs enough for the one-sided signed-rank test to reach ``alpha`` with room to spare:
    0.5^pairs <= alpha / slack. With slack 8 (the default) it still does when the two smallest
    pairs go the other way (10 pairs at alpha = 0.01: all one way give p = 0.001, those two
    against it p = 0.005); with slack 1, only when every pair goes one way (7 pairs)."""
    return math.ceil(math.log2(slack / alpha))
