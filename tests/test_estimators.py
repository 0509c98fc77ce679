"""The estimators, pinned with synthetic samples: fake processes with known offsets, so an
interval that ignores the process level fails here."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnbench.estimators import Estimate, estimate, median_ci

TRUE_S = 1e-3  # the typical process's median: what a re-run's time scatters around


def processes(rng: np.random.Generator, count: int, between: float, within: float = 0.01):
    """``count`` fake processes of 30 samples each: each process runs at its own speed (a
    log-normal offset of ``between``), its samples scatter by ``within`` around it."""
    speeds = TRUE_S * np.exp(rng.normal(0.0, between, size=count))
    return [list(s * np.exp(rng.normal(0.0, within, size=30))) for s in speeds]


def pooled(groups: list[list[float]]) -> tuple[float, float]:
    """What the interval was before processes: order statistics of every sample at once."""
    return median_ci([s for g in groups for s in g])


def test_one_group_is_its_median_and_the_order_statistics_of_its_samples() -> None:
    samples = [5.0, 1.0, 4.0, 2.0, 3.0, 7.0, 6.0, 9.0, 8.0, 10.0]
    found = estimate([samples])
    assert found.center_s == 5.5 and found.groups == 1
    assert (found.low_s, found.high_s) == median_ci(samples) == (2.0, 9.0)
    assert math.isnan(found.between_rel)
    assert math.isnan(estimate([[1.0, 2.0, 3.0]]).low_s)  # under 6 samples: no interval


def test_groups_give_the_geometric_mean_of_their_medians_and_a_t_interval_on_their_logs() -> None:
    from scipy import stats

    groups = [[1.0, 1.0, 1.1], [2.0, 2.2, 2.0], [4.0, 4.0, 3.0]]  # medians 1, 2, 4
    found = estimate(groups)
    logs = np.log([1.0, 2.0, 4.0])
    # a prediction interval for a re-run of three groups: sqrt(1/3 + 1/3)
    reach = stats.t.ppf(0.975, 2) * logs.std(ddof=1) * math.sqrt(2 / 3)
    assert found.center_s == pytest.approx(2.0)  # (1 x 2 x 4) ** (1/3)
    assert found.low_s == pytest.approx(2.0 * math.exp(-reach))
    assert found.high_s == pytest.approx(2.0 * math.exp(reach))
    assert found.between_rel == pytest.approx(logs.std(ddof=1))
    assert found.groups == 3


def test_identical_groups_are_known_exactly_and_empty_groups_are_left_out() -> None:
    found = estimate([[2.0, 2.0], [], [2.0, 2.0]])
    assert (found.center_s, found.low_s, found.high_s, found.groups) == (2.0, 2.0, 2.0, 2)
    assert math.isnan(estimate([]).center_s)
    zero = estimate([[0.0, 0.0], [0.0, 0.0]])  # a clock that never moved: no logs
    assert zero.center_s == 0.0 and math.isnan(zero.low_s)


def coverage(interval, count: int, between: float, trials: int = 400) -> float:
    """How often ``interval(groups) -> (low, high)`` holds a re-run's time: another run of
    ``count`` fresh processes, summarised as ``estimate`` summarises one."""
    rng = np.random.default_rng(7)
    held = 0
    for _ in range(trials):
        low, high = interval(processes(rng, count, between))
        again = estimate(processes(rng, count, between)).center_s
        held += low <= again <= high
    return held / trials


@pytest.mark.parametrize("count", [4, 6])
def test_the_interval_holds_a_re_run_95_times_in_100(count: int) -> None:
    """Processes 8% apart, each timed precisely (1%): the interval over processes holds a
    re-run's time about as often as it says; a confidence interval for the mean (which the
    re-run's own processes scatter around) holds it far less often, and the pooled samples'
    interval, which sees one process's precision, almost never."""
    from scipy import stats

    def over_processes(groups: list[list[float]]) -> tuple[float, float]:
        found: Estimate = estimate(groups)
        return found.low_s, found.high_s

    def of_the_mean(groups: list[list[float]]) -> tuple[float, float]:
        logs = np.log([np.median(g) for g in groups])
        reach = stats.t.ppf(0.975, len(logs) - 1) * logs.std(ddof=1) / math.sqrt(len(logs))
        return math.exp(logs.mean() - reach), math.exp(logs.mean() + reach)

    assert 0.92 <= coverage(over_processes, count, between=0.08) <= 0.98
    assert coverage(of_the_mean, count, between=0.08) < 0.915  # 0.89 and 0.87 in theory
    assert coverage(pooled, count, between=0.08) < 0.5


