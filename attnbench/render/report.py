"""A run's report: environment, comparison table, fits, crossovers and charts, in one file.

The report is a list of blocks (headings, paragraphs, tables, images) rendered to Markdown, and
to HTML from the same blocks, so the two never disagree. Chart images are linked relative to
the report, which sits in the results folder: commit the folder and the report renders on a
forge as it does locally.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from attnbench.fits import Analysis
from attnbench.fits.exponents import RangeKind, RangeRule, counted_work, line_rates
from attnbench.measure.counts.ops import fused_names
from attnbench.metrics import METRIC
from attnbench.regime import REGIME_BAND, REGIME_SIZES
from attnbench.render.blocks import Block, to_html, to_markdown
from attnbench.render.costmodels import better_note, model_display
from attnbench.results.run import RunResults
from attnbench.storage import write_text_atomic
from attnbench.table import comparison_table, display, fit_notes
from attnbench.units import fmt_exponent

REPORT_FILE = "report.md"


def _num(x: float, digits: int = 2) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _interval(row: pd.Series) -> str:
    if math.isnan(row.ci_low):
        return _num(row.exponent)
    if row.ci_low == row.ci_high:
        return f"{row.exponent:.2f} (exact)"
    return f"{row.exponent:.2f} [{row.ci_low:.2f}, {row.ci_high:.2f}]"


def _agrees(value: object, theory: float, low: float = math.nan) -> str:
    """The verdict, and on a "no" which way the measure went: a time above its formula's slope
    grew faster than its work (its rate fell), which the split table then explains."""
    if value is True:
        return "yes"
    if value is False:
        if math.isnan(low):
            return "no"
        return "no: steeper" if low > theory else "no: flatter"
    return "–" if math.isnan(theory) else "can't tell"


def _at_largest(e: pd.DataFrame) -> pd.DataFrame:
    """The exponent rows at each layer's largest fixed size (every size is in --json)."""
    return e[e["fixed"] == e.groupby("layer")["fixed"].transform("max")]


def _line(analysis: Analysis, row: pd.Series) -> pd.DataFrame:
    """The measured cases of an exponent row's line in n: its layer at its fixed d."""
    frame = analysis.frame
    return frame[(frame["layer"] == row.layer) & (frame["d"] == row.fixed)]


def exponent_display(analysis: Analysis, along: str) -> pd.DataFrame:
    """Exponents along ``along`` at each layer's largest fixed size (every size is in --json)."""
    e = analysis.exponents[analysis.exponents["along"] == along]
    if e.empty:
        return pd.DataFrame()
    e = _at_largest(e)
    other = "d" if along == "n" else "n"
    return pd.DataFrame(
        {
            "layer": e["layer"],
            "metric": e["metric"].map(lambda column: METRIC[column].display),
            f"at {other}": e["fixed"],
            "exponent [95% CI]": [_interval(r) for r in e.itertuples(index=False)],
            "chapter": e["order"].map(_num),
            "formula": e["theory"].map(_num),
            "agrees with formula": [
                _agrees(a, t, lo)
                for a, t, lo in zip(e["agrees"], e["theory"], e["ci_low"], strict=True)
            ],
            "model": e["model"].map(_num),
            f"fitted on {along}": [
                f"{a}..{b}" for a, b in zip(e.range_from, e.range_to, strict=True)
            ],
            "where": [
                "rate unsettled" if _unsettled(metric, rule) else _where(rule)
                for metric, rule in zip(e["metric"], e["range_rule"], strict=True)
            ],
        }
    )


def _unsettled(metric: str, rule: object) -> bool:
    """A time fitted where its rate did not settle, which ``table`` marks "(unsettled)": a
    conv-dilated line read "n^0.88 (unsettled)" there and a firm "no: flatter" here, with
    nothing beside it to say why the two differ."""
    kind = getattr(rule, "kind", None)
    return metric == "time_s" and kind is not None and kind != RangeKind.SETTLED


