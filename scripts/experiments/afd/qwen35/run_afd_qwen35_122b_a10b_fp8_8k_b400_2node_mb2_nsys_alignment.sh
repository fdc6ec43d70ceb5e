#!/usr/bin/env bash
# Qwen3.5-122B-A10B FP8, 8k-token prompts, global batch 400 (100 per attention GPU), two nodes:
# 4 attention + 4 expert workers. The batch holds the same request memory per attention GPU as
# the 397B preset's 320 (docs/qwen35_presets.md). AFD_NUM_MB (1 or 2) is required; see the driver.
#   AFD_NUM_MB=2 QWEN35_DRY_RUN=1 ./run_afd_qwen35_122b_a10b_fp8_8k_b400_2node_mb2_nsys_alignment.sh
export QWEN35_MODEL=Qwen3.5-122B-A10B
export GLOBAL_BATCH=400
export MODEL_PATH=${MODEL_PATH:-/models/Qwen3.5-122B-A10B-FP8}
exec "$(dirname "${BASH_SOURCE[0]}")/afd_qwen35_fp8_notp_driver.sh" "$@"
