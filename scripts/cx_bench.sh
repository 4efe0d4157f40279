#!/usr/bin/env bash
# Cross-server operations under cx, 2pc and serial (seed 004 §IV): throughput, mean and
# p99 latency, messages per operation, commitment share; sensitivity to the log limit,
# the conflict ratio and the two triggers; recovery time against the pending log size.
# Writes JSON lines and a Markdown report to bench/out/cx/.
#
#   PLUSFS=target/release/plusfs PYTHON=.venv/bin/python scripts/cx_bench.sh
#   RUNS=3 SERVERS="4 8" OPS=2000 PROCS=8 (defaults)
set -euo pipefail
: "${PLUSFS:?set PLUSFS to the plusfs binary}" "${PYTHON:?set PYTHON to a python}"
source "$(dirname "$0")/bench_lib.sh"
RUNS=${RUNS:-3}
SERVERS=${SERVERS:-"4 8"}
OPS=${OPS:-2000}
PROCS=${PROCS:-8}
OUT=${OUT:-bench/out/cx}
mkdir -p "$OUT"
RES="$OUT/results.jsonl"
: > "$RES"
WORK=$(mktemp -d)
CUR=""
cleanup() { [ -n "$CUR" ] && "$PLUSFS" cluster down --data "$CUR" >/dev/null 2>&1 || true; rm -rf "$WORK"; }
trap cleanup EXIT

# fresh NAME SERVERS [cluster up options...]: a new cluster, its map exported.
fresh() {
    local name=$1 n=$2; shift 2
    [ -n "$CUR" ] && "$PLUSFS" cluster down --data "$CUR" >/dev/null 2>&1 || true
    CUR="$WORK/$name"
    rm -rf "$CUR"
    "$PLUSFS" cluster up --servers "$n" --data "$CUR" --detach "$@" >/dev/null
    export PLUSFS_CLUSTER="$CUR/cluster.toml"
}

# run EXTRA_JSON xbench options...
run() {
    local extra=$1; shift
    "$PLUSFS" xbench --json --procs "$PROCS" --ops "$OPS" "$@" 2>/dev/null | tag "$extra" | tee -a "$RES"
}

echo "== protocols x workloads" >&2
for n in $SERVERS; do
    for proto in cx 2pc serial; do
        for w in mkdir update read; do
            for r in $(seq "$RUNS"); do
                fresh "p" "$n" --txn "$proto"
                run "{\"part\": \"main\", \"run\": $r}" --workload "$w" --dir "/x$r"
            done
        done
    done
done

echo "== sensitivity (8 servers unless SERVERS says otherwise, update mix)" >&2
N=$(echo "$SERVERS" | awk '{print $NF}')
for log in 65536 262144 1048576 16777216; do
    fresh "s" "$N" --txn cx --max-log-bytes "$log" --commit-timeout-ms 10000 --commit-threshold 100000
    run "{\"part\": \"log\", \"max_log_bytes\": $log}" --workload update
done
for c in 0 1 5 10 20 50; do
    fresh "s" "$N" --txn cx
    run "{\"part\": \"conflict\", \"conflict\": $c}" --workload update --conflict-pct "$c"
done
fresh "s" "$N" --txn 2pc
run "{\"part\": \"conflict\", \"conflict\": 0}" --workload update
for t in 10 100 1000 10000; do
    fresh "s" "$N" --txn cx --commit-timeout-ms "$t" --commit-threshold 1000000
    run "{\"part\": \"timeout\", \"timeout_ms\": $t}" --workload update
done
for th in 16 64 256 1024 4096; do
    fresh "s" "$N" --txn cx --commit-timeout-ms 600000 --commit-threshold "$th"
    run "{\"part\": \"threshold\", \"threshold\": $th}" --workload update
done

echo "== recovery time against the pending log" >&2
for ops in 100 1000 4000 16000; do
    fresh "r" "$N" --txn cx --commit-timeout-ms 600000 --commit-threshold 100000000 --max-log-bytes 268435456
    "$PLUSFS" xbench --json --procs 4 --ops $((ops / 4)) --workload mkdir --dir /rec --leave-pending >/dev/null 2>&1
    # The server with the most pending log bytes is killed and restarted.
    read -r victim bytes < <("$PLUSFS" cluster status --json | "$PYTHON" -c '
import json,sys
s=max((json.loads(l) for l in sys.stdin), key=lambda d: d["cx_log_bytes"])
print(s["id"], s["cx_log_bytes"])')
    kill -9 "$(cat "$CUR/server-$victim.pid")"
    sleep 0.2
    t0=$(date +%s.%N)
    "$PLUSFS" --cluster "$CUR/cluster.toml" server --id "$victim" --data "$CUR/server-$victim" \
        >>"$CUR/server-$victim.log" 2>&1 &
    echo $! > "$CUR/server-$victim.pid"
    # Recovered once the restarted server has nothing pending: its own operations
    # committed, and the coordinators it urged have decided its participations.
    while :; do
        left=$("$PLUSFS" cluster status --json 2>/dev/null | "$PYTHON" -c '
import json,sys
rows=[json.loads(l) for l in sys.stdin if l.startswith("{")]
mine=[r for r in rows if r.get("id") == '"$victim"' and "cx_pending" in r]
print(mine[0]["cx_pending"] if mine else -1)' || echo -1)
        [ "$left" = 0 ] && break
        sleep 0.02
    done
    t1=$(date +%s.%N)
    "$PLUSFS" ls /rec >/dev/null   # commits what the other servers still hold lazily
    sleep 0.5
    "$PLUSFS" fsck >/dev/null
    echo "{\"part\": \"recovery\", \"pending_ops\": $ops, \"victim_log_bytes\": $bytes, \"recovery_s\": $("$PYTHON" -c "print(round($t1-$t0,3))")}" | tee -a "$RES"
done

"$PYTHON" scripts/cx_report.py "$RES" > "$OUT/report.md"
echo "report: $OUT/report.md" >&2
