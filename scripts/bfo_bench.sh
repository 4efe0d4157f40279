#!/usr/bin/env bash
# Batch-file I/O (seed 002 Figs. 9-10): file sets of equal total size (TOTAL, default
# 1 GiB) with files of 4 KiB ... 4 MiB, written and read per file (one call per file) and
# in batches (BFO), reads in creation order and in random order, page caches dropped
# before every phase (as root). Results: bench/out/bfo/raw.jsonl and report.md.
set -euo pipefail
PLUSFS=${PLUSFS:-plusfs}
PYTHON=${PYTHON:-python3}
SERVERS=${SERVERS:-4}
TOTAL=${TOTAL:-1073741824}
SIZES=${SIZES:-4096 65536 1048576 4194304}
RUNS=${RUNS:-1}
cd "$(dirname "$0")/.."
. scripts/bench_lib.sh
out=bench/out/bfo
mkdir -p "$out"
raw="$out/raw.jsonl"
: > "$raw"
work=$(mktemp -d -p "$PWD/bench/out" bfo-work.XXXXXX)
cleanup() {
  "$PLUSFS" cluster down --data "$work/cluster" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
drop=()
[ "$(id -u)" = 0 ] && drop=(--drop-caches)
"$PLUSFS" cluster up --data "$work/cluster" --servers "$SERVERS" --detach >/dev/null
export PLUSFS_CLUSTER="$work/cluster/cluster.toml"
for run in $(seq 1 "$RUNS"); do
  for size in $SIZES; do
    n=$((TOTAL / size))
    # A batch is about 64 MiB of files (at most 1000 files).
    b=$((64 * 1048576 / size)); b=$((b > 1000 ? 1000 : b)); b=$((b < 2 ? 2 : b))
    for mode in per-file batch; do
      bs=1; [ "$mode" = batch ] && bs=$b
      dir="/bfo-$run-$size-$mode"
      echo "== run $run: $n files of $size bytes, $mode (batch $bs)"
      "$PLUSFS" bench write read -n "$n" --size "$size" -b "$bs" --dir "$dir" "${drop[@]}" --json |
        tag "{\"run\":$run,\"size\":$size,\"mode\":\"$mode\",\"order\":\"sequential\"}" | tee -a "$raw"
      "$PLUSFS" bench read -n "$n" --size "$size" -b "$bs" --dir "$dir" --random "${drop[@]}" --json |
        tag "{\"run\":$run,\"size\":$size,\"mode\":\"$mode\",\"order\":\"random\"}" | tee -a "$raw"
      "$PLUSFS" bench unlink -n "$n" -b 1000 --dir "$dir" --json >/dev/null
    done
    "$PLUSFS" cluster compact >/dev/null
  done
done
"$PYTHON" - "$raw" > "$out/report.md" <<'EOF'
import json, statistics, sys
from collections import defaultdict
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rate = defaultdict(list)
msgs = defaultdict(list)
for r in rows:
    k = (r["size"], r["phase"], r["order"], r["mode"])
    rate[k].append(r["mib_per_sec"])
    msgs[k].append(r["requests"] / max(r["ops"], 1))
print("# Batch-file I/O vs per-file calls (MiB/s, median of runs; requests per file)\n")
print("| file size | phase | order | per-file MiB/s | batch MiB/s | batch / per-file | requests/file per-file | batch |")
print("|---|---|---|---|---|---|---|---|")
for size, phase, order in sorted({k[:3] for k in rate}):
    p = rate.get((size, phase, order, "per-file"))
    b = rate.get((size, phase, order, "batch"))
    if not p or not b:
        continue
    pm, bm = statistics.median(p), statistics.median(b)
    rp = statistics.median(msgs[(size, phase, order, "per-file")])
    rb = statistics.median(msgs[(size, phase, order, "batch")])
    print(f"| {size // 1024} KiB | {phase} | {order} | {pm:.1f} | {bm:.1f} | {bm / pm:.2f} | {rp:.3f} | {rb:.4f} |")
EOF
cat "$out/report.md"
