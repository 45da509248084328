# cronlog: `make run` starts everything on this machine; `make test` proves it works.
# Both install what they need (a venv, the Kafka jars, PostgreSQL) and reuse it next time.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: help venv stack topics nettools sandbox run test test-secure lint format bench bench-full chaos soak upgrade-test fuzz sim clean

help:
	@echo "make run    - install, start Kafka + PostgreSQL, then everything of cronlog with a demo"
	@echo "make test   - the same set-up, then the whole test suite"
	@echo "make test-secure - the suite's core over SASL_SSL, a Kafka user per role, ACLs enforced"
	@echo "make lint   - ruff (lint + format check) and mypy"
	@echo "make bench  - benchmarks"
	@echo "make chaos  - long fault scenarios (every node down for 20 minutes; 10 minutes of random faults on 3 brokers)"
	@echo "make soak   - a million firings on a private 3-broker cluster under a nemesis (SOAK_ARGS=--quick: ~50,000)"
	@echo "make upgrade-test - the previous release's processes replaced one by one with this one's, under load"
	@echo "make sim    - the seeded simulations at volume on every core (CRONLOG_SIM_SEEDS, CRONLOG_LOG_SIM_SEEDS)"
	@echo "make fuzz   - 10,000 generated bad records on each topic the system reads, 10,000 requests per API operation"
	@echo "make clean  - stop the stack, remove the venv and the state folder"

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "cronlog needs Python >= 3.11 (found $$($(PYTHON) --version))"; exit 1; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

# The network-fault tests (tests/support/netns.py) run processes in network namespaces
# of their own: root, iproute2 and, for one-way loss, nftables (Debian's package).
nettools:
	@if [ "$$(id -u)" = 0 ] && ! command -v nft >/dev/null; then \
		apt-get install -y -qq nftables >/dev/null 2>&1 || \
		{ apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq nftables >/dev/null 2>&1; } || \
		echo "nftables could not be installed: the one-way network faults of make chaos will fail"; \
	fi

# bubblewrap hides a worker's files from jobs of its own user (connectors/worker/confine.py).
sandbox:
	@if [ "$$(id -u)" = 0 ] && ! command -v bwrap >/dev/null; then \
		apt-get install -y -qq bubblewrap >/dev/null 2>&1 || \
		{ apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq bubblewrap >/dev/null 2>&1; } || \
		echo "bubblewrap could not be installed: the confinement tests will be skipped"; \
	fi

stack: venv
	$(BIN)/cronlog stack up

topics: stack
	$(BIN)/cronlog topics create
	$(BIN)/cronlog db migrate

# Starts the stack, creates topics and tables, then supervises a node, two
# workers, the projector and the API in the foreground, with the demo jobs.
run: venv
	$(BIN)/cronlog run

# The whole suite, by tier (a test's folder): tests/unit (pure: CPU only, no clock,
# process or service) runs niced in the background on the cycles the others leave idle;
# tests/integration (the real broker and PostgreSQL) and tests/processes (real processes
# and clocks) in the foreground; either failing fails the target. With PYTEST_ARGS, one
# plain pytest run.

test: topics nettools sandbox
ifeq ($(strip $(PYTEST_ARGS)),)
	@mkdir -p .state; \
	nice -n 19 $(BIN)/python -m pytest -p no:cacheprovider tests/unit \
		> .state/unit-tests.out 2>&1 & unit=$$!; \
	$(BIN)/python -m pytest tests/integration tests/processes; fg=$$?; \
	wait $$unit; bg=$$?; \
	echo "== the pure unit tests (run niced, in the background):"; \
	cat .state/unit-tests.out; \
	test $$fg -eq 0 && test $$bg -eq 0
else
	$(BIN)/python -m pytest $(PYTEST_ARGS)
endif

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: venv
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# Quick sizes (about 30 minutes in all, the real-process scenarios included); bench-full runs the design's sizes.
bench: topics
	$(BIN)/python -m bench.ledger --jobs 5000
	$(BIN)/python -m bench.burst --quick --executor noop
	$(BIN)/python -m bench.burst --quick --executor noop --lead-s 0
	$(BIN)/python -m bench.spawn --quick
	$(BIN)/python -m bench.burst --quick --executor process --command sh
	$(BIN)/python -m bench.realjobs --quick
	$(BIN)/python -m bench.realjobs --quick --kill-worker-at 30
	$(BIN)/python -m bench.realjobs --quick --rates 100,250,400 --compare-noop
	$(BIN)/python -m bench.sustained --quick
	$(BIN)/python -m bench.costs --quick
	$(BIN)/python -m bench.ingress --quick
	$(BIN)/python -m bench.registry --quick
	$(BIN)/python -m bench.restore --quick
	$(BIN)/python -m bench.failover --quick
	$(BIN)/python -m bench.projector --quick
	$(BIN)/python -m bench.prune --quick
	$(BIN)/python -m bench.detector --seconds 30 --workers 4
	$(BIN)/python -m bench.outage --quick
	$(BIN)/python -m bench.fairness --quick

