"""The allocator's state: a CPU timing taken in a stated, history-free state by default.

glibc's malloc maps a large block afresh (above a threshold that moves with what was freed
before), gives the top of its heap back to the kernel once enough is free, and gives each
thread an arena of its own whose heaps come and go. Which of these a layer's tensors meet
depends on what ran before in the process, and each fresh page faults: explicit attention at
n = 512 measured 2-4x apart after different histories. ``pinned`` sets, before anything is
measured, ``M_MMAP_MAX = 0`` (no block is mapped on its own), ``M_TRIM_THRESHOLD = -1`` (the heap
is never trimmed) and ``M_ARENA_MAX = 1`` (one heap for every thread; without it, freed thread
heaps still came and went): after warm-up a call reuses memory that is already mapped, whatever
ran before. ``system`` leaves glibc's defaults: what a user's own program pays.

mallopt was chosen over an LD_PRELOADed jemalloc or tcmalloc because it acts inside the process
that is already running (the CLI's own, for a serial sweep), needs no package the machine may
lack, and measured 0 faults per call after every history.

``pinned`` also asks torch to put its CPU tensors of 2 MiB or more on transparent huge pages
(its own ``THP_MEM_ALLOC_ENABLE``, read at the process's first allocation: it aligns them and
madvises MADV_HUGEPAGE, where the kernel's THP mode allows it). On 4 KiB pages, where a large
tensor's pages land in memory differs from process to process, and a memory-bound call with
them: six fresh processes timed ssm-scan at n = 512 24-28% apart and explicit attention at
n = 512 15-42% apart, against 3-7% and 2% with huge pages (2026-12-01, this project's 2-core
VM), and most of a default sweep's ``!`` marks were ssm-scan's. The record says whether the
pages were taken.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from attnbench.devices import DEFAULT_ALLOCATOR, PINNED, SYSTEM, check_allocator
from attnbench.errors import AttnbenchError
from attnbench.formats import UNRECORDED_ALLOCATOR, partner_message

__all__ = ["DEFAULT_ALLOCATOR", "PINNED", "SYSTEM", "AllocatorState", "set_allocator"]

# mallopt's parameters (malloc.h) and the values that pin the state.
M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8
PINNED_SETTINGS = (
    ("M_MMAP_MAX", M_MMAP_MAX, 0),
    ("M_TRIM_THRESHOLD", M_TRIM_THRESHOLD, -1),
    ("M_ARENA_MAX", M_ARENA_MAX, 1),
)


class Libc(Protocol):
    def mallopt(self, param: int, value: int) -> int: ...
    def gnu_get_libc_version(self) -> bytes: ...
    def malloc_trim(self, pad: int) -> int: ...


@dataclass(frozen=True)
class AllocatorState:
    """The state a process measured in, as run.json records it."""

    state: str  # pinned or system
    mechanism: str  # what was set, in words
    libc: str  # "glibc 2.36", or what else the process runs on

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_current: AllocatorState | None = None  # the state this process was put in, once


def _libc() -> Libc | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
    except (OSError, AttributeError):
        return None  # not glibc (macOS, musl, Windows)
    return libc


def glibc_version(libc: Libc | None) -> str | None:
    if libc is None:
        return None
    try:
        return libc.gnu_get_libc_version().decode()
    except (AttributeError, OSError):
        return None


THP_ENV = "THP_MEM_ALLOC_ENABLE"  # torch's (c10's alloc_cpu): huge pages for tensors >= 2 MiB
THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")
SMAPS = Path("/proc/self/smaps")
PROBE_BYTES = 8 * 2**20  # a tensor torch would madvise, well past its 2 MiB threshold


def _kernel_thp() -> str | None:
    """The kernel's THP mode (always, madvise or never); None where it cannot be read."""
    try:
        found = re.search(r"\[(\w+)\]", THP_MODE.read_text())
    except OSError:
        return None
    return found.group(1) if found else None


# What the probe found of torch's huge pages (``_probe_pages``).
TAKEN, UNADVISED, REFUSED = "taken", "unadvised", "refused"
# The record's words for pages taken and for pages asked for but not verified, which
# ``huge_pages`` reads back (``compare``'s caveat).
TAKEN_WORDS = "huge pages for tensors of 2 MiB or more"
UNVERIFIED_WORDS = "huge pages asked for"


def _mapping_fields(address: int, lines: list[str]) -> dict[str, str] | None:
    """The smaps fields ("Rss", "THPeligible", "VmFlags"...) of the mapping holding
    ``address``; None where none holds it."""
    fields: dict[str, str] | None = None
    for line in lines:
        head, _, rest = line.partition(" ")
        if "-" in head and not head.endswith(":"):  # a mapping's first line: low-high perms...
            if fields is not None:
                return fields
            low, _, high = head.partition("-")
            fields = {} if int(low, 16) <= address < int(high, 16) else None
        elif fields is not None:
            fields[head.rstrip(":")] = rest.strip()
    return fields


