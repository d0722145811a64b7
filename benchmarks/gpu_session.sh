#!/usr/bin/env bash
# The learner on one GPU, without Ray or vLLM (issues 42 and 64), in one prepared call of about 8 minutes at most on
# an H100/H200. Run from the repository root:
#
#     OUT=/some/dir bash benchmarks/gpu_session.sh     # on the GPU machine (default OUT: results/benchmarks/gpu_session)
#     bash benchmarks/gpu_session.sh --rehearse        # on a CPU: every stage at the tiny shape (OUT: runs/...)
#
# LEARNER_GPU_STAGES picks stages (default "flex check learner max_rows"; see STAGES below).
# A rehearsal runs the stages without the compiled paths unless LEARNER_GPU_PATHS and LEARNER_GPU_MAX_ROWS_PATHS
# name them, and with 4x the limits (LEARNER_GPU_LIMIT_SCALE); other knobs: LEARNER_GPU_SHAPES, LEARNER_GPU_ROWS,
# LEARNER_GPU_DEVICE, LEARNER_GPU_MAX_ROWS_CAP, PYTHON.
#
# Needs torch and transformers (peft, pyarrow optional; no network, no pip). The stages, in order, each a process of
# benchmarks/learner_gpu.py under its own time limit (a failed or killed stage does not stop the next):
#
#   flex.json         flex attention on packed rows against padded SDPA: tests/test_flex_packing.py's case first (the
#                     0.64 gap of issue 55 was seen on CUDA only), then the check shape in float32 and bf16 autocast,
#                     and what the learner's packing check decides under flex attention              (limit 90 s)
#   check.json        correctness on the device: packed vs padded, the fused vs the chunked LM head (log-probs,
#                     loss, gradients; float32 and bf16 autocast), every loss against the CPU           (limit 60 s)
#   learner_0.5b.json, learner_1.5b.json
#                     s/step, real tokens/s, MFU and peak memory at 8 and 16 rows per path: packed, packed with
#                     the fused head, packed_compiled, packed_compiled with the fused head, and padded (last: its
#                     figures are known from the earlier round); fused_vs_chunked per batch
#                                                                                           (limits 100 s, 135 s)
#   max_rows_1.5b.json
#                     the most rows one step fits at 1.5B, packed and compiled, the fused and the chunked head
#                                                                                                    (limit 90 s)
#   session.log       everything the stages printed, nvidia-smi and the versions first.
#
# Every figure is written as soon as it exists (each JSON is rewritten after every path and batch, every flex case,
# every probe), so a stage killed at its limit keeps what it finished. The limits add up to 475 s; typically less.
set -u
cd "$(dirname "$0")/.."
REHEARSE=0
if [ "${1:-}" = "--rehearse" ]; then
    REHEARSE=1
