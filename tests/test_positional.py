from __future__ import annotations

import math

import pytest
import torch

from attnbench.positional import SinusoidalPositionalEncoding, shift_rotation, sinusoidal_table


@pytest.mark.parametrize("d", [1, 2, 7, 8, 33])
def test_table_matches_the_formula(d: int) -> None:
    n = 50
    table = sinusoidal_table(n, d, dtype=torch.float64)
    assert table.shape == (n, d)
    for i in (0, 1, 17, 49):
        for col in range(d):
            j = col // 2
            angle = i / 10000 ** (2 * j / d)
            expected = math.sin(angle) if col % 2 == 0 else math.cos(angle)
            assert table[i, col].item() == pytest.approx(expected, abs=1e-12)


def test_odd_width_ends_with_a_sine_column() -> None:
    table = sinusoidal_table(10, 5, dtype=torch.float64)
    angle = torch.arange(10, dtype=torch.float64) / 10000 ** (4 / 5)
    assert torch.allclose(table[:, 4], torch.sin(angle))


def test_no_max_len_and_large_positions_stay_exact() -> None:
    n, d = 100_000, 16
    table = sinusoidal_table(n, d, dtype=torch.float64)
    assert table.shape == (n, d)
    assert table[n - 1, 0].item() == pytest.approx(math.sin(n - 1), abs=1e-9)


@pytest.mark.parametrize("d", [8, 9, 32])
@pytest.mark.parametrize("delta", [1, 5, 37])
def test_relative_shift_is_a_rotation_independent_of_position(d: int, delta: int) -> None:
    n = 100
    table = sinusoidal_table(n + delta, d, dtype=torch.float64)
    rot = shift_rotation(delta, d)  # (d//2, 2, 2)
    pairs = table[:n, : 2 * (d // 2)].reshape(n, d // 2, 2)  # (n, d//2, 2)
    shifted = torch.einsum("jab,ijb->ija", rot, pairs)  # (n, d//2, 2)
    target = table[delta : n + delta, : 2 * (d // 2)].reshape(n, d // 2, 2)
    assert (shifted - target).abs().max().item() < 1e-12


def test_module_adds_the_table_and_grows_on_demand() -> None:
    pe = SinusoidalPositionalEncoding(6)
    x = torch.zeros(2, 12, 6)
    assert torch.allclose(pe(x)[1], sinusoidal_table(12, 6))
    assert pe.P.shape == (12, 6)
    pe(torch.zeros(1, 3, 6))  # shorter input reuses the table
    assert pe.P.shape == (12, 6)


def test_relative_shift_error_is_rounding_for_the_real_table() -> None:
    from attnbench.positional import relative_shift_error

    assert relative_shift_error(60, 32) < 1e-13
    assert relative_shift_error(60, 33, range(1, 5)) < 1e-13  # odd d: the last sine has no pair
    assert 1e-9 < relative_shift_error(60, 32, dtype=torch.float32) < 1e-5


def test_relative_shift_error_sees_a_broken_encoding(monkeypatch: pytest.MonkeyPatch) -> None:
    # With sine and cosine swapped, the rotations of the real table no longer map row i to i+δ.
    import attnbench.positional as positional

    real = positional.sinusoidal_table

    def swapped(n: int, d: int, **kw: object) -> torch.Tensor:
        return real(n, d, **kw)[:, torch.arange(d) ^ 1] if d % 2 == 0 else real(n, d, **kw)

    monkeypatch.setattr(positional, "sinusoidal_table", swapped)
    assert positional.relative_shift_error(60, 32) > 0.1


def test_binary_digits_lowest_bit_first() -> None:
    from attnbench.positional import binary_digits

    bits = binary_digits(8, 3)
    assert bits[5].tolist() == [1, 0, 1]  # 5 = 101
    assert bits[:, 0].tolist() == [0, 1, 0, 1, 0, 1, 0, 1]  # the lowest bit flips every step