EXPONENT_NOTE = (
    "exponents: 'chapter' is the slope of the chapter's order (attention's n²·d: 2 in n) over "
    "the sizes fitted, 'formula' that of the layer's whole formula, which 'agrees with formula' "
    "judges (the "
    "95% interval holds it, or an exact count is within 0.05 of it or is the law up to a scale "
    "and a constant); 'model' is the slope of the machine model's time (the counts over the "
    "measured ceilings, nothing fitted), not a cost model's; 'rate unsettled': a time fitted "
    "where its rate (work per second) had not settled (on its upper half of sizes, or where "
    "its fitted overhead is under half the time), so its slope is the machine's as much as "
    "the layer's, as attnbench table marks it"
)


# A rate exponent this close to 0 is a rate that held over the range.
STEADY_RATE = 0.1


def _reading(
    row: pd.Series,
    latency: tuple[float, float] | None = None,
    backends: tuple[str, str] | None = None,
    spread: float = 1.0,
    settled: bool = True,
) -> str:
    """How the rate moved over a time line's range, and whether the machine model's slope
    follows the measured one (within 0.1), with the share of the model's time that is latency
    (per-op costs and set-up) at both ends of the range, where it was predicted; and the
    convolution implementations at both ends, where they differ (torch chose another kernel
    as the input grew). ``spread``: the range's highest rate over its lowest; a rate with no
    trend end to end that moved past the regime's band inside is not "steady" (conv read
    42.6, 78.1, ..., 42 G/s: "rate steady" beside "rate unsettled"); nor is one fitted where
    it had not ``settled`` as ``table`` reads it (ssm-scan over three lengths read "rate
    steady" here and "rate unsettled" in the growth table above it)."""
    change = row.rate_to / row.rate_from if row.rate_from > 0 else math.nan
    if abs(row.rate_exponent) < STEADY_RATE and spread > 1 + REGIME_BAND:
        text = f"rate moved ×{spread:.2g} inside the range, with no trend end to end"
    elif abs(row.rate_exponent) < STEADY_RATE and not settled:
        text = (
            f"rate held here, but not settled as table reads it ({REGIME_SIZES} lengths within "
            f"{REGIME_BAND:.0%}, no trend)"
        )
    elif abs(row.rate_exponent) < STEADY_RATE:
        text = "rate steady: time follows the work"
    elif row.rate_exponent > 0:
        text = f"rate rose ×{change:.2g} with n"
    else:
        text = f"rate fell ÷{1 / change:.2g} with n"
    if not math.isnan(row.model):
        follows = abs(row.model - row.exponent) <= STEADY_RATE
        text += f"; model n^{fmt_exponent(row.model)}" + (" follows" if follows else ", misses it")
        if latency is not None:
            text += f" (latency {latency[0]:.0%} → {latency[1]:.0%} of it)"
    if backends is not None and backends[0] != backends[1]:
        text += f"; kernel {backends[0] or 'none'} → {backends[1] or 'none'}"
    return text


def _backends(analysis: Analysis, row: pd.Series) -> tuple[str, str] | None:
    """The convolution implementations (``backend``, names only) a time line's first and last
    size ran; None where the run recorded none."""
    if "backend" not in analysis.frame:
        return None
    names = (
        _line(analysis, row)
        .set_index("n")["backend"]
        .map(lambda v: v if isinstance(v, str) else "")
    )
    if not names.str.strip().any():
        return None

    def at(n: int) -> str:
        found = names[names.index == n]
        return ", ".join(sorted(fused_names(found.iloc[0]))) if len(found) else ""

    return at(int(row.range_from)), at(int(row.range_to))


def _spread(analysis: Analysis, row: pd.Series) -> float:
    """A time line's highest rate (counted work per second) over its lowest, on the sizes
    its exponent was fitted on (1 where fewer than two read)."""
    line = _line(analysis, row)
    line = line[line["n"].between(row.range_from, row.range_to)]
    rate = line_rates(line, "n", counted_work(line))
    return float(rate.max() / rate.min()) if len(rate) >= 2 else 1.0


