"""asv benchmark suite of the KDA decode implementations: see docs/perf-ci.md."""
