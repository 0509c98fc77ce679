"""The sweep's state and the jobs it hands out: order, skips after a failure, retries, rounds.

Cases covered by a failure of a smaller one (out of memory, out of time, a crash), and one the
previous process died in, are written as they come up, without a worker.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, replace
from typing import Any

import torch

from attnbench.measure.calibration import Calibration
from attnbench.measure.countcache import DEFAULT_COUNTING, Counting
from attnbench.measure.record import DIED_ERROR, WORKER_DIED_ERROR, CaseResult
from attnbench.measure.timing import TimingPolicy, TimingStats
from attnbench.results.run import RunResults
from attnbench.results.store import ResultsWriter
from attnbench.run.auto import AutoPlan
from attnbench.run.events import ProgressCallback, ProgressEvent
from attnbench.run.executors.base import Job, JobDone, Placement
from attnbench.run.signals import GracefulStop
from attnbench.schema import BLOCKING, Status
from attnbench.spec import Case, Grid


@dataclass(frozen=True)
class _Block:
    layer: str
    n: int
    d: int
    why: str

    def covers(self, case: Case) -> bool:
        """A case at least as long and as wide, of the same layer, would fail the same way."""
        return case.layer == self.layer and case.n >= self.n and case.d >= self.d


def _block(case: Case | Any, status: Status, died: bool) -> _Block | None:
    """What a case's outcome says of the larger cases of its layer: they would fail the same
    way (out of memory, out of time, a dead process); None when it says nothing of them."""
    why = BLOCKING.get(status, "crashed" if died else None)
    if why is None:
        return None
    layer, n, d = case.layer, int(case.n), int(case.d)
    return _Block(layer, n, d, f"{layer} n={n} d={d} {why}")


class JobQueue:
    """The sweep's state, and the jobs it hands to idle workers in order: retries first, then
    each case's first round in grid order, then later rounds (round by round, in grid order,
    each on the device model its first round ran on).  Cases covered by a failure of a smaller
    one, and one the previous process died in, are written as they come up, without a worker."""

    def __init__(
        self,
        grid: Grid,
        writer: ResultsWriter,
        previous: RunResults | None,
        *,
        died: str | None,
        policy: TimingPolicy,
        calibration: Calibration | None,
        in_process: bool,
        progress: ProgressCallback | None,
        stop: GracefulStop,
        counting: Counting = DEFAULT_COUNTING,
    ) -> None:
        self.grid, self.writer, self.progress, self.stop = grid, writer, progress, stop
        self.last: Case | None = None  # the case the latest event was about
        self.cases = grid.cases()
        self.index = {case.case_id: i for i, case in enumerate(self.cases)}
        self.died, self.policy, self.calibration = died, policy, calibration
        self.counting = counting
        self.in_process = in_process
        self.done: set[str] = set()
        self.ok: set[str] = set()
        self.rounds_done: dict[str, set[int]] = {}  # case_id -> rounds finished (or failed)
        self.next_sample: dict[str, int] = {}
        self.device_of: dict[str, str] = {}  # case_id -> device model of its first round
        self.blocks: list[_Block] = []
        self.running: set[tuple[str, int]] = set()  # (case_id, round) of the jobs out
        self.retries: deque[Job] = deque()
        self.later: list[tuple[int, int]] = []  # heap of (round, grid index)
        if previous is not None:
            for row in previous.frame.itertuples():
                self.done.add(row.case_id)
                if row.status == Status.OK:
                    self.ok.add(row.case_id)
                    self.device_of[row.case_id] = row.device_name
                block = _block(row, Status(row.status), row.case_id in previous.died_cases)
                if block is not None:
                    self.blocks.append(block)
            for case_id, group in previous.samples.groupby("case_id"):
                self.rounds_done[str(case_id)] = set(group["round"].tolist())
                self.next_sample[str(case_id)] = int(group["sample"].max()) + 1
            for case_id in self.ok:
                if case_id in self.index:
                    self._queue_next_round(case_id)
        # --n auto: which lengths of each line run is decided as its cases finish
        self.auto = AutoPlan(grid) if grid.n_auto is not None else None
        self.dropped: set[str] = set()  # auto cases no line will reach: never written
        if self.auto is not None and previous is not None:
            self.auto.restore(previous.frame)
        self.first = deque(i for i, case in enumerate(self.cases) if case.case_id not in self.done)

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
                self.grid.rounds,
                self.units_done(),
                running=len(self.running),
                **more,
            )
        )

    @property
    def planned(self) -> int:
        """Cases the sweep will measure: the grid's, less those an auto sweep will not reach."""
        return len(self.cases) - len(self.dropped)

    @property
    def completed(self) -> int:
        """Cases of the grid with a row on disk (earlier runs of a resume included)."""
        return sum(case.case_id in self.done for case in self.cases)

    def units_done(self) -> int:
        """(case, round) pairs done: a case that did not measure has nothing left to do."""
        total = 0
        for case in self.cases:
            if case.case_id in self.ok:
                rounds = self.rounds_done.get(case.case_id, set())
                total += len(rounds & set(range(1, self.grid.rounds + 1)))
            elif case.case_id in self.done:
                total += self.grid.rounds
        return total

    def _job(self, case: Case, round_: int) -> Job:
        return Job(
            case=case,
            round=round_,
            seed=self.grid.seed,
            policy=self.policy,
            max_case_s=self.grid.max_case_s,
            calibration=self.calibration,
            device_name=self.device_of.get(case.case_id) if round_ > 1 else None,
            counting=self.counting,
        )

    def _queue_next_round(self, case_id: str) -> None:
        missing = set(range(2, self.grid.rounds + 1)) - self.rounds_done.get(case_id, set())
        if missing:
            heapq.heappush(self.later, (min(missing), self.index[case_id]))

    def take(self, where: Placement) -> Job | None:
        """The next job for a worker at ``where``, or None when there is none for it now."""
        if self.stop.requested:
            return None
        job = self._next(where)
        if job is None:
            return None
        self.running.add((job.case.case_id, job.round))
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
        passed: list[tuple[int, int]] = []
        try:
            while self.later:
                round_, i = heapq.heappop(self.later)
                case = self.cases[i]
                if self.device_of.get(case.case_id, where.device_name) == where.device_name:
                    return self._job(case, round_)
                passed.append((round_, i))  # for a worker on its own device model
        finally:
            for item in passed:
                heapq.heappush(self.later, item)
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

    def _write(self, result: CaseResult, point: TimingStats | None = None) -> None:
        case = result.case
        block = _block(case, result.status, result.died)
        if block is not None:
            self.blocks.append(block)
        if self.auto is not None:
            self.auto.record(result)
            if case.n == self.grid.ns[-1]:
                self.auto.exhausted(case)
        with self.stop.writing():
            self.writer.append(result, point)
            if self.auto is not None:
                self.writer.update(auto=self.auto.describe())
        self.done.add(case.case_id)
        if result.status == Status.OK and result.timing is not None:
            self.ok.add(case.case_id)
            self.rounds_done[case.case_id] = {1}
            self.next_sample[case.case_id] = result.timing.count
            self.device_of[case.case_id] = result.device_name
            self._queue_next_round(case.case_id)
        self.notify("done", case, result)

    def finish(self, done: JobDone) -> None:
        """Write what a worker sends back; a job whose worker died runs once more elsewhere."""
        job = done.job
        case = job.case
        self.running.discard((case.case_id, job.round))
        if done.lost and job.attempt == 1:
            self.retries.append(replace(job, attempt=2))
            self.notify("retry", case, round_=job.round, where=done.where, error=done.lost)
            return
        if job.round == 1:
            result = done.result
            if done.lost or result is None:
                where = done.where
                result = CaseResult(
                    case=case,
                    status=Status.FAILED,
                    threads=where.threads if where else self.grid.threads or 0,
                    error=f"{WORKER_DIED_ERROR}: {done.lost or 'no result came back'}"[:300],
                    died=True,
                    node=where.node if where else "",
                    device_id=where.device_id if where else "",
                    device_name=where.device_name if where else "",
                )
            self._write(replace(result, attempts=job.attempt), done.point)
            return
        timing = None if done.lost else done.timing
        if timing is not None:
            first = self.next_sample.get(case.case_id, 0)
            with self.stop.writing():
                self.writer.append_round(
                    case.case_id, job.round, first, timing, done.point, done.load_1m
                )
            self.next_sample[case.case_id] = first + timing.count
        self.rounds_done.setdefault(case.case_id, set()).add(job.round)  # failed: not retried
        self._queue_next_round(case.case_id)
        self.notify("done", case, round_=job.round, timing=timing, where=done.where)
