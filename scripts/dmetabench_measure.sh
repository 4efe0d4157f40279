#!/usr/bin/env bash
# The measurements of the DMetabench issue, written to bench/out/dmetabench/:
#  1. Python overhead: the MakeOnedirFiles create loop in dmetabench vs the same loop in C
#     on tmpfs (seed 003 §4.2.2);
#  2. accounting: stonewall and wall-clock averages beside simple totals/time on the disk;
#  3. time charts of MakeFiles with 2 processes (disk, tmpfs) where one process is stopped
#     (SIGSTOP) for 1.5 s midway: the COV rises (seed 003 Fig. 4.4(b)).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
DMB=(.venv/bin/dmetabench)
out=bench/out/dmetabench
rm -rf "$out"; mkdir -p "$out"
N=${N:-100000}
shm=$(mktemp -d -p /dev/shm dmb.XXXXXX)
disk=$(mktemp -d -t dmb-disk.XXXXXX)
trap 'rm -rf "$shm" "$disk"' EXIT

echo "== 1. Python overhead on tmpfs, $N creates, 1 process"
gcc -O2 -o "$out/createloop" python/dmetabench/tools/createloop.c
for r in 1 2 3; do
  c=$("$out/createloop" "$shm" "$N")
  "${DMB[@]}" --operations MakeOnedirFiles --problemsize "$N" --workdir "$shm" --procs 1 --vmstat-seconds 0 \
    --label overhead --results "$out/overhead" 2>/dev/null > "$out/overhead-dir"
  rd=$(cat "$out/overhead-dir")
  p=$("$PY" -c 'import sys; from dmetabench import analysis as a
s = a.analyze(sys.argv[1])[0]; print(round(s.exact_rate))' "$rd")
  echo "run $r: C $c creates/s, dmetabench (Python) $p creates/s, Python/C $("$PY" -c "print(f'{$p/$c:.2f}')")" \
    | tee -a "$out/overhead.txt"
done

echo "== 2. stonewall vs wall-clock vs totals/time, StatFiles and MakeOnedirFiles, 2 processes, disk"
"${DMB[@]}" --operations MakeOnedirFiles,StatFiles,DeleteFiles --problemsize 50000 --workdir "$disk" --procs 2 \
  --min-procs 2 --vmstat-seconds 0 --label accounting --results "$out/accounting" 2>/dev/null > "$out/accounting-dir"
"${DMB[@]}" analyze "$(cat "$out/accounting-dir")" --fixed-ops 10000 | sed -n '/SUMMARY/,$p' | tee "$out/accounting.txt"

echo "== 3. MakeFiles, 2 processes, one of them stopped for 1.5 s midway (disk, then tmpfs)"
for where in disk tmpfs; do
  dir=$disk; [ "$where" = tmpfs ] && dir=$shm
  "${DMB[@]}" --operations MakeFiles --problemsize 5000 --runtime 8 --workdir "$dir" --procs 2 --min-procs 2 \
    --vmstat-seconds 0 --label "slowdown-$where" --results "$out/slowdown" > "$out/slowdown-dir" 2>"$out/slowdown.log" &
  main=$!
  sleep 4.5
  victim=$(pgrep -P "$main" -f spawn_main | head -n 1)
  kill -STOP "$victim"; sleep 1.5; kill -CONT "$victim"
  wait "$main"
  rd=$(cat "$out/slowdown-dir")
  suffix=""; [ "$where" = tmpfs ] && suffix="-tmpfs"
  "${DMB[@]}" chart time "$rd/results-MakeFiles-1-2.tsv" --out "docs/dmetabench-slowdown$suffix"
  "${DMB[@]}" analyze "$rd" | sed -n '/configuration/,$p'
done
