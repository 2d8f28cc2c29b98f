# The two commands a new user runs: `make up` (set up, run the stack on a simulated cluster) and `make test`.
# Everything is installed from the project's own files; Java 17, Maven, Go (>= 1.26) and a C compiler (pip builds
# schemas/_leanavro.c and processors/_window.c) are the only tools assumed.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed-stamp

.PHONY: up down status test lint setup bench fault fault-scale kube repeat

$(STAMP): pyproject.toml schemas/_leanavro.c schemas/_avroread.h processors/_window.c
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "gpuledger needs Python >= 3.11; run make PYTHON=python3.11 ...")'
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

# Starts the local stack in the background (first run also fetches the Kafka jars with Maven).
up: $(STAMP)
	$(VENV)/bin/gpuledger up

down: $(STAMP)
	$(VENV)/bin/gpuledger down

status: $(STAMP)
	$(VENV)/bin/gpuledger status

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# The local Kubernetes control plane of the tests (etcd, kube-apiserver, kubectl, Kueue), built from pinned
# Go modules into the user cache the first time only (~8 min on 2 cores; needs Go >= 1.26). KUBE_JOBS: how
# many packages compile at once, at low priority.
KUBE_JOBS ?= 2
kube: $(STAMP)
	$(VENV)/bin/gpuledger dev kube build --jobs $(KUBE_JOBS)

# Lint, types, then every test (unit and integration: the fixtures start a real broker, a real Kubernetes
# control plane and the Kueue controller, and a live one-node Slurm with accounting). The Slurm fixture runs as
# root (as CI does) and installs Debian's slurm-wlm, slurmdbd, munge, mariadb-server and slurm-client with
# apt-get the first time when they are missing (about a minute); not as root it names what to install.
# TEST_WORKERS: pytest-xdist workers (most tests wait on a broker, ClickHouse or an engine, so more workers than
# cores); each live engine's tests run on one worker, in order (tests/conftest.py).
TEST_WORKERS ?= 4
test: $(STAMP)
	$(VENV)/bin/gpuledger dev kube build --jobs $(KUBE_JOBS) --detach
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadgroup

# The fault injection suite (tests/fault, marker `fault`, excluded from `make test`): the real pipeline
# as processes (own broker, embedded ClickHouse, simulator, processors, sinks) under kill -9, broker
# restart, ClickHouse outage (GPULEDGER_FAULT_OUTAGE_S, default 60), duplicates and late events.
# FAULT_WORKERS: each fault module runs whole on one worker, with its own stack (tests/conftest.py).
FAULT_WORKERS ?= 2
fault: $(STAMP)
	$(VENV)/bin/pytest -n $(FAULT_WORKERS) --dist loadgroup -m fault tests/fault --durations=0

# The fault suite at scale (tests/fault/scale, marker `fault_scale`, excluded from `make test` and `make fault`):
# 10,000 GPUs replayed at 1 Hz on three brokers, three processes of each processor kind, under broker kills, two
# brokers down at once, a ClickHouse outage and a rolling restart; one stack, the scenarios one after another.
# -rP prints each scenario's figures (GPULEDGER_FAULT_SCALE_FIGURES=file.jsonl keeps them).
fault-scale: $(STAMP)
	$(VENV)/bin/pytest -n0 -m fault_scale tests/fault/scale --durations=0 -rP

# Runs a set of tests RUNS times, each on a clean state, and prints each test's pass rate and slowest run
# (tests/repeat.py): SET=live (the live Slurm and Kubernetes), faust (the agents on a real broker), fault.
SET ?= live
RUNS ?= 10
repeat: $(STAMP)
	$(VENV)/bin/python tests/repeat.py --set $(SET) --runs $(RUNS)

bench: $(STAMP)
	$(VENV)/bin/python bench/broker_startup.py
