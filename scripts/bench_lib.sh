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
