"""``attnbench machine``: the device's own ceilings (peak FLOP/s, memory bandwidth, the latency
of one dispatched op, a page fault), measured here and cached; ``attnbench predict``: a run's
times from its counts and those ceilings (``fits.roofline``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

import pandas as pd
import typer

from attnbench.cli.analysis import load_saved
from attnbench.cli.options import SavedRun, json_flag
from attnbench.cli.render import Streams, frame_table
from attnbench.devices import DEVICE_CHOICES, DTYPES, check_threads, device_kind, local_device
from attnbench.errors import AttnbenchError
from attnbench.fits import Analysis
from attnbench.fits.prediction import LayerMiss, Prediction, predict_run
from attnbench.measure.machine.ceilings import Ceilings
from attnbench.measure.machine.ceilings_file import cache_dir, machine_ceilings, read_ceilings
from attnbench.measure.machine.probes import PASSES
from attnbench.options import default_threads
from attnbench.render.charts import build_charts, save_charts
from attnbench.render.report import crossover_display
from attnbench.results.run import RunResults
from attnbench.units import fmt_seconds


def machine(
    device: Annotated[
        str, typer.Option(help=f"{DEVICE_CHOICES}.", envvar="ATTNBENCH_DEVICE")
    ] = "auto",
    dtype: Annotated[str, typer.Option(help=f"{', '.join(DTYPES)}.")] = "float32",
    threads: Annotated[
        int | None,
        typer.Option(
            help="CPU threads while measuring (default: 1 on the CPU, as a sweep uses; "
            "torch's on a GPU).",
            show_default=False,
        ),
    ] = None,
    remeasure: Annotated[
        bool, typer.Option("--remeasure", help="Measure again instead of reading the cache.")
    ] = False,
    passes: Annotated[
        int,
        typer.Option(
            help="Passes over the whole set of kernels; each keeps its fastest. More passes "
            "ride out a busy shared machine (about 0.9 s each on a 2-core CPU).",
        ),
    ] = PASSES,
    as_json: Annotated[bool, json_flag("the ceilings (a file attnbench predict reads)")] = False,
) -> None:
    """Measure this device's ceilings: peak FLOP/s, memory bandwidth, op latency, the host's
    cost per op, page fault.

    A large GEMM's FLOP/s, a STREAM-like copy's bandwidth, each kind of product's FLOP/s by
    width (GEMM, convolution, fused attention, a fused LSTM's steps), each elementwise op's
    rate, one tiny op's latency and a page fault's cost, cached per machine, torch version,
    device, dtype, threads and set of kernels under $ATTNBENCH_CACHE_DIR (else
    $XDG_CACHE_HOME/attnbench, else ~/.cache/attnbench). A sweep records them in run.json at
    its start.
    """
    if threads is not None and threads < 1:
        raise AttnbenchError(f"--threads must be at least 1 (got {threads})")
    if threads is not None:
        check_threads(threads)
    if passes < 1:
        raise AttnbenchError(f"--passes must be at least 1 (got {passes})")
    where = local_device(device, dtype)
    threads = threads if threads is not None else default_threads(where)
    found, cached = machine_ceilings(where, dtype, threads, remeasure=remeasure, passes=passes)
    if as_json:
        typer.echo(json.dumps({**found.to_dict(), "cached": cached}, indent=2))
        return
    streams = Streams.make()
    title = (
        f"{found.device_name} ({found.device}, {found.threads} thread(s), "
        f"torch {found.torch_version})"
    )
    frame_table(
        pd.DataFrame(_ceiling_rows(found), columns=["ceiling", "value", "measured with"]),
        streams.out,
        title=title,
    )
    where = "read from the cache" if cached else "measured now and cached"
    streams.err.print(f"{where} in {cache_dir()} (--remeasure measures again)", markup=False)


def _peak_source(found: Ceilings) -> str:
    """The product the peak was read on: the square GEMM, or a curve's faster one
    (``ceilings.fastest_rate``)."""
    names = {"gemm": "matrix product", "conv": "Conv1d", "recurrent": "LSTM"}
    for kind, curve in found.curves.items():
        for width, rate in (curve or {}).items():
            if rate == found.peak_flops_per_s:
                what = names.get(kind, kind)
                return f"{what} of width {width} (faster than the {found.gemm_side}-side square)"
    return f"{found.gemm_side}x{found.gemm_side} matrix product"


def _ceiling_rows(found: Ceilings) -> list[tuple[str, str, str]]:
    """Each ceiling, its value and what measured it, for people."""
    return [
        (
            "peak FLOP/s",
            f"{found.peak_flops_per_s / 1e9:.1f} GFLOP/s",
            f"{_peak_source(found)}, {found.dtype}",
        ),
        (
            "memory bandwidth",
            f"{found.bandwidth_bytes_per_s / 1e9:.1f} GB/s",
            f"copy of {found.stream_bytes // 2 // 2**20} MiB (read + written)",
        ),
        *_curve_rows(found),
        ("op latency", fmt_seconds(found.op_latency_s), "one add on one-element tensors"),
        (
            "host per op",
            "–" if found.host_op_s is None else fmt_seconds(found.host_op_s),
            "an op inside a module call, calls not synchronised one by one"
            if found.host_op_s
            else "not measured (the file does not hold it)",
        ),
        (
            "page fault",
            "–" if found.page_fault_s is None else fmt_seconds(found.page_fault_s),
            "a fresh 4 KiB page touched once" if found.page_fault_s else "not counted here",
        ),
    ]


def _curve_rows(found: Ceilings) -> list[tuple[str, str, str]]:
    """The rates by width and the elementwise ops' rates, a row each (where the file holds
    them)."""
    rows = []
    for label, curve, what in (
        ("GEMM by width", found.gemm_rates, "(rows x w) @ (w x w), operands in cache"),
        ("conv by width", found.conv_rates, "Conv1d(w, w, 3)"),
        ("attention by width", found.attention_rates, "4 heads of width w"),
        ("fused LSTM by width", found.recurrent_rates, "nn.LSTM(w, w), per step"),
    ):
        if curve:
            value = " ".join(f"{w}:{r / 1e9:.0f}" for w, r in sorted(curve.items()))
            rows.append((label, f"{value} GFLOP/s", what))
    if found.recurrent_call_s:
        value = " ".join(f"{w}:{fmt_seconds(c)}" for w, c in sorted(found.recurrent_call_s.items()))
        rows.append(("fused LSTM call", value, "its set-up, beyond its steps, by width"))
    if found.elementwise_rates:
        rates = found.elementwise_rates
        slow = ", ".join(
            f"{op} {rates[op] / 1e9:.2f}" for op in sorted(rates, key=lambda op: rates[op])[:4]
        )
        rows.append(
            (
                "elementwise ops",
                f"{len(rates)} ops, add {rates.get('add', 0) / 1e9:.1f} G/s",
                f"slowest (G elements/s): {slow}",
            )
        )
    return rows


MachineFile = Annotated[
    Path | None,
    typer.Option(
        "--machine",
        help="A ceilings file (attnbench machine --json, here or on another machine). "
        "Default: the ceilings the run recorded when it started (its own machine's), or, "
        "for a run that recorded none, this machine's, for its device, dtype and threads "
        "(cached).",
        show_default=False,
    ),
]
PredictedCharts = Annotated[
    Path | None,
    typer.Option(
        "--charts",
        help="Draw the predicted run's charts (time, crossover, time-split, roofline) into "
        "this folder: the run as it would look on that machine.",
        show_default=False,
    ),
]
Method = Annotated[
    str | None,
    typer.Option(
        "--method",
        help="carried: each measured time scaled by the two machines' ceilings (its "
        "kernels' part by their rates and bandwidths for the case's own work, the rest by "
        "their hosts), for a run that recorded its machine's ceilings, on a device of the "
        "same kind; counts: the counts alone on the target's ceilings. Default: carried "
        "where it can be, else counts.",
        show_default=False,
    ),
]


def predict(
    folder: SavedRun = None,
    machine_file: MachineFile = None,
    charts: PredictedCharts = None,
    method: Method = None,
    as_json: Annotated[bool, json_flag("the predicted times and crossovers")] = False,
) -> None:
    """Predict a run's times on a machine from its ceilings: the run's measured times carried
    there, or its counts alone, nothing fitted.

    Carried (a GPU run to another GPU, a CPU run to another CPU): each case's measured time is
    split into its kernels' part (kernel_time_s where the run has it, else the counts model's
    share) and the host's, and each is scaled by the two machines' ceilings. Counts: each
    product takes FLOPs / its kind's rate at its width plus its bytes / bandwidth, each
    elementwise op max(elements / its rate, bytes / bandwidth), the rest of the traffic
    bytes / bandwidth, every op the host's cost per op, every page fault its cost; on a GPU a
    call costs the larger of the host's time and the device's. Beside the measured times it
    says which method ran, how far it is and where the time goes, then the crossovers on that
    machine; --charts draws the run as it would look there.
    """
    run = load_saved(folder)
    ceilings = _ceilings_for(run, machine_file)
    found = predict_run(run, ceilings, method)
    table, options, analysis = found.table, found.options, found.analysis
    drawn = _draw(found.run, analysis, charts, ceilings) if charts is not None else []
    if as_json:
        typer.echo(json.dumps(_predicted_json(found, ceilings, drawn), indent=2))
        return
    streams = Streams.make(width=140)
    shown = table.assign(
        **{c: table[c].map(lambda v: "–" if pd.isna(v) else str(int(v))) for c in options},
        measured=table["time_s"].map(fmt_seconds),
        predicted=table["predicted_time_s"].map(fmt_seconds),
        ratio=(table["predicted_time_s"] / table["time_s"]).map(lambda r: f"{r:.2f}"),
    )[["layer", "n", "d", *options, "measured", "predicted", "ratio", "bound"]]
    title = (
        f"Predicted ({found.method}) on the ceilings of {ceilings.device_name} "
        f"({ceilings.device}, {ceilings.threads} thread(s), {ceilings.dtype})"
    )
    frame_table(shown, streams.out, title=title)
    streams.err.print(f"method: {found.why}", markup=False, soft_wrap=True)
    for miss in found.misses:
        streams.err.print(_miss_line(miss), markup=False, soft_wrap=True)
    crossings = crossover_display(analysis)
    if not crossings.empty:
        shown = crossings.rename(columns={"measured n": "predicted n"})
        frame_table(
            shown, streams.out, title="Crossovers on that machine, from the predicted times"
        )
    for path in drawn:
        streams.err.print(f"drew {path}", markup=False, soft_wrap=True)


def _predicted_json(found: Prediction, ceilings: Ceilings, drawn: list[Path]) -> dict[str, Any]:
    """``predict --json``: the machine, the method and why, each case, the crossovers."""
    return {
        "machine": ceilings.to_dict(),
        "method": found.method,
        "method_why": found.why,
        "results": json.loads(found.table.to_json(orient="records", double_precision=15)),
        "crossovers": json.loads(found.analysis.crossovers.to_json(orient="records")),
        "charts": [str(p) for p in drawn],
    }


def _miss_line(miss: LayerMiss) -> str:
    """How far one layer's prediction is, and where its time goes, in one line."""
    where = (
        ""
        if math.isnan(miss.kernels)
        else f" (its kernels {miss.kernels:.0%}, its overhead {miss.overhead:.0%} of the time)"
    )
    bounds = ", ".join(f"{b} {c}" for b, c in miss.bounds.items())
    rounds = "" if math.isnan(miss.rounds) else f"; its rounds {miss.rounds:.0%} from each other"
    return (
        f"{miss.layer}: relative RMS {miss.rms:.0%}{where} over {miss.cases} case(s)"
        f"{rounds}; bound: {bounds}"
    )


