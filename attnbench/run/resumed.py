"""What a resumed run brings to its job queue: the rows and samples already on disk, read back
as the queue's state (which cases are done and ok, each case's rounds, samples, references,
and busy rounds), so a resume goes on where the stopped run was."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from attnbench.measure.timing.contention import is_busy
from attnbench.results.run import RunResults
from attnbench.run.blocks import Block, block_of
from attnbench.schema import Status


@dataclass(frozen=True)
class Previous:
    """What a resumed run brings to its queue: the rows and samples already on disk, the case
    its process died in (recorded failed unless retried), and how many cases ``retry`` measures
    again."""

    run: RunResults
    died: str | None = None
    retried: int = 0


@dataclass
class Restored:
    """A run's cases on disk as the queue holds them (empty for a new run)."""

    done: set[str] = field(default_factory=set)
    ok: set[str] = field(default_factory=set)
    device_of: dict[str, str] = field(default_factory=dict)  # case_id -> its first round's
    blocks: list[Block] = field(default_factory=list)
    rounds_done: dict[str, set[int]] = field(default_factory=dict)  # case_id -> rounds ended
    next_sample: dict[str, int] = field(default_factory=dict)
    samples: dict[str, dict[int, list[float]]] = field(default_factory=dict)  # by round
    references: dict[str, dict[int, float | None]] = field(default_factory=dict)  # by round
    busy: dict[str, set[int]] = field(default_factory=dict)  # rounds beside a busy neighbour
    spent_s: dict[str, float] = field(default_factory=dict)  # case_id -> its rounds' seconds
    ran: dict[str, str] = field(default_factory=dict)  # case_id -> its layer_source: the code


def _named(layer_source: str) -> tuple[str, ...]:
    """What a row's ``layer_source`` names in its parentheses: its sha256, its distribution."""
    text = layer_source.strip()
    inside = text[text.rfind(" (") + 2 : -1] if text.endswith(")") and " (" in text else text
    return tuple(part.strip() for part in inside.split(","))


def same_code(one: str, other: str) -> bool:
    """Whether two ``layer_source`` texts name one code: by their sha256 where both name one,
    else by the rest their parentheses name (a row that names a module's distribution alone);
    never by the spec before them (a Ray worker may run a shipped copy elsewhere)."""
    a, b = _named(one), _named(other)
    digests = [next((p for p in x if p.startswith("sha256 ")), None) for x in (a, b)]
    if digests[0] and digests[1]:
        return digests[0] == digests[1]
    return [p for p in a if p not in digests] == [p for p in b if p not in digests]


def reference(value: Any) -> float | None:
    """A reference read back from samples.csv (NaN: not read)."""
    return None if value is None or pd.isna(value) else float(value)


def restored(previous: Previous | None) -> Restored:
    """The queue's state of ``previous``'s run: every case with a row is done, those ok keep
    their device, a failure blocks its larger cases, and each case's rounds come back with
    their samples, references and busy marks."""
    state = Restored()
    if previous is None:
        return state
    run = previous.run
    for row in run.frame.itertuples():
        state.done.add(row.case_id)
        if row.status == Status.OK:
            state.ok.add(row.case_id)
            state.device_of[row.case_id] = row.device_name
            state.ran[row.case_id] = str(getattr(row, "layer_source", "") or "")
        block = block_of(row, Status(row.status), row.case_id in run.died_cases)
        if block is not None:
            state.blocks.append(block)
    for case_id, group in run.samples.groupby("case_id"):
        key, rounds = str(case_id), group.groupby("round")
        state.rounds_done[key] = set(group["round"].tolist())
        state.next_sample[key] = int(group["sample"].max()) + 1
        state.samples[key] = {int(r): g["time_s"].tolist() for r, g in rounds}
        state.references[key] = {int(r): reference(g["reference_s"].iloc[0]) for r, g in rounds}
        state.busy[key] = {
            int(r) for r, g in rounds if is_busy(reference(g["others_cores"].iloc[0]))
        }
        # Its budget counts as spent: each round's block size is not on disk to charge it
        # again, and a guess below the live run's gave a complete run more rounds. A resumed
        # case gets the rounds it lacks of --processes, no more.
        state.spent_s[key] = math.inf
    return state
