#!/usr/bin/env bash
# AFD throughput driver for Qwen3.5 FP8, without tensor parallelism: 4 attention workers (DP 4,
# TP 1) and 4 expert workers (DP 4, EP 4), so a measured decode window holds no all-reduce.
# The presets beside it set QWEN35_MODEL, GLOBAL_BATCH and MODEL_PATH's default.
#
#   1. refuse what would make the measurement incomparable (see below)
#   2. derive every value (python -m minisgl.tools.preset); QWEN35_DRY_RUN=1 prints them and exits
#   3. serve the model (AFD, under nsys when NSYS=1), send the pool's GLOBAL_BATCH prompts at once,
#      greedy, OUTPUT_LEN tokens each                                     -> RUN_DIR/sample.json
#   4. RUN_VLLM_ALIGNMENT=1: score those completions with a reference     -> RUN_DIR/alignment.json
#
# Knobs (environment):
#   AFD_NUM_MB          required: 1 (serialized baseline) or 2 (ping-pong); no default
#   MODEL_PATH          checkpoint directory (its config.json replaces the public one)
#   AFD_ATTN_NODES, AFD_EXPERT_NODES   node IPs: place the workers through Ray (default: local)
#   AFD_PENDING_STEPS (2), AFD_DISPATCH_DTYPE (fp8)
#   INPUT_LEN (8192), OUTPUT_LEN (1024), MAX_BATCHED_TOKENS (16384, raised when too small)
#   PROMPT_FILE | PROMPT_SEED (0), PROMPT_SOURCE_DIR    the pool (GLOBAL_BATCH prompts of INPUT_LEN)
#   NSYS (0/1)          run the server under Nsight Systems (needs nsys on PATH)
#   PROFILE (off/torch) torch.profiler instead; both capture the profile window's steps
#   PROFILE_WARMUP (8), PROFILE_STEPS (64)
#   RUN_VLLM_ALIGNMENT (0/1)  REFERENCE_URL, or a `vllm serve` started here (VLLM_ARGS)
#   MIN_TOP1 (0), MIN_TOP10 (1.0), CANDIDATE_PORT, REFERENCE_PORT, RUN_DIR
# Refusals: AFD_NUM_MB missing or not 1/2; AFD_ATTN_WORKERS / AFD_EXPERT_WORKERS other than 4;
# NSYS=1 without nsys. AFD_TOTAL_NODES is ignored, with a notice.
# shellcheck source=../../../lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../../lib/common.sh"

: "${QWEN35_MODEL:?QWEN35_MODEL: run one of the presets beside this driver}"
: "${GLOBAL_BATCH:?GLOBAL_BATCH: run one of the presets beside this driver}"
FIXED_WORKERS=4

[[ -n ${AFD_NUM_MB:-} ]] || die "AFD_NUM_MB has no default: set 1 (serialized baseline) or 2 (ping-pong)"
require_choice AFD_NUM_MB "$AFD_NUM_MB" 1 2
for knob in AFD_ATTN_WORKERS AFD_EXPERT_WORKERS; do
  if [[ -n ${!knob:-} && ${!knob} != "$FIXED_WORKERS" ]]; then
    die "refusing $knob=${!knob}: this preset runs exactly $FIXED_WORKERS attention workers (DP $FIXED_WORKERS, TP 1)" \
      "and $FIXED_WORKERS expert workers (EP $FIXED_WORKERS), so the decode window has no tensor-parallel all-reduce"
  fi
done
if [[ -n ${AFD_TOTAL_NODES:-} ]]; then
  notice "AFD_TOTAL_NODES=$AFD_TOTAL_NODES is ignored: the topology is fixed at $FIXED_WORKERS + $FIXED_WORKERS workers;" \
    "place them with AFD_ATTN_NODES and AFD_EXPERT_NODES"
fi
NSYS=${NSYS:-0}
PROFILE=${PROFILE:-off}
RUN_VLLM_ALIGNMENT=${RUN_VLLM_ALIGNMENT:-0}
require_choice NSYS "$NSYS" 0 1
require_choice PROFILE "$PROFILE" off torch
require_choice RUN_VLLM_ALIGNMENT "$RUN_VLLM_ALIGNMENT" 0 1
if [[ $NSYS == 1 ]]; then
  command -v nsys >/dev/null || die "NSYS=1 needs Nsight Systems' nsys on PATH (or use PROFILE=torch)"
  [[ $PROFILE == off ]] || die "choose one profiler: NSYS=1 or PROFILE=torch"
  [[ -z ${AFD_ATTN_NODES:-}${AFD_EXPERT_NODES:-} ]] ||
    die "NSYS=1 wraps the server's local process tree, but AFD_ATTN_NODES/AFD_EXPERT_NODES run the workers as Ray actors: use PROFILE=torch"
  PROFILE=nsys
fi

