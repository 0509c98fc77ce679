"""The sweep's state and the jobs it hands out: order, skips after a failure, retries, rounds.

Cases covered by a failure of a smaller one (out of memory, out of time, a crash), and one the
previous process died in, are written as they come up, without a worker. Each case is timed in
rounds (under the fork executor, each a fresh process): its first round with its counts, in
grid order (an auto grid's by length); the later ones after every first round, in a shuffled
order, so no case is timed at the same moment of the sweep or after the same neighbour twice. A
sweep adds rounds to a case while the interval over its rounds is wider than the target
(``Replication``).
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from dataclasses import dataclass, replace
from typing import Any

import torch

from attnbench.estimators import kept_log_variance, quiet_level, quieter
from attnbench.layers.registry import REGISTRY, entry
from attnbench.measure.counts.countcache import DEFAULT_COUNTING, Counting
from attnbench.measure.record import DIED_ERROR, WORKER_DIED_ERROR, CaseResult
from attnbench.measure.timing.calibration import DEFAULT_CALIBRATION, Calibration
from attnbench.measure.timing.contention import is_busy
from attnbench.measure.timing.loop import Stop, TimingPolicy, TimingStats
from attnbench.priors import Priors, priors_of
from attnbench.results.store import ResultsWriter
from attnbench.run.auto import AutoPlan
from attnbench.run.blocks import block_of
from attnbench.run.events import ProgressCallback, ProgressEvent
from attnbench.run.executors.base import Job, JobDone, Placement
from attnbench.run.executors.fresh import Ending
from attnbench.run.quiet import wait_left
from attnbench.run.resumed import Previous, restored, same_code
from attnbench.run.rounds import Replication, budget_spent, round_policy
from attnbench.run.signals import GracefulStop
from attnbench.schema import Status
from attnbench.spec import Case, Grid, spread_group

# The most a round waits for the machine to read quiet (``measure.timing.reference.settle``),
# within what is left of the sweep's ``--wait-quiet``.
ROUND_WAIT_S = 10.0
# How a job whose process the fork server ended for its memory or its time is recorded: no
# retry, since the next process would end the same way.
ENDED_STATUS = {Ending.OOM.value: Status.OOM, Ending.TIMEOUT.value: Status.TIMEOUT}


# What a case's process may run before it is ended as a hang: ten minutes, or, where the first
# call has a limit (--max-case-seconds), a minute plus the twenty calls a round can make.
HANG_S = 600.0


def wall_limit(grid: Grid) -> float:
    """Seconds a case's process may run (``Job.wall_limit_s``)."""
    return HANG_S if grid.max_case_s is None else 60.0 + 20 * grid.max_case_s


def _first(references: tuple[float | None, ...] | None) -> float | None:
    """A round's machine reference (its samples all carry it)."""
    return references[0] if references else None


@dataclass(frozen=True)
class Measuring:
    """What every case of a sweep is measured with, the same on every worker: ``policy`` how
    each round samples (None: ``round_policy`` of the grid), ``calibration`` the GEMM timed
    between cases (None: off), ``counting`` how the exact counts are taken, ``quiet_s`` the
    median quiet reference of this machine's latest sweeps (``run.quiet``; None: unknown),
    which a round is judged against as well as the sweep's own."""

    policy: TimingPolicy | None = None
    calibration: Calibration | None = DEFAULT_CALIBRATION
    counting: Counting = DEFAULT_COUNTING
    quiet_s: float | None = None


DEFAULT_MEASURING = Measuring()
UNCALIBRATED = Measuring(calibration=None)  # no calibration GEMM between the cases