def test_a_re_run_of_more_rounds_narrows_the_interval() -> None:
    """``rerun``: the re-run's own groups' count; more of them scatter less."""
    groups = [[1.0], [2.0], [4.0]]
    assert estimate(groups, rerun=30).rel_ci < estimate(groups).rel_ci
    assert estimate(groups, rerun=3).rel_ci == estimate(groups).rel_ci


def test_the_interval_widens_with_the_spread_between_processes() -> None:
    """Same samples' scatter, processes 1% or 20% apart: only the second is wide, and says
    its spread is between the processes (``between_rel`` over ``within_rel``)."""
    rng = np.random.default_rng(3)
    close = [estimate(processes(rng, 5, between=0.01, within=0.05)) for _ in range(20)]
    apart = [estimate(processes(rng, 5, between=0.2, within=0.05)) for _ in range(20)]
    assert np.median([e.rel_ci for e in apart]) > 5 * np.median([e.rel_ci for e in close])
    assert all(e.between_rel > e.within_rel for e in apart)
    assert np.median([e.between_rel for e in close]) < np.median([e.within_rel for e in close])


@pytest.mark.parametrize("spread", [0.01, 0.025, 0.054, 0.1])
@pytest.mark.parametrize("prior_df", [0.0, 3.0])
def test_processes_for_is_the_fewest_whose_interval_reaches_the_target(
    spread: float, prior_df: float
) -> None:
    """k processes whose medians' logs spread by ``spread`` (alone, or in a run whose prior of
    ``prior_df`` carries the same variance) read within ±5% through ``estimate``; k - 1 do not."""
    from attnbench.estimators import processes_for
    from attnbench.priors import Prior

    def reach(k: int) -> float:
        logs = np.linspace(-1, 1, k)
        logs = logs / np.std(logs, ddof=1) * spread  # their sample deviation: ``spread``
        prior = Prior(spread**2, prior_df) if prior_df else None
        found = estimate([[float(np.exp(x))] * 3 for x in logs], prior=prior)
        return math.log(found.high_s / found.center_s)

    k = processes_for(spread, 0.05, prior_df)
    assert k is not None and reach(k) <= math.log1p(0.05)
    if k > 2:
        assert reach(k - 1) > math.log1p(0.05)
    assert processes_for(0.0, 0.05) is None and processes_for(math.nan, 0.05) is None


def test_the_quantiles_are_scipy_stats_own_to_the_bit() -> None:
    """The estimators take their quantiles from ``scipy.special`` (what ``scipy.stats`` calls
    underneath), so that a fork server need not import ``scipy.stats``: they must not move."""
    from scipy import stats

    from attnbench.estimators import binomial_half_ppf, normal_quantile, t_quantile

    for q in (0.005, 0.025, 0.05, 0.5, 0.9, 0.95, 0.975, 0.995):
        assert normal_quantile(q) == float(stats.norm.ppf(q))
        for df in (0.5, 1.0, 2.0, 3.0, 4.5, 7.0, 10.0, 30.0, 1e3, 1e6, math.inf):
            assert t_quantile(q, df) == float(stats.t.ppf(q, df)), (q, df)
    from attnbench.estimators import CONFIDENCE

    q = (1 - CONFIDENCE) / 2  # as median_ci_ranks asks
    counts = np.concatenate([np.arange(1, 3001), [9_999, 65_536, 10**6, 12_345_678]])
    expected = stats.binom.ppf(q, counts, 0.5).astype(int)
    assert [binomial_half_ppf(q, int(n)) for n in counts] == list(expected)
    assert binomial_half_ppf(0.5, 1) == 0 and binomial_half_ppf(0.975, 10) == 8


def test_the_estimates_without_an_interval_say_why_and_keep_their_counts() -> None:
    """No round: no time, no interval, no group. One round read disturbed keeps its count.
    Rounds whose medians are 0 (a clock that never moved): their median, no interval, and
    their counts."""
    none = estimate([])
    assert none.groups == 0 and all(math.isnan(v) for v in (none.center_s, none.low_s, none.high_s))
    one = estimate([[1.0] * 10], [2.0], quiet=1.0)
    assert one.groups == 1 and one.disturbed == 1 and one.left_out == 0
    still = estimate([[0.0, 0.0], [0.0, 0.0]], [2.0, 2.0], quiet=1.0)
    assert still.center_s == 0.0 and still.groups == 2 and still.disturbed == 2
    assert math.isnan(still.low_s) and math.isnan(still.high_s)


def test_a_moderated_variance_adds_the_priors_degrees_of_freedom_to_the_cases() -> None:
    """Three rounds (2 degrees of freedom) and a prior of 4: the t of 6."""
    from scipy import stats

    from attnbench.priors import Prior

    logs = [0.0, 0.1, -0.1]
    groups = [[math.exp(x)] * 3 for x in logs]
    variance = (4 * 0.01 + 2 * float(np.var(logs, ddof=1))) / 6
    reach = float(stats.t.ppf(0.975, 6)) * math.sqrt(variance * (2 / 3))
    found = estimate(groups, prior=Prior(0.01, 4.0))
    assert math.log(found.high_s / found.center_s) == pytest.approx(reach)


