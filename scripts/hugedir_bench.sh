#!/usr/bin/env bash
# Huge-directory benchmarks (seed 001 §V.B-C, seed 000 §5.2-5.3). JSON lines go to
# bench/out/hugedirs.jsonl (one per phase, tagged with the configuration), redistribution
# times and balance to bench/out/hugedirs-redistribution.txt; scripts/hugedir_report.py
# turns them into bench/out/hugedirs.md.
#
#   suites: redistribution (8,000-entry crossing and a forced 1,000,000-entry distribution
#                           on 4 and 8 servers: time and entries per server)
#           shared         (one shared directory, 8 clients, batch 1 and 1000,
#                           threshold never/dynamic/always, 1/2/4/8 servers)
#           multi          (8 directories at once, 1 and 8 clients each, batch 1000,
#                           never/dynamic/always, 1/2/4/8 servers: application time)
#           scale          (10,000,000 files in one directory, batches of 1000: create,
#                           stat, readdir, unlink; first vs last tenth; server memory)
set -euo pipefail
PLUSFS=${PLUSFS:-plusfs}
PYTHON=${PYTHON:-python3}
SUITES=${SUITES:-redistribution shared multi scale}
SERVERS=${SERVERS:-1 2 4 8}
SCALE_FILES=${SCALE_FILES:-10000000}
BIG=${BIG:-1000000}
cd "$(dirname "$0")/.."
. scripts/bench_lib.sh
out=bench/out
mkdir -p "$out"
raw="$out/hugedirs.jsonl"
redis="$out/hugedirs-redistribution.txt"
: > "$raw"
: > "$redis"
work=$(mktemp -d -t plusfs-hugedirs.XXXXXX)
current=""
cleanup() {
  if [ -n "$current" ]; then "$PLUSFS" cluster down --data "$current" >/dev/null 2>&1 || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

up() { # up NAME SERVERS: starts a fresh cluster (default threshold 8000)
  current="$work/$1"
  "$PLUSFS" cluster up --servers "$2" --data "$current" --detach >/dev/null
  export PLUSFS_CLUSTER="$current/cluster.toml"
}
down() {
  "$PLUSFS" cluster down --data "$current" >/dev/null
  rm -rf "$current"
  current=""
}
# The latest "directory distributed" log line of any server: milliseconds it took.
distributed_ms() { grep -h "directory distributed" "$current"/server-*.log | sed 's/\x1b\[[0-9;]*m//g' | sort | tail -1 | grep -o 'ms=[0-9]*' | cut -d= -f2; }
rss_mib() { # total resident memory of the cluster's servers
  local total=0
  for f in "$current"/server-*.pid; do
    local kb; kb=$(awk '/VmRSS/ {print $2}' "/proc/$(cat "$f")/status" 2>/dev/null || echo 0)
    total=$((total + kb))
  done
  echo $((total / 1024))
}
threshold_arg() { case $1 in never) echo never;; dynamic) echo cluster;; always) echo 0;; esac; }

for suite in $SUITES; do
  case $suite in
  redistribution)
    for n in 4 8; do
      up "redis$n" "$n"
      "$PLUSFS" bench create -n 8001 -b 1000 -d /crossing >/dev/null
      echo "servers=$n crossing 8000: $(distributed_ms) ms" | tee -a "$redis"
      "$PLUSFS" hugedir /crossing | tee -a "$redis"
      "$PLUSFS" bench create -n $((BIG / 4)) -b 1000 -c 4 -d /big --threshold never --json | tag "{\"suite\":\"redistribution\",\"servers\":$n}" >> "$raw"
      start=$(date +%s.%N)
      "$PLUSFS" hugedir /big --threshold 0 > "$work/big.txt"
      end=$(date +%s.%N)
      echo "servers=$n forced at $BIG entries: $(distributed_ms) ms (command $("$PYTHON" -c "print(round($end - $start, 2))") s)" | tee -a "$redis"
      tee -a "$redis" < "$work/big.txt"
      "$PLUSFS" fsck | tail -1 | tee -a "$redis"
      down
    done
    ;;
  shared)
    for n in $SERVERS; do
      for mode in never dynamic always; do
        for b in 1 1000; do
          files=$([ "$b" = 1 ] && echo 2000 || echo 20000)
          up "shared$n$mode$b" "$n"
          "$PLUSFS" bench -c 8 -n "$files" -b "$b" -d "/shared" --threshold "$(threshold_arg $mode)" --json \
            | tag "{\"suite\":\"shared\",\"servers\":$n,\"mode\":\"$mode\"}" >> "$raw"
          echo "shared servers=$n mode=$mode batch=$b done"
          down
        done
      done
    done
    ;;
  multi)
    for n in $SERVERS; do
      for mode in never dynamic always; do
        for per in 1 8; do
          up "multi$n$mode$per" "$n"
          "$PLUSFS" bench -c $((8 * per)) -n $((32000 / per)) -b 1000 --dirs 8 -d "/multi" \
            --threshold "$(threshold_arg $mode)" --json \
            | tag "{\"suite\":\"multi\",\"servers\":$n,\"mode\":\"$mode\",\"per_dir\":$per}" >> "$raw"
          echo "multi servers=$n mode=$mode clients/dir=$per done"
          down
        done
      done
    done
    ;;
  scale)
    up scale 4
    per=$((SCALE_FILES / 4))
    "$PLUSFS" bench create -c 4 -n "$per" -b 1000 -d /scale --json | tag '{"suite":"scale","servers":4}' >> "$raw"
    echo "scale: after create, servers resident $(rss_mib) MiB" | tee -a "$redis"
    "$PLUSFS" bench stat -c 4 -n "$per" -b 1000 -d /scale --json | tag '{"suite":"scale","servers":4}' >> "$raw"
    "$PLUSFS" bench readdir -c 1 -n 1 -d /scale --json | tag '{"suite":"scale","servers":4}' >> "$raw"
    "$PLUSFS" hugedir /scale | tee -a "$redis"
    "$PLUSFS" bench unlink -c 4 -n "$per" -b 1000 -d /scale --json | tag '{"suite":"scale","servers":4}' >> "$raw"
    echo "scale: at the end, servers resident $(rss_mib) MiB" | tee -a "$redis"
    down
    ;;
  *) echo "unknown suite $suite" >&2; exit 2 ;;
  esac
done
"$PYTHON" scripts/hugedir_report.py "$raw" "$redis" > "$out/hugedirs.md"
echo "report: $out/hugedirs.md"
