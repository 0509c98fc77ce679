"""Two runs matched case by case and judged: the tables ``compare`` and ``ab`` report.

Cases are matched by id (``compare``), or in given pairs (``ab`` matches its base and current
layers by position). Normalising divides every time by its run's calibration GEMM, so a baseline
from one machine stays comparable on another.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from attnbench.compare.caveats import (
    CALIBRATION_APART,
    busy_warnings,
    calibration_of,
    check_finished,
    environment_warnings,
    normalizing_scales,
    undecided_words,
)
from attnbench.compare.verdicts import (
    IMPROVEMENT,
    NOT_COMPARED,
    REGRESSION,
    THROTTLED,
    TOO_FEW,
    UNCHANGED,
    TimeVerdict,
    fmt_interval,
    interval_level,
    judge_count,
    judge_overall,
    judge_pairs,
    judge_rounds,
    pair_rounds,
    pairs_note,
    quiet_pairs_note,
    throttle,
)
from attnbench.errors import AttnbenchError
from attnbench.estimators import estimate
from attnbench.measure.counts.ops import RECURRENT_OPS, fused_names
from attnbench.metrics import EXACT_METRICS, METRIC
from attnbench.results.run import RunResults
from attnbench.schema import Status
from attnbench.thresholds import DEFAULT_THRESHOLDS, Thresholds, check_gate


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
    paired: bool = False  # judged on the pairs of an interleaved run (attnbench ab)

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
        """One line per regression that ``gate`` fails on (see ``GATES``); under ``none``,
        those ``all`` finds, shown but failing nothing (``failed``): "no regression" beside
        a table of regressions misled a record job's readers."""
        gate = "all" if check_gate(gate) == "none" else gate
        found: list[str] = []
        status = self.times[self.times["status_verdict"] == REGRESSION]
        found += [
            f"{r.case_id}: {r.status_base} -> {r.status_new}" for r in status.itertuples()
        ]  # a case that breaks fails every gate
        if gate in ("all", "time"):
            normalized = " (normalized)" if self.thresholds.normalize else ""
            slow = self.times[self.times["verdict"] == REGRESSION]
            found += [
                f"{r.case_id}: time{normalized} x{r.ratio_judged:.3f}{self._within(r)} "
                f"(p = {r.p_value:.2g})"
                for r in slow.itertuples()
            ]
            overall = self.overall_verdict
            if overall.verdict == REGRESSION:
                found.append(
                    f"OVERALL: geometric mean{normalized} x{overall.ratio:.3f} "
                    f"(p = {overall.p_value:.2g})"
                )
        if gate in ("all", "deterministic"):
            heavier = self.counts[self.counts["verdict"] == REGRESSION]
            found += [
                f"{r.case_id}: {METRIC[r.metric].display} {r.base:.0f} -> {r.new:.0f}"
                for r in heavier.itertuples()
            ]
        return found

    def undecided(self, gate: str = "all") -> str:
        """Where ``gate`` judges time and found no regression, the cases whose time it could
        not decide, in words ("" where none: ``caveats.undecided_words``); under any gate,
        the baseline's cases the current run lacks (a layer dropped from a CI config, or one
        that no longer imports, read plain "no regression")."""
        gate = "all" if check_gate(gate) == "none" else gate
        if self.regressions(gate):
            return ""
        words = (
            undecided_words(self.times, self.thresholds, self.paired)
            if gate != "deterministic"
            else ""
        )
        if self.only_baseline:
            gone = f"{len(self.only_baseline)} baseline case(s) not in the current run, not judged"
            words = f"{words}; {gone}" if words else gone
        return words

    def _within(self, row: Any) -> str:
        """ " (98% CI 1.21..1.52)" where a case's ratio has an interval, else ""."""
        found = fmt_interval(row.ratio_low, row.ratio_high)
        return f" ({interval_level(self.thresholds.alpha)} CI {found})" if found else ""

    def failed(self, gate: str = "all") -> bool:
        """Whether ``gate`` fails on what was found (never under ``none``)."""
        return check_gate(gate) != "none" and bool(self.regressions(gate))


