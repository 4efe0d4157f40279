#!/usr/bin/env bash
# The mount over its two kernel transports (/dev/fuse and FUSE over io_uring) against
# tmpfs and against the FUSE floor (an in-memory FUSE file system on the same transport), in
# one run: `tar x`, `ls -lR`, `rm -rf` of a real tree (TREE, default /usr/include), a `git
# clone` (checkout) of this repository, a C build (scripts/gen_c_project.py, make -j2), and
# mdtest-style create and remove rates (plusfs bench, 1 process, FILES files). For plusfs
# mounts: FUSE requests per extracted file and microseconds per FUSE request, and the
# lookups and getattrs among them.
#
# The plusfs mounts are PLUSFS_TARGETS, NAME:OPTIONS pairs (default
# "plusfs-devfuse:nouring plusfs-uring:uring"; e.g. add "plusfs-uring-dt0:uring,deleg_ttl=0"
# to compare without the kernel's longer caches under delegations). A NAME containing
# "uring" is compared with the floor over io_uring, others with the floor over /dev/fuse.
#
# The floor is FLOOR_FS: the path of an in-memory FUSE file system built outside this
# project, taking `-o io_uring` for its io_uring transport, e.g. libfuse's example
# `memfs_ll` (libfuse 3.18 or later); without it, the floor columns are left out.
# Needs root (switches /sys/module/fuse/parameters/enable_uring on, restores it; drops caches).
# Results: bench/out/transport/raw.jsonl and report.md.
set -euo pipefail
PLUSFS=${PLUSFS:-plusfs}
PYTHON=${PYTHON:-python3}
SERVERS=${SERVERS:-4}
RUNS=${RUNS:-3}
FILES=${FILES:-2000}
TREE=${TREE:-/usr/include}
FLOOR_FS=${FLOOR_FS:-}
PLUSFS_TARGETS=${PLUSFS_TARGETS:-plusfs-devfuse:nouring plusfs-uring:uring}
cd "$(dirname "$0")/.."
. scripts/bench_lib.sh
switch=/sys/module/fuse/parameters/enable_uring
[ -e "$switch" ] || { echo "$switch missing: this kernel has no FUSE over io_uring" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "needs root (the io_uring switch)" >&2; exit 1; }
out=bench/out/transport
mkdir -p "$out"
raw="$out/raw.jsonl"
: > "$raw"
: > "$out/fuse-stats.txt"
work=$(mktemp -d -p "$PWD/bench/out" transport-work.XXXXXX)
cluster="$work/cluster"
plusfs_targets=""
for p in $PLUSFS_TARGETS; do plusfs_targets="$plusfs_targets ${p%%:*}"; done
targets="$plusfs_targets tmpfs"
[ -n "$FLOOR_FS" ] && targets="$targets floor-devfuse floor-uring"
for t in $targets; do mkdir -p "$work/$t"; done
before=$(cat "$switch")
floor_pids=()
cleanup() {
  for t in $targets; do unmount_fuse "$work/$t"; umount "$work/$t" 2>/dev/null || true; done
  for p in "${floor_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  "$PLUSFS" cluster down --data "$cluster" >/dev/null 2>&1 || true
  echo "$before" > "$switch"
  rm -rf "$work"
}
trap cleanup EXIT
echo Y > "$switch"

"$PLUSFS" cluster up --data "$cluster" --servers "$SERVERS" --detach >/dev/null
export PLUSFS_CLUSTER="$cluster/cluster.toml"
for p in $PLUSFS_TARGETS; do "$PLUSFS" mount "$work/${p%%:*}" -o "${p#*:}" >/dev/null; done
[ "$(mount_local "$work/tmpfs")" = tmpfs ] || { echo "cannot mount a tmpfs" >&2; exit 1; }
if [ -n "$FLOOR_FS" ]; then
  "$FLOOR_FS" "$work/floor-devfuse" & floor_pids+=($!)
  "$FLOOR_FS" -o io_uring "$work/floor-uring" & floor_pids+=($!)
  for t in floor-devfuse floor-uring; do
    for _ in $(seq 100); do mountpoint -q "$work/$t" && break; sleep 0.1; done
    mountpoint -q "$work/$t" || { echo "$FLOOR_FS did not mount on $work/$t" >&2; exit 1; }
  done
fi
for t in $plusfs_targets; do "$PLUSFS" mount --stats "$work/$t" | grep '^transport'; done

