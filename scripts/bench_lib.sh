# Helpers the benchmark scripts share (sourced; needs PLUSFS and PYTHON set).

# Adds the JSON object $1 to every JSON line of standard input.
tag() { "$PYTHON" -c 'import json,sys
extra=json.loads(sys.argv[1])
for line in sys.stdin:
    line=line.strip()
    if line.startswith("{"):
        d=json.loads(line); d.update(extra); print(json.dumps(d), flush=True)' "$1"; }

# Empties the page cache (root only; otherwise a no-op).
drop_caches() { sync; [ "$(id -u)" = 0 ] && echo 3 > /proc/sys/vm/drop_caches || true; }

# Messages received by all servers of the PLUSFS_CLUSTER cluster so far.
msgs() { "$PLUSFS" cluster status --json | "$PYTHON" -c 'import json,sys; print(sum(json.loads(l).get("msgs_in",0) for l in sys.stdin))'; }

# CPU seconds (user + system) the processes $* have used so far.
cpu() { local t=0 p; for p in "$@"; do t=$(awk -v t="$t" '{ print t + ($14 + $15) / 100 }' "/proc/$p/stat"); done; echo "$t"; }

# Mounts a tmpfs at $1 where we may (as root) and prints "tmpfs"; else prints "disk" (the
# directory stays on the disk's file system, which creates files artefactually slowly).
mount_local() {
  if [ "$(id -u)" = 0 ] && mount -t tmpfs -o size=2g plusfs-bench "$1" 2>/dev/null; then echo tmpfs; else echo disk; fi
}

# Unmounts the FUSE mounts $* (lazily if busy); quiet about ones not mounted.
unmount_fuse() { local m; for m in "$@"; do fusermount3 -u "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done; }

# Cost studies (acl_bench.sh, quota_bench.sh): one JSON line per measurement in $raw.
# Records run $1, case $2, value $3, unit $4.
record() { echo "{\"run\":$1,\"case\":\"$2\",\"value\":$3,\"unit\":\"$4\"}" >> "$raw"; }

# Creates per second of one library client (`plusfs bench`, $FILES files), batch size
# $3, in directory $2 of the cluster; recorded as run $1, case $4.
bench_creates() {
  local run=$1 dir=$2 batch=$3 name=$4
  local rate
  rate=$("$PLUSFS" bench create -n "$FILES" -b "$batch" --dir "$dir/r$run-b$batch" --json 2>/dev/null |
    "$PYTHON" -c 'import json,sys; print([json.loads(l) for l in sys.stdin if l.strip()][0]["ops_per_sec"])')
  record "$run" "$name" "$rate" "creates/s"
}

# Seconds of `tar x` of $work/tree.tar into $2 (caches dropped first, sync included);
# recorded as run $1, case $3.
bench_untar() {
  local run=$1 dir=$2 name=$3
  mkdir -p "$dir"
  drop_caches
  local t0 t1
  t0=$(date +%s.%N)
  tar -xf "$work/tree.tar" -C "$dir"
  sync
  t1=$(date +%s.%N)
  record "$run" "$name" "$(echo "$t1 - $t0" | bc)" "s"
}

# The table of medians of every case in $raw (markdown), and `ratio A B HIGHER_BETTER`
# as Python source for the report that follows (sourced by the report's script).
median_table() {
  "$PYTHON" - "$raw" <<'PYEOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
cases = list(dict.fromkeys(r["case"] for r in rows))
med = {c: statistics.median(r["value"] for r in rows if r["case"] == c) for c in cases}
unit = {r["case"]: r["unit"] for r in rows}
print("| case | median | runs |")
print("|---|---|---|")
for c in cases:
    vals = ", ".join(f"{r['value']:.2f}" for r in rows if r["case"] == c)
    print(f"| {c} | {med[c]:.2f} {unit[c]} | {vals} |")
PYEOF
}

# Prints "LABEL: +x.x %", the slowdown of case $2's median against case $3's ($4: 1 when
# higher values are better, 0 for times).
slowdown() {
  "$PYTHON" - "$raw" "$1" "$2" "$3" "$4" <<'PYEOF'
import json, statistics, sys
raw, label, a, b, higher = sys.argv[1:]
rows = [json.loads(l) for l in open(raw)]
med = lambda c: statistics.median(r["value"] for r in rows if r["case"] == c)
x = med(b) / med(a) if higher == "1" else med(a) / med(b)
print(f"- {label}: {(x - 1) * 100:+.1f} %")
PYEOF
}
