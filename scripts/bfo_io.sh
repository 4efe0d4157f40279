#!/usr/bin/env bash
# Requests and data-store I/O per file, per-file calls vs batch-file I/O (seed 002 Fig. 12:
# the I/O-size distribution). Each phase runs alone; the servers' counters (`cluster
# status --json`) are read before and after it. Results: bench/out/bfo-io/report.md.
set -euo pipefail
PLUSFS=${PLUSFS:-plusfs}
PYTHON=${PYTHON:-python3}
SERVERS=${SERVERS:-4}
TOTAL=${TOTAL:-268435456}
SIZES=${SIZES:-4096 65536 1048576}
cd "$(dirname "$0")/.."
out=bench/out/bfo-io
mkdir -p "$out"
raw="$out/raw.jsonl"
: > "$raw"
work=$(mktemp -d -p "$PWD/bench/out" bfo-io-work.XXXXXX)
cleanup() {
  "$PLUSFS" cluster down --data "$work/cluster" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
drop=()
[ "$(id -u)" = 0 ] && drop=(--drop-caches)
"$PLUSFS" cluster up --data "$work/cluster" --servers "$SERVERS" --detach >/dev/null
export PLUSFS_CLUSTER="$work/cluster/cluster.toml"
counters() {
  "$PLUSFS" cluster status --json | "$PYTHON" -c 'import json,sys
t={"msgs":0,"appends":0,"reads":0,"sizes":[0]*5}
for l in sys.stdin:
    d=json.loads(l)
    t["msgs"]+=d["msgs_in"]; t["appends"]+=d["data_appends"]; t["reads"]+=d["data_reads"]
    t["sizes"]=[a+b for a,b in zip(t["sizes"],d["data_read_sizes"])]
print(json.dumps(t))'
}
for size in $SIZES; do
  n=$((TOTAL / size))
  b=$((64 * 1048576 / size)); b=$((b > 1000 ? 1000 : b)); b=$((b < 2 ? 2 : b))
  for mode in per-file batch; do
    bs=1; [ "$mode" = batch ] && bs=$b
    dir="/io-$size-$mode"
    for phase in write read; do
      before=$(counters)
      "$PLUSFS" bench "$phase" -n "$n" --size "$size" -b "$bs" --dir "$dir" --random "${drop[@]}" --json >/dev/null
      after=$(counters)
      echo "{\"size\":$size,\"mode\":\"$mode\",\"phase\":\"$phase\",\"files\":$n,\"before\":$before,\"after\":$after}" >> "$raw"
      echo "$size $mode $phase done"
    done
  done
done
"$PYTHON" - "$raw" "$SERVERS" > "$out/report.md" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
servers = int(sys.argv[2])
print("# Requests and data-store I/O per file (one run; reads in random order, cold caches)\n")
print("| file size | phase | method | messages/file | appends/file | reads/file | reads ≤4K / ≤64K / ≤256K / ≤1M / more |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    b, a, n = r["before"], r["after"], r["files"]
    msgs = (a["msgs"] - b["msgs"] - servers) / n
    sizes = " / ".join(str(x - y) for x, y in zip(a["sizes"], b["sizes"]))
    print(f"| {r['size'] // 1024} KiB | {r['phase']} | {r['mode']} | {msgs:.3f} | "
          f"{(a['appends'] - b['appends']) / n:.4f} | {(a['reads'] - b['reads']) / n:.4f} | {sizes} |")
EOF
cat "$out/report.md"