def test_one_round_on_a_prior_of_under_one_degree_of_freedom_gets_no_interval() -> None:
    """A layer whose cases' variances read 1e-10 and 1e-3 has a prior of 0.2 degrees of
    freedom: a one-round case of it read 1e-10 to 1e10 seconds, and now no interval (marked
    !); on a prior of one degree of freedom, the t of one."""
    from scipy import stats

    from attnbench.measure.timing.loop import is_imprecise
    from attnbench.priors import Prior, prior_of

    samples = [[1.0, 1.01, 0.99, 1.02]]
    prior = prior_of([(1e-10, 2.0), (1e-3, 2.0), (1e-3, 2.0)])
    assert prior is not None and prior.df < 1
    found = estimate(samples, prior=prior)
    assert found.groups == 1 and found.center_s == pytest.approx(1.005)
    assert math.isnan(found.low_s) and math.isnan(found.high_s)
    assert is_imprecise(found.center_s, found.low_s, found.high_s)
    cauchy = estimate(samples, prior=Prior(1e-4, 1.0))
    reach = float(stats.t.ppf(0.975, 1.0)) * math.sqrt(2e-4)
    assert math.log(cauchy.high_s / cauchy.center_s) == pytest.approx(reach)
    two = estimate([[1.0] * 3, [1.02] * 3], prior=prior)  # a round's own degree: an interval
    assert math.isfinite(two.low_s) and math.isfinite(two.high_s)


def test_a_busy_machines_interval_reaches_down_to_a_quiet_re_run() -> None:
    """Every round read 1.6x the quiet level (none quiet, so every one is kept): the low end is
    the rounds' own divided by 1.6, the high end theirs. Fake busy processes whose times ran
    1.5x a quiet re-run's: the interval over them alone misses the quiet re-run's time in every
    trial, the widened one holds it. Two quiet rounds: the busy ones are left out, no widening."""
    rng = np.random.default_rng(7)
    misses = holds = 0
    for _ in range(50):
        busy = [[t * 1.5 for t in g] for g in processes(rng, 6, 0.03)]
        rerun = [np.median(g) for g in processes(rng, 6, 0.03)]
        quiet_rerun = float(np.exp(np.mean(np.log(rerun))))
        alone = estimate(busy)
        found = estimate(busy, [1.6e-3] * 6, quiet=1e-3)
        assert found.slowdown == pytest.approx(1.6) and found.disturbed == 6
        assert found.center_s == alone.center_s and found.high_s == alone.high_s
        assert found.low_s == pytest.approx(alone.low_s / 1.6)
        misses += not alone.low_s <= quiet_rerun <= alone.high_s
        holds += found.low_s <= quiet_rerun <= found.high_s
    assert misses == 50 and holds == 50
    one = estimate([[2.0] * 10], [2.0], quiet=1.0)  # one round, read 2x: its median's interval
    assert one.low_s == 1.0 and one.high_s == 2.0 and one.slowdown == 2.0
    mixed = estimate([[1.0, 1.0], [1.02, 1.02], [2.0, 2.0]], [1.0, 1.1, 2.0], quiet=1.0)
    assert mixed.left_out == 1 and mixed.slowdown == 1.0
    assert mixed.low_s == estimate([[1.0, 1.0], [1.02, 1.02]]).low_s
    beside = estimate([[1.0] * 4, [1.1] * 4], busy=[True, True])  # no reference read: no reach
    assert beside.disturbed == 2 and beside.slowdown == 1.0
    # beside a busy neighbour, references within 1.25x: kept, not read slow, not widened
    near = estimate([[1.0] * 4, [1.0] * 4, [1.0] * 4], [1.08, 1.1, 1.0], 1.0, busy=[True] * 3)
    assert near.disturbed == 3 and near.slowdown == 1.0 and near.rel_ci == 0.0
    nan = estimate([[1.0] * 4, [1.0] * 4, [1.0] * 4], [1.4, math.nan, 1.6], quiet=1.0)
    assert nan.slowdown == pytest.approx(1.5)  # the references read, a NaN left out
    # more rounds narrow the rounds' own interval, not the reach down: the stop reads that
    assert found.rounds_rel_ci == pytest.approx(alone.rel_ci) and found.rel_ci > alone.rel_ci


