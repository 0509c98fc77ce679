"""Layers from packages nobody here wrote, swept as a user hands them over (a plugin file):
lucidrains' local-attention (blocked windows, and a window that refuses other lengths),
performer-pytorch (FAVOR+ random features) and linear-attention-transformer. Every figure is
checked against a formula or a count by hand written out here.

The packages come with the pinned ``thirdparty`` extra (``pip install -e ".[thirdparty]"``, which
.ci/run installs); without them these tests are skipped, not failed.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from synthetic import registry_restored
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.results.loader import load_results

for package in ("local_attention", "performer_pytorch", "linear_attention_transformer"):
    pytest.importorskip(package, reason='the thirdparty tests need pip install -e ".[thirdparty]"')

runner = CliRunner()

PLUGINS = """
import torch
from torch import nn
from local_attention import LocalAttention
from performer_pytorch import SelfAttention as PerformerAttention
from linear_attention_transformer import LinearAttentionTransformer


class Local(nn.Module):
    def __init__(self, d, window, **options):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.attn = LocalAttention(window_size=window, dim=d, **options)

    def forward(self, x):  # (B, n, d)
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # 3 x (B, n, d)
        return self.attn(q, k, v)


def local(d):  # blocks of 16, each seeing the one before and the one after; any length
    return Local(d, 16, autopad=True)


def local_causal(d):  # blocks of 16, each seeing itself (causally) and the two before
    return Local(d, 16, causal=True, look_backward=2, autopad=True)


def local48(d):  # blocks of 48, no padding: a length that is not a multiple of 48 is refused
    return Local(d, 48, autopad=False)


def local128(d):  # blocks of 128, no padding: refuses the usual probes (16, 32, 64)
    return Local(d, 128, autopad=False)


def performer(d):
    return PerformerAttention(dim=d, heads=4, dim_head=16, nb_features=8)


def linear(d):
    return LinearAttentionTransformer(
        dim=d, heads=4, depth=1, max_seq_len=4096, n_local_attn_heads=0
    )
