#!/usr/bin/env bash
# The learner on one GPU, without Ray or vLLM (issue 42): correctness on the device, then every path of
# benchmarks/learner_gpu.py at the Qwen2.5-0.5B and 1.5B shapes. Run from the repository root:
#
#     OUT=/some/dir bash benchmarks/gpu_session.sh
#
# Needs torch and transformers (peft, pyarrow optional; no network, no pip). Writes into $OUT (default
# results/benchmarks/gpu_session): check.json, learner_0.5b.json, learner_1.5b.json, session.log (everything the
# runs printed, nvidia-smi and the versions first). Each run has its own time limit and a failed or killed run does
# not stop the next; each JSON is rewritten after every path, so a killed run keeps the paths it finished.
# At most 60 + 210 + 170 s (the runs' limits), typically less, on an H100/H200. On a CPU, LEARNER_GPU_SHAPES=tiny runs the same end to end at a tiny size.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-results/benchmarks/gpu_session}
SHAPES=${LEARNER_GPU_SHAPES:-"0.5b 1.5b"}
CHECK_SHAPE=${LEARNER_GPU_CHECK_SHAPE:-${SHAPES%% *}}
PY=${PYTHON:-$(command -v python || command -v python3)}
PATHS=${LEARNER_GPU_PATHS:-"buckets_64 padded buckets_measured packed compiled packed_compiled"}
mkdir -p "$OUT"
LOG="$OUT/session.log"
: > "$LOG"
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$LOG"; }

log "gpu_session: shapes '$SHAPES', paths '$PATHS', out $OUT"
{ nvidia-smi || true; "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, 'device', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu')"; } >> "$LOG" 2>&1

run() {  # run LIMIT_S NAME ARGS...: one benchmark process under a time limit; its exit status logged, never fatal
    local limit=$1 name=$2
    shift 2
    log "start $name (limit ${limit}s)"
    local t0=$SECONDS
    timeout --kill-after=10 "$limit" "$PY" benchmarks/learner_gpu.py "$@" >> "$LOG" 2>&1
    local rc=$?
    log "end $name: exit $rc after $((SECONDS - t0))s$([ $rc = 124 ] && echo ' (time limit: the JSON holds the paths it finished)')"
}

run 60 check --check --shape "$CHECK_SHAPE" --out "$OUT/check.json"
for shape in $SHAPES; do
    # 2 warm-up + 5 timed steps per path; a path past 30 s of steps stops early. packed_flex is tried last, at the
    # smallest shape only (its first step compiles flex attention).
    extra="" limit=170
    [ "$shape" = "${SHAPES%% *}" ] && extra="packed_flex" limit=210
    run "${LEARNER_GPU_SHAPE_LIMIT_S:-$limit}" "learner $shape" --shape "$shape" --paths $PATHS $extra \
        --warmup 2 --steps 5 --path-budget-s 30 --out "$OUT/learner_$shape.json"
done
log "done: $(ls "$OUT" | tr '\n' ' ')"
