# Sourced by the one-device-call session scripts: the environment they share and `step`, which runs
# one bounded step with its log under $OUT (a step that runs out of time still leaves what it printed).
export PYTHONPATH="$PWD/python:$PWD/benchmarks:${PYTHONPATH:-}"
export PYTHONUNBUFFERED=1
# NVLink multicast stays off on shared hosts (it can take the host's GPUs out of service).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-out}
mkdir -p "$OUT"
step() {  # step NAME SECONDS CMD...: run CMD under a time limit, log to $OUT/NAME.log; 0 seconds skips it
  local name=$1 secs=$2
  shift 2
  [ "$secs" -gt 0 ] || return 0
  timeout "$secs" "$@" 2>&1 | tee "$OUT/$name.log"
}
