"""How fast each kind of work runs on this device, by size: the rate curves of the ceilings.

A layer's products are narrow (d = 32..128 wide; d / heads for the attention scores) and run
at a fraction of a large GEMM's rate, and an ``exp`` or a ``tanh`` computes for many times
longer than it takes to move an element (a 2-core CPU: 7 G elements/s for an add, 1.7 for an
exp, 0.6 for a tanh, on operands in cache). ``measure_ceilings`` records, from here:

- each kind of product's FLOP/s by its narrow width (a GEMM, a Conv1d, a fused attention, and
  oneDNN's fused LSTM), on operands that stay in cache; and the fused LSTM's cost per call
  beyond its steps (oneDNN's set-up);
- each elementwise op's elements per second, for the ops of ``CATALOGUE``; an op not in it
  runs at an add's rate (``Ceilings.elementwise_rate``).

The machine model charges each product and each op the larger of its work over its rate and
its bytes over the bandwidth (``fits.roofline``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial

import torch
import torch.nn.functional as F

from attnbench.devices import for_kind
from attnbench.measure.counts.flops import count_flops
from attnbench.measure.counts.laws import Law
from attnbench.measure.counts.ops import unfused
from attnbench.measure.timing.loop import TimingPolicy

# Each op by its aten name (trailing "_" of in-place variants dropped, as ``kernels`` writes
# it), as a call on x and y (rows, 256), a boolean mask of x's shape: the elements it computes
# are x's (its output's, or for a reduction or a softmax the input's).
CATALOGUE: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], object]] = {
    "add": lambda x, y, m: torch.add(x, y),
    "sub": lambda x, y, m: torch.sub(x, y),
    "mul": lambda x, y, m: torch.mul(x, y),
    "div": lambda x, y, m: torch.div(x, y),
    "neg": lambda x, y, m: torch.neg(x),
    "pow": lambda x, y, m: torch.pow(x, 2.0),
    "exp": lambda x, y, m: torch.exp(x),
    "log": lambda x, y, m: torch.log(x.abs()),
    "sqrt": lambda x, y, m: torch.sqrt(y),
    "rsqrt": lambda x, y, m: torch.rsqrt(y),
    "sin": lambda x, y, m: torch.sin(x),
    "cos": lambda x, y, m: torch.cos(x),
    "tanh": lambda x, y, m: torch.tanh(x),
    "sigmoid": lambda x, y, m: torch.sigmoid(x),
    "relu": lambda x, y, m: torch.relu(x),
    "gelu": lambda x, y, m: F.gelu(x),
    "silu": lambda x, y, m: F.silu(x),
    "elu": lambda x, y, m: F.elu(x),
    "softplus": lambda x, y, m: F.softplus(x),
    "masked_fill": lambda x, y, m: x.masked_fill(m, 0.0),
    "where": lambda x, y, m: torch.where(m, x, y),
    "_softmax": lambda x, y, m: torch.softmax(x, -1),
    "_log_softmax": lambda x, y, m: torch.log_softmax(x, -1),
    "sum": lambda x, y, m: x.sum(-1),
    "mean": lambda x, y, m: x.mean(-1),
    "amax": lambda x, y, m: x.amax(-1),
    "cumsum": lambda x, y, m: x.cumsum(-1),
}
if hasattr(torch.ops.aten, "_safe_softmax"):  # torch >= 2.5: the math attention's softmax
    CATALOGUE["_safe_softmax"] = lambda x, y, m: torch.ops.aten._safe_softmax(x, -1)
WIDTH = 256  # the operands' last dimension
# Elements of an elementwise op's operand and of a curve product's long operand: 256 KiB at
# float32 on the CPU (in cache, as a layer's operands at these widths are), large enough to
# fill the device elsewhere.
ELEMENTS = {"cpu": 2**16, "cuda": 2**24, "mps": 2**22}


def operands(device: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x, y (rows, 256) of ``dtype`` on ``device`` (y positive) and a mask of x's shape."""
    elements = for_kind(ELEMENTS, device)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(elements // WIDTH, WIDTH, generator=gen)  # (rows, 256)
    y = torch.rand(elements // WIDTH, WIDTH, generator=gen) + 0.5  # (rows, 256), positive
    mask = x > 0  # (rows, 256)
    return x.to(device=device, dtype=dtype), y.to(device=device, dtype=dtype), mask.to(device)


# The narrow dimensions each curve is measured at (a product's rate grows with it).
GEMM_WIDTHS = (8, 16, 32, 64, 128, 256, 512)
RECURRENT_WIDTHS = (8, 16, 32, 64, 128)
RECURRENT_STEPS = 256  # the fused LSTM's length: its rate holds beyond a few hundred steps
RECURRENT_SHORT = 16  # and a short one: the two give its cost per step and per call
CONV_WIDTHS = (8, 16, 32, 64, 128, 256)
HEAD_WIDTHS = (8, 16, 32, 64, 128)
# An attention's rate grows with its length up to about 512 positions on a CPU, then holds.
CURVE_ATTENTION_LENGTH = {"cpu": 512, "cuda": 4096, "mps": 2048}
# Each point of a curve: a short run, since there are dozens; it stops at its min_time, as
# ceilings.CEILING_POLICY says why. Blocks of 0.5 ms to 4 ms, not 1 ms to 8 ms: its fastest of
# more, shorter samples is as repeatable (the median kernel's spread over 8 interleaved rounds
# 1.237 against 1.218, its 90th percentile 1.89 against 1.87) at the same rates (median ratio
# 1.004, 0.98-1.04), and a measurement takes 1.13 s, not 1.65 (ceilings_check.py --policies
# --against curves).
CURVE_POLICY = TimingPolicy(
    warmup_calls=1,
    min_block_s=5e-4,
    min_samples=5,
    max_samples=30,
    min_time_s=0.004,
    budget_s=0.004,
)
# (kernel name, the call, its policy) -> seconds per call; tests pass their own.
KernelTimer = Callable[[str, Callable[[], object], TimingPolicy], float]


def recurrent_rates(
    device: str,
    dtype: torch.dtype,
    timed: KernelTimer,
    widths: Mapping[str, tuple[int, ...]] | None,
) -> tuple[dict[int, float], dict[int, float]] | None:
    """FLOP/s of nn.LSTM(w, w)'s steps at each width, and the seconds each call costs beyond
    its steps: the line through its times over ``RECURRENT_SHORT`` and ``RECURRENT_STEPS``
    steps (oneDNN sets up its primitive on every call: 80-210 µs at widths 8-128 on a 2-core
    CPU, a sixth of a 256-step call at width 64). Its FLOPs are counted as a case's are (the
    unfused trace's products), its time on the fused path the device takes. None where the
    device runs no fused LSTM (the model then charges the trace's ops)."""
    rates, calls = {}, {}
    gen = torch.Generator().manual_seed(0)
    for w in (widths or {}).get("recurrent", RECURRENT_WIDTHS):
        cell = torch.nn.LSTM(w, w, batch_first=True).to(device=device, dtype=dtype).eval()
        seconds, flops = {}, {}
        for steps, name in ((RECURRENT_SHORT, "recurrent-short"), (RECURRENT_STEPS, "recurrent")):
            x = torch.randn(1, steps, w, generator=gen).to(device=device, dtype=dtype)
            try:
                with torch.no_grad():
                    flops[steps] = _lstm_flops(cell, x)
                    call = lambda cell=cell, x=x: cell(x)  # noqa: E731
                    seconds[steps] = timed(f"{name}@{w}", call, CURVE_POLICY)
            except (RuntimeError, NotImplementedError):  # no LSTM on this device (meta)
                return None
        per_step, call_s = line_through(seconds)
        rates[w] = flops[RECURRENT_STEPS] / RECURRENT_STEPS / per_step
        calls[w] = call_s
    return rates, calls


def line_through(seconds: Mapping[int, float]) -> tuple[float, float]:
    """(seconds per step, seconds per call) of the line through two (steps, seconds) points;
    where noise made the longer run no slower per step than the line allows (a negative call
    cost, or a slope not above zero), the longer run's seconds per step and no call cost."""
    (short, t_short), (long, t_long) = sorted(seconds.items())
    per_step = (t_long - t_short) / (long - short)
    call_s = t_short - short * per_step
    if per_step <= 0 or call_s < 0:
        return t_long / long, 0.0
    return per_step, call_s


# The FLOPs of nn.LSTM(w, w) per width, device and steps: its unfused trace takes 0.15 s per
# width over 256 steps, and every pass of a measurement would count the same again.
_LSTM_FLOPS: dict[tuple[int, str, int], int] = {}
# A call longer than the last of these is counted at them and extended, when its FLOPs grow by
# the same count every step at all three (each step is the same products): 112 steps traced
# for a 256-step call instead of 256.
LAW_STEPS = (RECURRENT_SHORT, 2 * RECURRENT_SHORT, 4 * RECURRENT_SHORT)


def lstm_flops(width: int, steps: int = RECURRENT_STEPS) -> int:
    """The counted FLOPs of one nn.LSTM(width, width) call over ``steps`` (on the CPU), as
    ``recurrent_rates`` counts them: what its rates and call costs are per."""
    cell = torch.nn.LSTM(width, width, batch_first=True).eval()
    with torch.no_grad():
        return _lstm_flops(cell, torch.zeros(1, steps, width))


def _lstm_flops(cell: torch.nn.LSTM, x: torch.Tensor) -> int:
    """The call's counted FLOPs; beyond ``LAW_STEPS``, extended from them where they are a
    line (a count, not an estimate: the same per-step count, proven at three lengths)."""
    steps = int(x.shape[1])
    key = (cell.hidden_size, str(x.device), steps)
    if key not in _LSTM_FLOPS:
        if steps > LAW_STEPS[-1]:
            law = Law([(s, _lstm_flops(cell, x[:, :s])) for s in LAW_STEPS])
            value = law(steps)
            if law.degree <= 1 and value.denominator == 1:  # a line through all three
                _LSTM_FLOPS[key] = int(value)
                return _LSTM_FLOPS[key]
        with unfused():
            _LSTM_FLOPS[key] = count_flops(lambda: cell(x))
    return _LSTM_FLOPS[key]


def elementwise_rates(
    device: str, dtype: torch.dtype, timed: KernelTimer, ops: tuple[str, ...] | None
) -> dict[str, float]:
    """Elements per second of each op of ``CATALOGUE`` (or of ``ops``)."""
    x, y, mask = operands(device, dtype)
    found = {}
    for name in ops if ops is not None else tuple(CATALOGUE):
        op = CATALOGUE[name]
        seconds = timed(f"ew.{name}", partial(op, x, y, mask), CURVE_POLICY)
        found[name] = x.numel() / seconds
    return found


def rate_curves(
    device: str,
    dtype: torch.dtype,
    timed: KernelTimer,
    widths: Mapping[str, tuple[int, ...]] | None,
) -> dict[str, dict[int, float]]:
    """Each kind of product's FLOP/s at each narrow width: a (rows x w) @ (w x w) product, a
    Conv1d(w, w, 3) over as many positions (the CPU's: operands of about 256 KiB), an
    attention of 4 heads of width w over 512 positions on the CPU."""
    chosen = {"gemm": GEMM_WIDTHS, "conv": CONV_WIDTHS, "attention": HEAD_WIDTHS, **(widths or {})}
    elements = for_kind(ELEMENTS, device)
    gen = torch.Generator().manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    gemm, conv, attention = {}, {}, {}
    for w in chosen["gemm"]:
        rows = max(w, elements // w)
        a, b = randn(rows, w), randn(w, w)  # (rows, w), (w, w)

        def call(a: torch.Tensor = a, b: torch.Tensor = b) -> torch.Tensor:
            return a @ b

        gemm[w] = 2 * rows * w * w / timed(f"gemm@{w}", call, CURVE_POLICY)
    for w in chosen["conv"]:
        length = max(w, elements // w)
        x, k = randn(1, w, length), randn(w, w, 3)  # (1, w, L), (w, w, 3)
        seconds = timed(f"conv@{w}", partial(F.conv1d, x, k, padding=1), CURVE_POLICY)
        conv[w] = 2 * w * w * 3 * length / seconds
    n = for_kind(CURVE_ATTENTION_LENGTH, device)
    for w in chosen["attention"]:
        q, k, v = (randn(1, 4, n, w) for _ in range(3))  # (1, 4, n, w) each
        sdpa = partial(F.scaled_dot_product_attention, q, k, v)
        seconds = timed(f"attention@{w}", sdpa, CURVE_POLICY)
        attention[w] = 4 * 4 * n * n * w / seconds
    return {"gemm_rates": gemm, "conv_rates": conv, "attention_rates": attention}
