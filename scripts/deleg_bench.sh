#!/usr/bin/env bash
# Directory delegations measured in one run: a mount with delegations (the default), a
# second mount of the same cluster with -o nodeleg, and a tmpfs directory, step by step:
#   tar x of a real tree (TREE, default /usr/include), a stat of every entry and a probe
#   of a missing name in every directory read again (a find after an untimed first one:
#   read delegations), cp -r of it within the target,
#   a git checkout of a repository's work tree (REPO, default this repository; the git
#   directory stays outside the target), rm -rf of all three — each followed by the
#   target's sync (`plusfs mount --sync` on a mount, sync(1) on tmpfs);
#   then mdtest-style create/stat/unlink of empty files, 1/2/4 processes in their own
#   directories, through both mounts, tmpfs and the native API (unbatched).
# Every step records seconds, the mount's FUSE requests and the servers' messages.
# Results: bench/out/deleg/raw.jsonl and report.md (scripts/deleg_report.py).
set -euo pipefail
export LC_ALL=C
PLUSFS=${PLUSFS:-plusfs}
PYTHON=${PYTHON:-python3}
SERVERS=${SERVERS:-3}
RUNS=${RUNS:-3}
FILES=${FILES:-2000}
TREE=${TREE:-/usr/include}
cd "$(dirname "$0")/.."
REPO=${REPO:-$PWD}
. scripts/bench_lib.sh
out=bench/out/deleg
mkdir -p "$out"
raw="$out/raw.jsonl"
: > "$raw"
work=$(mktemp -d -p "$PWD/bench/out" deleg-work.XXXXXX)
cluster="$work/cluster" mnt="$work/mnt" nodeleg="$work/nodeleg" local="$work/local"
mkdir -p "$mnt" "$nodeleg" "$local"
if [ "$(id -u)" != 0 ] || ! mount -t tmpfs -o size=3g plusfs-bench "$local" 2>/dev/null; then
  echo "needs root to mount the tmpfs it compares with" >&2
  exit 1
fi
cleanup() {
  umount "$local" 2>/dev/null || true
  unmount_fuse "$mnt" "$nodeleg"
  "$PLUSFS" cluster down --data "$cluster" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

"$PLUSFS" cluster up --data "$cluster" --servers "$SERVERS" --detach >/dev/null
export PLUSFS_CLUSTER="$cluster/cluster.toml"
"$PLUSFS" mount "$mnt" >/dev/null
"$PLUSFS" mount "$nodeleg" -o nodeleg >/dev/null
tarball="$work/tree.tar"
tar cf "$tarball" -C "$(dirname "$TREE")" "$(basename "$TREE")"
files=$(tar tf "$tarball" | grep -vc '/$')
git_files=$(git -C "$REPO" ls-tree -r HEAD | wc -l)
echo "tree: $files files in $TREE; repository: $git_files files in $REPO"
echo "{\"step\":\"setup\",\"tree_files\":$files,\"git_files\":$git_files,\"servers\":$SERVERS}" >> "$raw"

# Where target $1 lives, and how it is synced.
dir_of() { case $1 in deleg) echo "$mnt" ;; nodeleg) echo "$nodeleg" ;; tmpfs) echo "$local" ;; esac; }
sync_target() { case $1 in tmpfs) sync ;; *) "$PLUSFS" mount --sync "$(dir_of "$1")" ;; esac; }
# FUSE requests of a mount so far, without the kernel's forgets (which follow cache drops).
fuse_total() { "$PLUSFS" mount --stats "$1" | awk '$1 == "total" { t = $2 } $1 == "forget" { f = $2 } END { print t - f }'; }
# Waits (at most 20 s) until mount $1 has returned its delegations, so that their write-back
# and return are counted in the step that took them.
returned() {
  for _ in $(seq 1 200); do
    "$PLUSFS" mount --stats "$1" | grep -q '^delegations held 0 ' && return 0
    sleep 0.1
  done
}

