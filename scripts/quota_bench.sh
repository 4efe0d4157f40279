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
mkdir "$m/plain" "$m/limited"
"$PLUSFS" quota set /limited --files 100000000 --bytes 1T >/dev/null

record() { echo "{\"run\":$1,\"case\":\"$2\",\"value\":$3,\"unit\":\"$4\"}" >> "$raw"; }

# Creates per second of one library client (`plusfs bench`), batch size $3, in $2.
creates() {
  local run=$1 dir=$2 batch=$3 name=$4
  local rate
  rate=$("$PLUSFS" bench create -n "$FILES" -b "$batch" --dir "$dir/r$run-b$batch" --json 2>/dev/null |
    "$PYTHON" -c 'import json,sys; print([json.loads(l) for l in sys.stdin if l.strip()][0]["ops_per_sec"])')
  record "$run" "$name" "$rate" "creates/s"
}

# Seconds of `tar x` of the tree into $2 (sync included).
untar() {
  local run=$1 dir=$2 name=$3
  mkdir -p "$dir"
  drop_caches
  local t0 t1
  t0=$(date +%s.%N)
  tar -xf "$work/tree.tar" -C "$dir"
  sync
  t1=$(date +%s.%N)
  record "$run" "$name" "$(echo "$t1 - $t0" | bc)" "s"
}

for run in $(seq 1 "$RUNS"); do
  echo "round $run of $RUNS" >&2
  creates "$run" /plain 1 "create unbatched, no quota"
  creates "$run" /limited 1 "create unbatched, tree quota"
  creates "$run" /plain 64 "create batched (64), no quota"
  creates "$run" /limited 64 "create batched (64), tree quota"
  untar "$run" "$m/plain/t$run" "tar x, mount, no quota"
  untar "$run" "$m/limited/t$run" "tar x, mount, tree quota"
done
# The same with a user quota on root (every create anywhere is limited), last: a user
# quota ends write delegations everywhere.
"$PLUSFS" quota set --uid 0 --files 100000000 --bytes 1T >/dev/null
for run in $(seq 1 "$RUNS"); do
  echo "user quota round $run of $RUNS" >&2
  creates "$run" /plain 1 "create unbatched, user quota"
  creates "$run" /plain 64 "create batched (64), user quota"
  untar "$run" "$m/plain/u$run" "tar x, mount, user quota"
done
"$PLUSFS" quota report > "$out/quota-report.txt"
"$PLUSFS" fsck > "$out/fsck.txt" || true
"$PYTHON" - "$raw" > "$out/report.md" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
cases = list(dict.fromkeys(r["case"] for r in rows))
med = {c: statistics.median(r["value"] for r in rows if r["case"] == c) for c in cases}
unit = {r["case"]: r["unit"] for r in rows}
print("| case | median | runs |")
print("|---|---|---|")
for c in cases:
    vals = ", ".join(f"{r['value']:.2f}" for r in rows if r["case"] == c)
    print(f"| {c} | {med[c]:.2f} {unit[c]} | {vals} |")
def ratio(a, b, higher_better):
    # Time per operation of case a over case b, minus one.
    x = med[b] / med[a] if higher_better else med[a] / med[b]
    return f"{(x - 1) * 100:+.1f} %"
print()
print("Cost of quotas (slowdown of the median; positive: slower):")
for kind in ["tree quota", "user quota"]:
    print(f"- unbatched create, {kind} vs none: {ratio(f'create unbatched, {kind}', 'create unbatched, no quota', True)}")
    print(f"- batched create, {kind} vs none: {ratio(f'create batched (64), {kind}', 'create batched (64), no quota', True)}")
    print(f"- tar x, {kind} vs none: {ratio(f'tar x, mount, {kind}', 'tar x, mount, no quota', False)}")
EOF
cat "$out/report.md"
tail -1 "$out/fsck.txt"
