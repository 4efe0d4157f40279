#!/usr/bin/env bash
# plusfs benchmark driver: results as JSON lines in bench/out/raw.jsonl and a Markdown
# report in bench/out/report.md. Every comparison is measured within one run; each
# configuration runs RUNS times and the report gives the median.
set -euo pipefail
PLUSFS=${PLUSFS:-plusfs}
RUNS=${RUNS:-3}
FILES_1C=${FILES_1C:-20000}     # files for the 1-server, 1-client baseline
FILES_PER_CLIENT=${FILES_PER_CLIENT:-3000}
cd "$(dirname "$0")/.."
out=bench/out
mkdir -p "$out"
raw="$out/raw.jsonl"
: > "$raw"
work=$(mktemp -d -t plusfs-bench.XXXXXX)
tmpfs=$(mktemp -d -p /dev/shm plusfs-bench.XXXXXX)
clusters=()
cleanup() {
  for d in "${clusters[@]}"; do "$PLUSFS" cluster down --data "$d" >/dev/null 2>&1 || true; done
  rm -rf "$work" "$tmpfs"
}
trap cleanup EXIT

# tag JSON lines with the configuration they belong to
tag() { python3 -c 'import json,sys
extra=json.loads(sys.argv[1])
for line in sys.stdin:
    line=line.strip()
    if line.startswith("{"):
        d=json.loads(line); d.update(extra); print(json.dumps(d))' "$1"; }

up() { # servers sync -> data dir
  local d="$work/c$1-$2-$RANDOM"
  "$PLUSFS" cluster up --servers "$1" --sync "$2" --data "$d" --detach >/dev/null
  clusters+=("$d"); echo "$d"
}

echo "== baseline: 1 server, 1 client, unbatched, vs local tmpfs and the server's disk"
d=$(up 1 os)
for r in $(seq "$RUNS"); do
  PLUSFS_CLUSTER="$d/cluster.toml" "$PLUSFS" bench create stat unlink --clients 1 --files "$FILES_1C" \
    --dir "/base$r" --target plusfs --target "local:$tmpfs/r$r" --target "local:$work/disk$r" --json \
    | tag "{\"suite\":\"baseline\",\"servers\":1,\"run\":$r}" | tee -a "$raw"
done
"$PLUSFS" cluster down --data "$d" >/dev/null

for mode in unique shared; do
  for n in 1 2 4; do
    echo "== scaling: $n servers, 8 clients, --$mode"
    d=$(up "$n" os)
    for r in $(seq "$RUNS"); do
      PLUSFS_CLUSTER="$d/cluster.toml" "$PLUSFS" bench create stat unlink --clients 8 \
        --files "$FILES_PER_CLIENT" "--$mode" --dir "/s$r" --json \
        | tag "{\"suite\":\"scaling\",\"mode\":\"$mode\",\"servers\":$n,\"run\":$r}" | tee -a "$raw"
    done
    "$PLUSFS" cluster status --data "$d" > "$out/status-$mode-$n.txt"
    "$PLUSFS" cluster down --data "$d" >/dev/null
  done
done

echo "== durability: sync=always with 8 clients (group commit)"
d=$(up 1 always)
PLUSFS_CLUSTER="$d/cluster.toml" "$PLUSFS" bench create --clients 8 --files 1000 --unique --dir /g --json \
  | tag '{"suite":"sync-always","servers":1,"run":1}' | tee -a "$raw"
"$PLUSFS" cluster status --data "$d" > "$out/status-sync-always.txt"
"$PLUSFS" cluster down --data "$d" >/dev/null

python3 scripts/bench_report.py "$raw" "$out" > "$out/report.md"
echo "report: $out/report.md"
cat "$out/report.md"
