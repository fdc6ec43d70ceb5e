#!/usr/bin/env bash
# Qwen3.5-397B-A17B FP8, 8k-token prompts, global batch 320 (80 per attention GPU), two nodes:
# 4 attention + 4 expert workers. AFD_NUM_MB (1 or 2) is required; see the driver for every knob.
#   AFD_NUM_MB=2 QWEN35_DRY_RUN=1 ./run_afd_qwen35_397b_a17b_fp8_8k_b320_2node_mb2_nsys_alignment.sh
export QWEN35_MODEL=Qwen3.5-397B-A17B
export GLOBAL_BATCH=320
export MODEL_PATH=${MODEL_PATH:-/models/Qwen3.5-397B-A17B-FP8}
exec "$(dirname "${BASH_SOURCE[0]}")/afd_qwen35_fp8_notp_driver.sh" "$@"
