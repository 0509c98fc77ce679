"""The chapter's comparison table, with the measured growth beside each theoretical order.

For each layer: computational complexity (time against n at fixed d, and against d at fixed n),
sequential operations (``seq_steps`` against n) and maximum path length (``path_len`` against
n), each as a fitted log-log exponent from the rows that were measured (status ok).
"""

from __future__ import annotations

import itertools
from typing import Any

import pandas as pd

from attnbench.fits import Analysis, analyse
from attnbench.fits.exponents import SETTLED_RULE, counted_work, line_rates
from attnbench.measure.counts.ops import fused_names
from attnbench.measure.counts.structure import NO_MIXING
from attnbench.provenance import Source, sources
from attnbench.regime import OVERHEAD_SHARE, REGIME_BAND, REGIME_SIZES, overhead_bound
from attnbench.results.record import SHORT_OF_REGIME, Stopped
from attnbench.results.run import BUSY_NOTE, RunResults
from attnbench.schema import failed_a_check, first_reasons, numeric_column
from attnbench.spec import TRAIN_NOTE
from attnbench.units import fmt_exponent

COLUMNS = [
    "layer",
    "compute (theory)",
    "compute (measured)",
    "sequential ops (theory)",
    "sequential ops (measured)",
    "max path length (theory)",
    "max path length (measured)",
]


# A decode run's table: the chapter's table for generation, one token at a time.
DECODE_COLUMNS = [
    "layer",
    "compute (theory)",
    "compute (measured)",
    "state memory (theory)",
    "state memory (measured)",
    "sequential ops (theory)",
    "sequential ops (measured)",
]


def _label(row: pd.Series | None, var: str) -> str:
    return "–" if row is None else f"{var}^{fmt_exponent(row.exponent)}"


# No kernels measured: overhead-bound where its rate grew at least this share as fast as its work
FLAT_SHARE = 0.8
OVERHEAD_BOUND = "overhead-bound"  # a time cell not read against the theory (check_notes)


def overhead_lengths(group: pd.DataFrame, d_fix: int) -> list[int] | None:
    """The lengths (at d_fix) whose kernels ran under half the time; None where no case of
    the layer measured its kernels."""
    line = group[group["d"] == d_fix]
    if "kernel_share" not in line or line["kernel_share"].isna().all():
        return None
    share = numeric_column(line, "kernel_share")
    return sorted(int(n) for n in line.loc[overhead_bound(share), "n"])


def _time_cell(row: pd.Series | None, overhead: list[int] | None, lengths: list[int]) -> str:
    """The time's growth in n as the table shows it: the exponent where the rate settled;
    ``overhead-bound`` where every length's kernels ran under half its time (or, with no
    kernels measured, where the time hardly grew while the work did); otherwise the exponent,
    marked unsettled: the machine's rate was still changing at those lengths."""
    if row is None:
        return "–"
    if row["range_rule"] == SETTLED_RULE:
        return _label(row, "n")
    work, rate = _finite(row["work_exponent"]), _finite(row["rate_exponent"])
    flat = overhead is None and work and rate is not None and rate >= FLAT_SHARE * work > 0
    if flat or (overhead is not None and lengths and set(lengths) <= set(overhead)):
        return OVERHEAD_BOUND
    return f"{_label(row, 'n')} (unsettled)"


DISAGREES = "disagrees"  # a measured cell whose law the theory's excludes (check_notes: how)


def _marked(cell: str, agrees: bool | None) -> str:
    """A measured cell marked where its law disagrees with the theory's (not overhead-bound)."""
    if agrees is not False or cell == OVERHEAD_BOUND:
        return cell
    return f"{cell[:-1]}, {DISAGREES})" if cell.endswith(")") else f"{cell} ({DISAGREES})"


def _checked(group: pd.DataFrame, key: str, outcome: str) -> int:  # 0 where no such column
    column = f"{key}_check"
    return int((group[column] == outcome).sum()) if column in group else 0


