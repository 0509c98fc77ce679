"""Baseline against current: statistics and verdicts per case, and one overall verdict.

``verdicts`` holds the statistics of one case (and of a run overall); ``runs`` matches two runs
case by case and builds the ``Comparison`` that every output format renders.
"""

from attnbench.compare.caveats import layer_differences
from attnbench.compare.runs import Comparison, compare_runs
from attnbench.compare.verdicts import (
    IMPROVEMENT,
    NOT_COMPARED,
    NOT_SIGNIFICANT,
    REGRESSION,
    THROTTLED,
    TOO_FEW,
    UNCHANGED,
    VERDICTS,
    TimeVerdict,
    judge_count,
    judge_overall,
    judge_pairs,
    judge_rounds,
    judge_time,
    smallest_p,
)
from attnbench.thresholds import cases_to_judge

__all__ = [
    "IMPROVEMENT",
    "NOT_COMPARED",
    "NOT_SIGNIFICANT",
    "REGRESSION",
    "THROTTLED",
    "TOO_FEW",
    "UNCHANGED",
    "VERDICTS",
    "Comparison",
    "TimeVerdict",
    "cases_to_judge",
    "compare_runs",
    "judge_count",
    "judge_overall",
    "judge_pairs",
    "judge_rounds",
    "judge_time",
    "layer_differences",
    "smallest_p",
]
