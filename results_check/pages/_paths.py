"""Where the committed result files live, relative to the repository root (one place to change when they move)."""

BENCH_RESULTS = "results/benchmarks"  # the benchmark scripts' JSON (benchmarks/*.py)
SWEEP = "results/sweep"  # `rllib-p3o sweep --full` on the demo task
BENCH = "results/bench"  # the claims bench (sorting task, one optimizer step per rollout batch)
BENCH_AVX2 = "results/bench-avx2"  # the claims bench's earlier grid, on an AVX2 CPU
BENCH_ABLATION = "results/bench-ablation"  # the claims bench's behavior_weaker ablation
BENCH_TWO_STEP = "results/bench-two-step"  # the claims bench's earlier grid: two optimizer steps per rollout batch
BENCH_DEVELOPMENT = "results/bench-development"  # the claims bench's development set (P3O under staleness)
BENCH_CONFIRMATION = "results/bench-confirmation"  # ... and its confirmation set, run after the choice was committed
BENCH_INFLIGHT = "results/bench-inflight"  # the bench's async regime with and without in-flight weight updates
BENCH_PROVENANCE_DEVELOPMENT = "results/bench-provenance-development"  # offline provenance: the development set
BENCH_PROVENANCE_CONFIRMATION = "results/bench-provenance-confirmation"  # ... and its confirmation set
BENCH_PROVENANCE_FIRST_CONFIRMATION = "results/bench-provenance-first-confirmation"  # ... its first choice's
BENCH_PROVENANCE_RATE = "results/bench-provenance-confirmation-rate"  # ... its default at another learning rate
BENCH_ADDITION_DEVELOPMENT = "results/bench-addition-development"  # the second task (addition): its development set
BENCH_ADDITION_CONFIRMATION = "results/bench-addition-confirmation"  # ... and its confirmation set
BENCH_ADDITION_RATE = "results/bench-addition-confirmation-rate"  # ... its default at the best method's learning rate
