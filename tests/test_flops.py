from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from attnbench import layer_names
from attnbench.measure.case import make_step
from attnbench.measure.flops import count_flops, flops_agree
from attnbench.spec import Case, build_grid
from attnbench.theory import TRAIN_FLOP_FACTOR


def _case(layer: str, mode: str = "forward", n: int = 24, d: int = 16, k: int = 3) -> Case:
    options = {"layers": layer, "n": [n], "d": [d], "k": k, "heads": 4, "window": 5}
    grid = build_grid({**options, "batch": 2, "device": "cpu", "mode": mode})
    return grid.cases()[0]


def _analytic(case: Case) -> float:
    return case.analytic_flops()


@pytest.mark.parametrize("layer", layer_names())
@pytest.mark.parametrize(("n", "d"), [(24, 16), (40, 8)])
def test_counted_forward_flops_equal_the_analytic_table(layer: str, n: int, d: int) -> None:
    case = _case(layer, n=n, d=d)
    step = make_step(case, seed=0)
    step()
    assert count_flops(step) == _analytic(case)


@pytest.mark.parametrize("k", [1, 3, 6])
def test_conv_count_follows_the_real_kernel(k: int) -> None:
    case = _case("conv", k=k)
    assert count_flops(make_step(case, seed=0)) == 2 * 2 * 24 * k * 16 * 16


def test_lstm_is_counted_even_where_its_fused_kernel_hides_the_products() -> None:
    case = _case("lstm")
    step = make_step(case, seed=0)
    plain = FlopCounterMode(display=False)
    with plain:
        step()
    if torch.backends.mkldnn.is_available():
        assert plain.get_total_flops() == 0  # the gap attnbench closes
    assert count_flops(step) == 16 * 2 * 24 * 16 * 16


def test_fused_sdpa_on_cpu_is_mapped_not_zero() -> None:
    case = _case("attention-sdpa")
    assert count_flops(make_step(case, seed=0)) == _analytic(case)


@pytest.mark.parametrize("layer", ["conv", "rnn", "gru", "lstm", "attention"])
def test_train_mode_counts_about_three_forward_passes(layer: str) -> None:
    case = _case(layer, mode="train")
    counted = count_flops(make_step(case, seed=0))
    assert flops_agree(counted, _analytic(case))
    assert _analytic(case) == TRAIN_FLOP_FACTOR * _analytic(_case(layer))


def test_fused_attention_backward_recomputes_and_is_flagged() -> None:
    """The flash backward recomputes QK^T: more FLOPs than 3 forward passes, and we say so."""
    case = _case("attention-sdpa", mode="train")
    counted = count_flops(make_step(case, seed=0))
    assert counted > _analytic(case)
    assert not flops_agree(counted, _analytic(case))


def test_flops_agree_tolerance() -> None:
    assert flops_agree(100.5, 100)
    assert not flops_agree(102, 100)
    assert flops_agree(0, 0)
    assert not flops_agree(1, 0)
