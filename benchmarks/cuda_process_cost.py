"""What a fresh process costs on a GPU: a process forked from a server that has imported torch
and attnbench (what ``--executor fork`` runs each round in) times, in order, its CUDA context,
its first cuBLAS product, its first cuDNN convolution and its first cuDNN LSTM, each to a
synchronised result. The sum is what every round of a case pays on CUDA before it times anything.

    python benchmarks/cuda_process_cost.py [--forks 4] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def child(device: str, write: int) -> None:
    """In the forked process: each first use, timed to a synchronised result."""
    import torch

    marks: dict[str, float] = {}
    start = time.perf_counter()

    def mark(name: str) -> None:
        torch.cuda.synchronize(device)
        marks[name] = time.perf_counter() - start

    torch.cuda.init()
    torch.zeros(1, device=device)
    mark("context")
    a = torch.randn(256, 256, device=device)
    _ = a @ a
    mark("cublas")
    x = torch.randn(1, 64, 256, device=device)
    w = torch.randn(64, 64, 3, device=device)
    _ = torch.nn.functional.conv1d(x, w, padding=1)
    mark("cudnn_conv")
    lstm = torch.nn.LSTM(64, 64, batch_first=True).to(device)
    with torch.no_grad():
        _ = lstm(torch.randn(1, 256, 64, device=device))
    mark("cudnn_lstm")
    with torch.no_grad():
        _ = torch.nn.functional.scaled_dot_product_attention(x, x, x)
    mark("sdpa")
    os.write(write, json.dumps(marks).encode())
    os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--forks", type=int, default=4)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    begin = time.perf_counter()
    import torch  # noqa: F401  (the server's import, as the fork server's)

    import attnbench.run.executors.child  # noqa: F401

    print(f"server import: {time.perf_counter() - begin:.2f} s")
    found: list[dict[str, float]] = []
    for _ in range(args.forks):
        read, write = os.pipe()
        forked = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            child(args.device, write)
        os.close(write)
        data = b""
        while chunk := os.read(read, 4096):
            data += chunk
        os.waitpid(pid, 0)
        marks = json.loads(data)
        marks["exit"] = time.perf_counter() - forked
        found.append(marks)
        print(" ".join(f"{k} {v:.3f}" for k, v in marks.items()))
    for key in found[0]:
        print(f"median {key}: {statistics.median(m[key] for m in found):.3f} s (cumulative)")


if __name__ == "__main__":
    main()
