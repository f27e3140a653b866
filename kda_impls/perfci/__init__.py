"""Performance CI built on the harness: ``kda-ab`` (two revisions measured side by side on one device,
interleaved, and judged round by round) and ``kda-perf-ci`` (the jobs a team's CI runs: main's asv
history, a pull request's paired gate, shards over a CI matrix and the step that merges and gates).
docs/perf-ci.md is the guide."""
