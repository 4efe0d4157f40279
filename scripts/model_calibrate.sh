#!/usr/bin/env bash
# Measured points for the scaling model (`plusfs sim rates`): unbatched creates and stats
# on loopback clusters of 1, 2, 4 and 8 servers with 1 and 4 clients, each phase with the
# servers' CPU seconds and the whole machine's busy CPU seconds around it.
# JSON lines in $OUT/calibration.jsonl.
#
#   PLUSFS=target/release/plusfs PYTHON=.venv/bin/python RUNS=3 scripts/model_calibrate.sh
set -euo pipefail
export LC_ALL=C
: "${PLUSFS:?set PLUSFS to the plusfs binary}" "${PYTHON:?set PYTHON to a python}"
RUNS=${RUNS:-5}
FILES=${FILES:-10000}   # per client: a single client's 3,000-file runs (0.4 s) varied by ±25 %
OUT=${OUT:-bench/out/network}
cd "$(dirname "$0")/.."
. scripts/bench_lib.sh
mkdir -p "$OUT"
raw="$OUT/calibration.jsonl"
: > "$raw"
work=$(mktemp -d -p "$PWD/bench/out" model-work.XXXXXX)
cleanup() { "$PLUSFS" cluster down --data "$work/c" >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT

# Busy CPU seconds of the whole machine so far (all but idle and iowait).
busy() { awk '/^cpu / { print ($2 + $3 + $4 + $7 + $8) / 100 }' /proc/stat; }

for run in $(seq 1 "$RUNS"); do
  for n in 1 2 4 8; do
    "$PLUSFS" cluster down --data "$work/c" >/dev/null 2>&1 || true
    rm -rf "$work/c"
    "$PLUSFS" cluster up --servers "$n" --data "$work/c" --detach >/dev/null
    export PLUSFS_CLUSTER="$work/c/cluster.toml"
    servers=$(pgrep -f "server --cluster $work/c/cluster.toml" | tr '\n' ' ')
    for c in 1 4; do
      for phase in create stat unlink; do
        s0=$(cpu $servers) b0=$(busy)
        json=$("$PLUSFS" bench "$phase" -n "$FILES" -c "$c" -b 1 --dir "/m-$c" --json)
        s1=$(cpu $servers) b1=$(busy)
        echo "$json" | tag "{\"run\":$run,\"servers\":$n,\"server_cpu\":$(awk -v a="$s1" -v b="$s0" 'BEGIN{print a-b}'),\"busy_cpu\":$(awk -v a="$b1" -v b="$b0" 'BEGIN{print a-b}')}" \
          | tee -a "$raw" >/dev/null
      done
    done
  done
done
echo "wrote $raw" >&2
