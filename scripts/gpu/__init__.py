"""The GPU checks: the runner (gpu-checks.sh) and the correctness grid."""
