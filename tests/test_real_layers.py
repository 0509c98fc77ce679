"""Layers nobody here wrote, counted right: torch's own attention modules through their fused fast
paths, a layer built on an op with no FLOP formula, one that accepts only some lengths, and one
whose auxiliary count fails. Each is swept for real; the expected figures are formulas written
out here."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from synthetic import registry_restored
from torch import nn
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.measure.counts.flops import trace_flops
from attnbench.measure.counts.ops import unfused
from attnbench.measure.record import CaseResult
from attnbench.results.loader import load_results
from attnbench.spec import Case

runner = CliRunner()

PLUGINS = """
import torch
import torch.nn.functional as F
from torch import nn

from attnbench.layers import SELF_ATTENTION, LayerEntry
from attnbench.theory import LayerTheory, Term


class TorchMHA(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.attn = nn.MultiheadAttention(d, 4, batch_first=True)

    def forward(self, x):  # (B, n, d)
        return self.attn(x, x, x, need_weights=False)[0]


def mha(d):
    return TorchMHA(d)


def encoder(d):
    return nn.TransformerEncoderLayer(d, 4, dim_feedforward=2 * d, dropout=0.0, batch_first=True)


class Fourier(nn.Module):  # FNet's mixing: an FFT over positions, an op with no FLOP formula
    def __init__(self, d):
        super().__init__()
        self.proj = nn.Linear(d, d, bias=False)

    def forward(self, x):  # (B, n, d)
        return self.proj(torch.fft.fft2(x).real)


FOURIER = LayerEntry(
    "fourier", Fourier, SELF_ATTENTION, "FNet mixing, declared with its projection only", (),
    LayerTheory("O(n d^2)", (Term(2, "b·n·d²", lambda s: s["b"] * s["n"] * s["d"] ** 2),)),
)


class Blocked(nn.Module):  # attention inside blocks of 48 positions: other lengths refused
    def __init__(self, d):
        super().__init__()
        self.block = 48

    def forward(self, x):  # (B, n, d)
        b, n, d = x.shape
        assert n % self.block == 0, f"sequence length {n} must be divisible by {self.block}"
        blocks = x.reshape(b, n // self.block, self.block, d)  # (B, n/48, 48, d)
        scores = blocks @ blocks.transpose(-1, -2) / d**0.5  # (B, n/48, 48, 48)
        return (scores.softmax(-1) @ blocks).reshape(b, n, d)


def blocked(d):
    return Blocked(d)


class NoGradients(nn.Module):  # refuses the input gradients the path-length probe takes
    def __init__(self, d):
        super().__init__()
        self.mix = nn.Linear(d, d)

    def forward(self, x):  # (B, n, d)
        assert not x.requires_grad, "no gradients"
        return self.mix(x.cumsum(dim=1))
"""

NS = (48, 96)
D = 16
BATCH = 2


def mha_forward(n: int, d: int) -> int:
    """nn.MultiheadAttention's forward per sequence: q, k, v and output projections (4 of
    2·n·d² each), then scores and their weighted sum (2 of 2·n²·d each)."""
    return 8 * n * d * d + 4 * n * n * d


@pytest.fixture(autouse=True)
def registry() -> Iterator[None]:
    with registry_restored():
        yield


def sweep(folder: Path, layers: str, *extra: str) -> tuple[pd.DataFrame, str]:
    path = folder / "plugins.py"
    path.write_text(textwrap.dedent(PLUGINS))
    out = folder / f"run{len(list(folder.iterdir()))}"
    spec = ",".join(f"{path}:{name}" for name in layers.split(","))
    with registry_restored():
        result = runner.invoke(
            app,
            ["sweep", "--layers", spec, "--n", ",".join(map(str, NS)), "--d", str(D),
             "--batch", str(BATCH), "--device", "cpu", "--time-budget", "0.002",
             "--no-charts", "--out", str(out), *extra],
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    return load_results(out).frame.set_index(["layer", "n"]), result.stderr


@pytest.fixture(scope="module")
def forward(tmp_path_factory: pytest.TempPathFactory) -> tuple[pd.DataFrame, str]:
    return sweep(tmp_path_factory.mktemp("real"), "mha,encoder,FOURIER,blocked,NoGradients")


@pytest.mark.slow
def test_multihead_attention_is_counted_through_its_fast_path(forward):
    frame, _ = forward
    for n in NS:
        row = frame.loc[("plugins:mha", n)]
        assert row["status"] == "ok"
        assert row["flops"] == BATCH * mha_forward(n, D)
        assert "_native_multi_head_attention" in row["fused_path"]  # the timed call's path
        assert row["seq_steps"] > 3  # the projections, scores, softmax, not one fused op
        assert row["elementwise"] >= BATCH * 4 * n * n  # at least the softmax over the scores
        assert pd.isna(row["uncounted_ops"]) or row["uncounted_ops"] == ""
    assert torch.backends.mha.get_fastpath_enabled()  # restored after counting


def test_transformer_encoder_layer_is_counted_through_its_fast_path(forward):
    frame, _ = forward
    for n in NS:
        row = frame.loc[("plugins:encoder", n)]
        ffn = 2 * (2 * n * D * (2 * D))  # two products of n x d x 2d
        assert row["flops"] == BATCH * (mha_forward(n, D) + ffn)
        assert "_transformer_encoder_layer_fwd" in row["fused_path"]


def test_an_op_with_no_formula_is_named_and_the_check_is_incomplete(forward):
    frame, summary = forward
    for n in NS:
        row = frame.loc[("fourier", n)]
        assert row["flops"] == BATCH * 2 * n * D * D  # the projection, which is counted
        assert row["flops_check"] == "incomplete"  # though the declared formula agrees
        assert row["uncounted_ops"] == f"aten._fft_c2c x1 ({2 * BATCH * n * D:,} elements)"
    assert set(frame.loc["plugins:mha", "flops_check"]) == {"no theory"}
    flat = " ".join(summary.split())
    assert "ran ops with no FLOP formula (aten._fft_c2c)" in flat


def test_a_layer_that_refuses_some_lengths_is_measured_at_those_it_accepts(forward):
    frame, _ = forward
    for n in NS:
        row = frame.loc[("plugins:blocked", n)]
        assert row["status"] == "ok"
        assert row["time_s"] > 0
        assert row["flops"] == BATCH * 2 * (2 * n * 48 * D)  # scores and sum, per block
        assert row["path_len_method"] == "measured"
        assert row["path_len"] == 1  # one application, inside a block; blocks never meet


def test_an_auxiliary_count_that_fails_keeps_the_case(forward):
    frame, _ = forward
    for n in NS:
        row = frame.loc[("plugins:NoGradients", n)]
        assert row["status"] == "ok"
        assert row["time_s"] > 0 and row["flops"] == BATCH * 2 * n * D * D
        assert pd.isna(row["path_len"])
        assert row["path_len_method"].startswith("none: AssertionError: no gradients")
        assert row["seq_steps"] > 0  # the other counts are kept


@pytest.mark.slow
def test_the_train_row_describes_one_code_path(tmp_path: Path):
    frame, _ = sweep(tmp_path, "mha,encoder", "--mode", "train")
    for n in NS:
        # The projections: forward, then the gradients of both operands (3 x 8·n·d²). The
        # attention runs as torch's fused SDPA when gradients are on: its 2 products forward,
        # and backward the scores recomputed and dV, dP, dQ, dK (5 products of 2·n²·d).
        mha_train = 3 * 8 * n * D * D + (2 + 5) * 2 * n * n * D
        ffn = 2 * (2 * n * D * (2 * D))  # the encoder's feed-forward: n x d x 2d, twice
        for layer, flops in (("mha", mha_train), ("encoder", mha_train + 3 * ffn)):
            row = frame.loc[(f"plugins:{layer}", n)]
            assert row["flops"] == BATCH * flops, layer
            assert row["seq_steps"] > 3 and row["elementwise"] >= BATCH * 4 * n * n
            assert pd.isna(row["fused_path"]) or row["fused_path"] == ""  # grad on: no fast path


def test_the_table_notes_an_incomplete_count(tmp_path: Path):
    path = tmp_path / "plugins.py"
    path.write_text(textwrap.dedent(PLUGINS))
    out = tmp_path / "run"
    result = runner.invoke(
        app,
        ["sweep", "--layers", f"{path}:FOURIER", "--n", "16,32", "--d", "8", "--device", "cpu",
         "--time-budget", "0.002", "--no-charts", "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    table = runner.invoke(app, ["table", str(out)])
    assert table.exit_code == 0, table.output
    notes = " ".join(table.stderr.split())
    assert "fourier: 2 case(s) ran ops with no FLOP formula" in notes


def test_uncounted_ops_make_any_check_incomplete():
    case = Case("conv", 16, 8, 1, "float32", "cpu", "forward", (("k", 3),))
    exact = CaseResult(case, "ok", 1, flops=10, flops_analytic=10.0)
    assert exact.flops_check == "ok"
    partial = CaseResult(case, "ok", 1, flops=10, flops_analytic=10.0, uncounted_ops="aten.x x1")
    assert partial.flops_check == "incomplete"
    no_theory = CaseResult(case, "ok", 1, flops=10, uncounted_ops="aten.x x1")
    assert no_theory.flops_check == "incomplete"


def test_the_count_names_each_uncounted_op_with_its_calls_and_elements():
    x = torch.randn(2, 8, 4)  # (B, n, d): 64 elements

    def fft_twice() -> torch.Tensor:
        return torch.fft.rfft(torch.fft.rfft(x, dim=1).real, dim=1).real

    count = trace_flops(fft_twice)
    assert count.total == 0
    # 64 read and 2·5·4 complex written, then those 40 read and 2·3·4 written
    assert count.uncounted == f"aten._fft_r2c x2 ({64 + 40 + 40 + 24} elements)"
    w = torch.randn(4, 4)
    assert trace_flops(lambda: x @ w).uncounted == ""  # counted ops are not named
    assert trace_flops(lambda: (x * 2).softmax(-1).cumsum(1)).uncounted == ""  # elementwise


def test_unfused_turns_the_attention_fast_path_off_and_back_on():
    attn = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    x = torch.randn(1, 4, 8)  # (B, n, d)
    with torch.no_grad():
        plain = trace_flops(lambda: attn(x, x, x, need_weights=False)[0])
    assert plain.total == mha_forward(4, 8)
    with unfused():
        assert not torch.backends.mha.get_fastpath_enabled()
    assert torch.backends.mha.get_fastpath_enabled()


def test_the_fused_path_of_the_timed_call_is_recorded_and_a_plain_one_is_not():
    from attnbench.measure.counts.ops import describe_fused, fused_names, recording_fused

    x = torch.randn(2, 16, 8)  # (B, n, d)
    lstm = nn.LSTM(8, 8, batch_first=True).eval()
    seen: set[str] = set()
    with torch.no_grad():
        recording_fused(lambda: lstm(x), seen)()
    assert "lstm" in seen  # the op nn.LSTM issues, which the dispatcher never shows
    if torch.backends.mkldnn.is_available():
        assert seen == {"lstm", "mkldnn_rnn_layer"}
        assert "mkldnn_rnn_layer (oneDNN recurrent kernel)" in describe_fused(seen)
    gru, ran = nn.GRU(8, 8, batch_first=True).eval(), set()
    with torch.no_grad():
        recording_fused(lambda: gru(x), ran)()
    assert ran == {"gru"}  # its steps' ops dispatched from C++, no fused kernel
    linear, plain = nn.Linear(8, 8), set()
    recording_fused(lambda: linear(x), plain)()
    assert plain == set()
    # The text reads back as the names (the machine model looks for a fused recurrence).
    two = {"mkldnn_rnn_layer", "_native_multi_head_attention"}
    assert fused_names(describe_fused(two)) == two and fused_names("") == set()


def scores_bytes(n: int, heads: int = 4) -> int:
    """The float32 scores of an explicit attention, per call: written by QK^T, read and
    written by the softmax, read by the product with V."""
    return 4 * BATCH * heads * n * n * 4


@pytest.mark.parametrize("layer", ["plugins:mha", "plugins:encoder"])
def test_the_cpu_fast_path_is_counted_as_the_explicit_attention_its_kernel_runs(forward, layer):
    # On the CPU, MultiheadAttention's fused kernel computes QK^T, a softmax over the n x n
    # scores and their product with V; the unfused path it is counted on would have run a
    # flash kernel (``attention@``) that never writes the scores.
    frame, _ = forward
    for n in NS:
        row = frame.loc[(layer, n)]
        kernels = str(row["kernels"])
        assert "attention@" not in kernels
        softmax = BATCH * 4 * n * n  # elements read
        assert f"ew._softmax:{softmax}:{2 * 4 * softmax}" in kernels.split("; ")
        head_products = f"gemm@{D // 4}:{BATCH * 4 * n * n * D}:"  # QK^T and AV, 2·n²·d each
        assert any(k.startswith(head_products) for k in kernels.split("; "))
        assert row["bytes"] > scores_bytes(n)


def test_explicit_attention_counts_the_same_output_and_leaves_a_direct_sdpa_fused():
    from attnbench.measure.counts.census import take_census
    from attnbench.measure.counts.ops import explicit_attention

    attn = nn.MultiheadAttention(16, 4, batch_first=True).eval()
    x = torch.randn(1, 32, 16)  # (B, n, d)
    with torch.no_grad():
        real = attn(x, x, x, need_weights=False)[0]  # the fast path
    with explicit_attention(), unfused(), torch.no_grad():
        out, weights = attn(x, x, x, need_weights=False)
    assert weights is None  # the caller gets what it asked for
    torch.testing.assert_close(out, real)
    q = torch.randn(1, 4, 32, 4)  # (B, h, n, hs)
    with explicit_attention():
        direct = take_census(lambda: F.scaled_dot_product_attention(q, q, q))
        counted = take_census(lambda: attn(x, x, x, need_weights=False)[0])
    assert "attention@4" in direct.traffic.kernels_text()
    assert "ew._softmax:4096:" in counted.traffic.kernels_text()
    plain = take_census(lambda: attn(x, x, x, need_weights=False)[0])  # off again
    assert "attention@4" in plain.traffic.kernels_text()


def test_the_cpu_fast_path_runs_explicit_scores_in_this_torch():
    # What ``explicit_attention`` stands on: if a torch ever runs a fused attention kernel
    # inside the CPU fast path, this fails and the counting must follow it.
    from torch.profiler import profile

    attn = nn.MultiheadAttention(16, 4, batch_first=True).eval()
    x = torch.randn(1, 32, 16)  # (B, n, d)
    with torch.no_grad(), profile() as prof:
        attn(x, x, x, need_weights=False)
    names = {event.name for event in prof.events()}
    assert {"aten::_native_multi_head_attention", "aten::bmm", "aten::_softmax"} <= names
    assert not any("flash" in name or "efficient" in name for name in names)


def test_only_a_layer_holding_multihead_attention_spends_a_call_on_its_fast_paths():
    from attnbench.measure.case import attention_fast_paths
    from attnbench.measure.step import Step

    def refuse() -> torch.Tensor:
        raise AssertionError("called")

    x = torch.randn(1, 8, 16)  # (B, n, d)
    assert attention_fast_paths(Step(nn.Linear(16, 16), x, refuse)) == frozenset()
    attn = nn.MultiheadAttention(16, 4, batch_first=True).eval()

    def call() -> torch.Tensor:
        with torch.no_grad():
            return attn(x, x, x, need_weights=False)[0]

    assert attention_fast_paths(Step(attn, x, call)) == {"_native_multi_head_attention"}
    attn.train()  # a training call takes the unfused path, counted as it runs
    assert attention_fast_paths(Step(attn, x, lambda: attn(x, x, x)[0])) == frozenset()


def test_the_timed_devices_rule_decides_which_fast_paths_wrote_scores():
    # torch's kernels: the CPU's fast path always computes the scores; CUDA's hands them to a
    # fused kernel at head widths that are a multiple of 8 and writes them at others.
    from attnbench.measure.counts.census import take_census
    from attnbench.measure.counts.ops import explicit_attention, scores_explicit

    assert scores_explicit("cpu", 16) and scores_explicit("cpu", 12)
    assert scores_explicit("cuda", 12) and not scores_explicit("cuda", 16)
    assert not scores_explicit("mps", 12) and not scores_explicit(None, 12)

    def kernels(d: int, timed_on: str | None) -> str:
        attn = nn.MultiheadAttention(d, 4, batch_first=True).eval()
        x = torch.randn(1, 16, d)  # (B, n, d)
        with explicit_attention(timed_on):
            return take_census(lambda: attn(x, x, x, need_weights=False)[0]).traffic.kernels_text()

    # Counted here on the CPU, as a case timed on CUDA and counted in its own process would be.
    assert "ew._softmax:1024:" in kernels(48, "cuda")  # head width 12: explicit there
    assert "attention@16" in kernels(64, "cuda")  # head width 16: a fused kernel there
    assert "ew._softmax:1024:" in kernels(64, "cpu")
    assert "attention@16" in kernels(64, None)
