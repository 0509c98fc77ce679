"""Timing one call: the loop and its stopping rule, the clocks, the GPU timers, the allocator's
stated state, page faults, the machine's reference around a round, the calibration kernel, and
the split of a time into its kernels and the overhead."""
