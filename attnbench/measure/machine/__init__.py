"""Measuring the machine: its ceilings (peak FLOP/s, bandwidth, op latency, the host's cost per
op), the rate curves of narrow products and elementwise ops, and their files."""
