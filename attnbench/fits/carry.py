"""A measured run carried to another device of the same kind: each case's measured time, split
into what bounds it, each part scaled by the two devices' ceilings (Habitat's wave scaling,
with the host's part scaled too).

The part of a call the device's kernels ran scales with the two devices' rates for that
case's own mix of work: the counts-only model's compute and memory seconds on the target over
the same on the source, so a GEMM-heavy case follows the products' rates and a copy-heavy one
the bandwidths. The rest (Python, modules, the dispatcher, launches) scales with the hosts:
the ratio of their ``host_op_s`` where both ceilings have it, else of their ``op_latency_s``.
The kernels' part is the run's measured ``kernel_time_s`` where it has one, else the counts-
only model's device share on the source's own ceilings.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from attnbench.devices import device_kind
from attnbench.fits import roofline
from attnbench.measure.machine.ceilings import Ceilings
from attnbench.schema import numeric_column

CARRIED = "carried"  # the measured times, scaled by the two devices' ceilings
COUNTS = "counts"  # the counts alone on the target's ceilings (fits.roofline)
METHODS = (CARRIED, COUNTS)


@dataclass(frozen=True)
class HostRatio:
    """How much slower the target's host issues an op than the source's, and from what."""

    ratio: float
    basis: str  # "host_op_s", or "op_latency_s" where either machine lacks the host ceiling


def host_ratio(source: Ceilings, target: Ceilings) -> HostRatio:
    """Target over source host cost per op (``host_op_s`` where both have it)."""
    if source.host_op_s and target.host_op_s:
        return HostRatio(target.host_op_s / source.host_op_s, "host_op_s")
    return HostRatio(target.op_latency_s / source.op_latency_s, "op_latency_s")


def carry(frame: pd.DataFrame, source: Ceilings, target: Ceilings) -> pd.DataFrame:
    """One row per case of ``frame`` the model can read (flops, bytes and ops counted): its
    time carried to the target (``predicted_time_s``), the kernels' and the host's parts of
    it (``kernels_s``, ``host_s``), the share of the measured time given to the kernels and
    where that share came from (``measured`` or ``model``), and the bound: ``device`` where
    the kernels' part is the larger, else ``host``."""
    here = roofline.predict(frame, source)
    there = roofline.predict(frame, target)
    rows = frame.loc[here.index]
    time = numeric_column(rows, "time_s")
    device_here = here["compute_s"] + here["memory_s"]
    device_there = there["compute_s"] + there["memory_s"]
    host_here = here["latency_s"] + here["faults_s"]
    modelled = (device_here / (device_here + host_here)).where(device_here + host_here > 0, 0.0)
    kernel = numeric_column(rows, "kernel_time_s")  # NaN where the split was not measured
    measured = kernel.notna() & time.gt(0)
    share = (kernel / time).clip(0.0, 1.0).where(measured, modelled)
    device_ratio = (device_there / device_here).where(device_here > 0, 1.0)
    hosts = host_ratio(source, target)
    kernels_s = time * share * device_ratio
    host_s = time * (1 - share) * hosts.ratio
    return pd.DataFrame(
        {
            "case_id": rows["case_id"],
            "predicted_time_s": kernels_s + host_s,
            "bound": (kernels_s >= host_s).map({True: "device", False: "host"}),
            "kernels_s": kernels_s,
            "host_s": host_s,
            "kernel_share": share,
            "share_from": measured.map({True: "measured", False: "model"}),
        },
        index=rows.index,
    )


def can_carry(run_device: str, source: Ceilings | None, target: Ceilings) -> str | None:
    """Why a run cannot be carried to ``target`` (None: it can): it needs its own machine's
    ceilings, on a device of the same kind as the target."""
    if source is None:
        return "the run recorded no ceilings of its own machine"
    if device_kind(run_device) != device_kind(target.device):
        return f"the run was measured on {run_device}, the ceilings are of {target.device}"
    if (source.device_name, source.measured_at) == (target.device_name, target.measured_at):
        return "the ceilings are the run's own machine's: carried, it would read as measured"
    return None
