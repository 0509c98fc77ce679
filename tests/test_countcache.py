"""The count cache: a second sweep reads the exact counts a first one traced, equal to them; a
changed layer, a layer with no digest, --no-cache and a damaged entry all trace again."""

from __future__ import annotations

import dataclasses
import json
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import own_cache
from synthetic import registry_restored
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.layers import REGISTRY
from attnbench.measure.counts import countcache
from attnbench.options import build_grid
from attnbench.results.loader import load_results

runner = CliRunner()
EXACT = ["flops", "elementwise", "bytes", "product_bytes", "kernels", "seq_steps", "path_len",
         "uncounted_ops", "seq_steps_method", "path_len_method", "bytes_method"]  # fmt: skip
MEMORY = ["peak_bytes", "ops", "fused_path", "backend"]
TINY = ["--n", "16,32", "--d", "8", "--device", "cpu", "--time-budget", "0.002", "--no-charts"]

LAYER = """
import torch
from torch import nn


class Mixer(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.up = nn.Linear(d, {width} * d)
        self.down = nn.Linear({width} * d, d)

    def forward(self, x):  # (B, n, d)
        return self.down(torch.relu(self.up(x + x.mean(dim=1, keepdim=True))))


def make(d):
    return Mixer(d)
"""


@pytest.fixture(autouse=True)
def cache_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The cache on, in a folder of this test's own."""
    monkeypatch.delenv("ATTNBENCH_NO_CACHE", raising=False)  # the command line's cache on
    own_cache(tmp_path / "cache", monkeypatch)  # with the session's ceilings
    with registry_restored():
        yield tmp_path / "cache"


def sweep(out: Path, *args: str) -> object:
    result = runner.invoke(app, ["sweep", *TINY, "--out", str(out), *args])
    assert result.exit_code == 0, result.output
    return load_results(out).frame.set_index("case_id")


@pytest.mark.slow
def test_a_second_sweep_reads_the_counts_the_first_traced(tmp_path: Path, cache_on: Path) -> None:
    layers = ["--layers", "conv,rnn,attention,ssm-scan"]
    first = sweep(tmp_path / "a", *layers)
    assert set(first["counts_source"]) == {"traced"}
    # One entry of counts and one of the memory pass per case, and the rnn cases' (n = 16, 32:
    # probe lengths of a recurrence) again as its probes' for longer cases.
    assert len(list((cache_on / "counts").rglob("*.json"))) == 2 * len(first) + 2 * 2
    assert set(first["peak_bytes_method"]) == {"measured"}
    second = sweep(tmp_path / "b", *layers)
    assert set(second["counts_source"]) == {"cache"}
    assert second[EXACT].equals(first[EXACT])  # the very same counts
    assert second[MEMORY].equals(first[MEMORY])  # and the same memory pass, marked as read
    assert set(second["peak_bytes_method"]) == {"measured (cache)"}
    assert set(second["bytes_check"]) == {"ok"} and set(second["flops_check"]) == {"ok"}
    meta = json.loads((tmp_path / "b" / "run.json").read_text())
    assert meta["count_cache"] == {"enabled": True, "folder": str(cache_on / "counts")}
    third = sweep(tmp_path / "c", *layers, "--no-cache")
    assert set(third["counts_source"]) == {"traced"} and third[EXACT].equals(first[EXACT])