tarball="$work/tree.tar"
tar cf "$tarball" -C "$(dirname "$TREE")" "$(basename "$TREE")"
files=$(tar tf "$tarball" | grep -vc '/$')
echo "tree: $files files, $(du -h "$tarball" | cut -f1) in $TREE"
project="$work/project.tar"
"$PYTHON" scripts/gen_c_project.py "$work/gen" && tar cf "$project" -C "$work/gen" .

# FUSE requests a plusfs mount has answered so far: all, lookups, getattrs (0 0 0 for
# other targets).
fuse_calls() {
  case $1 in
    plusfs-*) "$PLUSFS" mount --stats "$work/$1" |
      awk '{ c[$1] = $2 } END { printf "%d %d %d\n", c["total"], c["lookup"], c["getattr"] }' ;;
    *) echo 0 0 0 ;;
  esac
}

# What reading the control file itself adds between two readings, per plusfs mount (its
# requests after the counts are taken, and the next reading's before): all, getattrs.
declare -A read_cost read_getattrs
for t in $plusfs_targets; do
  read -r a _ g < <(fuse_calls "$t"); read -r b _ h < <(fuse_calls "$t")
  read_cost[$t]=$((b - a)); read_getattrs[$t]=$((h - g))
done

# Runs `sh -c CMD` on target $3; appends {"step","target","run","seconds","fuse","files"}.
timed() {
  local step=$1 run=$2 target=$3 count=$4 cmd=$5
  drop_caches
  local f0 l0 g0; read -r f0 l0 g0 < <(fuse_calls "$target")
  local t0; t0=$(date +%s.%N)
  # A floor file system may lack an operation (memfs_ll: symlinks): the step goes on.
  sh -c "$cmd" || echo "($step on $target exited non-zero)"
  local t1; t1=$(date +%s.%N)
  local f1 l1 g1; read -r f1 l1 g1 < <(fuse_calls "$target")
  local secs; secs=$(printf '%.3f' "$(echo "$t1 - $t0" | bc)")
  local cost=${read_cost[$target]:-0} gcost=${read_getattrs[$target]:-0}
  local fuse=$(( f1 > f0 + cost ? f1 - f0 - cost : 0 ))
  local lookups=$((l1 - l0)) getattrs=$(( g1 > g0 + gcost ? g1 - g0 - gcost : 0 ))
  echo "{\"step\":\"$step\",\"target\":\"$target\",\"run\":$run,\"seconds\":$secs,\"fuse\":$fuse,\"files\":$count,\"lookup\":$lookups,\"getattr\":$getattrs}" >> "$raw"
  echo "$step [$target, run $run]: $secs s, $fuse FUSE requests"
}

for run in $(seq 1 "$RUNS"); do
  # The native API's unbatched rates (the aim for the mount's creates and removes).
  for phase in create unlink; do
    "$PLUSFS" bench "$phase" -n "$FILES" -c 1 --unique --dir "/native$run" --target plusfs --json |
      tag "{\"step\":\"mdtest\",\"run\":$run,\"where\":\"native-api\"}" | tee -a "$raw" >/dev/null
  done
  for t in $targets; do
    d="$work/$t"
    timed tar-x "$run" "$t" "$files" "mkdir $d/t$run && tar xf $tarball -C $d/t$run && sync"
    timed ls-lR "$run" "$t" "$files" "ls -lR $d/t$run > /dev/null"
    timed rm-rf "$run" "$t" "$files" "rm -rf $d/t$run && sync"
    timed git-clone "$run" "$t" 0 "git clone -q file://$PWD $d/g$run && sync"
    rm -rf "${d:?}/g$run"
    mkdir "$d/b$run" && tar xf "$project" -C "$d/b$run"
    timed c-build "$run" "$t" 0 "cd $d/b$run && ./configure > /dev/null && make -j2 > /dev/null"
    rm -rf "${d:?}/b$run"
    for phase in create unlink; do
      "$PLUSFS" bench "$phase" -n "$FILES" -c 1 --unique --dir "/md$run" --target "local:$d" --json |
        tag "{\"step\":\"mdtest\",\"run\":$run,\"where\":\"$t\"}" | tee -a "$raw" >/dev/null
    done
  done
done
for t in $plusfs_targets; do
  { echo "## $t"; "$PLUSFS" mount --stats "$work/$t"; } >> "$out/fuse-stats.txt"
done
"$PYTHON" scripts/transport_report.py "$raw" > "$out/report.md"
cat "$out/report.md"
