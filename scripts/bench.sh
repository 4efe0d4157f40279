#!/usr/bin/env bash
# plusfs benchmark driver. Results: JSON lines in bench/out/raw.jsonl; a Markdown report
# (bench/out/report.md) and charts (bench/out/*.png). Every comparison is measured within
# one run; each configuration runs RUNS times and the report gives medians.
#
#   suites: baseline (1 server, 1 client, unbatched, vs tmpfs and the data disk),
#           batch    (batch sizes 1..1000 x 1/2/4 servers x shared/unique, 8 clients,
#                     with --target engine in the same run: seed 000 Table 2, Figs. 7-8),
#           count    (100,000 creates with batch 1000: requests and replies),
#           sync     (sync=always, 8 clients: fsyncs shared by group commit).
set -euo pipefail
PLUSFS=${PLUSFS:-plusfs}
PYTHON=${PYTHON:-python3}
RUNS=${RUNS:-3}
SUITES=${SUITES:-baseline batch count sync}
FILES_1C=${FILES_1C:-20000}
FILES_PER_CLIENT=${FILES_PER_CLIENT:-5000}
BATCHES=${BATCHES:-1 10 50 100 500 1000}
SERVERS=${SERVERS:-1 2 4}
cd "$(dirname "$0")/.."
. scripts/bench_lib.sh
out=bench/out
mkdir -p "$out"
raw="$out/raw.jsonl"
: > "$raw"
rm -f "$out"/status-*.txt
work=$(mktemp -d -t plusfs-bench.XXXXXX)
tmpfs=$(mktemp -d -p /dev/shm plusfs-bench.XXXXXX)
clusters=()
cleanup() {
  for d in "${clusters[@]}"; do "$PLUSFS" cluster down --data "$d" >/dev/null 2>&1 || true; done
  rm -rf "$work" "$tmpfs"
}
trap cleanup EXIT

# Adds the configuration to each JSON line of plusfs bench.

up() { # SERVERS SYNC -> data dir of a new cluster
  local d="$work/c$1-$2-$RANDOM"
  "$PLUSFS" cluster up --servers "$1" --sync "$2" --data "$d" --detach >/dev/null
  clusters+=("$d"); echo "$d"
}
down() { "$PLUSFS" cluster down --data "$1" >/dev/null; rm -rf "$1"; }
has() { [[ " $SUITES " == *" $1 "* ]]; }

if has baseline; then
  echo "== baseline: 1 server, 1 client, unbatched, vs tmpfs and the server's disk"
  d=$(up 1 os)
  for r in $(seq "$RUNS"); do
    PLUSFS_CLUSTER="$d/cluster.toml" "$PLUSFS" bench create stat unlink --clients 1 --files "$FILES_1C" \
      --dir "/base$r" --target plusfs --target "local:$tmpfs/r$r" --target "local:$work/disk$r" --json \
      | tag "{\"suite\":\"baseline\",\"servers\":1,\"run\":$r}" >> "$raw"
  done
  down "$d"
fi

if has batch; then
  for n in $SERVERS; do
    d=$(up "$n" os)
    for mode in shared unique; do
      for r in $(seq "$RUNS"); do
        for b in $BATCHES; do
          echo "== batch: $n servers, --$mode, batch $b, run $r"
          PLUSFS_CLUSTER="$d/cluster.toml" "$PLUSFS" bench create stat unlink --clients 8 \
            --files "$FILES_PER_CLIENT" "--$mode" --batch "$b" --dir "/$mode-$r-$b" \
            --target plusfs --target "engine:$work" --json \
            | tag "{\"suite\":\"batch\",\"mode\":\"$mode\",\"servers\":$n,\"run\":$r}" >> "$raw"
        done
      done
    done
    "$PLUSFS" cluster status --data "$d" > "$out/status-batch-$n-servers.txt"
    down "$d"
  done
fi

if has count; then
  echo "== count: 100,000 creates in one directory with batch 1000"
  d=$(up 4 os)
  PLUSFS_CLUSTER="$d/cluster.toml" "$PLUSFS" bench create --clients 1 --files 100000 --batch 1000 --dir /count --json \
    | tag '{"suite":"count","servers":4,"run":1}' >> "$raw"
  down "$d"
fi

if has sync; then
  echo "== sync=always: 8 clients, group commit"
  d=$(up 1 always)
  for b in 1 100; do
    PLUSFS_CLUSTER="$d/cluster.toml" "$PLUSFS" bench create --clients 8 --files 500 --unique --batch "$b" \
      --dir "/g$b" --json | tag "{\"suite\":\"sync\",\"servers\":1,\"run\":1}" >> "$raw"
  done
  "$PLUSFS" cluster status --data "$d" > "$out/status-sync-always.txt"
  down "$d"
fi

"$PYTHON" scripts/bench_report.py "$raw" "$out" > "$out/report.md"
echo "report: $out/report.md"
cat "$out/report.md"