def _kernels(row: pd.Series, recorded: bool) -> str:
    """The fused paths and convolution implementations a case's timed call ran, by name
    ("mkldnn_convolution, mkldnn_rnn_layer"; empty where none, or not recorded): a change
    between two runs (torch choosing another kernel) explains a change of time."""
    if not recorded:
        return ""
    names: set[str] = set()
    for column in ("fused_path", "backend"):
        text = row.get(column)
        if isinstance(text, str):
            names |= fused_names(text) - RECURRENT_OPS  # the module's op, not a kernel choice
    return ", ".join(sorted(names))


def _clock_ratio(base: pd.Series, new: pd.Series) -> float:
    """The current side's median SM clock over the base side's (NaN where either was not
    read: the CPU, a run that did not read them)."""
    values = [row.get("sm_clock_mhz") for row in (base, new)]
    if any(v is None or pd.isna(v) or not v > 0 for v in values):
        return math.nan
    return float(values[1]) / float(values[0])


def _share(row: pd.Series) -> float | None:
    value = row.get("throttled_share")
    return None if value is None or pd.isna(value) else float(value)


def _over_rounds(rounds: Mapping[int, list[float]], pairs: list[int]) -> float:
    """A time over the rounds ``pairs`` as a run's ``time_s`` is (``estimators.estimate``'s
    centre, every round kept): the geometric mean of their medians. An ab table's columns: a
    side's ``time_s`` leaves out the disturbed halves its pairs judge, and under a busy
    neighbour read 925 µs -> 537 µs beside a paired ratio of 1.29."""
    return estimate([rounds[r] for r in pairs]).center_s if pairs else math.nan


def _scaled(rounds: Mapping[int, list[float]], scale: float) -> dict[int, list[float]]:
    return {round_: [s * scale for s in samples] for round_, samples in rounds.items()}


@dataclass(frozen=True)
class _Sides:
    """What judging one pair of cases needs of the two runs, worked out once for all pairs."""

    baseline: RunResults
    current: RunResults
    base: pd.DataFrame  # the runs' rows by case id
    new: pd.DataFrame
    thresholds: Thresholds
    paired: bool
    same_device: bool  # the runs name the same device model
    by_device: bool  # a run spread over device models (a mixed cluster)
    scales_base: dict[str, float]  # what normalising multiplies times by, per model
    scales_new: dict[str, float]
    recorded: bool  # both runs recorded the kernels they ran


