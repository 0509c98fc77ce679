"""Counting one call: every traced count (FLOPs, elementwise work, bytes, sequential steps,
path length, instructions), the ops they read, the laws that extend them, and their cache."""