def _value(row: pd.Series | None, column: str) -> Any:
    return None if row is None else row[column]


def _finite(value: Any) -> float | None:  # None for a missing or nan one (what JSON holds)
    return None if value is None or pd.isna(value) else float(value)


def _agrees(row: pd.Series | None) -> bool | None:
    """Whether a measured law agrees with the theory's (None: not judged)."""
    if row is None or row["agrees"] is None or pd.isna(row["agrees"]):
        return None
    return bool(row["agrees"])


def fixed_at(group: pd.DataFrame, by: str, over: str) -> int | None:
    """The largest value of ``by`` at which ``over`` takes at least two values."""
    counts = group.groupby(by)[over].nunique()
    usable = counts[counts >= 2]
    return int(usable.index.max()) if len(usable) else None


def _path_unproven_from(group: pd.DataFrame, d_fix: int) -> int | None:
    """The shortest n (at d_fix) whose path had no law, so no value: an exponent fitted on the
    lengths that did get one would describe the probes, not the layer (None: all had one)."""
    at_d = group[group["d"] == d_fix]
    unproven = at_d[(sources(at_d["path_len_method"]) == Source.NONE) & ~_mixes_none(at_d)]
    return int(unproven["n"].min()) if len(unproven) else None


NO_PATH = "no path"  # the path cell of a layer that mixes no positions


def _mixes_none(group: pd.DataFrame) -> pd.Series:
    """Cases whose layer mixes no positions: no path between two, rather than no law."""
    return group["path_len_method"].astype(str).eq(NO_MIXING)


def _path_cell(group: pd.DataFrame, path_n: pd.Series | None, unproven: int | None) -> str:
    """The measured path: its exponent, no law from some n on, or no path at all."""
    longer = group[group["n"] > 1]  # one position mixes with none whatever the layer
    if len(longer) and _mixes_none(longer).all():
        return NO_PATH
    return _label(path_n, "n") if unproven is None else f"no law at n ≥ {unproven}"