def compare_runs(
    baseline: RunResults,
    current: RunResults,
    thresholds: Thresholds = DEFAULT_THRESHOLDS,
    *,
    pairs: Sequence[tuple[str, str]] | None = None,
    paired: bool = False,
) -> Comparison:
    """Judge every case the two runs share; list the cases only one of them has.

    ``pairs`` (base case id, current case id) matches cases otherwise than by id (``ab`` races
    two layers against each other); ``paired`` judges time on the paired per-round ratios of an
    interleaved run instead of comparing the two runs' samples.
    """
    check_finished(baseline, current)
    if pairs is None and (raced := _raced(baseline, current)):  # judged as ab judged them
        pairs, paired = raced, True
    calibration = calibration_of(baseline, current, thresholds.normalize)
    base, new = baseline.frame.set_index("case_id"), current.frame.set_index("case_id")
    shared, only_baseline, only_current = _matched(baseline, current, base, new, pairs)
    devices = list(dict.fromkeys([*baseline.devices, *current.devices]))
    sides = _Sides(
        baseline=baseline,
        current=current,
        base=base,
        new=new,
        thresholds=thresholds,
        paired=paired,
        same_device=baseline.record.environment.get("device_name")
        == current.record.environment.get("device_name"),
        by_device=(by_device := len(devices) > 1),
        # Empty when the runs cannot be normalised against each other (calibration_of).
        scales_base=normalizing_scales(baseline, calibration.get("base_s"), by_device),
        scales_new=normalizing_scales(current, calibration.get("new_s"), by_device),
        # The kernels a case ran are compared only where both runs recorded the convolution's
        # (``backend``): a run that did not would read as a change of kernel.
        recorded=not {"backend"} & {*baseline.record.unrecorded, *current.record.unrecorded},
    )
    warnings = _warnings(sides, devices, shared, (len(only_baseline), len(only_current)))
    speed = calibration.get("ratio")
    if (
        speed is not None
        and not thresholds.normalize
        and not 1 / CALIBRATION_APART < speed < CALIBRATION_APART
    ):
        warnings.append(
            f"the calibration kernel, timed between the cases, ran {speed:.2f}x the baseline's "
            "time in the current run: the machine ran at another speed, which these raw "
            "verdicts do not tell from the code (--normalize divides it out)"
        )
    time_rows: list[dict[str, Any]] = []
    count_rows: list[dict[str, Any]] = []
    other_model = 0
    for base_id, case_id in shared:
        row, counts, timed = _judged_pair(sides, base_id, case_id)
        time_rows.append(row)
        count_rows += counts
        other_model += row["status_base"] == row["status_new"] == Status.OK and not timed
    times = pd.DataFrame(time_rows)
    warnings += [n for n in (pairs_note(times), quiet_pairs_note(times)) if n is not None]
    if other_model:
        warnings.append(
            f"{other_model} case(s) ran on another device model in each run: their times are "
            "not compared"
        )
    if by_device:  # grouped by device model, grid order within each
        times = times.sort_values("device_new", kind="stable").reset_index(drop=True)
    ok = times[~times["verdict"].isin((NOT_COMPARED, THROTTLED))]
    # The whole is judged on the ratios the table shows, each case's judged one (an interleaved
    # run's pairs', not two pooled medians, which a machine's change of state moves).
    raw = "ratio" if thresholds.normalize and not paired else "ratio_judged"
    overall = {"raw": judge_overall(ok[raw].tolist(), thresholds)}
    if calibration:
        shown = "ratio_judged" if thresholds.normalize else "ratio_normalized"
        overall["normalized"] = judge_overall(ok[shown].tolist(), thresholds)
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
        paired=paired,
    )


def _raced(baseline: RunResults, current: RunResults) -> list[tuple[str, str]]:
    """The pairs of cases the two sides of one ``ab`` run raced (run.json's ``ab_pairs``),
    its base and current side in one folder; none for two other runs (two ab runs of one grid
    raced nothing against each other)."""
    raced = baseline.meta.get("ab_pairs") or []
    one = baseline.path.resolve().parent == current.path.resolve().parent
    one &= (baseline.meta.get("ab"), current.meta.get("ab")) == (0, 1)
    return [(b, c) for b, c in raced] if one and raced == current.meta.get("ab_pairs") else []


def _matched(
    baseline: RunResults,
    current: RunResults,
    base: pd.DataFrame,
    new: pd.DataFrame,
    pairs: Sequence[tuple[str, str]] | None,
) -> tuple[list[tuple[str, str]], tuple[str, ...], tuple[str, ...]]:
    """The pairs of cases both runs have, and the cases only one of them has; one line where
    they share none."""
    if pairs is None:
        pairs = [(c, c) for c in base.index if c in new.index]
    shared = [(b, n) for b, n in pairs if b in base.index and n in new.index]
    only_baseline = tuple(c for c in base.index if c not in {b for b, _ in shared})
    only_current = tuple(c for c in new.index if c not in {n for _, n in shared})
    if not shared:
        raise AttnbenchError(
            f"{str(baseline.path)!r} and {str(current.path)!r} have no case in common "
            f"(e.g. {base.index[0] if len(base) else '-'} against "
            f"{new.index[0] if len(new) else '-'}); compare runs of the same grid, dtype and "
            "device"
        )
    return shared, only_baseline, only_current


