from __future__ import annotations

import pytest
import torch
from reference import chapter_encoding
from torch import nn

from attnbench import AttnbenchError, build_layer, layer_names

ALL = layer_names()


def _x(b: int, n: int, d: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(b, n, d, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize(("n", "d", "heads"), [(10, 8, 4), (7, 9, 3), (5, 7, 1)])
def test_every_layer_maps_b_n_d_to_b_n_d(name: str, n: int, d: int, heads: int) -> None:
    layer = build_layer(name, d, heads=heads, n=n, window=2)
    assert not layer.training
    with torch.no_grad():
        y = layer(_x(2, n, d))
    assert y.shape == (2, n, d)
    assert y.dtype == torch.float32
    assert torch.isfinite(y).all()


@pytest.mark.parametrize("name", ALL)
def test_same_seed_same_layer_other_seed_other_layer(name: str) -> None:
    x = _x(1, 6, 8)
    with torch.no_grad():
        a = build_layer(name, 8, seed=3, n=6)(x)
        b = build_layer(name, 8, seed=3, n=6)(x)
        c = build_layer(name, 8, seed=4, n=6)(x)
    assert torch.equal(a, b)
    assert not torch.allclose(a, c)


def test_building_does_not_touch_the_global_rng() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_layer("attention", 8)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("k", [1, 2, 3, 4, 7])
def test_conv_keeps_length_for_odd_and_even_k(k: int) -> None:
    layer = build_layer("conv", 6, k=k)
    assert layer.conv.kernel_size == (k,)
    with torch.no_grad():
        assert layer(_x(1, 11, 6)).shape == (1, 11, 6)


def test_an_even_conv_is_silent_and_only_its_first_call_pays_for_silencing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch warns about an even kernel's padded copy once per process; the layer silences it
    on its first call only, as catch_warnings costs 24 us (a third of a small conv's call)."""
    import warnings

    from attnbench.layers import conv

    entered: list[int] = []
    real = warnings.catch_warnings

    def counting(*args: object, **kwargs: object) -> warnings.catch_warnings:
        entered.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(conv.warnings, "catch_warnings", counting)
    layer = build_layer("conv", 6, k=4)
    with real(record=True) as shown:
        warnings.simplefilter("always")
        with torch.no_grad():
            for _ in range(3):
                layer(_x(1, 11, 6))
    assert entered == [1]
    assert not [w for w in shown if "even kernel" in str(w.message)]


def test_conv_output_depends_only_on_k_neighbours() -> None:
    layer = build_layer("conv", 4, k=3)
    x = _x(1, 20, 4)
    x2 = x.clone()
    x2[0, 15] += 1.0  # change one token
    with torch.no_grad():
        diff = (layer(x) - layer(x2)).abs().sum(-1)[0]
    assert set(torch.nonzero(diff).flatten().tolist()) == {14, 15, 16}


@pytest.mark.parametrize("name", ["rnn", "gru", "lstm"])
def test_recurrent_output_is_every_hidden_state(name: str) -> None:
    layer = build_layer(name, 5)
    x = _x(2, 9, 5)
    with torch.no_grad():
        out = layer(x)
        _, state = layer.rnn(x)
    h_n = state[0] if isinstance(state, tuple) else state  # (1, B, d)
    assert torch.allclose(out[:, -1], h_n[0])


def test_attention_is_textbook_multihead_attention_on_x_plus_p() -> None:
    """Same weights in torch's MultiheadAttention (scale 1/sqrt(d/h)) give the same output."""
    d, h, n = 12, 3, 10
    layer = build_layer("attention", d, heads=h)
    mha = nn.MultiheadAttention(d, h, bias=False, batch_first=True)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat([layer.W_q.weight, layer.W_k.weight, layer.W_v.weight]))
        mha.out_proj.weight.copy_(layer.W_o.weight)
        x = _x(2, n, d)
        xp = x + chapter_encoding(n, d)  # the chapter's own code
        expected, _ = mha(xp, xp, xp, need_weights=False)
        assert torch.allclose(layer(x), expected, atol=1e-5)


def test_attention_sdpa_computes_the_same_function() -> None:
    x = _x(2, 33, 16)
    with torch.no_grad():
        a = build_layer("attention", 16, heads=4)(x)
        b = build_layer("attention-sdpa", 16, heads=4)(x)
    assert torch.allclose(a, b, atol=1e-5)


def test_attention_works_beyond_any_max_len() -> None:
    n = 1500  # the chapter's table stops at max_len=1000
    layer = build_layer("attention", 5, heads=1)
    with torch.no_grad():
        y = layer(_x(1, n, 5))
    assert y.shape == (1, n, 5)
    assert layer.pos.P.shape[0] >= n


def test_positional_table_is_a_buffer_that_moves_with_the_layer() -> None:
    layer = build_layer("attention", 8, heads=2)
    with torch.no_grad():
        layer(_x(1, 4, 8))
    assert "pos.P" in dict(layer.named_buffers())
    layer = layer.to(torch.float64)
    assert layer.pos.P.dtype == torch.float64
    with torch.no_grad():
        y = layer(_x(1, 20, 8).double())  # grows in the buffer's dtype
    assert y.dtype == torch.float64
    assert layer.pos.P.dtype == torch.float64


@pytest.mark.parametrize(
    ("name", "d", "opts", "message"),
    [
        ("transformer", 8, {}, "unknown layer 'transformer'"),
        ("attention", 10, {"heads": 4}, "not divisible by heads=4"),
        ("conv", 0, {}, "d must be >= 1"),
        ("conv", 8, {"k": 0}, "k must be >= 1"),
    ],
)
def test_bad_layer_options_raise_domain_error(name: str, d: int, opts: dict, message: str) -> None:
    with pytest.raises(AttnbenchError, match=message):
        build_layer(name, d, **opts)
