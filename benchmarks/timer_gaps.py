"""Where the kernels timer and Triton's do_bench_cudagraph part, and whether the profiler sees the
device's kernels at all on this machine (CUPTI).

For a few cases: the kernels timer (back-to-back replays of a graph of up to 64 calls, timed in
synchronised blocks), the same graph's single replays between CUDA events (as
do_bench_cudagraph times its own), and do_bench_cudagraph itself at its default and at a long
``rep``. A replay timed alone pays the graph's launch; back-to-back replays hide it.

    python benchmarks/timer_gaps.py [--cases ssm@256,conv@2048,ssm-scan@256] [--d 128]
"""

from __future__ import annotations

import argparse
import collections
import statistics

import torch

from attnbench.devices import device_sync
from attnbench.measure.step import make_step
from attnbench.measure.timing.gputimers import cuda_timers, graph_of, time_step
from attnbench.measure.timing.loop import TimingPolicy
from attnbench.options import build_grid


def profiler_sees_kernels() -> None:
    from torch.autograd.profiler import profile

    x = torch.randn(2048, 2048, device="cuda")
    x @ x
    torch.cuda.synchronize()
    with profile(use_device="cuda") as prof:
        x @ x
        torch.cuda.synchronize()
    kinds = collections.Counter(str(e.device_type()) for e in prof.kineto_results.events())
    print("kineto events by device type:", dict(kinds))
    try:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as profile2

        with profile2(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p2:
            x @ x
            torch.cuda.synchronize()
        names = [e.name for e in p2.events() if getattr(e, "device_type", None) is not None]
        cuda = [e for e in p2.events() if str(e.device_type).endswith("CUDA")]
        print(f"torch.profiler: {len(names)} events, {len(cuda)} on CUDA")
    except Exception as exc:
        print("torch.profiler failed:", type(exc).__name__, str(exc)[:200])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="ssm@256,conv@2048,ssm-scan@256,attention-local@256")
    parser.add_argument("--d", default="128")
    args = parser.parse_args()
    profiler_sees_kernels()
    from triton.testing import do_bench_cudagraph

    sync = device_sync("cuda:0")
    for spec in args.cases.split(","):
        layer, n = spec.split("@")
        (case,) = build_grid({"layers": layer, "n": n, "d": args.d, "device": "cuda"}).cases()
        step = make_step(case, seed=0)
        fn = step.call
        fn()
        sync()
        policy = TimingPolicy(budget_s=0.2, warmup_calls=1, timer="kernels")
        ours = time_step(fn, policy, case.device, sync=sync)
        timers = cuda_timers(case.device)
        calls, replay = graph_of(fn, timers, sync=sync)
        single = [timers.replay_time(replay) / calls for _ in range(20)]
        cg20 = do_bench_cudagraph(fn, return_mode="median") * 1e-3
        cg100 = do_bench_cudagraph(fn, rep=100, return_mode="median") * 1e-3
        print(f"{spec:22} kernels {ours.stats.median_s * 1e6:8.1f}us ({calls} a graph)  "
              f"one replay {statistics.median(single) * 1e6:8.1f}us  "
              f"cudagraph(20) {cg20 * 1e6:8.1f}us  cudagraph(100) {cg100 * 1e6:8.1f}us",
              flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