def comparison_table(run: RunResults, analysis: Analysis | None = None) -> pd.DataFrame:
    """One row per layer: theory orders, measured exponents, and the ranges they were fitted on.

    The exponents are the fits module's (``exponent_table``): time in n at the largest d, and
    in d at the largest n, on the sizes where overhead no longer dominates.
    """
    analysis = analysis or analyse(run)
    measured = run.measured
    rows: list[dict[str, Any]] = []
    for layer in dict.fromkeys(run.frame["layer"]):
        theory = analysis.layers.theory(layer)
        group = measured[measured["layer"] == layer]
        d_fix = fixed_at(group, "d", "n")
        n_fix = fixed_at(group, "n", "d")
        time_n = time_d = seq_n = path_n = unproven = overhead = None
        lengths: list[int] = []
        if d_fix is not None:
            time_n = analysis.exponent(layer, "time_s", "n", d_fix)
            overhead = overhead_lengths(group, d_fix)
            lengths = sorted(int(n) for n in group.loc[group["d"] == d_fix, "n"].unique())
            seq_n = analysis.exponent(layer, "seq_steps", "n", d_fix)
            # a decode step has no path of its own: a forward run measures the layer's
            unproven = None if run.mode == "decode" else _path_unproven_from(group, d_fix)
            if unproven is None and run.mode != "decode":
                path_n = analysis.exponent(layer, "path_len", "n", d_fix)
        if n_fix is not None:
            time_d = analysis.exponent(layer, "time_s", "d", n_fix)
        compute = _marked(_time_cell(time_n, overhead, lengths), _agrees(time_n))
        compute += "" if time_d is None else " " + _label(time_d, "d")
        decode = _decode_cells(analysis, group, layer, d_fix) if run.mode == "decode" else {}
        rows.append(
            {
                **decode,
                "layer": layer,
                "compute (theory)": theory.complexity if theory else "?",
                "compute (measured)": compute,
                "sequential ops (theory)": theory.sequential if theory else "?",
                "sequential ops (measured)": _marked(_label(seq_n, "n"), _agrees(seq_n)),
                "max path length (theory)": theory.path if theory else "?",
                "max path length (measured)": _marked(
                    _path_cell(group, path_n, unproven), _agrees(path_n)
                ),
                "time_exponent_n": _value(time_n, "exponent"),
                "time_exponent_n_ci95": None if time_n is None else [time_n.ci_low, time_n.ci_high],
                "time_exponent_d": _value(time_d, "exponent"),
                # the theory's slope over the same lengths, and whether the time agrees with it
                "time_theory_exponent_n": _finite(_value(time_n, "theory")),
                "time_agrees_n": _agrees(time_n),
                "time_settled_n": None if time_n is None else time_n["range_rule"] == SETTLED_RULE,
                "overhead_bound_n": overhead,  # the lengths; all of them: no exponent shown
                "time_overhead_bound_n": compute.startswith(OVERHEAD_BOUND),
                # time = work / rate: the counted work's and the rate's slopes on time_n's sizes
                "time_work_exponent_n": _finite(_value(time_n, "work_exponent")),
                "time_rate_exponent_n": _finite(_value(time_n, "rate_exponent")),
                "seq_steps_exponent_n": _value(seq_n, "exponent"),
                "path_len_exponent_n": _value(path_n, "exponent"),
                "seq_steps_agrees": _agrees(seq_n),
                "path_len_agrees": _agrees(path_n),
                "path_len_unproven_from": unproven,
                "flops_mismatch_cases": _checked(group, "flops", "mismatch"),
                "flops_incomplete_cases": _checked(group, "flops", "incomplete"),
                "elementwise_mismatch_cases": _checked(group, "elementwise", "mismatch"),
                "bytes_mismatch_cases": _checked(group, "bytes", "mismatch"),
                "time_fit_n": None
                if time_n is None
                else [int(time_n.range_from), int(time_n.range_to)],
                "time_fit_d_at": d_fix,
                "time_fit_rule": None if time_n is None else str(time_n.range_rule),
                "time_d_fit_n_at": n_fix,
                "measured_cases": len(group),
                "left_out_cases": int((run.frame["layer"] == layer).sum()) - len(group),
            }
        )
    columns = DECODE_COLUMNS if run.mode == "decode" else COLUMNS
    return pd.DataFrame(rows) if rows else pd.DataFrame(columns=columns)


def _decode_cells(
    analysis: Analysis, group: pd.DataFrame, layer: str, d_fix: int | None
) -> dict[str, Any]:
    """A decode run's own cells: the state's order, its measured growth in n, and the cases
    whose state or decoded tokens disagree with the layer."""
    theory = analysis.layers.theory(layer)
    step = theory.decode if theory is not None else None
    state_n = None if d_fix is None else analysis.exponent(layer, "state_bytes", "n", d_fix)
    return {
        "state memory (theory)": step.memory if step else "?",
        "state memory (measured)": _marked(_label(state_n, "n"), _agrees(state_n)),
        "decode form": step.form if step else "",
        "state_bytes_exponent_n": _value(state_n, "exponent"),
        "state_agrees": _agrees(state_n),
        "state_mismatch_cases": _checked(group, "state", "mismatch"),
    }


# Headers as the chapter's table has them, each theory column followed by its measurement.
HEADERS = [
    "layer", "complexity", "measured", "sequential ops", "measured", "max path length", "measured",
]  # fmt: skip
DECODE_HEADERS = [
    "layer", "compute per token", "measured", "state memory", "measured",
    "sequential ops per token", "measured",
]  # fmt: skip


def display(table: pd.DataFrame) -> pd.DataFrame:
    """The seven columns people read, under the chapter's headers (Markdown, report, terminal);
    a decode run's under the headers of its table for generation."""
    decode = "state memory (theory)" in table.columns
    shown = table[DECODE_COLUMNS if decode else COLUMNS].copy()
    shown.columns = DECODE_HEADERS if decode else HEADERS
    return shown