@pytest.mark.slow
def test_a_sweep_the_cache_holds_never_pays_the_tracers_start_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The instruments' start-up (the profiler's first session) is paid before the first case
    that traces, and not at all when every case is read from the cache."""
    from attnbench.measure import case

    primed: list[str] = []
    monkeypatch.setattr(case, "prime_instruments", lambda: primed.append("primed"))
    sweep(tmp_path / "a", "--layers", "conv")
    assert primed == ["primed", "primed"]  # asked before each traced case (it runs once)
    primed.clear()
    sweep(tmp_path / "b", "--layers", "conv")
    assert primed == []


@pytest.mark.slow
def test_the_probes_are_traced_once_for_every_long_case_of_a_layer(
    tmp_path: Path, cache_on: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two long rnn cases share their probes' traces (n = 8..64), kept in the cache apart from
    the cases' own entries; a second sweep traces nothing."""
    from attnbench.measure import case as case_module

    traced: list[int] = []
    real = case_module.call_counts

    def counting(step, mode, **kw):  # type: ignore[no-untyped-def]
        traced.append(step.x.shape[1])
        return real(step, mode, **kw)

    monkeypatch.setattr(case_module, "call_counts", counting)
    first = sweep(tmp_path / "a", "--layers", "rnn", "--n", "128,256")
    assert set(first["counts_source"]) == {"extended"}
    assert traced == [8, 16, 32, 64]  # once, for both cases
    # The cases' counts and memory passes, and the probes' counts and memory passes.
    assert len(list((cache_on / "counts").rglob("*.json"))) == 2 * 2 + 2 * 4
    # A case at a probe length is the probe: one trace and one memory pass serve both.
    traced.clear()
    profiled: list[int] = []
    real_pass = case_module.memory_pass
    monkeypatch.setattr(
        case_module, "memory_pass", lambda c, *a: profiled.append(c.n) or real_pass(c, *a)
    )
    short = sweep(tmp_path / "s", "--layers", "rnn", "--n", "64", "--d", "16")
    longer = sweep(tmp_path / "l", "--layers", "rnn", "--n", "128", "--d", "16")
    assert traced == [64, 8, 16, 32] and profiled == [64, 8, 16, 32]
    assert list(short["counts_source"]) == ["traced"] and list(longer["counts_source"]) == [
        "extended"
    ]
    assert short["path_len"].tolist() == [64] and longer["path_len"].tolist() == [128]
    traced.clear()
    second = sweep(tmp_path / "b", "--layers", "rnn", "--n", "128,256")
    assert traced == [] and set(second["counts_source"]) == {"cache"}
    assert second[EXACT].equals(first[EXACT])


@pytest.mark.slow
def test_a_changed_layer_never_reads_a_stale_entry(tmp_path: Path) -> None:
    path = tmp_path / "mixer.py"
    path.write_text(textwrap.dedent(LAYER.replace("{width}", "2")))
    first = sweep(tmp_path / "a", "--layers", f"{path}:make")
    again = sweep(tmp_path / "b", "--layers", f"{path}:make")
    assert set(first["counts_source"]) == {"traced"} and set(again["counts_source"]) == {"cache"}
    path.write_text(textwrap.dedent(LAYER.replace("{width}", "4")))  # twice the products
    REGISTRY.pop("mixer:make")  # as a new process would load it
    changed = sweep(tmp_path / "c", "--layers", f"{path}:make")
    assert set(changed["counts_source"]) == {"traced"}
    assert list(changed["flops"]) == [2 * f for f in first["flops"]]


def test_what_the_key_covers() -> None:
    case = build_grid({"layers": "conv", "n": [16], "d": [8], "device": "cpu"}).cases()[0]
    other = build_grid({"layers": "conv", "n": [32], "d": [8], "device": "cpu"}).cases()[0]
    key = countcache.key(case, 0)
    assert key is not None and key == countcache.key(case, 0)
    assert key != countcache.key(other, 0) and key != countcache.key(case, 1)
    # from Python the cache is asked for; the command line asks for it unless --no-cache
    assert not countcache.DEFAULT_COUNTING.cache


