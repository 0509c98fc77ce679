"""--compile: each case's layer under torch.compile, its compile timed apart and read from
dynamo's counters, its output checked against the eager layer's; a layer that breaks its graph
says why, one that cannot compile fails in one line, and the counts stay the eager layer's.

Compiles cost seconds on this machine, so the cases are few and tiny (d = 8, n = 16, one timed
sample, one thread)."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from synthetic import registry_restored, small_case
from torch import nn
from typer.testing import CliRunner

from attnbench import register_layer
from attnbench.cli import app
from attnbench.compiling import CompileSpec, compile_text
from attnbench.errors import AttnbenchError
from attnbench.formats import FORMAT_VERSION, V3_LATER_RESULTS, RawRun, migrate_run
from attnbench.measure import step as step_module
from attnbench.measure.case import measure_case
from attnbench.measure.record import CaseResult
from attnbench.measure.timing.loop import TimingPolicy
from attnbench.measure.timing.split import OpEvent, ProfilerCost, host_kernel_seconds
from attnbench.spec import Case

QUICK = TimingPolicy(warmup_calls=0, min_block_s=0.0, min_samples=1, max_samples=1, budget_s=0.0)
runner = CliRunner()


pytestmark = pytest.mark.usefixtures("one_thread")


def compiled_case(layer: str, text: str = "default", **options: object) -> Case:
    return small_case(layer, n=16, d=8, batch=1, compile=text, **options)


def measured(case: Case) -> CaseResult:
    return measure_case(case, policy=QUICK)


# ----------------------------------------------------------------------------- the option


@pytest.mark.parametrize(
    ("given", "text"),
    [
        ("default", "default"),
        ("none", ""),
        ("", ""),
        ("max-autotune , fullgraph", "max-autotune,fullgraph"),
        ("reduce-overhead,dynamic", "reduce-overhead,dynamic"),
        ("default,static,fullgraph", "default,static,fullgraph"),
    ],
)
def test_a_compile_value_reads_as_its_canonical_words(given: str, text: str) -> None:
    assert compile_text(given) == text
    spec = CompileSpec.parse(text)
    assert (spec.text if spec else "") == text


@pytest.mark.parametrize(
    "given",
    [
        "fast",
        "fullgraph",
        "default,dynamic,static",
        "default,wobbly",
        "default,fullgraph,fullgraph",
    ],
)
def test_a_bad_compile_value_is_refused_in_one_line(given: str) -> None:
    with pytest.raises(AttnbenchError, match="--compile"):
        compile_text(given)


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--compile", "fast"], "the mode must come first"),
        (["--compile", "default", "--metric", "instructions"], "--metric instructions"),
        (["--compile", "default", "--mode", "decode"], "decode step is not compiled"),
    ],
)
def test_bad_compile_options_exit_2_in_one_line(extra: list[str], says: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "run"
    done = runner.invoke(
        app, ["sweep", "--layers", "conv", "--n", "16", "--d", "8", "--out", str(out), *extra]
    )
    assert done.exit_code == 2
    assert says in done.output and "Traceback" not in done.output
    assert not out.exists()


def test_a_compiled_case_is_another_case() -> None:
    eager, compiled = small_case("conv", n=16, d=8, batch=1), compiled_case("conv")
    assert compiled.case_id == f"{eager.case_id}/compiled=default"
    assert compiled.columns()["compiled"] == "default" and eager.columns()["compiled"] == ""


# ----------------------------------------------------------------------------- measuring


@pytest.mark.slow  # a real compile: 3-4 s
def test_a_compiled_layer_is_timed_counted_as_the_layer_and_checked() -> None:
    eager = measured(small_case("attention", n=16, d=8, batch=1))
    found = measured(compiled_case("attention"))
    assert found.status == "ok", found.error
    assert found.compile_s is not None and found.compile_s > 0
    # one graph: the positional table was grown to n by an eager call before the compile
    assert found.compile_graphs == 1 and found.compile_breaks == 0
    assert found.compile_recompiles == 0  # the timed calls compiled nothing more
    assert found.compile_check is not None and found.compile_check < 1e-4
    # the work is the layer's: counted on the eager layer, equal to its formula
    assert (found.flops, found.elementwise, found.seq_steps) == (
        eager.flops, eager.elementwise, eager.seq_steps,
    )  # fmt: skip
    assert found.flops_check == "ok"
    row = found.to_row()
    assert row["compiled"] == "default" and row["compile_check"] == found.compile_check
    assert eager.compile_s is None and eager.to_row()["compile_check"] is None


class Branchy(nn.Module):
    """A layer whose forward branches on its data: dynamo breaks the graph there."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, n, d)
        y = self.proj(x)
        if y.sum() > 0:  # data-dependent Python control flow
            return torch.relu(y)
        return y


