from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from synthetic import samples_for

from attnbench.devices import device_sync
from attnbench.errors import AttnbenchError
from attnbench.measure.case import measure_case
from attnbench.options import build_grid
from attnbench.results.run import RunResults
from attnbench.run.events import Listeners, ProgressEvent
from attnbench.run.sweep import run_sweep
from attnbench.spec import Case, Grid


@pytest.mark.slow
def test_every_case_is_written_before_the_next_starts(tiny_grid: Grid, tmp_path: Path) -> None:
    out = tmp_path / "run"
    seen: list[tuple[str, int, int, int]] = []

    def progress(event: ProgressEvent) -> None:
        rows = len(pd.read_csv(out / "results.csv"))
        seen.append((event.kind, event.index, event.round, rows))

    run = run_sweep(tiny_grid, out, listeners=Listeners(progress=progress))
    total = len(tiny_grid.cases())
    assert len(run.frame) == total
    for kind, index, round_, rows in seen:
        if round_ == 1:  # a case's row is written after its first round
            assert rows == (index + 1 if kind == "done" else index)
        else:  # later rounds add samples, not rows
            assert rows == total
    assert (run.frame["status"] == "ok").all()
    assert set(run.frame["case_id"]) == {c.case_id for c in tiny_grid.cases()}


def test_results_hold_measured_values(tiny_run: RunResults) -> None:
    frame = tiny_run.frame
    assert (frame["time_s"] > 0).all()
    assert (frame["samples"] >= 3 * frame["rounds"]).all()  # three a round at the least
    assert (frame["peak_bytes"] > 0).all()
    assert (frame["flops_check"] == "ok").all()
    assert np.allclose(frame["flops_per_s"], frame["flops"] / frame["time_s"], rtol=1e-12)
    for row in frame.itertuples():
        assert len(samples_for(tiny_run, row.case_id)) == row.samples
    config = tiny_run.meta["config"]
    assert config["ns"] == [16, 32] and config["device"] == "cpu"
    assert tiny_run.meta["environment"]["torch_version"] == torch.__version__


