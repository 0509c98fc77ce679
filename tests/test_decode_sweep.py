"""--mode decode, case by case and end to end: a decode case of a built-in layer is measured in
every column with its state's bytes exactly its theory's; a layer without a step is skipped
with the reason, one whose step is broken (wrong shape, an error, a growing state, another
function) fails in one line, its measurements kept where it ran; a plugin with a proper step
is measured; and the command line sweeps, writes and tabulates a decode run.

Everything here is tiny (d = 16, n <= 64, one thread, one timed sample a case in process) so
the file runs in seconds beside a benchmark."""

from __future__ import annotations

import json
import math
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pandas as pd
import pytest
import torch
from synthetic import registry_restored, small_case
from torch import nn
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.cli.correctness import compile_notes, correctness_notes, fast_path_notes
from attnbench.devices import TOLERANCE
from attnbench.formats import FORMAT_VERSION
from attnbench.layers.decoding import State
from attnbench.measure.case import DECODE_PATH, measure_case
from attnbench.measure.record import CaseResult
from attnbench.measure.timing.loop import TimingPolicy
from attnbench.results.loader import load_results
from attnbench.spec import Case

D = 16
# One timed sample, no warm-up: the timing is exercised, not trusted.
QUICK = TimingPolicy(warmup_calls=0, min_block_s=0.0, min_samples=1, max_samples=1, budget_s=0.0)
DECODE_COLUMNS = ("state_bytes", "state_analytic", "state_check", "decode_check")
runner = CliRunner()
# The command line's smallest decode sweep: one round a case, one thread, no charts.
FAST = [
    "--mode", "decode", "--d", str(D), "--device", "cpu", "--processes", "1",
    "--max-processes", "1", "--time-budget", "0.005", "--threads", "1", "--no-charts",
]  # fmt: skip


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def registry() -> Iterator[None]:
    """Plugins registered by a test (on the command line too) leave with it."""
    with registry_restored():
        yield


def decode_case(layer: str, n: int, mode: str = "decode") -> Case:
    return small_case(layer, n=n, d=D, batch=1, mode=mode)


def measured(case: Case) -> CaseResult:
    return measure_case(case, policy=QUICK)


# ----------------------------------------------------------------------------- built-in layers


def _expected_state(layer: str, n: int) -> int:
    """The state's bytes at context n, b = 1, float32, written out: attention's keys and
    values for the n + 1 tokens; rnn's hidden state; conv's k - 1 tokens before; ssm's
    d x N state (N = 16)."""
    return {
        "attention": 2 * (n + 1) * D * 4,
        "rnn": D * 4,
        "conv": (3 - 1) * D * 4,
        "ssm": D * 16 * 4,
    }[layer]


@pytest.mark.parametrize("n", [8, 32])
@pytest.mark.parametrize("layer", ["attention", "rnn", "conv", "ssm"])
def test_a_builtin_decode_case_is_measured_in_every_column(layer: str, n: int) -> None:
    case = decode_case(layer, n)
    assert case.tokens == n + 1
    result = measured(case)
    assert result.status == "ok", result.error
    assert result.error in ("", None)
    assert result.state_bytes == _expected_state(layer, n)
    assert result.state_analytic == result.state_bytes
    assert result.state_check == "ok"
    assert result.flops_check == "ok"
    assert result.elementwise_check == "ok"
    assert isinstance(result.decode_check, float)
    assert 0.0 <= result.decode_check < 1e-4
    assert result.path_len is None
    assert result.path_len_method == DECODE_PATH
    assert "decode" in result.path_len_method
    assert result.seq_steps is not None and result.seq_steps > 0
    assert result.timing is not None and result.timing.median_s > 0
    assert result.flops is not None and result.flops > 0
    row = result.to_row()
    assert set(DECODE_COLUMNS) <= set(row)
    assert row["mode"] == "decode" and row["status"] == "ok"
    assert row["state_bytes"] == result.state_bytes
    assert row["state_analytic"] == result.state_analytic
    assert row["state_check"] == "ok"
    assert row["decode_check"] == result.decode_check
    assert row["path_len"] is None


