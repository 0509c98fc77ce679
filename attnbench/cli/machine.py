"""``attnbench machine``: the device's own ceilings (peak FLOP/s, memory bandwidth, the latency
of one dispatched op, a page fault), measured here and cached."""

from __future__ import annotations

import json
from typing import Annotated

import pandas as pd
import typer

from attnbench.cli.options import json_flag
from attnbench.cli.render import Streams, frame_table
from attnbench.devices import DEVICE_CHOICES, DTYPES, local_device
from attnbench.errors import AttnbenchError
from attnbench.measure.ceilings import cache_dir, machine_ceilings
from attnbench.units import fmt_seconds


def machine(
    device: Annotated[
        str, typer.Option(help=f"{DEVICE_CHOICES}.", envvar="ATTNBENCH_DEVICE")
    ] = "auto",
    dtype: Annotated[str, typer.Option(help=f"{', '.join(DTYPES)}.")] = "float32",
    threads: Annotated[
        int | None,
        typer.Option(
            help="CPU threads while measuring (default: torch's, as a sweep uses).",
            show_default=False,
        ),
    ] = None,
    remeasure: Annotated[
        bool, typer.Option("--remeasure", help="Measure again instead of reading the cache.")
    ] = False,
    as_json: Annotated[bool, json_flag("the ceilings (a file attnbench predict reads)")] = False,
) -> None:
    """Measure this device's ceilings: a large GEMM's FLOP/s, a STREAM-like copy's bandwidth,
    one tiny op's latency and a page fault's cost (cached per machine, torch version, device,
    dtype and threads, under $ATTNBENCH_CACHE_DIR or ~/.cache/attnbench)."""
    if threads is not None and threads < 1:
        raise AttnbenchError(f"--threads must be at least 1 (got {threads})")
    if dtype not in DTYPES:
        raise AttnbenchError(f"--dtype {dtype!r}: accepted: {', '.join(DTYPES)}")
    found, cached = machine_ceilings(
        local_device(device, dtype), dtype, threads, remeasure=remeasure
    )
    if as_json:
        typer.echo(json.dumps({**found.to_dict(), "cached": cached}, indent=2))
        return
    rows = [
        ("peak FLOP/s", f"{found.peak_flops_per_s / 1e9:.1f} GFLOP/s",
         f"{found.gemm_side}x{found.gemm_side} matrix product, {found.dtype}"),
        ("memory bandwidth", f"{found.bandwidth_bytes_per_s / 1e9:.1f} GB/s",
         f"copy of {found.stream_bytes // 2 // 2**20} MiB (read + written)"),
        ("op latency", fmt_seconds(found.op_latency_s), "one add on one-element tensors"),
        ("page fault", "–" if found.page_fault_s is None else fmt_seconds(found.page_fault_s),
         "a fresh 4 KiB page touched once" if found.page_fault_s else "not counted here"),
    ]  # fmt: skip
    streams = Streams.make()
    title = (
        f"{found.device_name} ({found.device}, {found.threads} thread(s), "
        f"torch {found.torch_version})"
    )
    frame_table(pd.DataFrame(rows, columns=["ceiling", "value", "measured with"]), streams.out,
                title=title)  # fmt: skip
    where = "read from the cache" if cached else "measured now and cached"
    streams.err.print(f"{where} in {cache_dir()} (--remeasure measures again)", markup=False)
