"""run.json read once into a typed record: what code decides on, never the raw mapping.

Every field has the value a run made before it was recorded reads as (an empty mapping, None),
so older folders load; the writer keeps the mapping it writes (``results.store``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from attnbench.schema import RunStatus


def _mapping(value: object) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class RunRecord:
    """What run.json says of a run (``RunResults.record``)."""

    status: RunStatus
    config: dict[str, Any] = field(default_factory=dict)  # the grid, as ``spec`` writes it
    environment: dict[str, Any] = field(default_factory=dict)  # ``results.environment``
    layers: dict[str, Any] = field(default_factory=dict)  # each layer's source
    start_time: str | None = None
    end_time: str | None = None
    pid: int | None = None
    current_case: str | None = None  # the case being measured when it last wrote
    cases_total: int | None = None
    duration_s: float | None = None
    fault_cost_s: float | None = None  # one page fault's cost, measured at the start
    allocator: dict[str, Any] = field(default_factory=dict)
    ceilings: dict[str, Any] | None = None  # the machine's, recorded at the start
    ceilings_error: str | None = None  # why they could not be measured
    calibration: Any = None  # the calibration kernel's description

    @classmethod
    def parse(cls, meta: Mapping[str, Any]) -> RunRecord:
        """The record of a run.json mapping (a run killed before it finished reads
        ``running``)."""
        raw = meta.get("status")
        if isinstance(raw, str) and raw in tuple(RunStatus):
            status = RunStatus(raw)
        else:
            status = RunStatus.COMPLETE if meta.get("end_time") else RunStatus.RUNNING
        pid, total = meta.get("pid"), meta.get("cases_total")
        ceilings = meta.get("ceilings")
        return cls(
            status=status,
            config=_mapping(meta.get("config")),
            environment=_mapping(meta.get("environment")),
            layers=_mapping(meta.get("layers")),
            start_time=_text(meta.get("start_time")),
            end_time=_text(meta.get("end_time")),
            pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
            current_case=_text(meta.get("current_case")),
            cases_total=total if isinstance(total, int) and total > 0 else None,
            duration_s=_number(meta.get("duration_s")),
            fault_cost_s=_number(meta.get("fault_cost_s")),
            allocator=_mapping(meta.get("allocator")),
            ceilings=dict(ceilings) if isinstance(ceilings, Mapping) else None,
            ceilings_error=_text(meta.get("ceilings_error")) or None,
            calibration=meta.get("calibration"),
        )
