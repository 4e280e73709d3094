# runledger: `make demo` runs the main job, `make test` runs the tests. Both install what they need.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup browser demo test test-fast bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: setup
	$(BIN)/runledger demo

# Debian's chromium, for the report's screenshot test (installed when we may; else that test is skipped)
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
		apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1; } || \
		echo "chromium could not be installed: the report screenshot test will be skipped"

test: setup browser
	$(BIN)/python -m pytest -q

# the fast tier, for your own loop (the unit tests, about a minute on 2 cores): tests/conftest.py marks
# `slow` every test that starts a server, a process or a browser, trains or compiles JAX, itself or
# through its fixtures; `make test` runs them all
test-fast: setup
	$(BIN)/python -m pytest -q -x -m "not slow"

bench: setup
	$(BIN)/python -m bench.ingest

clean:
	rm -rf $(VENV) runledger-data
