"""Where the committed result files live, relative to the repository root (one place to change when they move)."""

BENCH_RESULTS = "benchmarks/results"  # the benchmark scripts' JSON
SWEEP = "docs/sweep"  # `rllib-p3o sweep --full` on the demo task
BENCH = "docs/bench"  # the claims bench (sorting task)
BENCH_AVX2 = "docs/bench-avx2"  # the claims bench's earlier grid, on an AVX2 CPU
BENCH_ABLATION = "docs/bench-ablation"  # the claims bench's behavior_weaker ablation
