#!/usr/bin/env bash
# What POSIX ACLs cost, in one run: creates through the library (unbatched and in
# batches) and `tar x` of a tree (TREE, default /usr/include) through the mount, in a
# directory without ACLs and in one with an access and a default ACL (so every new entry
# inherits an ACL), and `tar x` through a mount with `-o noacl` (the kernel checking mode
# bits only). RUNS rounds, each measuring every case once, in turn; medians reported.
# Needs root (drops caches) and setfacl. Results: bench/out/acl/raw.jsonl and report.md.
set -euo pipefail
PLUSFS=${PLUSFS:-plusfs}
PYTHON=${PYTHON:-python3}
SERVERS=${SERVERS:-4}
RUNS=${RUNS:-3}
FILES=${FILES:-2000}
TREE=${TREE:-/usr/include}
cd "$(dirname "$0")/.."
. scripts/bench_lib.sh
command -v setfacl >/dev/null || { echo "setfacl missing (Debian package acl)" >&2; exit 1; }
out=bench/out/acl
mkdir -p "$out"
raw="$out/raw.jsonl"
: > "$raw"
work=$(mktemp -d -p "$PWD/bench/out" acl-work.XXXXXX)
cluster="$work/cluster"
mkdir -p "$work/acl" "$work/noacl"
cleanup() {
  unmount_fuse "$work/acl" "$work/noacl"
  "$PLUSFS" cluster down --data "$cluster" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
tar -cf "$work/tree.tar" -C "$(dirname "$TREE")" "$(basename "$TREE")" 2>/dev/null
"$PLUSFS" cluster up --data "$cluster" --servers "$SERVERS" --detach >/dev/null
export PLUSFS_CLUSTER="$cluster/cluster.toml"
"$PLUSFS" mount "$work/acl" >/dev/null
"$PLUSFS" mount "$work/noacl" -o noacl >/dev/null
m="$work/acl"
mkdir "$m/plain" "$m/withacl"
setfacl -m g:2000:rwx,u:1001:r-x "$m/withacl"
setfacl -d -m u::rwx,g::r-x,g:2000:rwx,u:1001:r-x,o::r-x "$m/withacl"

for run in $(seq 1 "$RUNS"); do
  echo "round $run of $RUNS" >&2
  bench_creates "$run" /plain 1 "create unbatched, no ACL"
  bench_creates "$run" /withacl 1 "create unbatched, default ACL"
  bench_creates "$run" /plain 64 "create batched (64), no ACL"
  bench_creates "$run" /withacl 64 "create batched (64), default ACL"
  bench_untar "$run" "$m/plain/t$run" "tar x, mount, no ACL"
  bench_untar "$run" "$m/withacl/t$run" "tar x, mount, default ACL"
  bench_untar "$run" "$work/noacl/plain/n$run" "tar x, mount -o noacl"
done
{
  median_table
  echo
  echo "Cost of ACLs (slowdown of the median; positive: slower):"
  slowdown "unbatched create, default ACL vs none" "create unbatched, default ACL" "create unbatched, no ACL" 1
  slowdown "batched create, default ACL vs none" "create batched (64), default ACL" "create batched (64), no ACL" 1
  slowdown "tar x, default ACL vs none" "tar x, mount, default ACL" "tar x, mount, no ACL" 0
  slowdown "tar x, ACL-checking mount vs -o noacl" "tar x, mount, no ACL" "tar x, mount -o noacl" 0
} > "$out/report.md"
cat "$out/report.md"
