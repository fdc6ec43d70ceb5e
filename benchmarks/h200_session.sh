#!/usr/bin/env bash
# One device call for the GPU checks and benchmarks that still need (re-)measuring, each bounded in
# time, with logs under $OUT as they go (a step that runs out of time still leaves what it printed).
# Steps can be skipped by setting their time to 0, e.g. DECODE_S=0.
set -u
# shellcheck source=benchmarks/session_lib.sh
source "$(dirname "$0")/session_lib.sh"
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv | tee "$OUT/gpu.txt"
step tests "${TESTS_S:-0}" python3 -m pytest -q -m gpu -p no:cacheprovider ${TESTS:-tests/gpu}
step moe "${MOE_S:-0}" python3 benchmarks/bench_moe.py ${MOE_ARGS:-}
step graphs "${GRAPHS_S:-100}" python3 -m pytest -q -m gpu tests/gpu/test_engine_graphs.py
step slice "${SLICE_S:-100}" python3 benchmarks/bench_slice_vs_hf.py --json "$OUT/slice.json"
step decode "${DECODE_S:-200}" python3 benchmarks/bench_decode.py
# Per-layer T_a(GDN), T_a(full) and T_e at real shapes for the layer-imbalance study (issue 8).
step layers_122b "${LAYERS_S:-0}" python3 benchmarks/bench_layer_times.py --model qwen35-122b --fp8 \
  --expert-workers 4 --batches 16,64,128 --out "$OUT/layer_times_122b.json"
step layers_397b "${LAYERS_S:-0}" python3 benchmarks/bench_layer_times.py --model qwen35-397b --fp8 \
  --expert-workers 4 --batches 16,64,128 --out "$OUT/layer_times_397b.json"
