"""One piece of work in a fresh process, forked from a server that has imported torch and
attnbench but never run a torch op (a process that has run one must not fork: the child's
first parallel op waits forever on OpenMP's threads, which fork did not copy).

The forked process writes its answer to a pipe and exits; the server watches it meanwhile and
ends it when it outgrows its memory or its time, so whatever kills the work of one case (the
kernel's out-of-memory killer, a segfault in a plugin's extension, a hang) kills this process,
never the sweep. A process costs a fork and what its work sets up (about 7 ms and the layer's
first call here), not the second of an import; a server forks each job's process ahead, as a
spare that waits for its job (``fork_spare``), and answers as soon as the process's answer is
whole, before its memory is torn down (about 9 ms here): neither is a wait of the sweep's.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import select
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from attnbench.devices import available_bytes, process_bytes
from attnbench.errors import first_line
from attnbench.spec import MEMORY_SHARE
from attnbench.units import fmt_bytes

# How often the server reads the process's memory while it works.
WATCH_S = 0.02
READ_CHUNK = 1 << 16


class Ending(str, enum.Enum):
    """How a process's work ended, when it brought no answer."""

    OOM = "oom"  # it outgrew its memory (stopped here, or by the kernel)
    TIMEOUT = "timeout"  # it outlived its time
    DIED = "died"  # it died otherwise (a signal, an exit without an answer)


@dataclass(frozen=True)
class Outcome:
    """What a fresh process brought back: its answer, or how it ended without one."""

    answer: dict[str, Any] | None
    ending: Ending | None = None
    reason: str = ""
    peak_rss_bytes: int | None = None  # the process's largest resident set


@dataclass(frozen=True)
class Limits:
    """What one process may take: seconds of wall time, and bytes of resident memory (None:
    ``MEMORY_SHARE`` of what is available when it starts)."""

    wall_s: float
    memory_bytes: int | None = None


Prepare = Callable[[], Callable[[dict[str, Any]], dict[str, Any]]]


@dataclass(frozen=True)
class Spare:
    """A process forked ahead of its work (``fork_spare``): it has made what every job needs
    (``prepare``) and waits for its message on ``jobs``, answering on ``answers``."""

    pid: int
    jobs: int  # the write end of its message's pipe
    answers: int  # the read end of its answer's pipe


def fork_spare(prepare: Prepare, settle_s: float = 0.0) -> Spare:
    """Fork a process that runs ``prepare`` now and waits for one message, then answers it
    with what ``prepare`` returned and exits: the fork and the set-up are not the job's wait.
    With ``settle_s``, return once it has prepared (or after that many seconds): a spare that
    set itself up while another server's job timed took a core from that job."""
    jobs_read, jobs_write = os.pipe()
    answers_read, answers_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the forked process; its outcome is what the tests read
        os.close(jobs_write)
        os.close(answers_read)
        _child(prepare, jobs_read, answers_write)
    os.close(jobs_read)
    os.close(answers_write)
    if settle_s > 0 and select.select([answers_read], [], [], settle_s)[0]:
        os.read(answers_read, len(PREPARED))  # its mark (or nothing: it died preparing)
    return Spare(pid, jobs_write, answers_read)


PREPARED = b" "  # what a spare writes once prepared: whitespace before its JSON answer


def _child(prepare: Prepare, jobs: int, out: int) -> None:
    """In the forked process: prepare, wait for the message, do the work, write the answer as
    one JSON document, close it (the server reads it whole before this process's memory is
    torn down) and exit without running the server's exit handlers (they are the server's)."""
    code = 0
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)  # the server's protocol stays the server's: no reading it
        os.dup2(2, 1)  # and anything written to stdout, even by C code, goes to stderr
        try:
            with open("/proc/self/oom_score_adj", "w", encoding="ascii") as fh:
                fh.write("1000")  # the kernel's first choice, should memory run out
        except OSError:
            pass
        try:
            work = prepare()
        except BaseException as exc:
            work = _failing(exc)
        os.write(out, PREPARED)
        message = _read_all(jobs)
        if not message:  # the server went away before it had work for this process
            return
        try:
            answer = work(json.loads(message))
        except BaseException as exc:  # one line for the driver, whatever broke
            answer, code = {"op": "error", "message": first_line(exc)}, 1
        data = json.dumps(answer).encode()
        view = memoryview(data)
        while view:
            view = view[os.write(out, view) :]
        os.close(out)
    finally:
        _leave(code)


