# Slipstream: the two commands are `make run` and `make test`.
SHELL := /bin/bash
CARGO ?= cargo
PYTHON ?= python3
BIN := target/release/slipstream
# Embedded defaults for `make run`: memcached's, on loopback.
RUN_ARGS ?= -l 127.0.0.1 -p 11211 -U 11211 --admin 127.0.0.1:9180

.PHONY: all setup build run test test-rust test-py bench fuzz clean

all: build

setup:
	@bash scripts/setup.sh

build: setup
	$(CARGO) build --release --workspace

run: build
	$(BIN) serve $(RUN_ARGS)

test-rust: setup
	$(CARGO) build --release --workspace
	$(CARGO) test --release --workspace

test-py: build
	SLIPSTREAM_BIN=$(CURDIR)/$(BIN) $(PYTHON) -m pytest -q -p no:cacheprovider tests

test: test-rust test-py

bench: build
	bash bench/kv_bench.sh
	bash bench/xdp_bench.sh
	bash bench/tenant_bench.sh
	bash bench/stream_bench.sh

clean:
	$(CARGO) clean

# Coverage-guided fuzzing for longer runs (nightly toolchain + cargo-fuzz from crates.io).
FUZZ_SECONDS ?= 300
fuzz: setup
	@command -v cargo-fuzz >/dev/null || $(CARGO) install cargo-fuzz
	cd fuzz && $(CARGO) +nightly fuzz run executors -- -max_total_time=$(FUZZ_SECONDS) -max_len=4096
