#!/usr/bin/env bash
# What a node identity costs against the admin identity (issue "Many users on one
# cluster"): one TLS cluster of SERVERS servers, two mounts of it — one presenting the
# admin identity, one a node identity (uids and gids 1000-1999, root squashed) — and the
# same work through each, as uid 1000 (setpriv), the order of the mounts turning with each
# of RUNS rounds:
#   tar-x    `tar x` of TREE (/usr/include) and the mount's sync
#   rm-rf    `rm -rf` of that tree and the sync
#   md       mdtest-style create, stat, unlink of FILES empty files, 1 process (plusfs bench)
#   ior-w    2 processes each writing its own IO_MIB MiB file (dd bs=1M conv=fsync)
#   ior-r    2 processes each reading, after the caches are dropped, the file the *other*
#            mount wrote (so neither reads its own cached pages)
# The node mount uses delegations and client-direct I/O under capabilities; the admin
# mount needs no capabilities, so the large-file rows are what capabilities cost.
# Results: bench/out/identity/raw.jsonl and report.md (scripts/identity_report.py).
set -euo pipefail
export LC_ALL=C
PLUSFS=${PLUSFS:-plusfs}
PYTHON=${PYTHON:-python3}
SERVERS=${SERVERS:-4}
RUNS=${RUNS:-3}
FILES=${FILES:-2000}
IO_MIB=${IO_MIB:-256}
TREE=${TREE:-/usr/include}
cd "$(dirname "$0")/.."
. scripts/bench_lib.sh
[ "$(id -u)" = 0 ] || { echo "needs root (two mounts with allow_other, setpriv, drop_caches)" >&2; exit 1; }
out=bench/out/identity
mkdir -p "$out"
raw="$out/raw.jsonl"
: > "$raw"
work=$(mktemp -d -p "$PWD/bench/out" identity-work.XXXXXX)
chmod 755 "$work"
cluster="$work/cluster"
declare -A mnt=([admin]="$work/admin" [node]="$work/node")
mkdir -p "${mnt[admin]}" "${mnt[node]}"
cleanup() {
  for m in "${mnt[@]}"; do fusermount3 -u "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
  "$PLUSFS" cluster down --data "$cluster" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

"$PLUSFS" cluster up --data "$cluster" --servers "$SERVERS" --detach >/dev/null
export PLUSFS_CLUSTER="$cluster/cluster.toml"
"$PLUSFS" cert issue --name bench-node --node --uids 1000-1999 --gids 1000-1999 --root-squash \
  --out "$work/node-id" >/dev/null
"$PLUSFS" mount "${mnt[admin]}" -o allow_other >/dev/null
PLUSFS_IDENTITY="$work/node-id" "$PLUSFS" mount "${mnt[node]}" -o allow_other >/dev/null
mkdir -m 0755 "${mnt[admin]}/u1000" && chown 1000:1000 "${mnt[admin]}/u1000"
tarball="$work/tree.tar"
tar cf "$tarball" -C "$(dirname "$TREE")" "$(basename "$TREE")"
chmod 644 "$tarball"
files=$(tar tf "$tarball" | grep -vc '/$')
echo "tree: $files files in $TREE; $SERVERS servers; $IO_MIB MiB per I/O process"
echo "{\"step\":\"setup\",\"tree_files\":$files,\"servers\":$SERVERS,\"io_mib\":$IO_MIB,\"files\":$FILES}" >> "$raw"

# Runs a command as uid 1000.
as_user() { setpriv --reuid 1000 --regid 1000 --clear-groups -- "$@"; }
# The directory of mount $1 that uid 1000 works in.
home() { echo "${mnt[$1]}/u1000"; }
# Messages the servers received so far, and the mount's client-direct counters.
direct() { "$PLUSFS" mount --stats "${mnt[$1]}" | awk '$1 == "direct" { print $4, $6, $8 }'; }

# timed STEP MOUNT RUN CMD...: runs CMD as uid 1000 then the mount's sync; one JSON line.
timed() {
  local step=$1 m=$2 run=$3; shift 3
  drop_caches
  local m0 m1 t0 t1
  m0=$(msgs)
  t0=$(date +%s.%N)
  as_user "$@"
  "$PLUSFS" mount --sync "${mnt[$m]}"
  t1=$(date +%s.%N)
  m1=$(msgs)
  local secs; secs=$(printf '%.3f' "$(echo "$t1 - $t0" | bc)")
  echo "{\"step\":\"$step\",\"mount\":\"$m\",\"run\":$run,\"seconds\":$secs,\"requests\":$((m1 - m0 - SERVERS))}" >> "$raw"
  echo "$step [$m, run $run]: $secs s, $((m1 - m0 - SERVERS)) server messages"
}

# Two processes writing (or reading) files of IO_MIB MiB at once.
ior_write() { dd if=/dev/zero of="$1/io.0" bs=1M count="$IO_MIB" conv=fsync status=none &
  dd if=/dev/zero of="$1/io.1" bs=1M count="$IO_MIB" conv=fsync status=none; wait; }
ior_read() { dd if="$1/io.0" of=/dev/null bs=1M status=none & dd if="$1/io.1" of=/dev/null bs=1M status=none; wait; }
export -f ior_write ior_read
export IO_MIB

for run in $(seq 1 "$RUNS"); do
  order=(admin node)
  [ $((run % 2)) = 0 ] && order=(node admin)
  for m in "${order[@]}"; do
    d=$(home "$m")
    # Both mounts show one namespace: each works in directories of its own.
    timed tar-x "$m" "$run" tar xf "$tarball" -C "$d" --one-top-level="t$run-$m"
    timed rm-rf "$m" "$run" rm -rf "$d/t$run-$m"
    as_user "$PLUSFS" bench create stat unlink -n "$FILES" -c 1 --dir "/u1000/md-$m-$run" \
      --target "local:${mnt[$m]}" --json | tag "{\"step\":\"md\",\"mount\":\"$m\",\"run\":$run}" >> "$raw"
    as_user mkdir -p "$d/io$run-$m"
    timed ior-w "$m" "$run" bash -c "ior_write $d/io$run-$m"
  done
  for m in "${order[@]}"; do
    other=node
    [ "$m" = node ] && other=admin
    timed ior-r "$m" "$run" bash -c "ior_read $(home "$m")/io$run-$other"
    cmp -s "$(home "$m")/io$run-$other/io.0" /dev/zero -n $((IO_MIB << 20)) || { echo "ior-r: contents differ" >&2; exit 1; }
  done
  rm -rf "$(home admin)/io$run-admin" "$(home admin)/io$run-node"
done
echo "{\"step\":\"direct\",\"mount\":\"node\",\"counters\":\"$(direct node)\"}" >> "$raw"
"$PYTHON" scripts/identity_report.py "$raw" > "$out/report.md"
cat "$out/report.md"
