#!/usr/bin/env bash
# The papers' comparisons on a private network (`cluster up --netns`, needs root): 8 servers
# and a client host in their own namespaces, every link delayed by DELAYS (one way, added by
# the per-server proxy), against the same cluster on loopback (which also gives the proxy's
# own cost). Per delay and run, from client host c0:
#   batch   create/stat/unlink, batch 1 vs 1000 (seed 000 Figs. 9-12)
#   hugedir creates and stats in one shared directory: never / dynamic / always spread
#           (seed 000 Tables 3-4)
#   txn     the update mix under cx, 2pc and serial (seed 004 Figs. 5-6, Table IV)
#   bfo     small-file writes and reads, per file vs batch (seed 002)
# JSON lines in $OUT/raw.jsonl; scripts/network_report.py writes the report.
#
#   PLUSFS=target/release/plusfs PYTHON=.venv/bin/python RUNS=3 scripts/network_bench.sh
set -euo pipefail
export LC_ALL=C
: "${PLUSFS:?set PLUSFS to the plusfs binary}" "${PYTHON:?set PYTHON to a python}"
SERVERS=${SERVERS:-8}
RUNS=${RUNS:-3}
DELAYS=${DELAYS:-"loopback 0us 100us 1ms"}
FILES=${FILES:-2000}         # files per client (4 clients) in the batch part
SMALL=${SMALL:-500}          # 4 KiB files per client (4 clients) in the bfo part
HUGE=${HUGE:-2500}           # files per client (4 clients) in the shared directory
XOPS=${XOPS:-300}            # xbench operations per process (8 processes)
PARTS=${PARTS:-"batch bfo hugedir txn"}  # which of the parts above to run
OUT=${OUT:-bench/out/network}
cd "$(dirname "$0")/.."
. scripts/bench_lib.sh
if [ "$(id -u)" != 0 ]; then
  echo "needs root: the cluster runs in network namespaces" >&2
  exit 1
fi
mkdir -p "$OUT"
raw="$OUT/raw.jsonl"
: > "$raw"
work=$(mktemp -d -p "$PWD/bench/out" net-work.XXXXXX)
cur=""
cleanup() { [ -n "$cur" ] && "$PLUSFS" cluster down --data "$cur" >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT

# fresh DELAY [cluster up options…]: a new cluster on loopback or on a private network.
fresh() {
  local delay=$1; shift
  [ -n "$cur" ] && "$PLUSFS" cluster down --data "$cur" >/dev/null 2>&1 || true
  cur="$work/c"
  rm -rf "$cur"
  case $delay in
    loopback) "$PLUSFS" cluster up --servers "$SERVERS" --data "$cur" --detach "$@" >/dev/null ;;
    *) "$PLUSFS" cluster up --servers "$SERVERS" --data "$cur" --detach --netns --clients 1 --delay "$delay" "$@" >/dev/null ;;
  esac
}

# on DELAY CMD…: runs a plusfs command as a client (on host c0 of a private network).
on() {
  local delay=$1; shift
  case $delay in
    loopback) PLUSFS_CLUSTER="$cur/cluster.toml" "$PLUSFS" "$@" ;;
    *) "$PLUSFS" netns exec --data "$cur" c0 -- "$PLUSFS" "$@" ;;
  esac
}

for run in $(seq 1 "$RUNS"); do
  for delay in $DELAYS; do
    t="{\"delay\":\"$delay\",\"run\":$run"
    echo "== run $run, delay $delay" >&2
    want() { case " $PARTS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
    fresh "$delay"
    want batch && for b in 1 1000; do
      on "$delay" bench create stat unlink -n "$FILES" -c 4 -b "$b" --dir "/batch-$b" --json \
        | tag "$t,\"part\":\"batch\"}" | tee -a "$raw" >/dev/null
    done
    want bfo && for b in 1 1000; do
      on "$delay" bench write read -n "$SMALL" -c 4 --size 4096 -b "$b" --dir "/bfo-$b" --json \
        | tag "$t,\"part\":\"bfo\"}" | tee -a "$raw" >/dev/null
    done
    want hugedir && for th in never 8000 0; do
      on "$delay" bench create stat -n "$HUGE" -c 4 --shared --threshold "$th" --dir "/huge-$th" --json \
        | tag "$t,\"part\":\"hugedir\",\"threshold\":\"$th\"}" | tee -a "$raw" >/dev/null
    done
    want txn && for proto in cx 2pc serial; do
      fresh "$delay" --txn "$proto"
      on "$delay" xbench --json --procs 8 --ops "$XOPS" --workload update --dir /x \
        | tag "$t,\"part\":\"txn\",\"protocol\":\"$proto\"}" | tee -a "$raw" >/dev/null
    done
  done
done
"$PYTHON" scripts/network_report.py "$raw" > "$OUT/report.md"
cat "$OUT/report.md"
