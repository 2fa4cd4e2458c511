"""hybrid-cache experiments: absl/gin entry points, benchmarks, notebooks."""
