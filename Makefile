# fp4jax developer commands. `make demo` and `make test` work on a fresh machine.
PYTHON ?= $(shell ls -d $$(pyenv root 2>/dev/null)/versions/3.1[2-9]*/bin/python3 2>/dev/null | tail -n 1)
ifeq ($(PYTHON),)
PYTHON := $(shell command -v python3.12 || command -v python3.13 || command -v python3)
endif
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup demo lint test test-gpu clean

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
	$(PY) -m pytest -n 2 fp4jax pallas_kernels tests

clean:
	rm -rf $(VENV) .pytest_cache
