# Two entry points for a new user: `make demo` and `make test`. Both create .venv first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint setup proto clean

$(STAMP): pyproject.toml
	$(PYTHON) -c 'import sys; sys.exit("pyshuffle needs Python >= 3.11, found " + sys.version.split()[0]) if sys.version_info < (3, 11) else None'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/pyshuffle demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: lint
	$(BIN)/pytest

proto: $(STAMP)
	$(BIN)/python scripts/generate_proto.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
