#!/usr/bin/env bash
# The FUSE test suites with every mount over FUSE over io_uring: switches the kernel's
# io_uring transport for FUSE on (root), runs the FUSE test binaries with `-o uring` added
# to each test mount (a mount that cannot start io_uring fails), and puts the switch back.
# Usage: scripts/fuse_uring_suite.sh [TEST-BINARY...] (default: fuse fuse_delegations
# fuse_bigdir multiuser).
set -euo pipefail
switch=/sys/module/fuse/parameters/enable_uring
if [[ ! -e $switch ]]; then
    echo "$switch is missing: this kernel has no FUSE over io_uring" >&2
    exit 1
fi
if [[ $(id -u) != 0 ]]; then
    echo "switching $switch needs root" >&2
    exit 1
fi
before=$(cat "$switch")
trap 'echo "$before" > "$switch"' EXIT
echo Y > "$switch"
binaries=("$@")
[[ ${#binaries[@]} -gt 0 ]] || binaries=(fuse fuse_delegations fuse_bigdir multiuser)
args=()
for b in "${binaries[@]}"; do args+=(--test "$b"); done
echo "== ${binaries[*]} with every mount over io_uring"
PLUSFS_TEST_MOUNT_OPTIONS=uring cargo test -p plusfs-tests "${args[@]}"
