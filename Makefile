# plusfs: `make demo` and `make test` on a fresh Debian machine.
#
# Builds link Debian's librocksdb-dev (seconds). `make build BUNDLED_ROCKSDB=1` compiles the
# bundled RocksDB instead (20-30 minutes on two cores). Build output goes outside the clone.

SHELL := /bin/bash
.DEFAULT_GOAL := build

export CARGO_TARGET_DIR ?= $(HOME)/.cache/plusfs/target
ifeq ($(BUNDLED_ROCKSDB),1)
CARGO_FEATURES := --features plusfs-store/bundled-rocksdb
APT_PACKAGES := libclang-dev clang pkg-config openmpi-bin libopenmpi-dev python3-venv fuse3 iproute2 nftables acl rsync
else
export ROCKSDB_LIB_DIR ?= /usr/lib/$(shell gcc -dumpmachine 2>/dev/null || echo x86_64-linux-gnu)
APT_PACKAGES := librocksdb-dev libclang-dev clang pkg-config openmpi-bin libopenmpi-dev python3-venv fuse3 iproute2 nftables acl rsync
endif
CARGO ?= cargo
BIN := $(CARGO_TARGET_DIR)/release/plusfs

PYTHON ?= python3
VENV := .venv

## soak: many more seeded fault schedules on the in-process cluster (PLUSFS_SCHEDULES, default 20000)
SOAK_SCHEDULES ?= 20000

.PHONY: deps build demo test lint unit check-broken soak ctest pytest pymodule venv-base bench bench-hugedirs bench-mount bench-transport test-uring bench-bfo bench-cp bench-cx bench-deleg bench-io bench-network bench-model bench-replica bench-security bench-elastic bench-identity bench-bigdir bench-acl bench-quota venv clean

## deps: install missing system packages (apt-get when root, else print the command)
deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	  else \
	    echo "missing packages:$$missing"; echo "run: sudo apt-get install -y$$missing"; exit 1; \
	  fi; \
	fi
	@command -v $(CARGO) >/dev/null || { echo "cargo not found: install Rust with rustup (https://rustup.rs)"; exit 1; }

## build: release binary $(BIN)
build: deps
	$(CARGO) build --release --workspace --exclude plusfs-tests --exclude plusfs-testcluster $(CARGO_FEATURES)  # no failpoints

## demo: 4-server local cluster, a small tree, bench, status, fsck, cluster down
demo: build
	PLUSFS=$(BIN) scripts/demo.sh

## test: formatting, lints, unit tests, multi-process cluster tests, C tests, Python tests
test: deps lint unit ctest pytest

lint: venv-base
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets $(CARGO_FEATURES) -- -D warnings
	$(CARGO) clippy -p plusfs -p plusfs-server $(CARGO_FEATURES) -- -D warnings  # as released: no failpoints
	$(VENV)/bin/ruff check python scripts tests/py
	$(PYTHON) scripts/modgraph.py

## pymodule: the `plusfs` Python module (PyO3), built with maturin into the venv
pymodule: venv-base
	VIRTUAL_ENV=$(CURDIR)/$(VENV) $(VENV)/bin/maturin develop --quiet -m crates/py/Cargo.toml

## pytest: DMetabench tests, incl. its plusfs plugins on a local cluster, and tests/py (files
## of 0 B to past 4 GiB through the Python module, libplusfs and a mount)
## (pytest's exit code 5, no test collected, fails the target too)
pytest: venv
	$(CARGO) build -p plusfs -p plusfs-ffi $(CARGO_FEATURES)
	cd python/dmetabench && PLUSFS_BIN=$(CARGO_TARGET_DIR)/debug/plusfs ../../$(VENV)/bin/python -m pytest -q
	PLUSFS_BIN=$(CARGO_TARGET_DIR)/debug/plusfs PLUSFS_LIB=$(CARGO_TARGET_DIR)/debug/libplusfs.so \
	  $(VENV)/bin/python -m pytest -q tests/py

## check-broken: the history checker against a deliberately broken build (a cut-off leader
## that keeps serving reads): it must report the stale read (about 8 minutes; root)
check-broken:
	$(CARGO) test -p plusfs-tests $(CARGO_FEATURES) --test history -- --ignored --nocapture the_checker

unit:
	$(CARGO) test --workspace $(CARGO_FEATURES)

soak:
	PLUSFS_SCHEDULES=$(SOAK_SCHEDULES) PLUSFS_FIRST_SEED=$${PLUSFS_FIRST_SEED:-1000001} \
	  $(CARGO) test -p plusfs-testcluster $(CARGO_FEATURES) --release --test schedules -- --nocapture

## ctest: libplusfs built, C tests and the example compiled with gcc and run on a cluster
ctest:
	CARGO_FEATURES="$(CARGO_FEATURES)" scripts/ctest.sh

## venv: the project's Python environment: dmetabench (editable), matplotlib, mpi4py, pytest,
## ruff, and the `plusfs` module (so `import plusfs` works in it)
venv: venv-base pymodule
venv-base: $(VENV)/.done
$(VENV)/.done: python/dmetabench/pyproject.toml Makefile | deps
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet matplotlib mpi4py pytest ruff maturin prometheus-client
	$(VENV)/bin/pip install --quiet -e python/dmetabench
	touch $@

## bench: create/stat/unlink runs, batch sizes, baselines; report and charts in bench/out/
bench: build venv
	PLUSFS=$(BIN) PYTHON=$(VENV)/bin/python scripts/bench.sh

