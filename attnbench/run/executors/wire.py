"""Jobs and their results as plain JSON, for a worker in another interpreter.

A child process may run another attnbench version (``attnbench ab --base-python``), so nothing
crosses as a pickle: a job is its case, round, seed and policies; a result is the row the
child's ``CaseResult`` produced, with its raw samples. ``PROTOCOL`` changes when this does, and
both sides refuse a partner that speaks another.
"""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any

from attnbench.formats import partner_message
from attnbench.measure.counts.countcache import Counting
from attnbench.measure.record import CaseResult
from attnbench.measure.timing.calibration import Calibration
from attnbench.measure.timing.loop import Stop, TimingPolicy, TimingStats
from attnbench.run.executors.base import Job, JobDone, Placement
from attnbench.run.executors.fresh import Ending, Outcome
from attnbench.schema import Status
from attnbench.spec import Case

# 8: a timing carries the blocks its round left out; 7: a timing carries the other processes'
# CPU beside its round; 6: a job's policy carries
# the machine's quiet level and a round's wait, a timing the seconds it waited (5: a fork
# server (start's "fresh"), a job's wall limit, a result's process and how a watched process
# ended; 4: a job's policy names its timer, a result its clocks)
PROTOCOL = 8


def timing_to_wire(timing: TimingStats | None) -> dict[str, Any] | None:
    return None if timing is None else asdict(timing)


def timing_from_wire(data: dict[str, Any] | None) -> TimingStats | None:
    if data is None:
        return None
    data = partner_message("timing", data)
    stop, clocks, faults, refs = (data[k] for k in ("stop", "clocks_mhz", "faults", "references_s"))
    return TimingStats(
        tuple(data["samples_s"]),
        data["calls_per_sample"],
        data["total_s"],
        stop=None if stop is None else Stop(stop),
        clocks_mhz=None if clocks is None else tuple(clocks),
        faults=None if faults is None else tuple(faults),
        major_faults=data["major_faults"],
        references_s=None if refs is None else tuple(refs),
        others_cores=None if data["others_cores"] is None else tuple(data["others_cores"]),
        waited_s=float(data["waited_s"]),
        left_out=data["left_out"],
    )


def job_to_wire(job: Job) -> dict[str, Any]:
    out = asdict(job)
    out["case"] = job.case.to_dict()  # (the calibration travels whole, as asdict made it)
    return out


def calibration_from_wire(data: dict[str, Any]) -> Calibration:
    """A job's calibration kernel back from plain data (the fields a message does not hold
    take the kernel's defaults)."""
    policy = data.get("policy")
    return Calibration(**{**data, **({"policy": TimingPolicy(**policy)} if policy else {})})


def job_from_wire(data: dict[str, Any]) -> Job:
    calibration = data["calibration"]
    return Job(
        **{
            **data,
            "case": Case.from_dict(data["case"]),
            "policy": TimingPolicy(**data["policy"]),
            "calibration": None if calibration is None else calibration_from_wire(calibration),
            "counting": Counting(**data["counting"]),
        }
    )


_RESULT_FIELDS = [f.name for f in fields(CaseResult) if f.name not in ("case", "timing")]


def done_to_wire(done: JobDone) -> dict[str, Any]:
    result = done.result
    return {
        "where": None if done.where is None else asdict(done.where),
        "result": None
        if result is None
        else {
            **{name: getattr(result, name) for name in _RESULT_FIELDS},
            "timing": timing_to_wire(result.timing),
        },
        "timing": timing_to_wire(done.timing),
        "point": timing_to_wire(done.point),
        "lost": done.lost,
        "load_1m": done.load_1m,
        "process": done.process,
        "ended": done.ended,
    }


def lost_to_wire(outcome: Outcome) -> dict[str, Any]:
    """A job whose fresh process brought no answer, as ``done_from_wire`` reads it."""
    ended = outcome.ending.value if outcome.ending is not None else Ending.DIED.value
    return {
        "where": None,
        "result": None,
        "timing": None,
        "point": None,
        "lost": outcome.reason or "the process brought no answer",
        "load_1m": None,
        "process": "",
        "ended": ended,
    }


def done_from_wire(job: Job, data: dict[str, Any]) -> JobDone:
    """The result of ``job`` as the child sent it (fields this version does not know of are
    dropped, so a child of a newer version still answers)."""
    data = partner_message("done", data)
    result = data["result"]
    return JobDone(
        job,
        None if data["where"] is None else Placement(**data["where"]),
        result=None
        if result is None
        else CaseResult(
            case=job.case,
            timing=timing_from_wire(result.get("timing")),
            **{name: result[name] for name in _RESULT_FIELDS if name in result}
            | {"status": Status(result["status"])},
        ),
        timing=timing_from_wire(data["timing"]),
        point=timing_from_wire(data["point"]),
        lost=data["lost"],
        load_1m=data["load_1m"],
        process=data["process"],
        ended=data["ended"],
    )