def _warnings(
    sides: _Sides,
    devices: list[str],
    shared: Sequence[tuple[str, str]],
    only: tuple[int, int],
) -> list[str]:
    """What a reader of the comparison should know before its verdicts."""
    warnings = environment_warnings(sides.baseline, sides.current, sides.paired)
    if sides.by_device:
        warnings.append(
            f"the runs span {len(devices)} device models ({', '.join(devices)}): each case is "
            "compared only with the same model"
            + (", normalised by that model's calibration" if sides.thresholds.normalize else "")
        )
    elif not sides.same_device:
        warnings.append("peak memory is compared only between runs on the same device")
    single = [
        name
        for name, run in (("baseline", sides.baseline), ("current", sides.current))
        if run.rounds == 1
    ]
    if single and not sides.paired:
        warnings.append(
            f"the {' and the '.join(single)} run{'s' if len(single) > 1 else ''} timed each case "
            "in one round: samples taken back to back cannot show the machine's slower moments, "
            "so a busy moment can pass for a regression; sweep with --processes 5 or more for CI"
        )
    if not sides.paired:  # ab counts its disturbed pairs instead (pairs_note)
        warnings += busy_warnings(sides.baseline, sides.current, shared)
    only_base, only_new = only
    if only_base or only_new:
        warnings.append(
            f"{only_base} case(s) only in the baseline and {only_new} only "
            "in the current run are listed, not judged"
        )
    return warnings


def _judged_pair(
    sides: _Sides, base_id: str, case_id: str
) -> tuple[dict[str, Any], list[dict[str, Any]], bool]:
    """One pair of cases judged: its time row, its exact counts' rows, and whether its times
    were compared (both measured, on the same device model)."""
    thresholds = sides.thresholds
    b, n = sides.base.loc[base_id], sides.new.loc[case_id]
    device_base, device_new = str(b["device_name"]), str(n["device_name"])
    # Rows name their device model; where a row does not (not recorded), the runs' do.
    same_model = device_base == device_new if device_base and device_new else sides.same_device
    layer = b["layer"] if b["layer"] == n["layer"] else f"{b['layer']} -> {n['layer']}"
    ident = {"case_id": case_id, "layer": layer, "n": int(b["n"]), "d": int(b["d"])}
    row: dict[str, Any] = {
        **ident,
        "device_base": device_base,
        "device_new": device_new,
        **_statuses(b, n, sides.recorded),
    }
    both_ok = b["status"] == Status.OK and n["status"] == Status.OK
    timed = both_ok and (same_model or not sides.by_device)
    if b["status"] == Status.OK and n["status"] != Status.OK:
        row["status_verdict"] = REGRESSION  # it measured before; now it fails or is skipped
    elif b["status"] != Status.OK and n["status"] == Status.OK:
        row["status_verdict"] = IMPROVEMENT
    norm_base = sides.scales_base.get(device_base, sides.scales_base.get("", math.nan))
    norm_new = sides.scales_new.get(device_new, sides.scales_new.get("", math.nan))
    scale_base, scale_new = (norm_base, norm_new) if thresholds.normalize else (1.0, 1.0)
    # the rounds each time is over (those read disturbed left out); ab judges every pair
    base_of, new_of = sides.baseline.rounds_of, sides.current.rounds_of
    if not sides.paired:
        base_of, new_of = sides.baseline.kept_rounds_of, sides.current.kept_rounds_of
    base_rounds = _scaled(base_of(base_id), scale_base) if timed else {}
    new_rounds = _scaled(new_of(case_id), scale_new) if timed else {}
    disturbed, quiet, quiet_rounds, pairs = 0, "", list[int](), list[int]()
    if sides.paired:  # every pair judged; those with a disturbed half counted
        marks = (sides.baseline.disturbed_of(base_id), sides.current.disturbed_of(case_id))
        pairs, quiet_rounds = pair_rounds(base_rounds, new_rounds, marks)
        disturbed = len(pairs) - len(quiet_rounds)
        judged, unit = judge_pairs(base_rounds, new_rounds, thresholds), "pairs"
    else:
        judged, unit = judge_rounds(
            list(base_rounds.values()),
            list(new_rounds.values()),
            thresholds,
            sides.current.between.get(case_id) or sides.baseline.between.get(base_id),
        )
    clocks = _clock_ratio(b, n) if timed else math.nan
    judged = throttle(judged, clocks, (_share(b), _share(n)), thresholds.max_slowdown)
    if disturbed and judged.verdict in (REGRESSION, IMPROVEMENT):  # the quiet pairs' too
        base_q, new_q = ({r: side[r] for r in quiet_rounds} for side in (base_rounds, new_rounds))
        quiet = judge_pairs(base_q, new_q, thresholds).verdict if quiet_rounds else TOO_FEW
    # each side's own time where it measured: a case that broke blanked the baseline's too
    time_base, time_new = (s["time_s"] if s["status"] == Status.OK else math.nan for s in (b, n))
    if sides.paired and timed and pairs:  # over the pairs' rounds, as the ratio (_over_rounds)
        time_base = _over_rounds(base_of(base_id), pairs)
        time_new = _over_rounds(new_of(case_id), pairs)
    raw_ratio = time_new / time_base if both_ok else math.nan
    row.update(
        time_base_s=time_base,
        time_new_s=time_new,
        samples_base=sum(len(r) for r in base_rounds.values()),
        samples_new=sum(len(r) for r in new_rounds.values()),
        rounds_base=len(base_rounds),
        rounds_new=len(new_rounds),
        unit=unit if timed else "",
        ratio=raw_ratio,
        ratio_normalized=raw_ratio * norm_new / norm_base,
        ratio_judged=judged.ratio,
        ratio_low=judged.low,
        ratio_high=judged.high,
        clock_ratio=clocks,
        pairs_disturbed=disturbed,
        verdict_quiet_pairs=quiet,
        p_value=judged.p_value,
        verdict=judged.verdict,
    )
    comparable = (both_ok, both_ok and same_model)  # for every count, for device-bound ones
    return row, _count_rows(sides.thresholds, ident, b, n, comparable), timed