@pytest.mark.slow  # a real compile: 3-4 s
def test_a_graph_break_is_counted_with_its_reason() -> None:
    with registry_restored():
        register_layer(Branchy, "branchy")
        found = measured(compiled_case("branchy"))
    assert found.status == "ok", found.error
    assert found.compile_breaks is not None and found.compile_breaks >= 1
    assert "data-dependent" in found.compile_break_reasons.lower()
    assert found.compile_check is not None and found.compile_check < 1e-4


def test_a_layer_that_cannot_compile_fails_in_one_line_and_the_sweep_goes_on(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """fullgraph makes the graph break an error: the case fails with dynamo's first line."""
    with registry_restored():
        register_layer(Branchy, "branchy")
        found = measured(compiled_case("branchy", "default,fullgraph"))
    assert found.status == "failed"
    assert found.error.startswith("CompileFailed: ") and "\n" not in found.error


def test_a_miscompiled_layer_fails_with_its_measurements_kept(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A compile that computes something else cannot read as fast: compile_check says by how
    much, the case is failed, its time and counts kept."""

    class Off(nn.Module):
        def __init__(self, layer: nn.Module) -> None:
            super().__init__()
            self.layer = layer

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.layer(x) * 1.01

    monkeypatch.setattr(step_module, "compiled", lambda layer, spec: Off(layer))
    found = measured(compiled_case("conv"))
    assert found.status == "failed" and "compiled output differs" in found.error
    assert found.compile_check == pytest.approx(0.01, rel=1e-3)
    assert found.timing is not None and found.flops is not None


# ----------------------------------------------------------------------------- the split


def test_the_split_counts_inductors_generated_kernels_as_kernels() -> None:
    cost = ProfilerCost(per_op_s=0.0, op_floor_s=0.0)
    events = [
        OpEvent("graph_0_cpp_fused_add_mul_0", 3e-6, 0),  # a kernel inductor generated
        OpEvent("aten::mm", 5e-6, 0),  # a product it calls out to
        OpEvent("## Call CompiledFxGraph abc ##", 7e-6, 2),  # its Python wrapper: overhead
        OpEvent("Torch-Compiled Region: 0/0", 4e-6, 1),  # dynamo's guards: overhead
    ]
    assert host_kernel_seconds(events, cost) == pytest.approx(8e-6)


# ----------------------------------------------------------------------------- the format


def test_a_version_3_folder_reads_its_cases_as_eager() -> None:
    raw = RawRun(
        meta={"schema_version": 3, "unrecorded": []},
        results=pd.DataFrame({"case_id": ["conv/n=64"]}),
        samples=pd.DataFrame(),
        calibration=None,
        theories={},
    )
    done = migrate_run(raw, "v3")
    assert done.meta["schema_version"] == FORMAT_VERSION
    assert (done.samples["others_cores"] == "").all()  # and version 5's: not read then
    assert all((done.results[c] == "").all() for c in V3_LATER_RESULTS)
    # "compiled" empty is known (eager), the compile's own columns were not recorded
    assert "compiled" not in done.meta["unrecorded"]
    assert set(V3_LATER_RESULTS) - {"compiled"} <= set(done.meta["unrecorded"])


@pytest.mark.slow
def test_ab_races_an_eager_side_against_a_compiled_side(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """--base-compile none --compile default: the same layer, eager against compiled, paired;
    the verdict's direction is the measured one (exit 0 or 1, never an error)."""
    out = tmp_path / "ab"
    done = runner.invoke(
        app,
        [
            "ab", "--layers", "conv", "--base-compile", "none", "--compile", "default",
            "--n", "16", "--d", "8", "--processes", "3", "--time-budget", "0.02",
            "--threads", "1", "--out", str(out), "--json", "--fail-on", "deterministic",
        ],
    )  # fmt: skip
    assert done.exit_code in (0, 1), done.output
    base = pd.read_csv(out / "base" / "results.csv")
    current = pd.read_csv(out / "current" / "results.csv")
    assert base["compiled"].isna().all() or (base["compiled"].fillna("") == "").all()
    assert (current["compiled"] == "default").all()
    assert current["compile_s"].notna().all() and base["compile_s"].isna().all()


def test_a_compiled_case_reads_the_eager_layers_fused_paths_which_route_its_counts() -> None:
    """The counts are the eager layer's, and the fused paths its call takes decide where they
    are traced (cuDNN's recurrence on a GPU: on the CPU). A compiled call's memory pass read
    none, so a compiled lstm on an H200 was traced through the device (2n + 1 steps against
    its eager 8n + 1): the pass now reads the eager call's."""
    from attnbench.measure.case import memory_pass

    eager = memory_pass(small_case("rnn", n=16, d=8, batch=1), 0)
    compiled = memory_pass(compiled_case("rnn"), 0)
    assert "rnn_tanh" in eager.fused
    assert compiled.fused == eager.fused


def test_the_kernels_timer_refuses_a_compile_that_already_replays_cuda_graphs() -> None:
    """--timer kernels captures the call in a CUDA graph; reduce-overhead and max-autotune
    replay cudagraph trees of their own, which cannot be captured inside it: refused before
    anything runs (on a GPU, faked here by the device resolver), default mode taken."""
    from attnbench.options import build_grid

    def on_a_gpu(device: str, dtype: str) -> str:
        return "cuda:0"

    options = {"layers": "attention", "n": "16", "d": "8", "timer": "kernels"}
    for mode in ("reduce-overhead", "max-autotune"):
        with pytest.raises(AttnbenchError, match="already replays CUDA graphs"):
            build_grid({**options, "compile": mode}, on_a_gpu)
    assert build_grid({**options, "compile": "default"}, on_a_gpu).compile == "default"
    assert CompileSpec("reduce-overhead").replays_graphs("cuda:1")
    assert not CompileSpec("reduce-overhead").replays_graphs("cpu")
    assert not CompileSpec("max-autotune-no-cudagraphs").replays_graphs("cuda:0")


def test_a_layer_that_replays_cuda_graphs_is_called_as_a_loop_that_keeps_outputs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under cudagraph trees each replay writes over the last output: a step begins before
    each call and the output is copied out (faked on the CPU: the marks are counted)."""

    class Graph(nn.Module):
        """A replay's static output: every call writes the same memory."""

        def __init__(self) -> None:
            super().__init__()
            self.out = torch.zeros(1, 3, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.out.copy_(x)

    marks: list[int] = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    replayed = step_module._Replayed(Graph())
    x, y = torch.randn(1, 3, 4), torch.randn(1, 3, 4)
    first, second = replayed(x), replayed(y)
    assert marks == [1, 1]
    assert torch.equal(first, x) and torch.equal(second, y)  # the first kept past the second


def test_make_step_calls_a_graph_replaying_compile_through_the_loop_wrapper(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The step of a case whose compile replays CUDA graphs (faked on the CPU) calls it
    through ``_Replayed``, its layer's positional table grown by an eager call first; any
    other compile calls the compiled layer itself."""
    from attnbench.compiling import CompileSpec as Spec

    monkeypatch.setattr(Spec, "replays_graphs", lambda self, device: self.mode != "default")
    step = step_module.make_step(compiled_case("attention", "reduce-overhead"), 0)
    assert isinstance(step.model, step_module._Replayed)
    assert step.layer.pos.P.shape[0] == 16  # grown before the compile, not inside it
    assert step().shape == (1, 16, 8)
    plain = step_module.make_step(compiled_case("attention"), 0)
    assert not isinstance(plain.model, step_module._Replayed)
