#!/usr/bin/env bash
# What an operation costs as a directory grows: mdtest-style create, stat and unlink of
# FILES empty files in one directory that already holds SIZE entries, for each SIZE of
# SIZES, through the FUSE mount (default options: delegations), through the mount with
# -o nodeleg, through the native API, and in a tmpfs directory, in one run. The cost per
# operation should not depend on SIZE: the report gives each rate and its ratio to the
# rate in an empty directory (SIZE 0) of the same target.
# Results: JSON lines in bench/out/bigdir/raw.jsonl, report bench/out/bigdir/report.md.
set -euo pipefail
PLUSFS=${PLUSFS:-plusfs}
PYTHON=${PYTHON:-python3}
SERVERS=${SERVERS:-4}
FILES=${FILES:-2000}
SIZES=${SIZES:-0 10000 30000}
RUNS=${RUNS:-1}
cd "$(dirname "$0")/.."
. scripts/bench_lib.sh
out=bench/out/bigdir
mkdir -p "$out"
raw="$out/raw.jsonl"
: > "$raw"
work=$(mktemp -d -p "$PWD/bench/out" bigdir-work.XXXXXX)
cluster="$work/cluster" mnt="$work/mnt" nodeleg="$work/mnt-nodeleg" local="$work/local"
mkdir -p "$mnt" "$nodeleg" "$local"
localfs=$(mount_local "$local")
echo "local directory: $localfs"
cleanup() {
  umount "$local" 2>/dev/null || true
  unmount_fuse "$mnt" "$nodeleg"
  "$PLUSFS" cluster down --data "$cluster" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

"$PLUSFS" cluster up --data "$cluster" --servers "$SERVERS" --detach >/dev/null
export PLUSFS_CLUSTER="$cluster/cluster.toml"
"$PLUSFS" mount "$mnt" >/dev/null 2>&1 &
"$PLUSFS" mount "$nodeleg" -o nodeleg >/dev/null 2>&1 &
for m in "$mnt" "$nodeleg"; do
  for _ in $(seq 1 100); do mountpoint -q "$m" && break; sleep 0.1; done
  mountpoint -q "$m" || { echo "mount $m failed" >&2; exit 1; }
done

# Fills directory $1 (a path on the machine) with $2 empty files named pre.N.
fill() {
  "$PYTHON" - "$1" "$2" <<'EOF'
import os, sys, time
d, n = sys.argv[1], int(sys.argv[2])
os.makedirs(d, exist_ok=True)
t0 = time.time()
for i in range(n):
    os.close(os.open(f"{d}/pre.{i}", os.O_CREAT | os.O_WRONLY, 0o644))
    if i and i % 10000 == 0:
        print(f"  {i:,} of {n:,} entries ({time.time() - t0:.1f} s)", file=sys.stderr)
EOF
}

# Waits until cluster directory $1 is no longer being spread over servers (a directory
# that crossed the threshold while it was filled moves entries meanwhile).
settled() {
  for _ in $(seq 1 600); do
    "$PLUSFS" hugedir "$1" 2>/dev/null | grep -qi distributing || return 0
    sleep 0.1
  done
  echo "warning: $1 still being distributed" >&2
}

# Each target once on a few files first: the mounts' first requests set up connections and
# delegations, which is not what is measured.
for target in "local:$mnt" "local:$nodeleg" plusfs "local:$local"; do
  "$PLUSFS" bench --target "$target" -n 200 -c 1 -d /warm-up >/dev/null
done

for run in $(seq 1 "$RUNS"); do
  for size in $SIZES; do
    for target in mount nodeleg native local; do
      dir="/big-$run-$size-$target"
      echo "run $run: $target, $size entries" >&2
      case $target in
        mount) fill "$mnt$dir" "$size"; args=(--target "local:$mnt") ;;
        nodeleg) fill "$nodeleg$dir" "$size"; args=(--target "local:$nodeleg") ;;
        local) fill "$local$dir" "$size"; args=(--target "local:$local") ;;
        # The native API's directory is filled through a mount: the servers hold the same.
        native) fill "$nodeleg$dir" "$size"; args=() ;;
      esac
      sync
      [ "$target" = local ] || settled "$dir"
      "$PLUSFS" bench "${args[@]}" -n "$FILES" -c 1 -d "$dir" --json create stat unlink |
        tag "{\"run\":$run,\"size\":$size,\"target\":\"$target\",\"localfs\":\"$localfs\"}" >> "$raw"
    done
  done
done

"$PYTHON" - "$raw" > "$out/report.md" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
rates = {}
for r in rows:
    phase = r.get("phase") or r.get("op")
    rate = r.get("ops_per_sec") or r.get("rate")
    if phase and rate:
        rates.setdefault((r["target"], phase, r["size"]), []).append(rate)
sizes = sorted({k[2] for k in rates})
print("# Cost per operation as a directory grows\n")
print(f"mdtest-style create, stat, unlink of new files in a directory already holding N entries; "
      f"ops/s (median of runs), and in brackets the ratio to N = {sizes[0]}.\n")
print("| target | phase | " + " | ".join(f"N = {s:,}" for s in sizes) + " |")
print("|---|---|" + "---|" * len(sizes))
for target in ["mount", "nodeleg", "native", "local"]:
    for phase in ["create", "stat", "unlink"]:
        base = rates.get((target, phase, sizes[0]))
        if not base:
            continue
        b = statistics.median(base)
        cells = []
        for s in sizes:
            v = statistics.median(rates.get((target, phase, s), [0]))
            cells.append(f"{v:,.0f} ({v / b:.2f})")
        print(f"| {target} | {phase} | " + " | ".join(cells) + " |")
EOF
cat "$out/report.md"