elif [ $# -gt 0 ]; then
    echo "usage: [OUT=dir] bash benchmarks/gpu_session.sh [--rehearse]" >&2
    exit 2
fi
if [ $REHEARSE = 1 ]; then
    # A CPU's rehearsal: the same stages at the tiny shape, slower limits, and never into results/ (its figures are
    # a CPU's at a toy size, not results).
    OUT=${OUT:-runs/gpu_session_rehearsal}
    case "$OUT" in results/*|*/results/*) echo "a rehearsal does not write into results/ (OUT=$OUT)" >&2; exit 2;; esac
    SHAPES=${LEARNER_GPU_SHAPES:-tiny}
    DEVICE=${LEARNER_GPU_DEVICE:-cpu}
    SCALE=${LEARNER_GPU_LIMIT_SCALE:-4}
    MAX_ROWS_CAP=${LEARNER_GPU_MAX_ROWS_CAP:-64}
    # Without the compiled paths unless asked (LEARNER_GPU_PATHS, LEARNER_GPU_MAX_ROWS_PATHS): on a CPU,
    # torch.compile's C++ builds take minutes even at the tiny shape, more than a stage's limit on a busy machine.
    DEFAULT_PATHS="packed packed_fused padded"
    DEFAULT_MAX_ROWS_PATHS="packed_fused packed"
else
    OUT=${OUT:-results/benchmarks/gpu_session}
    SHAPES=${LEARNER_GPU_SHAPES:-"0.5b 1.5b"}
    DEVICE=${LEARNER_GPU_DEVICE:-cuda}
    SCALE=${LEARNER_GPU_LIMIT_SCALE:-1}
    MAX_ROWS_CAP=${LEARNER_GPU_MAX_ROWS_CAP:-1024}
    # The paths the default is chosen among first (each chunked path beside its fused twin), padded last: its
    # figures at these shapes are known from the earlier round (results/benchmarks/learner_gpu_h200).
    DEFAULT_PATHS="packed packed_fused packed_compiled packed_compiled_fused padded"
    DEFAULT_MAX_ROWS_PATHS="packed_compiled_fused packed_compiled"
fi
CHECK_SHAPE=${LEARNER_GPU_CHECK_SHAPE:-${SHAPES%% *}}
LARGEST=${SHAPES##* }
ROWS=${LEARNER_GPU_ROWS:-"8 16"}
PATHS=${LEARNER_GPU_PATHS:-$DEFAULT_PATHS}
# The stages to run, in the order below. The default list is the first call's; a second call names what the first
# left unmeasured: check_compiled (--check with compiled layers against eager ones), head (the LM head alone at
# the 151,936 vocabulary, fused against chunked), flex_long (flex attention's rows longer than a block), repeat (the
# first shape's smaller batch again at 20 timed steps per path: padded, packed, packed_fused, default); confirm (the
# default path chosen from those figures against padding and the fused head, on another seed's batch).
STAGES=${LEARNER_GPU_STAGES:-"flex check learner max_rows"}
MAX_ROWS_PATHS=${LEARNER_GPU_MAX_ROWS_PATHS:-$DEFAULT_MAX_ROWS_PATHS}
# The project's .venv where there is one (a CPU's checkout), else the machine's python (a GPU machine's).
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || command -v python || command -v python3)}
mkdir -p "$OUT"
LOG="$OUT/session.log"
: > "$LOG"
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$LOG"; }

log "gpu_session: shapes '$SHAPES', rows '$ROWS', paths '$PATHS', device $DEVICE, out $OUT$([ $REHEARSE = 1 ] && echo ' (rehearsal)')"
{ nvidia-smi || true; "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, 'device', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu')"; } >> "$LOG" 2>&1

run() {  # run LIMIT_S NAME ARGS...: one stage under a time limit; its exit status logged, never fatal
    local limit=$(($1 * SCALE)) name=$2
    shift 2
    log "start $name (limit ${limit}s)"
    local t0=$SECONDS
    timeout --kill-after=10 "$limit" "$PY" benchmarks/learner_gpu.py --device "$DEVICE" "$@" >> "$LOG" 2>&1
    local rc=$?
    log "end $name: exit $rc after $((SECONDS - t0))s$([ $rc = 124 ] && echo ' (time limit: the JSON holds what it finished)')"
}

wants() { case " $STAGES " in *" $1 "*) return 0;; *) return 1;; esac; }

wants flex && run 90 flex --flex --shape "$CHECK_SHAPE" --out "$OUT/flex.json"
wants check && run 60 check --check --shape "$CHECK_SHAPE" --out "$OUT/check.json"
if wants learner; then
    for shape in $SHAPES; do
        # 2 warm-up + 5 timed steps per path and batch; a path's batch past 20 s of steps stops early. Each path is
        # prepared (compiled) once for all its batches.
        limit=100
        [ "$shape" = "$LARGEST" ] && [ "$shape" != "${SHAPES%% *}" ] && limit=135
        run "$limit" "learner $shape" --shape "$shape" --rows $ROWS --paths $PATHS \
            --warmup 2 --steps 5 --path-budget-s 20 --out "$OUT/learner_$shape.json"
    done
fi
# From the larger of the measured batches up, one step per probe, 30 s per path (the fused head first).
wants max_rows && run 90 "max rows $LARGEST" --max-rows --shape "$LARGEST" --rows "${ROWS##* }" --paths $MAX_ROWS_PATHS \
    --max-rows-cap "$MAX_ROWS_CAP" --max-rows-step 8 --path-budget-s 30 --out "$OUT/max_rows_$LARGEST.json"
# The second call's stages (not in the default list): what the first left unmeasured.
wants check_compiled && run 120 "check compiled" --check --check-compiled --shape "$CHECK_SHAPE" \
    --out "$OUT/check_compiled.json"
wants head && run 60 head --head --out "$OUT/head.json"
wants flex_long && run 90 "flex long" --flex --flex-cases long --shape "$CHECK_SHAPE" --out "$OUT/flex_long.json"
wants repeat && run 60 "repeat ${SHAPES%% *}" --shape "${SHAPES%% *}" --rows "${ROWS%% *}" \
    --paths padded packed packed_fused default --warmup 2 --steps 20 --path-budget-s 12 \
    --out "$OUT/repeat_${SHAPES%% *}.json"
# After the GPU default was chosen from the runs above: the default path against padding and the fused head on
# another seed's batch (a confirmation, run after the choice was committed), the smaller batch at each shape.
if wants confirm; then
    for shape in $SHAPES; do
        run 75 "confirm $shape" --shape "$shape" --rows "${ROWS%% *}" --seed 1 --paths padded default packed_fused \
            --warmup 2 --steps 10 --path-budget-s 12 --out "$OUT/confirm_$shape.json"
    done
fi
log "done: $(ls "$OUT" | tr '\n' ' ')"