"""

D = 32
BATCH = 2


@pytest.fixture(autouse=True)
def registry() -> Iterator[None]:
    with registry_restored():
        yield


def sweep(folder: Path, layers: str, ns: tuple[int, ...]) -> pd.DataFrame:
    path = folder / "plugins.py"
    path.write_text(textwrap.dedent(PLUGINS))
    out = folder / "run"
    spec = ",".join(f"{path}:{name}" for name in layers.split(","))
    result = runner.invoke(
        app,
        ["sweep", "--layers", spec, "--n", ",".join(map(str, ns)), "--d", str(D),
         "--batch", str(BATCH), "--device", "cpu", "--time-budget", "0.002", "--no-charts",
         "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return load_results(out).frame.set_index(["layer", "n"])


NS = (48, 128, 200)  # 48: measured directly; 128 and 200 (a partial last block): extended


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> pd.DataFrame:
    return sweep(tmp_path_factory.mktemp("thirdparty"), "local,local_causal,performer,linear", NS)


def blocks_to_cross(n: int, width: int, reach: int) -> int:
    """By hand: ⌈n/width⌉ blocks, and one application moves a dependency ``reach`` blocks."""
    return max(1, math.ceil((math.ceil(n / width) - 1) / reach))


@pytest.mark.slow
@pytest.mark.parametrize(("layer", "reach"), [("local", 1), ("local_causal", 2)])
def test_blocked_local_attention_gets_a_path_at_every_n(
    swept: pd.DataFrame, layer: str, reach: int
):
    for n in NS:
        row = swept.loc[(f"plugins:{layer}", n)]
        assert row["status"] == "ok" and row["time_s"] > 0
        assert row["path_len"] == blocks_to_cross(n, 16, reach), (n, row["path_len_method"])
        expected = "measured" if n <= 64 else "extended: blocks of 16"
        assert row["path_len_method"].startswith(expected)
        # O(1): the same chain at every n, and one op more where autopad pads a partial block
        padded = n % 16 != 0
        assert row["seq_steps"] == swept.loc[(f"plugins:{layer}", 128), "seq_steps"] + padded
        assert row["flops"] > 0 and row["uncounted_ops"] == ""
    causal = swept.loc[("plugins:local_causal", 128), "path_len_method"]
    assert "block j-i in [-2, 0], causal inside a block" in causal


def performer_forward(n: int, d: int, heads: int = 4, e: int = 16, m: int = 8) -> int:
    """FAVOR+ per sequence: q, k, v and output projections (4 of 2·n·d·h·e); per head, the
    random features of q and k (2 of 2·n·e·m), kᵀv and q(kᵀv) (2 of 2·n·m·e), and the
    normaliser q·Σk (2·n·m)."""
    return 4 * 2 * n * d * heads * e + heads * (2 * 2 * n * e * m + 2 * 2 * n * m * e + 2 * n * m)


def linear_forward(n: int, d: int, heads: int = 4) -> int:
    """One block: q, k, v, out projections (4 of 2·n·d²), the feed-forward d -> 4d -> d
    (2 of 2·n·d·4d), and per head kᵀv and q(kᵀv) with heads of d/h (2 of 2·n·(d/h)²)."""
    e = d // heads
    return 4 * 2 * n * d * d + 2 * 2 * n * d * 4 * d + heads * 2 * 2 * n * e * e


FORMULAS = {"performer": performer_forward, "linear": linear_forward}


@pytest.mark.parametrize("layer", FORMULAS)
def test_linear_attentions_are_counted_and_global(swept: pd.DataFrame, layer: str) -> None:
    formula = FORMULAS[layer]
    for n in NS:
        row = swept.loc[(f"plugins:{layer}", n)]
        assert row["status"] == "ok" and row["time_s"] > 0
        assert row["flops"] == BATCH * formula(n, D)  # linear in n: no n x n score matrix
        assert row["uncounted_ops"] == ""
        assert row["path_len"] == 1  # every output reads every input in one application
        assert row["seq_steps"] == swept.loc[(f"plugins:{layer}", NS[0]), "seq_steps"]


def test_a_window_that_refuses_other_lengths_is_measured_at_every_length_it_accepts(
    tmp_path: Path,
) -> None:
    frame = sweep(tmp_path, "local48", (96, 192))
    for n in (96, 192):
        row = frame.loc[("plugins:local48", n)]
        assert row["status"] == "ok" and row["time_s"] > 0, row["error"]
        assert row["path_len"] == blocks_to_cross(n, 48, 1)  # 1 at n = 96, 3 at n = 192
        assert row["seq_steps"] > 0 and row["flops"] > 0


@pytest.mark.slow
def test_a_window_past_the_probes_is_extended_from_lengths_it_accepts_between_other_layers(
    tmp_path: Path,
) -> None:
    """The issue's case: a window of 128 swept at lengths past it, after attention and before
    rnn in one command. Its dependency patterns are taken at the shortest lengths it accepts
    (128..512), in chunks that fit, never the whole n x n x d at once (17 GB at n = 1024 once
    ended a sweep), and every row after it is measured."""
    path = tmp_path / "plugins.py"
    path.write_text(textwrap.dedent(PLUGINS))
    out = tmp_path / "run"
    result = runner.invoke(app, [
        "sweep", "--layers", f"attention,{path}:local128,rnn", "--n", "256,1024", "--d", str(D),
        "--device", "cpu", "--time-budget", "0.002", "--no-charts", "--out", str(out),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    run = load_results(out)
    frame = run.frame.set_index(["layer", "n"])
    assert run.status == "complete" and set(frame["status"]) == {"ok"} and len(frame) == 6
    for n in (256, 1024):
        row = frame.loc[("plugins:local128", n)]
        assert row["path_len"] == blocks_to_cross(n, 128, 1)  # 1 at n = 256, 7 at n = 1024
    assert frame.loc[("plugins:local128", 256), "path_len_method"] == "measured"
    extended = frame.loc[("plugins:local128", 1024), "path_len_method"]
    assert extended.startswith("extended: blocks of 128") and "n=128..512" in extended
    assert frame.loc[("rnn", 1024), "path_len"] == 1024  # measured after it