def test_a_busy_machines_rounds_stop_on_their_own_interval() -> None:
    """Three rounds that agree, two of them read 1.6x the quiet level (one quiet: every round
    kept, the interval reaching 1.6x down): precise at 5%, as the same rounds unread are, and
    time_stop says so; more rounds could not narrow the reach down."""
    from attnbench.measure.timing.loop import Stop, TimingStats
    from attnbench.run.rounds import Replication

    rounds, references = [[1.0] * 4, [1.01] * 4, [0.99] * 4], [1.0, 1.6, 1.6]
    wants = Replication(least=1, most=6, target_rel_ci=0.05)
    assert estimate(rounds, references, 1.0).rel_ci > 0.3
    assert wants.stop_of(rounds, 3, references, quiet=1.0) == Stop.PRECISE
    assert wants.stop_of(rounds, 3) == Stop.PRECISE
    stats = TimingStats(
        tuple(t for r in rounds for t in r),
        1,
        0.1,
        rounds=tuple(i for i, r in enumerate(rounds) for _ in r),
        references_s=tuple(ref for ref, r in zip(references, rounds, strict=True) for _ in r),
        quiet_s=1.0,
        precision=0.05,
    )
    assert stats.estimate.slowdown == pytest.approx(1.6) and stats.overall_stop == Stop.PRECISE


def test_kept_log_variance_is_the_kept_rounds_spread_and_remembers_it() -> None:
    """The sweep's prior reads every case after every round: the memo gives what
    ``kept_rounds`` then ``log_variance`` give, leaves the disturbed round out as they do,
    and computes a case that has not changed only once."""
    from attnbench.estimators import kept_log_variance, kept_rounds, log_variance

    groups = ((1.0, 1.1, 0.9), (1.2, 1.3, 1.25), (2.0, 2.1, 2.2), (1.05, 1.0, 1.1))
    refs = (1e-4, 1e-4, 3e-4, 1e-4)  # the third read 3x the quiet level: left out
    busy = (False, False, False, False)
    kept, _, _ = kept_rounds(groups, refs, 1e-4, busy)
    assert kept_log_variance(groups, refs, 1e-4, busy) == (log_variance(kept), 2.0)
    everything = log_variance([list(g) for g in groups])
    assert log_variance(kept) != pytest.approx(everything)  # the disturbed round mattered
    before = kept_log_variance.cache_info().hits
    kept_log_variance(groups, refs, 1e-4, busy)
    assert kept_log_variance.cache_info().hits == before + 1
    assert kept_log_variance(groups[:1], refs[:1], 1e-4, busy[:1]) == (None, 0.0)  # one round


def test_a_round_read_disturbed_that_ran_no_slower_than_the_quiet_ones_is_kept() -> None:
    """A new user's conv at n = 64: round medians 98, 70, 29, 29, 30 and 31 µs, the first and
    the three at 29-30 read disturbed by their references. Left out, its time was 46 µs ×/÷6.3
    over 70 and 31; a re-run read 29. A disturbance slows a round: one that ran no slower
    than the slowest quiet round shows none, and is kept."""
    us = [98.3, 69.8, 28.6, 29.4, 30.3, 30.8]
    groups = [[t * 1e-6] * 5 for t in us]
    references = [2.0, 1.0, 2.0, 2.0, 2.0, 1.0]  # quiet level 1: a factor of 2 reads disturbed
    found = estimate(groups, references, quiet=1.0)
    assert (found.disturbed, found.left_out, found.groups) == (1, 1, 5)  # 98.3 alone left out
    assert found.center_s == pytest.approx(math.exp(np.mean(np.log(us[1:]))) * 1e-6)
    assert found.center_s < 40e-6 and found.low_s < 30e-6
    # read disturbed at 28.6 and 30.8 µs, no slower than the quiet rounds: kept
    fast = estimate(groups, [1.0, 1.0, 2.0, 1.0, 1.0, 2.0], quiet=1.0)
    assert fast.left_out == 0 and fast.disturbed == 0
    # one slow quiet round (70) does not keep disturbed ones at 60 and 65: the bound is the
    # lower of the slowest quiet round and 1.25x their median (31 here)
    odd = estimate([[t * 1e-6] * 5 for t in [30.0, 31.0, 70.0, 60.0, 65.0]], [1, 1, 1, 2, 2], 1.0)
    assert (odd.disturbed, odd.left_out, odd.groups) == (2, 2, 3)
    late = estimate([[t * 1e-6] * 5 for t in [30.0, 29.0, 45.0, 31.0]], [1, 1, 2, 1], quiet=1.0)
    assert (late.disturbed, late.left_out, late.groups) == (1, 1, 3)
    # fewer than two quiet rounds: a busy machine's, every round kept and marked as read
    busy = estimate(groups, [2.0, 1.0, 2.0, 2.0, 2.0, 2.0], quiet=1.0)
    assert (busy.disturbed, busy.left_out, busy.groups) == (5, 0, 6)
