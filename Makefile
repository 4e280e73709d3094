# runledger: `make demo` runs the main job, `make test` runs the tests. Both install what they need.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: setup
	$(BIN)/runledger demo

test: setup
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python bench/ingest.py

clean:
	rm -rf $(VENV) runledger-data
