# pagedkv — set-up and checks. `make test` and `make demo` work on a fresh clone.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# CPU build of torch (already on disk on our machines); users with a GPU keep their own build.
TORCH_PIN ?= torch==2.13.0

.PHONY: install test lint typecheck pytest crosshair bench fuzz verify demo clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q $(TORCH_PIN)
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check impl spec stateful tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/python -m pytest -q

crosshair: $(STAMP)
	$(BIN)/python -m pagedkv_spec.check

test: lint typecheck pytest crosshair

# CrossHair over every contract of the spec, with a deeper budget (CPU s per condition).
VERIFY_TIMEOUT ?= 60
verify: $(STAMP)
	$(BIN)/python -m pagedkv_spec.check --all --timeout $(VERIFY_TIMEOUT)

# A long fuzz campaign on all cores with a shared example database (see README).
DURATION ?= 10m
fuzz: $(STAMP)
	$(BIN)/python -m pagedkv_stateful.fuzz --duration $(DURATION)

bench: $(STAMP)
	$(BIN)/python -m pagedkv.bench

demo: $(STAMP)
	$(BIN)/python -m pagedkv simulate --preset overload

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis
