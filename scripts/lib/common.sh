# shellcheck shell=bash
# Shared shell entry points, sourced by every script under scripts/:
#   the repo root and Python environment, logging that dies with a message, minisgl (colocated or
#   AFD) and vLLM servers started in their own session and waited on /health with a timeout, the
#   prompt pool, and the alignment validator (whose failures propagate as non-zero exits).
set -euo pipefail

MINISGL_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# The repo's venv when there is one (`make install` creates it); MINISGL_PYTHON overrides.
if [[ -z ${MINISGL_PYTHON:-} ]]; then
  if [[ -x $MINISGL_ROOT/.venv/bin/python ]]; then MINISGL_PYTHON=$MINISGL_ROOT/.venv/bin/python; else MINISGL_PYTHON=python3; fi
fi
export MINISGL_ROOT MINISGL_PYTHON
case ":${PYTHONPATH:-}:" in
  *":$MINISGL_ROOT/python:"*) ;;
  *) export PYTHONPATH="$MINISGL_ROOT/python${PYTHONPATH:+:$PYTHONPATH}" ;;
esac
export PYTHONUNBUFFERED=1

STARTUP_TIMEOUT=${STARTUP_TIMEOUT:-1800} # seconds a server may take to load its model
STOP_TIMEOUT=${STOP_TIMEOUT:-30}         # seconds a server may take to exit after SIGTERM

log() { printf '[%s %s] %s\n' "$(date +%H:%M:%S)" "${0##*/}" "$*" >&2; }
notice() { log "notice: $*"; }
die() {
  log "error: $*"
  exit 1
}

# require_choice NAME VALUE ALLOWED...: die unless VALUE is one of ALLOWED.
require_choice() {
  local name=$1 value=$2 ok
  shift 2
  for ok in "$@"; do [[ $value == "$ok" ]] && return 0; done
  die "$name must be one of: $*; got '$value'"
}

require_dir() { [[ -d $2 ]] || die "$1=$2 is not a directory"; }

default_run_dir() { printf '%s/reports/%s-%s' "$MINISGL_ROOT" "$1" "$(date +%Y%m%d-%H%M%S)"; }

# --- servers ----------------------------------------------------------------------------------

declare -gA MINISGL_SERVER_PIDS=()
declare -gA MINISGL_SERVER_LOGS=()
declare -ga MINISGL_SERVE_WRAPPER=()

