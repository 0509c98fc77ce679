"""A comparison's outputs for people and for CI: display table, Markdown, JSON verdicts, the
github-action-benchmark list, and the GitHub job summary.

Every output is built from one ``Comparison``, so the terminal, the job summary and the JSON
never disagree. ``FORMATS`` holds one renderer per output format: ``compare``, ``sweep
--baseline`` and any later command that judges runs choose from it, so a new format is one
function and one entry.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any, cast

import pandas as pd

from attnbench.compare import (
    NOT_COMPARED,
    NOT_SIGNIFICANT,
    REGRESSION,
    THROTTLED,
    TOO_FEW,
    UNCHANGED,
    Comparison,
    TimeVerdict,
    cases_to_judge,
)
from attnbench.compare.verdicts import fmt_interval, interval_level
from attnbench.metrics import DEVICE_FREE_COUNTS, EXACT_METRICS, METRIC
from attnbench.render.blocks import Block
from attnbench.render.blocks import to_markdown as blocks_to_markdown
from attnbench.schema import Status
from attnbench.thresholds import Thresholds
from attnbench.units import fmt_bytes, fmt_count, fmt_seconds

JSON_SCHEMA_ID = "attnbench-compare/1"
STEP_SUMMARY_ENV = "GITHUB_STEP_SUMMARY"


def schema(name: str) -> dict[str, Any]:
    """A JSON Schema shipped with the package: ``compare`` or ``github-action-benchmark``.
    The compare schema's per-case ``metrics`` object requires exactly the registry's exact
    metrics (the shipped file lists them too; a test keeps the two equal)."""
    text = resources.files("attnbench").joinpath(f"schemas/{name}.schema.json").read_text()
    loaded = json.loads(text)
    if name == "compare":
        metrics = loaded["properties"]["cases"]["items"]["properties"]["metrics"]
        metrics["required"] = [m.column for m in EXACT_METRICS]
    return cast("dict[str, Any]", loaded)


def _ratio(x: float) -> str:
    return "–" if x is None or math.isnan(x) else f"{x:.3f}"


def _p(x: float) -> str:
    return "–" if x is None or math.isnan(x) else f"{x:.2g}"


def _amount(metric: str, value: float) -> str:
    return fmt_bytes(value) if METRIC[metric].unit == "bytes" else fmt_count(value)


@dataclass(frozen=True)
class RowMark:
    """How a terminal marks one row of ``display_table``: its time's verdict and whether an
    exact count regressed, read from the comparison, never from the row's words."""

    time: str  # REGRESSION, IMPROVEMENT, or another verdict
    exact_regressed: bool = False


def row_marks(comparison: Comparison) -> list[RowMark]:
    """One mark per row of ``display_table``, in its order (the OVERALL row last)."""
    counts = comparison.counts
    regressed = set(counts.loc[counts["verdict"] == REGRESSION, "case_id"])
    marks = []
    for r in comparison.times.itertuples():
        worse = REGRESSION in (r.verdict, r.status_verdict)
        healthy = r.status_base == Status.OK and r.status_new == Status.OK
        time = REGRESSION if worse else (r.verdict if healthy else NOT_COMPARED)
        marks.append(RowMark(str(time), r.case_id in regressed))
    marks.append(RowMark(str(comparison.overall_verdict.verdict)))
    return marks


# The exact counts that read the same on any device, named from the registry (a note had named
# three of the six, and a new user's elementwise and bytes regressions looked unexplained).
_COUNTED = ", ".join(METRIC[column].display for column in DEVICE_FREE_COUNTS)


def count_changes(comparison: Comparison, case_id: str) -> str:
    """The exact metrics of one case in a few words: "same", or what moved and by how much."""
    rows = comparison.counts[comparison.counts["case_id"] == case_id]
    moved = []
    for r in rows.itertuples():
        if r.verdict in (UNCHANGED, NOT_COMPARED):
            continue
        sign = "+" if r.new > r.base else ""
        mark = "!" if r.verdict == REGRESSION else ""
        change = f" ({sign}{r.change:.1%})" if math.isfinite(r.change) else ""  # from 0: none
        moved.append(
            f"{mark}{METRIC[r.metric].short} {_amount(r.metric, r.base)} -> "
            f"{_amount(r.metric, r.new)}{change}"
        )
    if moved:
        return "; ".join(moved)
    if (rows["verdict"] == NOT_COMPARED).all():
        return "–"
    return "same"


