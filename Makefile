# Each target creates .venv on first use and installs what it needs.
#
# On a machine whose nvidia-smi lists a GPU, the venv gets CUDA torch, triton and
# flash-linear-attention (the [gpu] extra) and the demo runs on the GPU. Elsewhere (CI included)
# it gets the CPU build of torch and never a CUDA one.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.minisgl-installed
NUM_GPUS := $(shell nvidia-smi -L 2>/dev/null | grep -c '^GPU')
# Where CUDA builds of torch come from; override for another CUDA version.
TORCH_CUDA_INDEX ?= https://download.pytorch.org/whl/cu128

ifeq ($(NUM_GPUS),0)
VENV_FLAGS :=
EXTRAS := test
# CPU torch from the local wheel when no torch is present; never a CUDA build.
INSTALL_TORCH := $(VPY) -c "import torch" 2>/dev/null || $(VPY) -m pip install -q torch==2.13.0
DEMO_DEVICE := cpu
else
# The machine's own CUDA torch and triton, where its Python has them, are used as they are.
VENV_FLAGS := --system-site-packages
EXTRAS := test,gpu
INSTALL_TORCH := $(VPY) -c "import torch; assert torch.cuda.is_available()" 2>/dev/null \
	|| $(VPY) -m pip install -q torch --index-url $(TORCH_CUDA_INDEX)
DEMO_DEVICE := cuda
endif
# AFD 2+2 takes a GPU per worker; with fewer than 4 GPUs its demo runs on the CPU.
AFD_DEVICE := $(if $(filter-out 0 1 2 3,$(NUM_GPUS)),cuda,cpu)

.PHONY: demo serve test install clean

$(STAMP): pyproject.toml
	test -x $(VPY) || $(PY) -m venv $(VENV_FLAGS) $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(INSTALL_TORCH)
	$(VPY) -m pip install -q -e ".[$(EXTRAS)]"
	touch $(STAMP)

install: $(STAMP)

# The embedded tiny model continues Python source; then the same model disaggregated (AFD 2+2) must
# give the colocated engine's tokens.
demo: $(STAMP)
	$(VPY) -m minisgl generate --prompt "    def close(self):" --prompt "def escape(s):" --max-tokens 32 --ignore-eos \
		--device $(DEMO_DEVICE)
	$(VPY) -m minisgl generate --prompt "    def __eq__(self, other):" --prompt "class Error(Exception):" \
		--max-tokens 32 --ignore-eos --dtype float32 --afd --afd-attn-workers 2 --afd-expert-workers 2 \
		--afd-num-mb 2 --check-colocated --device $(AFD_DEVICE)

# OpenAI-compatible server on 127.0.0.1:30000 (the embedded tiny model unless ARGS names one).
serve: $(STAMP)
	$(VPY) -m minisgl serve $(ARGS)

test: $(STAMP)
	OMP_NUM_THREADS=1 $(VPY) -m pytest -q tests

clean:
	rm -rf $(VENV)
