"""The checks end to end: a layer whose counts disagree with its declared theory is reported as
disagreeing, in results.csv, in the sweep's summary and in ``table``; one that keeps its theory
is reported as agreeing. Real layers, traced for real: nothing here is written into a table by
hand."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from synthetic import registry_restored
from torch import nn
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.errors import AttnbenchError
from attnbench.layers.checks import check_output
from attnbench.layers.entry import LayerEntry, LayerOption
from attnbench.layers.registry import register
from attnbench.results.loader import load_results

runner = CliRunner()

# Two layers and three declared theories: an MLP (4·b·n·d² FLOPs, no sequential steps) declared
# with half its FLOPs, and declared recurrent; a recurrence over n declared O(1) sequential.
LAYERS = """
import torch
from torch import nn

from attnbench.layers import RECURRENT, SELF_ATTENTION, LayerEntry
from attnbench.theory import LayerTheory, Term


def nd2(s):
    return s["b"] * s["n"] * s["d"] * s["d"]


class Mlp(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.up = nn.Linear(d, d, bias=False)
        self.down = nn.Linear(d, d, bias=False)

    def forward(self, x):  # (B, n, d)
        return self.down(self.up(x))  # two products of d x d per position: 4·b·n·d²


class Loop(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.step = nn.Linear(d, d, bias=False)

    def forward(self, x):  # (B, n, d)
        h = torch.zeros_like(x[:, 0])  # (B, d)
        out = []
        for t in range(x.shape[1]):  # one step after another: n sequential steps
            h = self.step(h) + x[:, t]
            out.append(h)
        return torch.stack(out, dim=1)  # (B, n, d)


HALF = LayerEntry(
    "half", Mlp, SELF_ATTENTION, "an MLP declared with half its FLOPs", (),
    LayerTheory("O(n d^2)", (Term(2, "b·n·d²", nd2),), order=nd2),
)
CONSTANT = LayerEntry(
    "constant", Loop, RECURRENT, "a recurrence declared O(1) sequential", (),
    LayerTheory(
        "O(n d^2)", (Term(2, "b·n·d²", nd2),), sequential="O(1)", path="O(n)", order=nd2,
        path_law=lambda s: s["n"],
    ),
)
LINEAR = LayerEntry(
    "linear-steps", Mlp, RECURRENT, "an MLP declared O(n) sequential", (),
    LayerTheory(
        "O(n d^2)", (Term(4, "b·n·d²", nd2),), sequential="O(n)", path="O(1)", order=nd2,
        sequential_law=lambda s: s["n"],
    ),
)
"""


@pytest.fixture(autouse=True)
def registry() -> Iterator[None]:
    with registry_restored():
        yield


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One sweep of the three declared layers and the built-in rnn, on four lengths: enough
    for an exact count's interval to exclude a wrong law."""
    folder = tmp_path_factory.mktemp("checks")
    path = folder / "declared.py"
    path.write_text(textwrap.dedent(LAYERS))
    out = folder / "run"
    layers = ",".join(f"{path}:{name}" for name in ("HALF", "CONSTANT", "LINEAR"))
    with registry_restored():
        result = runner.invoke(
            app,
            ["sweep", "--layers", f"{layers},rnn", "--n", "8,16,32,64", "--d", "8",
             "--device", "cpu", "--time-budget", "0.002", "--no-charts", "--out", str(out)],
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    return out, result.stderr


@pytest.mark.slow
def test_a_formula_that_disagrees_with_the_count_is_a_mismatch(checked: tuple[Path, str]):
    out, summary = checked
    frame = load_results(out).frame.set_index("layer")
    half = frame.loc["half"]
    assert list(half["flops"]) == [4 * n * 8 * 8 for n in (8, 16, 32, 64)]  # counted
    assert list(half["flops_analytic"]) == [2 * n * 8 * 8 for n in (8, 16, 32, 64)]  # declared
    assert set(half["flops_check"]) == {"mismatch"}
    assert set(frame.loc["linear-steps", "flops_check"]) == {"ok"}  # the same MLP, declared right
    assert set(frame.loc["rnn", "flops_check"]) == {"ok"}
    flat = " ".join(summary.split())
    assert "counted FLOPs differ from the analytic formula by more than 1% in 4 case(s)" in flat
    assert "(half)" in flat
    table = runner.invoke(app, ["table", str(out)])
    assert table.exit_code == 0, table.output
    notes = " ".join(table.stderr.split())
    assert "half: counted FLOPs differ from the analytic formula by more than 1% in 4 case(s)" in (
        notes
    )
    assert "rnn: counted FLOPs" not in notes
    # fit reads the exponent, which a formula off by a constant factor agrees with: it says so
    fitted = runner.invoke(app, ["fit", str(out)])
    assert fitted.exit_code == 0, fitted.output
    said = " ".join(fitted.stderr.split())
    assert "half: counted FLOPs differ from the analytic formula by more than 1% in 4" in said
    # fit --layers fits those layers, and its notes are theirs
    other = runner.invoke(app, ["fit", str(out), "--layers", "rnn"])
    assert other.exit_code == 0 and "half:" not in other.stderr, other.stderr


@pytest.mark.slow
def test_a_sequential_law_the_steps_contradict_is_reported(checked: tuple[Path, str]):
    out, _ = checked
    table = runner.invoke(app, ["table", str(out), "--json"])
    assert table.exit_code == 0, table.output
    rows = {row["layer"]: row for row in json.loads(table.stdout)}
    # Steps that grow with n, declared O(1); O(1) steps, declared O(n): both disagree.
    assert rows["constant"]["seq_steps_exponent_n"] == pytest.approx(1, abs=0.1)
    assert rows["constant"]["seq_steps_agrees"] is False
    assert rows["constant"]["path_len_agrees"] is True  # its path is declared right
    assert rows["linear-steps"]["seq_steps_exponent_n"] == pytest.approx(0, abs=0.01)
    assert rows["linear-steps"]["seq_steps_agrees"] is False
    # The chapter's RNN keeps both of its laws on the same grid.
    assert rows["rnn"]["seq_steps_agrees"] is True and rows["rnn"]["path_len_agrees"] is True
    assert rows["half"]["seq_steps_agrees"] is True
    notes = " ".join(runner.invoke(app, ["table", str(out)]).stderr.split())
    assert "constant: sequential ops measured n^0.9" in notes
    assert "disagree with the theory's O(1)" in notes
    assert "linear-steps: sequential ops measured n^0.00 disagree with the theory's O(n)" in notes
    assert "rnn: sequential ops" not in notes
    fitted = json.loads(runner.invoke(app, ["fit", str(out), "--json"]).stdout)["exponents"]
    judged = {(e["layer"], e["metric"]): e["agrees"] for e in fitted if e["along"] == "n"}
    assert judged[("constant", "seq_steps")] is False
    assert judged[("rnn", "seq_steps")] is True and judged[("rnn", "path_len")] is True


class _Blocked(nn.Module):
    """Accepts only lengths that are multiples of 48; scales by its option ``gain``."""

    def __init__(self, d: int, gain: int, n: int) -> None:
        super().__init__()
        assert gain == 3, f"gain {gain} did not arrive"
        self.n = n

    def forward(self, x):  # (B, n, d)
        assert x.shape[1] == self.n, "built for another length"
        assert x.shape[1] % 48 == 0, f"length {x.shape[1]} is not a multiple of 48"
        return x * 3


def _entry(build, **kw):  # type: ignore[no-untyped-def]
    gain = LayerOption("gain", 1, "g", "a gain the layer must receive")
    return register(LayerEntry("blocky", build, options=(gain,), needs_length=True, **kw))


def test_the_plugin_check_tries_a_grid_length_before_refusing() -> None:
    entry = _entry(_Blocked)
    check_output(entry, 8, (16, 96), {"gain": 3})  # refused at 16, accepted at 96: passes
    with pytest.raises(AttnbenchError) as refused:
        check_output(entry, 8, (16, 50), {"gain": 3})
    assert str(refused.value) == (
        "layer blocky: calling it on a (2, 50, 8) input failed: "
        "AssertionError: length 50 is not a multiple of 48"
    )  # the error at the grid's length, the last one tried
    with pytest.raises(AttnbenchError) as unbuilt:
        check_output(entry, 8, (96,), {"gain": 1})
    # the factory failed, not the call: a new user's was blamed on calling the layer
    assert str(unbuilt.value) == (
        "layer blocky: building it for a (2, 96, 8) input failed: "
        "AssertionError: gain 1 did not arrive"
    )


def test_a_factory_that_refuses_a_short_length_is_checked_at_the_grids() -> None:
    """A factory may refuse the cheap length tried first (it builds blocks of 48 only): the
    check goes on to the grid's length, as it does for a call that fails."""

    def build(d: int, gain: int, n: int) -> _Blocked:
        if n % 48:
            raise ValueError(f"n={n} is not a whole number of blocks")
        return _Blocked(d, gain, n)

    check_output(_entry(build), 8, (16, 96), {"gain": 3})  # refused at 16, built at 96


class _Mean(nn.Module):  # no parameters: its output has its input's dtype, whatever that is
    def forward(self, x):  # (B, n, d)
        return x.mean(dim=1, keepdim=True).expand_as(x)


def test_the_plugin_check_feeds_float32_whatever_torchs_default_dtype() -> None:
    """A plugin module may set torch's default dtype to float64; the sweep still measures in
    float32, so the check must feed float32 (an input made in the default dtype would give a
    float64 output and a wrong refusal)."""
    entry = _entry(lambda d, gain, n: _Mean())
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        check_output(entry, 8, (16,), {"gain": 1})  # passes: fed float32, returns float32
    finally:
        torch.set_default_dtype(before)
    with pytest.raises(AttnbenchError, match=r"^no length to check the layer at$"):
        check_output(entry, 8, (), {"gain": 1})


def test_the_plugin_check_names_a_wrong_shape_in_one_exact_line() -> None:
    entry = _entry(lambda d, gain, n: nn.Linear(d, d + 1))
    with pytest.raises(AttnbenchError) as refused:
        check_output(entry, 8, (16,), {"gain": 1})
    assert str(refused.value) == (
        "layer blocky maps a (2, 16, 8) input to (2, 16, 9); a layer must map "
        "(batch, n, d) to (batch, n, d) in the input's dtype"
    )
