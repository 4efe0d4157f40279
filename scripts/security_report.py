"""Medians of scripts/security_bench.sh: rates with plain TCP, TLS, and TLS without the
metrics endpoint, and the ratios that measure TLS's cost and the metrics' cost."""

import json
import statistics
import sys
from collections import defaultdict


def rate(row):
    """Operations per second of a `plusfs bench` line, or MiB/s of a copy."""
    if row["case"].startswith("cp"):
        return row["mib_per_sec"]
    return row.get("ops_per_sec", row.get("ops_s", row.get("ops_per_s", 0.0)))


def main(path):
    rows = [json.loads(line) for line in open(path) if line.strip().startswith("{")]
    cells = defaultdict(list)
    for r in rows:
        batch = "-" if r["case"].startswith("cp") else r.get("batch", 1)
        cells[(r["case"], batch, r["mode"])].append(rate(r))
    print("| workload | batch | insecure | TLS | TLS / insecure | TLS, no metrics | metrics on / off |")
    print("|---|---|---|---|---|---|---|")
    keys = sorted({(c, b) for (c, b, _) in cells}, key=lambda k: (str(k[1]), k[0]))
    for case, batch in keys:
        med = {
            m: statistics.median(cells[(case, batch, m)])
            for m in ("insecure", "tls", "tls-nometrics")
            if cells.get((case, batch, m))
        }
        if len(med) < 3:
            continue
        unit = " MiB/s" if batch == "-" else ""
        print(
            f"| {case} | {batch} | {med['insecure']:,.0f}{unit} | {med['tls']:,.0f}{unit} | "
            f"{med['tls'] / med['insecure']:.2f} | {med['tls-nometrics']:,.0f}{unit} | "
            f"{med['tls'] / med['tls-nometrics']:.2f} |"
        )


if __name__ == "__main__":
    main(sys.argv[1])