# timed STEP TARGET RUN CMD...: runs CMD then the target's sync; one JSON line.
timed() {
  local step=$1 target=$2 run=$3; shift 3
  local d; d=$(dir_of "$target")
  drop_caches
  local f0=0 f1=0 m0 m1
  if [ "$target" != tmpfs ]; then f0=$(fuse_total "$d"); fi
  m0=$(msgs)
  local t0; t0=$(date +%s.%N)
  "$@"
  sync_target "$target"
  local t1; t1=$(date +%s.%N)
  if [ "$target" != tmpfs ]; then returned "$d"; fi
  m1=$(msgs)
  # Less what reading the counters and syncing cost (measured on an empty step).
  if [ "$target" != tmpfs ]; then f1=$(( $(fuse_total "$d") - ${overhead[$target]} )); fi
  local secs; secs=$(printf '%.3f' "$(echo "$t1 - $t0" | bc)")
  # A status scan costs one message per server.
  echo "{\"step\":\"$step\",\"target\":\"$target\",\"run\":$run,\"seconds\":$secs,\"fuse\":$((f1 - f0)),\"requests\":$((m1 - m0 - SERVERS))}" >> "$raw"
  echo "$step [$target, run $run]: $secs s, $((f1 - f0)) FUSE requests, $((m1 - m0 - SERVERS)) server messages"
}

# FUSE requests of an empty step (the stats reads and the sync), per mount.
declare -A overhead=([deleg]=0 [nodeleg]=0)
for target in deleg nodeleg; do
  d=$(dir_of "$target")
  a=$(fuse_total "$d"); sync_target "$target"; b=$(fuse_total "$d")
  overhead[$target]=$((b - a))
done
echo "FUSE requests of an empty step: ${overhead[deleg]} (deleg), ${overhead[nodeleg]} (nodeleg)"

# Stats every entry of tree $1 and looks up a missing name in each of its directories.
find_tree() {
  find "$1" -printf '%s %m\n' >/dev/null
  find "$1" -type d -exec test -e {}/no-such-name \;
}

checkout() {
  mkdir -p "$2"
  GIT_INDEX_FILE="$work/index.$3" git -C "$REPO" --work-tree="$2" checkout -f HEAD -- .
}

for run in $(seq 1 "$RUNS"); do
  # The order of the targets turns with each run.
  order=(deleg nodeleg tmpfs)
  for i in 0 1 2; do
    target=${order[$(( (i + run - 1) % 3 ))]}
    d=$(dir_of "$target")
    timed tar-x "$target" "$run" tar xf "$tarball" -C "$d" --one-top-level="t$run"
    find_tree "$d/t$run"
    timed find-again "$target" "$run" find_tree "$d/t$run"
    timed cp-r "$target" "$run" cp -r "$d/t$run" "$d/c$run"
    timed git-checkout "$target" "$run" checkout "$REPO" "$d/g$run" "$target$run"
    timed rm-rf "$target" "$run" rm -rf "$d/t$run" "$d/c$run" "$d/g$run"
  done
  # The trees match: extract once more into both and compare.
  tar xf "$tarball" -C "$mnt" --one-top-level=check && tar xf "$tarball" -C "$local" --one-top-level=check
  diff -r --no-dereference "$local/check" "$mnt/check" >/dev/null || { echo "the mount's tree differs" >&2; exit 1; }
  rm -rf "$mnt/check" "$local/check"
  for c in 1 2 4; do
    echo "== run $run: create/stat/unlink, $c processes, $FILES files each"
    # One target at a time, each in its own directories; a mount's delegations are
    # returned before the next target starts.
    for t in plusfs "local:$mnt" "local:$nodeleg" "local:$local"; do
      "$PLUSFS" bench create stat unlink -n "$FILES" -c "$c" --unique --dir "/md$run-$c-${t##*/}" \
        --target "$t" --json | tag "{\"step\":\"md\",\"run\":$run}" | tee -a "$raw" >/dev/null
      if [ "$t" = "local:$mnt" ]; then "$PLUSFS" mount --sync "$mnt"; returned "$mnt"; fi
    done
  done
done
"$PLUSFS" cluster status > "$out/cluster-status.txt"
"$PYTHON" scripts/deleg_report.py "$raw" "$mnt" "$nodeleg" "$local" > "$out/report.md"
cat "$out/report.md"
