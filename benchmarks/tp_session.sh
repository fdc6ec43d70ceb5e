#!/usr/bin/env bash
# One device call (nvidia-h200-x8) for colocated tensor / expert parallelism with dummy weights:
# the 122B at TP 1/2/4/8 and the 397B at TP 8 and TP 8 + EP 8 (benchmarks/bench_tp.py), then the
# 2-GPU engine test. Each layout is bounded in time and logs under $OUT as it goes, so one that
# runs out of time still leaves what it printed and the next one runs. Skip one by setting its
# time to 0 (e.g. TP1_S=0). Run from the repository root:
#   OUT=out bash benchmarks/tp_session.sh
set -u
# shellcheck source=benchmarks/session_lib.sh
source "$(dirname "$0")/session_lib.sh"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee "$OUT/gpu.txt"
B122=${B122:-Qwen3.5-122B-A10B}
B397=${B397:-Qwen3.5-397B-A17B}
step test_tp_engine "${TEST_S:-60}" python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_tp_engine.py
step tp8_122b "${TP8_S:-85}" python3 benchmarks/bench_tp.py --model "$B122" --tp 8 --out "$OUT"
step tp4_122b "${TP4_S:-85}" python3 benchmarks/bench_tp.py --model "$B122" --tp 4 --out "$OUT"
step tp2_122b "${TP2_S:-85}" python3 benchmarks/bench_tp.py --model "$B122" --tp 2 --out "$OUT"
step tp1_122b "${TP1_S:-85}" python3 benchmarks/bench_tp.py --model "$B122" --tp 1 --out "$OUT"
step tp8_397b "${TP8_397_S:-95}" python3 benchmarks/bench_tp.py --model "$B397" --tp 8 --out "$OUT"
step ep8_397b "${EP8_397_S:-95}" python3 benchmarks/bench_tp.py --model "$B397" --tp 8 --ep 8 --out "$OUT"
exit 0
