# Build, test and lint everystep.
#
#   make run        the example workflows on a worker (embedded SQLite)
#   make test       run the test suite once per database backend
#   make pyz        build dist/everystep.pyz (PYTHON=python3.13 for another interpreter)
#   make bench      the benchmark suite
#   make venv       create .venv and install the project with its dev extras
#   make lint       ruff
#   make clean      remove the virtualenv, build output and caches

SHELL := /bin/bash

# The virtualenv's interpreter: python3.12 when present, else python3.
VENV_PYTHON ?= $(shell scripts/find-python)
# The zipapp's interpreter: the one `./everystep.pyz` will run under.
PYTHON ?= python3
VENV := .venv
PYZ := dist/everystep.pyz
PYZ_SOURCES := pyproject.toml scripts/build-pyz scripts/pyz-main.py $(shell find everystep config runtime -type f -not -path '*/__pycache__/*')
BACKENDS ?= postgres mariadb sqlite pgbouncer
PYTEST_ARGS ?=

.PHONY: run venv test pyz bench lint clean

run: $(PYZ)
	exec scripts/run-example $(PYZ)

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@test -n "$(VENV_PYTHON)" || { echo "make: no suitable Python interpreter (see scripts/find-python)" >&2; exit 1; }
	rm -rf $(VENV)
	$(VENV_PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -e '.[dev,runtime]'
	touch $@

# `make pyz` always builds (PYTHON may name another interpreter); targets that
# only need a zipapp rebuild it when the sources changed.
pyz:
	scripts/build-pyz $(PYTHON) $(PYZ)

$(PYZ): $(PYZ_SOURCES)
	scripts/build-pyz $(PYTHON) $@

# The zipapp is built first: the suite runs it as a user would. The
# backends run side by side, and every one runs to its end even when another
# fails, so one run shows them all.
test: venv $(PYZ)
	scripts/install-test-deps
	scripts/test-backends $(VENV)/bin/pytest $(BACKENDS) -- $(PYTEST_ARGS)

# A throwaway PostgreSQL, MariaDB and PgBouncer, default durability; about 50 minutes.
# `make bench BENCH_ARGS=--quick` for a smoke run.
BENCH_ARGS ?=
bench: venv $(PYZ) .venv-bench-peers/.installed
	scripts/install-test-deps
	$(VENV)/bin/python -m bench $(BENCH_ARGS)

# The peers (DBOS Transact, Procrastinate) in a virtualenv of their own.
.venv-bench-peers/.installed: bench/requirements-peers.txt
	rm -rf .venv-bench-peers
	$(VENV_PYTHON) -m venv .venv-bench-peers
	.venv-bench-peers/bin/python -m pip install --quiet -r bench/requirements-peers.txt
	touch $@

lint: venv
	$(VENV)/bin/ruff check everystep config runtime tests bench examples scripts/pyz-main.py

clean:
	rm -rf $(VENV) .venv-bench-peers dist build *.egg-info .pytest_cache .ruff_cache .run
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
