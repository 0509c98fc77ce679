"""How attnbench splits a time into its kernels and the overhead, and what the profiler does to it.

Prints, on this machine:

1. the profiler's own cost, calibrated once per process: its wall time per recorded op and
   the self time it reads for an op that computes one element (the dispatcher and the op's
   set-up): what ``measure.timing.split`` takes out;
2. for a few calls, the profiler's own wall time per recorded op (profiled calls against as
   many unprofiled around them) and the kernels' share three ways: the aten ops' raw self
   time over the profiled wall time (what the profiler says), over the unprofiled wall time,
   and attnbench's (the profiler's cost out of each nested op, the floor out of each op);
3. the checks the split is held to: one large matrix product (a Linear layer) reads a share
   above 0.9, and its kernel time agrees within 10% with that product timed alone
   (``torch.mm``); a layer that loops in Python over tiny ops reads under 0.3;
4. with --compiled, attention and attention-sdpa at n = 64 and 1024, and torch's own
   nn.MultiheadAttention at n = 64 and 256 (d = 64, 4 heads), eager and under torch.compile:
   the kernels' share as a sweep reads each (an eager call with its dispatched ops known, a
   compiled one with them unknown until it is profiled), which way the profiler's cost was
   read, the shares' range over the repeats, and the kernels' seconds a call;
5. with --readings, what reading a split from up to three profiles (the median share kept)
   buys over one: for calls of many tiny ops (ssm, rnn, gru) and of few large ones, each way
   read ``--readings`` times in turn in one process, the shares' range and spread, and the
   milliseconds a split costs.

    python benchmarks/kernel_split.py [--repeat 3] [--compiled] [--readings 8]

Every figure is a ratio inside one process, the sides measured back to back.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from attnbench.measure.timing.allocator import set_allocator
from attnbench.measure.timing.loop import TimingPolicy, time_call
from attnbench.measure.timing.split import (
    READINGS,
    KernelSplit,
    _read_split,
    _record,
    kernel_split,
    profiler_cost,
)

POLICY = TimingPolicy(warmup_calls=2, budget_s=0.3)


def linear(n: int, d: int) -> tuple[Callable[[], object], Callable[[], object]]:
    """A layer that is one large product, and that product alone."""
    layer = torch.nn.Linear(d, d, bias=False)
    x = torch.randn(1, n, d)

    def call() -> object:
        with torch.no_grad():
            return layer(x)

    flat, weight = x.reshape(n, d), layer.weight.detach().t().contiguous()
    return call, lambda: torch.mm(flat, weight)


def tiny_loop(steps: int = 200) -> Callable[[], object]:
    """A Python loop over tiny ops: what a hand-written recurrence of small vectors does."""
    x = torch.randn(4)

    def call() -> object:
        y = x
        for _ in range(steps):
            y = torch.tanh(y * 1.01 + 0.1)
        return y

    return call


def layer_call(name: str, n: int, d: int = 64, compile: str = "") -> Callable[[], object]:
    from attnbench.measure.step import make_step
    from attnbench.options import build_grid

    values = {"layers": name, "n": [n], "d": [d], "device": "cpu", "compile": compile}
    case = build_grid(values).cases()[0]
    step = make_step(case, seed=0)
    step()
    return step


def shares(call: Callable[[], object]) -> tuple[float, float, float, float, float]:
    """(raw self / profiled wall, raw self / plain wall, attnbench's share, the profiler's
    seconds a recorded op, plain seconds a call) of one profile."""
    plain = time_call(call, POLICY).median_s
    calls = max(1, min(20, round(0.01 / plain)))
    found = _record(call, calls, "cpu", time.perf_counter, lambda: None)
    raw = sum(e.self_s for e in found.ops if e.name.startswith("aten::"))
    ops = sum(e.name.startswith("aten::") for e in found.ops) // calls  # as a sweep knows them
    ours = kernel_split(call, "cpu", plain, ops, record=lambda fn, k, device: found).share
    return raw / found.wall_s, raw / found.plain_s, ours, found.per_op_s, plain


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--compiled", action="store_true", help="also the compiled calls (4.)")
    parser.add_argument("--readings", type=int, default=0, help="5., each way this many times")
    args = parser.parse_args()
    set_allocator("pinned")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
    cost = profiler_cost()
    print(f"1. the profiler: {cost.per_op_s * 1e6:.2f} µs of wall time a recorded op (a loop "
          f"of one-element adds); such an add reads {cost.op_floor_s * 1e6:.2f} µs of self "
          "time")  # fmt: skip

    print("\n2. the kernels' share (medians of the repeats)")
    print(f"{'call':<24} {'time':>9} {'profiler/op':>11} {'raw/profiled':>13} {'raw/plain':>10} "
          f"{'attnbench':>10}")  # fmt: skip
    big, product = linear(2048, 1024)
    calls = {
        "Linear 2048x1024": big,
        "Python loop, 200 tiny": tiny_loop(),
        **{f"{name} n={n}": layer_call(name, n) for name, n in (
            ("conv", 64), ("conv", 4096), ("attention", 64), ("attention", 2048),
            ("rnn", 256), ("ssm", 256), ("ssm-scan", 1024), ("attention-local", 1024))},
    }  # fmt: skip
    found: dict[str, float] = {}
    for label, call in calls.items():
        rows = [shares(call) for _ in range(args.repeat)]
        raw_p, raw_w, ours, per_op, plain = (
            statistics.median(r[i] for r in rows) for i in range(5)
        )
        found[label] = ours
        print(f"{label:<24} {plain * 1e3:>7.3f}ms {per_op * 1e6:>9.2f}µs {raw_p:>13.2f} "
              f"{raw_w:>10.2f} {ours:>10.2f}")  # fmt: skip

    print("\n3. the checks")
    ratios = []
    share = kernel_split(big, "cpu", time_call(big, POLICY).median_s, ops=1).share
    for i in range(4 * args.repeat):  # the layer and the product alone, in turn (ABBA)
        first, second = (big, product) if i % 2 == 0 else (product, big)
        times = {id(first): time_call(first, POLICY).median_s}
        times[id(second)] = time_call(second, POLICY).median_s
        ratios.append(share * times[id(big)] / times[id(product)])
    ratio = statistics.median(ratios)
    print(f"one large product: share {found['Linear 2048x1024']:.2f} (target > 0.9); its kernel "
          f"time / the product timed alone {ratio:.3f} (target within 10%; "
          f"{min(ratios):.3f}..{max(ratios):.3f} over {len(ratios)} pairs)")  # fmt: skip
    print(f"a Python loop of tiny ops: share {found['Python loop, 200 tiny']:.2f} (target < 0.3)")
    if args.compiled:
        compiled_shares(args.repeat)
    if args.readings:
        readings(args.readings)


def mha_call(n: int, compile: str) -> Callable[[], object]:
    """torch's nn.MultiheadAttention as a plugin would wrap it, eager or compiled."""
    from attnbench.compiling import CompileSpec
    from attnbench.measure.compiled import compiled

    attention = torch.nn.MultiheadAttention(64, 4, batch_first=True).eval()
    spec = CompileSpec.parse(compile) if compile else None
    model = attention if spec is None else compiled(attention, spec)
    x = torch.randn(1, n, 64)

    def call() -> object:
        with torch.no_grad():
            return model(x, x, x, need_weights=False)[0]

    call()
    return call


