"""Generation: every built-in layer decodes one token at a time, as its causal form computes
all of them at once, with a step that can be repeated at the same position, and costs and a
state its ``DecodeTheory`` states exactly."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, cast

import pytest
import torch
from torch import nn

from attnbench import build_layer, layer_names
from attnbench.layers import BUILTIN, entry
from attnbench.layers.decoding import (
    Decoder,
    State,
    causal_output,
    decode_error,
    decoder,
    prefill,
    state_bytes,
)
from attnbench.measure.counts.elementwise import count_elementwise
from attnbench.measure.counts.flops import count_flops
from attnbench.positional import SinusoidalPositionalEncoding
from attnbench.theory import DecodeTheory, sizes

B, D = 2, 16
OPTIONS = {"heads": 2, "window": 4, "k": 3, "state": 4}
TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-10}


def _layer(name: str, capacity: int, dtype: torch.dtype = torch.float32, **options: int) -> Any:
    """The layer built for ``capacity`` tokens (conv-dilated's depth depends on it)."""
    layer = build_layer(name, D, seed=0, n=capacity, **{**OPTIONS, **options})
    return layer.to(dtype)


def _x(n: int, dtype: torch.dtype = torch.float32, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(B, n, D, generator=generator, dtype=torch.float64).to(dtype)  # (B, n, d)


def _decode_theory(name: str) -> DecodeTheory:
    theory = entry(name).theory
    assert theory is not None and theory.decode is not None, name
    return theory.decode


def _sizes(name: str, n: int, **options: int) -> dict[str, Any]:
    return sizes(B, n, D, entry(name).resolve({**OPTIONS, **options}))


def _prefilled(name: str, n: int, **options: int) -> tuple[Decoder, torch.Tensor, State]:
    """The layer at context n: built for n + 1 tokens, the first n prefilled into a state
    of capacity n + 1; and the n + 1 tokens."""
    layer = decoder(_layer(name, n + 1, **options))
    assert layer is not None
    x = _x(n + 1)  # (B, n + 1, d)
    with torch.no_grad():
        state = prefill(layer, x[:, :n], n + 1)
    return layer, x, state


def _step(layer: Decoder, x: torch.Tensor, state: State, n: int) -> Callable[[], object]:
    def call() -> object:
        with torch.no_grad():
            return layer.step(x[:, n], state, n)

    call()  # a first call does its one-off work (a table grown, a warning silenced)
    return call


# ----------------------------------------------------------------------------- correctness


def test_every_builtin_layer_decodes() -> None:
    for name in BUILTIN:
        assert decoder(_layer(name, 8)) is not None, name
        _decode_theory(name)


# n = 1024 steps 1024 tokens one by one: all of them together take about 2 s here.
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [1, 2, 127, 1024])
@pytest.mark.parametrize("name", BUILTIN)
def test_decoded_tokens_are_the_causal_layers_output(name: str, n: int, dtype: torch.dtype) -> None:
    layer = _layer(name, n, dtype)
    assert decode_error(layer, _x(n, dtype)) <= TOLERANCE[dtype]


@pytest.mark.parametrize("name", BUILTIN)
def test_a_step_after_prefill_is_the_causal_layers_output(name: str) -> None:
    """The layer's own prefill (one product for the prefix, where it has one) leaves the state
    the steps would: the next token's output is the causal layer's."""
    for n in (1, 6, 40):
        layer, x, state = _prefilled(name, n)
        with torch.no_grad():
            y, _ = layer.step(x[:, n], state, n)  # (B, d)
            expected = causal_output(_layer(name, n + 1), x)[:, n]  # (B, d)
        assert torch.allclose(y, expected, rtol=1e-4, atol=1e-5), (name, n)


@pytest.mark.parametrize("name", BUILTIN)
def test_the_causal_form_sees_no_later_token(name: str) -> None:
    layer, x = _layer(name, 12), _x(12)
    later = x.clone()
    later[:, 7] += 1.0
    with torch.no_grad():
        a, b = causal_output(layer, x), causal_output(layer, later)  # (B, n, d)
    assert torch.equal(a[:, :7], b[:, :7])
    assert not torch.allclose(a[:, 7], b[:, 7])


@pytest.mark.parametrize(
    "name", ["attention", "attention-sdpa", "attention-local", "attention-linear"]
)
def test_the_causal_form_leaves_a_bidirectional_layer_as_it_was(name: str) -> None:
    layer, x = _layer(name, 12, causal=0), _x(12)
    with torch.no_grad():
        before = layer(x)  # (B, n, d)
        causal = causal_output(layer, x)  # (B, n, d)
        after = layer(x)  # (B, n, d)
        built_causal = _layer(name, 12, causal=1)(x)  # (B, n, d)
    assert torch.equal(before, after)
    assert not torch.allclose(before, causal)
    assert torch.allclose(causal, built_causal, rtol=1e-5, atol=1e-6)


def test_the_conv_decodes_its_own_weights_causally() -> None:
    """The centred conv has no causal form: its decode form is the same kernel over the k-1
    tokens before and the token, so the first output sees the first token alone."""
    layer, x = _layer("conv", 8), _x(8)
    with torch.no_grad():
        causal = causal_output(layer, x)  # (B, n, d)
        first = x[:, 0] @ layer.conv.weight[:, :, -1].T + layer.conv.bias  # (B, d)
        centred = layer(x)  # (B, n, d)
    assert torch.allclose(causal[:, 0], first, atol=1e-6)
    assert torch.allclose(causal[:, 1:-1], centred[:, :-2])  # shifted by (k-1)/2 = 1
    assert decode_error(layer, x) <= 1e-6


@pytest.mark.parametrize("k", [1, 2, 4])
def test_the_conv_decodes_any_kernel_size(k: int) -> None:
    assert decode_error(_layer("conv", 9, k=k), _x(9)) <= 1e-5


@pytest.mark.parametrize("k", [2, 3, 4])
@pytest.mark.parametrize("n", [1, 5, 17, 64])
def test_the_dilated_stack_decodes_at_any_depth(k: int, n: int) -> None:
    layer = _layer("conv-dilated", n, torch.float64, k=k)
    assert decode_error(layer, _x(n, torch.float64)) <= 1e-10


def test_local_attention_decodes_windows_wider_than_the_sequence() -> None:
    """r >= n - 1: the ring is never full, and the layer is the full causal attention."""
    x = _x(5, torch.float64)
    local = _layer("attention-local", 5, torch.float64, window=5)
    full = _layer("attention", 5, torch.float64)
    assert decode_error(local, x) <= 1e-10
    with torch.no_grad():
        assert torch.allclose(causal_output(local, x), causal_output(full, x))


# ----------------------------------------------------------------------------- broken steps


def _previous_output(layer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The step answers with the previous token's output (and the first with zeros)."""
    real = layer.step
    last: list[torch.Tensor] = []

    def stale(x: torch.Tensor, state: State, position: int) -> tuple[torch.Tensor, State]:
        y, state = real(x, state, position)
        out = last[0] if last else torch.zeros_like(y)
        last[:] = [y]
        return out, state

    monkeypatch.setattr(layer, "step", stale)


def _the_input(layer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    real = layer.step

    def echo(x: torch.Tensor, state: State, position: int) -> tuple[torch.Tensor, State]:
        return x, real(x, state, position)[1]

    monkeypatch.setattr(layer, "step", echo)


def _one_key_fewer(layer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Attention over the cache without its oldest key (an off-by-one in the slots read)."""
    real = layer._attend_cached

    def short(q: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor) -> torch.Tensor:
        if keys.shape[2] > 1:
            keys, vals = keys[:, :, 1:], vals[:, :, 1:]
        return cast("torch.Tensor", real(q, keys, vals))

    monkeypatch.setattr(layer, "_attend_cached", short)


@pytest.mark.parametrize(
    ("name", "breaking"),
    [
        ("attention", _previous_output),
        ("rnn", _previous_output),
        ("ssm", _previous_output),
        ("conv", _the_input),
        ("attention-linear", _the_input),
        ("attention-sdpa", _one_key_fewer),
        ("attention-local", _one_key_fewer),
    ],
)
def test_a_broken_step_is_caught(
    name: str, breaking: Callable[[Any, pytest.MonkeyPatch], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    layer, x = _layer(name, 40), _x(40)
    assert decode_error(layer, x) <= 1e-4
    breaking(layer, monkeypatch)
    assert decode_error(layer, x) > 1e-3


# ----------------------------------------------------------------------------- idempotence


def _slot(name: str, key: str, n: int) -> tuple[int, int] | None:
    """(dim, index) of the one slot a step at position n writes in place; None for a layer
    whose step leaves its state as it was (it returns new tensors)."""
    if name in ("attention", "attention-sdpa"):
        return 2, n
    if name == "attention-local":
        return 2, n % (OPTIONS["window"] + 1)
    if name == "conv-dilated":
        level = int(key.removeprefix("level"))
        k = OPTIONS["k"]
        return 1, n % ((k - 1) * k**level + 1)
    return None


@pytest.mark.parametrize("n", [3, 9, 40])
@pytest.mark.parametrize("name", BUILTIN)
def test_a_step_repeated_at_the_same_position_gives_the_same_output(name: str, n: int) -> None:
    layer, x, state = _prefilled(name, n)
    before = {key: t.clone() for key, t in state.items()}
    with torch.no_grad():
        y1, after1 = layer.step(x[:, n], state, n)
        first = {key: t.clone() for key, t in after1.items()}
        y2, after2 = layer.step(x[:, n], state, n)
    assert torch.equal(y1, y2)
    assert first.keys() == after2.keys()
    assert all(torch.equal(first[key], after2[key]) for key in first)
    for key, old in before.items():
        slot = _slot(name, key, n)
        if slot is None:
            assert torch.equal(state[key], old), (name, key)  # new tensors returned
            continue
        dim, index = slot
        keep = torch.ones(old.shape[dim], dtype=torch.bool)
        keep[index] = False
        unchanged = old.index_select(dim, keep.nonzero().squeeze(1))
        assert torch.equal(state[key].index_select(dim, keep.nonzero().squeeze(1)), unchanged)
        assert state[key].shape == old.shape  # the cache never grows


# ----------------------------------------------------------------------------- theory


@pytest.mark.parametrize("n", [9, 40])
@pytest.mark.parametrize("name", BUILTIN)
def test_counted_step_flops_equal_the_decode_theory(name: str, n: int) -> None:
    layer, x, state = _prefilled(name, n)
    counted = count_flops(_step(layer, x, state, n))
    assert counted == _decode_theory(name).flops(_sizes(name, n))


@pytest.mark.parametrize("n", [9, 40])
@pytest.mark.parametrize("name", BUILTIN)
def test_state_bytes_equal_the_decode_theory(name: str, n: int) -> None:
    _, _, state = _prefilled(name, n)
    itemsize = torch.finfo(torch.float32).bits // 8
    assert state_bytes(state) == _decode_theory(name).state_values(_sizes(name, n)) * itemsize


@pytest.mark.parametrize("n", [9, 40])
@pytest.mark.parametrize("name", BUILTIN)
def test_counted_step_elementwise_work_equals_the_decode_theory(name: str, n: int) -> None:
    expected = _decode_theory(name).elements(_sizes(name, n))
    if expected is None:
        pytest.skip(f"{name}'s decode theory gives no elementwise formula")
    layer, x, state = _prefilled(name, n)
    assert count_elementwise(_step(layer, x, state, n)) == expected


@pytest.mark.parametrize("name", ["rnn", "gru", "lstm"])
def test_a_recurrent_steps_input_bias_is_apart_only_for_a_batch(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(f"{__name__}.B", 1)
    layer, x, state = _prefilled(name, 5)
    expected = _decode_theory(name).elements(_sizes(name, 5))
    assert count_elementwise(_step(layer, x, state, 5)) == expected


def _held(name: str, n: int) -> int:
    return state_bytes(_prefilled(name, n)[2])


def test_the_attention_cache_grows_linearly_and_the_other_states_do_not() -> None:
    for name in ("attention", "attention-sdpa"):
        held = [_held(name, n) for n in (8, 16, 32)]
        assert held[2] - held[1] == 2 * (held[1] - held[0]) > 0  # linear in n + 1
        assert held[0] == 2 * B * 9 * D * 4  # k and v: 2·b·(n+1)·d float32 values
    for name in ("rnn", "gru", "lstm", "ssm", "ssm-scan", "attention-linear", "conv"):
        assert len({_held(name, n) for n in (8, 16, 32)}) == 1, name
    assert len({_held("attention-local", n) for n in (8, 16, 32)}) == 1  # r + 1 slots


def test_the_decode_theories_state_their_orders() -> None:
    at = _sizes("attention", 100)
    assert _decode_theory("attention").order(at) == 100 * D
    for name in ("rnn", "gru", "lstm", "attention-linear", "conv", "ssm", "attention-local"):
        orders = {_decode_theory(name).order(_sizes(name, n)) for n in (10, 1000)}
        assert len(orders) == 1, name  # the same at any context
    assert {_decode_theory(n).memory for n in ("rnn", "gru", "lstm")} == {"O(d)"}
    assert _decode_theory("attention").memory == "O(n d)"
    # a plugin's step that states no order has none: not a constant, which would read n^0
    unstated = DecodeTheory("O(d^2)", "O(d)", _decode_theory("rnn").terms, (), "causal")
    rnn = entry("rnn").theory
    assert rnn is not None
    read = replace(rnn, decode=unstated).generation()
    assert read is not None and read.order(_sizes("rnn", 100)) == 0  # order_values: not stated


def test_a_decode_run_reads_each_layer_with_its_steps_theory() -> None:
    """``LayerTheory.generation``: the step's FLOPs, elementwise work and orders become the
    theory every fit, chart and table of a decode run reads; a layer without a step's theory
    has none there."""
    theory = entry("attention").theory
    assert theory is not None and theory.decode is not None
    # a step whose sequential steps grow (no built-in's do): what it says must carry over
    step = replace(theory.decode, sequential="O(log n)", sequential_law=lambda s: s["n"] + 1)
    theory = replace(theory, decode=step)
    read = theory.generation()
    assert read is not None
    at = _sizes("attention", 100)
    assert (read.complexity, read.sequential, read.path) == (step.compute, step.sequential, "–")
    assert read.flops(at) == step.flops(at) != theory.flops(at)
    assert read.elements(at) == step.elements(at) is not None
    assert read.order(at) == step.order(at) == 100 * D
    assert read.sequential_law(at) == step.sequential_law(at) == 101
    assert read.decode is step
    assert replace(theory, decode=None).generation() is None
    assert replace(step, elementwise=None).elements(at) is None  # not said: no formula


# ----------------------------------------------------------------------------- positions


def test_a_positional_row_is_what_forward_adds() -> None:
    pos = SinusoidalPositionalEncoding(D)
    added = pos(torch.zeros(1, 20, D))[0]  # (n, d)
    for i in (0, 7, 19, 45):
        expected = added[i] if i < 20 else pos(torch.zeros(1, i + 1, D))[0, i]
        assert torch.equal(pos.row(i), expected)


def test_extending_the_table_leaves_its_rows_as_they_were() -> None:
    pos = SinusoidalPositionalEncoding(D)
    short = pos(torch.zeros(1, 10, D))  # (1, n, d)
    pos.extend(1000)
    assert pos.P.shape == (1000, D)
    assert torch.equal(pos(torch.zeros(1, 10, D)), short)
    pos.extend(5)  # never shrinks
    assert pos.P.shape == (1000, D)


def test_init_state_follows_the_layers_dtype() -> None:
    for name in layer_names():
        if name not in BUILTIN:
            continue
        layer: nn.Module = _layer(name, 8, torch.float64)
        found = decoder(layer)
        assert found is not None
        state = found.init_state(B, 8)
        assert all(t.dtype == torch.float64 for t in state.values()), name


@pytest.mark.parametrize("name", BUILTIN)
def test_the_state_and_the_step_stay_on_the_layers_device(name: str) -> None:
    """On a GPU the state must live where the layer does: every built-in layer made on the
    meta device (no values, every op's shapes and devices) makes its state there and steps
    there, prefill included, as on CUDA (tests/test_cuda.py runs it for real)."""
    layer: nn.Module = _layer(name, 9).to("meta")
    found = decoder(layer)
    assert found is not None
    x = torch.empty(B, 9, 16, device="meta")  # (B, n + 1, d)
    with torch.no_grad():
        state = prefill(found, x[:, :8], 9)
        out, after = found.step(x[:, 8], state, 8)
    assert all(t.device.type == "meta" for t in state.values()), name
    assert all(t.device.type == "meta" for t in after.values()), name
    assert out.device.type == "meta" and tuple(out.shape) == (B, 16)