PREDICTED_CHARTS = ("time", "crossover", "time-split", "roofline")


def _draw(run: RunResults, analysis: Analysis, folder: Path, ceilings: Ceilings) -> list[Path]:
    """The predicted run's charts, each titled with the machine it is predicted on."""
    figures = build_charts(run, analysis, PREDICTED_CHARTS)
    if not figures:
        raise AttnbenchError(
            "nothing to draw: each chart needs a layer predicted at two sizes or more"
        )
    where = f"predicted on {ceilings.device_name} ({ceilings.device}, {ceilings.threads} thread(s))"
    for figure in figures.values():
        figure.suptitle(f"{figure.get_suptitle()}\n{where}")
    return save_charts(figures, folder)


def _ceilings_for(run: RunResults, machine_file: Path | None) -> Ceilings:
    if machine_file is not None:
        ceilings = read_ceilings(machine_file)
    elif run.ceilings is not None:
        ceilings = run.ceilings  # the machine it was measured on, recorded at its start
    else:
        config = run.record.config
        device, dtype = str(config.get("device", "cpu")), str(config.get("dtype", "float32"))
        threads = pd.to_numeric(run.measured.get("threads"), errors="coerce").dropna()
        try:
            here = local_device(device, dtype)
        except AttnbenchError:
            raise AttnbenchError(
                f"{run.path} was measured on {device}, which this machine lacks: pass "
                "--machine with that machine's ceilings (attnbench machine --json there)"
            ) from None
        count = int(threads.median()) if len(threads) else None
        ceilings, _ = machine_ceilings(here, dtype, count)
    recorded = run.record.config
    measured_in = recorded.get("dtype")
    notes = []
    if measured_in and measured_in != ceilings.dtype:
        notes.append(f"note: the ceilings are for {ceilings.dtype}, the run measured {measured_in}")
    device = str(recorded.get("device", ""))
    if device and device_kind(device) != device_kind(ceilings.device):
        # The model charges the ops of the run's device: another kind's fused kernels differ.
        notes.append(
            f"note: the run was measured on {device} and the ceilings are of {ceilings.device}: "
            "the model charges the ops the run's device dispatched, so a layer that the other "
            "device runs as one fused kernel (cuDNN's recurrences) or op by op is mispredicted"
        )
    for note in notes:
        Streams.make().err.print(note, markup=False, soft_wrap=True)
    return ceilings
