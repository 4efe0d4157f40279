#!/usr/bin/env bash
# What replication costs at the store (crates/replica/examples/replica_bench.rs), RUNS
# times; JSON lines in $OUT/replica.jsonl and a table of medians (scripts/replica_report.py).
#
#   CARGO=cargo PYTHON=.venv/bin/python RUNS=3 scripts/replica_bench.sh
set -euo pipefail
: "${PYTHON:?set PYTHON to a python}"
CARGO=${CARGO:-cargo}
RUNS=${RUNS:-3}
COUNT=${COUNT:-4000}
ENTRIES=${ENTRIES:-1000000}
KILLS=${KILLS:-20}
OUT=${OUT:-bench/out}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
$CARGO build --release -q -p plusfs-replica --example replica_bench
bin="${CARGO_TARGET_DIR:-target}/release/examples/replica_bench"
raw="$OUT/replica.jsonl"
: > "$raw"
for run in $(seq 1 "$RUNS"); do
  echo "== run $run" >&2
  "$bin" --count "$COUNT" --entries "$ENTRIES" --kills "$KILLS" | sed "s/^{/{\"run\":$run,/" >> "$raw"
done
"$PYTHON" scripts/replica_report.py "$raw"