def test_the_attention_cache_grows_with_the_context_and_the_rnn_state_does_not() -> None:
    attention = [measured(decode_case("attention", n)).state_bytes for n in (2, 8, 32)]
    assert attention == [2 * (n + 1) * D * 4 for n in (2, 8, 32)]
    rnn = {measured(decode_case("rnn", n)).state_bytes for n in (2, 8, 32)}
    assert rnn == {D * 4}


def test_a_decode_step_costs_less_than_the_forward_call_over_the_same_context() -> None:
    """The step's counts are one token's: attention's step is O(d² + n d), the forward call
    over n + 1 tokens O(n d² + n² d)."""
    step = measured(decode_case("attention", 32))
    whole = measured(small_case("attention", n=33, d=D, batch=1))
    assert step.flops is not None and whole.flops is not None
    assert 0 < step.flops < whole.flops / 10
    assert whole.state_bytes is None and whole.decode_check is None  # forward: no state
    assert whole.to_row()["state_check"] != "ok"


# ----------------------------------------------------------------------------- plugin layers


class Plain(nn.Module):
    """A per-token projection: causal, with no step of its own."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, n, d)
        return self.proj(x)


class CumulativeMean(nn.Module):
    """The mean of the tokens so far, projected: causal, with a step whose state is the running
    sum (batch, d)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, n, d)
        counts = torch.arange(1, x.shape[1] + 1, dtype=x.dtype, device=x.device)  # (n,)
        return self.proj(x.cumsum(dim=1) / counts[:, None])  # (B, n, d)

    def init_state(self, batch: int, capacity: int) -> State:
        w = self.proj.weight
        return {"sum": torch.zeros(batch, w.shape[1], dtype=w.dtype, device=w.device)}

    def step(self, x: torch.Tensor, state: State, position: int) -> tuple[torch.Tensor, State]:
        total = state["sum"] + x  # (B, d): a new tensor, the old state left as it was
        return self.proj(total / (position + 1)), {"sum": total}


class WrongShape(CumulativeMean):
    def step(self, x: torch.Tensor, state: State, position: int) -> tuple[torch.Tensor, State]:
        y, state = super().step(x, state, position)
        return y[:, :-1], state  # (B, d - 1)


class Raises(CumulativeMean):
    def step(self, x: torch.Tensor, state: State, position: int) -> tuple[torch.Tensor, State]:
        raise ValueError("the step broke\nsecond line")


class Grows(CumulativeMean):
    """Right answers, but a cache that torch.cat lengthens by a token every step."""

    def init_state(self, batch: int, capacity: int) -> State:
        w = self.proj.weight
        return {"cache": torch.zeros(batch, 0, w.shape[1], dtype=w.dtype, device=w.device)}

    def step(self, x: torch.Tensor, state: State, position: int) -> tuple[torch.Tensor, State]:
        cache = torch.cat([state["cache"], x[:, None]], dim=1)  # (B, position + 1, d)
        return self.proj(cache.mean(dim=1)), {"cache": cache}


class Lagging(CumulativeMean):
    """Answers each token with the previous token's output (zeros first): a constant state,
    repeatable, shaped right, and the wrong function."""

    def init_state(self, batch: int, capacity: int) -> State:
        state = super().init_state(batch, capacity)
        return {**state, "last": torch.zeros_like(state["sum"])}

    def step(self, x: torch.Tensor, state: State, position: int) -> tuple[torch.Tensor, State]:
        y, new = super().step(x, {"sum": state["sum"]}, position)
        return state["last"], {**new, "last": y}


class Zeros(CumulativeMean):
    def step(self, x: torch.Tensor, state: State, position: int) -> tuple[torch.Tensor, State]:
        y, state = super().step(x, state, position)
        return torch.zeros_like(y), state


AddLayer = Callable[..., object]


