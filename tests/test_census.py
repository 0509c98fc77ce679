"""One traced pass, four counts: each equal to its own pass's, and a counter that fails alone."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnbench import layer_names
from attnbench.measure.case import measure_case, traced_counts
from attnbench.measure.counts import census as census_module
from attnbench.measure.counts.census import take_census
from attnbench.measure.counts.chains import sequential_steps
from attnbench.measure.counts.elementwise import count_elementwise
from attnbench.measure.counts.flops import trace_flops
from attnbench.measure.counts.traffic import count_traffic
from attnbench.measure.step import make_step
from attnbench.measure.timing.loop import TimingPolicy
from attnbench.options import build_grid


def _case(layer: str, mode: str = "forward"):  # type: ignore[no-untyped-def]
    given = {"layers": layer, "n": [24], "d": [16], "heads": 4, "window": 5, "batch": 2}
    return build_grid({**given, "device": "cpu", "mode": mode}).cases()[0]


@pytest.mark.parametrize("layer", layer_names())
def test_one_pass_counts_what_four_passes_count(layer: str) -> None:
    step = make_step(_case(layer), seed=0)
    step()
    found = take_census(step.forward)
    assert found.errors == {}
    assert found.flops == trace_flops(step)
    assert found.elementwise == count_elementwise(step.forward)
    assert found.traffic == count_traffic(step)
    assert found.steps == sequential_steps(step.forward)


def test_train_mode_traces_forward_and_backward_apart() -> None:
    """FLOPs and bytes of a training call include the backward pass; steps and elementwise
    work describe the forward pass: they cannot share one trace."""
    step = make_step(_case("attention", mode="train"), seed=0)
    step()
    flops, steps, elements, traffic = traced_counts(step, "train")
    assert flops == trace_flops(step) and traffic[0] == count_traffic(step)
    assert steps == (sequential_steps(step.forward), "traced")
    assert elements == (count_elementwise(step.forward), "traced")
    forward = take_census(step.forward)
    assert flops.total > 2 * forward.flops.total  # the backward pass is in it


def test_a_counter_that_fails_leaves_the_others_and_the_case(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(self, func, args, kwargs, out):  # type: ignore[no-untyped-def]
        raise ValueError("cannot read this op\nsecond line")

    monkeypatch.setattr(census_module.ElementCounter, "observe", broken)
    layer = nn.Linear(8, 8)
    x = torch.randn(2, 8)
    found = take_census(lambda: layer(x))
    assert found.elementwise is None
    assert found.errors == {"elementwise": "none: ValueError: cannot read this op"}
    assert found.flops.total == 2 * 2 * 8 * 8 and found.traffic is not None
    result = measure_case(_case("conv"), policy=TimingPolicy(budget_s=0.01, min_samples=3))
    assert result.status == "ok" and result.elementwise is None
    assert result.elementwise_method.startswith("none: ValueError")
    assert result.flops == _case("conv").analytic_flops() and result.bytes is not None


@pytest.mark.slow
def test_counting_a_case_never_imports_torch_dynamo() -> None:
    """Every tracer and the memory profiler run without torch._dynamo and torch._inductor:
    importing them was 1.3 s of a cold sweep. A fresh process measures an ssm case (dispatch
    modes, the profiler, the train-mode FLOP counter) and must not have loaded either."""
    import subprocess
    import sys

    code = (
        "import sys; from attnbench.spec import Case; "
        "from attnbench.measure.case import measure_case; "
        "from attnbench.measure.timing.loop import TimingPolicy; "
        "policy = TimingPolicy(warmup_calls=0, min_block_s=0, min_samples=1, budget_s=0); "
        "r = measure_case(Case('ssm', 16, 8, 1, 'float32', 'cpu', 'train'), policy=policy); "
        "print(r.status, r.flops > 0, r.peak_bytes > 0, "
        "'torch._dynamo' in sys.modules, 'torch._inductor' in sys.modules)"
    )
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert found.stdout.split() == ["ok", "True", "True", "False", "False"], found.stderr


def test_the_counters_find_every_tensor_pytree_finds() -> None:
    """``ops.tensors`` (the counters' quick walk) against torch's pytree on aten-like arguments:
    lists of tensors (cat), kwargs, structseq outputs (max), and no tensor at all."""
    from torch.utils._pytree import tree_flatten

    from attnbench.measure.counts.ops import tensors

    a, b = torch.ones(2, 3), torch.zeros(4)
    trees = [
        ((a, [b, a], 3, None), {"out": b, "dim": 1}),
        torch.max(a, dim=1),  # a torch.return_types structseq
        ([[a], (b,)], {"nested": {"t": a}}),
        (1, "x", torch.float32),
    ]
    for tree in trees:
        expected = [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]
        assert [id(t) for t in tensors(tree)] == [id(t) for t in expected]
