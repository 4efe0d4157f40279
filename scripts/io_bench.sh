#!/usr/bin/env bash
# Large-file bandwidth in one run: file-per-process and shared-file write and read with
# 1, 2 and 4 processes, through the native API, through a mount, and on tmpfs, next to
# the wire probe (the same bytes to and from the servers with requests that store
# nothing). Each phase is its own `plusfs bench` call, so the servers' and the mount's CPU
# seconds per GiB are measured around it; reads run after the page cache was dropped.
# Results: bench/out/io/raw.jsonl and report.md (scripts/io_report.py).
# CLIENTS, MODES and OUT narrow a run (e.g. CLIENTS=2 MODES=own OUT=bench/out/io-ab).
set -euo pipefail
export LC_ALL=C
PLUSFS=${PLUSFS:-plusfs}
PYTHON=${PYTHON:-python3}
SERVERS=${SERVERS:-4}
RUNS=${RUNS:-3}
SIZE=${SIZE:-256MiB}
BLOCK=${BLOCK:-16MiB}
CLIENTS=${CLIENTS:-1 2 4}
MODES=${MODES:-own shared}
OUT=${OUT:-bench/out/io}
cd "$(dirname "$0")/.."
. scripts/bench_lib.sh
out=$OUT
mkdir -p "$out"
raw="$out/raw.jsonl"
: > "$raw"
work=$(mktemp -d -p "$PWD/bench/out" io-work.XXXXXX)
cluster="$work/cluster" mnt="$work/mnt" local="$work/local"
mkdir -p "$mnt" "$local"
if [ "$(id -u)" != 0 ] || ! mount -t tmpfs -o size=6g plusfs-io "$local" 2>/dev/null; then
  echo "needs root: it mounts the tmpfs it compares with and drops the page cache" >&2
  exit 1
fi
cleanup() {
  umount "$local" 2>/dev/null || true
  fusermount3 -u "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
  "$PLUSFS" cluster down --data "$cluster" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

"$PLUSFS" cluster up --data "$cluster" --servers "$SERVERS" --detach >/dev/null
export PLUSFS_CLUSTER="$cluster/cluster.toml"
"$PLUSFS" mount "$mnt" >/dev/null
servers=$(pgrep -f "server --cluster $cluster/cluster.toml" | tr '\n' ' ')
mount_pid=$(pgrep -f "mount -f $mnt" | head -1)

# CPU seconds processes $2... used since they had used $1 (a JSON number).
since() { local before=$1; shift; awk -v a="$(cpu "$@")" -v b="$before" 'BEGIN { printf "%.3f", a - b }'; }

# one TARGET MODE CLIENTS RUN PHASE: one phase, one JSON line with CPU seconds added.
one() {
  local target=$1 mode=$2 c=$3 run=$4 phase=$5 extra=()
  local dir="/io-$mode-$c-$run-$(case $target in plusfs) echo api ;; "local:$mnt") echo mount ;; *) echo tmpfs ;; esac)"
  [ "$mode" = shared ] && extra+=(--shared-file) || extra+=(--unique)
  case $phase in read|probe-read) drop_caches ;; esac
  local s0 m0
  s0=$(cpu $servers); m0=$(cpu $mount_pid)
  local json
  json=$("$PLUSFS" bench "$phase" --size "$SIZE" --block "$BLOCK" -n 1 -c "$c" --dir "$dir" \
    --target "$target" --json "${extra[@]}")
  echo "$json" \
    | tag "{\"mode\":\"$mode\",\"run\":$run,\"server_cpu\":$(since "$s0" $servers),\"mount_cpu\":$(since "$m0" $mount_pid)}" \
    | tee -a "$raw" | "$PYTHON" -c 'import json,sys
for l in sys.stdin:
    d = json.loads(l)
    print("%-40s %-7s %d %-11s %8.1f MiB/s %6.2f req/MiB" % (d["target"], d["mode"], d["clients"], d["phase"], d["mib_per_sec"], d["requests_per_mib"]))'
}

for run in $(seq 1 "$RUNS"); do
  for c in $CLIENTS; do
    for mode in $MODES; do
      one plusfs "$mode" "$c" "$run" probe-write
      one plusfs "$mode" "$c" "$run" probe-read
      for target in plusfs "local:$mnt" "local:$local"; do
        one "$target" "$mode" "$c" "$run" write
        one "$target" "$mode" "$c" "$run" read
      done
      rm -rf "$mnt/io-$mode-$c-$run-"* "$local/io-$mode-$c-$run-"*
    done
  done
done
"$PLUSFS" cluster status > "$out/cluster-status.txt"
"$PYTHON" scripts/io_report.py "$raw" "$mnt" "$local" "$SIZE" "$BLOCK" > "$out/report.md"
cat "$out/report.md"
