# Build, test and lint everystep.
#
#   make venv       create .venv and install the project with its dev extras
#   make test       run the test suite once per database backend
#   make lint       ruff
#   make clean      remove the virtualenv, build output and caches

SHELL := /bin/bash

PYTHON ?= $(shell scripts/find-python)
VENV := .venv
BACKENDS ?= postgres mariadb sqlite
PYTEST_ARGS ?=

.PHONY: venv test lint clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@test -n "$(PYTHON)" || { echo "make: no suitable Python interpreter (see scripts/find-python)" >&2; exit 1; }
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -e '.[dev]'
	touch $@

# Every backend runs even when an earlier one fails, so one run shows them all.
test: venv
	scripts/install-test-deps
	@failed=0; summary=""; \
	for backend in $(BACKENDS); do \
		echo "=== backend: $$backend ==="; \
		if EVERYSTEP_TEST_DB=$$backend $(VENV)/bin/pytest $(PYTEST_ARGS); then \
			summary="$$summary$$backend: passed\n"; \
		else \
			summary="$$summary$$backend: FAILED (exit $$?)\n"; failed=1; \
		fi; \
	done; \
	echo "=== summary ==="; printf "$$summary"; \
	exit $$failed

lint: venv
	$(VENV)/bin/ruff check everystep config runtime tests bench examples

clean:
	rm -rf $(VENV) dist build *.egg-info .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

# --- To be added ---
# run:   start the standalone everystep runtime from the virtualenv.
# pyz:   build a self-contained zipapp with shiv (PYTHON=... picks the
#        interpreter, e.g. `make pyz PYTHON=$$(scripts/find-python 3.13)`).
# bench: run the benchmarks in bench/ and write results to bench/out/.
