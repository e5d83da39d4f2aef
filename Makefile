# The two commands a newcomer runs (see README): `make demo` and `make test`.
# Both work as root on a fresh Debian 12 machine with only Python installed: the harness
# installs the SLURM, MariaDB, munge and OpenSSH packages it needs.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
HARNESS := $(PYTHON) tests/cluster/harness.py

.PHONY: venv cluster-up cluster-down lint unit test demo clean

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

unit: venv
	$(BIN)/pytest tests/unit

test: venv lint cluster-up
	$(BIN)/pytest

demo: venv cluster-up
	$(BIN)/python tests/cluster/demo.py

clean: cluster-down
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