def dispatched(call: Callable[[], object]) -> int:
    """The ops an eager call dispatches, as a sweep's memory pass counts them."""
    from attnbench.measure.counts.ops import recording_fused

    ops: list[int] = []
    recording_fused(call, set(), ops)()
    return ops[0]


def compiled_shares(repeat: int) -> None:
    """Eager and compiled calls of the same layer: the share a sweep reads of each (a compiled
    call's ops unknown, as ``measure.case`` passes them), and the kernels' seconds."""
    print("\n4. eager and compiled (medians, the shares' range; kernels: share x time)")
    print(f"{'call':<30} {'time':>9} {'share':>6} {'range':>11} {'kernels':>9}  cost read on")
    cases = [("attention", 64), ("attention", 1024), ("attention-sdpa", 64),
             ("attention-sdpa", 1024), ("nn.MultiheadAttention", 64),
             ("nn.MultiheadAttention", 256)]  # fmt: skip
    for name, n in cases:
        for mode in ("", "default"):
            if name == "nn.MultiheadAttention":
                call = mha_call(n, mode)
            else:
                call = layer_call(name, n, compile=mode)
            ops = None if mode else dispatched(call)
            rows = []
            for _ in range(repeat):
                plain = time_call(call, POLICY).median_s
                split = kernel_split(call, "cpu", plain, ops)
                rows.append((plain, split.share, split.method))
            plain = statistics.median(r[0] for r in rows)
            share = statistics.median(r[1] for r in rows)
            own = sum("unprofiled" in r[2] for r in rows)
            how = f"own calls, {own} of {repeat}" if own else "the host's"
            low, high = min(r[1] for r in rows), max(r[1] for r in rows)
            label = f"{name} n={n} {'compiled' if mode else 'eager'}"
            print(f"{label:<30} {plain * 1e3:>7.3f}ms {share:>6.2f} {low:>5.2f}..{high:<4.2f} "
                  f"{share * plain * 1e6:>7.1f}µs  {how}")  # fmt: skip


