# One entry point for developers and CI. `make demo` and `make test` are the
# two commands of the README; .ci/run calls `make test`.
CARGO ?= cargo

.PHONY: setup demo test lint unit python pytest fuzz-smoke bench device-binary chaos fuzz clean coverage

# The Python package lives in its own virtual environment.
PYTHON ?= python3
VENV := python/.venv
VPY := $(VENV)/bin/python

# Everything the project needs beyond a Rust toolchain, cmake and a C++
# compiler (libzmq is built from source by the zmq crate). The multi-host
# tests (crates/milonga-cli/tests/hosts.rs) need iproute2 and nftables, and
# root to make network namespaces (they fail without, unless
# MILONGA_SKIP_MULTIHOST=1); `discovery = etcd` is tested against Debian's
# etcd-server (crates/milonga-cli/tests/registry.rs starts its own).
setup:
	rustup component add rustfmt clippy
	@command -v ip >/dev/null && command -v nft >/dev/null && command -v etcd >/dev/null || \
		{ if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 nftables etcd-server; \
		else echo "setup: the multi-host tests need iproute2 and nftables (ip, nft), the etcd test etcd-server; install them as root"; fi; }

demo: setup
	$(CARGO) run --release -p milonga-cli -- demo

lint: setup
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps

unit:
	$(CARGO) test --workspace --exclude milonga-py

# Builds the Python package (maturin, release) and installs it with its test
# dependencies (pytest, pytest-timeout, mypy, pyzmq) from PyPI.
python:
	test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install --quiet --disable-pip-version-check "./python[test]"

# The stubs checked against the binary, the package type-checked, then the
# Python test suite (strict: warnings are errors, a timeout per test).
pytest: python
	cd python/tests && ../.venv/bin/python -m mypy.stubtest milonga._native
	cd python/tests && ../.venv/bin/python -m mypy --strict -p milonga
	cd python/tests && ../.venv/bin/python -m pytest

test: lint unit pytest

# Line coverage of the engine by its own unit tests (no sockets), the
# figure docs/internals.md quotes. Not part of `test`: it builds the crate
# again, instrumented, in target/coverage.
LLVM_BIN = $(shell rustc --print sysroot)/lib/rustlib/$(shell rustc -vV | sed -n 's/^host: //p')/bin
coverage:
	rustup component add llvm-tools-preview
	rm -rf target/coverage/prof && mkdir -p target/coverage/prof
	RUSTFLAGS="-C instrument-coverage" LLVM_PROFILE_FILE=$(CURDIR)/target/coverage/prof/%p-%m.profraw \
		$(CARGO) test -p milonga --lib --target-dir target/coverage engine::
	$(LLVM_BIN)/llvm-profdata merge -sparse target/coverage/prof/*.profraw -o target/coverage/engine.profdata
	$(LLVM_BIN)/llvm-cov report --ignore-filename-regex='milonga-wire|/(api|backend|session|discovery|model|util)/|\.cargo|rustc' \
		--instr-profile=target/coverage/engine.profdata \
		$$(ls -t target/coverage/debug/deps/milonga-* | grep -v '\.d$$' | head -1)

# The runs recorded in docs/benchmarks.md: throughput and latency on tcp and
# ipc, liveliness detection, call deadlines, discovery of 100 nodes, idle memory.
bench:
	$(CARGO) build --release -p milonga-cli
	./target/release/milonga bench pubsub --transport tcp --format csv
	./target/release/milonga bench pubsub --transport ipc --format csv
	./target/release/milonga bench latency --transport tcp --format csv
	./target/release/milonga bench latency --transport ipc --format csv
	./target/release/milonga bench liveliness --format csv
	./target/release/milonga bench deadlines --format csv
	./target/release/milonga bench rpc --transport tcp --format csv
	./target/release/milonga bench rpc --transport ipc --format csv
	./target/release/milonga bench discovery --nodes 100 --format csv
	./target/release/milonga bench discovery --hosts 4 --nodes 100 --format csv
	./target/release/milonga bench pubsub --hosts 2 --format csv
	./target/release/milonga bench latency --hosts 2 --format csv
	./target/release/milonga bench idle
	$(MAKE) python
	cd /tmp && $(CURDIR)/$(VPY) -m milonga.bench pubsub --format csv
	cd /tmp && $(CURDIR)/$(VPY) -m milonga.bench signals --format csv
	$(VPY) python/bench_memory.py

# A stripped release binary small enough to carry to a machine that cannot
# build, for tools/device-bench.sh (the scaling runs two cores cannot
# settle; docs/benchmarks.md).
device-binary:
	$(CARGO) build --release -p milonga-cli
	mkdir -p target/device
	strip -o target/device/milonga target/release/milonga

# The chaos suite (issue 10): a soak (MILONGA_CHAOS_MINUTES, default 2), 200
# publishers killed at once, a 15 s history-query flood. Minutes long, so not
# in `make test`; docs/guarantees.md records a run.
chaos:
	$(CARGO) test --release -p milonga-cli --test chaos -- --ignored --test-threads 1 --nocapture

# Needs a nightly toolchain and cargo-fuzz (see docs/fuzzing.md).
fuzz:
	cd fuzz && $(CARGO) +nightly fuzz run frame_decode corpus/frame_decode ../tests/vectors -- -max_total_time=600

clean:
	$(CARGO) clean
