"""Charts drawn in two processes: each half drawn once, the paths in the asked order, and a
half whose process fails drawn again here."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from attnbench.render import parallel

NAMES = ["time", "memory", "flops", "elementwise", "seq_steps"]


def drawer(folder: Path, fail_elsewhere: bool = False):  # type: ignore[no-untyped-def]
    here = os.getpid()

    def draw(names: Sequence[str]) -> list[Path]:
        if fail_elsewhere and os.getpid() != here:
            raise RuntimeError("the forked half breaks")
        written = []
        for name in names:
            for fmt in ("png", "svg"):
                path = folder / f"{name}.{fmt}"
                path.write_text(str(os.getpid()))  # who drew it
                written.append(path)
        return written

    return draw


@pytest.mark.skipif(not hasattr(os, "fork") or (os.cpu_count() or 1) < 2, reason="needs fork")
def test_the_other_half_is_drawn_in_a_forked_process(tmp_path: Path) -> None:
    found = parallel.draw_in_two(drawer(tmp_path), NAMES)
    assert [p.name for p in found] == [f"{n}.{f}" for n in NAMES for f in ("png", "svg")]
    drew = {p.stem: int(p.read_text()) for p in found}
    assert {drew[n] for n in NAMES[0::2]} == {os.getpid()}  # every second one here
    assert len({drew[n] for n in NAMES[1::2]}) == 1 and drew["memory"] != os.getpid()


@pytest.mark.skipif(not hasattr(os, "fork") or (os.cpu_count() or 1) < 2, reason="needs fork")
def test_a_half_whose_process_fails_is_drawn_here(tmp_path: Path) -> None:
    found = parallel.draw_in_two(drawer(tmp_path, fail_elsewhere=True), NAMES)
    assert [p.stem for p in found][::2] == NAMES
    assert {int(p.read_text()) for p in found} == {os.getpid()}


def test_one_core_or_one_chart_draws_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    found = parallel.draw_in_two(drawer(tmp_path), NAMES)
    assert {int(p.read_text()) for p in found} == {os.getpid()} and len(found) == 10
    monkeypatch.undo()
    assert [p.stem for p in parallel.draw_in_two(drawer(tmp_path), ["time"])] == ["time"] * 2


@pytest.mark.skipif(not hasattr(os, "fork") or (os.cpu_count() or 1) < 2, reason="needs fork")
def test_a_half_whose_process_hangs_is_killed_and_drawn_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    monkeypatch.setattr(parallel, "MIN_WAIT_S", 0.3)
    monkeypatch.setattr(parallel, "WAIT_FACTOR", 1.0)
    here, inner = os.getpid(), drawer(tmp_path)

    def draw(names: Sequence[str]) -> list[Path]:
        if os.getpid() != here:
            time.sleep(3600)  # stuck: the parent must not wait for it
        return inner(names)

    found = parallel.draw_in_two(draw, NAMES)
    assert [p.stem for p in found][::2] == NAMES
    assert {int(p.read_text()) for p in found} == {os.getpid()}


def test_the_halves_are_split_by_what_each_chart_takes_to_draw() -> None:
    """Every second chart gave one process 4.6 s of the default run's charts and the other
    3.3 s; split by each one's cost, the halves take about as long, each in the asked order."""
    cost = {"time": 1.0, "memory": 0.7, "flops": 0.7, "elementwise": 0.9, "seq_steps": 0.8,
            "path_len": 0.8, "crossover": 0.3, "time-split": 1.8}  # fmt: skip
    names = list(cost)
    first, second = parallel.halves(names, cost)
    assert sorted(first + second) == sorted(names)
    assert first == [n for n in names if n in first] and second == [n for n in names if n in second]
    sums = [sum(cost[n] for n in half) for half in (first, second)]
    assert abs(sums[0] - sums[1]) <= 0.3  # every second name: 3.1 against 3.9
    alternate = [sum(cost[n] for n in names[i::2]) for i in (0, 1)]
    assert abs(alternate[0] - alternate[1]) > abs(sums[0] - sums[1])
    assert parallel.halves(NAMES) == (NAMES[0::2], NAMES[1::2])  # no costs: every second one
    assert parallel.halves(["a", "b"], {}) == (["a"], ["b"])  # unknown: 1 each
