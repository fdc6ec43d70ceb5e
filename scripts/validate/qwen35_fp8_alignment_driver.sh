#!/usr/bin/env bash
# Alignment driver: greedy completions from a minisgl candidate (colocated or AFD), scored
# teacher-forced by a reference, gated. The model presets beside it only set defaults.
#
#   1. the prompt pool (PROMPT_FILE, or generated: see ensure_pool in lib/common.sh)
#   2. sample: serve the candidate, take greedy completions, stop it      -> RUN_DIR/sample.json
#   3. score: start the reference (or use REFERENCE_URL), score, gate     -> RUN_DIR/alignment.json
# The candidate stops before the reference starts, so each may use every GPU.
#
# Knobs (environment):
#   MODEL_PATH          checkpoint directory (required)
#   CANDIDATE           server (default: `minisgl serve` started here) | url (CANDIDATE_URL, a
#                       server already running: minisgl, vLLM or SGLang)
#   AFD_ATTN_WORKERS    attention workers; 0 = colocated (default 0)
#   AFD_EXPERT_WORKERS, AFD_NUM_MB (1), AFD_PENDING_STEPS (2), AFD_DISPATCH_DTYPE (bf16),
#   AFD_ATTN_NODES, AFD_EXPERT_NODES   AFD topology and Ray placement
#   PROMPT_FILE | PROMPT_LEN (1024), NUM_PROMPTS (64), PROMPT_SEED (0), PROMPT_SOURCE_DIR
#   MAX_NEW_TOKENS (32), CONCURRENCY (8)
#   CONTEXT_LENGTH      the servers' max tokens per request (default PROMPT_LEN + MAX_NEW_TOKENS + 1:
#                       scoring a sequence at max_tokens 0 still leaves room for one token in vLLM)
#   EXTRA_SERVE_ARGS    more `minisgl serve` flags for the candidate (word-split)
#   REFERENCE           hf (default: transformers in process) | minisgl (colocated, started here)
#                       | vllm (`vllm serve`, started here; VLLM_ARGS word-split) | url (REFERENCE_URL)
#                       | none (sample only)
#   REFERENCE_MODEL_PATH  the reference's checkpoint (default MODEL_PATH)
#   MIN_TOP1 (0), MIN_TOP10 (1.0)   gates
#   CANDIDATE_PORT, REFERENCE_PORT  ports of the servers started here (default: free ones)
#   RUN_DIR             artifacts (default reports/align-DATE)
# Exit status: 0 pass, 1 a gate failed or a setup error, 2 the validator's usage/protocol error.
# shellcheck source=../lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/common.sh"

[[ -n ${MODEL_PATH:-} ]] || die "MODEL_PATH: set it to the checkpoint directory"
require_dir MODEL_PATH "$MODEL_PATH"
CANDIDATE=${CANDIDATE:-server}
AFD_ATTN_WORKERS=${AFD_ATTN_WORKERS:-0}
AFD_EXPERT_WORKERS=${AFD_EXPERT_WORKERS:-0}
AFD_NUM_MB=${AFD_NUM_MB:-1}
AFD_PENDING_STEPS=${AFD_PENDING_STEPS:-2}
AFD_DISPATCH_DTYPE=${AFD_DISPATCH_DTYPE:-bf16}
PROMPT_LEN=${PROMPT_LEN:-1024}
NUM_PROMPTS=${NUM_PROMPTS:-64}
MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-32}
CONCURRENCY=${CONCURRENCY:-8}
CONTEXT_LENGTH=${CONTEXT_LENGTH:-$((PROMPT_LEN + MAX_NEW_TOKENS + 1))}
REFERENCE=${REFERENCE:-hf}
REFERENCE_MODEL_PATH=${REFERENCE_MODEL_PATH:-$MODEL_PATH}
MIN_TOP1=${MIN_TOP1:-0}
MIN_TOP10=${MIN_TOP10:-1.0}
RUN_DIR=${RUN_DIR:-$(default_run_dir align)}
require_choice CANDIDATE "$CANDIDATE" server url
require_choice REFERENCE "$REFERENCE" hf minisgl vllm url none
if ((AFD_ATTN_WORKERS > 0 && AFD_EXPERT_WORKERS < 1)); then
  die "AFD_EXPERT_WORKERS must be >= 1 with AFD_ATTN_WORKERS=$AFD_ATTN_WORKERS"
fi

mkdir -p "$RUN_DIR"
pool=$(ensure_pool "$NUM_PROMPTS" "$PROMPT_LEN")
log "prompts $pool sha256 $(sha256sum "$pool" | cut -d' ' -f1)"
common=(--out "$RUN_DIR" --min-top1 "$MIN_TOP1" --min-top10 "$MIN_TOP10" --concurrency "$CONCURRENCY")
sample=(--stage sample --prompts "$pool" --num-prompts "$NUM_PROMPTS" --max-new-tokens "$MAX_NEW_TOKENS")

serve_flags=(--model-path "$MODEL_PATH" --context-length "$CONTEXT_LENGTH" --max-running-requests "$CONCURRENCY")
afd_serve_flags serve_flags
# shellcheck disable=SC2206 # EXTRA_SERVE_ARGS is a list of flags, split on whitespace
serve_flags+=(${EXTRA_SERVE_ARGS:-})

case $CANDIDATE in
  server)
    port=${CANDIDATE_PORT:-$(pick_port)}
    start_minisgl candidate "$port" "${serve_flags[@]}"
    run_validator "${sample[@]}" "${common[@]}" --candidate-url "http://127.0.0.1:$port"
    stop_server candidate
    ;;
  url) run_validator "${sample[@]}" "${common[@]}" --candidate-url "${CANDIDATE_URL:?CANDIDATE_URL: the candidate server}" ;;
esac

score=(--stage score "${common[@]}")
case $REFERENCE in
  hf) run_validator "${score[@]}" --reference hf --reference-model "$REFERENCE_MODEL_PATH" ;;
  minisgl | vllm)
    port=${REFERENCE_PORT:-$(pick_port)}
    if [[ $REFERENCE == minisgl ]]; then
      start_minisgl reference "$port" --model-path "$REFERENCE_MODEL_PATH" --context-length "$CONTEXT_LENGTH" \
        --max-running-requests "$CONCURRENCY"
    else
      # shellcheck disable=SC2086 # VLLM_ARGS is a list of flags, split on whitespace
      start_vllm reference "$port" "$REFERENCE_MODEL_PATH" --max-model-len "$CONTEXT_LENGTH" ${VLLM_ARGS:-}
    fi
    run_validator "${score[@]}" --reference-url "http://127.0.0.1:$port"
    ;;
  url) run_validator "${score[@]}" --reference-url "${REFERENCE_URL:?REFERENCE_URL: the reference server}" ;;
  none) log "samples in $RUN_DIR/sample.json (REFERENCE=none: not scored)" ;;
esac
