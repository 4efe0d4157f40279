#!/usr/bin/env bash
# What the server's bounds cost (issue "A server no user can take down"): the memory
# budgets taken before each frame is read, the handshake and idle limits and the
# free-space floor checked on each request. Runs `plusfs bench` (create, stat, unlink of
# FILES files per client, CLIENTS clients, one shared directory) unbatched and with
# batches of BATCH, on a TLS cluster of SERVERS servers, once with the build BEFORE (no
# bounds) and once with AFTER, alternating for RUNS rounds; both as the admin identity
# and as a user identity (which also draws on the server-wide budget).
# Besides the rates, the servers' CPU time (user + system, from /proc) over each bench
# run is divided by the operations it made: CPU per operation is what the bounds add to,
# and it varies less than rates on a loaded machine.
# Usage: scripts/bounds_bench.sh BEFORE_BINARY AFTER_BINARY
# Results: bench/out/bounds/raw.jsonl (one JSON line per phase) and a table on stdout.
set -euo pipefail
export LC_ALL=C
BEFORE=${1:?usage: bounds_bench.sh BEFORE_BINARY AFTER_BINARY}
AFTER=${2:?usage: bounds_bench.sh BEFORE_BINARY AFTER_BINARY}
SERVERS=${SERVERS:-4}
RUNS=${RUNS:-3}
FILES=${FILES:-2000}
CLIENTS=${CLIENTS:-4}
BATCH=${BATCH:-100}
PYTHON=${PYTHON:-python3}
cd "$(dirname "$0")/.."
out=bench/out/bounds
mkdir -p "$out"
raw="$out/raw.jsonl"
: > "$raw"
work=$(mktemp -d -p "$PWD/bench/out" bounds-work.XXXXXX)
cleanup() {
  for b in "$BEFORE" "$AFTER"; do "$b" cluster down --data "$work/cluster" >/dev/null 2>&1 || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# CPU ticks (user + system) used so far by the cluster's server processes.
server_ticks() {
  local total=0 f pid
  for f in "$work"/cluster/server-*.pid; do
    pid=$(cat "$f")
    [ -r "/proc/$pid/stat" ] || continue
    total=$((total + $(awk '{print $14 + $15}' "/proc/$pid/stat")))
  done
  echo "$total"
}

for round in $(seq 1 "$RUNS"); do
  for build in before after; do
    bin=$BEFORE
    [ "$build" = after ] && bin=$AFTER
    rm -rf "$work/cluster"
    "$bin" cluster up --data "$work/cluster" --servers "$SERVERS" --detach >/dev/null
    export PLUSFS_CLUSTER="$work/cluster/cluster.toml"
    "$bin" cert issue --name bench-user --uids 1000-1999 --gids 1000-1999 --root-squash \
      --out "$work/user-id" >/dev/null
    "$bin" mkdir /u >/dev/null
    "$bin" chmod 1777 /u >/dev/null
    for who in admin user; do
      for batch in 1 "$BATCH"; do
        id=()
        [ "$who" = user ] && id=(env PLUSFS_IDENTITY="$work/user-id")
        echo "round $round: $build, $who, batch $batch" >&2
        t0=$(server_ticks)
        "${id[@]}" "$bin" bench -n "$FILES" -c "$CLIENTS" -b "$batch" -d "/u/$who-$batch" --json |
          while read -r line; do
            echo "{\"round\":$round,\"build\":\"$build\",\"who\":\"$who\",\"batch\":$batch,\"result\":$line}"
          done >> "$raw"
        t1=$(server_ticks)
        ops=$((3 * FILES * CLIENTS))
        echo "{\"round\":$round,\"build\":\"$build\",\"who\":\"$who\",\"batch\":$batch,\"cpu_ticks\":$((t1 - t0)),\"ops\":$ops,\"hz\":$(getconf CLK_TCK)}" >> "$raw"
      done
    done
    "$bin" cluster down --data "$work/cluster" >/dev/null
    rm -rf "$work/user-id"
  done
done

"$PYTHON" - "$raw" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
rates = {}
cpu = {}
for r in rows:
    if "cpu_ticks" in r:
        us = r["cpu_ticks"] / r["hz"] * 1e6 / r["ops"]
        cpu.setdefault((r["who"], r["batch"], r["build"]), []).append(us)
        continue
    res = r["result"]
    phase = res.get("phase") or res.get("op")
    rate = res.get("ops_per_sec") or res.get("rate")
    if phase is None or rate is None:
        continue
    rates.setdefault((r["who"], r["batch"], phase, r["build"]), []).append(rate)
print("| identity | batch | phase | before ops/s (median) | after ops/s (median) | after/before |")
print("|---|---|---|---|---|---|")
for (who, batch, phase, build) in sorted(k for k in rates if k[3] == "before"):
    b = statistics.median(rates[(who, batch, phase, "before")])
    a = statistics.median(rates.get((who, batch, phase, "after"), [0]))
    print(f"| {who} | {batch} | {phase} | {b:,.0f} | {a:,.0f} | {a / b:.3f} |")
print()
print("Server CPU per operation (create, stat and unlink together), median of the rounds:")
print()
print("| identity | batch | before µs/op | after µs/op | after/before | rounds |")
print("|---|---|---|---|---|---|")
for (who, batch, build) in sorted(k for k in cpu if k[2] == "before"):
    b = statistics.median(cpu[(who, batch, "before")])
    a = statistics.median(cpu.get((who, batch, "after"), [0]))
    n = len(cpu[(who, batch, "before")])
    print(f"| {who} | {batch} | {b:.2f} | {a:.2f} | {a / b:.3f} | {n} |")
EOF
