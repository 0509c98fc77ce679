"""Elementwise work: counted at the dispatcher from the real call, equal to each layer's formula."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from synthetic import small_case, warm_step
from torch import nn

from attnbench import layer_names
from attnbench.measure.counts.elementwise import count_elementwise
from attnbench.spec import Case

_case = small_case


def _counted(case: Case) -> int:
    step = warm_step(case)
    return count_elementwise(step.forward)


@pytest.mark.parametrize("layer", layer_names())
@pytest.mark.parametrize(("n", "d", "batch"), [(24, 16, 2), (40, 8, 1)])
def test_counted_elementwise_work_equals_each_layers_formula(
    layer: str, n: int, d: int, batch: int
) -> None:
    case = _case(layer, n=n, d=d, batch=batch)
    assert _counted(case) == case.analytic_elements()


@pytest.mark.parametrize(("layer", "gates"), [("rnn", 1), ("gru", 3), ("lstm", 4)])
def test_a_recurrent_input_bias_is_counted_only_where_torch_does_not_fuse_it(
    layer: str, gates: int
) -> None:
    """Batch 1 folds the bias into the product; a larger batch adds it apart, per gate."""
    one, two = _counted(_case(layer, batch=1)), _counted(_case(layer, batch=2))
    assert two - 2 * one == gates * 2 * 24 * 16


ATTENTION = ["attention", "attention-sdpa", "attention-local", "attention-linear"]


@pytest.mark.parametrize("layer", ATTENTION)
def test_causal_attention_counts_its_mask_and_keeps_the_formula(layer: str) -> None:
    plain, causal = _case(layer), _case(layer, causal=True)
    assert _counted(causal) == causal.analytic_elements()
    if layer in ("attention", "attention-sdpa"):  # the mask: one more pass over b·h·n² scores
        assert _counted(causal) - _counted(plain) == 2 * 4 * 24 * 24
    if layer == "attention-local":  # the band is masked either way: one-sided, same work
        assert _counted(causal) == _counted(plain)


def test_the_softmax_term_is_quadratic_in_n_and_the_scan_term_is_n_log_n() -> None:
    attention = [_counted(_case("attention", n=n, d=8)) for n in (16, 32, 64)]
    b, h, d = 2, 4, 8
    assert [a - b * n * d for a, n in zip(attention, (16, 32, 64), strict=True)] == [
        2 * b * h * n * n for n in (16, 32, 64)
    ]
    scan = [_counted(_case("ssm-scan", n=n, d=8, state=4)) for n in (16, 32)]
    step = [_counted(_case("ssm", n=n, d=8, state=4)) for n in (16, 32)]
    # The step-by-step recurrence does 2 per state and position; the scan 3 per level (4, 5).
    assert [s - t for s, t in zip(scan, step, strict=True)] == [
        (3 * levels - 2) * b * n * d * 4 for n, levels in ((16, 4), (32, 5))
    ]


def test_state_size_changes_the_ssm_count() -> None:
    small, large = _case("ssm", state=4), _case("ssm", state=8)
    assert _counted(small) == small.analytic_elements()
    assert _counted(large) == large.analytic_elements()
    assert _counted(large) > _counted(small)


def test_a_changed_layer_changes_the_count(add_layer) -> None:  # type: ignore[no-untyped-def]
    class Plain(nn.Module):
        def __init__(self, d: int) -> None:
            super().__init__()
            self.proj = nn.Linear(d, d)

        def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, n, d)
            return self.proj(x)

    class Activated(Plain):
        def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, n, d)
            return F.gelu(self.proj(x)) * 2  # two more passes over b·n·d

    add_layer("plain", Plain)
    add_layer("activated", Activated)
    plain, activated = _counted(_case("plain")), _counted(_case("activated"))
    assert activated - plain == 2 * 2 * 24 * 16


def test_copies_masks_and_matrix_products_are_not_elementwise_work() -> None:
    x = torch.randn(3, 5)
    assert count_elementwise(lambda: x.clone().t().contiguous() @ x) == 0
    assert count_elementwise(lambda: torch.arange(10) > 3) == 0  # integers and booleans
    assert count_elementwise(lambda: x + 1) == 15
    assert count_elementwise(lambda: x.sum(dim=0)) == 15  # a reduction: the elements it reads
    assert count_elementwise(lambda: torch.softmax(x, dim=-1)) == 15


@pytest.mark.skipif(not hasattr(torch.ops.aten, "_safe_softmax"), reason="torch < 2.5")
def test_the_math_attentions_softmax_is_counted_and_has_its_own_rate() -> None:
    # scaled_dot_product_attention's math backend normalises with _safe_softmax (a softmax
    # that zeroes fully masked rows): the elements it reads, as any softmax, not uncounted.
    from attnbench.measure.counts.flops import trace_flops
    from attnbench.measure.machine.rates import CATALOGUE

    x = torch.randn(3, 5)
    assert count_elementwise(lambda: torch.ops.aten._safe_softmax(x, -1)) == 15
    q = torch.randn(1, 2, 6, 4)  # (B, h, n, hs)
    with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.MATH]):
        math = lambda: F.scaled_dot_product_attention(q, q, q)  # noqa: E731
        assert count_elementwise(math) >= 2 * 6 * 6
        assert trace_flops(math).uncounted == ""
    torch.testing.assert_close(CATALOGUE["_safe_softmax"](x, x, x > 0), torch.softmax(x, -1))


X = torch.randn(2, 16, 32)  # (B, n, d): 1024 elements
UNTAGGED = {
    # activations torch does not tag pointwise: the elements they produce
    "hardswish": (lambda: F.hardswish(X), 1024),
    "glu": (lambda: F.glu(X, -1), 512),  # half the width: a gate times a value
    "rrelu": (lambda: F.rrelu(X), 1024),
    "prelu": (lambda: F.prelu(X, torch.tensor([0.25])), 1024),
    "logsigmoid": (lambda: F.logsigmoid(X), 1024),  # read: its second output is a buffer
    "interpolate linear": (lambda: F.interpolate(X, scale_factor=2, mode="linear"), 2048),
    # pooling: the elements each window's reduction reads
    "avg_pool1d": (lambda: F.avg_pool1d(X, 2), 1024),
    "max_pool1d": (lambda: F.max_pool1d(X, 2), 1024),
    "adaptive_avg_pool1d": (lambda: F.adaptive_avg_pool1d(X, 8), 1024),
    "adaptive_max_pool1d": (lambda: F.adaptive_max_pool1d(X, 8), 1024),
    # moved, not computed
    "interpolate nearest": (lambda: F.interpolate(X, scale_factor=2), 0),
    "pixel_shuffle": (lambda: F.pixel_shuffle(torch.randn(1, 4, 4, 4), 2), 0),
}


@pytest.mark.parametrize("name", list(UNTAGGED))
def test_untagged_activations_pooling_and_moves_are_counted_not_left_uncounted(name: str) -> None:
    from attnbench.measure.counts.flops import trace_flops

    call, elements = UNTAGGED[name]
    assert count_elementwise(call) == elements
    assert trace_flops(call).uncounted == ""  # none of them is named as an op with no count


def test_an_in_place_draw_counts_as_its_op() -> None:
    # Dropout in training draws its mask with the in-place bernoulli_, which torch leaves
    # untagged: counted as the elements it writes, like bernoulli.
    from attnbench.measure.counts.flops import trace_flops

    draw = lambda: torch.empty_like(X).bernoulli_(0.9)  # noqa: E731
    assert count_elementwise(draw) == 1024
    assert trace_flops(draw).uncounted == ""


def test_a_source_folded_in_at_indices_counts_its_elements() -> None:
    # A mixture of experts gathers its experts' outputs with index_add_ (or scatter_add): one
    # combination per element of the source, whatever the size of the destination.
    from attnbench.measure.counts.flops import trace_flops

    tokens = torch.randn(6, 8)  # (routed tokens, d)
    slots = torch.tensor([0, 2, 2, 5, 1, 0])  # each routed token's position among 7

    def gather() -> torch.Tensor:
        return torch.zeros(7, 8).index_add_(0, slots, tokens)  # (n, d)

    index = slots[:, None].expand(6, 8)
    calls = {
        "index_add_": gather,
        "scatter_add": lambda: torch.zeros(7, 8).scatter_add(0, index, tokens),
        "scatter_reduce": lambda: torch.zeros(7, 8).scatter_reduce(0, index, tokens, "amax"),
        "index_reduce": lambda: torch.zeros(7, 8).index_reduce(0, slots, tokens, "prod"),
    }
    for name, call in calls.items():
        assert count_elementwise(call) == 6 * 8, name
        assert trace_flops(call).uncounted == "", name
