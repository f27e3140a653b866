"""Profiling our kernel on a GPU: Nsight Compute counters, the memory ceiling, compute-sanitizer runs."""
