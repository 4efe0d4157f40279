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
  creates "$run" /plain 1 "create unbatched, no ACL"
  creates "$run" /withacl 1 "create unbatched, default ACL"
  creates "$run" /plain 64 "create batched (64), no ACL"
  creates "$run" /withacl 64 "create batched (64), default ACL"
  untar "$run" "$m/plain/t$run" "tar x, mount, no ACL"
  untar "$run" "$m/withacl/t$run" "tar x, mount, default ACL"
  untar "$run" "$work/noacl/plain/n$run" "tar x, mount -o noacl"
done
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
print("Cost of ACLs (slowdown of the median; positive: slower):")
print(f"- unbatched create, default ACL vs none: {ratio('create unbatched, default ACL', 'create unbatched, no ACL', True)}")
print(f"- batched create, default ACL vs none: {ratio('create batched (64), default ACL', 'create batched (64), no ACL', True)}")
print(f"- tar x, default ACL vs none: {ratio('tar x, mount, default ACL', 'tar x, mount, no ACL', False)}")
print(f"- tar x, ACL-checking mount vs -o noacl: {ratio('tar x, mount, no ACL', 'tar x, mount -o noacl', False)}")
EOF
cat "$out/report.md"
