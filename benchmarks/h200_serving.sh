#!/usr/bin/env bash
# One device call for the served system on one H200: the GPU tests of the warm start, then the
# end-to-end serving matrix (benchmarks/serve_matrix.py), each step bounded in time, logs under $OUT.
# Run from the repository root with the wheels of ../shared/device/fetch_wheels.sh carried as .whl:
#   TESTS_S=150 MATRIX=h200-122b MATRIX_S=420 bash benchmarks/h200_serving.sh [-- extra server flags]
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}  # kept: e.g. a directory holding deep_gemm
fi
export PYTHONPATH="$PWD/python:${PYTHONPATH:-}"
export PYTHONUNBUFFERED=1
step() {  # step NAME SECONDS CMD...: run CMD under a time limit, log to $OUT/NAME.log
  local name=$1 secs=$2
  shift 2
  [ "$secs" -gt 0 ] || return 0
  timeout "$secs" "$@" 2>&1 | tee "$OUT/$name.log" | tail -n 40
}
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv | tee "$OUT/gpu.txt"
step tests "${TESTS_S:-0}" python3 -m pytest -q -m gpu -p no:cacheprovider --maxfail=40 -rfE ${TESTS:-tests/gpu/test_warm_start.py}
[ "${MATRIX_S:-0}" -gt 0 ] && step "matrix_${MATRIX:-h200-122b}" "$MATRIX_S" \
  python3 benchmarks/serve_matrix.py --matrix "${MATRIX:-h200-122b}" --out "$OUT" ${ONLY:+--only "$ONLY"} "$@"
exit 0
