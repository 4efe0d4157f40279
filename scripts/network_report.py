"""Report of scripts/network_bench.sh: the papers' comparisons at each link delay, our
ratios (medians of the per-run ratios) beside the papers'.

    python scripts/network_report.py bench/out/network/raw.jsonl > report.md
"""

import json
import statistics
import sys

# What the papers report for the same comparisons (seed and figure in the label).
PAPER = {
    "batch create": "seed 000 §5.2 (8 SSD servers, GigE, 256 clients): +50 % to 2x",
    "batch stat": "seed 000 §5.2: +25 % or more (SSD); down to -60 % (HDD, ReiserFS)",
    "batch unlink": "seed 000 §5.2: +23 % (ReiserFS) to +60 % (Ext4)",
}


def load(path):
    rows = [json.loads(line) for line in open(path) if line.strip().startswith("{")]
    delays = []
    for r in rows:
        if r["delay"] not in delays:
            delays.append(r["delay"])
    return rows, delays


def rate(r):
    return r.get("ops_per_sec", r.get("ops_s", r.get("ops_per_s", 0.0)))


def med(values):
    return statistics.median(values) if values else float("nan")


def by_run(rows, **match):
    """run -> rate of the row matching every key of `match`."""
    out = {}
    for r in rows:
        if all(r.get(k) == v for k, v in match.items()):
            out[r["run"]] = rate(r)
    return out


def ratio(rows, num, den):
    """Median over runs of rate(num) / rate(den), and the medians of both."""
    a, b = by_run(rows, **num), by_run(rows, **den)
    runs = sorted(set(a) & set(b))
    ratios = [a[r] / b[r] for r in runs if b[r] > 0]
    return med(ratios), med(list(a.values())), med(list(b.values()))


def main(path):
    rows, delays = load(path)
    runs = len({r["run"] for r in rows})
    print("# The papers' comparisons on a private network\n")
    print("`scripts/network_bench.sh` (`make bench-network`): 8 servers and a client host in their own")
    print("network namespaces, every link delayed by the given one-way delay (user-space proxy in")
    print("front of each server), against the same cluster on loopback; 4 clients (xbench: 8")
    print(f"processes). {runs} runs; rates are medians, ratios the medians of the per-run ratios.\n")

    print("## Round trip and the proxy's cost\n")
    print("| delay | unbatched stat, 4 clients: ops/s | time per operation per client |")
    print("|---|---|---|")
    for d in delays:
        s = by_run(rows, delay=d, part="batch", phase="stat", batch=1)
        m = med(list(s.values()))
        print(f"| {d} | {m:,.0f} | {4 / m * 1e6:,.0f} µs |")

    print("\n## Batch 1000 vs batch 1 (seed 000 Figs. 9-12)\n")
    print("| delay | operation | batch 1 ops/s | batch 1000 ops/s | ratio | paper |")
    print("|---|---|---|---|---|---|")
    for d in delays:
        for ph in ["create", "stat", "unlink"]:
            q, big, one = ratio(
                rows, dict(delay=d, part="batch", phase=ph, batch=1000), dict(delay=d, part="batch", phase=ph, batch=1)
            )
            print(f"| {d} | {ph} | {one:,.0f} | {big:,.0f} | {q:.1f}x | {PAPER['batch ' + ph]} |")

    print("\n## Huge directories: one shared directory never / dynamically / always spread (seed 000 Tables 3-4)\n")
    print(
        "| delay | operation | never ops/s | dynamic (8,000) ops/s | always ops/s | dynamic / never | always / never |"
    )
    print("|---|---|---|---|---|---|---|")
    for d in delays:
        for ph in ["create", "stat"]:
            base = dict(delay=d, part="hugedir", phase=ph)
            qd, dyn, never = ratio(rows, {**base, "threshold": "8000"}, {**base, "threshold": "never"})
            qa, alw, _ = ratio(rows, {**base, "threshold": "0"}, {**base, "threshold": "never"})
            print(f"| {d} | {ph} | {never:,.0f} | {dyn:,.0f} | {alw:,.0f} | {qd:.2f} | {qa:.2f} |")

    print("\n## Cx vs 2PC vs serial, update mix (seed 004 Figs. 5-6, Table IV)\n")
    print(
        "| delay | cx ops/s | 2pc ops/s | serial ops/s | cx / 2pc | cx / serial "
        "| messages per op cx / 2pc / serial | cx commitment messages per op |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for d in delays:
        base = dict(delay=d, part="txn")
        q2, cx, two = ratio(rows, {**base, "protocol": "cx"}, {**base, "protocol": "2pc"})
        qs, _, ser = ratio(rows, {**base, "protocol": "cx"}, {**base, "protocol": "serial"})
        msgs = []
        for p in ["cx", "2pc", "serial"]:
            msgs.append(
                med(
                    [
                        r["msgs_per_op"]
                        for r in rows
                        if r.get("part") == "txn" and r["delay"] == d and r["protocol"] == p
                    ]
                )
            )
        commit = med(
            [
                r["commit_msgs"] / r["ops"]
                for r in rows
                if r.get("part") == "txn" and r["delay"] == d and r["protocol"] == "cx"
            ]
        )
        print(
            f"| {d} | {cx:,.0f} | {two:,.0f} | {ser:,.0f} | {q2:.2f} | {qs:.2f} "
            f"| {msgs[0]:.2f} / {msgs[1]:.2f} / {msgs[2]:.2f} | {commit:.2f} |"
        )

    print("\n## Small files per file vs in batches (seed 002)\n")
    print("| delay | phase | per file ops/s | batch 1000 ops/s | ratio |")
    print("|---|---|---|---|---|")
    for d in delays:
        for ph in ["write", "read"]:
            q, big, one = ratio(
                rows, dict(delay=d, part="bfo", phase=ph, batch=1000), dict(delay=d, part="bfo", phase=ph, batch=1)
            )
            print(f"| {d} | {ph} (4 KiB files) | {one:,.0f} | {big:,.0f} | {q:.1f}x |")


if __name__ == "__main__":
    main(sys.argv[1])
