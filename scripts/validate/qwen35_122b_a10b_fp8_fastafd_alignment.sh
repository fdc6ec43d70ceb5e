#!/usr/bin/env bash
# Qwen3.5-122B-A10B FP8 alignment: AFD 2+2 with ping-pong and FP8 dispatch (the fast path)
# against a vLLM TP4 reference; 64 prompts of 1024 tokens, 256 greedy tokens each.
# Every default below is a knob of qwen35_fp8_alignment_driver.sh; set it to override.
export MODEL_PATH=${MODEL_PATH:-/models/Qwen3.5-122B-A10B-FP8}
export AFD_ATTN_WORKERS=${AFD_ATTN_WORKERS:-2} AFD_EXPERT_WORKERS=${AFD_EXPERT_WORKERS:-2}
export AFD_NUM_MB=${AFD_NUM_MB:-2} AFD_DISPATCH_DTYPE=${AFD_DISPATCH_DTYPE:-fp8}
export PROMPT_LEN=${PROMPT_LEN:-1024} NUM_PROMPTS=${NUM_PROMPTS:-64}
export MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-256} CONCURRENCY=${CONCURRENCY:-64}
export REFERENCE=${REFERENCE:-vllm} VLLM_ARGS=${VLLM_ARGS:---tensor-parallel-size 4}
exec "$(dirname "${BASH_SOURCE[0]}")/qwen35_fp8_alignment_driver.sh" "$@"
