#!/usr/bin/env bash
# One device call for the GPU checks and benchmarks still unmeasured, each bounded in time, with
# logs under $OUT as they go (a step that runs out of time still leaves what it printed).
set -u
export PYTHONPATH="$PWD/python:$PWD/benchmarks:${PYTHONPATH:-}"
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv | tee "$OUT/gpu.txt"
timeout "${GRAPHS_S:-100}" python3 -m pytest -q -m gpu tests/gpu/test_engine_graphs.py 2>&1 | tee "$OUT/graphs.log"
timeout "${SLICE_S:-100}" python3 benchmarks/bench_slice_vs_hf.py --json "$OUT/slice.json" 2>&1 | tee "$OUT/slice.log"
timeout "${DECODE_S:-200}" python3 benchmarks/bench_decode.py 2>&1 | tee "$OUT/decode.log"
