# Slipstream: the two commands are `make run` and `make test`.
SHELL := /bin/bash
CARGO ?= cargo
PYTHON ?= python3
BIN := target/release/slipstream
# Embedded defaults for `make run`: memcached's, on loopback.
RUN_ARGS ?= -l 127.0.0.1 -p 11211 -U 11211 --admin 127.0.0.1:9180

.PHONY: all setup build run test lint test-rust test-py test-spark spark-build hbase-build hbase-run hbase-thrift-gen test-hbase-java spark-wordcount spark-changepoint spark-bench shuffle-bench pagerank-bench hbase-bench bench fuzz clean cluster

all: build

setup:
	@bash scripts/setup.sh

build: setup
	$(CARGO) build --release --workspace
	$(MAKE) spark-build
	$(MAKE) hbase-build

run: build
	$(BIN) serve $(RUN_ARGS)

# A 3-node cluster on loopback, tenants t0/t1/t2 replicated on all three with their preferred
# leaders on nodes 1/2/3 (scripts/cluster.sh: ports, data dir, Ctrl-C stops it).
cluster: setup
	$(CARGO) build --release -p slipstream
	bash scripts/cluster.sh

# The habits the workspace keeps (clippy.toml, [workspace.lints], rustfmt.toml): formatted,
# clippy-clean with warnings as errors.
lint: setup
	$(CARGO) fmt --all --check
	$(CARGO) clippy --release --workspace --all-targets -- -D warnings

test-rust: setup
	$(CARGO) build --release --workspace
	$(CARGO) test --release --workspace

test-py: build
	SLIPSTREAM_BIN=$(CURDIR)/$(BIN) $(PYTHON) -m pytest -q -p no:cacheprovider tests

# The Spark connector (connectors/spark): Java 17 + Maven; dependencies come from Maven Central
# into ~/.m2 on first use. Tests run against the daemon built above (SLIPSTREAM_BIN).
MVN ?= mvn -B -ntp
spark-build:
	cd connectors/spark && $(MVN) -q -DskipTests package

# The local-cluster tests start executor JVMs from a Spark installation: pip's pyspark==4.0.1
# (tests/requirements.txt, installed by scripts/setup.sh).
PYSPARK_HOME = $(shell $(PYTHON) -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))' 2>/dev/null)
test-spark: test-rust
	cd connectors/spark && SPARK_HOME=$(PYSPARK_HOME) SLIPSTREAM_BIN=$(CURDIR)/$(BIN) $(MVN) test

test: lint test-rust test-py test-spark test-hbase-java

# The sidecar's codec tests (JUnit, no HBase started; the end-to-end tests are tests/test_hbase.py).
test-hbase-java: setup
	cd connectors/hbase && $(MVN) -q test

# HBase (connectors/hbase): the sidecar + an in-process mini cluster, Java 17 + Maven (HBase 2.6.4
# from Maven Central into ~/.m2 on first use). tests/test_hbase.py (in test-py) needs this build.
hbase-build:
	cd connectors/hbase && $(MVN) -q -DskipTests package dependency:build-classpath -Dmdep.outputFile=target/classpath.txt

# A mini HBase (ZooKeeper + master + region server on the local filesystem, sidecar on 9091) and
# Slipstream's range cache in front of it: HBase's Thrift1 API on 127.0.0.1:9090. Ctrl-C stops both.
HBASE_RUN_DIR ?= $(CURDIR)/.work/hbase-run
hbase-run: build
	bash scripts/hbase-run.sh "$(HBASE_RUN_DIR)"

# Regenerate the Thrift1 code from crates/rangecache/idl/hbase1.thrift (needs thrift-compiler 0.17,
# Debian's package; not part of setup because the generated file is checked in).
hbase-thrift-gen:
	thrift --gen rs -out crates/rangecache/src/gen crates/rangecache/idl/hbase1.thrift
	bash crates/rangecache/idl/postprocess.sh crates/rangecache/src/gen/hbase1.rs

# Example jobs (local Spark, a daemon and `slipstream send`): see connectors/spark/examples.
spark-wordcount: build
	bash connectors/spark/examples/run.sh wordcount

spark-changepoint: build
	bash connectors/spark/examples/run.sh changepoint