def test_a_layer_without_a_step_is_skipped_in_decode_mode_and_measured_forward(
    add_layer: AddLayer,
) -> None:
    add_layer("plain", Plain)
    skipped = measured(Case("plain", 8, D, 1, "float32", "cpu", "decode"))
    assert skipped.status == "skipped"
    assert "no decode step" in skipped.error
    assert "\n" not in skipped.error
    assert skipped.timing is None and skipped.state_bytes is None
    forward = measured(Case("plain", 8, D, 1, "float32", "cpu", "forward"))
    assert forward.status == "ok", forward.error
    assert forward.flops == 2 * 8 * D * D  # the projection, counted


@pytest.mark.parametrize(
    ("factory", "words"),
    [
        (WrongShape, ["its step maps a (1, 16) token to (1, 15)", "(batch, d)"]),
        (Raises, ["ValueError: the step broke"]),
        (Grows, ["grows", "at context 8", "preallocate"]),
    ],
)
def test_a_broken_step_fails_its_case_in_one_line(
    add_layer: AddLayer, factory: type[nn.Module], words: list[str]
) -> None:
    add_layer("broken", factory)
    result = measured(Case("broken", 8, D, 1, "float32", "cpu", "decode"))
    assert result.status == "failed"
    assert "\n" not in result.error
    for word in words:
        assert word in result.error, result.error
    assert "second line" not in result.error


@pytest.mark.parametrize("factory", [Lagging, Zeros])
def test_a_step_that_computes_another_function_fails_with_its_measurements_kept(
    add_layer: AddLayer, factory: type[nn.Module]
) -> None:
    add_layer("wrong", factory)
    result = measured(Case("wrong", 8, D, 1, "float32", "cpu", "decode"))
    assert result.status == "failed"
    assert result.decode_check is not None
    assert result.decode_check > 100 * TOLERANCE["float32"]
    assert "differ from the causal layer's parallel output" in result.error
    assert "\n" not in result.error
    # What was measured stays: the time, the counts, the state.
    assert result.timing is not None and result.timing.median_s > 0
    assert result.flops is not None and result.flops > 0
    assert result.seq_steps is not None
    assert result.state_bytes is not None and result.state_bytes > 0
    row = result.to_row()
    assert row["status"] == "failed"
    assert row["decode_check"] == result.decode_check
    assert row["flops"] == result.flops and row["time_s"] is not None


class Accumulates(CumulativeMean):
    """Adds the token into its running sum in place: right once per position, but a step
    repeated at the same position (every timed call) reads a context that is no longer n."""

    def step(self, x: torch.Tensor, state: State, position: int) -> tuple[torch.Tensor, State]:
        state["sum"].add_(x)
        return self.proj(state["sum"] / (position + 1)), state


@pytest.mark.parametrize("n", [8, 2048])
def test_a_step_that_changes_its_context_in_place_fails_at_any_n(
    add_layer: AddLayer, n: int
) -> None:
    """Tokens decoded once each are right; the timed step, repeated on the same state, is not.
    Its output after the timed calls against before them says so at any context (the check
    against the parallel output at n stops at 1023), and the error names the cause."""
    add_layer("accumulates", Accumulates)
    result = measured(Case("accumulates", n, D, 1, "float32", "cpu", "decode"))
    assert result.status == "failed"
    assert "changes the state it reads" in result.error and "\n" not in result.error
    assert result.state_bytes == D * 4  # it does not grow: only its values drift
    assert result.timing is not None  # measured, and kept


class TensorState(CumulativeMean):
    def init_state(self, batch: int, capacity: int) -> State:
        return super().init_state(batch, capacity)["sum"]  # type: ignore[return-value]


class NoState(CumulativeMean):
    def init_state(self, batch: int, capacity: int) -> State:
        return None  # type: ignore[return-value]


class IntInState(CumulativeMean):
    def init_state(self, batch: int, capacity: int) -> State:
        return {**super().init_state(batch, capacity), "count": 0}  # type: ignore[dict-item]


class ThreeTuple(CumulativeMean):
    def step(self, x, state, position):  # type: ignore[no-untyped-def]
        return (*super().step(x, state, position), "extra")