def _left_out(run: RunResults, layer: str, count: int) -> str:
    """Why a layer's cases were left out of its fits: not measured, or measured and failed a
    correctness check (decoded tokens, a compiled output), which keeps its figures."""
    frame = run.frame[run.frame["layer"] == layer]
    failed = min(int(failed_a_check(frame).sum()), count)
    why = "".join(f" ({row.status}: {row.error})" for row in first_reasons(frame).itertuples())
    parts = [f"{count - failed} unmeasured case(s){why}"] if count > failed else []
    parts += [f"{failed} case(s) that failed a correctness check"] if failed else []
    return " and ".join(parts) + " left out"


def _past_plateau(run: RunResults, layer: str, d: int, top: int) -> str:
    """Where a line was measured past the plateau its time was fitted on: how far its rate
    moved by its largest length ("" where the plateau is the top)."""
    rows = run.measured
    rows = rows[(rows["layer"] == layer) & (rows["d"] == d)]
    rate = line_rates(rows, "n", counted_work(rows))
    if rate.empty or int(rate.index.max()) <= top or top not in rate.index:
        return ""
    last = int(rate.index.max())
    ratio = float(rate[last] / rate[top])
    return (
        f"; past it, to n={last}, its rate did not settle again (it ends at {ratio:.2f}x its "
        f"rate at n={top})"
    )


def _crossing(run: RunResults, layer: str, d: Any) -> str:
    """How far a line's kernels' share ranged where it crossed ``OVERHEAD_SHARE`` more than
    once along n: a list of lengths alone reads as a pattern ("" where it did not)."""
    if pd.isna(d):
        return ""
    rows = run.measured
    rows = rows[(rows["layer"] == layer) & (rows["d"] == int(d))].sort_values("n")
    share = numeric_column(rows, "kernel_share")
    known = share.notna()
    bound = list(overhead_bound(share[known]))
    if sum(a != b for a, b in itertools.pairwise(bound)) < 2:  # under it, then over it (or not)
        return ""
    sizes = rows.loc[known, "n"]
    return (
        f"; its share read {share.min():.0%} to {share.max():.0%} at n = {int(sizes.min())}.."
        f"{int(sizes.max())}, back and forth across {OVERHEAD_SHARE:.0%}: near the line, not "
        "clearly on either side"
    )


def _goes_on(run: RunResults, layer: str, row: Any) -> str:
    """What would measure an unsettled line further: --n auto, or, in an auto run whose
    line stopped short, a larger --auto-budget (or whatever else stopped it, as its note
    says)."""
    d = int(row.time_fit_d_at) if pd.notna(row.time_fit_d_at) else None
    line = next((x for x in run.record.auto if x.layer == layer and x.d == d), None)
    if line is None or line.stopped is None or line.at_n is None:
        return "--n auto goes on until it is"
    if line.stopped is Stopped.REGIME:
        return f"--n auto stopped it at n={line.at_n}, where its first rounds had settled"
    how, further = SHORT_OF_REGIME[line.stopped]
    words = {"their": "its", "them": "it"}
    further = f", and {further.format(**words)}" if further else ""
    return f"--n auto stopped it at n={line.at_n} {how.format(**words)}{further}"


