"""Measurements of one call: time, peak memory, FLOPs."""

from attnbench.measure.counts.flops import count_flops, flops_agree
from attnbench.measure.memory import peak_bytes
from attnbench.measure.timing.loop import TimingPolicy, TimingStats, time_call

__all__ = ["TimingPolicy", "TimingStats", "count_flops", "flops_agree", "peak_bytes", "time_call"]