def _case_verdict(row: Any, thresholds: Thresholds) -> str:
    if row.status_verdict == REGRESSION:
        why = f": {row.error_new}" if row.error_new else ""  # why it broke: a blank read none
        return f"REGRESSION ({row.status_base} -> {row.status_new}{why})"
    if row.status_base != Status.OK or row.status_new != Status.OK:
        return f"not compared ({row.status_base} -> {row.status_new})"
    if row.verdict == UNCHANGED and row.p_value < thresholds.alpha:
        return f"{UNCHANGED} {_within(row, thresholds)}"
    if row.verdict == NOT_SIGNIFICANT and row.p_value < thresholds.alpha:
        return f"{NOT_SIGNIFICANT} {_reaching(row, thresholds)}"
    return "REGRESSION" if row.verdict == REGRESSION else row.verdict


def _within(row: Any, thresholds: Thresholds) -> str:
    """What an "unchanged" that its test found significant moved by (a +4.5% slowdown at p <
    0.01 read plain "unchanged"), by the ratio the test judged (the pairs', or with
    --normalize the calibrated one: a normalized +9.1% had read "+0.6%, significant")."""
    ratio = row.ratio_judged
    moved = abs(ratio - 1)
    way = f"{'+' if ratio >= 1 else '-'}{moved:.1%}" if moved >= 0.001 else "by under 0.1%"
    basis = "normalized, " if thresholds.normalize else ""
    limit = thresholds.max_slowdown
    # an improvement is a ratio under 1 / (1 + limit): -9.1%, not -10%, beside +10%
    bound = f"under the +{limit:.0%}" if ratio >= 1 else f"short of the -{1 - 1 / (1 + limit):.1%}"
    return f"({basis}{way}, significant; {bound} threshold)"


def _reaching(row: Any, thresholds: Thresholds) -> str:
    """A move its test found whose interval reaches past the threshold (``_bounded``)."""
    basis = "normalized, " if thresholds.normalize else ""
    return (
        f"past +{thresholds.max_slowdown:.0%} ({basis}{row.ratio_judged - 1:+.1%}, significant;"
        f" its interval reaches {row.ratio_high - 1:+.1%})"
    )


UNJUDGED = (NOT_COMPARED, THROTTLED)  # verdicts the overall row leaves out


def display_table(comparison: Comparison) -> pd.DataFrame:
    """One row of strings per shared case, then the OVERALL row: what people read."""
    normalized = bool(comparison.calibration)
    level = f"{interval_level(comparison.thresholds.alpha)} CI"  # the test's dual interval
    level += " (norm.)" if comparison.thresholds.normalize else ""  # of the ratio judged
    # ab's is its pairs' median ratio: 1.067 read beside a current time under the baseline's
    ratio = "pairs' ratio" if comparison.paired else "ratio"
    rows = []
    for r in comparison.times.itertuples():
        row = {"layer": r.layer}
        if comparison.by_device:
            moved = r.device_new != r.device_base
            row["device"] = f"{r.device_base} -> {r.device_new}" if moved else r.device_new
        row |= {
            "n": str(r.n),
            "d": str(r.d),
            "baseline": fmt_seconds(r.time_base_s),
            "current": fmt_seconds(r.time_new_s),
            # the ratio judged, its interval's and p's (2.650 here read x2.598 in a verdict)
            ratio: _ratio(r.ratio if comparison.thresholds.normalize else r.ratio_judged),
        }
        if normalized:  # under --normalize, the judged ratio is the normalised one
            judged = r.ratio_judged if comparison.thresholds.normalize else r.ratio_normalized
            row["norm. ratio"] = _ratio(judged)
        row[level] = fmt_interval(r.ratio_low, r.ratio_high) or "–"  # of the judged ratio
        exact = count_changes(comparison, r.case_id)
        if r.kernel_base != r.kernel_new:  # torch chose another kernel: why the time moved
            exact += f"; kernel {r.kernel_base or 'none'} -> {r.kernel_new or 'none'}"
        row.update(p=_p(r.p_value), time=_case_verdict(r, comparison.thresholds), exact=exact)
        rows.append(row)
    overall: Mapping[str, TimeVerdict] = comparison.overall
    judged = comparison.overall_verdict
    last = {"layer": "OVERALL"}
    if comparison.by_device:
        last["device"] = ""
    last |= {
        "n": "",
        "d": "",
        "baseline": "",
        # the cases judge_overall took: neither uncompared nor throttled (compare.runs)
        "current": f"geomean of {int((~comparison.times['verdict'].isin(UNJUDGED)).sum())}",
        ratio: _ratio(overall["raw"].ratio),
    }
    if normalized:
        last["norm. ratio"] = _ratio(overall["normalized"].ratio)
    last[level] = ""
    verdict = "REGRESSION" if judged.verdict == REGRESSION else judged.verdict
    if judged.verdict == TOO_FEW:  # across cases: one case with a verdict read "too few samples"
        verdict = f"too few cases (needs {cases_to_judge(comparison.thresholds.alpha)})"
    last.update(p=_p(judged.p_value), time=verdict, exact="")
    rows.append(last)
    return pd.DataFrame(rows)


