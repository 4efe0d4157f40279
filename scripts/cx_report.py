"""Markdown report of scripts/cx_bench.sh results (JSON lines from `plusfs xbench`)."""

import json
import statistics
import sys
from collections import defaultdict


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.startswith("{")]


def median_run(runs):
    """The run with the median throughput (its latencies and counts go with it)."""
    ordered = sorted(runs, key=lambda r: r["ops_per_s"])
    return ordered[len(ordered) // 2]


def ratio(protocol, run, medians, other):
    """cx throughput over `other`'s, for the cx row only."""
    if protocol != "cx" or other not in medians:
        return ""
    return f"{run['ops_per_s'] / medians[other]['ops_per_s']:.2f}x"


def main_table(rows):
    out = ["## Protocols (median of runs by ops/s; its latency and messages)", ""]
    out.append(
        "| servers | workload | protocol | ops/s (runs) | mean µs | p99 µs | msgs/op | "
        "commit msgs % | cx / 2pc | cx / serial |"
    )
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    groups = defaultdict(list)
    for r in rows:
        groups[(r["servers"], r["workload"], r["protocol"])].append(r)
    for n, w in sorted({(k[0], k[1]) for k in groups}):
        med = {p: median_run(groups[(n, w, p)]) for p in ("cx", "2pc", "serial") if (n, w, p) in groups}
        for p, m in med.items():
            runs = "/".join(str(r["ops_per_s"]) for r in groups[(n, w, p)])
            out.append(
                f"| {n} | {w} | {p} | {m['ops_per_s']} ({runs}) | {m['mean_us']} | {m['p99_us']} | "
                f"{m['msgs_per_op']} | {m['commit_share_pct']} | "
                f"{ratio(p, m, med, '2pc')} | {ratio(p, m, med, 'serial')} |"
            )
    return out


def sensitivity(rows, part, key, title):
    sel = [r for r in rows if r.get("part") == part]
    if not sel:
        return []
    out = [f"## {title}", "", f"| {key} | protocol | ops/s | mean µs | p99 µs | msgs/op | commit msgs % | immediate |"]
    out.append("|---|---|---|---|---|---|---|---|")
    for r in sorted(sel, key=lambda r: (r["protocol"], r[key])):
        out.append(
            f"| {r[key]} | {r['protocol']} | {r['ops_per_s']} | {r['mean_us']} | {r['p99_us']} | "
            f"{r['msgs_per_op']} | {r['commit_share_pct']} | {r['immediate']} |"
        )
    return out + [""]


def recovery(rows):
    sel = [r for r in rows if r.get("part") == "recovery"]
    if not sel:
        return []
    out = ["## Recovery time against the pending log", ""]
    out.append("| pending mkdirs (cluster) | log bytes on the killed server | restart to nothing pending (s) |")
    out.append("|---|---|---|")
    for r in sorted(sel, key=lambda r: r["pending_ops"]):
        out.append(f"| {r['pending_ops']} | {r['victim_log_bytes']} | {r['recovery_s']} |")
    return out + [""]


def main():
    rows = load(sys.argv[1])
    main_rows = [r for r in rows if r.get("part") == "main"]
    lines = ["# Cx vs 2PC vs serial execution", ""]
    if main_rows:
        lines += main_table(main_rows) + [""]
        cx_update = [r for r in main_rows if r["protocol"] == "cx" and r["workload"] == "update"]
        if cx_update:
            lines.append(f"cx update runs: {statistics.median(r['ops_per_s'] for r in cx_update):.0f} ops/s median")
            lines.append("")
    lines += sensitivity(rows, "log", "max_log_bytes", "Log size limit (update mix)")
    lines += sensitivity(rows, "conflict", "conflict", "Injected conflicting stats, % of stats (update mix)")
    lines += sensitivity(rows, "timeout", "timeout_ms", "Timeout trigger alone (update mix)")
    lines += sensitivity(rows, "threshold", "threshold", "Threshold trigger alone (update mix)")
    lines += recovery(rows)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
