"""attention-linear: kernelized linear attention (Katharopoulos et al. 2020), measured like every
built-in layer: its function, its exact FLOPs, linear memory, O(1) steps and path length 1."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from reference import chapter_encoding

from attnbench import build_grid, build_layer, layer_names
from attnbench.layers import entry
from attnbench.measure.case import measure_case
from attnbench.measure.counts.flops import count_flops, flops_agree
from attnbench.measure.memory import peak_bytes
from attnbench.measure.step import make_step

NAME = "attention-linear"


def _case(n: int, d: int, heads: int, mode: str = "forward", batch: int = 2):  # type: ignore[no-untyped-def]
    options = {"layers": NAME, "n": [n], "d": [d], "heads": heads, "batch": batch}
    return build_grid({**options, "device": "cpu", "mode": mode}).cases()[0]


def test_it_is_registered_as_a_linear_rival_of_attention() -> None:
    found = entry(NAME)
    assert NAME in layer_names() and found.family.rival and not found.family.pairwise
    assert [o.name for o in found.options] == ["heads", "causal"]
    assert found.theory is not None and found.theory.complexity == "O(n d^2)"
    order = found.theory.order
    assert order({"n": 2048, "d": 64}) == 2 * order({"n": 1024, "d": 64})  # linear in n


@pytest.mark.parametrize(("n", "d", "heads"), [(7, 12, 3), (40, 16, 4), (64, 8, 1)])
def test_it_computes_the_kernelized_attention_of_the_paper(n: int, d: int, heads: int) -> None:
    """Against the explicit (n x n) form in float64: A = φ(Q)φ(K)ᵀ, y = A·V / A·1."""
    layer = build_layer(NAME, d, heads=heads, seed=3).double()
    x = torch.randn(2, n, d, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = layer(x)
        xp = x + chapter_encoding(n, d, dtype=torch.float64)  # the chapter's own code
        hs = d // heads

        def split(t: torch.Tensor) -> torch.Tensor:  # (B, n, d) -> (B, h, n, hs)
            return t.view(2, n, heads, hs).transpose(1, 2)

        phi_q = F.elu(split(xp @ layer.W_q.weight.T)) + 1  # (B, h, n, hs)
        phi_k = F.elu(split(xp @ layer.W_k.weight.T)) + 1  # (B, h, n, hs)
        v = split(xp @ layer.W_v.weight.T)  # (B, h, n, hs)
        a = phi_q @ phi_k.transpose(-2, -1)  # (B, h, n, n)
        y = (a @ v) / a.sum(dim=-1, keepdim=True)  # (B, h, n, hs)
        expected = y.transpose(1, 2).reshape(2, n, d) @ layer.W_o.weight.T  # (B, n, d)
    assert torch.allclose(got, expected, atol=1e-10, rtol=0)


def test_it_shares_attentions_projections_and_encoding() -> None:
    linear = build_layer(NAME, 16, heads=4, seed=5)
    softmax = build_layer("attention", 16, heads=4, seed=5)
    for name in ("W_q", "W_k", "W_v", "W_o"):
        assert torch.equal(getattr(linear, name).weight, getattr(softmax, name).weight)
    assert type(linear.pos) is type(softmax.pos)


@pytest.mark.parametrize(("n", "d", "heads"), [(24, 16, 4), (40, 8, 2), (33, 12, 3)])
def test_counted_flops_equal_its_formula_exactly(n: int, d: int, heads: int) -> None:
    case = _case(n, d, heads)
    step = make_step(case, seed=0)
    step()
    b = 2
    assert count_flops(step) == case.analytic_flops()
    assert case.analytic_flops() == 8 * b * n * d * d + 4 * b * n * d * d // heads + 2 * b * n * d


def test_train_mode_counts_three_forward_passes() -> None:
    case = _case(24, 16, 4, mode="train")
    counted = count_flops(make_step(case, seed=0))
    assert flops_agree(counted, case.analytic_flops())
    assert case.analytic_flops() == 3 * _case(24, 16, 4).analytic_flops()


def test_its_memory_grows_linearly_where_attention_grows_quadratically() -> None:
    """Peak bytes of one call (allocator events): the n x n weights never exist."""

    def peak(layer: str, n: int) -> int:
        case = build_grid(
            {"layers": layer, "n": [n], "d": [32], "heads": 4, "device": "cpu"}
        ).cases()[0]
        step = make_step(case, seed=0)
        step()
        found = peak_bytes(step, "cpu")
        assert found is not None
        return found

    assert peak(NAME, 1024) / peak(NAME, 512) < 2.2
    assert peak("attention", 1024) / peak("attention", 512) > 3.0


@pytest.mark.slow
def test_steps_are_constant_and_every_output_sees_every_input() -> None:
    measured = {n: measure_case(_case(n, 8, 2, batch=1)) for n in (8, 40, 131)}
    assert {r.status for r in measured.values()} == {"ok"}
    assert len({r.seq_steps for r in measured.values()}) == 1  # O(1) sequential steps
    assert {r.path_len for r in measured.values()} == {1}  # one application connects all
    assert measured[131].path_len_method.startswith("extended")  # beyond direct measurement
    assert {r.flops_check for r in measured.values()} == {"ok"}