# http_status HOST PORT PATH: the HTTP status code of GET PATH, or nothing (bash's /dev/tcp: no curl needed).
http_status() {
  (
    exec 3<>"/dev/tcp/$1/$2" || exit 0
    printf 'GET %s HTTP/1.0\r\nHost: %s\r\n\r\n' "$3" "$1" >&3
    read -r -t 5 _ code _ <&3 && printf '%s' "$code"
  ) 2>/dev/null || true
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Below Linux's ephemeral range (32768-60999 by default): a port there can be taken by any process's
# outgoing connection between this check, which sees only listeners, and the server's bind (a CI run
# lost the alignment gate test to "Address already in use" on 52552).
pick_port() {
  local port _
  for _ in {1..50}; do
    port=$((20000 + RANDOM % 12768))
    port_in_use "$port" || {
      echo "$port"
      return 0
    }
  done
  die "found no free port"
}

# start_server NAME LOG CMD...: run CMD in its own session, so stop_server can end its whole tree.
start_server() {
  local name=$1 logfile=$2
  shift 2
  mkdir -p "$(dirname "$logfile")"
  setsid "$@" >"$logfile" 2>&1 &
  MINISGL_SERVER_PIDS[$name]=$!
  MINISGL_SERVER_LOGS[$name]=$logfile
  log "started $name (pid $!, log $logfile): $*"
}

# wait_health NAME PORT: until GET /health answers 200; dies with the log's tail if the server
# exits first or STARTUP_TIMEOUT passes.
wait_health() {
  local name=$1 port=$2 pid=${MINISGL_SERVER_PIDS[$1]} logfile=${MINISGL_SERVER_LOGS[$1]}
  local deadline=$((SECONDS + STARTUP_TIMEOUT))
  until [[ $(http_status 127.0.0.1 "$port" /health) == 200 ]]; do
    kill -0 "$pid" 2>/dev/null || die "$name exited before it was healthy; the end of $logfile:"$'\n'"$(tail -n 40 "$logfile")"
    ((SECONDS < deadline)) || die "$name not healthy after $STARTUP_TIMEOUT s; the end of $logfile:"$'\n'"$(tail -n 40 "$logfile")"
    sleep 0.2
  done
  log "$name is healthy on port $port"
}

# stop_server NAME: SIGTERM to its session (uvicorn and vLLM shut down gracefully on it; SIGINT
# would not do: background jobs of a script start with SIGINT ignored), SIGKILL to what is left
# after STOP_TIMEOUT.
stop_server() {
  local name=$1 pid=${MINISGL_SERVER_PIDS[$1]:-} i
  [[ -n $pid ]] || return 0
  unset "MINISGL_SERVER_PIDS[$name]"
  kill -TERM -- "-$pid" 2>/dev/null || true
  for ((i = 0; i < STOP_TIMEOUT * 5; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  kill -KILL -- "-$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  log "stopped $name"
}

stop_all_servers() {
  local name
  for name in "${!MINISGL_SERVER_PIDS[@]}"; do stop_server "$name"; done
}
trap stop_all_servers EXIT

# start_minisgl NAME PORT FLAGS...: `minisgl serve` on 127.0.0.1:PORT, waited on. A command in
# MINISGL_SERVE_WRAPPER (an array, e.g. nsys) runs the server under it.
start_minisgl() {
  local name=$1 port=$2
  shift 2
  start_server "$name" "$RUN_DIR/$name.log" "${MINISGL_SERVE_WRAPPER[@]}" \
    "$MINISGL_PYTHON" -m minisgl serve --host 127.0.0.1 --port "$port" "$@"
  wait_health "$name" "$port"
}

# start_vllm NAME PORT MODEL FLAGS...: `vllm serve` as a reference server.
start_vllm() {
  local name=$1 port=$2 model=$3
  shift 3
  command -v vllm >/dev/null || die "vllm is not installed here: give REFERENCE_URL of a running reference server instead"
  start_server "$name" "$RUN_DIR/$name.log" vllm serve "$model" --host 127.0.0.1 --port "$port" "$@"
  wait_health "$name" "$port"
}

# afd_serve_flags ARRAY: append the `minisgl serve` AFD flags from the AFD_* knobs (none when
# AFD_ATTN_WORKERS is 0: colocated). AFD_ATTN_NODES / AFD_EXPERT_NODES place the workers through Ray.
afd_serve_flags() {
  local -n _flags=$1
  ((${AFD_ATTN_WORKERS:-0} > 0)) || return 0
  _flags+=(--afd --afd-attn-workers "$AFD_ATTN_WORKERS" --afd-expert-workers "$AFD_EXPERT_WORKERS"
    --afd-num-mb "$AFD_NUM_MB" --afd-async-pending-steps "$AFD_PENDING_STEPS"
    --afd-dispatch-dtype "$AFD_DISPATCH_DTYPE")
  if [[ -n ${AFD_ATTN_NODES:-}${AFD_EXPERT_NODES:-} ]]; then
    [[ -n ${AFD_ATTN_NODES:-} && -n ${AFD_EXPERT_NODES:-} ]] ||
      die "set both AFD_ATTN_NODES and AFD_EXPERT_NODES (comma-separated node IPs) to place workers through Ray"
    _flags+=(--afd-launcher ray --afd-attn-nodes "$AFD_ATTN_NODES" --afd-expert-nodes "$AFD_EXPERT_NODES")
  fi
}

# --- prompts and the validator ------------------------------------------------------------------

# ensure_pool NUM LEN: print the prompt pool's path: PROMPT_FILE, or NUM prompts of LEN tokens cut
# from PROMPT_SOURCE_DIR (default: Python's standard library) with PROMPT_SEED (default 0), generated
# once with MODEL_PATH's tokenizer into POOL_DIR (default reports/pools).
ensure_pool() {
  local num=$1 len=$2 seed=${PROMPT_SEED:-0}
  if [[ -n ${PROMPT_FILE:-} ]]; then
    [[ -f $PROMPT_FILE ]] || die "PROMPT_FILE=$PROMPT_FILE does not exist"
    echo "$PROMPT_FILE"
    return 0
  fi
  [[ -d ${MODEL_PATH:-} ]] || die "MODEL_PATH=${MODEL_PATH:-} is not a directory: the prompt pool needs its tokenizer (or give PROMPT_FILE)"
  local src=${PROMPT_SOURCE_DIR:-$("$MINISGL_PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')}
  require_dir PROMPT_SOURCE_DIR "$src"
  local dir=${POOL_DIR:-$MINISGL_ROOT/reports/pools}
  mkdir -p "$dir"
  local out="$dir/pool-${MODEL_PATH##*/}-${src##*/}-n$num-l$len-seed$seed.jsonl"
  if [[ ! -f $out ]]; then
    "$MINISGL_PYTHON" "$MINISGL_ROOT/scripts/data_gen/generate_prompts.py" --tokenizer "$MODEL_PATH" \
      --source-dir "$src" --num-prompts "$num" --prompt-len "$len" --seed "$seed" --output "$out.partial" >&2
    mv "$out.partial" "$out"
  fi
  echo "$out"
}

# run_validator ARGS...: the alignment tool; exit 1 = a gate failed, 2 = a usage or protocol error.
run_validator() { "$MINISGL_PYTHON" -m minisgl.tools.align "$@"; }