bench-full: topics
	$(BIN)/python -m bench.ledger --jobs 50000
	$(BIN)/python -m bench.burst --executor noop --schedule cron
	$(BIN)/python -m bench.burst --executor noop --schedule cron --spread-s 60
	$(BIN)/python -m bench.burst --executor noop --lead-s 0
	$(BIN)/python -m bench.spawn
	$(BIN)/python -m bench.burst --jobs 10000 --executor process --command sh
	$(BIN)/python -m bench.realjobs
	$(BIN)/python -m bench.realjobs --kill-worker-at 120
	$(BIN)/python -m bench.realjobs --rates 100,250,400,600 --compare-noop
	$(BIN)/python -m bench.sustained --rates 1000 --step-s 300
	$(BIN)/python -m bench.sustained
	$(BIN)/python -m bench.registry --ledgers 2
	$(BIN)/python -m bench.registry --ledgers 1
	$(BIN)/python -m bench.restore --jobs 100000 --versions 1,5
	$(BIN)/python -m bench.costs --nodes 1
	$(BIN)/python -m bench.costs --nodes 2
	$(BIN)/python -m bench.costs --nodes 4
	$(BIN)/python -m bench.failover
	$(BIN)/python -m bench.projector
	$(BIN)/python -m bench.prune
	$(BIN)/python -m bench.detector --seconds 60 --workers 4
	$(BIN)/python -m bench.fairness

# A million firings (SOAK_ARGS=--quick: about 50,000) of a mixed load on a private
# three-broker cluster and a private PostgreSQL, every process with default options, one
# random fault at a time (bench/soak.py); then every check and the price of each fault kind.
SOAK_ARGS ?=
soak: topics nettools sandbox
	$(BIN)/python -m bench.soak $(SOAK_ARGS)

# A rolling upgrade under load (bench/upgrade.py): the previous release (the commit before
# the newest schema change, or UPGRADE_ARGS=--from REF) built into a venv of its own, its
# processes replaced one at a time with this checkout's; 0 violations, the audit clean.
UPGRADE_ARGS ?=
upgrade-test: topics
	$(BIN)/python -m bench.upgrade $(UPGRADE_ARGS)

# Long fault scenarios (about 40 minutes, most of it waiting): 2,000 jobs every second,
# every node killed for 20 minutes and restarted. The ledger must work through
# the catch-up in bounded transactions without a failure, and the audit must be clean.
# Then 10 minutes of random faults (brokers, nodes, ledgers, workers, the projector) on a
# private three-broker cluster: no duplicate, no missed firing, every run final.
# 10,000 generated bad records on each topic the system reads, and FUZZ_API_N requests
# per API operation generated from its OpenAPI (the suite runs 200 per topic and 25 per
# operation: tests/integration/test_fuzz_topics.py, test_fuzz_api.py), and owner inputs whose
# outputs pass the limits once substituted (test_fuzz_owner_limits.py: 50 of each kind a
# partition; 1 in the suite): no partition stalled, no process dead.
FUZZ_API_N ?= 10000
fuzz: topics
	CRONLOG_FUZZ_N=10000 CRONLOG_FUZZ_API_N=$(FUZZ_API_N) $(BIN)/python -m pytest $(PYTEST_ARGS) -s \
		tests/integration/test_fuzz_topics.py tests/integration/test_fuzz_api.py \
		tests/integration/test_fuzz_owner_limits.py

# The seeded simulations (tests/unit/test_simulation.py, test_simulation_log.py) at
# volume, in parallel on the machine's cores: seeds/s, the failing seeds, the total time.
# Pure, no services. `make test` runs a few hundred of them; this runs thousands.
CRONLOG_SIM_SEEDS ?= 2000
CRONLOG_LOG_SIM_SEEDS ?= 50
sim: venv
	$(BIN)/python -m bench.sim --seeds $(CRONLOG_SIM_SEEDS) --loop-seeds $(CRONLOG_LOG_SIM_SEEDS)

chaos: topics nettools
	CRONLOG_LONG_TESTS=1 $(BIN)/python -m pytest $(PYTEST_ARGS) \
		tests/integration/test_broker_outage.py tests/integration/test_cluster_failover.py \
		tests/integration/test_production_faults.py tests/integration/test_network_faults.py \
		tests/integration/test_cluster_outage.py
	$(BIN)/python -m bench.outage --jobs 2000 --outage-s 1200
	$(BIN)/python -m bench.chaos --duration-s 600

# The suite's core (registration to succeeded run, failover, the API, workers, ingress)
# on a private secured broker: SASL_SSL, a SCRAM user per role with only its ACLs
# (connectors/stack/acls.py), every process with its role's credentials. `make test`
# runs tests/integration/test_secure.py, the short version.
test-secure: topics
	CRONLOG_TEST_SECURE=1 $(BIN)/python -m pytest $(PYTEST_ARGS) \
		tests/integration/test_failover.py tests/integration/test_api.py \
		tests/integration/test_workers.py tests/integration/test_ingress.py \
		tests/integration/test_dependencies.py

clean:
	-@test -x $(BIN)/cronlog && $(BIN)/cronlog stack down
	rm -rf $(VENV) .state .mypy_cache .ruff_cache .pytest_cache .hypothesis *.egg-info
