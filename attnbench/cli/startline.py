"""The start line's words on time: how long a sweep should take, and how much longer on a
busy machine (``run.estimate`` makes the figures; this says them)."""

from __future__ import annotations

from attnbench.devices import device_kind
from attnbench.run.estimate import Busy
from attnbench.spec import Grid


def estimate_range(low: float | None, high: float, waits_s: float = 0.0) -> str:
    """A sweep's expected duration, "about 20-45 s": a quiet machine's timing stops early, a
    busy one's spends the budget; "45 s or more" where no low end was estimated. ``waits_s``,
    what its rounds may wait for a quiet machine, is in no case's time and is said beside it
    (a new user's ab, "about 3-7 s", took 48 s under load). It is the measuring's: a new user
    read the sweep's 3-5 s as the command's, which drew its charts for 3 s more."""
    span = _duration_range(low, high) + " of measuring"
    return f"{span} (and up to {waits_s:.0f} s waiting for quiet)" if waits_s else span


def cpu_threads(grid: Grid) -> int | None:
    """The threads the cases' ops run on, for the busy note: the grid's on the CPU (None:
    torch's own); 1 on an accelerator, whose ops are its kernels, not the host's threads."""
    return grid.threads if device_kind(grid.device) == "cpu" else 1


def busy_note(
    busy: Busy,
    low: float | None,
    high: float,
    auto: bool,
    first: float = 0.0,
    threads: int | None = None,
) -> str:
    """The start's note on a busy machine ("" on a quiet one): the estimate said is its
    slowdown times a quiet machine's (``first``, the ceilings' seconds, aside), which is said
    too; an auto sweep's budget bounds its cases' time, so there its lines reach shorter
    lengths instead. Ops on several threads slow further, said where the sweep's ``threads``
    are several or torch's own (None), not on the CPU's default one."""
    if busy.slowdown <= 1.0:
        return ""
    several = ", ops on several threads far slower" if threads is None or threads > 1 else ""
    slower = (
        f"the machine is busy ({busy.why}): while it stays so its cases run at least "
        f"{busy.slowdown:.1f}x slower than on a quiet machine{several}"
    )
    if auto:
        return f"{slower}, and its lines reach shorter lengths within their budget"
    quiet_low = (low - first) / busy.slowdown + first if low is not None else None
    quiet = _duration_range(quiet_low, (high - first) / busy.slowdown + first)
    return (
        f"{slower}; the estimate counts the {busy.slowdown:.1f}x alone, and a quiet machine "
        f"would take {quiet}"
    )


def _duration_range(low: float | None, high: float) -> str:
    if low is None:
        return f"{duration(high)} or more"
    high_text = duration(high)
    if high < 1:
        return high_text
    low_text = duration(max(min(low, high), 1.0))
    if low_text == high_text:
        return f"about {high_text}"
    number, _, unit = low_text.partition(" ")
    if unit == high_text.partition(" ")[2]:
        low_text = number
    return f"about {low_text}-{high_text}"


def duration(seconds: float) -> str:
    if seconds < 1:
        return "under a second"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
