"""An order in words ("O(k n d^2 log_k n)") read for its power of n, which registering a
plugin holds against the law its verdicts read (``theory.order_problem``)."""

from __future__ import annotations

import pytest

from attnbench.layers import REGISTRY
from attnbench.theory import LayerTheory, Term, n_power, order_problem, sizes


@pytest.mark.parametrize(
    ("words", "power"),
    [
        ("O(n^2 d)", 2.0),
        ("O(k n d^2 log_k n)", 1.0),
        ("O(n d N log n)", 1.0),
        ("O(n^2 d + n d^2)", 2.0),
        ("O(n/k)", 1.0),
        ("O(d/n)", -1.0),
        ("O(n d^2/h)", 1.0),
        ("O(n^1.5 d)", 1.5),
        ("O(2n d)", 1.0),
        ("O(log_k n)", 0.0),
        ("O(1)", 0.0),
        ("O(k^L d)", 0.0),
        ("O(n log^2 n)", 1.0),
        ("O(n log² n)", 1.0),
        ("O(n lg n)", 1.0),
        ("O(n ln n)", 1.0),
        ("O(n log2 n)", 1.0),
        ("O(n log_{k} n)", 1.0),
        # not read: a superscript, a product written as one word, a root, a difference
        ("O(n² d)", None),
        ("O(kn d^2)", None),
        ("O(n√n)", None),
        ("O(n^2 - n)", None),
        ("n d^2", None),
    ],
)
def test_an_order_in_words_reads_as_its_power_of_n(words: str, power: float | None) -> None:
    assert n_power(words) == power


def test_every_built_in_order_grows_as_its_law() -> None:
    for name, entry in REGISTRY.items():
        if entry.theory is not None:
            assert order_problem(entry.theory, sizes(1, 64, 64, entry.resolve({}))) is None, name


def test_words_that_grow_otherwise_than_their_law_are_named() -> None:
    term = (Term(1, "b·n·d", lambda s: s["b"] * s["n"] * s["d"]),)
    linear = LayerTheory("O(n^2 d)", term, order=lambda s: s["n"] * s["d"])
    said = order_problem(linear, sizes(1, 64, 64, {})) or ""
    assert said.startswith("its theory's complexity 'O(n^2 d)' grows as n^2, its order as n^1.00")
    # a log n factor reads 0.06 over n there: within the quarter allowed
    log = LayerTheory("O(n d)", term, order=lambda s: s["n"] * s["d"] * len(bin(int(s["n"]))))
    assert order_problem(log, sizes(1, 64, 64, {})) is None
    unread = LayerTheory("O(n² d)", term, order=lambda s: s["n"] * s["d"])
    assert order_problem(unread, sizes(1, 64, 64, {})) is None  # words not read: not compared
