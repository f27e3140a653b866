"""Tuning our Triton kernel: tile timings, the tuning table, register counts."""
