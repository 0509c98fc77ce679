"""A layer with a recurrent form from PyPI, generating as a user hands it over: minGRU
(``minGRU-pytorch``, Feng et al. 2024). Its module alone has no step, so its decode cases are a
stated skip; wrapped with the two methods of ``examples/mingru_decode.py`` it decodes, and its
tokens equal its own parallel scan's.

The package comes with the pinned ``thirdparty`` extra; without it these tests are skipped.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch
from synthetic import registry_restored
from typer.testing import CliRunner

from attnbench.cli import app

pytest.importorskip("minGRU_pytorch", reason='needs pip install -e ".[thirdparty]"')

ROOT = Path(__file__).resolve().parents[1]
D = 16
runner = CliRunner()


def test_mingru_decodes_with_its_step_and_is_skipped_without_one(tmp_path: Path) -> None:
    plain = tmp_path / "mingru_plain.py"
    plain.write_text(
        textwrap.dedent(
            """
            from minGRU_pytorch import minGRU

            def make(d):
                return minGRU(d)
            """
        )
    )
    out = tmp_path / "run"
    layers = f"{ROOT / 'examples' / 'mingru_decode.py'}:make,{plain}:make"
    before = torch.get_num_threads()
    try:
        with registry_restored():
            result = runner.invoke(
                app,
                [
                    "sweep", "--mode", "decode", "--layers", layers, "--n", "8,64",
                    "--d", str(D), "--processes", "1", "--max-processes", "1",
                    "--time-budget", "0.005", "--threads", "1", "--no-charts",
                    "--device", "cpu", "--out", str(out),
                ],
            )  # fmt: skip
    finally:
        torch.set_num_threads(before)
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(out / "results.csv")
    wrapped = rows[rows["layer"] == "mingru_decode:make"]
    assert list(wrapped["status"]) == ["ok", "ok"]
    assert (wrapped["decode_check"] < 1e-4).all()  # the steps equal its parallel scan
    assert list(wrapped["state_bytes"]) == [D * 4, D * 4]  # one hidden vector, at any n
    assert list(wrapped["flops"]) == [2 * D * 2 * D] * 2  # to_hidden_and_gate, d -> 2d
    bare = rows[rows["layer"] == "mingru_plain:make"]
    assert list(bare["status"]) == ["skipped", "skipped"]
    assert bare["error"].str.contains("no decode step").all()
