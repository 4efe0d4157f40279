#!/usr/bin/env bash
# Replication through servers (issue "Replication"): the same workloads on a cluster of
# SERVERS server slots with --replicas 1 and --replicas 3, alternated in each of RUNS
# rounds: unbatched and batched create/stat/unlink, the Cx update mix and 4 KiB BFO
# writes, each with the CPU seconds all server processes used per operation (all members
# share this machine's cores). Then the failover time over KILLS kills of the serving
# member of the home of `/` (crates/localcluster/examples/failover_bench.rs).
# JSON lines in $OUT/replica-servers.jsonl; a table of medians from
# scripts/replica_servers_report.py.
#
#   PLUSFS=target/release/plusfs PYTHON=.venv/bin/python RUNS=3 scripts/replica_servers_bench.sh
set -euo pipefail
: "${PLUSFS:?set PLUSFS to the plusfs binary}" "${PYTHON:?set PYTHON to a python}"
cd "$(dirname "$0")/.."
source scripts/bench_lib.sh
RUNS=${RUNS:-3}
SERVERS=${SERVERS:-2}
FILES=${FILES:-2000}
CLIENTS=${CLIENTS:-4}
BATCH=${BATCH:-1000}
OPS=${OPS:-500}
KILLS=${KILLS:-20}
CARGO=${CARGO:-cargo}
OUT=${OUT:-bench/out}
mkdir -p "$OUT"
RES="$OUT/replica-servers.jsonl"
: > "$RES"
WORK=$(mktemp -d)
CUR=""
cleanup() { [ -n "$CUR" ] && "$PLUSFS" cluster down --data "$CUR" >/dev/null 2>&1 || true; rm -rf "$WORK"; }
trap cleanup EXIT

# The pids of every server process of the current cluster.
pids() { local f; for f in "$CUR"/server-*.pid; do echo "$(cat "$f")"; done; }

# measure EXTRA_JSON OPS COMMAND...: runs COMMAND, adds the servers' CPU per operation
# (OPS operations) to its JSON lines.
measure() {
  local extra=$1 ops=$2; shift 2
  local before after out
  before=$(cpu $(pids))
  out=$("$@" 2>/dev/null)
  after=$(cpu $(pids))
  local us
  us=$("$PYTHON" -c "print(round(($after - $before) / $ops * 1e6, 1))")
  echo "$out" | tag "$extra" | tag "{\"server_cpu_us_per_op\": $us}" | tee -a "$RES"
}

for run in $(seq "$RUNS"); do
  for r in 1 3; do
    echo "== run $run, replicas $r" >&2
    [ -n "$CUR" ] && "$PLUSFS" cluster down --data "$CUR" >/dev/null 2>&1 || true
    CUR="$WORK/r$r-$run"
    "$PLUSFS" cluster up --servers "$SERVERS" --replicas "$r" --data "$CUR" --detach >/dev/null
    export PLUSFS_CLUSTER="$CUR/cluster.toml"
    tagj="{\"run\": $run, \"replicas\": $r"
    n=$((FILES * CLIENTS))
    for b in 1 "$BATCH"; do
      for phase in create stat unlink; do
        measure "$tagj, \"case\": \"$phase\"}" "$n" \
          "$PLUSFS" bench "$phase" -n "$FILES" -c "$CLIENTS" -b "$b" --dir "/m$b" --json
      done
    done
    measure "$tagj, \"case\": \"cx update\"}" $((OPS * CLIENTS)) \
      "$PLUSFS" xbench --json --procs "$CLIENTS" --ops "$OPS" --workload update --dir /x
    measure "$tagj, \"case\": \"bfo write 4KiB\"}" "$FILES" \
      "$PLUSFS" bench write -n "$FILES" --size 4096 -b "$BATCH" --dir /bfo --json
  done
done
"$PLUSFS" cluster down --data "$CUR" >/dev/null 2>&1 || true
CUR=""

echo "== failover ($KILLS kills)" >&2
$CARGO build --release -q -p plusfs-localcluster --example failover_bench
PLUSFS="$PLUSFS" "${CARGO_TARGET_DIR:-target}/release/examples/failover_bench" --kills "$KILLS" --servers "$SERVERS" |
  tee -a "$RES"
"$PYTHON" scripts/replica_servers_report.py "$RES"