def headline(comparison: Comparison, gate: str) -> str:
    found = comparison.regressions(gate)
    cases = len(comparison.times)
    if not found:
        undecided = comparison.undecided(gate)
        return (
            f"no regression shown: {undecided}"
            if undecided
            else f"no regression in {cases} shared cases"
        )
    gating = "" if comparison.failed(gate) else f", not gating (--fail-on {gate})"
    return f"{len(found)} regression(s) in {cases} shared cases{gating}"


def method_note(comparison: Comparison) -> str:
    t = comparison.thresholds
    basis = (
        "times divided by each run's calibration GEMM (--normalize)" if t.normalize else "raw times"
    )
    if comparison.paired:
        test = (
            "a one-sided Wilcoxon signed-rank test with p < {alpha:g} on the ratios of the pairs, "
            "each pair a round of the two sides measured back to back (ABBA order); the ratio is "
            "the median of those ratios"
        )
    else:
        test = (
            "a one-sided Welch t-test with p < {alpha:g} on the logs of the timing rounds' "
            "medians (each round a process; the case's spread between this machine's sweeps "
            "added where the runs record it) where both runs have two rounds or more, else a "
            "one-sided Mann-Whitney U test on the raw samples (at least "
            f"{t.min_samples} a side)"
        )
    note = (
        f"A time regression needs a median ratio above {1 + t.max_slowdown:.2f} and "
        + test.format(alpha=t.alpha)
        + "; OVERALL is the geometric mean of the ratios, tested with a one-sided Wilcoxon "
        f"signed-rank test. Each p is one-sided in the direction its ratio moved (a speed-up's "
        f"p tests faster, not slower). Judged on {basis}. The exact counts ({_COUNTED}) fail on "
        "any increase"
    )
    note += (
        f", peak memory on growth above {t.memory_tolerance:.1%}"
        if t.memory_tolerance
        else ", peak memory on any increase (same device only)"
    )
    note += f", instructions on growth above {t.instructions_tolerance:.1%}."
    if comparison.calibration:
        c = comparison.calibration
        note += (
            f" Calibration GEMM: {fmt_seconds(c['base_s'])} in the baseline, "
            f"{fmt_seconds(c['new_s'])} now (x{c['ratio']:.3f}); the normalised ratio divides "
            "by it."
        )
    return note


def _run_line(label: str, run: Any) -> str:
    env = run.record.environment
    commit = (env.get("git_commit") or "")[:10] or "no commit"
    dirty = " (dirty)" if env.get("git_dirty") else ""
    return (
        f"{label}: `{run.path}`, {run.record.start_time or '?'}, {commit}{dirty}, "
        f"{env.get('device_name', '?')}, torch {env.get('torch_version', '?')}"
    )


