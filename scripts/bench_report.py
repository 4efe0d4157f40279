"""Turns bench/out/raw.jsonl into a Markdown report (medians of the runs)."""

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def main(raw_path: str, out_dir: str) -> None:
    rows = [json.loads(line) for line in Path(raw_path).read_text().splitlines() if line.strip()]
    print("# plusfs benchmark report\n")
    print("Medians over runs; ratios are computed within each run, then the median is taken.\n")

    base = [r for r in rows if r["suite"] == "baseline"]
    if base:
        print("## 1 server, 1 client, unbatched, vs local file systems\n")
        print("| phase | plusfs ops/s | tmpfs ops/s | disk ops/s | plusfs/tmpfs | plusfs/disk | msgs/op |")
        print("|---|---|---|---|---|---|---|")
        for phase in ("create", "stat", "unlink"):
            by_run = defaultdict(dict)
            for r in base:
                if r["phase"] != phase:
                    continue
                kind = "plusfs" if r["target"] == "plusfs" else ("tmpfs" if "/dev/shm" in r["target"] else "disk")
                by_run[r["run"]][kind] = r
            runs = [v for v in by_run.values() if len(v) == 3]
            p = median([v["plusfs"]["ops_per_sec"] for v in runs])
            t = median([v["tmpfs"]["ops_per_sec"] for v in runs])
            d = median([v["disk"]["ops_per_sec"] for v in runs])
            rt = median([v["plusfs"]["ops_per_sec"] / v["tmpfs"]["ops_per_sec"] for v in runs])
            rd = median([v["plusfs"]["ops_per_sec"] / v["disk"]["ops_per_sec"] for v in runs])
            m = median([v["plusfs"]["messages_per_op"] for v in runs])
            print(f"| {phase} | {p:,.0f} | {t:,.0f} | {d:,.0f} | {rt:.1%} | {rd:.1%} | {m:.1f} |")
        print()

    scal = [r for r in rows if r["suite"] == "scaling"]
    for mode in ("unique", "shared"):
        sel = [r for r in scal if r["mode"] == mode]
        if not sel:
            continue
        print(f"## 8 clients, {'a directory per client' if mode == 'unique' else 'one shared directory'}\n")
        print("| phase | servers | ops/s (median) | runs | msgs/op | speed-up vs 1 server |")
        print("|---|---|---|---|---|---|")
        for phase in ("create", "stat", "unlink"):
            one = median([r["ops_per_sec"] for r in sel if r["phase"] == phase and r["servers"] == 1])
            for n in sorted({r["servers"] for r in sel}):
                xs = [r for r in sel if r["phase"] == phase and r["servers"] == n]
                rate = median([r["ops_per_sec"] for r in xs])
                runs = ", ".join(f"{r['ops_per_sec']:,.0f}" for r in xs)
                msgs = median([r["messages_per_op"] for r in xs])
                print(f"| {phase} | {n} | {rate:,.0f} | {runs} | {msgs:.1f} | {rate / one:.2f}x |")
        print()

    for f in sorted(Path(out_dir).glob("status-*.txt")):
        print(f"### cluster status after `{f.stem[len('status-'):]}`\n")
        print("```")
        print(f.read_text().rstrip())
        print("```\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
