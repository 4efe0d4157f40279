#!/usr/bin/env bash
# The FUSE mount measured against the native API and a tmpfs directory, in one run:
#   1. create, stat, open+close, unlink of empty files, 1/2/4 processes, unique and shared
#      directories (plusfs bench, 3 targets), with the mount's FUSE requests and server
#      requests per operation (plusfs mount --stats);
#   2. write and read of 4 KiB and 1 MiB files (1 process, 3 targets);
#   3. `ls -l` of a 100,000-file directory through the mount, with readdirplus and with
#      -o noreaddirplus (requests counted by the servers), and in the local directory;
#   4. `rm -rf` of that directory, mount vs local;
#   5. `tar x`, `ls -lR`, `rm -rf` of a real source tree (/usr/include) and a C build
#      (`./configure && make -j2` of PROJECT, a source tarball with a configure script; by
#      default a generated project of C files and a Makefile), mount vs tmpfs.
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
# Extra mount options for every mount of the run (e.g. nodefault_permissions).
MOUNT_OPTS=${MOUNT_OPTS:-}
cd "$(dirname "$0")/.."
. scripts/bench_lib.sh
out=bench/out/mount
mkdir -p "$out"
raw="$out/raw.jsonl"
: > "$raw"
work=$(mktemp -d -p "$PWD/bench/out" mount-work.XXXXXX)
cluster="$work/cluster" mnt="$work/mnt" local="$work/local"
mkdir -p "$mnt" "$local"
# The local directory is a tmpfs where we may mount one (this machine's disk file system
# creates files artefactually slowly), else a directory on the cluster's disk.
localfs=$(mount_local "$local")
echo "local directory: $localfs"
cleanup() {
  umount "$local" 2>/dev/null || true
  unmount_fuse "$mnt"
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
  local o=${1:-}${1:+${MOUNT_OPTS:+,}}${MOUNT_OPTS}
  "$PLUSFS" mount --cluster "$cluster/cluster.toml" "$mnt" ${o:+-o "$o"} >/dev/null
}

"$PLUSFS" cluster up --data "$cluster" --servers "$SERVERS" --detach >/dev/null
export PLUSFS_CLUSTER="$cluster/cluster.toml"
remount
tarball="$work/tree.tar"
tar cf "$tarball" -C "$(dirname "$TREE")" "$(basename "$TREE")"
echo "tree: $(tar tf "$tarball" | grep -vc '/$') files, $(du -h "$tarball" | cut -f1) in $TREE"

# The mount's own counters (FUSE requests and the server requests they sent, in all).
fuse_totals() { "$PLUSFS" mount --stats "$mnt" | awk '$1 == "total" { print $2, $4 }'; }

for run in $(seq 1 "$RUNS"); do
  for c in 1 2 4; do
    for layout in unique shared; do
      dir="/m$run-$c-$layout"
      for phase in create stat open unlink; do
        echo "== run $run: $phase, $c processes, $layout directories, $FILES files each"
        # The native API works in its own directory: the mount's files are the cluster's too.
        "$PLUSFS" bench "$phase" --cluster "$cluster/cluster.toml" -n "$FILES" -c "$c" "--$layout" \
          --dir "/native$dir" --target plusfs --json |
          tag "{\"step\":\"meta\",\"run\":$run,\"layout\":\"$layout\"}" | tee -a "$raw" >/dev/null
        read -r f0 r0 < <(fuse_totals)
        "$PLUSFS" bench "$phase" --cluster "$cluster/cluster.toml" -n "$FILES" -c "$c" "--$layout" \
          --dir "$dir" --target "local:$mnt" --target "local:$local" --json |
          tag "{\"step\":\"meta\",\"run\":$run,\"layout\":\"$layout\"}" | tee -a "$raw" >/dev/null
        read -r f1 r1 < <(fuse_totals)
        # The stats file's own open/read/release are 4 FUSE requests without server requests.
        echo "{\"step\":\"fuse\",\"run\":$run,\"phase\":\"$phase\",\"clients\":$c,\"layout\":\"$layout\",\"ops\":$((FILES * c)),\"fuse\":$((f1 - f0 - 4)),\"requests\":$((r1 - r0))}" >> "$raw"
      done
    done
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

# A C project to build: PROJECT (a source tarball with ./configure), or a generated one.
project="$work/project.tar"
if [ -n "${PROJECT:-}" ]; then
  cp "$PROJECT" "$project"
else
  "$PYTHON" scripts/gen_c_project.py "$work/gen" && tar cf "$project" -C "$work/gen" .
fi
for run in $(seq 1 "$RUNS"); do
  mkdir -p "$mnt/t$run" "$local/t$run" "$mnt/b$run" "$local/b$run"
  timed tar-x mount "$run" sh -c "tar xf '$tarball' -C '$mnt/t$run' && sync"
  timed tar-x local "$run" sh -c "tar xf '$tarball' -C '$local/t$run' && sync"
  timed ls-lR mount "$run" sh -c "ls -lR '$mnt/t$run' > /dev/null"
  timed ls-lR local "$run" sh -c "ls -lR '$local/t$run' > /dev/null"
  for where in mount local; do
    d=$([ $where = mount ] && echo "$mnt/b$run" || echo "$local/b$run")
    tar xf "$project" -C "$d" --strip-components=1 2>/dev/null || tar xf "$project" -C "$d"
    timed c-build $where "$run" sh -c "cd '$d' && ./configure > /dev/null && make -j2 > /dev/null"
  done
done
if ! diff -r --no-dereference "$local/t1" "$mnt/t1" >/dev/null; then
  echo "the tree extracted into the mount differs from the local one" >&2
  exit 1
fi
echo "tree extracted into the mount is identical to the local one"
for run in $(seq 1 "$RUNS"); do
  timed rm-rf-tree mount "$run" sh -c "rm -rf '$mnt/t$run' && sync"
  timed rm-rf-tree local "$run" sh -c "rm -rf '$local/t$run' && sync"
done
"$PLUSFS" mount --stats "$mnt" > "$out/fuse-stats.txt"
"$PYTHON" scripts/mount_report.py "$raw" > "$out/report.md"
cat "$out/report.md"