class OutputOnly(CumulativeMean):
    def step(self, x, state, position):  # type: ignore[no-untyped-def]
        return super().step(x, state, position)[0]


class DropsAKey(CumulativeMean):
    def init_state(self, batch: int, capacity: int) -> State:
        state = super().init_state(batch, capacity)
        return {**state, "ring": torch.zeros_like(state["sum"])}


@pytest.mark.parametrize(
    ("factory", "batch", "says"),
    [
        (TensorState, 1, "init_state must return the state as a dict of tensors, got a Tensor"),
        (NoState, 1, "init_state must return the state as a dict of tensors, got None"),
        (IntInState, 1, "'count' holds a int"),
        (ThreeTuple, 1, "step must return (output, state), got a tuple of 3"),
        (OutputOnly, 1, "step must return (output, state), got a Tensor"),
        (OutputOnly, 2, "step must return (output, state), got a Tensor"),
        (DropsAKey, 1, "step returned a state of ['sum'], where it was given ['ring', 'sum']"),
    ],
)
def test_a_step_that_breaks_the_protocol_says_which_part(
    add_layer: AddLayer, factory: type[nn.Module], batch: int, says: str
) -> None:
    add_layer("rogue", factory)
    result = measured(Case("rogue", 8, D, batch, "float32", "cpu", "decode"))
    assert result.status == "failed"
    assert says in result.error and "\n" not in result.error, result.error


def test_a_batchs_state_holds_every_sequence() -> None:
    case = small_case("attention", n=8, d=D, batch=2, mode="decode")
    result = measured(case)
    assert result.status == "ok", result.error
    assert result.state_bytes == result.state_analytic == 2 * 2 * 9 * D * 4  # k, v: 2·b·(n+1)·d


def test_a_plugin_with_a_proper_step_is_measured(add_layer: AddLayer) -> None:
    add_layer("cummean", CumulativeMean)
    for n in (2, 8, 64):
        result = measured(Case("cummean", n, D, 1, "float32", "cpu", "decode"))
        assert result.status == "ok", result.error
        assert result.decode_check is not None and result.decode_check < 1e-5
        assert result.state_bytes == D * 4  # the running sum, at any context
        assert result.state_analytic is None and result.state_check == "no theory"
        assert result.flops_check == "no theory"
        assert result.flops == 2 * D * D  # one token through the projection
        assert result.timing is not None


def test_a_plugin_whose_state_holds_a_fixed_cache_is_not_growing(add_layer: AddLayer) -> None:
    """A cache preallocated for init_state's capacity and written in place is what a step
    should do: measured, its bytes (n + 1 slots) grow with the context, not with the calls."""

    class Cached(CumulativeMean):
        def init_state(self, batch: int, capacity: int) -> State:
            w = self.proj.weight
            return {"cache": torch.zeros(batch, capacity, w.shape[1], dtype=w.dtype)}

        def step(self, x: torch.Tensor, state: State, position: int) -> tuple[torch.Tensor, State]:
            cache = state["cache"]
            cache[:, position] = x
            return self.proj(cache[:, : position + 1].mean(dim=1)), state

    add_layer("cached", Cached)
    for n in (4, 16):
        result = measured(Case("cached", n, D, 1, "float32", "cpu", "decode"))
        assert result.status == "ok", result.error
        assert result.state_bytes == (n + 1) * D * 4
        assert result.decode_check is not None and result.decode_check < 1e-5


# ----------------------------------------------------------------------------- the command line


@pytest.fixture(scope="module")
def decode_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """attnbench sweep --mode decode over attention and rnn at n = 8, 16, 32."""
    out = tmp_path_factory.mktemp("decode") / "run"
    before = torch.get_num_threads()  # set up before the one_thread fixture: left as it was
    try:
        with registry_restored():
            args = ["--layers", "attention,rnn", "--n", "8,16,32", "--out", str(out)]
            result = runner.invoke(app, ["sweep", *FAST, *args])
    finally:
        torch.set_num_threads(before)
    assert result.exit_code == 0, result.output
    return out