def _probe_pages() -> str | None:
    """Whether a CPU tensor of ``PROBE_BYTES``, touched and held while smaps is read, lies in
    a mapping torch advised for huge pages that the kernel may back with them: ``TAKEN``;
    ``UNADVISED`` (no ``hg`` flag: torch had allocated before it was asked), ``REFUSED``
    (advised, but ``THPeligible: 0``: THP is off for this process, a prctl a launcher set);
    None where smaps cannot be read."""
    import torch

    probe = torch.zeros(PROBE_BYTES // 4)  # (2 Mi,) float32, its pages touched
    try:
        lines = SMAPS.read_text().splitlines()
    except OSError:
        return None
    fields = _mapping_fields(probe.data_ptr(), lines)
    del probe
    if fields is None or "VmFlags" not in fields:
        return None
    if "hg" not in fields["VmFlags"].split():
        return UNADVISED
    return REFUSED if fields.get("THPeligible", "1") == "0" else TAKEN


def ask_huge_pages(
    kernel: Callable[[], str | None] = _kernel_thp, probe: Callable[[], str | None] = _probe_pages
) -> str:
    """Ask this process's torch for huge pages for its large CPU tensors (``THP_ENV``), and say
    what took, for the record ("" where the platform has no THP to ask: not Linux)."""
    mode = kernel()
    if mode is None:
        return ""
    os.environ[THP_ENV] = "1"  # read at torch's first allocation: children inherit it too
    if mode == "never":
        return "; no huge pages (the kernel's THP: never)"
    found = probe()
    if found is None:
        return f"; {UNVERIFIED_WORDS} ({THP_ENV}=1), not verified: smaps could not be read"
    if found == UNADVISED:
        return "; no huge pages (torch had allocated in this process before it was asked)"
    if found == REFUSED:
        return "; no huge pages (THP is off for this process: its mappings read THPeligible 0)"
    return f"; {TAKEN_WORDS} ({THP_ENV}=1, the kernel's THP: {mode})"


def huge_pages(record: dict[str, Any]) -> str:
    """Whether a run's torch took huge pages, from its allocator record (run.json's
    ``allocator``): "taken", "asked, not verified", or "not taken" (the system state, a kernel
    or process without THP, or an attnbench that did not ask yet)."""
    mechanism = str(record.get("mechanism", ""))
    if TAKEN_WORDS in mechanism:
        return "taken"
    return "asked, not verified" if UNVERIFIED_WORDS in mechanism else "not taken"


def _inherited_thp() -> str:
    """A system run's word on huge pages its environment asked torch for: what the user's
    own program, started the same way, pays too."""
    value = os.environ.get(THP_ENV)
    return f"; {THP_ENV}={value} from the environment" if value else ""


def set_allocator(
    state: str, libc: Libc | None = None, huge: Callable[[], str] = ask_huge_pages
) -> AllocatorState:
    """Put this process's allocator in ``state`` before it measures, and say what was done.

    Pinning cannot be undone in a process (glibc has no way back to its dynamic thresholds),
    so asking a pinned process for ``system`` is an error: such a run needs a fresh process.
    """
    global _current
    check_allocator(state)
    if _current is not None and _current.state == state:
        return _current
    if _current is not None and _current.state == PINNED:
        raise AttnbenchError(
            "this process's allocator is pinned already; --allocator system needs a fresh "
            "process (run attnbench again)"
        )
    libc = libc if libc is not None else _libc()
    version = glibc_version(libc)
    if libc is None or version is None:  # nothing to pin: record the platform's state as it is
        _current = AllocatorState(SYSTEM, "not glibc: the platform's allocator, unchanged", "")
        return _current
    if state == SYSTEM:
        mechanism = "glibc's defaults (dynamic mmap and trim thresholds)" + _inherited_thp()
        _current = AllocatorState(SYSTEM, mechanism, f"glibc {version}")
        return _current
    refused = [name for name, param, value in PINNED_SETTINGS if libc.mallopt(param, value) != 1]
    if refused:
        raise AttnbenchError(f"glibc {version} refused mallopt {', '.join(refused)}")
    mechanism = "mallopt " + ", ".join(f"{name}={value}" for name, _, value in PINNED_SETTINGS)
    _current = AllocatorState(PINNED, mechanism + huge(), f"glibc {version}")
    return _current


def release_freed(libc: Libc | None = None) -> bool:
    """Give the heap's free memory back to the system (glibc's ``malloc_trim``): what a pinned
    process frees it otherwise keeps mapped for its whole life. For memory that no case will
    reuse (the ceilings' 1 GiB copy), freed before any case runs. False where not glibc."""
    libc = libc if libc is not None else _libc()
    if libc is None or glibc_version(libc) is None or not hasattr(libc, "malloc_trim"):
        return False
    libc.malloc_trim(0)
    return True


def run_state(workers: list[dict[str, Any]]) -> dict[str, Any]:
    """The state a run measured in, from its workers' records (run.json ``allocator``):
    theirs when they agree, "mixed" when they do not, "unrecorded" where a worker did not say
    (``formats.partner_message``) or there is none."""
    states = [partner_message("worker", w)["allocator"] for w in workers]
    if not states:
        return dict(UNRECORDED_ALLOCATOR)
    if all(s == states[0] for s in states):
        return dict(states[0])
    mechanisms = sorted({f"{s.get('state')}: {s.get('mechanism')}" for s in states})
    return {"state": "mixed", "mechanism": "; ".join(mechanisms), "libc": ""}
