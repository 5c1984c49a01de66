# fp4jax developer commands. `make demo` and `make test` work on a fresh machine.
# Python: `make PYTHON=/path/to/python3` wins. Otherwise the newest pyenv 3.12.x (by
# version: 3.12.10 > 3.12.9), then the newest pyenv 3.13+, then python3.12/3.13/python3
# on PATH. 3.12 first: it is what the GPU machine runs (README, "Quick start").
PYENV_ROOT ?= $(shell pyenv root 2>/dev/null)
newest = $(shell ls -d $(PYENV_ROOT)/versions/$(1)/bin/python3 2>/dev/null | sort -V | tail -n 1)
ifeq ($(origin PYTHON),undefined)
PYTHON := $(if $(PYENV_ROOT),$(call newest,3.12.*))
PYTHON := $(or $(PYTHON),$(if $(PYENV_ROOT),$(call newest,3.1[3-9]*)))
PYTHON := $(or $(PYTHON),$(shell command -v python3.12 || command -v python3.13 || command -v python3))
endif
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup demo lint test test-gpu clean print-python

$(PY): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 12), f"Python >= 3.12 needed, got {sys.version}"'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@touch $(PY)

setup: $(PY)

demo: $(PY)
	$(PY) examples/demo.py

lint: $(PY)
	$(PY) -m ruff check .

test: lint
	$(PY) -m pytest -n 2 --dist worksteal fp4jax pallas_kernels tests

clean:
	rm -rf $(VENV) .pytest_cache

print-python:
	@echo $(PYTHON)