def readings(times: int) -> None:
    """One profile against the split a sweep takes (up to ``READINGS``, the median), in turn."""

    print(f"\n5. one profile against the median of up to {READINGS} ({times} splits each way, "
          "in turn; spread: the shares' standard deviation)")  # fmt: skip
    print(f"{'call':<22} {'time':>9} {'one: range':>12} {'spread':>7} {'cost':>7}   "
          f"{'median: range':>13} {'spread':>7} {'cost':>7} {'profiles':>8}")  # fmt: skip
    for name, n in (("ssm", 256), ("ssm", 1024), ("rnn", 256), ("gru", 256), ("lstm", 512),
                    ("attention", 128), ("conv", 256), ("conv-dilated", 128)):  # fmt: skip
        call = layer_call(name, n)
        ops = dispatched(call)
        plain = time_call(call, POLICY).median_s
        ways: dict[str, list[tuple[float, float, int]]] = {"one": [], "median": []}
        for _ in range(times):
            for way, split in (("one", _one_profile), ("median", kernel_split)):
                start = time.perf_counter()
                found = split(call, "cpu", plain, ops)
                ways[way].append((found.share, time.perf_counter() - start, found.calls))
        cells = []
        for rows in ways.values():
            got = [r[0] for r in rows]
            cost = statistics.median(r[1] for r in rows) * 1e3
            cells.append(f"{min(got):>5.2f}..{max(got):<5.2f} {statistics.stdev(got):>7.3f} "
                         f"{cost:>5.1f}ms")  # fmt: skip
        per = statistics.mean(r[2] for r in ways["median"]) / statistics.mean(
            r[2] for r in ways["one"]
        )
        print(f"{name + ' n=' + str(n):<22} {plain * 1e3:>7.3f}ms {cells[0]}   {cells[1]} "
              f"{per:>8.1f}")  # fmt: skip


def _one_profile(
    call: Callable[[], object], device: str, plain: float, ops: int | None
) -> KernelSplit:
    """A split from one profile, as attnbench read it before 2026-11-30."""
    return _read_split(call, device, plain, ops, None, None, time.perf_counter, lambda: None)


if __name__ == "__main__":
    main()
