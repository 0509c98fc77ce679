"""The run's prior (``attnbench.priors``): Smyth's moments recover a known prior, a homogeneous
run pools every case, and a noisy layer keeps its own spread."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from attnbench.priors import LEAST_GROUP, prior_of, priors_of
from attnbench.spec import spread_group


def test_smyths_moments_recover_the_prior_the_variances_were_drawn_from() -> None:
    """Cases whose true variances follow a scaled inverse chi-square (4 degrees of freedom,
    scale 0.01), each seen through 2 or 5 degrees of freedom of its own: the fit reads both."""
    rng = np.random.default_rng(1)
    entries = []
    for i in range(4000):
        true = 0.01 * 4 / rng.chisquare(4)
        df = 2.0 if i % 2 else 5.0
        entries.append((float(true * rng.chisquare(df) / df), df))
    prior = prior_of(entries)
    assert prior is not None
    assert prior.df == pytest.approx(4.0, rel=0.15)
    assert prior.variance == pytest.approx(0.01, rel=0.1)


def test_a_homogeneous_run_pools_its_cases_up_to_their_own_degrees_of_freedom() -> None:
    """Variances no further apart than sampling gives: one variance for every case, weighted
    by the cases' degrees of freedom together, never more (here two cases, 2 each: 4)."""
    rng = np.random.default_rng(2)
    same = [(float(0.01 * rng.chisquare(2) / 2), 2.0) for _ in range(400)]
    prior = prior_of(same)
    assert prior is not None and prior.df > 100
    assert prior.variance == pytest.approx(0.01, rel=0.15)
    two = prior_of([(0.010, 2.0), (0.011, 2.0)])
    assert two is not None and two.df == 4.0
    assert two.variance == pytest.approx(0.0105)  # their pooled variance


def test_cases_without_a_positive_variance_make_no_prior() -> None:
    assert prior_of([]) is None
    assert prior_of([(0.01, 2.0)]) is None
    assert prior_of([(0.01, 2.0), (None, 2.0), (0.0, 2.0), (math.nan, 2.0)]) is None
    assert prior_of([(0.01, 2.0), (0.02, 0.0)]) is None  # no degrees of freedom: no variance


def test_a_group_with_enough_cases_has_a_prior_of_its_own() -> None:
    """A layer of ``LEAST_GROUP`` cases is shrunk toward its own; one of fewer toward the
    run's; a group never seen, the run's too."""
    quiet = [("conv", v, 2.0) for v in (1e-4, 2e-4, 1.5e-4, 3e-4)]
    noisy = [("lstm", v, 2.0) for v in (1e-2, 2e-2, 1.5e-2)]
    few = [("gru", 1e-2, 2.0)] * (LEAST_GROUP - 1)
    priors = priors_of([*quiet, *noisy, *few])
    conv, lstm, gru = priors.of("conv"), priors.of("lstm"), priors.of("gru")
    assert conv is not None and lstm is not None and priors.run is not None
    assert conv.variance < 1e-3 < lstm.variance
    assert gru == priors.run == priors.of("ssm")
    assert priors.run == prior_of([(v, df) for _, v, df in [*quiet, *noisy, *few]])


def test_a_cases_group_is_its_id_without_its_sizes() -> None:
    assert spread_group("conv/n=64/d=32/k=3/b=1/float32/cpu/forward") == (
        "conv/k=3/b=1/float32/cpu/forward"
    )
    assert spread_group("lstm/n=512/d=64/b=1/float32/cpu/forward/compiled=default") == (
        "lstm/b=1/float32/cpu/forward/compiled=default"
    )


def _simulated() -> Any:
    """``benchmarks/priors.py``, whose simulation this test holds."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "priors.py"
    spec = importlib.util.spec_from_file_location("benchmark_priors", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_noisy_layer_keeps_its_own_spread_and_its_intervals_hold_a_re_run() -> None:
    """Shrunk toward its own layer's cases, every layer's 95% interval holds a re-run about 95%
    of the time; toward the whole run's, the noisy layers' hold far less often (the fixed weight
    before 2026-12-02 did the same)."""
    spreads = [0.02] * 9 + [0.08] * 2  # nine layers at 2%, two at 8%, four cases a layer
    coverage = _simulated().coverage
    by_layer, whole = coverage(spreads, 4, True, 120), coverage(spreads, 4, False, 120)
    assert by_layer[0.02][0] > 0.9 and by_layer[0.08][0] > 0.9
    assert whole[0.08][0] < 0.86
    assert by_layer[0.02][1] < whole[0.02][1]  # the quiet layers' intervals narrower