bench-hugedirs: build venv
	PLUSFS=$(BIN) PYTHON=$(VENV)/bin/python scripts/hugedir_bench.sh

## bench-bfo: batch-file vs per-file reads and writes, 4 KiB..4 MiB files, 1 GiB sets (report in bench/out/bfo/)
bench-bfo: build venv
	PLUSFS=$(BIN) PYTHON=$(VENV)/bin/python scripts/bfo_bench.sh

## bench-cp: the Linux source tree copied with plusfs cp vs cp -r / rsync -a / tar through the mount (bench/out/cp/)
bench-cp: build venv
	PLUSFS=$(BIN) PYTHON=$(VENV)/bin/python scripts/cp_bench.sh

## bench-cx: mkdir/rmdir under cx vs 2pc vs serial at 4 and 8 servers, sensitivity, recovery (bench/out/cx/)
bench-cx: build venv
	PLUSFS=$(BIN) PYTHON=$(VENV)/bin/python scripts/cx_bench.sh

## bench-mount: the FUSE mount vs the native API vs a local directory (report in bench/out/mount/)
bench-mount: build venv
	PLUSFS=$(BIN) PYTHON=$(VENV)/bin/python scripts/mount_bench.sh

## bench-acl: what POSIX ACLs cost: creates (library, unbatched and batched) and tar x through the mount, with and without a default ACL, and a mount with -o noacl (root)
bench-acl: build venv
	PLUSFS=$(BIN) PYTHON=$(VENV)/bin/python scripts/acl_bench.sh

## bench-quota: what quotas cost: creates (library, unbatched and batched) and tar x through the mount, with and without a tree quota, and with a user quota (root)
bench-quota: build venv
	PLUSFS=$(BIN) PYTHON=$(VENV)/bin/python scripts/quota_bench.sh

## bench-transport: the mount over /dev/fuse and FUSE over io_uring vs tmpfs and an in-memory FUSE floor (FLOOR_FS=path, e.g. libfuse's memfs_ll built elsewhere; root)
bench-transport: build venv
	PLUSFS=$(BIN) PYTHON=$(VENV)/bin/python scripts/transport_bench.sh

## test-uring: the FUSE test suites with every mount over FUSE over io_uring (root; switches the kernel's setting on and back)
test-uring: build
	scripts/fuse_uring_suite.sh

## bench-io: large-file write/read, file-per-process and shared, 1/2/4 processes, native API and mount vs tmpfs and the wire probe (bench/out/io/)
bench-io: build venv
	PLUSFS=$(BIN) PYTHON=$(VENV)/bin/python scripts/io_bench.sh

## bench-identity: tar x, rm -rf, mdtest-style and IOR-style runs through an admin-identity mount vs a node-identity mount (bench/out/identity/)
bench-identity: build venv
	PLUSFS=$(BIN) PYTHON=$(VENV)/bin/python scripts/identity_bench.sh

## bench-deleg: tar x, cp -r, git checkout, rm -rf and mdtest-style runs through a mount with and without delegations vs tmpfs (bench/out/deleg/)
bench-deleg: build venv
	PLUSFS=$(BIN) PYTHON=$(VENV)/bin/python scripts/deleg_bench.sh

## bench-bigdir: create/stat/unlink in one directory grown to 3,000/30,000/300,000 entries (SIZES=...) through the mount (with and without delegations), the native API and tmpfs, 1 and 4 processes; mount RSS; ls/find/rm -rf at the largest size (bench/out/bigdir/)
bench-bigdir: build venv
	PLUSFS=$(BIN) PYTHON=$(VENV)/bin/python scripts/bigdir_bench.sh

## bench-network: the papers' comparisons (batching, huge directories, cx/2pc/serial, BFO) on a private network of 8 servers at 0/100 µs/1 ms link delay vs loopback (root; bench/out/network/)
bench-network: build venv
	PLUSFS=$(BIN) PYTHON=$(VENV)/bin/python scripts/network_bench.sh

## bench-model: loopback runs of 1-8 servers for the scaling model, then `plusfs sim` (needs bench-network's raw.jsonl)
bench-model: build venv
	PLUSFS=$(BIN) PYTHON=$(VENV)/bin/python scripts/model_calibrate.sh
	$(BIN) sim placement
	$(BIN) sim rates --calibration bench/out/network/calibration.jsonl --network bench/out/network/raw.jsonl

## bench-replica: what replication costs at the store (R=1/R=3 groups vs a plain store) and a 1,000,000-entry snapshot catch-up;
## then through servers (--replicas 3 vs 1: create/stat/unlink, Cx update mix, 4 KiB BFO writes, CPU per op; failover over 20 kills)
bench-replica: build venv
	CARGO="$(CARGO)" PYTHON=$(VENV)/bin/python scripts/replica_bench.sh
	CARGO="$(CARGO)" PLUSFS=$(BIN) PYTHON=$(VENV)/bin/python RUNS=3 scripts/replica_servers_bench.sh

## bench-security: what mutual TLS and the metrics endpoints cost: create/stat/unlink
## (unbatched, batched) and `plusfs cp` in and out, insecure vs TLS vs TLS without metrics
bench-security: build venv
	PLUSFS=$(BIN) PYTHON=$(VENV)/bin/python RUNS=3 scripts/security_bench.sh

## bench-elastic: a server added to 4 and to 8 servers, then one drained, under load:
## fraction of directories and bytes moved, migration rate, time to balanced, load ratio
bench-elastic: build venv
	PLUSFS=$(BIN) $(VENV)/bin/python scripts/elastic_bench.py

clean:
	$(CARGO) clean
