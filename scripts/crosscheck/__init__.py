"""Second clocks beside the harness: CUPTI kernel durations and NVIDIA nvbench."""
