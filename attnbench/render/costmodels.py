"""The cost-model table of ``fit`` and the report: each layer's own model, its coefficients
and the throughput they imply, and the model AICc ranks first, said by what it adds."""

from __future__ import annotations

import pandas as pd

from attnbench.fits import LETTERS, Analysis, cost_models, loglog_slope
from attnbench.fits.models import ZERO_TERM, term_sizes
from attnbench.units import fmt_exponent


def _rate(row: pd.Series, term: str) -> str:
    """A term's implied throughput: GFLOP/s for a FLOP term, G elements/s for the others."""
    if term in row.gflops_per_s:
        return f"{row.gflops_per_s[term]:.3g} GFLOP/s"
    return f"{row.gelements_per_s[term]:.3g} G elements/s"


def _coefficients(row: pd.Series) -> str:
    twins = row.twins if isinstance(row.get("twins"), dict) else {}
    parts = [
        f"{letter}={value:.3g} s ({_rate(row, term)})"
        if value > 0
        else _twin(letter, term, twins[term], row)
        if term in twins
        else f"{letter}=0 (no time seen for {term})"
        for letter, (term, value) in zip(LETTERS, row.coefficients.items(), strict=False)
    ]
    return ", ".join([*parts, f"γ={row.constant_s * 1e6:.0f} µs"])


def _twin(letter: str, term: str, twin: str, row: pd.Series) -> str:
    """A term fitted as part of another (``ModelFit.twins``): where its time went, and why."""
    if twin == ZERO_TERM:
        return f"{letter}=0 ({term} is 0 at every size here)"
    if twin == "γ":
        return f"{letter} in γ ({term} is constant here)"
    names = list(row.coefficients)
    return f"{letter} in {LETTERS[names.index(twin)]}'s (a multiple of {twin} here)"


def model_display(analysis: Analysis) -> pd.DataFrame:
    """Per layer: its own model's fit, and the model that fits best."""
    m = analysis.models
    rows = []
    for layer, group in m.groupby("layer", sort=False):
        own = group[group["own"]]
        best = group[group["best"]].iloc[0]
        if own.empty:
            continue
        own = own.iloc[0]
        rows.append(
            {
                "layer": layer,
                "own model": own.formula,
                "coefficients": _coefficients(own),
                "rel. RMS": f"{own.rms:.1%}",
                # AICc weighs each case's relative error and the terms used; the RMS column is
                # google-benchmark's, on absolute errors: the two can rank two models apart
                BETTER: _better(own, best, analysis),
                "its rel. RMS": f"{best.rms:.1%}",
            }
        )
    return pd.DataFrame(rows)


BETTER = "best by AICc"


def _better(own: pd.Series, best: pd.Series, analysis: Analysis | None = None) -> str:
    """The model AICc ranks first, said by what it adds to the layer's own: lstm's time fitted
    best by "self-attention: α·b·n·d² + β·b·n²·d + ..." read as if lstm were attention, where
    what the ranking says is that a b·n²·d term its own formula lacks took some of its time.
    Each term added is read as its growth in n over the layer's cases (ssm's best named
    "L·b·n·k·d²", sizes an ssm does not have: a term in n^1.1 over its lengths)."""
    if own.best:
        return "own"
    extra = [t for t, a in best.coefficients.items() if a > 0 and t not in own.coefficients]
    # the own terms that carried time and the best model has not (conv's best, state space's
    # model, lacks b·n·k·d²): then it is another curve, not the own one plus a term
    lacks = [t for t, a in own.coefficients.items() if a > 0 and t not in best.coefficients]
    words = []
    for term in extra:
        slope = _term_growth(analysis, str(own.layer), str(best.model), term) if analysis else None
        grows = f"a term in n^{fmt_exponent(slope)} ({term})" if slope is not None else term
        words.append(grows)
    if lacks or not words:
        adds = f"adds {' + '.join(words)}; " if words else ""
        lacking = f"lacks {', '.join(lacks)}" if lacks else f"{best.formula}"
        found = f"{best.model}'s model instead ({adds}{lacking})"
    else:
        found = f"own + {' + '.join(words)}, from {best.model}'s model"
    # Where the model AICc ranks first reads the larger rel. RMS, neither is best on both: a
    # student read attention "best by AICc: state space's model instead (lacks b·n²·d)" at
    # 100.6% beside its own 6.3%, as if attention's time were not quadratic.
    return f"own by rel. RMS; by AICc, {found}" if best.rms > own.rms else found


def _term_growth(analysis: Analysis, layer: str, model: str, term: str) -> float | None:
    """The log-log slope in n of a cost model's term over a layer's cases at its largest d."""
    found = next((m for m in cost_models(analysis.layers) if m.name == model), None)
    fitted = next((t for t in found.terms if t.name == term), None) if found else None
    line = analysis.frame[analysis.frame["layer"] == layer]
    line = line[line["d"] == line["d"].max()].sort_values("n")
    if fitted is None or line["n"].nunique() < 2:
        return None
    sizes = term_sizes(line, [fitted], analysis.layers)[:, 0]
    return loglog_slope(line["n"].tolist(), sizes.tolist())


def better_note(analysis: Analysis) -> list[str]:
    """How to read a layer whose own model is not the best: once, where one is not."""
    display = model_display(analysis)
    if display.empty or (display[BETTER] == "own").all():
        return []
    return [
        f"{BETTER}: where a layer's own model is not the best, the one ranked first is named "
        "by the terms it adds to the own, each by its growth in n over the layer's lengths "
        "(own + a term in n^2.00 (b·h·n²)), or, where it lacks an own term that took time, "
        "as another model instead (adds ...; lacks ...): part of the time grew that way, "
        "which the layer's "
        "counted work does not (a cache outgrown, a kernel changed with n, a per-call cost), "
        "and the term's sizes (k, L, h) need not be the layer's; the cost models are fitted on "
        "every length, the exponents only where the rate settled, and the split table above "
        "says where the rate moved",
        *_ranked_apart(analysis.models),
    ]


def _ranked_apart(models: pd.DataFrame) -> list[str]:
    """A line where the model ranked first reads a larger rel. RMS than the layer's own (the
    model table's rows): a new user read ssm-scan's "best by AICc ... 59.6%" beside its own
    34.4% as a contradiction."""
    named = []
    for layer, group in models.groupby("layer", sort=False):
        own, best = group[group["own"]], group[group["best"]]
        if len(own) and len(best) and best["rms"].iloc[0] > own["rms"].iloc[0]:
            named.append(
                f"{layer} ({best['rms'].iloc[0]:.1%} against its own {own['rms'].iloc[0]:.1%})"
            )
    if not named:
        return []
    return [
        f"{BETTER} ranks by each case's relative error, every length weighed alike, as the "
        "models are fitted; the rel. RMS columns are google-benchmark's, on absolute errors, "
        "which the longest times dominate: so the model ranked first can read the larger "
        f"rel. RMS, as for {', '.join(named)}"
    ]
