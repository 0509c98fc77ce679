from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from attnbench import layer_names
from attnbench.measure.counts.flops import count_flops, flops_agree
from attnbench.measure.step import make_step
from attnbench.options import build_grid
from attnbench.spec import Case


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


@pytest.mark.slow
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


# The chapter's forward FLOPs, written out here (b = 2, k = 3): 2 FLOPs per multiply-add of each
# product; the recurrences' gates (rnn 1, gru 3, lstm 4), each an input and a state product.
WRITTEN = {
    "conv": lambda b, n, d: 2 * b * n * 3 * d * d,
    "rnn": lambda b, n, d: 1 * 2 * 2 * b * n * d * d,
    "gru": lambda b, n, d: 3 * 2 * 2 * b * n * d * d,
    "lstm": lambda b, n, d: 4 * 2 * 2 * b * n * d * d,
    "attention": lambda b, n, d: 4 * 2 * b * n * d * d + 2 * 2 * b * n * n * d,
}


@pytest.mark.parametrize("layer", sorted(WRITTEN))
def test_train_mode_counts_a_forward_and_a_backward_of_twice_its_cost(layer: str) -> None:
    """Backward takes each product's gradient with respect to both of its operands: two
    products as large as the forward one, so a training step is forward + 2 x forward."""
    forward = WRITTEN[layer](2, 24, 16)
    case = _case(layer, mode="train")
    assert _analytic(_case(layer)) == forward
    assert _analytic(case) == forward + 2 * forward
    assert flops_agree(count_flops(make_step(case, seed=0)), forward + 2 * forward)


def test_fused_attention_backward_recomputes_its_scores_and_the_formula_says_so() -> None:
    """The flash backward recomputes QKᵀ rather than keep it: a training call counts three
    forward passes and one n x n product more, and the layer's formula says exactly that."""
    case = _case("attention-sdpa", mode="train")
    b, n, d = 2, 24, 16
    forward = WRITTEN["attention"](b, n, d)
    assert _analytic(case) == 3 * forward + 2 * b * n * n * d
    assert flops_agree(count_flops(make_step(case, seed=0)), _analytic(case))
    # the explicit layer keeps its scores: three forward passes
    assert _analytic(_case("attention", mode="train")) == 3 * forward


def test_the_recomputed_scores_are_what_the_cuda_kernels_backward_formulas_count() -> None:
    """torch's FLOP formula for the fused attention backward, registered for the CUDA flash,
    memory-efficient and cuDNN kernels, counts five n x n products a head: the forward's two
    twice, and QKᵀ once more, the recompute the theory adds."""
    from torch.utils.flop_counter import flop_registry

    from attnbench.layers.registry import entry

    b, heads, n, d = 2, 4, 96, 64
    q = (b, heads, n, d // heads)  # (B, h, n, d/h)
    theory = entry("attention-sdpa").theory
    assert theory is not None
    sizes = {"b": b, "n": n, "d": d, "heads": heads, "causal": 0}
    scores = 4 * b * n * n * d  # QKᵀ and AV, forward
    recompute = theory.train_flops(sizes) - 3 * theory.flops(sizes)
    for op in (
        torch.ops.aten._scaled_dot_product_flash_attention_backward,
        torch.ops.aten._scaled_dot_product_efficient_attention_backward,
        torch.ops.aten._scaled_dot_product_cudnn_attention_backward,
    ):
        assert flop_registry[op](q, q, q, q) == 2 * scores + recompute, op


def test_flops_agree_tolerance() -> None:
    assert flops_agree(100.5, 100)
    assert flops_agree(101, 100) and flops_agree(99, 100)  # exactly 1% off still agrees
    assert not flops_agree(101.01, 100) and not flops_agree(98.99, 100)
    assert not flops_agree(102, 100)
    assert flops_agree(0, 0)
    assert not flops_agree(1, 0)


def test_matrix_vector_products_are_counted_as_the_products_they_are() -> None:
    # torch's table has no mv, addmv, dot or addbmm: a learned query scoring every position
    # (x @ v with a 1-D v) read as an uncounted op and 0 FLOPs.
    from attnbench.measure.counts.flops import trace_flops
    from attnbench.measure.counts.traffic import count_traffic

    # the matrix-vector products' matrices are not square: a formula that read one side for
    # the other would be off
    x, w, v, u = torch.randn(2, 16, 24), torch.randn(40, 32), torch.randn(32), torch.randn(24)
    zeros, bias = torch.zeros(16, 16), torch.randn(40)  # x: (B, n, d)
    written = {
        "x @ u": (lambda: x @ u, 2 * 2 * 16 * 24),  # mv over the 32 rows of (B·n, d)
        "addmv": (lambda: torch.addmv(bias, w, v), 2 * 40 * 32),
        "dot": (lambda: v @ v, 2 * 32),
        "vdot": (lambda: torch.vdot(v, v), 2 * 32),
        "addbmm": (lambda: torch.addbmm(zeros, x, x.transpose(1, 2)), 2 * 2 * 16 * 24 * 16),
    }  # fmt: skip
    for name, (call, flops) in written.items():
        count = trace_flops(call)
        assert (count.total, count.uncounted) == (flops, ""), name
        (kernel,) = count_traffic(call).kernels
        assert kernel == ("gemm@16" if name == "addbmm" else "gemm@1"), name  # a vector out: 1 wide


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("groups", [1, 4, 64])
def test_a_grouped_convolutions_backward_counts_each_group_once(
    groups: int, transposed: bool
) -> None:
    """A new user's depthwise conv read 6.3x its forward FLOPs in --mode train: torch's formula
    counts the weight gradient as if every input channel met every output channel. Forward,
    the input's gradient and the weight's gradient are each 2·B·L·k·C·C/groups here."""
    torch.manual_seed(0)
    b, c, n, k = 2, 64, 32, 3
    kind = torch.nn.ConvTranspose1d if transposed else torch.nn.Conv1d
    conv = kind(c, c, k, padding=1, groups=groups, bias=False)
    x = torch.randn(b, c, n, requires_grad=True)
    one = 2 * b * n * k * c * c // groups
    assert count_flops(lambda: conv(x)) == one
    assert count_flops(lambda: conv(x).sum().backward()) == 3 * one
    if groups == 1:  # as torch's own count where it is right
        with FlopCounterMode(display=False) as mode:
            conv(x).sum().backward()
        assert mode.get_total_flops() == 3 * one
