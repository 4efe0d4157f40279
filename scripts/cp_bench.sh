#!/usr/bin/env bash
# Batch migration (seed 002 Figs. 18-19): the Linux source tree (Debian's linux-source-6.1,
# TREE_TAR) copied local -> cluster, cluster -> local and local -> local with `plusfs cp`,
# and with `cp -r`, `rsync -a` and `tar c | tar x` through the FUSE mount (or locally).
# Page caches are dropped before every copy (as root); each copy is timed and the
# messages the servers received counted. Results: bench/out/cp/raw.jsonl and report.md.
set -euo pipefail
PLUSFS=${PLUSFS:-plusfs}
PYTHON=${PYTHON:-python3}
SERVERS=${SERVERS:-4}
TREE_TAR=${TREE_TAR:-/usr/src/linux-source-6.1.tar.xz}
cd "$(dirname "$0")/.."
. scripts/bench_lib.sh
out=bench/out/cp
mkdir -p "$out"
raw="$out/raw.jsonl"
: > "$raw"
work=$(mktemp -d -p "$PWD/bench/out" cp-work.XXXXXX)
cluster="$work/cluster" mnt="$work/mnt"
mkdir -p "$mnt" "$work/src"
cleanup() {
  fusermount3 -u "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
  "$PLUSFS" cluster down --data "$cluster" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
[ -f "$TREE_TAR" ] || { echo "missing $TREE_TAR: apt-get install linux-source-6.1" >&2; exit 1; }
tar xf "$TREE_TAR" -C "$work/src"
src="$work/src/$(ls "$work/src")"
echo "tree: $(find "$src" -type f | wc -l) files, $(du -sh "$src" | cut -f1)"
"$PLUSFS" cluster up --data "$cluster" --servers "$SERVERS" --detach >/dev/null
export PLUSFS_CLUSTER="$cluster/cluster.toml"
"$PLUSFS" mount "$mnt" >/dev/null

timed() {
  local direction=$1 method=$2; shift 2
  drop_caches
  local m0 t0 t1 m1 secs
  m0=$(msgs); t0=$(date +%s.%N)
  "$@"
  t1=$(date +%s.%N); m1=$(msgs)
  secs=$(printf '%.3f' "$(echo "$t1 - $t0" | bc)")
  echo "{\"direction\":\"$direction\",\"method\":\"$method\",\"seconds\":$secs,\"requests\":$((m1 - m0 - SERVERS))}" >> "$raw"
  echo "$direction $method: $secs s, $((m1 - m0 - SERVERS)) messages to servers"
}

timed local-to-cluster "plusfs cp" "$PLUSFS" cp -r -q "$src" plusfs:/pc
# MOUNT_WRITES=0 skips the (slow) copies into the mount.
if [ "${MOUNT_WRITES:-1}" = 1 ]; then
  timed local-to-cluster "cp -r (mount)" cp -r "$src" "$mnt/cp"
  timed local-to-cluster "rsync -a (mount)" rsync -a "$src/" "$mnt/rsync/"
  timed local-to-cluster "tar c | tar x (mount)" sh -c "tar cf - -C '$(dirname "$src")' '$(basename "$src")' | tar xf - -C '$mnt' --transform 's,^$(basename "$src"),tar,'"
fi

timed cluster-to-local "plusfs cp" "$PLUSFS" cp -r -q plusfs:/pc "$work/back-pc"
timed cluster-to-local "cp -r (mount)" cp -r "$mnt/pc" "$work/back-cp"
timed cluster-to-local "rsync -a (mount)" rsync -a "$mnt/pc/" "$work/back-rsync/"
timed cluster-to-local "tar c | tar x (mount)" sh -c "mkdir -p '$work/back-tar' && tar cf - -C '$mnt' pc | tar xf - -C '$work/back-tar'"
diff -r --no-dereference "$src" "$work/back-pc" >/dev/null && echo "copy back identical to the source"
rm -rf "$work"/back-*

timed local-to-local "plusfs cp" "$PLUSFS" cp -r -q "$src" "$work/l-pc"
timed local-to-local "cp -r" cp -r "$src" "$work/l-cp"
timed local-to-local "rsync -a" rsync -a "$src/" "$work/l-rsync/"
rm -rf "$work"/l-*

"$PYTHON" - "$raw" > "$out/report.md" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("# Copying the Linux 6.1 source tree (seconds, one run, cold caches)\n")
print("| direction | method | seconds | vs plusfs cp | messages to servers |")
print("|---|---|---|---|---|")
for d in ("local-to-cluster", "cluster-to-local", "local-to-local"):
    base = next((r["seconds"] for r in rows if r["direction"] == d and r["method"] == "plusfs cp"), None)
    for r in rows:
        if r["direction"] == d:
            ratio = f"{r['seconds'] / base:.2f}x" if base else "-"
            method = r["method"].replace("|", "\\|")
            print(f"| {d} | {method} | {r['seconds']:.1f} | {ratio} | {r['requests']:,} |")
EOF
cat "$out/report.md"
