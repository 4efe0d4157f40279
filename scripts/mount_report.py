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


def median(xs) -> float:
    return statistics.median(list(xs))


def rates_table(rows: list[dict]) -> None:
    """Operations per second through the native API, the mount and the local directory."""
    rates: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        if r.get("step") not in ("meta", "rw"):
            continue
        key = (r["step"], r.get("size", 0), r["phase"], r["clients"], r.get("layout", "unique"))
        rates[key + (target_name(r["target"]),)].append(r["ops_per_sec"])
    fuse: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if r.get("step") == "fuse":
            fuse[(r["phase"], r["clients"], r["layout"])].append(r)
    print(
        "| operation | processes | directories | native API | mount | local dir | mount / API "
        "| FUSE req/op | server req/op |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for step, size, phase, clients, layout in sorted({k[:5] for k in rates}):
        name = phase if step == "meta" else f"{phase} {size // 1024} KiB files"
        cells = []
        for t in ("native API", "mount", "local dir"):
            v = rates.get((step, size, phase, clients, layout, t))
            cells.append(f"{median(v):,.0f}" if v else "-")
        api = rates.get((step, size, phase, clients, layout, "native API"))
        mnt = rates.get((step, size, phase, clients, layout, "mount"))
        ratio = f"{median(mnt) / median(api):.2f}" if api and mnt else "-"
        f = fuse.get((phase, clients, layout))
        per = [f"{median(x[k] / x['ops'] for x in f):.2f}" for k in ("fuse", "requests")] if f else ["-", "-"]
        print(f"| {name} | {clients} | {layout} | {' | '.join(cells)} | {ratio} | {' | '.join(per)} |")
    print()
    scaling(rates)


def scaling(rates: dict[tuple, list[float]]) -> None:
    """Mount rate with 4 processes over 1 process, per phase and layout."""
    lines = []
    for step, size, phase, clients, layout, target in sorted(rates):
        if step != "meta" or clients != 4 or target != "mount":
            continue
        one = rates.get((step, size, phase, 1, layout, "mount"))
        if one:
            four = median(rates[(step, size, phase, 4, layout, "mount")])
            lines.append(f"| {phase} | {layout} | {four / median(one):.2f} |")
    if lines:
        print("| mount operation | directories | 4 processes / 1 process |")
        print("|---|---|---|")
        print("\n".join(lines))
        print()


def timed_table(rows: list[dict]) -> None:
    """Timed steps: median seconds per target, and the mount / local ratio of each run."""
    timed: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if r.get("step") in ("ls-l", "rm-rf", "tar-x", "ls-lR", "rm-rf-tree", "c-build"):
            timed[(r["step"], r["target"])].append(r)
    if not timed:
        return
    print("| step | where | seconds (median) | messages to servers (median) | runs | mount / local (median of runs) |")
    print("|---|---|---|---|---|---|")
    for (step, target), rs in sorted(timed.items()):
        secs = median(x["seconds"] for x in rs)
        reqs = median(x["requests"] for x in rs) if "local" not in target else 0
        ratio = "-"
        local = {x["run"]: x["seconds"] for x in timed.get((step, "local"), [])}
        if target == "mount" and local:
            ratio = f"{median(x['seconds'] / max(local[x['run']], 1e-3) for x in rs if x['run'] in local):.1f}"
        print(f"| {step} | {target} | {secs:.2f} | {reqs:,.0f} | {len(rs)} | {ratio} |")
    print()


def main(path: str) -> None:
    rows = [json.loads(line) for line in open(path) if line.strip()]
    print("# FUSE mount vs native API vs local directory\n")
    print("Medians over runs; operations (files) per second; requests per operation from the mount's counters.\n")
    rates_table(rows)
    timed_table(rows)


if __name__ == "__main__":
    main(sys.argv[1])
