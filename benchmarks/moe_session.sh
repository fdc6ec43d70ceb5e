#!/usr/bin/env bash
# The fused MoE at prefill sizes (issue 18 item 2) in one bounded device call, ~5 minutes at most:
#   1. bench_prefill.py --moe-only (BENCH_S, default 150 s): the FP8 ceiling (_scaled_mm 8192^3), then
#      every MoE candidate (decode's kernels, with wider tiles, the large-M kernels) at T = 4096,
#      16384, 1024 (BENCH_ARGS="--moe-tokens ..." to change), uniform and skewed routing, with the
#      align; a table per case as it goes, the summary last, $OUT/bench_prefill.json after each case;
#   2. the MoE GPU tests (TESTS_S, default 150 s): both orientations against torch, the align,
#      graph replay, compile-once, and the stage-by-stage checks of tests/kernels/.
# Run from the repository root: OUT=/some/dir bash benchmarks/moe_session.sh. A stage's time 0 skips it.
set -u
source "$(dirname "$0")/session_lib.sh"
export OUT
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv | tee "$OUT/gpu.txt"
step moe_bench "${BENCH_S:-150}" python3 benchmarks/bench_prefill.py --moe-only --moe-tokens 4096,16384,1024 \
  ${BENCH_ARGS:-}
step moe_tests "${TESTS_S:-150}" python3 -m pytest -q -p no:cacheprovider --maxfail=25 \
  tests/gpu/test_moe_triton.py tests/kernels/test_moe_interpret.py
echo "================ summary ================"
grep -E "passed|failed|^FAILED|^ERROR" "$OUT/moe_tests.log" 2>/dev/null | tail -n 12
grep -E "^  MoE .*: [A-Za-z]*Error" "$OUT/moe_bench.log" 2>/dev/null | head -n 8  # candidates that failed
sed -n '/^### Summary/,$p' "$OUT/moe_bench.log" 2>/dev/null
