"""Medians of scripts/replica_bench.sh's runs, as a Markdown table."""

import json
import statistics
import sys
from collections import defaultdict


def main(path: str) -> None:
    rows = [json.loads(line) for line in open(path) if line.startswith("{")]
    writes: dict[tuple[str, int], list[dict]] = defaultdict(list)
    catch_up = []
    failover = []
    for r in rows:
        if r["case"] == "snapshot catch-up":
            catch_up.append(r)
        elif r["case"] == "failover":
            failover.append(r)
        else:
            writes[(r["case"], r["entries_per_batch"])].append(r)
    runs = max((r["run"] for r in rows), default=0)
    print(f"Medians of {runs} runs.\n")
    print("| case | entries per batch | in flight | batches/s | entries/s | CPU µs per batch | vs group R=1 |")
    print("|---|---|---|---|---|---|---|")
    for (case, per), rs in writes.items():
        rate = statistics.median(r["batches_per_s"] for r in rs)
        one = writes.get(("group R=1", per))
        ratio = rate / statistics.median(r["batches_per_s"] for r in one) if one else float("nan")
        cpu = statistics.median(r["cpu_us_per_batch"] for r in rs)
        print(f"| {case} | {per} | {rs[0]['in_flight']} | {rate:,.0f} | {rate * per:,.0f} | {cpu:,.1f} | {ratio:.2f} |")
    if catch_up:
        secs = statistics.median(r["seconds"] for r in catch_up)
        size = statistics.median(r["snapshot_bytes"] for r in catch_up)
        n = catch_up[0]["entries"]
        print(f"\nA new member catching up from a snapshot of {n:,} entries ({size / 2**20:.0f} MiB): {secs:.2f} s.")
    if failover:
        p50 = [r["p50_s"] for r in failover]
        p99 = [r["p99_s"] for r in failover]
        kills = failover[0]["kills"]
        print(
            f"\nFailover (leader of 3 stopped, until a write succeeds), {kills} kills per run: "
            f"p50 {statistics.median(p50):.2f} s, p99 {statistics.median(p99):.2f} s "
            f"(per run p50 {', '.join(f'{x:.2f}' for x in p50)}; p99 {', '.join(f'{x:.2f}' for x in p99)})."
        )


if __name__ == "__main__":
    main(sys.argv[1])