def blocks(comparison: Comparison, gate: str = "all") -> list[Block]:
    """The comparison as report blocks (heading, runs, method, warnings, table, lists)."""
    out = [
        # ab's pairs, or two runs compared (ab's summary was headed "attnbench compare")
        Block(
            "h2",
            f"attnbench {'ab' if comparison.paired else 'compare'}: {headline(comparison, gate)}",
        ),
        Block(
            "list",
            items=(
                _run_line("baseline", comparison.baseline),
                _run_line("current", comparison.current),
            ),
        ),
        Block("p", method_note(comparison)),
    ]
    if comparison.warnings:
        out.append(Block("list", items=tuple(f"warning: {w}" for w in comparison.warnings)))
    out.append(Block("table", table=display_table(comparison)))
    found = comparison.regressions(gate)
    if found:
        gating = "" if comparison.failed(gate) else ", not gating"
        out += [
            Block("p", f"Regressions (--fail-on {gate}{gating}):"),
            Block("list", items=tuple(found)),
        ]
    for label, cases in (
        ("Only in the baseline", comparison.only_baseline),
        ("Only in the current run", comparison.only_current),
    ):
        if cases:
            out += [Block("p", f"{label} ({len(cases)}):"), Block("list", items=by_length(cases))]
    return out


def by_length(case_ids: Sequence[str]) -> tuple[str, ...]:
    """Case ids that differ only in n, one line each: "rnn/n=512,1024/d=64/…" (a sweep
    compared with a shorter one has dozens only on one side, which one line each buried)."""
    lengths: dict[tuple[str, ...], list[str]] = {}
    for case_id in case_ids:
        parts = case_id.split("/")
        at = next((i for i, p in enumerate(parts) if p.startswith("n=")), None)
        key = tuple(parts) if at is None else (*parts[:at], "n=", *parts[at + 1 :])
        lengths.setdefault(key, []).append("" if at is None else parts[at][2:])
    lines = []
    for key, ns in lengths.items():
        joined = "n=" + ",".join(ns)
        lines.append("/".join(joined if part == "n=" else part for part in key))
    return tuple(lines)


def to_markdown(comparison: Comparison, gate: str = "all") -> str:
    return blocks_to_markdown(blocks(comparison, gate))


def _num(value: Any) -> Any:
    """JSON numbers: NaN and NA become null, numpy scalars plain Python."""
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return None
    if hasattr(value, "item"):
        return value.item()
    return value


def _verdict_json(v: TimeVerdict) -> dict[str, Any]:
    return {"ratio": _num(v.ratio), "p_value": _num(v.p_value), "verdict": v.verdict}


def to_json(comparison: Comparison, gate: str = "all") -> dict[str, Any]:
    """Machine-readable verdicts; validated against ``schema("compare")`` in the tests."""
    counts = comparison.counts
    cases = []
    for r in comparison.times.to_dict(orient="records"):
        mine = counts[counts["case_id"] == r["case_id"]]
        cases.append(
            {
                **{key: _num(value) for key, value in r.items()},
                "metrics": {
                    m.metric: {
                        "base": _num(m.base),
                        "new": _num(m.new),
                        "change": _num(m.change),
                        "verdict": m.verdict,
                    }
                    for m in mine.itertuples()
                },
            }
        )
    t = comparison.thresholds
    found = comparison.regressions(gate)
    return {
        "schema": JSON_SCHEMA_ID,
        "baseline": {"path": str(comparison.baseline.path), **_side(comparison.baseline)},
        "current": {"path": str(comparison.current.path), **_side(comparison.current)},
        "thresholds": asdict(t),
        "judged_on": comparison.judged_on,
        "calibration": dict(comparison.calibration) or None,
        "warnings": list(comparison.warnings),
        "cases": cases,
        "overall": {key: _verdict_json(v) for key, v in comparison.overall.items()},
        "only_baseline": list(comparison.only_baseline),
        "only_current": list(comparison.only_current),
        "gate": gate,
        "regressions": found,
        "failed": comparison.failed(gate),
        "undecided": comparison.undecided(gate),
    }


