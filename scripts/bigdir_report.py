"""Report of scripts/bigdir_bench.sh: rates per directory size, their ratio to the rate
at the smallest size, the mount's rate against the native API's, mount memory, and the
whole-directory tools at the largest size."""

import json
import statistics
import sys

TARGETS = ["mount", "nodeleg", "native", "local"]
PHASES = ["create", "stat", "unlink"]


def load(path):
    rows = [json.loads(line) for line in open(path) if line.strip().startswith("{")]
    rates, rss, tools, handover = {}, {}, [], {}
    for r in rows:
        phase = r.get("phase") or r.get("op")
        rate = r.get("ops_per_sec") or r.get("rate")
        if phase and rate and "target" in r:
            key = (r["procs"], r["target"], phase, r["size"])
            rates.setdefault(key, []).append(rate)
        for k in ("mount_rss", "mount_rss_after", "mount_rss_listed"):
            if k in r:
                rss.setdefault(r["size"], {})[k] = r[k]
        if "tool" in r:
            tools.append(r)
        if "handover_ms" in r:
            handover[r["size"]] = r["handover_ms"]
    return rates, rss, tools, handover


def rate_table(rates, procs, sizes):
    print(f"\n### {procs} process{'es' if procs > 1 else ''}\n")
    print("| target | phase | " + " | ".join(f"N = {s:,}" for s in sizes) + " |")
    print("|---|---|" + "---|" * len(sizes))
    for target in TARGETS:
        for phase in PHASES:
            cells = [statistics.median(rates.get((procs, target, phase, s), [0])) for s in sizes]
            if not cells[0]:
                continue
            row = " | ".join(f"{v:,.0f} ({v / cells[0]:.2f})" for v in cells)
            print(f"| {target} | {phase} | {row} |")
    print("\nMount (delegations) against the native API, one request per operation:\n")
    print("| phase | " + " | ".join(f"N = {s:,}" for s in sizes) + " |")
    print("|---|" + "---|" * len(sizes))
    for phase in PHASES:
        cells = []
        for s in sizes:
            m = statistics.median(rates.get((procs, "mount", phase, s), [0]))
            n = statistics.median(rates.get((procs, "native", phase, s), [0]))
            cells.append(f"{m / n:.2f}" if n else "-")
        print(f"| {phase} | " + " | ".join(cells) + " |")


def main():
    rates, rss, tools, handover = load(sys.argv[1])
    sizes = sorted({k[3] for k in rates})
    procs = sorted({k[0] for k in rates})
    print("# Cost per operation as a directory grows\n")
    print(
        "mdtest-style create, stat and unlink of new files in one directory that already "
        "holds N entries; ops/s, and in brackets the ratio to the rate at "
        f"N = {sizes[0]:,}. `mount`: default FUSE mount (delegations); `nodeleg`: "
        "`-o nodeleg`; `native`: the library, one request per operation; `local`: the "
        "yardstick directory."
    )
    for p in procs:
        rate_table(rates, p, sizes)
    print("\n### Mount memory\n")
    print("| N | RSS before, MiB | after the runs, MiB | after ls -l, MiB |")
    print("|---|---|---|---|")
    for s in sorted(rss):
        r = rss[s]
        cells = [f"{r[k] / 2**20:.0f}" if k in r else "-" for k in ("mount_rss", "mount_rss_after", "mount_rss_listed")]
        print(f"| {s:,} | " + " | ".join(cells) + " |")
    if handover:
        print("\n### Taking the directory over from another client\n")
        print(
            "The mount's first 40 creates after the native API changed the directory "
            "(new grants of every shard), ms:\n"
        )
        print("| N | ms |")
        print("|---|---|")
        for s in sorted(handover):
            print(f"| {s:,} | {handover[s]} |")
    if tools:
        size = tools[0]["size"]
        print(f"\n### Whole directory of {size:,} entries, seconds\n")
        print("| tool | mount | local | entries/s through the mount |")
        print("|---|---|---|---|")
        by = {(t["tool"], t["target"]): t["seconds"] for t in tools}
        for name in dict.fromkeys(t["tool"] for t in tools):
            m, loc = by.get((name, "mount")), by.get((name, "local"))
            per = f"{size / m:,.0f}" if m else "-"
            print(f"| `{name}` | {m:.2f} | {loc:.2f} | {per} |")


if __name__ == "__main__":
    main()
