# The README's two commands: `make train` (set up + run the default job) and `make test`.
# Also: `make check` (lint + unit tests), `make test-all` (with slow tests), lint, format, clean.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: setup train test check test-all lint format clean

$(STAMP): pyproject.toml setup.py
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q torch==2.13.0 -e ".[dev]"
	$(BIN)/python -m zero_lab.app.workloads.torch_extras
	touch $(STAMP)

setup: $(STAMP)

train: setup
	$(BIN)/python train.py

# The full suite, in layers: unit (no processes), dist (Gloo worlds), e2e (train.py runs). CI runs this.
# --dist loadfile: each test file on one worker, so a module's fixtures (an e2e module's train.py
# runs) are made once, not once per worker its tests were spread over.
test: setup
	$(BIN)/ruff check --output-format concise .
	$(BIN)/python -m pytest -n 3 --dist loadfile --durations=30

# The edit-test loop: lint + the unit layer (config tests included), well under a minute.
check: setup
	$(BIN)/ruff check --output-format concise .
	$(BIN)/python -m pytest tests/unit -q -n 2

test-all: setup
	$(BIN)/python -m pytest -m ""

lint: setup
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff format . && $(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) outputs/*/ .pytest_cache

# Benchmarks (docs/benchmarks.md). FairScale's OSS row needs fairscale 0.4.13, installed
# with --no-deps so pip leaves this torch alone (it runs with torch 2.13; see FIELD-NOTES).
# bench-quick: 99 s on 2 cores (`time python scripts/bench.py --quick`) (W=2, the strategies the targets compare).
.PHONY: bench-deps bench-quick
bench-deps: setup
	$(BIN)/pip install -q torch==2.13.0 -e ".[bench]"
	$(BIN)/pip install -q --no-deps fairscale==0.4.13

bench-quick: setup
	$(BIN)/python scripts/bench.py --quick
