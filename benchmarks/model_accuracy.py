"""How well the machine model predicts a run: relative RMS per layer, term by term.

For a results folder with ceilings in its run.json (a sweep records them), this prints, per
layer, the relative RMS of the predicted against the measured time (google-benchmark's relative
RMS, as ``attnbench fit`` reports it) three ways:

- ``before``: every product at its kind's one rate (a 1024³ GEMM's peak, one large
  convolution, one fused attention), every byte at memory's bandwidth;
- ``+ widths``: each product at its kind's rate for its narrow width (``Ceilings.rate``);
- ``+ op rates``: and each elementwise op at its own rate (an exp against an add);
- ``+ fused LSTM``: and a call whose timed path ran a fused recurrent kernel at that kernel's
  measured rate, the rate of a 256-step call with its set-up folded in (as before the set-up
  was measured apart);
- ``+ LSTM set-up (the model)``: and that kernel's rate per step, its set-up charged once a
  call as latency: the model itself, where the ceilings measured the set-up;
- ``all-layer NNLS``: the one least-squares fit of the model's terms over every layer at once.
- ``rounds (floor)``: how far the run's timing rounds are from each other (``rounds_rms``),
  the median over pairs of rounds: no model can be checked closer than the machine repeats
  itself (a layer at 40% beside rounds at 70% misses by the noise; beside 12%, by the model).

    python benchmarks/model_accuracy.py RESULTS [--ceilings FILE] [--setup-from FILE]

The ceilings default to the run's own. ``--setup-from`` takes the LSTM set-up from another
ceilings file, as each width's share of a 256-step call there, and applies those shares to the
run's own one-rate-per-width LSTM rates: for a run whose ceilings predate the set-up. Nothing is
fitted per layer but in the last column.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pandas as pd

from attnbench.fits.roofline import effective_ceilings, predict, relative_rms, rounds_rms
from attnbench.measure.machine.ceilings import Ceilings
from attnbench.measure.machine.ceilings_file import read_ceilings
from attnbench.measure.machine.rates import lstm_flops
from attnbench.results.loader import load_results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--ceilings", type=Path, default=None)
    parser.add_argument("--setup-from", type=Path, default=None, help="a ceilings file")
    args = parser.parse_args()
    run = load_results(args.results)
    ceilings = read_ceilings(args.ceilings) if args.ceilings else run.ceilings
    if ceilings is None:
        raise SystemExit(f"{args.results}: no ceilings in run.json; pass --ceilings")
    frame = run.measured
    single = dataclasses.replace(
        ceilings, gemm_rates=None, elementwise_rates=None, recurrent_rates=None,
        conv_rates={1: ceilings.rate("conv")}, attention_rates={1: ceilings.rate("attention")},
    )  # fmt: skip
    curves = dataclasses.replace(ceilings, elementwise_rates=None, recurrent_rates=None)
    ops = dataclasses.replace(ceilings, recurrent_rates=None)
    if args.setup_from is not None:
        ceilings = with_setup(ceilings, read_ceilings(args.setup_from))
    models = {"before": single, "+ widths": curves, "+ op rates": ops,
              "+ fused LSTM": folded(ceilings),
              "+ LSTM set-up (the model)": ceilings}  # fmt: skip
    columns = {}
    for name, chosen in models.items():
        found = predict(frame, chosen)
        columns[name] = _per_layer(frame, found["predicted_time_s"])
    fitted = effective_ceilings(frame, ceilings)
    if fitted is not None:
        columns["all-layer NNLS"] = _per_layer(frame, fitted.predicted)
    columns["rounds (floor)"] = rounds_rms(run.samples, frame)
    table = pd.DataFrame(columns)
    table.loc["median"] = table.median()
    print(f"{args.results}: {len(frame)} cases, relative RMS of predicted against measured time")
    print((table * 100).round(0).astype("Int64").astype(str).add("%").to_string())
    within = (table.drop(index="median") <= 0.30).sum()
    print("layers within 30%: " + ", ".join(f"{k} {v}" for k, v in within.items()))


def folded(ceilings: Ceilings) -> Ceilings:
    """The LSTM rates with each call's set-up folded into one 256-step rate, no set-up apart."""
    calls = ceilings.recurrent_call_s
    if not ceilings.recurrent_rates or not calls:
        return ceilings
    rates = {}
    for w, rate in ceilings.recurrent_rates.items():
        seconds = lstm_flops(w) / rate + ceilings.recurrent_call(w)
        rates[w] = lstm_flops(w) / seconds
    return dataclasses.replace(ceilings, recurrent_rates=rates, recurrent_call_s=None)


def with_setup(ceilings: Ceilings, other: Ceilings) -> Ceilings:
    """``ceilings`` (one 256-step rate per width) split as ``other`` splits its calls: each
    width's set-up share of a 256-step call there taken off the rate and charged per call."""
    if not ceilings.recurrent_rates or ceilings.recurrent_call_s or not other.recurrent_call_s:
        return ceilings
    theirs = folded(other)
    assert theirs.recurrent_rates is not None
    rates, calls = {}, {}
    for w, rate in ceilings.recurrent_rates.items():
        call = lstm_flops(w) / theirs.rate("recurrent", w)
        share = other.recurrent_call(w) / call
        seconds = lstm_flops(w) / rate
        calls[w] = share * seconds
        rates[w] = lstm_flops(w) / (seconds - calls[w])
    return dataclasses.replace(ceilings, recurrent_rates=rates, recurrent_call_s=calls)


def _per_layer(frame: pd.DataFrame, predicted: pd.Series) -> pd.Series:
    both = frame.assign(predicted=predicted)
    return pd.Series({
        layer: relative_rms(rows["time_s"], rows["predicted"])
        for layer, rows in both.groupby("layer", sort=False)
    })  # fmt: skip


if __name__ == "__main__":
    main()
