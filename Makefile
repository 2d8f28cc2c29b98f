# The two commands a new user runs: `make up` (set up, run the stack on a simulated cluster) and `make test`.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed-stamp

.PHONY: up down status test lint setup

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

up: $(STAMP)
	$(VENV)/bin/gpuledger up

down: $(STAMP)
	$(VENV)/bin/gpuledger down

status: $(STAMP)
	$(VENV)/bin/gpuledger status

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/pytest
