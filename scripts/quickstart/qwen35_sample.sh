#!/usr/bin/env bash
# Quickstart: serve a checkpoint with minisgl and sample greedy completions of a prompt set into
# reports/sample-DATE/sample.json (prompt ids, completion ids and text per prompt). Without
# MODEL_PATH it serves the embedded tiny model on the CPU.
#   MODEL_PATH=/models/Qwen3.5-122B-A10B-FP8 scripts/quickstart/qwen35_sample.sh
# Every default below is a knob of ../validate/qwen35_fp8_alignment_driver.sh (AFD_* for AFD).
# shellcheck source=../lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/common.sh"
MODEL_PATH=${MODEL_PATH:-$("$MINISGL_PYTHON" -c 'from minisgl.models.tiny.default import default_model_path as p; print(p())')}
export MODEL_PATH REFERENCE=${REFERENCE:-none}
export NUM_PROMPTS=${NUM_PROMPTS:-8} PROMPT_LEN=${PROMPT_LEN:-256} MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-64}
export RUN_DIR=${RUN_DIR:-$(default_run_dir sample)}
exec "$MINISGL_ROOT/scripts/validate/qwen35_fp8_alignment_driver.sh" "$@"
