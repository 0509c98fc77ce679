"""What differs between two runs that changes what comparing them means, each in one line:
their settings and environment, their layers' code, the machine's state in each, and the cases
whose time is a busy machine's. ``compare_runs`` puts them before its verdicts; a run that is
unfinished, or not calibrated where --normalize asks for it, it refuses."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from attnbench.compare.verdicts import NOT_SIGNIFICANT, THROTTLED, TOO_FEW
from attnbench.errors import AttnbenchError
from attnbench.layers.entry import LayerSource
from attnbench.layers.plugins import unversioned
from attnbench.measure.timing.allocator import huge_pages
from attnbench.options import OPTIONS
from attnbench.results.environment import compare_keys
from attnbench.results.reruns import same_state, typical_reference
from attnbench.results.run import BUSY_NOTE, RunResults
from attnbench.thresholds import Thresholds


def environment_warnings(base: RunResults, new: RunResults, paired: bool = False) -> list[str]:
    """What differs between the runs that changes what the comparison means: the grid's device,
    dtype, mode and batch (recorded by field), the environment keys compare watches, and the
    code of each layer both measured. Two sides of one interleaved run (``paired``: ab's)
    shared the machine's state pair by pair: no state is said to differ between them."""
    config_keys = {o.field: o.key for o in OPTIONS if o.compare}
    warnings = []
    if base.path.resolve() == new.path.resolve():  # a typo a new user's A/A check made
        warnings.append(
            f"both runs are {str(new.path)!r}: every case is compared with itself, so nothing "
            "can move; give the baseline and the current run as two folders"
        )
    sides: list[tuple[Mapping[str, Any], Mapping[str, Any], dict[str, str]]] = [
        (base.record.config, new.record.config, config_keys),
        (base.record.environment, new.record.environment, compare_keys()),
    ]
    for before, after, keys in sides:
        for key, label in keys.items():
            if before.get(key) != after.get(key):
                warnings.append(
                    f"{label} differs: {before.get(key)!r} in the baseline, "
                    f"{after.get(key)!r} in the current run"
                )
    if base.allocator != new.allocator:
        warnings.append(
            f"allocator differs: {base.allocator!r} in the baseline, {new.allocator!r} in the "
            "current run; CPU times under one state pay page faults the other does not "
            "(see --allocator)"
        )
    elif huge_pages(base.record.allocator) != huge_pages(new.record.allocator):
        warnings.append(
            f"huge pages differ: {huge_pages(base.record.allocator)} in the baseline, "
            f"{huge_pages(new.record.allocator)} in "
            "the current run; a memory-bound case's CPU time moved 5-17% with them (attnbench "
            "asks for them since 2026-12-01: docs/metrics.md)"
        )
    level, level_now = typical_reference(base.samples), typical_reference(new.samples)
    if not paired and not same_state(level, level_now):
        warnings.append(
            "the machine ran in another state in each run (its reference read "
            f"{level_now / level:.2f}x the baseline's): a layer's time moves with the "
            "machine's state, which no verdict here tells from the code"
        )
    return [
        *warnings,
        *layer_differences(base.record.layers, new.record.layers),
        *code_ran_differences(base, new),
    ]


def layer_differences(
    before: Mapping[str, Mapping[str, str]], after: Mapping[str, Mapping[str, str]]
) -> list[str]:
    """One line per layer whose code differs between two runs' records (run.json ``layers``);
    an ``ab`` base side's ``NAME@base`` (the base version of one plugin) is read as NAME."""
    lines = []
    for base_name, record in before.items():
        name = unversioned(base_name)
        if name not in after or (base_name != name and base_name in after):
            continue
        old, now = LayerSource(**record), LayerSource(**after[name])
        if old == now:
            continue
        if old.digest and old.digest == now.digest and old.spec != now.spec:  # found elsewhere
            lines.append(
                f"layer {name} ran the same code (sha256 {old.digest}) from another place: "
                f"{old.spec} in the baseline, {now.spec} in the current run"
            )
            continue
        lines.append(
            f"layer {name} differs: {old.describe()} in the baseline, {now.describe()} in the "
            "current run"
        )
    return lines


def code_ran_differences(base: RunResults, new: RunResults) -> list[str]:
    """What the runs' cases ran where their records do not say it (``RunResults.codes_ran``):
    a layer whose cases ran two codes, and one that ran other code in each run where run.json
    names the same (a --resume --force of a finished run rewrote it, measuring nothing)."""
    lines = [
        f"{line} (the {side})"
        for side, run in (("baseline", base), ("current run", new))
        for line in run.mixed_code()
    ]
    before, after = base.codes_ran, new.codes_ran
    for base_name, codes in before.items():
        name = unversioned(base_name)
        recorded = base.record.layers.get(base_name), new.record.layers.get(name)
        now = after.get(name, [])
        named = recorded[0] is not None and recorded[0] == recorded[1]
        if len(codes) == len(now) == 1 and codes != now and named:
            lines.append(
                f"layer {name}'s cases ran other code: {codes[0]} in the baseline, {now[0]} "
                "in the current run, where both run.json files name one (a --resume --force "
                "rewrote one's record)"
            )
    return lines


def busy_warnings(
    base: RunResults, new: RunResults, shared: Sequence[tuple[str, str]]
) -> list[str]:
    """The compared cases (``shared``: base and current case ids) of either run whose time is
    a busy machine's (``RunResults.busy_cases``): a new user's case timed only beside a
    neighbour read 7x its quiet time, and compare called it "not significant" without a
    word."""
    sides = (
        ("baseline", base, {b for b, _ in shared}),
        ("current run", new, {c for _, c in shared}),
    )
    counts = [(name, len(set(run.busy_cases()) & ids)) for name, run, ids in sides]
    busy = [f"{n} case(s) in the {name}" for name, n in counts if n]
    if not busy:
        return []
    return [
        f"{' and '.join(busy)} {BUSY_NOTE}, and their verdicts may be the machine's, not the code's"
    ]


def undecided_words(times: pd.DataFrame, thresholds: Thresholds, paired: bool = False) -> str:
    """The cases whose time a gate could not decide, in words ("" where none): slower past the
    threshold but not significant; under it, with an interval reaching past it; too few
    samples for any test; or throttled (the GPU's clock moved). "No regression" alone read as
    "none slower" to a new user whose three cases read 1.29-1.33x; a run compared with itself,
    every ratio 1.000, read "2 slower than +10%"."""
    verdicts, past = times["verdict"], times["ratio_judged"] > 1 + thresholds.max_slowdown
    unsure = verdicts == NOT_SIGNIFICANT
    slowdown = f"+{thresholds.max_slowdown:.0%}"
    counted = [
        (int((unsure & past).sum()),
         f"slower than {slowdown} but not significant at p < {thresholds.alpha:g}"),
        (int((unsure & ~past).sum()), f"under {slowdown} with an interval reaching past it"),
        (int((verdicts == TOO_FEW).sum()), "with too few samples for a test"),
        (int((verdicts == THROTTLED).sum()), "throttled: the GPU's clock moved"),
    ]  # fmt: skip
    parts = [f"{count} {why}" for count, why in counted if count]
    if not parts:
        return ""
    count = sum(count for count, _ in counted)
    more = "more --processes" if paired else "sweeps with more --processes"
    return (
        f"time undecided for {count} of {len(verdicts)} shared case(s) ({'; '.join(parts)}): "
        f"the gate passes them, and {more} would decide them"
    )


def check_finished(baseline: RunResults, current: RunResults | None = None) -> None:
    """A run stopped part way is refused, not judged: a CI job killed by its time limit and
    then compared went green, its unmeasured cases listed as on one side only. (``current``
    None: the baseline alone, checked before ``sweep --baseline`` measures anything.)"""
    for role, run in (("baseline", baseline), ("current", current)):
        if run is not None and run.unfinished:
            raise AttnbenchError(
                f"the {role} run {str(run.path)!r} is {run.unfinished}, then compare"
            )


# Calibration kernels timed this far apart between two runs say the machine's speed moved.
CALIBRATION_APART = 1.25


def calibration_of(base: RunResults, new: RunResults, normalize: bool) -> dict[str, float]:
    base_s, new_s = base.calibration_s, new.calibration_s
    same_kernel = base.record.calibration == new.record.calibration
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
                f"({base.record.calibration} and {new.record.calibration})"
            )
    if base_s is None or new_s is None or not same_kernel:
        return {}
    return {"base_s": base_s, "new_s": new_s, "ratio": new_s / base_s}


def normalizing_scales(run: RunResults, run_s: float | None, by_device: bool) -> dict[str, float]:
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