def _side(run: Any) -> dict[str, Any]:
    env = run.record.environment
    return {
        "start_time": run.record.start_time,
        "git_commit": env.get("git_commit"),
        "device_name": env.get("device_name"),
        "torch_version": env.get("torch_version"),
    }


def github_action_benchmark(comparison: Comparison) -> list[dict[str, Any]]:
    """The current run in the ``customSmallerIsBetter`` format of github-action-benchmark:
    per measured case its median time (ms), its time in calibration GEMMs when the run has
    them, and its peak memory (bytes); the baseline's figures and the verdict go in ``extra``."""
    run = comparison.current
    judged = comparison.times.set_index("case_id")
    calibration_s = run.calibration_s
    entries: list[dict[str, Any]] = []
    for r in run.measured.itertuples():
        extra = f"{r.samples} samples"
        if r.case_id in judged.index:
            j = judged.loc[r.case_id]
            # the ratio the verdict judged, as the table names it: an ab case's is its pairs'
            # median, not current over baseline (a new user's read 1.030 beside a value under
            # the baseline), and its times are over the pairs' rounds, not this value's
            paired = j["unit"] == "pairs"
            normalized = comparison.thresholds.normalize
            kind = "paired " if paired else "normalised " if normalized else ""
            ratio = f"{kind}ratio {_ratio(j['ratio_judged'])}"  # the table's, the p's
            over = (
                f", current {fmt_seconds(j['time_new_s'])}, over the pairs' rounds"
                if paired
                else ""
            )
            extra = (
                f"baseline {fmt_seconds(j['time_base_s'])}{over}, {ratio}, "
                f"p {_p(j['p_value'])}: {j['verdict']}; {extra}"
            )
        entries.append(
            {
                "name": f"{r.case_id} time",
                "unit": "ms",
                "value": float(r.time_s) * 1e3,
                "range": f"IQR {float(r.time_iqr_s) * 1e3:.4g}",
                "extra": extra,
            }
        )
        if calibration_s:
            entries.append(
                {
                    "name": f"{r.case_id} time in calibration GEMMs",
                    "unit": "GEMM",
                    "value": float(r.time_s) / calibration_s,
                    "range": f"IQR {float(r.time_iqr_s) / calibration_s:.4g}",
                    "extra": f"calibration GEMM {fmt_seconds(calibration_s)} in this run",
                }
            )
        if not pd.isna(r.peak_bytes):
            entries.append(
                {
                    "name": f"{r.case_id} peak memory",
                    "unit": "bytes",
                    "value": int(r.peak_bytes),
                    "range": "exact",
                    "extra": f"{fmt_bytes(r.peak_bytes)} above the pre-call baseline",
                }
            )
    return entries


def append_step_summary(markdown: str, environ: Mapping[str, str] | None = None) -> Path | None:
    """Append to the file named by ``$GITHUB_STEP_SUMMARY`` (GitHub's job summary); nothing
    when the variable is unset or empty. Returns the file written."""
    environ = os.environ if environ is None else environ
    target = environ.get(STEP_SUMMARY_ENV, "")
    if not target:
        return None
    path = Path(target)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(markdown.rstrip("\n") + "\n\n")
    return path


@dataclass(frozen=True)
class VerdictFormat:
    """One way to print a comparison: its renderer, and what it is for (--format's help)."""

    render: Callable[[Comparison, str], str]  # (comparison, --fail-on) -> the text
    help: str
    step_summary: bool = False  # also appended to GitHub's job summary, when there is one


def _json_text(value: Any) -> str:
    return json.dumps(value, indent=2) + "\n"


FORMATS: dict[str, VerdictFormat] = {
    "markdown": VerdictFormat(
        to_markdown,
        "the table as Markdown, also appended to $GITHUB_STEP_SUMMARY when that is set",
        step_summary=True,
    ),
    "json": VerdictFormat(
        lambda c, gate: _json_text(to_json(c, gate)),
        "the verdicts as JSON (attnbench/schemas/compare.schema.json)",
    ),
    "github-action-benchmark": VerdictFormat(
        lambda c, gate: _json_text(github_action_benchmark(c)),
        "the customSmallerIsBetter list github-action-benchmark reads",
    ),
}
