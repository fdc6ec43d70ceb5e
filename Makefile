# Each target creates .venv on first use and installs what it needs.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.minisgl-installed

.PHONY: demo serve test install clean

$(STAMP): pyproject.toml
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	# CPU torch from the local wheel when no torch is present; never a CUDA build.
	$(VPY) -c "import torch" 2>/dev/null || $(VPY) -m pip install -q torch==2.13.0
	$(VPY) -m pip install -q -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

# The embedded tiny model continues Python source; then the same model disaggregated (AFD 2+2) must
# give the colocated engine's tokens.
demo: $(STAMP)
	$(VPY) -m minisgl generate --prompt "    def close(self):" --prompt "def escape(s):" --max-tokens 32 --ignore-eos
	$(VPY) -m minisgl generate --prompt "    def __eq__(self, other):" --prompt "class Error(Exception):" \
		--max-tokens 32 --ignore-eos --dtype float32 --afd --afd-attn-workers 2 --afd-expert-workers 2 \
		--afd-num-mb 2 --check-colocated

# OpenAI-compatible server on 127.0.0.1:30000 (the embedded tiny model unless ARGS names one).
serve: $(STAMP)
	$(VPY) -m minisgl serve $(ARGS)

test: $(STAMP)
	OMP_NUM_THREADS=1 $(VPY) -m pytest -q tests

clean:
	rm -rf $(VENV)