def _statuses(b: pd.Series, n: pd.Series, recorded: bool) -> dict[str, Any]:
    """Each side's status, kernels and error: why a case broke (ab and compare read "baseline -
    current - REGRESSION (ok -> failed)", the error in results.csv alone)."""
    return {
        "status_base": b["status"],
        "status_new": n["status"],
        "status_verdict": UNCHANGED,
        "kernel_base": _kernels(b, recorded),
        "kernel_new": _kernels(n, recorded),
        "error_base": _error(b),
        "error_new": _error(n),
    }


def _error(row: pd.Series) -> str:
    """A case's error's first line where it did not measure, else "" (and where a run has no
    such column)."""
    found = row.get("error")
    if row["status"] == Status.OK or not isinstance(found, str):
        return ""
    return (found.strip().splitlines() or [""])[0]


def _count_rows(
    thresholds: Thresholds,
    ident: dict[str, Any],
    b: pd.Series,
    n: pd.Series,
    comparable: tuple[bool, bool],
) -> list[dict[str, Any]]:
    """The exact counts of one pair of cases, each judged within its tolerance; ``comparable``:
    whether counts are (both measured), and whether device-bound ones are (the same model)."""
    rows = []
    for m in EXACT_METRICS:
        metric = m.column
        here = comparable[1] if m.device_bound else comparable[0]
        tolerance = getattr(thresholds, m.tolerance) if m.tolerance else 0.0
        base_v = float(b[metric]) if here and not pd.isna(b[metric]) else math.nan
        new_v = float(n[metric]) if here and not pd.isna(n[metric]) else math.nan
        rows.append(
            {
                **ident,
                "metric": metric,
                "base": base_v,
                "new": new_v,
                "change": new_v / base_v - 1 if base_v else math.nan,
                "verdict": judge_count(base_v, new_v, tolerance),
            }
        )
    return rows
