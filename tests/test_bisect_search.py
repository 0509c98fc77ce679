"""bisect's search on fake races: three outcomes, an undecided race raced again with twice the
pairs, and one still undecided stopping the search with the commits it narrowed to (counting
it as fast named a docs-only commit as the culprit of a 2.3x step on a busy machine)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

import pytest

from attnbench.compare.bisect import (
    AS_FAST,
    SLOWER,
    UNDECIDED,
    UNDECIDED_EXIT,
    Race,
    Undecided,
    outcome_of,
    search,
)
from attnbench.compare.verdicts import (
    IMPROVEMENT,
    NOT_COMPARED,
    NOT_SIGNIFICANT,
    REGRESSION,
    THROTTLED,
    TOO_FEW,
    UNCHANGED,
)
from attnbench.errors import AttnbenchError

PATH = [f"c{i:02d}" + "0" * 8 for i in range(1, 17)]  # 16 commits after GOOD, BAD last


def races(
    first_bad: int, undecided: Mapping[str, int] | None = None
) -> tuple[Callable[[str, int], Race], list[tuple[str, int]]]:
    """A fake race: slower from PATH[first_bad] on; a commit in ``undecided`` reads undecided
    on its first that-many attempts."""
    seen: list[tuple[str, int]] = []
    stubborn = dict(undecided or {})

    def race(commit: str, attempt: int) -> Race:
        seen.append((commit, attempt))
        if attempt < stubborn.get(commit, 0):
            outcome = UNDECIDED
        else:
            outcome = SLOWER if PATH.index(commit) >= first_bad else AS_FAST
        return Race(commit, "s", 1.3, 0.05, outcome, 10 * 2**attempt)

    return race, seen


def test_the_outcome_is_three_valued() -> None:
    assert outcome_of([UNCHANGED, REGRESSION, NOT_SIGNIFICANT]) == SLOWER
    assert outcome_of([UNCHANGED, IMPROVEMENT, NOT_COMPARED]) == AS_FAST
    for unsure in (NOT_SIGNIFICANT, TOO_FEW, THROTTLED):
        assert outcome_of([UNCHANGED, unsure]) == UNDECIDED
    assert outcome_of([NOT_COMPARED]) == UNDECIDED  # nothing judged is not "as fast"
    assert outcome_of([NOT_COMPARED], broke=True) == SLOWER  # it measured, now it fails


@pytest.mark.parametrize("first_bad", [0, 1, 7, 15])
def test_the_search_finds_the_first_slower_commit(first_bad: int) -> None:
    race, seen = races(first_bad)
    assert search(PATH, race, "good") == PATH[first_bad]
    assert len(seen) <= 1 + 4 and seen[0] == (PATH[-1], 0)  # BAD, then log2(16) halvings


def test_an_undecided_race_is_raced_again_and_its_answer_used() -> None:
    race, seen = races(5, undecided={PATH[7]: 1})
    assert search(PATH, race, "good") == PATH[5]
    assert (PATH[7], 0) in seen and (PATH[7], 1) in seen


def test_a_race_still_undecided_stops_with_the_commits_narrowed_to() -> None:
    race, _ = races(5, undecided={PATH[7]: 2})  # undecided on both attempts
    with pytest.raises(Undecided) as stop:
        search(PATH, race, "good")
    assert stop.value.exit_code == UNDECIDED_EXIT
    message = stop.value.message
    assert "c08" in message and "20 pairs" in message  # the second attempt's pairs
    assert "one of the 16 after good up to c16" in message  # nothing narrowed yet below BAD
    assert stop.value.candidates == tuple(PATH)


def test_the_candidates_narrow_as_the_search_goes() -> None:
    race, _ = races(5, undecided={PATH[3]: 2})  # c16 slower, c08 slower, c04 undecided
    with pytest.raises(Undecided) as stop:
        search(PATH, race, "good")
    assert stop.value.candidates == tuple(PATH[:8])  # after good up to c08, the slower one


def test_bisect_json_still_prints_the_races_when_undecided(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Exit 3 with --json: stdout is the races run and the commits the culprit is among (it
    printed nothing, and a script parsing it failed on empty input)."""
    from typer.testing import CliRunner

    from attnbench.cli import app, history

    ran = [Race(PATH[-1], "s", 1.4, 0.001, SLOWER, 10), Race(PATH[7], "s", 1.1, 0.2, UNDECIDED, 20)]

    def stuck(*_: object, **__: object) -> None:
        raise Undecided("c08 stayed undecided", candidates=PATH[:8], races=ran)

    monkeypatch.setattr(history, "bisect", stuck)
    done = CliRunner().invoke(app, [
        "bisect", "good", "bad", "--layers", "conv", "--n", "16", "--d", "8", "--json",
    ])  # fmt: skip
    assert done.exit_code == UNDECIDED_EXIT
    found = json.loads(done.stdout)
    assert found["outcome"] == "undecided" and found["first_bad"] is None
    assert found["candidates"] == PATH[:8]
    assert [r["commit"] for r in found["races"]] == [PATH[-1], PATH[7]]
    assert "c08 stayed undecided" in done.stderr


def test_bad_as_fast_or_undecided_is_no_bisect() -> None:
    race, _ = races(99)  # nothing is slower
    with pytest.raises(AttnbenchError, match=r"is not slower than .*nothing to bisect") as fast:
        search(PATH, race, "good")
    assert fast.value.exit_code == 2
    race, _ = races(3, undecided={PATH[-1]: 5})
    with pytest.raises(Undecided, match="stayed undecided over 20 pairs"):
        search(PATH, race, "good")
