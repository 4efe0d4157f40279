#!/usr/bin/env bash
# What an operation costs as a directory grows (issue "Directories of any size at full
# speed through the mount"). One directory of the cluster is grown step by step to each
# size of SIZES (filled through the native API in batches); at each size, mdtest-style
# create, stat and unlink of OPS new files (so the rate is that of the last OPS operations
# at that size) are measured with 1 and 4 processes through the FUSE mount (default
# options: delegations), through the mount with -o nodeleg, and through the native API
# (one request per operation), all in that same directory; a tmpfs directory grown the
# same way is the yardstick. Before each size the servers are left to settle after the
# fill, and each target makes a few changes before it is measured (the mount takes the
# shards' delegations back from the client before it); what that hand-over costs is
# measured apart. The mount's RSS is read at each size. At the largest size,
# `ls -f | wc -l`, `ls -l`, `find -name` and `rm -rf` run through the mount and on tmpfs.
# Results: JSON lines in bench/out/bigdir/raw.jsonl, report bench/out/bigdir/report.md.
set -euo pipefail
PLUSFS=${PLUSFS:-plusfs}
PYTHON=${PYTHON:-python3}
SERVERS=${SERVERS:-4}
OPS=${OPS:-3000}
SIZES=${SIZES:-3000 30000 300000}
PROCS=${PROCS:-1 4}
cd "$(dirname "$0")/.."
. scripts/bench_lib.sh
out=bench/out/bigdir
mkdir -p "$out"
raw="$out/raw.jsonl"
: > "$raw"
work=$(mktemp -d -p "$PWD/bench/out" bigdir-work.XXXXXX)
cluster="$work/cluster" mnt="$work/mnt" nodeleg="$work/mnt-nodeleg" local="$work/local"
mkdir -p "$mnt" "$nodeleg" "$local"
localfs=$(mount_local "$local")
echo "local directory: $localfs"
cleanup() {
  umount "$local" 2>/dev/null || true
  unmount_fuse "$mnt" "$nodeleg"
  "$PLUSFS" cluster down --data "$cluster" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

"$PLUSFS" cluster up --data "$cluster" --servers "$SERVERS" --detach >/dev/null
export PLUSFS_CLUSTER="$cluster/cluster.toml"
# `plusfs mount` returns once the mount is ready and says which process serves it.
mount_pid=$("$PLUSFS" mount "$mnt" | sed -n 's/.*process \([0-9]*\).*/\1/p')
"$PLUSFS" mount "$nodeleg" -o nodeleg >/dev/null
for m in "$mnt" "$nodeleg"; do
  mountpoint -q "$m" || { echo "mount $m failed" >&2; exit 1; }
done
[ -n "$mount_pid" ] || { echo "no process id from plusfs mount" >&2; exit 1; }
rss() { awk '/VmRSS/ { print $2 * 1024 }' "/proc/$mount_pid/status"; }

# Waits until cluster directory $1 is no longer being spread over servers, then until the
# servers are idle (the bulk fill leaves them compacting, which is not what is measured).
settled() {
  for _ in $(seq 1 1200); do
    "$PLUSFS" hugedir "$1" 2>/dev/null | grep -qi distributing || break
    sleep 0.1
  done
  local pids ticks last quiet=0
  pids=$(pgrep -f "server --cluster $cluster/" || true)
  [ -n "$pids" ] || return 0
  ticks() { for p in $pids; do awk '{ print $14 + $15 }' "/proc/$p/stat" 2>/dev/null; done | awk '{ s += $1 } END { print s }'; }
  last=$(ticks)
  for _ in $(seq 1 120); do
    sleep 1
    now=$(ticks)
    # Under 5 % of one CPU for 3 seconds in a row.
    if [ $((now - last)) -le 5 ]; then quiet=$((quiet + 1)); else quiet=0; fi
    last=$now
    [ "$quiet" -ge 3 ] && return 0
  done
  echo "warning: the servers stayed busy" >&2
}

# The cost of taking a grown directory over from another client: the native API creates
# a few files (recalling the mount's delegations of every shard), then the mount's first
# 40 creates wait for the new grants, whose name digests the servers read from the
# whole directory.
handover() {
  "$PLUSFS" bench -n 8 -d "$dir" --prefix "h$1" create >/dev/null
  local t0 t1
  t0=$(date +%s%N)
  for k in $(seq 1 40); do : > "$mnt$dir/h$1.mount.$k"; done
  t1=$(date +%s%N)
  echo "{\"size\":$1,\"handover_ms\":$(((t1 - t0) / 1000000))}" >> "$raw"
  rm -f "$mnt$dir"/h"$1".mount.*
  "$PLUSFS" bench -n 8 -d "$dir" --prefix "h$1" unlink >/dev/null
}

# Each target once on a few files first: the mounts' first requests set up connections and
# delegations, which is not what is measured.
for target in "local:$mnt" "local:$nodeleg" plusfs "local:$local"; do
  "$PLUSFS" bench --target "$target" -n 200 -c 1 -d /warm-up >/dev/null
done

dir=/big
mkdir -p "$mnt$dir" "$local$dir"
have=0
for size in $SIZES; do
  add=$((size - have))
  if [ "$add" -gt 0 ]; then
    echo "growing the directories to $size entries" >&2
    "$PLUSFS" bench -n "$add" -b 1000 -d "$dir" --prefix "fill$size" create >/dev/null
    "$PLUSFS" bench --target "local:$local" -n "$add" -d "$dir" --prefix "fill$size" create >/dev/null
    have=$size
  fi
  settled "$dir"
  echo "{\"size\":$size,\"mount_rss\":$(rss)}" >> "$raw"
  handover "$size"
  for procs in $PROCS; do
    for target in mount nodeleg native local; do
      case $target in
        mount) args=(--target "local:$mnt") ;;
        nodeleg) args=(--target "local:$nodeleg") ;;
        native) args=() ;;
        local) args=(--target "local:$local") ;;
      esac
      echo "$size entries: $target, $procs process(es)" >&2
      # A few operations first: the mount takes its delegations of the directory's shards
      # back from the client before it (measured apart: handover).
      "$PLUSFS" bench "${args[@]}" -n 40 -d "$dir" --prefix "w$procs$target" create unlink >/dev/null
      "$PLUSFS" bench "${args[@]}" -n $((OPS / procs)) -c "$procs" -d "$dir" --prefix "m$procs" --json \
        create stat unlink |
        tag "{\"size\":$size,\"procs\":$procs,\"target\":\"$target\",\"localfs\":\"$localfs\"}" >> "$raw"
    done
  done
  echo "{\"size\":$size,\"mount_rss_after\":$(rss)}" >> "$raw"
done

# Whole-directory work at the largest size: through the mount and on tmpfs.
timed() { # name, target, command...
  local name=$1 target=$2 t0 t1 out
  shift 2
  t0=$(date +%s.%N)
  out=$("$@" 2>&1 | tail -1)
  t1=$(date +%s.%N)
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')
  echo "{\"size\":$have,\"tool\":\"$name\",\"target\":\"$target\",\"seconds\":$secs,\"out\":\"$out\"}" >> "$raw"
  echo "  $name on $target: $secs s ($out)" >&2
}
for target in mount local; do
  case $target in mount) d="$mnt$dir" ;; local) d="$local$dir" ;; esac
  timed "ls -f | wc -l" "$target" sh -c "ls -f '$d' | wc -l"
  timed "ls -l" "$target" sh -c "ls -l '$d' | wc -l"
  timed "find -name" "$target" sh -c "find '$d' -name 'fill*9' | wc -l"
  [ "$target" = mount ] && echo "{\"size\":$have,\"mount_rss_listed\":$(rss)}" >> "$raw"
  timed "rm -rf" "$target" sh -c "rm -rf '$d'; echo done"
done

"$PYTHON" scripts/bigdir_report.py "$raw" > "$out/report.md"
cat "$out/report.md"