def _latency_shares(analysis: Analysis, row: pd.Series) -> tuple[float, float] | None:
    """The machine model's latency share (latency and faults over its predicted time) of a
    time line's first and last size (median over their cases); None without a prediction."""
    machine = analysis.machine
    if machine.empty:
        return None
    line = _line(analysis, row)
    terms = machine.reindex(line.index).dropna(subset=["predicted_time_s"])
    if terms.empty:
        return None
    share = (terms["latency_s"] + terms["faults_s"]) / terms["predicted_time_s"]
    by_n = share.groupby(line.loc[terms.index, "n"]).median()
    if row.range_from not in by_n or row.range_to not in by_n:
        return None
    return float(by_n[row.range_from]), float(by_n[row.range_to])


def _split_rows(analysis: Analysis) -> pd.DataFrame:
    """The time exponents in n that were split into work and rate, at each layer's largest d."""
    e = analysis.exponents
    e = e[(e["metric"] == "time_s") & (e["along"] == "n")].dropna(subset=["rate_exponent"])
    return e if e.empty else _at_largest(e)


def split_display(analysis: Analysis) -> pd.DataFrame:
    """Each layer's time exponent in n (at its largest d) as time = work / rate: the counted
    work's slope and the slope of the rate it ran at, over the same sizes, so whether a bend
    from the chapter's order is the layer's (its work) or the machine's (its rate) is read, not
    guessed."""
    e = _split_rows(analysis)
    if e.empty:
        return pd.DataFrame()
    return pd.DataFrame(
        {
            "layer": e["layer"],
            "sizes": [
                f"n={a}..{b}, d={d}"
                for a, b, d in zip(e.range_from, e.range_to, e.fixed, strict=True)
            ],
            "time = work ÷ rate": [
                f"n^{fmt_exponent(t)} = n^{fmt_exponent(w)} ÷ n^{fmt_exponent(r)}"
                for t, w, r in zip(e.exponent, e.work_exponent, e.rate_exponent, strict=True)
            ],
            "rate (work/s)": [
                f"{a / 1e9:.3g} → {b / 1e9:.3g} G/s"
                for a, b in zip(e.rate_from, e.rate_to, strict=True)
            ],
            "reading": [
                _reading(
                    r,
                    _latency_shares(analysis, r),
                    _backends(analysis, r),
                    _spread(analysis, r),
                    not _unsettled("time_s", r.range_rule),
                )
                for _, r in e.iterrows()
            ],
        }
    )


SPLIT_NOTE = (
    "time = work ÷ rate on the same sizes, so the time's exponent is the work's minus the "
    "rate's, exactly. The work is counted (FLOPs + elementwise work, as the theory states it); "
    "the rate is the work done per second. A rate that rises with n usually means that small "
    "calls pay fixed per-call costs or leave cores idle; one that falls, that the operands "
    "outgrew a cache. Where the machine model's slope follows the measured one, the measured "
    "ceilings account for the bend."
)


_WHERE = {
    RangeKind.SETTLED: "rate settled",
    RangeKind.OVERHEAD: "overhead < half",
    RangeKind.EXACT: "every size",
    RangeKind.UPPER_HALF: "upper half",
}


def _where(rule: RangeRule) -> str:
    """The sizes an exponent was fitted on, in a word or two (``fits.range_rule``)."""
    return _WHERE[rule.kind]


def machine_display(analysis: Analysis) -> pd.DataFrame:
    """Per layer: how far the machine model (counts and measured ceilings, nothing fitted) and
    the all-layer NNLS fit of the same terms are from the measured times, and the bounds."""
    m = analysis.machine_table()
    if m.empty:
        return pd.DataFrame()
    return pd.DataFrame(
        {
            "layer": m["layer"],
            "cases": m["cases"],
            "bound (cases)": m["bounds"],
            "model rel. RMS": m["model_rms"].map(_share),
            "kernels' miss": m["kernel_rms"].map(_share),
            "overhead's miss": m["overhead_rms"].map(_share),
            "all-layer NNLS rel. RMS": m["nnls_rms"].map(_share),
            "rounds' rel. RMS (the floor)": m["rounds_rms"].map(_share),
        }
    )


