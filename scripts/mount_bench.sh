#!/usr/bin/env bash
# The FUSE mount measured against the native API and a local directory, in one run:
#   1. create, stat, unlink of empty files, 1 and 4 processes (plusfs bench, 3 targets);
#   2. write and read of 4 KiB and 1 MiB files (1 process, 3 targets);
#   3. `ls -l` of a 100,000-file directory through the mount, with readdirplus and with
#      -o noreaddirplus (requests counted by the servers), and in the local directory;
#   4. `rm -rf` of that directory, mount vs local;
#   5. `tar x` of a real source tree (/usr/include) into the mount vs into a local dir.
# Results: JSON lines in bench/out/mount/raw.jsonl, report bench/out/mount/report.md.
# Page caches are dropped (as root) before each timed step of 3-5.
set -euo pipefail
PLUSFS=${PLUSFS:-plusfs}
PYTHON=${PYTHON:-python3}
SERVERS=${SERVERS:-4}
RUNS=${RUNS:-3}
FILES=${FILES:-2000}
BIG=${BIG:-100000}
TREE=${TREE:-/usr/include}
cd "$(dirname "$0")/.."
. scripts/bench_lib.sh
out=bench/out/mount
mkdir -p "$out"
raw="$out/raw.jsonl"
: > "$raw"
# The local directory sits on the same disk as the cluster's data.
work=$(mktemp -d -p "$PWD/bench/out" mount-work.XXXXXX)
cluster="$work/cluster" mnt="$work/mnt" local="$work/local"
mkdir -p "$mnt" "$local"
cleanup() {
  fusermount3 -u "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
  "$PLUSFS" cluster down --data "$cluster" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

# Runs a command, appends {"step","target","run","seconds","requests"} to raw.jsonl.
timed() {
  local step=$1 target=$2 run=$3; shift 3
  drop_caches
  local m0; m0=$(msgs)
  local t0; t0=$(date +%s.%N)
  "$@"
  local t1; t1=$(date +%s.%N)
  local m1; m1=$(msgs)
  # The two status scans cost one request per server each.
  local secs; secs=$(printf '%.3f' "$(echo "$t1 - $t0" | bc)")
  echo "{\"step\":\"$step\",\"target\":\"$target\",\"run\":$run,\"seconds\":$secs,\"requests\":$((m1 - m0 - SERVERS))}" >> "$raw"
  echo "$step [$target, run $run]: $secs s, $((m1 - m0 - SERVERS)) messages to servers"
}
remount() {
  fusermount3 -u "$mnt" 2>/dev/null || true
  "$PLUSFS" mount --cluster "$cluster/cluster.toml" "$mnt" ${1:+-o "$1"} >/dev/null
}

"$PLUSFS" cluster up --data "$cluster" --servers "$SERVERS" --detach >/dev/null
export PLUSFS_CLUSTER="$cluster/cluster.toml"
remount
tarball="$work/tree.tar"
tar cf "$tarball" -C "$(dirname "$TREE")" "$(basename "$TREE")"
echo "tree: $(tar tf "$tarball" | grep -vc '/$') files, $(du -h "$tarball" | cut -f1) in $TREE"

for run in $(seq 1 "$RUNS"); do
  for c in 1 4; do
    echo "== run $run: create/stat/unlink, $c processes, $FILES files each"
    "$PLUSFS" bench create stat unlink --cluster "$cluster/cluster.toml" -n "$FILES" -c "$c" --unique \
      --dir "/m$run-$c" --target plusfs --target "local:$mnt" --target "local:$local" --json |
      tag "{\"step\":\"meta\",\"run\":$run}" | tee -a "$raw" >/dev/null
  done
  for size in 4096 1048576; do
    n=$((size == 4096 ? FILES : 100))
    echo "== run $run: write/read of $n files of $size bytes"
    "$PLUSFS" bench write read unlink --cluster "$cluster/cluster.toml" -n "$n" --size "$size" --unique \
      --dir "/rw$run-$size" --target plusfs --target "local:$mnt" --target "local:$local" --json |
      tag "{\"step\":\"rw\",\"run\":$run,\"size\":$size}" | tee -a "$raw" >/dev/null
  done
done

echo "== $BIG files in one directory (batched creates), then ls -l"
"$PLUSFS" bench create --cluster "$cluster/cluster.toml" -n "$BIG" -b 1000 --dir /big --json >/dev/null
mkdir -p "$local/big"
(cd "$local/big" && seq 0 $((BIG - 1)) | sed 's/^/f.0./' | xargs touch)
for run in $(seq 1 "$RUNS"); do
  remount
  timed ls-l mount-readdirplus "$run" sh -c "ls -l '$mnt/big' > /dev/null"
  remount noreaddirplus
  timed ls-l mount-noreaddirplus "$run" sh -c "ls -l '$mnt/big' > /dev/null"
  timed ls-l local "$run" sh -c "ls -l '$local/big' > /dev/null"
done
remount
timed rm-rf mount 1 rm -rf "$mnt/big"
timed rm-rf local 1 rm -rf "$local/big"

for run in $(seq 1 "$RUNS"); do
  mkdir -p "$mnt/t$run" "$local/t$run"
  timed tar-x mount "$run" tar xf "$tarball" -C "$mnt/t$run"
  timed tar-x local "$run" tar xf "$tarball" -C "$local/t$run"
done
if ! diff -r --no-dereference "$local/t1" "$mnt/t1" >/dev/null; then
  echo "the tree extracted into the mount differs from the local one" >&2
  exit 1
fi
echo "tree extracted into the mount is identical to the local one"
"$PYTHON" scripts/mount_report.py "$raw" > "$out/report.md"
cat "$out/report.md"
