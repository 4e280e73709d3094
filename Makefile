# runledger: `make demo` runs the main job, `make test` runs the tests. Both install what they need.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# the integrations' tests train on the CPU: torch's CPU build, from a local wheel folder where pip's find-links
# ($$PIP_FIND_LINKS, else /opt/wheels where it is there) holds one, else from PyTorch's CPU index (PyPI's Linux
# torch is the multi-GB CUDA build)
TORCH := 2.13.0
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
TORCH_WHEELS := $(firstword $(PIP_FIND_LINKS) $(wildcard /opt/wheels))

.PHONY: setup browser postgres s3 oracle demo lint test test-fast bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==$(TORCH) $(if $(TORCH_WHEELS),--find-links $(TORCH_WHEELS),--index-url $(TORCH_CPU_INDEX))
	$(BIN)/python -m pip install --quiet -e '.[train,lineage,dev,integrations,attest]'
	touch $(STAMP)

demo: setup
	$(BIN)/runledger demo

# Debian's chromium and its driver, for the report's and the dashboard's browser tests (installed when we may;
# else those tests are skipped)
browser:
	@{ command -v chromium && command -v chromedriver; } >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
		apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1; } || \
		echo "chromium could not be installed: the browser tests will be skipped"

# Debian's PostgreSQL server, for the shared-catalog tests (they start their own server in a temp dir)
postgres:
	@ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
		apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null 2>&1; } || \
		echo "postgresql could not be installed: the shared-catalog tests will be skipped"

# OpenStack Swift with its S3 API, for the tests of a warehouse on object storage (tests/support/s3.py starts it on
# loopback in a temp dir); in a virtual environment of its own, as eventlet monkey-patches what imports it. Its
# erasure-code library comes as a wheel (pyeclib); else those tests are skipped
s3:
	@test -x .venv-s3/bin/swift-proxy-server || { $(PY) -m venv .venv-s3 && .venv-s3/bin/python -m pip install --quiet swift; } >/dev/null 2>&1 || \
		echo "swift could not be installed: the S3 warehouse tests will be skipped"

# a reader written elsewhere checks the transparency log (dev only, not part of `make test`, which skips it without
# Go): tests/oracle/tlogcheck, built offline on the Go checksum database's own code (Debian's Go and its
# golang.org/x/mod: sumdb/tlog, sumdb/note), reads a log the ledger wrote, checks its proofs, refuses tampering
oracle: setup
	@{ command -v go && test -f /usr/share/gocode/src/golang.org/x/mod/sumdb/tlog/tile.go; } >/dev/null 2>&1 || \
		{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && apt-get update -qq >/dev/null 2>&1 && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq golang-go golang-golang-x-mod-dev >/dev/null 2>&1; } || \
		{ echo "golang-go and golang-golang-x-mod-dev could not be installed (apt-get as root)"; exit 1; }
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/integration/test_tlog_oracle.py

# the linter (ruff; its rules in pyproject.toml): `make test` and `make test-fast` run it first
lint: setup
	$(BIN)/ruff check .

# every tier in 2 pytest-xdist workers, a test file to a worker (its module fixtures start once)
test: lint browser postgres s3
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

# the fast tier, for your own loop: the linter, then tests/unit (no server, process, browser or JAX
# program: tests/unit/conftest.py refuses them) but the slowest unit files (marked slow) in 2 pytest-xdist
# workers, each property test at a tenth of its examples; `make test` runs every tier (unit, integration,
# attacks, e2e), slow files included, at full counts
test-fast: lint
	RUNLEDGER_TESTS_FAST=1 $(BIN)/python -m pytest -q -x -n 2 -m "not slow" tests/unit

bench: setup
	$(BIN)/python -m bench.ingest

clean:
	rm -rf $(VENV) .venv-s3 runledger-data
