#!/usr/bin/env bash
# Installs DeepGEMM (the `deep_gemm` package) into minisgl's Python for `--moe-backend deep_gemm`,
# the routed experts' FP8 GEMMs of prefill-sized steps on Hopper (python/minisgl/kernels/moe_deep_gemm.py).
# PyPI's deep-gemm is an incomplete source package; vLLM's wheel carries a built DeepGEMM
# (vllm/third_party/deep_gemm: its op library on torch's stable ABI and CUDA 13, with the headers it
# compiles each kernel from on first use). Only that directory is installed, as `deep_gemm`: not vLLM,
# and none of vLLM's pinned dependencies. Tested with torch 2.11 (CUDA 13.0) on an H100.
#   scripts/quickstart/install_deep_gemm.sh
# Knobs: VLLM_VERSION (0.34.0), MINISGL_PYTHON (the repo's .venv, else python3). At run time DeepGEMM
# compiles with the CUDA toolkit under CUDA_HOME (default /usr/local/cuda).
# shellcheck source=../lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/common.sh"
VLLM_VERSION=${VLLM_VERSION:-0.34.0}
download=$(mktemp -d)
trap 'rm -rf "$download"' EXIT
log "downloading vllm==$VLLM_VERSION (no dependencies) for its DeepGEMM"
"$MINISGL_PYTHON" -m pip download -q --no-deps -d "$download" "vllm==$VLLM_VERSION" || die "could not download vllm==$VLLM_VERSION"
"$MINISGL_PYTHON" - "$download" <<'PY' || die "could not install deep_gemm from the vllm wheel"
import glob, os, shutil, sys, sysconfig, zipfile

wheel = glob.glob(os.path.join(sys.argv[1], "vllm-*.whl"))[0]
prefix = "vllm/third_party/deep_gemm/"
target = os.path.join(sysconfig.get_paths()["purelib"], "deep_gemm")
shutil.rmtree(target, ignore_errors=True)
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.startswith(prefix) and not n.endswith("/")]
    if not names:
        sys.exit(f"{wheel} has no {prefix}")
    for name in names:
        path = os.path.join(target, name[len(prefix):])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with z.open(name) as src, open(path, "wb") as dst:
            shutil.copyfileobj(src, dst)
print(f"installed {len(names)} files into {target}")
PY
if "$MINISGL_PYTHON" -c 'import deep_gemm; print("deep_gemm", deep_gemm.__version__)'; then
  log "done: serve with --moe-backend deep_gemm"
else
  notice "deep_gemm is installed but does not import here: it needs CUDA 13's runtime and a CUDA torch"
fi