# Slipstream-fed Spark vs plain Spark on raw UDP (bench/spark_bench.sh; about 10 minutes).
spark-bench: build
	bash bench/spark_bench.sh

# Spark's GroupBy with the built-in sort shuffle (defaults and tuned) vs SlipstreamShuffleManager
# on local-cluster[2,1,1024], 4M records, 8x8 and 200x200 tasks (bench/shuffle_bench.sh). Four
# warm-up rounds per manager and invocation: the executors' JIT compiles for ~4 rounds, and more
# of sort's stage than Slipstream's (docs/benchmarks.md, session 15). About 70–105 minutes on the
# loaded 2-core machine (session 12's 40–60 with one warm-up, x1.75); most of it the built-in
# shuffle at 200x200.
SHUFFLE_BENCH = SKIP_BUILD=1 RECORDS=4000000 SHAPES="8x8 200x200" WARMUPS=4 RUNS=3 bash bench/shuffle_bench.sh
shuffle-bench: build
	$(SHUFFLE_BENCH)

# GraphX PageRank, 10 iterations on a generated power-law graph, the same three managers and
# cluster, per-iteration time, ranks compared across managers (PAGERANK=1 bench/shuffle_bench.sh;
# about 8 minutes on the loaded 2-core machine).
PAGERANK_BENCH = SKIP_BUILD=1 PAGERANK=1 RUNS=3 bash bench/shuffle_bench.sh
pagerank-bench: build
	$(PAGERANK_BENCH)

# HBase range cache with the Rust load generator (bench/hbase_load_bench.py, about 2 minutes;
# bench/hbase_zipf_bench.py, Zipf scans with 5% writes over k-fold overlapping ranges, about 5;
# bench/hbase_observer_latency.py, a native client's Put without/with the observer in-JVM/over TCP,
# six fresh mini clusters, about 3, each run's Puts bounded to 60 s).
hbase-bench: build
	$(CARGO) build --release -p slipstream-rangecache --example thrift_load
	SLIPSTREAM_BIN=$(CURDIR)/target/release/slipstream python3 bench/hbase_load_bench.py
	SLIPSTREAM_BIN=$(CURDIR)/target/release/slipstream python3 bench/hbase_zipf_bench.py
	SLIPSTREAM_BIN=$(CURDIR)/target/release/slipstream ORDER=injvm,net,none,none,net,injvm N=2000 WARM=500 \
	  PUTS_S_MAX=60 OUT=$(CURDIR)/.work/hbase_observer_latency.json python3 bench/hbase_observer_latency.py

bench: build
	bash bench/kv_bench.sh
	python3 bench/mem_bench.py
	bash bench/xdp_bench.sh
	bash bench/tenant_bench.sh
	bash bench/stream_bench.sh
	bash bench/wordcount_xdpgen.sh
	bash bench/spark_bench.sh
	$(SHUFFLE_BENCH)
	$(PAGERANK_BENCH)
	python3 bench/shuffle_peer_bench.py
	python3 bench/shuffle_two_hosts_bench.py
	bash bench/stream_cpu.sh
	$(MAKE) hbase-bench
	bash bench/repl_soak.sh
	SLIPSTREAM_BIN=$(CURDIR)/target/release/slipstream python3 bench/failover_bench.py
	SLIPSTREAM_BIN=$(CURDIR)/target/release/slipstream python3 bench/isolation_bench.py
	# 0.33 core per node: at 0.5 the three nodes plus the clients ask for more than the 2 cores (docs/benchmarks.md, session 20)
	SLIPSTREAM_BIN=$(CURDIR)/target/release/slipstream BENCH=sets NODE_CPU=0.33 REPEATS=2 PNG=docs/img/repl_spread.png bash bench/repl_emulation_ab.sh

clean:
	$(CARGO) clean

# Coverage-guided fuzzing for longer runs (nightly toolchain + cargo-fuzz from crates.io).
FUZZ_SECONDS ?= 300
fuzz: setup
	@command -v cargo-fuzz >/dev/null || $(CARGO) install cargo-fuzz
	cd fuzz && $(CARGO) +nightly fuzz run executors -- -max_total_time=$(FUZZ_SECONDS) -max_len=4096