def fit_notes(table: pd.DataFrame, run: RunResults) -> list[str]:
    """What the exponents were fitted on, and what was left out."""
    notes = []
    for row in table.itertuples(index=False):
        parts = []
        if row.time_fit_n:
            regime = (
                " (where its rate settled)"
                if row.time_fit_rule == SETTLED_RULE
                else f" (its rate not seen settled, which takes {REGIME_SIZES} lengths within "
                f"{REGIME_BAND:.0%} of each other: {_goes_on(run, str(row.layer), row)})"
            )
            law = "time ~ n"
            if row.time_work_exponent_n is not None and row.time_rate_exponent_n is not None:
                law = (
                    f"time ~ n^{fmt_exponent(row.time_exponent_n)} = work "
                    f"n^{fmt_exponent(row.time_work_exponent_n)} ÷ rate "
                    f"n^{fmt_exponent(row.time_rate_exponent_n)},"
                )
            parts.append(
                f"{law} fitted at n={row.time_fit_n[0]}..{row.time_fit_n[1]}, "
                f"d={int(row.time_fit_d_at)}{regime}"
            )
            if row.time_fit_rule == SETTLED_RULE:
                parts[-1] += _past_plateau(
                    run, str(row.layer), int(row.time_fit_d_at), row.time_fit_n[1]
                )
        if row.overhead_bound_n:
            # settled and overhead-bound at once: the overhead grows as the work (a recurrent
            # layer issues its ops step by step), which a new user read as a contradiction
            fitted: Any = row.time_fit_n
            same = (
                row.time_fit_rule == SETTLED_RULE
                and bool(fitted)
                and any(fitted[0] <= n <= fitted[1] for n in row.overhead_bound_n)
            )  # overhead-bound where the settled rate was fitted, not only below it
            grows = (
                "; its rate settled all the same: the overhead grows with the work" if same else ""
            )
            crossing = _crossing(run, str(row.layer), row.time_fit_d_at)
            parts.append(
                f"overhead-bound at n = {_lengths(row.overhead_bound_n)} (its kernels under "
                f"{OVERHEAD_SHARE:.0%} of the time{grows}{crossing})"
            )
        if row.time_d_fit_n_at is not None:
            # the exponent itself: "time ~ d" read as a claim of linear growth beside d^0.48
            slope = row.time_exponent_d
            grows = f"^{fmt_exponent(slope)}" if slope is not None and pd.notna(slope) else ""
            parts.append(f"time ~ d{grows} fitted across d at n={row.time_d_fit_n_at}")
        if row.left_out_cases:
            parts.append(_left_out(run, str(row.layer), int(row.left_out_cases)))
        if row.time_fit_n:
            parts += _kernels_along_n(run, str(row.layer), int(row.time_fit_d_at))
        notes.append(f"{row.layer}: " + "; ".join(parts or ["too few measured cases to fit"]))
    notes.extend(check_notes(table))
    if "decode form" in table.columns:
        rows = table.to_dict("records")
        notes += [f"{r['layer']} decodes as {r['decode form']}" for r in rows if r["decode form"]]
    if run.mode == "train":  # the chapter's columns are the forward's (``step.forward``)
        notes.append(TRAIN_NOTE)
    extended = (sources(run.measured["path_len_method"]) == Source.EXTENDED).sum()
    if extended:
        notes.append(
            f"path_len of {extended} case(s) is extended from a band or block law proven at probe "
            "lengths (see the path_len_method column)"
        )
    busy = run.busy_cases()
    if busy:  # a run swept beside a neighbour: its exponents read the neighbour's moments too
        layers = sorted({str(c).split("/")[0] for c in busy})
        notes.append(
            f"{len(busy)} of {len(run.measured)} case(s) ({', '.join(layers)}) {BUSY_NOTE}, and "
            "the time exponents fitted over them may be the machine's, not the layer's (sweep "
            "again when it is quiet)"
        )
    return notes


def kernel_runs(line: pd.DataFrame, along: str = "n") -> list[tuple[str, list[int]]]:
    """The convolution kernels torch chose along ``along`` (a line's rows, its ``backend``
    column), as runs of sizes that ran the same ones ("": none recorded there): [] unless at
    least two different kernels were recorded (a line whose kernels were recorded at some
    sizes only ran one kernel as far as anyone knows)."""
    if "backend" not in line:
        return []
    line = line.sort_values(along, kind="stable")
    names = [
        ", ".join(sorted(fused_names(v))) if isinstance(v, str) else "" for v in line["backend"]
    ]
    runs = [
        (kernels, [int(size) for _, size in group])
        for kernels, group in itertools.groupby(
            zip(names, line[along], strict=True), lambda x: x[0]
        )
    ]
    return runs if len({kernels for kernels, _ in runs if kernels}) >= 2 else []