AFD_ATTN_WORKERS=$FIXED_WORKERS
AFD_EXPERT_WORKERS=$FIXED_WORKERS
AFD_PENDING_STEPS=${AFD_PENDING_STEPS:-2}
AFD_DISPATCH_DTYPE=${AFD_DISPATCH_DTYPE:-fp8}
INPUT_LEN=${INPUT_LEN:-8192}
OUTPUT_LEN=${OUTPUT_LEN:-1024}
MAX_BATCHED_TOKENS=${MAX_BATCHED_TOKENS:-16384}
RUN_DIR=${RUN_DIR:-$(default_run_dir "afd-${QWEN35_MODEL}-b$GLOBAL_BATCH-mb$AFD_NUM_MB")}
launcher=local
[[ -z ${AFD_ATTN_NODES:-}${AFD_EXPERT_NODES:-} ]] || launcher="ray (attention ${AFD_ATTN_NODES:-?}; experts ${AFD_EXPERT_NODES:-?})"

pool=$(ensure_pool "$GLOBAL_BATCH" "$INPUT_LEN")
preset=(-m minisgl.tools.preset --model "$QWEN35_MODEL" --model-path "$MODEL_PATH" --global-batch "$GLOBAL_BATCH"
  --num-mb "$AFD_NUM_MB" --attn-workers "$AFD_ATTN_WORKERS" --expert-workers "$AFD_EXPERT_WORKERS"
  --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN" --max-batched-tokens "$MAX_BATCHED_TOKENS"
  --pending-steps "$AFD_PENDING_STEPS" --dispatch-dtype "$AFD_DISPATCH_DTYPE"
  --profile-warmup "${PROFILE_WARMUP:-8}" --profile-steps "${PROFILE_STEPS:-64}")
describe=("${preset[@]}" --launcher "$launcher" --profiler "$PROFILE" --prompts "$pool"
  --prompts-sha256 "$(sha256sum "$pool" | cut -d' ' -f1)" --run-dir "$RUN_DIR")
if [[ ${QWEN35_DRY_RUN:-0} == 1 ]]; then
  "$MINISGL_PYTHON" "${describe[@]}" --format text
  exit 0
fi
preset_shell=$("$MINISGL_PYTHON" "${describe[@]}" --format shell)
eval "$preset_shell"

[[ -d $MODEL_PATH ]] || die "MODEL_PATH=$MODEL_PATH is not a directory"
mkdir -p "$RUN_DIR"
"$MINISGL_PYTHON" "${describe[@]}" --format text | tee "$RUN_DIR/config.txt" >&2

serve_flags=(--model-path "$MODEL_PATH" --context-length "$PRESET_MAX_SEQ_LEN" --page-size "$PRESET_PAGE_SIZE"
  --max-running-requests "$PRESET_LANE_BATCH" --chunked-prefill-size "$INPUT_LEN"
  --max-prefill-tokens "$PRESET_MAX_BATCHED_TOKENS" --cuda-graph-max-bs "$PRESET_MB_BATCH")
afd_serve_flags serve_flags
# The workers profile steps [start, stop) when MINISGL_PROFILE is set; nsys records only that range.
if [[ $PROFILE != off ]]; then
  export MINISGL_PROFILE=$PROFILE MINISGL_PROFILE_STEPS="$PRESET_PROFILE_START:$PRESET_PROFILE_STOP"
  export MINISGL_PROFILE_DIR=$RUN_DIR/profile
  # shellcheck disable=SC2034 # start_minisgl runs the server under MINISGL_SERVE_WRAPPER
  [[ $PROFILE != nsys ]] || MINISGL_SERVE_WRAPPER=(nsys profile --output "$RUN_DIR/profile/minisgl" --force-overwrite true
    --trace "cuda,nvtx,osrt" --capture-range cudaProfilerApi --capture-range-end stop --trace-fork-before-exec true)
fi

port=${CANDIDATE_PORT:-$(pick_port)}
start_minisgl candidate "$port" "${serve_flags[@]}"
common=(--out "$RUN_DIR" --min-top1 "${MIN_TOP1:-0}" --min-top10 "${MIN_TOP10:-1.0}" --concurrency "$PRESET_GLOBAL_BATCH")
run_validator --stage sample "${common[@]}" --prompts "$pool" --num-prompts "$PRESET_GLOBAL_BATCH" \
  --max-new-tokens "$OUTPUT_LEN" --candidate-url "http://127.0.0.1:$port"
stop_server candidate

[[ $RUN_VLLM_ALIGNMENT == 1 ]] || exit 0
if [[ -n ${REFERENCE_URL:-} ]]; then
  run_validator --stage score "${common[@]}" --reference-url "$REFERENCE_URL"
else
  port=${REFERENCE_PORT:-$(pick_port)}
  # shellcheck disable=SC2086 # VLLM_ARGS is a list of flags, split on whitespace
  start_vllm reference "$port" "$MODEL_PATH" --max-model-len "$((PRESET_MAX_SEQ_LEN + 1))" \
    ${VLLM_ARGS:---tensor-parallel-size 8}
  run_validator --stage score "${common[@]}" --reference-url "http://127.0.0.1:$port"
fi
