#!/usr/bin/env bash
# What quotas cost, in one run: creates through the library (unbatched and in batches)
# and `tar x` of a tree (TREE, default /usr/include) through the mount, in a directory
# without a quota and in one under a tree quota, with a user quota on the creating user
# as well (limits far above what the run makes, so nothing is refused: the cost measured
# is counting and allowances). RUNS rounds, each measuring every case once, in turn;
# medians reported. Needs root (drops caches). Results: bench/out/quota/raw.jsonl and
# report.md.
set -euo pipefail
PLUSFS=${PLUSFS:-plusfs}
PYTHON=${PYTHON:-python3}
SERVERS=${SERVERS:-4}
RUNS=${RUNS:-3}
FILES=${FILES:-2000}
TREE=${TREE:-/usr/include}
cd "$(dirname "$0")/.."
. scripts/bench_lib.sh
out=bench/out/quota
mkdir -p "$out"
raw="$out/raw.jsonl"
: > "$raw"
work=$(mktemp -d -p "$PWD/bench/out" quota-work.XXXXXX)
cluster="$work/cluster"
mkdir -p "$work/m"
cleanup() {
  unmount_fuse "$work/m"
  "$PLUSFS" cluster down --data "$cluster" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
tar -cf "$work/tree.tar" -C "$(dirname "$TREE")" "$(basename "$TREE")" 2>/dev/null
"$PLUSFS" cluster up --data "$cluster" --servers "$SERVERS" --detach >/dev/null
export PLUSFS_CLUSTER="$cluster/cluster.toml"
"$PLUSFS" mount "$work/m" >/dev/null
m="$work/m"
mkdir "$m/plain" "$m/plain/user" "$m/limited"
"$PLUSFS" quota set /limited --files 100000000 --bytes 1T >/dev/null

for run in $(seq 1 "$RUNS"); do
  echo "round $run of $RUNS" >&2
  bench_creates "$run" /plain 1 "create unbatched, no quota"
  bench_creates "$run" /limited 1 "create unbatched, tree quota"
  bench_creates "$run" /plain 64 "create batched (64), no quota"
  bench_creates "$run" /limited 64 "create batched (64), tree quota"
  bench_untar "$run" "$m/plain/t$run" "tar x, mount, no quota"
  bench_untar "$run" "$m/limited/t$run" "tar x, mount, tree quota"
done
# The same with a user quota on root (every create anywhere is limited), last: a user
# quota ends write delegations everywhere.
"$PLUSFS" quota set --uid 0 --files 100000000 --bytes 1T >/dev/null
for run in $(seq 1 "$RUNS"); do
  echo "user quota round $run of $RUNS" >&2
  bench_creates "$run" /plain/user 1 "create unbatched, user quota"
  bench_creates "$run" /plain/user 64 "create batched (64), user quota"
  bench_untar "$run" "$m/plain/u$run" "tar x, mount, user quota"
done
"$PLUSFS" quota report > "$out/quota-report.txt"
"$PLUSFS" fsck > "$out/fsck.txt" || true
{
  median_table
  echo
  echo "Cost of quotas (slowdown of the median; positive: slower):"
  for kind in "tree quota" "user quota"; do
    slowdown "unbatched create, $kind vs none" "create unbatched, $kind" "create unbatched, no quota" 1
    slowdown "batched create, $kind vs none" "create batched (64), $kind" "create batched (64), no quota" 1
    slowdown "tar x, $kind vs none" "tar x, mount, $kind" "tar x, mount, no quota" 0
  done
} > "$out/report.md"
cat "$out/report.md"
tail -1 "$out/fsck.txt"