def kernel_changes(runs: list[tuple[str, list[int]]]) -> list[int]:
    """The first size of each recorded kernel that differs from the one at the nearest smaller
    size that recorded any (``kernel_runs``): a stretch with none recorded is no change, nor is
    its end."""
    found, last = [], ""
    for kernels, sizes in runs:
        if kernels and last and kernels != last:
            found.append(sizes[0])
        last = kernels or last
    return found


def _kernels_along_n(run: RunResults, layer: str, d: int) -> list[str]:
    """The convolution kernels torch chose along n, where it changed them: the time's slope
    bends there (conv-dilated at n = 512 read faster than at 256 as oneDNN took over from
    torch's reference kernel), which the exponent alone does not say (``kernel_runs``)."""
    frame = run.measured
    runs = kernel_runs(frame[(frame["layer"] == layer) & (frame["d"] == d)])
    if not runs:
        return []
    ran = "; ".join(f"{kernels or 'none recorded'} at n = {_lengths(ns)}" for kernels, ns in runs)
    return [f"its convolution kernel changed with n: {ran} (results.csv's backend column)"]


def _lengths(values: list[int]) -> str:
    """Lengths in words: one, a doubling run as a range, or a list."""
    doubling = len(values) > 1 and all(b == 2 * a for a, b in itertools.pairwise(values))
    return f"{values[0]}..{values[-1]}" if doubling else ", ".join(map(str, values))


def check_notes(table: pd.DataFrame) -> list[str]:
    """Where a layer's counts disagree with its own theory: a formula off by more than 1%, or a
    sequential or path law that the measured exponent's interval excludes."""
    notes = []
    for row in table.to_dict("records"):
        layer = row["layer"]
        for key, column, what in (
            ("flops", "flops", "FLOPs"),
            ("elementwise", "elementwise", "elementwise work"),
            ("bytes", "bytes", "bytes moved"),
            ("state", "state_bytes", "state bytes"),
        ):
            cases = row.get(f"{key}_mismatch_cases") or 0
            if cases:
                notes.append(
                    f"{layer}: counted {what} differ from the analytic formula by more than "
                    f"1% in {cases} case(s); see the {column} and {key}_analytic columns"
                )
        incomplete = row.get("flops_incomplete_cases") or 0
        if incomplete:
            notes.append(
                f"{layer}: {incomplete} case(s) ran ops with no FLOP formula, so their FLOPs "
                "are a lower bound; see the uncounted_ops column"
            )
        if row.get("max path length (measured)") == NO_PATH:
            notes.append(
                f"{layer}: no output depends on another position's input, so no path joins two "
                "positions (its path_len is empty, and path_len_method says so)"
            )
        unproven = row.get("path_len_unproven_from")
        if unproven is not None and not pd.isna(unproven):
            notes.append(
                f"{layer}: max path length has no law proven at n ≥ {int(unproven)} (see "
                "path_len_method), so no exponent is fitted"
            )
        bound = bool(row.get("time_overhead_bound_n"))
        if row.get("time_agrees_n") is False and not bound:
            where = "where the rate settled" if row.get("time_settled_n") else "(unsettled)"
            notes.append(
                f"{layer}: time measured n^{fmt_exponent(row['time_exponent_n'])} {where} "
                f"disagrees with n^{fmt_exponent(row['time_theory_exponent_n'])}, its "
                "complexity formula's slope over the same lengths (lower terms included)"
            )
        for column, what in (("seq_steps", "sequential ops"), ("path_len", "max path length")):
            if row.get(f"{column}_agrees") is False:
                notes.append(
                    f"{layer}: {what} measured "
                    f"n^{fmt_exponent(row[f'{column}_exponent_n'])} disagree "
                    f"with the theory's {row[f'{what} (theory)']}"
                )
    return notes
