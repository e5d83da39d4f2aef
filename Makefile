# The two commands a newcomer runs (see README): `make demo` and `make test`.
# Both work as root on a fresh Debian 12 machine with only Python installed: the harness
# installs the SLURM, MariaDB, munge, OpenSSH, PostgreSQL and faketime packages it needs.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
HARNESS := $(PYTHON) tests/cluster/harness.py

.PHONY: venv cluster-up cluster-down lint docs unit test reliability demo bench clean

$(BIN)/.installed: pyproject.toml
	@$(PYTHON) -c 'import ensurepip' 2>/dev/null || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $@

venv: $(BIN)/.installed

cluster-up:
	$(HARNESS) up

cluster-down:
	$(HARNESS) down

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

docs: venv
	$(BIN)/mkdocs build --strict

unit: venv
	$(BIN)/pytest tests/unit

test: venv lint docs cluster-up
	$(BIN)/pytest

# RELIABILITY.md from the fault and security suites and the tests they cite, about 15 minutes
# (make test regenerates it too, from the same tests in its full run).
reliability: venv cluster-up
	$(BIN)/python tests/cluster/reliability_report.py

demo: venv cluster-up
	$(BIN)/python tests/cluster/demo.py

# Performance figures against same-run baselines (benchmarks/RESULTS.md); about 25 minutes on 2 cores, plus
# about 17 for restart.py (real triggerers SIGKILLed 5 times per mode at N = 1000).
# BENCH_RUN (the run's start, UTC) is exported once for the whole run: each script records it beside the
# commit it measured, and report.py labels every table that does not come from this run and commit.
bench: export BENCH_RUN := $(shell date -u +%Y-%m-%dT%H:%M:%SZ)
bench: venv cluster-up
	rm -rf "$${BENCH_OUT:-/tmp/tao-slurm-bench}"
	$(BIN)/python benchmarks/poller.py
	$(BIN)/python benchmarks/restart.py
	$(BIN)/python benchmarks/submit.py
	$(BIN)/python benchmarks/import_parse.py
	$(BIN)/python benchmarks/detect.py
	$(BIN)/python benchmarks/logs.py
	$(BIN)/python benchmarks/markers.py
	$(BIN)/python benchmarks/shared_streams.py
	$(BIN)/python benchmarks/storm.py
	$(BIN)/python benchmarks/report.py

clean: cluster-down
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site