def _share(value: float) -> str:
    """A relative RMS as a percentage; "–" where there is none (a fit that could not run, a
    run with one round)."""
    return "–" if math.isnan(value) else f"{value:.0%}"


def machine_notes(analysis: Analysis) -> list[str]:
    """The ceilings the model used, and those the all-layer fit found (the layers' own)."""
    if analysis.machine.empty:
        return []
    notes = []
    found = analysis.effective
    if found is not None:
        peak = found.peak_flops_per_s
        bandwidth = found.bandwidth_bytes_per_s
        notes.append(
            "effective ceilings (NNLS over every layer's cases): "
            f"{'–' if peak is None else f'{peak / 1e9:.3g} GFLOP/s'}, "
            f"{'–' if bandwidth is None else f'{bandwidth / 1e9:.3g} GB/s'}, "
            f"{found.op_latency_s * 1e6:.3g} µs per op, "
            f"{found.page_fault_s * 1e6:.3g} µs per page fault; fitted, not measured: each "
            "takes whatever time grows with its count across the layers, so they need not "
            "match the device's own (attnbench machine)"
        )  # a student read 130 µs a fault here against the machine's measured 2.7 µs
    if analysis.machine_table()["kernel_rms"].notna().any():  # a new user read them as parts
        notes.append(  # of the model's, one of them past it: they cancel in the whole call
            "kernels' miss, overhead's miss: the model's miss of the kernels' measured time and "
            "of the rest (the overhead), each as a share of the layer's time; the two can "
            "cancel in the whole call, so either may exceed the model's rel. RMS"
        )
    if analysis.rounds.notna().any():
        notes.append(
            "rounds' rel. RMS: how far one timing round's times are from another's (the "
            "median over pairs of rounds): a model cannot be checked closer than the machine "
            "repeats itself"
        )
    return notes


def crossover_display(analysis: Analysis) -> pd.DataFrame:
    c = analysis.crossovers
    if c.empty:
        return pd.DataFrame()
    return pd.DataFrame(
        {
            "d": c["d"],
            "attention": c["layer"],
            "versus": c["versus"],
            "measured n": c["measured"],
            "theory: FLOP formulas": c["theory_flops"],
            _ORDERS_DECODE if analysis.mode == "decode" else _ORDERS: c["theory_order"],
        }
    )


_ORDERS = "theory: orders (n²d vs nd², knd²)"
_ORDERS_DECODE = "theory: orders per token (nd vs d², kd²)"


def model_notes(analysis: Analysis) -> list[str]:
    """Each layer left out of the cost-model table, and why, so a missing row is explained;
    how to read time = work ÷ rate; then the machine model's effective ceilings."""
    unfitted = [f"no cost model for {layer}: {why}" for layer, why in analysis.unfitted.items()]
    split = [SPLIT_NOTE] if not _split_rows(analysis).empty else []
    return unfitted + better_note(analysis) + split + machine_notes(analysis)


def fit_tables(analysis: Analysis) -> dict[str, pd.DataFrame]:
    """The fit tables for people (the CLI's ``fit`` and the report), titled, non-empty only."""
    tables = {
        "Growth in n (log-log exponent at the largest d)": exponent_display(analysis, "n"),
        "Growth in d (log-log exponent at the largest n)": exponent_display(analysis, "d"),
        "Why time grows as it does in n (at the largest d)": split_display(analysis),
        "Cost models of time (NNLS; relative RMS as google-benchmark reports it)": model_display(
            analysis
        ),
        "Crossovers: the n above which attention is slower": crossover_display(analysis),
        "Machine model: time from the counts and the measured ceilings, nothing fitted per "
        "layer": machine_display(analysis),
    }
    return {title: t for title, t in tables.items() if not t.empty}


# ----------------------------------------------------------------------------- blocks


