"""Baseline against current: statistics and verdicts per case, and one overall verdict.

A shared CI runner swings timings by 2x between jobs, so one ratio is no verdict. A time
regression here needs both a median ratio above the allowed slowdown and a one-sided
Mann-Whitney U test on the raw samples (scipy) below ``alpha``; the overall row is the
geometric mean of the ratios, tested across cases with a one-sided Wilcoxon signed-rank test.
Deterministic metrics (FLOPs, sequential steps, path length, and peak memory on the same
device) are compared exactly: any increase is a regression. ``normalize`` divides every time by
its run's calibration GEMM, so a baseline from one machine stays comparable on another.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from math import comb
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from attnbench.errors import AttnbenchError
from attnbench.layers.entry import LayerSource
from attnbench.results.environment import compare_keys
from attnbench.results.run import RunResults
from attnbench.schema import EXACT_METRICS, METRIC
from attnbench.spec import OPTIONS
from attnbench.thresholds import DEFAULT_THRESHOLDS, Thresholds, check_gate

# Verdicts, worst first: what a case, a metric or the overall row can be judged.
REGRESSION = "regression"
IMPROVEMENT = "improvement"
UNCHANGED = "unchanged"
NOT_SIGNIFICANT = "not significant"  # past the threshold, but the samples could be noise
TOO_FEW = "too few samples"  # no test at this alpha can be significant with so few
NOT_COMPARED = "not compared"  # missing on a side, not measured, or another device
VERDICTS = (REGRESSION, NOT_SIGNIFICANT, TOO_FEW, UNCHANGED, IMPROVEMENT, NOT_COMPARED)

# ----------------------------------------------------------------------------- verdicts


@dataclass(frozen=True)
class TimeVerdict:
    """One case's time: median ratio current / baseline, the one-sided p-value in the
    direction the median moved (NaN when untested), and the verdict."""

    ratio: float
    p_value: float
    verdict: str


def smallest_p(n_base: int, n_new: int) -> float:
    """The smallest one-sided p-value a Mann-Whitney U test can give with these sample sizes."""
    return 1 / comb(n_base + n_new, n_base)


def judge_time(
    base: Sequence[float], new: Sequence[float], thresholds: Thresholds = DEFAULT_THRESHOLDS
) -> TimeVerdict:
    """Regression when the median is more than ``max_slowdown`` slower *and* the samples are
    slower with p < alpha; improvement symmetrically; "too few samples" when no outcome of the
    test could reach alpha."""
    base_a = np.asarray(base, dtype=float)
    new_a = np.asarray(new, dtype=float)
    if base_a.size == 0 or new_a.size == 0:
        return TimeVerdict(math.nan, math.nan, NOT_COMPARED)
    if min(base_a.size, new_a.size) < thresholds.min_samples:
        return TimeVerdict(_median_ratio(base_a, new_a), math.nan, TOO_FEW)
    return _judge(_median_ratio(base_a, new_a), base_a, new_a, thresholds)


def judge_rounds(
    base: Sequence[Sequence[float]],
    new: Sequence[Sequence[float]],
    thresholds: Thresholds = DEFAULT_THRESHOLDS,
) -> tuple[TimeVerdict, str]:
    """A case timed in rounds: the test compares the rounds' medians (``"rounds"``), each an
    independent look at the machine, when both runs have enough rounds for the test to reach
    alpha; otherwise all samples (``"samples"``). The ratio is of the medians of all samples."""
    if min(len(base), len(new)) >= 2 and smallest_p(len(base), len(new)) < thresholds.alpha:
        flat_base = np.concatenate([np.asarray(r, dtype=float) for r in base])
        flat_new = np.concatenate([np.asarray(r, dtype=float) for r in new])
        base_units = np.array([np.median(r) for r in base])
        new_units = np.array([np.median(r) for r in new])
        ratio = _median_ratio(flat_base, flat_new)
        return _judge(ratio, base_units, new_units, thresholds), "rounds"
    flat = [[s for r in side for s in r] for side in (base, new)]
    return judge_time(flat[0], flat[1], thresholds), "samples"


def _median_ratio(base: np.ndarray, new: np.ndarray) -> float:
    base_median = float(np.median(base))
    return float(np.median(new)) / base_median if base_median > 0 else math.inf


def _judge(
    ratio: float, base_a: np.ndarray, new_a: np.ndarray, thresholds: Thresholds
) -> TimeVerdict:
    """The verdict from a ratio and the units the one-sided test compares."""
    if smallest_p(base_a.size, new_a.size) >= thresholds.alpha:
        return TimeVerdict(ratio, math.nan, TOO_FEW)
    slower = ratio >= 1
    p = float(stats.mannwhitneyu(new_a, base_a, alternative="greater" if slower else "less").pvalue)
    return _verdict(ratio, p, thresholds)


def _verdict(ratio: float, p: float, thresholds: Thresholds) -> TimeVerdict:
    """Past the threshold in the direction the one-sided p-value tested, and significant."""
    slower = ratio >= 1
    limit = 1 + thresholds.max_slowdown
    significant = p < thresholds.alpha
    if slower and ratio > limit:
        return TimeVerdict(ratio, p, REGRESSION if significant else NOT_SIGNIFICANT)
    if not slower and ratio < 1 / limit and significant:
        return TimeVerdict(ratio, p, IMPROVEMENT)
    return TimeVerdict(ratio, p, UNCHANGED)


def judge_overall(
    ratios: Sequence[float], thresholds: Thresholds = DEFAULT_THRESHOLDS
) -> TimeVerdict:
    """The geometric mean of the cases' ratios, tested across cases: a one-sided Wilcoxon
    signed-rank test on the log ratios says whether the cases moved together."""
    logs = np.log(np.asarray([r for r in ratios if r > 0 and math.isfinite(r)], dtype=float))
    if logs.size == 0:
        return TimeVerdict(math.nan, math.nan, NOT_COMPARED)
    geomean = float(np.exp(logs.mean()))
    if 0.5**logs.size >= thresholds.alpha:  # the smallest p of the exact test
        return TimeVerdict(geomean, math.nan, TOO_FEW)
    slower = geomean >= 1
    if not np.any(logs):
        return TimeVerdict(geomean, 1.0, UNCHANGED)
    p = float(stats.wilcoxon(logs, alternative="greater" if slower else "less").pvalue)
    return _verdict(geomean, p, thresholds)


def judge_count(base: Any, new: Any, tolerance: float = 0.0) -> str:
    """An exact metric: any increase beyond ``tolerance`` (a fraction) is a regression."""
    if base is None or new is None or pd.isna(base) or pd.isna(new):
        return NOT_COMPARED
    if new > base * (1 + tolerance):
        return REGRESSION
    if new < base * (1 - tolerance):
        return IMPROVEMENT
    return UNCHANGED


# ----------------------------------------------------------------------------- comparison


@dataclass(frozen=True)
class Comparison:
    """Everything ``attnbench compare`` reports, as tidy tables.

    ``times``: one row per case in both runs (statuses, medians, ratios, p-value, verdict);
    ``counts``: one row per case and exact metric (long format); ``overall``: the raw and, when
    both runs have calibration, the normalised geometric-mean rows.
    """

    baseline: RunResults
    current: RunResults
    thresholds: Thresholds
    times: pd.DataFrame
    counts: pd.DataFrame
    overall: dict[str, TimeVerdict]
    only_baseline: tuple[str, ...] = ()
    only_current: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    calibration: dict[str, float] = field(default_factory=dict)  # base_s, new_s, ratio

    @property
    def by_device(self) -> bool:
        """Whether the runs span several device models (the table then names each case's)."""
        if self.times.empty:
            return False
        names = set(self.times["device_base"]) | set(self.times["device_new"])
        return len(names - {""}) > 1

    @property
    def judged_on(self) -> str:
        """Which times the verdicts judge: ``normalized`` or ``raw``."""
        return "normalized" if self.thresholds.normalize else "raw"

    @property
    def overall_verdict(self) -> TimeVerdict:
        return self.overall[self.judged_on]

    def regressions(self, gate: str = "all") -> list[str]:
        """One line per regression that ``gate`` fails on (see ``GATES``)."""
        if check_gate(gate) == "none":
            return []
        found: list[str] = []
        status = self.times[self.times["status_verdict"] == REGRESSION]
        found += [
            f"{r.case_id}: {r.status_base} -> {r.status_new}" for r in status.itertuples()
        ]  # a case that breaks fails every gate
        if gate in ("all", "time"):
            slow = self.times[self.times["verdict"] == REGRESSION]
            found += [
                f"{r.case_id}: time x{r.ratio_judged:.3f} (p = {r.p_value:.2g})"
                for r in slow.itertuples()
            ]
            overall = self.overall_verdict
            if overall.verdict == REGRESSION:
                found.append(
                    f"OVERALL: geometric mean x{overall.ratio:.3f} (p = {overall.p_value:.2g})"
                )
        if gate in ("all", "deterministic"):
            heavier = self.counts[self.counts["verdict"] == REGRESSION]
            found += [
                f"{r.case_id}: {METRIC[r.metric].display} {r.base:.0f} -> {r.new:.0f}"
                for r in heavier.itertuples()
            ]
        return found

    def failed(self, gate: str = "all") -> bool:
        return bool(self.regressions(gate))


def _environment_warnings(base: RunResults, new: RunResults) -> list[str]:
    """What differs between the runs that changes what the comparison means: the grid's device,
    dtype, mode and batch (recorded by field), the environment keys compare watches, and the
    code of each layer both measured."""
    config_keys = {o.field: o.key for o in OPTIONS if o.compare}
    warnings = []
    for source, keys in (("config", config_keys), ("environment", compare_keys())):
        before: Mapping[str, Any] = base.meta.get(source, {})
        after: Mapping[str, Any] = new.meta.get(source, {})
        for key, label in keys.items():
            if before.get(key) != after.get(key):
                warnings.append(
                    f"{label} differs: {before.get(key)!r} in the baseline, "
                    f"{after.get(key)!r} in the current run"
                )
    return warnings + layer_differences(base.meta.get("layers", {}), new.meta.get("layers", {}))


def layer_differences(
    before: Mapping[str, Mapping[str, str]], after: Mapping[str, Mapping[str, str]]
) -> list[str]:
    """One line per layer whose code differs between two runs' records (run.json ``layers``)."""
    lines = []
    for name in [layer for layer in before if layer in after]:
        old, now = LayerSource(**before[name]), LayerSource(**after[name])
        if old != now:
            lines.append(
                f"layer {name} differs: {old.describe()} in the baseline, "
                f"{now.describe()} in the current run"
            )
    return lines


def _calibration(base: RunResults, new: RunResults, normalize: bool) -> dict[str, float]:
    base_s, new_s = base.calibration_s, new.calibration_s
    same_kernel = base.meta.get("calibration") == new.meta.get("calibration")
    if normalize:
        for run, value in ((base, base_s), (new, new_s)):
            if value is None:
                raise AttnbenchError(
                    f"--normalize: {str(run.path)!r} has no calibration samples (a run made "
                    "before attnbench timed them); re-run it, or compare without --normalize"
                )
        if not same_kernel:
            raise AttnbenchError(
                "--normalize: the two runs timed different calibration kernels "
                f"({base.meta.get('calibration')} and {new.meta.get('calibration')})"
            )
    if base_s is None or new_s is None or not same_kernel:
        return {}
    return {"base_s": base_s, "new_s": new_s, "ratio": new_s / base_s}


def _scales(run: RunResults, run_s: float | None, by_device: bool) -> dict[str, float]:
    """What normalising multiplies a case's times by: one over the median calibration GEMM, per
    device model when the runs span several ("" for the whole run); empty without calibration."""
    if run_s is None:
        return {}
    scales = {"": 1 / run_s}
    if by_device:
        for device in run.devices:
            own = run.for_device(device).calibration_s
            if own is not None:
                scales[device] = 1 / own
    return scales


def compare_runs(
    baseline: RunResults, current: RunResults, thresholds: Thresholds = DEFAULT_THRESHOLDS
) -> Comparison:
    """Judge every case the two runs share; list the cases only one of them has."""
    calibration = _calibration(baseline, current, thresholds.normalize)
    base = baseline.frame.set_index("case_id")
    new = current.frame.set_index("case_id")
    shared = [c for c in base.index if c in new.index]
    only_baseline = tuple(c for c in base.index if c not in new.index)
    only_current = tuple(c for c in new.index if c not in base.index)
    if not shared:
        raise AttnbenchError(
            f"{str(baseline.path)!r} and {str(current.path)!r} have no case in common "
            f"(e.g. {base.index[0] if len(base) else '-'} against "
            f"{new.index[0] if len(new) else '-'}); compare runs of the same grid, dtype and "
            "device"
        )
    warnings = _environment_warnings(baseline, current)
    same_device = baseline.meta.get("environment", {}).get("device_name") == current.meta.get(
        "environment", {}
    ).get("device_name")
    devices = list(dict.fromkeys([*baseline.devices, *current.devices]))
    by_device = len(devices) > 1  # a run spread over device models (a mixed cluster)
    if by_device:
        warnings.append(
            f"the runs span {len(devices)} device models ({', '.join(devices)}): each case is "
            "compared only with the same model"
            + (", normalised by that model's calibration" if thresholds.normalize else "")
        )
    elif not same_device:
        warnings.append("peak memory is compared only between runs on the same device")
    single = [
        name for name, run in (("baseline", baseline), ("current", current)) if run.rounds == 1
    ]
    if single:
        warnings.append(
            f"the {' and the '.join(single)} run{'s' if len(single) > 1 else ''} timed each case "
            "in one round: samples taken back to back cannot show the machine's slower moments, "
            "so a busy moment can pass for a regression; sweep with --rounds 5 or more for CI"
        )
    if only_baseline or only_current:
        warnings.append(
            f"{len(only_baseline)} case(s) only in the baseline and {len(only_current)} only "
            "in the current run are listed, not judged"
        )
    # Empty when the runs cannot be normalised against each other (see _calibration).
    scales_base = _scales(baseline, calibration.get("base_s"), by_device)
    scales_new = _scales(current, calibration.get("new_s"), by_device)
    other_model = 0

    time_rows: list[dict[str, Any]] = []
    count_rows: list[dict[str, Any]] = []
    for case_id in shared:
        b, n = base.loc[case_id], new.loc[case_id]
        device_base, device_new = str(b["device_name"]), str(n["device_name"])
        # Rows name their device model; rows of older runs do not, and the runs' do.
        same_model = device_base == device_new if device_base and device_new else same_device
        ident = {"case_id": case_id, "layer": b["layer"], "n": int(b["n"]), "d": int(b["d"])}
        row: dict[str, Any] = {
            **ident,
            "device_base": device_base,
            "device_new": device_new,
            "status_base": b["status"],
            "status_new": n["status"],
            "status_verdict": UNCHANGED,
        }
        both_ok = b["status"] == "ok" and n["status"] == "ok"
        timed = both_ok and (same_model or not by_device)
        if both_ok and not timed:
            other_model += 1
        if b["status"] == "ok" and n["status"] != "ok":
            row["status_verdict"] = REGRESSION  # it measured before; now it fails or is skipped
        elif b["status"] != "ok" and n["status"] == "ok":
            row["status_verdict"] = IMPROVEMENT
        base_rounds = baseline.rounds_for(case_id) if timed else []
        new_rounds = current.rounds_for(case_id) if timed else []
        norm_base = scales_base.get(device_base, scales_base.get("", math.nan))
        norm_new = scales_new.get(device_new, scales_new.get("", math.nan))
        scale_base, scale_new = (norm_base, norm_new) if thresholds.normalize else (1.0, 1.0)
        judged, unit = judge_rounds(
            [[s * scale_base for s in r] for r in base_rounds],
            [[s * scale_new for s in r] for r in new_rounds],
            thresholds,
        )
        raw_ratio = n["time_s"] / b["time_s"] if both_ok else math.nan
        norm_ratio = raw_ratio * norm_new / norm_base
        row.update(
            time_base_s=b["time_s"] if both_ok else math.nan,
            time_new_s=n["time_s"] if both_ok else math.nan,
            samples_base=sum(len(r) for r in base_rounds),
            samples_new=sum(len(r) for r in new_rounds),
            rounds_base=len(base_rounds),
            rounds_new=len(new_rounds),
            unit=unit if timed else "",
            ratio=raw_ratio,
            ratio_normalized=norm_ratio,
            ratio_judged=judged.ratio,
            p_value=judged.p_value,
            verdict=judged.verdict,
        )
        time_rows.append(row)
        for m in EXACT_METRICS:
            metric = m.column
            comparable = both_ok and (not m.device_bound or same_model)
            tolerance = getattr(thresholds, m.tolerance) if m.tolerance else 0.0
            base_v = float(b[metric]) if comparable and not pd.isna(b[metric]) else math.nan
            new_v = float(n[metric]) if comparable and not pd.isna(n[metric]) else math.nan
            count_rows.append(
                {
                    **ident,
                    "metric": metric,
                    "base": base_v,
                    "new": new_v,
                    "change": new_v / base_v - 1 if base_v else math.nan,
                    "verdict": judge_count(base_v, new_v, tolerance),
                }
            )
    if other_model:
        warnings.append(
            f"{other_model} case(s) ran on another device model in each run: their times are "
            "not compared"
        )
    times = pd.DataFrame(time_rows)
    if by_device:  # grouped by device model, grid order within each
        times = times.sort_values("device_new", kind="stable").reset_index(drop=True)
    ok = times[times["verdict"] != NOT_COMPARED]
    overall = {"raw": judge_overall(ok["ratio"].tolist(), thresholds)}
    if calibration:
        overall["normalized"] = judge_overall(ok["ratio_normalized"].tolist(), thresholds)
    return Comparison(
        baseline=baseline,
        current=current,
        thresholds=thresholds,
        times=times,
        counts=pd.DataFrame(count_rows),
        overall=overall,
        only_baseline=only_baseline,
        only_current=only_current,
        warnings=tuple(warnings),
        calibration=calibration,
    )
