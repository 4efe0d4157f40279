"""Medians of scripts/replica_servers_bench.sh: rate and server CPU per operation for
--replicas 1 and 3, their ratio, and the failover times."""

import json
import statistics
import sys
from collections import defaultdict


def rate(row):
    """Operations per second of a `plusfs bench` or `plusfs xbench` line."""
    return row.get("ops_per_sec", row.get("ops_s", row.get("ops_per_s", 0.0)))


def main(path):
    rows = [json.loads(line) for line in open(path) if line.strip().startswith("{")]
    cells = defaultdict(list)
    failover = []
    for r in rows:
        if r.get("case") == "server failover":
            failover.append(r)
            continue
        batch = r.get("batch", 1)
        cells[(r["case"], batch, r["replicas"])].append((rate(r), r["server_cpu_us_per_op"]))
    print("| workload | batch | R=1 ops/s | R=3 ops/s | R=3 / R=1 | CPU µs/op R=1 | CPU µs/op R=3 |")
    print("|---|---|---|---|---|---|---|")
    for case, batch in sorted({(c, b) for (c, b, _) in cells}, key=lambda k: (k[1], k[0])):
        one, three = cells.get((case, batch, 1), []), cells.get((case, batch, 3), [])
        if not one or not three:
            continue
        r1 = statistics.median(x for x, _ in one)
        r3 = statistics.median(x for x, _ in three)
        c1 = statistics.median(c for _, c in one)
        c3 = statistics.median(c for _, c in three)
        print(f"| {case} | {batch} | {r1:,.0f} | {r3:,.0f} | {r3 / r1:.2f} | {c1:.0f} | {c3:.0f} |")
    for f in failover:
        print(
            f"\nFailover over {f['kills']} kills of a serving member ({f['servers']} server slots): "
            f"p50 {f['p50_s']:.2f} s, p99 {f['p99_s']:.2f} s, max {f['max_s']:.2f} s"
        )


if __name__ == "__main__":
    main(sys.argv[1])
