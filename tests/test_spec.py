from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnbench.devices import check_dtype, resolve_device
from attnbench.errors import AttnbenchError
from attnbench.layers import BUILTIN
from attnbench.lengths import AutoN, parse_int_list
from attnbench.options import CONFIG_KEYS, build_grid, grid_from_config, load_config, parse_layers
from attnbench.run.estimate import estimate_bounds, estimate_seconds, size_warning
from attnbench.spec import AUTO_PRECISION, Grid


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("64", (64,)),
        ("128,64,64", (64, 128)),
        (" 64 , 128 ", (64, 128)),
        ("64..512", (64, 128, 256, 512)),
        ("64..1000", (64, 128, 256, 512)),
        ("3..3", (3,)),
        (7, (7,)),
        ([256, 64], (64, 256)),
    ],
)
def test_parse_int_list(text: object, expected: tuple[int, ...]) -> None:
    assert parse_int_list(text, "n") == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("64..", "cannot read '64..'"),
        ("a,b", "cannot read 'a,b'"),
        ("", "cannot read ''"),
        ("64,,128", "cannot read"),
        ("4096..64", "runs backwards"),
        ("64..100", r"holds 64 alone \(it doubles, and 128 is past 100\); write 64"),
        ("0..8", "range start must be >= 1"),
        ("0,8", "values must be >= 1"),
        ("-4", "values must be >= 1"),
        ("1.5", "cannot read"),
        ([], "expected a list of integers"),
        (True, "expected integers"),
    ],
)
def test_parse_int_list_rejects_malformed_input(text: object, message: str) -> None:
    with pytest.raises(AttnbenchError, match=message):
        parse_int_list(text, "n")  # type: ignore[arg-type]


@given(st.integers(1, 10_000), st.integers(0, 20))
def test_range_doubles_from_start_and_stays_within_end(start: int, extra: int) -> None:
    end = start * 2**extra + extra  # not always a power-of-two multiple
    values = parse_int_list(f"{start}..{end}", "n")
    assert values[0] == start
    assert values[-1] <= end < values[-1] * 2
    assert all(b == 2 * a for a, b in itertools.pairwise(values))


@given(st.lists(st.integers(1, 10**6), min_size=1, max_size=20))
def test_list_parsing_is_sorted_unique(values: list[int]) -> None:
    assert parse_int_list(",".join(map(str, values)), "d") == tuple(sorted(set(values)))


@given(st.text(max_size=12))
def test_parser_never_fails_with_anything_but_a_domain_error(text: str) -> None:
    try:
        values = parse_int_list(text, "n")
    except AttnbenchError as exc:
        assert "\n" not in exc.message
    else:
        assert values and all(v >= 1 for v in values)


def test_parse_layers() -> None:
    assert parse_layers("conv, rnn,conv") == ("conv", "rnn")
    with pytest.raises(
        AttnbenchError, match="unknown layer 'cnn'; accepted: conv, conv-dilated, rnn"
    ):
        parse_layers("conv,cnn")
    with pytest.raises(AttnbenchError, match="cannot read"):
        parse_layers("conv,")


def test_cases_order_and_ids() -> None:
    grid = build_grid({"layers": "conv,attention", "n": "8,16", "d": "8", "device": "cpu"})
    cases = grid.cases()
    assert [(c.layer, c.n) for c in cases] == [
        ("conv", 8),
        ("conv", 16),
        ("attention", 8),
        ("attention", 16),
    ]
    assert cases[0].options == (("k", 3),)  # a case names only the options its layer takes
    assert cases[2].options == (("heads", 4), ("causal", 0))
    assert "causal" not in cases[2].case_id  # an option at its default (off) adds no tag
    assert cases[0].case_id == "conv/n=8/d=8/k=3/b=1/float32/cpu/forward"
    assert cases[2].case_id == "attention/n=8/d=8/h=4/b=1/float32/cpu/forward"
    assert len({c.case_id for c in cases}) == len(cases)


