#!/usr/bin/env bash
# What mutual TLS and the metrics endpoints cost (issue "Running a cluster in the open"):
# the same workloads on clusters of SERVERS servers made three ways, alternated in each of
# RUNS rounds — `--insecure` (plain TCP), TLS (the default), and TLS with `--no-metrics`
# (no endpoint, requests not timed): unbatched and batched create and stat with CLIENTS
# clients, and `plusfs cp` of a CP_MIB MiB file into the cluster and back out. Each cluster
# is new, so every client connection pays its handshake. JSON lines in
# $OUT/security.jsonl; a table of medians and ratios from scripts/security_report.py.
#
#   PLUSFS=target/release/plusfs PYTHON=.venv/bin/python RUNS=3 scripts/security_bench.sh
set -euo pipefail
: "${PLUSFS:?set PLUSFS to the plusfs binary}" "${PYTHON:?set PYTHON to a python}"
cd "$(dirname "$0")/.."
source scripts/bench_lib.sh
RUNS=${RUNS:-3}
SERVERS=${SERVERS:-2}
FILES=${FILES:-2000}
CLIENTS=${CLIENTS:-4}
BATCH=${BATCH:-1000}
CP_MIB=${CP_MIB:-512}
OUT=${OUT:-bench/out}
mkdir -p "$OUT"
RES="$OUT/security.jsonl"
: > "$RES"
WORK=$(mktemp -d)
CUR=""
cleanup() { [ -n "$CUR" ] && "$PLUSFS" cluster down --data "$CUR" >/dev/null 2>&1 || true; rm -rf "$WORK"; }
trap cleanup EXIT
head -c $((CP_MIB << 20)) /dev/urandom > "$WORK/big"

# copy EXTRA_JSON FROM TO: `plusfs cp` of the big file, as a JSON line with its MiB/s.
copy() {
  local extra=$1 t0 t1
  t0=$(date +%s.%N)
  "$PLUSFS" cp -q "$2" "$3" >/dev/null
  t1=$(date +%s.%N)
  "$PYTHON" -c "import json,sys; print(json.dumps({'mib_per_sec': $CP_MIB / ($t1 - $t0)}))" | tag "$extra" | tee -a "$RES"
}

for run in $(seq "$RUNS"); do
  for mode in insecure tls tls-nometrics; do
    echo "== run $run, $mode" >&2
    [ -n "$CUR" ] && "$PLUSFS" cluster down --data "$CUR" >/dev/null 2>&1 || true
    CUR="$WORK/$mode-$run"
    case $mode in
      insecure) flags=(--insecure) ;;
      tls) flags=() ;;
      tls-nometrics) flags=(--no-metrics) ;;
    esac
    "$PLUSFS" cluster up --servers "$SERVERS" --data "$CUR" --detach "${flags[@]}" >/dev/null
    export PLUSFS_CLUSTER="$CUR/cluster.toml"
    tagj="{\"run\": $run, \"mode\": \"$mode\""
    for b in 1 "$BATCH"; do
      # Batched runs are ~100 times faster: ten times the files, so they last long enough.
      n=$FILES
      [ "$b" = 1 ] || n=$((FILES * 10))
      for phase in create stat unlink; do
        "$PLUSFS" bench "$phase" -n "$n" -c "$CLIENTS" -b "$b" --dir "/m$b" --json 2>/dev/null |
          tag "$tagj, \"case\": \"$phase\"}" | tee -a "$RES"
      done
    done
    copy "$tagj, \"case\": \"cp in\"}" "$WORK/big" plusfs:/big
    rm -f "$WORK/back"
    copy "$tagj, \"case\": \"cp out\"}" plusfs:/big "$WORK/back"
    cmp -s "$WORK/big" "$WORK/back" || { echo "cp out: contents differ" >&2; exit 1; }
  done
done
"$PLUSFS" cluster down --data "$CUR" >/dev/null 2>&1 || true
CUR=""
"$PYTHON" scripts/security_report.py "$RES"
