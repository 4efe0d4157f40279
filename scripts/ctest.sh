#!/usr/bin/env bash
# Builds libplusfs, compiles the C tests and the example with gcc (against the shared and
# the static library), runs them against a 3-server local cluster, and takes it down.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${CARGO_TARGET_DIR:?}"
cargo build -p plusfs-ffi -p plusfs ${CARGO_FEATURES:-}
lib="$CARGO_TARGET_DIR/debug"
work=$(mktemp -d -t plusfs-ctest.XXXXXX)
cleanup() { "$lib/plusfs" cluster down --data "$work/cluster" >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT
cflags=(-std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Iinclude)
gcc "${cflags[@]}" tests/c/test_plusfs.c -L"$lib" -lplusfs -Wl,-rpath,"$lib" -o "$work/test_shared"
gcc "${cflags[@]}" tests/c/test_plusfs.c "$lib/libplusfs.a" -lpthread -ldl -lm -o "$work/test_static"
gcc "${cflags[@]}" examples/batch_create.c -L"$lib" -lplusfs -Wl,-rpath,"$lib" -o "$work/batch_create"
"$lib/plusfs" cluster up --servers 3 --data "$work/cluster" --detach >/dev/null
map="$work/cluster/cluster.toml"
"$work/test_shared" "$map"
"$work/test_static" "$map" | tail -n 1
"$work/batch_create" "$map" /example 5000