def test_a_decode_sweep_writes_its_columns(decode_run: Path) -> None:
    frame = pd.read_csv(decode_run / "results.csv")
    assert len(frame) == 6
    assert set(frame["mode"]) == {"decode"}
    assert set(frame["status"]) == {"ok"}
    assert frame["state_bytes"].notna().all()
    assert set(frame["state_check"]) == {"ok"}
    assert (frame["decode_check"] < 1e-4).all()
    attention = frame[frame["layer"] == "attention"].sort_values("n")
    assert list(attention["state_bytes"]) == [2 * (n + 1) * D * 4 for n in (8, 16, 32)]
    assert set(frame.loc[frame["layer"] == "rnn", "state_bytes"]) == {D * 4}
    assert frame["path_len"].isna().all()
    assert frame["case_id"].str.endswith("/decode").all()
    meta = json.loads((decode_run / "run.json").read_text())
    assert meta["schema_version"] == FORMAT_VERSION
    assert meta["config"]["mode"] == "decode"
    loaded = load_results(decode_run)
    assert set(loaded.frame["mode"]) == {"decode"}


def test_a_decode_runs_table_gives_the_states_growth(decode_run: Path) -> None:
    result = runner.invoke(app, ["table", str(decode_run), "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["layer"]: row for row in json.loads(result.stdout)}
    assert set(rows) == {"attention", "rnn"}
    attention, rnn = rows["attention"], rows["rnn"]
    assert attention["state memory (theory)"] == "O(n d)"
    assert rnn["state memory (theory)"] == "O(d)"
    # The bytes are exact, so the exponents are too: (n + 1)·d over n = 8..32, and constant.
    exact = math.log(33 / 9) / math.log(32 / 8)  # the slope of n + 1 over n = 8..32: 0.94
    assert attention["state_bytes_exponent_n"] == pytest.approx(exact, abs=0.02)
    assert 0.9 < attention["state_bytes_exponent_n"] <= 1.0
    assert rnn["state_bytes_exponent_n"] == pytest.approx(0.0, abs=1e-9)
    assert attention["state_agrees"] is True and rnn["state_agrees"] is True
    assert attention["state_mismatch_cases"] == 0 == rnn["state_mismatch_cases"]


def test_a_decode_runs_text_table_is_the_generation_table(decode_run: Path) -> None:
    result = runner.invoke(app, ["table", str(decode_run)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "generation table" in text
    assert "compute per token" in text
    assert "state memory" in text
    assert "attention decodes as" in text


def test_a_misspelt_mode_is_refused_in_one_line(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = runner.invoke(
        app, ["sweep", "--mode", "decod", "--layers", "rnn", "--n", "8", "--out", str(out)]
    )
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "decod" in lines[0] and "decode" in lines[0]
    assert "Traceback" not in result.output
    assert not out.exists()


PLAIN = '''
import torch
from torch import nn


class Plain(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.proj = nn.Linear(d, d)

    def forward(self, x):  # (B, n, d)
        return self.proj(x)


def make(d):
    """A per-token projection, without a decode step."""
    return Plain(d)
'''


def test_a_decode_sweep_skips_a_plugin_without_a_step_and_keeps_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "plain.py"
    path.write_text(textwrap.dedent(PLAIN))
    out = tmp_path / "run"
    result = runner.invoke(
        app, ["sweep", *FAST, "--layers", f"rnn,{path}:make", "--n", "2,8", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    frame = pd.read_csv(out / "results.csv")
    mine = frame[frame["layer"] == "plain:make"]
    assert len(mine) == 2
    assert set(mine["status"]) == {"skipped"}
    assert mine["error"].str.contains("no decode step").all()
    assert mine["state_bytes"].isna().all()
    rnn = frame[frame["layer"] == "rnn"]
    assert len(rnn) == 2
    assert set(rnn["status"]) == {"ok"}
    assert set(rnn["state_bytes"]) == {D * 4}


def test_an_auto_decode_sweep_stops_a_layer_without_a_step_at_its_first_case(
    tmp_path: Path,
) -> None:
    """--n auto: a plugin with no step is skipped once, not at every length of the ladder."""
    path = tmp_path / "plain_plugin.py"
    path.write_text("from torch import nn\n\n\ndef make(d):\n    return nn.Linear(d, d)\n")
    out = tmp_path / "run"
    with registry_restored():
        done = runner.invoke(
            app,
            ["sweep", *FAST, "--layers", f"rnn,{path}:make", "--n", "auto", "--auto-budget", "5",
             "--out", str(out)],
        )  # fmt: skip
    assert done.exit_code == 0, done.output
    rows = pd.read_csv(out / "results.csv")
    plain = rows[rows["layer"] == "plain_plugin:make"]
    assert list(plain["status"]) == ["skipped"]
    lines = {
        line["layer"]: line for line in json.loads((out / "run.json").read_text())["auto"]["lines"]
    }
    assert lines["plain_plugin:make"]["why"] == "n=64 skipped"


def test_the_machine_model_is_not_applied_to_decode_steps() -> None:
    """Its ceilings price whole calls' products; a step's one-row products read 24-159x off, so
    a decode run's analysis leaves it out rather than print it."""
    from attnbench.fits import analyse

    run = load_results(Path(__file__).resolve().parents[1] / "results" / "cpu-decode")
    assert run.ceilings is not None  # the run recorded them
    assert analyse(run).machine.empty


def test_the_summary_names_a_decode_run_and_a_case_that_failed_its_check(tmp_path: Path) -> None:
    """Each layer's table says its calls were generated tokens; a case whose tokens are not its
    layer's is counted apart from the unmeasured ones: it keeps its measurements."""
    path = tmp_path / "zeros_plugin.py"
    path.write_text(
        textwrap.dedent(
            """
            import torch
            from torch import nn


            class Zeros(nn.Module):
                def __init__(self, d):
                    super().__init__()
                    self.proj = nn.Linear(d, d)

                def forward(self, x):
                    return self.proj(x)

                def init_state(self, batch, capacity):
                    return {}

                def step(self, x, state, position):
                    return torch.zeros_like(self.proj(x)), state


            def make(d):
                return Zeros(d)
            """
        )
    )
    out = tmp_path / "run"
    with registry_restored():
        done = runner.invoke(
            app, ["sweep", *FAST, "--layers", f"rnn,{path}:make", "--n", "2,8", "--out", str(out)]
        )
    assert done.exit_code == 0, done.output
    assert "rnn (decode: one generated token at context n)" in done.stdout
    assert "2 case(s) failed a correctness check" in done.stderr
    # on one line, however narrow the terminal: a note piped to a file broke mid-sentence
    assert (
        "2 case(s) failed a correctness check (their error says which: decoded tokens, or a "
        "compiled output, not the layer's) and keep their measurements in results.csv (the tables"
    ) in done.stderr
    assert "have no measurements" not in done.stderr
    # the check's figure is in the summary, not only in results.csv: rnn passed, zeros did not
    text = " ".join(done.stderr.split())
    assert (
        "decoded tokens against the causal layer's parallel output, the largest difference "
        "(relative) in each layer's cases that passed: rnn "
    ) in text
    assert "2 case(s) failed it (zeros_plugin:make): their errors say by how much" in text
    tabled = runner.invoke(app, ["table", str(out)])  # its notes: what the fits left out
    assert "2 case(s) that failed a correctness check left out" in tabled.stderr
    assert "unmeasured" not in tabled.stderr


def test_a_check_note_gives_each_layers_largest_difference_and_the_layers_that_failed() -> None:
    """Each layer's largest passing difference, beside what its dtype allows; a difference past
    it, or a NaN (a NaN output), is a failure, whatever the other layers read."""
    frame = pd.DataFrame(
        {
            "layer": ["rnn", "rnn", "attention", "ssm"],
            "n": [8, 16, 16, 32],
            "d": [64, 64, 64, 64],
            "dtype": ["float32", "float32", "float32", "float32"],
            "device": ["cpu", "cpu", "cpu", "cpu"],
            "status": ["ok", "ok", "ok", "ok"],
            "time_s": [1e-3, 1e-3, 1e-3, 1e-3],
            "decode_check": [2e-7, 4e-7, 6e-5, 3e-6],
        }
    )
    (note,) = correctness_notes(frame)
    assert note == (
        "decoded tokens against the causal layer's parallel output, the largest difference "
        "(relative) in each layer's cases that passed: rnn 4e-07, attention 6e-05, ssm 3e-06 "
        "(float32 on cpu allows 0.0001)"
    )
    frame.loc[2, ["status", "decode_check"]] = ["failed", 1e-3]  # past float32's 1e-4
    frame.loc[3, ["status", "decode_check"]] = ["failed", math.nan]  # a NaN output
    (note,) = correctness_notes(frame)
    assert note.endswith(
        "passed: rnn 4e-07 (float32 on cpu allows 0.0001); 2 case(s) failed it "
        "(attention, ssm): their errors say by how much"
    )
    assert correctness_notes(frame.drop(columns="decode_check")) == []


def test_a_compiled_check_is_held_to_the_dtype_and_an_eager_fallback_is_not_counted() -> None:
    """The compile check grants TF32 nothing (``measure.compiled``): on CUDA, float32 allows
    1e-4, not TF32's 5e-3. A case that compiled no graph ran eager, checked against itself:
    it is left out of the check and named in a note of its own."""
    frame = pd.DataFrame(
        {
            "layer": ["attention", "rnn"],
            "n": [64, 64],
            "d": [32, 32],
            "dtype": ["float32", "float32"],
            "device": ["cuda:0", "cpu"],
            "status": ["failed", "ok"],
            "time_s": [1e-3, 1e-3],
            "compile_check": [1e-3, 0.0],
            "compile_graphs": [1, 0],
            "compile_breaks": [0, 1],
            "compile_break_reasons": ["", "Attempted to wrap RNN, GRU, or LSTM (x1)"],
        }
    )
    (note,) = correctness_notes(frame)
    assert note == (
        "compiled outputs against the eager layer's, the largest difference (relative) in each "
        "layer's cases that passed: none (float32 allows 0.0001); 1 case(s) failed it "
        "(attention): their errors say by how much"
    )
    (broke,) = compile_notes(frame)
    assert broke == (
        "1 compiled case(s) broke their graph (rnn: Attempted to wrap RNN, GRU, or LSTM (x1)); "
        "see compile_breaks and compile_break_reasons; rnn compiled no graph at all and ran "
        "eager: those times are the eager layer's"
    )
    assert compile_notes(frame.drop(index=1)) == []
    # a compiled call that took one of torch's fused kernels times that kernel: said so
    path = "_transformer_encoder_layer_fwd (nn.TransformerEncoderLayer fast path)"
    fused = frame.drop(index=1).assign(compiled=["default"], fused_path=[path], layer=["tel"])
    (ran,) = compile_notes(fused)
    assert ran.startswith(f"1 compiled case(s) ran a fused kernel of torch's (tel: {path}): ")
    assert compile_notes(fused.assign(compiled=[None])) == []  # eager: the next note's
    assert compile_notes(fused.assign(fused_path=[None])) == []
    # an eager call that took a module's fast path times its one fused op: said so
    eager = fused.assign(compiled=[None], status=["ok"])
    (fast,) = fast_path_notes(eager)
    assert fast.startswith(
        "1 case(s) took a module's fast path (tel: _transformer_encoder_layer_fwd): in eval "
        "mode without grad torch runs that one fused op"
    )
    assert fast_path_notes(fused.assign(status=["ok"])) == []  # compiled: compile_notes says so
    lstm = "lstm (torch's recurrent op: one call from Python, its steps run in C++)"
    assert fast_path_notes(eager.assign(fused_path=[lstm])) == []  # a recurrent op: not a module's


def test_a_compiled_run_says_which_columns_are_the_eager_layers() -> None:
    """A compiled attention's peak (the compiled call's) read 85.5 KiB beside a kernels column
    that lists the eager layer's ops: the summary says which columns describe which call."""
    import pandas as pd

    frame = pd.DataFrame(
        {"layer": ["attention"], "status": ["ok"], "compiled": ["default"],
         "compile_graphs": [1], "compile_breaks": [0]}
    )  # fmt: skip
    (note,) = compile_notes(frame)
    assert note.startswith("a compiled case's time, kernels' share and peak memory are the ")
    assert "counted on the eager layer" in note
    assert compile_notes(frame.assign(compiled=[None])) == []  # an eager run: nothing to say
    assert compile_notes(frame.assign(status=["failed"])) == []  # nothing measured compiled


RUNNING_SUM = '''
import torch
from torch import nn

from attnbench.layers import LINEAR, LayerEntry
from attnbench.theory import DecodeTheory, LayerTheory, Term, values


class RunningSum(nn.Module):
    """Each output the projected sum of the tokens up to it: a d-value state."""

    def __init__(self, d):
        super().__init__()
        self.proj = nn.Linear(d, d, bias=False)

    def forward(self, x):  # (B, n, d)
        return self.proj(x.cumsum(1))

    def causal_forward(self, x):
        return self.forward(x)

    def init_state(self, batch, capacity):
        return {"sum": torch.zeros(batch, self.proj.weight.shape[0])}

    def step(self, x, state, position):  # x: (B, d)
        total = state["sum"] + x
        return self.proj(total), {"sum": total}


ENTRY = LayerEntry(
    name="running-sum", build=RunningSum, family=LINEAR, description="a projected running sum",
    theory=LayerTheory(
        "O(n d^2)", (Term(2, "b·n·d²", lambda s: s["b"] * s["n"] * s["d"] ** 2),),
        order=lambda s: s["n"] * s["d"] ** 2,
        decode=DecodeTheory(
            "O(d^2)", "O(d)", (Term(2, "b·d²", lambda s: s["b"] * s["d"] ** 2),),
            (values(1, "b·d", lambda s: s["b"] * s["d"]),), form="its running sum",
            order=lambda s: s["d"] ** 2,
        ),
    ),
)
'''


def test_a_plugins_generation_theory_is_read_back_from_its_run(tmp_path: Path) -> None:
    """A decode sweep checked a plugin's step against its DecodeTheory, but theory.json kept
    only its forward theory: table and fit read '?' for its orders, with no word of why. The
    step's theory is recorded, and a reader of the folder, with no code, finds it."""
    path = tmp_path / "running_sum.py"
    path.write_text(RUNNING_SUM)
    out = tmp_path / "run"
    with registry_restored():
        done = runner.invoke(
            app, ["sweep", *FAST, "--layers", f"{path}:ENTRY", "--n", "4,8,16", "--out", str(out)]
        )
    assert done.exit_code == 0, done.output
    rows = pd.read_csv(out / "results.csv")
    assert set(rows["state_check"]) == {"ok"} and set(rows["flops_check"]) == {"ok"}
    recorded = json.loads((out / "theory.json").read_text())["layers"]["running-sum"]
    assert recorded["theory"]["decode"]["memory"] == "O(d)"
    with registry_restored():  # read as another process would: no plugin loaded
        table = runner.invoke(app, ["table", str(out), "--json"])
    assert table.exit_code == 0, table.output
    rows = {row["layer"]: row for row in json.loads(table.stdout)}
    mine = rows["running-sum"]
    assert mine["compute (theory)"] == "O(d^2)"
    assert mine["state memory (theory)"] == "O(d)" and mine["state_agrees"] is True
    from attnbench.results.theories import record_problem

    whole = json.loads((out / "theory.json").read_text())
    assert record_problem(whole) is None
    whole["layers"]["running-sum"]["theory"]["decode"]["points"][0]["values"].pop()
    assert "its decode theory: a point does not hold 4 values" in str(record_problem(whole))
    del whole["layers"]["running-sum"]["theory"]["decode"]["elementwise"]  # a note, not a crash
    assert "its decode theory lacks an elementwise entry" in str(record_problem(whole))
