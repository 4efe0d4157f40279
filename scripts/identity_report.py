"""Medians of scripts/identity_bench.sh: each step through the admin-identity mount and
the node-identity mount, and the node / admin ratio of times (of rates for the md phases,
inverted so that above 1 always means the node mount is slower)."""

import json
import statistics
import sys
from collections import defaultdict


def main(path):
    rows = [json.loads(line) for line in open(path) if line.strip().startswith("{")]
    setup = next((r for r in rows if r.get("step") == "setup"), {})
    times = defaultdict(list)
    rates = defaultdict(list)
    requests = defaultdict(list)
    for r in rows:
        if r.get("step") in ("tar-x", "rm-rf", "ior-w", "ior-r"):
            times[(r["step"], r["mount"])].append(r["seconds"])
            requests[(r["step"], r["mount"])].append(r["requests"])
        elif r.get("step") == "md":
            rates[("md " + r.get("phase", r.get("op", "?")), r["mount"])].append(rate(r))
    print(f"# Admin-identity mount vs node-identity mount ({setup.get('servers')} servers, "
          f"{setup.get('tree_files')} files in the tree, {setup.get('io_mib')} MiB per I/O process)\n")
    print("Medians of the runs; ratio = node time / admin time (for rates, admin rate / node rate).\n")
    print("| step | admin | node | node / admin | server messages admin / node |")
    print("|---|---|---|---|---|")
    for step in ("tar-x", "rm-rf", "ior-w", "ior-r"):
        a, n = times.get((step, "admin")), times.get((step, "node"))
        if not a or not n:
            continue
        ma, mn = statistics.median(a), statistics.median(n)
        extra = ""
        if step.startswith("ior"):
            mib = 2 * setup.get("io_mib", 0)
            extra = f" ({mib / ma:,.0f} / {mib / mn:,.0f} MiB/s)"
        ra, rn = statistics.median(requests[(step, "admin")]), statistics.median(requests[(step, "node")])
        print(f"| {step} | {ma:.2f} s | {mn:.2f} s | {mn / ma:.2f}{extra} | {ra:,.0f} / {rn:,.0f} |")
    for key in sorted({k for (k, _) in rates}):
        a, n = rates.get((key, "admin")), rates.get((key, "node"))
        if not a or not n:
            continue
        ma, mn = statistics.median(a), statistics.median(n)
        print(f"| {key} | {ma:,.0f} ops/s | {mn:,.0f} ops/s | {ma / mn:.2f} | - |")
    direct = next((r for r in rows if r.get("step") == "direct"), None)
    if direct:
        put, got, caps = (direct["counters"].split() + ["?"] * 3)[:3]
        print(f"\nNode mount, client-direct I/O over the whole run: {put} bytes written, "
              f"{got} bytes read, {caps} capabilities received.")


def rate(row):
    """Operations per second of a `plusfs bench` line."""
    return row.get("ops_per_sec", row.get("ops_s", row.get("ops_per_s", 0.0)))


if __name__ == "__main__":
    main(sys.argv[1])