def test_a_failing_case_is_recorded_and_the_sweep_goes_on(add_layer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    class Broken(torch.nn.Module):
        def __init__(self, d: int) -> None:
            super().__init__()
            self.d = d

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.shape[1] > 16:
                raise ValueError("shapes do not fit\nsecond line")
            return x

    add_layer("broken", Broken)
    grid = build_grid({"layers": "conv", "n": "16,32", "d": "8", "device": "cpu"})
    grid = Grid(**{**grid.__dict__, "layers": ("broken", "conv"), "time_budget_s": 0.005})
    run = run_sweep(grid, tmp_path / "run")
    status = dict(zip(run.frame["case_id"], run.frame["status"], strict=True))
    assert status["broken/n=16/d=8/b=1/float32/cpu/forward"] == "ok"
    assert status["broken/n=32/d=8/b=1/float32/cpu/forward"] == "failed"
    assert run.frame.loc[run.frame["status"] == "failed", "error"].iloc[0] == (
        "ValueError: shapes do not fit"
    )
    assert (run.frame[run.frame["layer"] == "conv"]["status"] == "ok").all()


def test_a_layer_that_answers_in_another_shape_at_its_n_fails_that_case(  # type: ignore[no-untyped-def]
    add_layer, tmp_path: Path
) -> None:
    """A plugin that cut its output to 20 tokens passed the plugin check's small probe and was
    measured ok at every longer n: each case's first call now checks its own answer."""

    class Cut(torch.nn.Module):
        def __init__(self, d: int) -> None:
            super().__init__()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x[:, :20]  # (B, min(n, 20), d)

    add_layer("cut", Cut)
    grid = build_grid({"layers": "conv", "n": "16,32", "d": "8", "device": "cpu"})
    for mode in ("forward", "train"):
        grid = Grid(**{**grid.__dict__, "layers": ("cut",), "time_budget_s": 0.005, "mode": mode})
        run = run_sweep(grid, tmp_path / mode)
        status = dict(zip(run.frame["n"], run.frame["status"], strict=True))
        assert status == {16: "ok", 32: "failed"}, mode
        (error,) = run.frame.loc[run.frame["status"] == "failed", "error"]
        if mode == "forward":
            assert error == (
                "LayerShapeError: the layer answered an input of shape (1, 32, 8) with shape "
                "(1, 20, 8): a sequence layer maps (batch, n, d) to (batch, n, d)"
            )


def test_train_mode_measures_forward_and_backward(tmp_path: Path) -> None:
    case = Case("conv", 32, 8, 1, "float32", "cpu", "train", (("k", 3),))
    result = measure_case(case)
    forward = measure_case(Case("conv", 32, 8, 1, "float32", "cpu", "forward", (("k", 3),)))
    assert result.status == "ok"
    assert result.flops == 3 * forward.flops  # type: ignore[operator]


@pytest.mark.slow
def test_threads_option_is_applied_and_recorded(tmp_path: Path) -> None:
    before = torch.get_num_threads()
    try:
        grid = build_grid(
            {
                "layers": "conv",
                "n": "8",
                "d": "8",
                "device": "cpu",
                "threads": 1,
                "time_budget": 0.005,
            }
        )
        run = run_sweep(grid, tmp_path / "run")
        assert run.frame["threads"].tolist() == [1]
        assert run.meta["config"]["threads"] == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.slow
def test_more_threads_than_cpus_are_refused_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """libgomp aborts the process past a few thousand threads (a segfault at --threads
    99999), and more threads than CPUs time the scheduler: one line, exit 2, threads unset."""
    from typer.testing import CliRunner

    from attnbench import devices
    from attnbench.cli import app

    monkeypatch.setattr(devices, "usable_cpus", lambda: 2)
    before = torch.get_num_threads()
    with pytest.raises(AttnbenchError, match="--threads 3: this process may use 2 CPUs; "):
        devices.set_threads(3)
    assert torch.get_num_threads() == before
    devices.set_threads(1)
    assert torch.get_num_threads() == 1
    torch.set_num_threads(before)
    runner = CliRunner()
    sizes = ["--layers", "conv", "--n", "8", "--d", "8"]
    for command in (["machine"], ["sweep", *sizes, "--out", str(tmp_path / "run")]):
        result = runner.invoke(app, [*command, "--threads", "3"])
        assert result.exit_code == 2, result.output
        assert result.stderr.strip() == (
            "error: --threads 3: this process may use 2 CPUs; choose at most 2"
        )
    assert torch.get_num_threads() == before
    assert not (tmp_path / "run").exists()  # no empty run folder is left behind
    monkeypatch.undo()  # ab's sides are processes of their own: the real count, one over
    over = str(devices.usable_cpus() + 1)
    ab = ["ab", "--base-layers", "conv", *sizes, "--threads", over, "--out", str(tmp_path / "ab")]
    result = runner.invoke(app, ab)
    assert result.exit_code == 2 and "--threads " + over in result.stderr, result.output
    assert not (tmp_path / "ab").exists()


def test_a_refused_start_removes_only_the_empty_folder_it_made(tmp_path: Path) -> None:
    from attnbench.results.files import new_out_dir

    for folder in (tmp_path / "new", tmp_path / "a" / "b"):
        with pytest.raises(AttnbenchError), new_out_dir(folder):
            raise AttnbenchError("refused")
        assert not folder.exists()
    assert not (tmp_path / "a").exists()  # the parent made for it too
    mine = tmp_path / "mine"
    mine.mkdir()  # the user's own empty folder stays
    with pytest.raises(AttnbenchError), new_out_dir(mine):
        raise AttnbenchError("refused")
    assert mine.is_dir()
    with pytest.raises(AttnbenchError), new_out_dir(tmp_path / "written") as written:
        (written / "run.json").write_text("{}")
        raise AttnbenchError("failed after writing")
    assert (tmp_path / "written" / "run.json").exists()


def test_half_precision_cases_run_on_cpu(tmp_path: Path) -> None:
    for dtype in ("bfloat16", "float16"):
        case = Case("attention", 16, 8, 1, dtype, "cpu", "forward", (("heads", 2),))
        assert measure_case(case).status == "ok"


def test_cuda_sync_calls_torch_cuda_synchronize(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[object] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: seen.append(device))
    device_sync("cuda:1")()
    assert seen == [torch.device("cuda:1")]
    device_sync("cpu")()
    assert len(seen) == 1


def test_every_case_has_measured_steps_and_path_with_their_method(tiny_run: RunResults) -> None:
    frame = tiny_run.frame
    assert (frame["seq_steps"] >= 1).all() and (frame["seq_steps_method"] == "traced").all()
    assert (frame["path_len"] >= 1).all() and (frame["path_len_method"] == "measured").all()
    by = frame.set_index(["layer", "n"])
    assert by.loc[("rnn", 32), "path_len"] == 32 and by.loc[("attention", 32), "path_len"] == 1
    assert by.loc[("rnn", 32), "seq_steps"] > by.loc[("rnn", 16), "seq_steps"]
    assert by.loc[("attention", 32), "seq_steps"] == by.loc[("attention", 16), "seq_steps"]
    assert by.loc[("attention-local", 32), "window"] == 16