def test_default_grid_covers_every_layer() -> None:
    """The default reaches each layer's regime (--n auto); on the CPU at one width, in a
    budget of 60 s of cases, on one thread."""
    grid = build_grid({"device": "cpu"})
    ladder = AutoN().ladder()
    assert grid == replace(
        Grid(device="cpu"), ns=ladder, n_auto=AutoN(), ds=(64,), auto_budget_s=60.0, threads=1,
        precision=AUTO_PRECISION,
    )  # fmt: skip
    assert len(grid.cases()) == len(BUILTIN) * len(ladder)
    fixed = build_grid({"device": "cpu", "n": "64..1024"})
    assert fixed == Grid(device="cpu", threads=1)
    assert len(fixed.cases()) == len(BUILTIN) * 5 * 2


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"layers": "foo"}, "unknown layer 'foo'"),
        ({"d": "30"}, "d=30 is not divisible by heads=4"),
        ({"n": "0"}, "values must be >= 1"),
        ({"k": 0}, "--k must be >= 1"),
        ({"heads": 0}, "--heads must be >= 1"),
        ({"batch": 0}, "--batch must be >= 1"),
        ({"threads": 0}, "--threads must be >= 1"),
        ({"dtype": "float64"}, "unknown dtype 'float64'; accepted: float32, float16, bfloat16"),
        ({"mode": "eval"}, "unknown mode 'eval'; accepted: forward, train"),
        ({"device": "tpu"}, "unknown device 'tpu'; accepted: cpu, cuda, cuda:N, mps, auto"),
        ({"time_budget": 0}, "--time-budget must be a positive"),
        ({"batch": "2"}, "expected an integer"),
    ],
)
def test_build_grid_rejects_bad_options(options: dict, message: str) -> None:
    with pytest.raises(AttnbenchError, match=message):
        build_grid({"device": "cpu", **options})


def test_d_need_not_divide_by_heads_without_attention() -> None:
    assert build_grid({"layers": "conv,rnn", "d": "30", "device": "cpu"}).ds == (30,)


def test_the_cpu_times_on_one_thread_unless_told_or_recorded_otherwise() -> None:
    """One thread on the CPU by default; --threads wins; a GPU keeps torch's; a run recorded
    before the default (threads null: torch's own) resumes on torch's, not on one."""
    small = {"device": "cpu", "n": "32", "layers": "conv"}
    assert build_grid(small).threads == 1
    assert build_grid({**small, "threads": 2}).threads == 2
    on_gpu = build_grid({**small, "device": "cuda"}, lambda name, dtype: "cuda:0")
    assert on_gpu.threads is None
    recorded = build_grid(small).to_dict()
    assert grid_from_config(recorded).threads == 1
    assert grid_from_config({**recorded, "threads": None}).threads is None
    assert build_grid({**small, "threads": None}).threads is None


def test_a_ray_sweep_keeps_torchs_threads_unless_told() -> None:
    """Ray places one case per --threads CPUs: with no --threads a case keeps a node's cores
    (torch's threads), not the one thread the local executors default to on the CPU; from the
    command line and from ``run_sweep`` alike."""
    from attnbench.run.executors.ray import RayExecutor
    from attnbench.run.executors.serial import SerialExecutor
    from attnbench.run.sweep import grid_for

    class Ray:
        keeps_torch_threads = RayExecutor.keeps_torch_threads

        def resolve_device(self, name: str, dtype: str) -> str:
            return "cpu"

    small = {"device": "cpu", "n": "32", "layers": "conv"}
    assert grid_for(small, Ray()).threads is None  # type: ignore[arg-type]
    assert grid_for({**small, "threads": 2}, Ray()).threads == 2  # type: ignore[arg-type]
    assert grid_for(small, SerialExecutor()).threads == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_refused_where_absent() -> None:
    with pytest.raises(AttnbenchError, match="'cuda:1' is not available"):
        resolve_device("cuda:1")


def test_cuda_index_checked_against_device_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda") == "cuda:0"
    assert resolve_device("CUDA:1") == "cuda:1"
    assert resolve_device("auto") == "cuda:0"
    with pytest.raises(AttnbenchError, match="has 2 CUDA device"):
        resolve_device("cuda:2")


def test_bfloat16_needs_native_support_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (7, 5))
    with pytest.raises(AttnbenchError, match=r"compute capability 7.5 < 8.0\); accepted there"):
        check_dtype("bfloat16", "cuda:0")
    check_dtype("float16", "cuda:0")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    check_dtype("bfloat16", "cuda:0")
    check_dtype("bfloat16", "cpu")


