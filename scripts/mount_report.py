"""Markdown report of scripts/mount_bench.sh: medians over runs, ratios within each run."""

import json
import statistics
import sys
from collections import defaultdict


def target_name(t: str) -> str:
    if t == "plusfs":
        return "native API"
    if "/mnt" in t:
        return "mount"
    if t.startswith("local:"):
        return "local dir"
    return t


def main(path: str) -> None:
    rows = [json.loads(line) for line in open(path) if line.strip()]
    print("# FUSE mount vs native API vs local directory\n")
    print("Medians over runs; operations (files) per second.\n")
    rates: dict[tuple, list[float]] = defaultdict(list)
    msgs: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        if r.get("step") not in ("meta", "rw"):
            continue
        key = (r["step"], r.get("size", 0), r["phase"], r["clients"], target_name(r["target"]))
        rates[key].append(r["ops_per_sec"])
        if r["target"] == "plusfs":
            msgs[key].append(r["messages_per_op"])
    print("| operation | processes | native API | mount | local dir | mount / API |")
    print("|---|---|---|---|---|---|")
    seen = sorted({k[:4] for k in rates})
    for step, size, phase, clients in seen:
        name = phase if step == "meta" else f"{phase} {size // 1024} KiB files"
        cells = []
        for t in ("native API", "mount", "local dir"):
            v = rates.get((step, size, phase, clients, t))
            cells.append(f"{statistics.median(v):,.0f}" if v else "-")
        api = rates.get((step, size, phase, clients, "native API"))
        mnt = rates.get((step, size, phase, clients, "mount"))
        ratio = f"{statistics.median(mnt) / statistics.median(api):.2f}" if api and mnt else "-"
        print(f"| {name} | {clients} | {' | '.join(cells)} | {ratio} |")
    print()
    timed: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if r.get("step") in ("ls-l", "rm-rf", "tar-x"):
            timed[(r["step"], r["target"])].append(r)
    if timed:
        print("| step | where | seconds (median) | messages to servers (median) | runs |")
        print("|---|---|---|---|---|")
        for (step, target), rs in sorted(timed.items()):
            secs = statistics.median(x["seconds"] for x in rs)
            reqs = statistics.median(x["requests"] for x in rs) if "local" not in target else 0
            print(f"| {step} | {target} | {secs:.2f} | {reqs:,.0f} | {len(rs)} |")
        print()


if __name__ == "__main__":
    main(sys.argv[1])