def test_the_memory_pass_is_kept_per_cpu_model_and_thread_count(
    cache_on: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = build_grid({"layers": "conv", "n": [16], "d": [8], "device": "cpu"}).cases()[0]
    profile = countcache.Profile(4096, 3, frozenset({"mkldnn_rnn_layer"}), "measured")
    countcache.CountCache().write_profile(case, 0, profile)
    assert countcache.CountCache().read_profile(case, 0) == profile
    assert countcache.CountCache().read(case, 0) is None  # the counts are an entry of their own
    threads = countcache.torch.get_num_threads
    monkeypatch.setattr(countcache.torch, "get_num_threads", lambda: 7)
    cache = countcache.CountCache()
    assert cache.read_profile(case, 0) is None  # other threads, other oneDNN kernels
    monkeypatch.setattr(countcache.torch, "get_num_threads", threads)
    assert countcache.CountCache().read_profile(case, 0) == profile
    monkeypatch.setattr(countcache, "cpu_model", lambda: "Another CPU")
    assert countcache.CountCache().read_profile(case, 0) is None
    on_cuda = dataclasses.replace(case, device="cuda")
    assert countcache.profile_key(on_cuda, 0) is None  # allocator statistics: read every time


def test_a_layer_from_python_or_a_damaged_entry_is_traced(add_layer, cache_on: Path) -> None:  # type: ignore[no-untyped-def]
    from torch import nn

    add_layer("plain", lambda d: nn.Linear(d, d))
    case = build_grid({"layers": "plain", "n": [16], "d": [8], "device": "cpu"}).cases()[0]
    assert countcache.key(case, 0) is None  # no digest proves its code unchanged
    conv = build_grid({"layers": "conv", "n": [16], "d": [8], "device": "cpu"}).cases()[0]
    counts = countcache.Counts(1, "", 1, "traced", 1, "measured", 0, "traced", 2, "traced", 2, "")
    countcache.CountCache().write(conv, 0, counts)
    assert countcache.CountCache().read(conv, 0) == counts
    entry = next((cache_on / "counts").rglob("*.json"))
    entry.write_text("{torn")
    assert countcache.CountCache().read(conv, 0) is None


@pytest.mark.slow
def test_the_start_estimate_counts_the_tracing_a_sweep_will_do(tmp_path: Path) -> None:
    """A recurrence traces every position, attention does not; a cached case traces nothing."""
    from attnbench.run.estimate import estimate_seconds, in_cache, tracing_seconds

    def one(layer: str, n: int):  # type: ignore[no-untyped-def]
        return build_grid({"layers": layer, "n": [n], "d": [8], "device": "cpu"}).cases()[0]

    assert tracing_seconds(one("rnn", 1024), False) > 2 * tracing_seconds(one("rnn", 64), False)
    assert tracing_seconds(one("attention", 1024), False) == tracing_seconds(
        one("attention", 64), False
    )
    assert tracing_seconds(one("rnn", 1024), True) < tracing_seconds(one("rnn", 64), False)
    # The probes a first long case traced serve the next ones: those pay their path only.
    assert tracing_seconds(one("rnn", 1024), False, probes_traced=True) < tracing_seconds(
        one("rnn", 1024), False
    )
    long = build_grid({"layers": "rnn", "n": "128,256,512", "d": "8", "device": "cpu"})
    first, *later = long.cases()
    shared = tracing_seconds(first, False) + sum(
        tracing_seconds(c, False, probes_traced=True) for c in later
    )
    # Three cases of a few kFLOP: their high end is the rounds' (up to six), each its process's
    # cost and its share of the time budget.
    from attnbench.run.rounds import ROUND_PROCESS_S, ROUND_WARMUP_S, round_policy

    rounds = 6 * (ROUND_PROCESS_S + ROUND_WARMUP_S + round_policy(long).budget_s)
    assert estimate_seconds(long) == pytest.approx(shared + 3 * rounds, rel=0.01)
    grid = build_grid({"layers": "conv,rnn", "n": "16,32", "d": "8", "device": "cpu",
                       "time_budget": 0.002})  # fmt: skip
    on = countcache.Counting(cache=True)
    cold = estimate_seconds(grid, lambda c: in_cache(c, grid.seed, on), on)
    sweep(tmp_path / "a", "--layers", "conv,rnn")
    warm = estimate_seconds(grid, lambda c: in_cache(c, grid.seed, on), on)
    assert all(in_cache(c, grid.seed, on) for c in grid.cases()) and warm < cold


@pytest.mark.slow
def test_a_cache_that_cannot_be_written_is_skipped_and_left_without_torn_files(
    tmp_path: Path, cache_on: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk under the cache: the sweep goes on, traces, and leaves no half entry."""
    import os

    real = os.write

    def full(fd: int, data: bytes) -> int:
        if str(cache_on) in os.readlink(f"/proc/self/fd/{fd}"):  # a cache file's write only
            real(fd, bytes(data)[:3])  # cut short, as a full disk cuts a write
            raise OSError(28, "No space left on device")
        return real(fd, data)

    monkeypatch.setattr(os, "write", full)
    frame = sweep(tmp_path / "a", "--layers", "conv")
    assert (frame["status"] == "ok").all() and (frame["counts_source"] == "traced").all()
    ceilings = cache_on / "ceilings"  # copied in by the fixture
    assert not [p for p in cache_on.rglob("*") if p.is_file() and ceilings not in p.parents]