def _blocks(run: RunResults, analysis: Analysis, charts: Sequence[Path], base: Path) -> list[Block]:
    counts = ", ".join(f"{v} {k}" for k, v in run.counts().items() if v)
    config = run.record.config
    env = run.record.environment
    blocks = [
        Block("h1", f"attnbench report: {run.path.name}"),
        Block(
            "p",
            f"{len(run.frame)} cases ({counts}), run {run.status}, started "
            f"{run.record.start_time or '?'}. Layers {', '.join(config.get('layers', []))}; "
            f"n = {config.get('ns')}, d = {config.get('ds')}, batch {config.get('batch')}, "
            f"{config.get('dtype')}, {config.get('mode')} on {config.get('device')}.",
        ),
        Block("h2", "Environment"),
        Block(
            "table",
            table=pd.DataFrame(
                {"key": list(env), "value": ["–" if v is None else str(v) for v in env.values()]}
            ),
        ),
    ]
    table = comparison_table(run, analysis)
    heading, says = (
        (
            "Table for generation",
            "The chapter's table for generation, one token at context n: each layer's "
            "per-token order beside the log-log exponent measured in this run (the step's "
            "time; the state's bytes, from its tensors; the step's traced steps).",
        )
        if run.mode == "decode"
        else (
            "Comparison table",
            "The chapter's table, each theoretical order beside the log-log exponent measured "
            "in this run (time at fixed d and at fixed n; traced steps; Jacobian path length).",
        )
    )
    blocks += [
        Block("h2", heading),
        Block("p", says),
        Block("table", table=display(table)),
        Block("list", items=tuple(fit_notes(table, run))),
    ]
    for title, frame in fit_tables(analysis).items():
        blocks += [Block("h2", title), Block("table", table=frame)]
    if model_notes(analysis):
        blocks.append(Block("list", items=tuple(model_notes(analysis))))
    blocks.append(
        Block(
            "p",
            "Exponents of time are fitted where the layer's rate (counted work per second) "
            "settled, the largest such sizes; a line whose rate never settled, where its fitted "
            "constant overhead is under half the time (at least the three largest sizes), "
            "marked unsettled; exact counts on every size. "
            "'chapter' is the slope of the chapter's order (attention's n²·d: 2 in n) over the "
            "same sizes, and 'formula' that of the layer's whole FLOP formula (8·n·d² + "
            "4·n²·d grows slower than n² at short n), which 'agrees' judges: it lies in the 95% "
            "interval or within 0.05; 'no: steeper' is a time that grew faster than its work "
            "(its rate fell), and 'can't tell' an interval wider than 1 (two or three noisy "
            "sizes). 'model' is the slope of the "
            "machine model's time (the counts over the measured ceilings, nothing fitted) over "
            "the same sizes: where it sits by the measured exponent and away from the theory's, "
            "the machine bends the curve, not the layer. Models are ranked by AICc on "
            "relative residuals, so a model does not win on a spare term; with a fixed k, the "
            "convolutional and recurrent models are the same curve.",
        )
    )
    if charts:
        blocks.append(Block("h2", "Charts"))
        for path in charts:
            blocks.append(Block("img", os.path.relpath(path, base)))
    return blocks


def write_report(
    run: RunResults,
    analysis: Analysis,
    charts: Sequence[Path],
    *,
    out: Path | None = None,
    html_too: bool = False,
) -> list[Path]:
    """Write ``report.md`` (and ``report.html``) into the results folder; the paths written.

    Only the PNG charts are embedded (one image per chart; the SVGs sit beside them).
    """
    path = out or run.path / REPORT_FILE
    blocks = _blocks(run, analysis, _images(charts), path.parent)
    write_text_atomic(path, to_markdown(blocks))
    written = [path]
    if html_too:
        page = path.with_suffix(".html")
        write_text_atomic(page, to_html(blocks))
        written.append(page)
    return written


def report_markdown(
    run: RunResults, analysis: Analysis, charts: Sequence[Path], folder: Path
) -> str:
    """The Markdown ``write_report`` writes into ``folder``: a committed report is held to it."""
    return to_markdown(_blocks(run, analysis, _images(charts), folder))


def _images(charts: Sequence[Path]) -> list[Path]:
    """The charts a report embeds: the PNGs (the SVGs sit beside them), else what there is."""
    return [p for p in charts if p.suffix == ".png"] or list(charts)
