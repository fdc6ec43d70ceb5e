#!/usr/bin/env bash
# Prefill kernels (issue 18) in one bounded device call, ~6 minutes at most by default:
#   1. GPU tests of the kernels: FP8 linear backends and quantiser, fused MoE and align, compile-once;
#   2. the tiny FP8 model's teacher-forced agreement with the CPU reference;
#   3. bench_prefill.py kernels: the FP8 ceiling, quantiser, every projection backend, MoE stages;
#   4. bench_prefill.py model: 122B FP8 prefill steps (dummy weights, PREFILL_LAYERS layers) and the
#      decode check at B=32/64 in the same engine.
# Each stage runs under `timeout` with its log in $OUT/<stage>.log (what it printed survives a
# timeout); a failing stage is reported and the next one runs. Set a stage's time to 0 to skip it,
# e.g. TESTS_S=0. The summary comes last.
set -u
export PYTHONPATH="$PWD/python:$PWD/benchmarks:${PYTHONPATH:-}"
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}
mkdir -p "$OUT"
results=()
step() {  # step NAME SECONDS CMD...
  local name=$1 secs=$2
  shift 2
  [ "$secs" -gt 0 ] || return 0
  local start=$SECONDS
  timeout "$secs" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  local why=""
  [ "$rc" -eq 124 ] && why=" (out of time: ${secs} s)"
  results+=("$name: exit $rc$why, $((SECONDS - start)) s")
  echo "== $name: exit $rc$why, $((SECONDS - start)) s"
}
{
  nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} | tee "$OUT/gpu.txt"

step kernel_tests "${TESTS_S:-100}" python3 -m pytest -q -m gpu -p no:cacheprovider --maxfail=25 \
  tests/gpu/test_fp8_linear.py tests/gpu/test_moe_triton.py
step fp8_model_test "${MODEL_TEST_S:-60}" python3 -m pytest -q -m gpu -p no:cacheprovider -s \
  tests/gpu/test_fp8_model.py
mkdir -p "$OUT/kernels" "$OUT/model"
step bench_kernels "${KERNELS_S:-90}" env OUT="$OUT/kernels" python3 benchmarks/bench_prefill.py --skip-model \
  ${KERNELS_ARGS:-}
step bench_model "${PREFILL_S:-120}" env OUT="$OUT/model" python3 benchmarks/bench_prefill.py --skip-kernels \
  --layers "${PREFILL_LAYERS:-48}" ${MODEL_ARGS:-}

echo
echo "================ summary ================"
printf '%s\n' "${results[@]}"
for t in kernel_tests fp8_model_test; do
  [ -f "$OUT/$t.log" ] || continue
  echo "-- $t:"
  grep -E "^(FAILED|ERROR)|passed|failed|xfail|teacher-forced" "$OUT/$t.log" | tail -n 12
done
for b in bench_kernels bench_model; do
  [ -f "$OUT/$b.log" ] || continue
  echo "-- $b:"
  grep -E "^  .*: [A-Za-z]*Error" "$OUT/$b.log" | head -n 8  # candidates that failed
  sed -n '/^### Summary/,$p' "$OUT/$b.log"
done