def _leave(code: int) -> None:
    """End the forked process at once: no exit handler of the server's runs in it."""
    os._exit(code)


def _failing(exc: BaseException) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def work(message: dict[str, Any]) -> dict[str, Any]:
        raise exc

    return work


def _read_all(fd: int) -> bytes:
    chunks: list[bytes] = []
    while chunk := os.read(fd, READ_CHUNK):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def run_fresh(work: Callable[[], dict[str, Any]], limits: Limits) -> Outcome:
    """Run ``work`` in a process forked from this one, watched until it answers or ends."""
    spare = fork_spare(lambda: lambda _: work())
    outcome = run_spare(spare, {}, limits)
    reap()
    return outcome


# Processes that answered and are still exiting (their memory torn down): reaped by ``reap``.
_exiting: list[int] = []


def run_spare(spare: Spare, message: dict[str, Any], limits: Limits) -> Outcome:
    """Send ``spare`` its message and watch it until it answers or ends: its answer comes back
    as soon as it is whole, and the process, still exiting, is left to ``reap``."""
    free = available_bytes()
    start = time.monotonic()
    allowed = limits.memory_bytes
    if allowed is None and free is not None:
        allowed = int(MEMORY_SHARE * free) + (process_bytes("VmRSS", spare.pid) or 0)
    with contextlib.suppress(OSError):  # a process already gone answers nothing: read below
        data = memoryview(json.dumps(message).encode())
        while data:
            data = data[os.write(spare.jobs, data) :]
    os.close(spare.jobs)
    chunks: list[bytes] = []
    ending, reason, peak = None, "", 0
    try:
        while True:
            ready, _, _ = select.select([spare.answers], [], [], WATCH_S)
            if ready:
                chunk = os.read(spare.answers, READ_CHUNK)
                if not chunk:
                    break
                chunks.append(chunk)
                continue
            rss = process_bytes("VmRSS", spare.pid)
            peak = max(peak, process_bytes("VmHWM", spare.pid) or 0)
            if allowed is not None and rss is not None and rss > allowed:
                ending = Ending.OOM
                reason = (
                    f"the process grew to {fmt_bytes(rss)}, past the {fmt_bytes(allowed)} it may "
                    "take"
                )
                break
            if time.monotonic() - start > limits.wall_s:
                ending, reason = Ending.TIMEOUT, f"the process ran past {limits.wall_s:g} s"
                break
    finally:
        os.close(spare.answers)
        if ending is not None:
            _kill(spare.pid)
    if ending is not None:
        os.waitpid(spare.pid, 0)
        return Outcome(None, ending, reason, peak or None)
    answer = _parse(b"".join(chunks))
    gone, status = os.waitpid(spare.pid, os.WNOHANG)
    if answer is not None and not gone:  # whole, and the process is only exiting
        _exiting.append(spare.pid)
        return Outcome(answer, peak_rss_bytes=peak or None)
    if not gone:
        _, status = os.waitpid(spare.pid, 0)
    if answer is not None and os.WIFEXITED(status):
        return Outcome(answer, peak_rss_bytes=peak or None)
    return Outcome(None, *_death(status, answer), peak_rss_bytes=peak or None)


def discard(spare: Spare) -> None:
    """Close a spare's pipes (a waiting one leaves on the empty message) and reap it."""
    os.close(spare.jobs)
    os.close(spare.answers)
    with contextlib.suppress(ChildProcessError):  # reaped already: it died waiting
        os.waitpid(spare.pid, 0)


def reap() -> None:
    """Wait for the processes that answered to finish exiting."""
    while _exiting:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(_exiting.pop(), 0)


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _parse(data: bytes) -> dict[str, Any] | None:
    try:
        found = json.loads(data) if data else None
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def _death(status: int, answer: dict[str, Any] | None) -> tuple[Ending, str]:
    """How a process that brought no (whole) answer ended, in words."""
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        name = signal.Signals(number).name if number in signal.Signals._value2member_map_ else ""
        if number == signal.SIGKILL:
            return (
                Ending.OOM,
                "the process was killed (SIGKILL: the kernel's out-of-memory killer?)",
            )
        return Ending.DIED, f"the process died of signal {number}" + (f" ({name})" if name else "")
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else status
    return Ending.DIED, f"the process exited with status {code} and no answer"