class JobQueue:
    """The sweep's state, and the jobs it hands to idle workers in order: retries first, then
    each case's first round in grid order (an auto grid's by length, every line's n before any
    line's 2n), then later rounds (round by round, shuffled with the grid's seed, each on the
    device model its first round ran on). Cases covered by a failure of a smaller one, and one
    the previous process died in, are written as they come up, without a worker."""

    def __init__(
        self,
        grid: Grid,
        writer: ResultsWriter,
        previous: Previous | None = None,
        *,
        measuring: Measuring,
        in_process: bool,
        progress: ProgressCallback | None,
        stop: GracefulStop,
        replication: Replication | None = None,
    ) -> None:
        self.grid, self.writer, self.progress, self.stop = grid, writer, progress, stop
        self.machine_quiet = measuring.quiet_s
        self.waited_s = 0.0  # what the rounds waited for a quiet machine, in all
        # case_id -> the rule that ended its rounds (``Replication.stop_of``), a resume's too
        self.round_stops: dict[str, str] = (
            dict(previous.run.record.round_stops) if previous is not None else {}
        )
        # the cases whose rounds an earlier session ended: a resume adds none (it would judge
        # their rounds against its own quiet level, lower once it reads them all, and a round
        # the first session read quiet could then want another; a complete run measured more)
        self.ended = set(self.round_stops)
        self.last: Case | None = None  # the case the latest event was about
        self.cases = grid.cases()
        self.index = {case.case_id: i for i, case in enumerate(self.cases)}
        self.died = previous.died if previous is not None else None
        self.policy = measuring.policy or round_policy(grid)
        self.calibration, self.counting = measuring.calibration, measuring.counting
        self.in_process = in_process
        state = restored(previous)  # a new run's: empty
        # A case's rounds are one code's: a resume adds none to a case that other code began
        # (after a forced resume over an edit, an unforced one had gone on with the edit's).
        for case_id, ran in state.ran.items():
            now = self._code(case_id)  # None: a case out of this grid, never timed here
            if ran and now is not None and not same_code(now, ran) and case_id not in self.ended:
                self.ended.add(case_id)
                self.round_stops[case_id] = Stop.CODE_CHANGED.value
        self.done, self.ok, self.device_of = state.done, state.ok, state.device_of
        self.blocks, self.rounds_done = state.blocks, state.rounds_done  # rounds ended, by case
        self.samples, self.references = state.samples, state.references  # by case, by round
        self.busy = state.busy  # case_id -> its rounds beside a busy neighbour (contention)
        self.spent_s = state.spent_s  # case_id -> its rounds' timed seconds (budget_spent)
        self.next_sample = state.next_sample
        self.replication = replication or Replication.of(grid)
        self.shuffle = random.Random(grid.seed)  # the later rounds' order: shuffled, seeded
        self.running: dict[tuple[str, int], float] = {}  # (case_id, round) out: its wait
        self.retries: deque[Job] = deque()
        self.later: list[tuple[int, float, int]] = []  # heap of (round, shuffled key, grid index)
        for case_id in self.ok:
            if case_id in self.index:
                self._queue_next_round(case_id)
        # --n auto: which lengths of each line run is decided as its cases finish
        self.auto = AutoPlan(grid, fresh=not in_process) if grid.n_auto is not None else None
        self.dropped: set[str] = set()  # auto cases no line will reach: never written
        if self.auto is not None and previous is not None:
            recorded = previous.run.record
            lines = (previous.run.meta.get("auto") or {}).get("lines", [])
            self.auto.restore(previous.run.frame, lines, recorded.config.get("auto_budget_s"))
        first = [i for i, case in enumerate(self.cases) if case.case_id not in self.done]
        if self.auto is not None:  # every line's n before any line's 2n (``AutoPlan._share``)
            first.sort(key=lambda i: self.cases[i].n)
        self.first = deque(first)

    def _code(self, case_id: str) -> str | None:
        """The code a round of the case would run now (``layer_source``); None: not here."""
        if case_id not in self.index:
            return None
        layer = self.cases[self.index[case_id]].layer
        return entry(layer).source.describe() if layer in REGISTRY else None

    @property
    def drained(self) -> bool:
        """No round queued, out or to retry, and a row for every case the sweep may measure: a
        stop heard after the last round ended leaves the run complete (its message had said to
        finish it with --resume, which found nothing to do). Its cases get no second look
        (``_second_look``), as a resume would give them none."""
        left = self.first or self.later or self.running or self.retries
        return not left and self.completed == self.planned

    def notify(self, kind: Any, case: Case, result: CaseResult | None = None, **more: Any) -> None:
        """Tell the caller's progress callback what happened to ``case``."""
        self.last = case
        if self.progress is None:
            return
        self.progress(
            ProgressEvent(
                kind,
                self.index[case.case_id],
                self.planned,
                case,
                result,
                self.completed,
                more.pop("round_", 1),
                self.replication.least,
                self.units_done(),
                running=len(self.running),
                **more,
            )
        )

    @property
    def planned(self) -> int:
        """Cases the sweep may measure: the grid's, less those no auto line will reach."""
        back = self.auto.may_return(self.dropped) if self.auto is not None else 0
        return len(self.cases) - len(self.dropped) + back

    @property
    def completed(self) -> int:
        """Cases of the grid with a row on disk (earlier runs of a resume included)."""
        return sum(case.case_id in self.done for case in self.cases)

    def units_done(self) -> int:
        """(case, round) pairs done, out of ``least`` a case: a case that did not measure has
        nothing left to do (the rounds added past ``least`` are not counted)."""
        least = self.replication.least
        total = 0
        for case in self.cases:
            if case.case_id in self.ok:
                rounds = self.rounds_done.get(case.case_id, set())
                total += len(rounds & set(range(1, least + 1)))
            elif case.case_id in self.done:
                total += least
        return total

    def _job(self, case: Case, round_: int) -> Job:
        # Jobs out at once (Ray's workers) and retries share what is left of --wait-quiet
        held = sum(self.running.values()) + sum(j.policy.wait_s for j in self.retries)
        left = wait_left(self.grid.wait_quiet_s, self.waited_s + held)
        policy = replace(self.policy, quiet_s=self.quiet(), wait_s=min(ROUND_WAIT_S, left))
        return Job(
            case=case,
            round=round_,
            seed=self.grid.seed,
            policy=policy,
            max_case_s=self.grid.max_case_s,
            calibration=self.calibration,
            device_name=self.device_of.get(case.case_id) if round_ > 1 else None,
            counting=self.counting,
            wall_limit_s=wall_limit(self.grid),
            memory_limit_bytes=self.grid.max_case_memory,
        )

    def _queue_next_round(self, case_id: str) -> None:
        """Another round of the case, if ``Replication`` wants one (one at a time: each later
        round is decided on the ones before it)."""
        if case_id in self.ended:
            return
        done = self.rounds_done.get(case_id, set())
        if any(round_ == 1 + max(done) for round_, _, i in self.later if i == self.index[case_id]):
            return
        quiet = self.quiet()
        stop = self._stop_now(case_id, quiet, self.prior(quiet))
        if stop is None:
            key = (1 + max(done), self.shuffle.random(), self.index[case_id])
            heapq.heappush(self.later, key)
        elif stop is not Stop.BUDGET or math.isfinite(self.spent_s.get(case_id, 0.0)):
            # why its rounds ended, for its time_stop (run.json's round_stops); the first
            # decision holds. A resume charges a case's earlier rounds the whole budget (their
            # blocks are not on disk), which says nothing of why they ended: not recorded.
            self.round_stops.setdefault(case_id, stop.value)

    def _stop_now(self, case_id: str, quiet: float | None, prior: Priors) -> Stop | None:
        """What ends the case's rounds, read now against ``quiet`` and ``prior`` (the caller's:
        a prior reads every case's rounds, so a look at many cases reads it once)."""
        measured = sorted(self.samples.get(case_id, {}).items())
        mine, beside = self.references.get(case_id, {}), self.busy.get(case_id, ())
        return self.replication.stop_of(
            [samples for _, samples in measured],
            len(self.rounds_done.get(case_id, ())),
            [mine.get(r) for r, _ in measured],
            quiet,
            prior.of(spread_group(case_id)),
            self.spent_s.get(case_id, 0.0),
            [r in beside for r, _ in measured],
        )

    def _second_look(self) -> bool:
        """Once no round is left or out, the cases stopped precise against the spread of the
        cases before them, read again against every case's, as the interval written is (22 of a
        default sweep read ±5.1-7.7% in the end): those now wider get another round."""
        again = [
            case_id
            for case_id, why in self.round_stops.items()
            if why == Stop.PRECISE.value and case_id not in self.ended
        ]
        quiet = self.quiet()
        prior = self.prior(quiet)
        again = [case_id for case_id in again if self._stop_now(case_id, quiet, prior) is None]
        for case_id in again:
            del self.round_stops[case_id]
            self._queue_next_round(case_id)
        return bool(again)

    def own_quiet(self) -> float | None:
        """The sweep's own quiet level so far, from its rounds' references
        (``estimators.quiet_level``; None: it read none)."""
        seen = [r for mine in self.references.values() for r in mine.values() if r is not None]
        found = quiet_level(seen)
        return None if math.isnan(found) else found

    def quiet(self) -> float | None:
        """The quiet machine reference: the sweep's own, or the machine's latest sweeps'
        where that is quieter (a sweep busy throughout)."""
        return quieter(self.own_quiet(), self.machine_quiet)

    def prior(self, quiet: float | None) -> Priors:
        """The sweep's typical spread between a case's rounds so far (``priors.Priors``)."""
        spreads = []
        for case_id, rounds in self.samples.items():
            mine, beside = self.references.get(case_id, {}), self.busy.get(case_id, set())
            groups = tuple(tuple(samples) for samples in rounds.values())
            refs, busy = tuple(mine.get(r) for r in rounds), tuple(r in beside for r in rounds)
            spreads.append((spread_group(case_id), *kept_log_variance(groups, refs, quiet, busy)))
        return priors_of(spreads)

    def take(self, where: Placement) -> Job | None:
        """The next job for a worker at ``where``, or None when there is none for it now."""
        if self.stop.requested:
            return None
        job = self._next(where)
        if job is None:
            return None
        self.running[(job.case.case_id, job.round)] = job.policy.wait_s
        if self.in_process:
            # What a resumed run learns if this process dies: the case it died in.
            if job.round == 1:
                self.writer.begin(job.case)
            elif self.writer.meta.get("current_case") is not None:
                self.writer.begin(None)
        self.notify("start", job.case, round_=job.round)
        return job

    def _next(self, where: Placement) -> Job | None:
        for _ in range(len(self.retries)):
            job = self.retries.popleft()
            if job.device_name in (None, where.device_name):
                return job
            self.retries.append(job)
        for i in list(self.first):
            case = self.cases[i]
            if self.auto is not None and case.case_id != self.died:
                go, why = self.auto.decide(case)
                if not go and not why:
                    continue  # its line's case before it is still running
                if not go:
                    self.first.remove(i)
                    self.dropped.add(case.case_id)
                    continue
            self.first.remove(i)
            unrun = self._unrun(case)
            if unrun is None:
                if self.auto is not None:
                    self.auto.started(case)
                return self._job(case, 1)
            self._write(unrun)  # never runs: written at once
        if self.auto is not None and not self.first:  # every line stopped: what is left
            back = self.auto.reopen([self.cases[self.index[c]] for c in self.dropped])
            self.dropped -= {case.case_id for case in back}
            self.first.extend(self.index[case.case_id] for case in back)
            if back:
                return self._next(where)
        passed: list[tuple[int, float, int]] = []
        try:
            while self.later:
                round_, key, i = heapq.heappop(self.later)
                case = self.cases[i]
                if self.device_of.get(case.case_id, where.device_name) == where.device_name:
                    return self._job(case, round_)
                passed.append((round_, key, i))  # for a worker on its own device model
        finally:
            for item in passed:
                heapq.heappush(self.later, item)
        if not (self.later or self.running) and self._second_look():
            return self._next(where)
        return None

    def _unrun(self, case: Case) -> CaseResult | None:
        """The row of a case that is not to be run (died in before, or blocked), else None."""
        threads = self.grid.threads or torch.get_num_threads()
        if case.case_id == self.died:
            return CaseResult(
                case=case, status=Status.FAILED, threads=threads, error=DIED_ERROR, died=True
            )
        for block in self.blocks:
            if block.covers(case):
                return CaseResult(
                    case=case, status=Status.SKIPPED, threads=threads, error=f"after {block.why}"
                )
        return None

    def _write(
        self, result: CaseResult, point: TimingStats | None = None, process: str = ""
    ) -> None:
        case = result.case
        block = block_of(case, result.status, result.died)
        if block is not None:
            self.blocks.append(block)
        if self.auto is not None:
            self.auto.record(result)
            if case.n == self.grid.ns[-1]:
                self.auto.exhausted(case)
        with self.stop.writing():
            self.writer.append(result, point, process)
            if self.auto is not None:
                self.writer.update(auto=self.auto.describe())
        self.done.add(case.case_id)
        if result.timing is not None:
            self.waited_s += result.timing.waited_s
        if result.status == Status.OK and result.timing is not None:
            self.ok.add(case.case_id)
            self.rounds_done[case.case_id] = {1}
            self.samples[case.case_id] = {1: list(result.timing.samples_s)}
            self.references[case.case_id] = {1: _first(result.timing.references_s)}
            self.busy[case.case_id] = {1} if is_busy(_first(result.timing.others_cores)) else set()
            self.spent_s[case.case_id] = budget_spent(result.timing)
            self.next_sample[case.case_id] = result.timing.count
            self.device_of[case.case_id] = result.device_name
            self._queue_next_round(case.case_id)
        self.notify("done", case, result)

    def finish(self, done: JobDone) -> None:
        """Write what a worker sends back. A job whose worker died runs once more elsewhere;
        one whose process was ended for its memory or its time is recorded so at once."""
        job = done.job
        case = job.case
        self.running.pop((case.case_id, job.round), None)  # what it waited counts instead
        ended = ENDED_STATUS.get(done.ended)
        if done.lost and job.attempt == 1 and ended is None:
            self.retries.append(replace(job, attempt=2))
            self.notify("retry", case, round_=job.round, where=done.where, error=done.lost)
            return
        if job.round == 1:
            result = done.result
            if done.lost or result is None:
                result = self._lost(job, done, ended)
            self._write(replace(result, attempts=job.attempt), done.point, done.process)
            return
        timing = None if done.lost else done.timing
        if timing is not None:
            self.waited_s += timing.waited_s
            first = self.next_sample.get(case.case_id, 0)
            with self.stop.writing():
                self.writer.append_round(
                    case.case_id,
                    job.round,
                    first,
                    timing,
                    done.point,
                    done.load_1m,
                    done.process,
                )
            self.next_sample[case.case_id] = first + timing.count
            self.samples.setdefault(case.case_id, {})[job.round] = list(timing.samples_s)
            self.references.setdefault(case.case_id, {})[job.round] = _first(timing.references_s)
            if is_busy(_first(timing.others_cores)):
                self.busy.setdefault(case.case_id, set()).add(job.round)
            # every round's timed calls count toward --time-budget
            spent = self.spent_s.get(case.case_id, 0.0)
            self.spent_s[case.case_id] = spent + budget_spent(timing)
        self.rounds_done.setdefault(case.case_id, set()).add(job.round)  # failed: not retried
        self._queue_next_round(case.case_id)
        self.notify("done", case, round_=job.round, timing=timing, where=done.where)

    def _lost(self, job: Job, done: JobDone, ended: Status | None) -> CaseResult:
        """The row of a first round that brought no result: out of memory or time where its
        process was ended for it, else failed, its worker dead."""
        where = done.where
        reason = done.lost or "no result came back"
        error = reason if ended is not None else f"{WORKER_DIED_ERROR}: {reason}"
        return CaseResult(
            case=job.case,
            status=ended or Status.FAILED,
            threads=where.threads if where else self.grid.threads or 0,
            error=error[:300],
            died=ended is None,
            node=where.node if where else "",
            device_id=where.device_id if where else "",
            device_name=where.device_name if where else "",
        )