def test_config_file_and_unknown_keys(tmp_path: Path) -> None:
    good = tmp_path / "sweep.toml"
    good.write_text('layers = ["conv", "rnn"]\nn = "8..32"\nd = [8]\nbatch = 2\n')
    grid = build_grid({**load_config(good), "device": "cpu"})
    assert grid.layers == ("conv", "rnn") and grid.ns == (8, 16, 32) and grid.batch == 2

    bad = tmp_path / "bad.toml"
    bad.write_text('layerz = "conv"\n')
    with pytest.raises(AttnbenchError, match="unknown key\\(s\\) layerz; accepted: layers"):
        load_config(bad)
    broken = tmp_path / "broken.toml"
    broken.write_text("n = [\n")
    with pytest.raises(AttnbenchError, match="not valid TOML"):
        load_config(broken)
    with pytest.raises(AttnbenchError, match="does not exist"):
        load_config(tmp_path / "missing.toml")


_CONFIG_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.lists(st.integers(-2, 70), max_size=3),
    st.lists(st.text(max_size=5), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=1),
)


@given(st.dictionaries(st.sampled_from(sorted(set(CONFIG_KEYS) - {"out"})), _CONFIG_VALUES))
def test_any_config_gives_a_grid_or_a_one_line_domain_error(options: dict[str, object]) -> None:
    try:
        grid = build_grid({**options, "device": "cpu"} if "device" not in options else options)
    except AttnbenchError as exc:
        assert exc.message and "\n" not in exc.message
    else:
        assert grid.cases() and all(c.n >= 1 and c.d >= 1 for c in grid.cases())
        assert grid_from_config(grid.to_dict()) == grid  # what run.json records rebuilds it


def test_estimate_grows_with_the_grid_and_is_bounded_by_the_case_limit() -> None:
    small = build_grid({"device": "cpu"})
    large = build_grid({"device": "cpu", "n": "64..16384"})
    assert 0 < estimate_seconds(small) < estimate_seconds(large)
    assert size_warning(small) is None
    limited = build_grid({"device": "cpu", "n": "64..16384", "max_case_seconds": 1})
    assert estimate_seconds(limited) < estimate_seconds(large)
    huge = build_grid({"device": "cpu", "n": "16..64", "d": ",".join(map(str, range(4, 2100, 4)))})
    assert len(huge.cases()) > 2000
    assert "pass --yes" in (size_warning(huge) or "")


def test_the_estimates_low_end_stops_each_stable_case_at_the_minimum_timing() -> None:
    """A quiet machine's rounds stop at their minimum time, a busy one's spend the budget and
    add rounds up to --max-processes: the start line gives both ends (the fixed grid: 110
    cases, three rounds each at the least, each a process of its own)."""
    from attnbench.cli.startline import estimate_range
    from attnbench.run.rounds import ROUND_PROCESS_S, ROUND_WARMUP_S, round_policy

    grid = build_grid({"device": "cpu", "n": "64..1024"})
    policy = round_policy(grid)
    quick, share = policy.min_time_s, policy.budget_s
    assert quick < share and grid.processes == 3
    calls = [(c.analytic_flops() or 0) / 2e10 for c in grid.cases()]  # the assumed 20 GFLOP/s
    low, high = estimate_bounds(grid)
    rounds = [ROUND_PROCESS_S + 2 * call + ROUND_WARMUP_S for call in calls]  # a round's own
    timed_low = sum(3 * (r + max(quick, 5 * c)) for r, c in zip(rounds, calls, strict=True))
    timed_high = sum(6 * (r + max(share, 5 * c)) for r, c in zip(rounds, calls, strict=True))
    assert high - low == pytest.approx(timed_high - timed_low)
    assert low > timed_low  # tracing on top
    assert estimate_range(23.4, 45.2) == "about 23-45 s of measuring"
    assert estimate_range(100, 200) == "about 100 s-3 min of measuring"
    assert estimate_range(30.2, 30.4) == "about 30 s of measuring"
    assert estimate_range(None, 45) == "45 s or more of measuring"
