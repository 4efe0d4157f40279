"""Markdown tables from scripts/hugedir_bench.sh output (JSON lines + redistribution log)."""

import json
import sys
from collections import defaultdict


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


PHASES = ["create", "stat", "unlink"]
MODES = ("never", "dynamic", "always")


def by_mode(rows, second, value):
    """{(servers, second field, phase): {mode: value}} in table order."""
    cells = defaultdict(dict)
    for r in rows:
        cells[(r["servers"], r[second], r["phase"])][r["mode"]] = r[value]
    return [(k, cells[k]) for k in sorted(cells, key=lambda k: (k[0], k[1], PHASES.index(k[2])))]


def shared_table(rows):
    out = ["## One shared directory, 8 clients (ops/s)", ""]
    out.append("| servers | batch | phase | never | dynamic | always |")
    out.append("|---:|---:|---|---:|---:|---:|")
    for key, c in by_mode(rows, "batch", "ops_per_sec"):
        vals = " | ".join(f"{c.get(m, 0):,.0f}" for m in MODES)
        out.append(f"| {key[0]} | {key[1]} | {key[2]} | {vals} |")
    return out


def multi_table(rows):
    out = ["## Eight directories at once, batch 1000: application time (s)", ""]
    out.append("Never in seconds; dynamic and always as the change relative to never (seed 000 Table 4 layout).")
    out.append("")
    out.append("| servers | clients/dir | phase | never (s) | dynamic | always |")
    out.append("|---:|---:|---|---:|---:|---:|")
    for key, c in by_mode(rows, "per_dir", "seconds"):
        never = c.get("never")
        if not never:
            continue
        rel = [f"{100 * (c[m] - never) / never:+.1f} %" if m in c else "-" for m in MODES[1:]]
        out.append(f"| {key[0]} | {key[1]} | {key[2]} | {never:.2f} | {rel[0]} | {rel[1]} |")
    return out


def scale_table(rows):
    files = max(r["ops"] for r in rows)
    out = [f"## {files:,} files in one directory (4 servers, batches of 1000)", ""]
    out.append("| phase | clients | ops | seconds | ops/s | first tenth | last tenth | kept |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        first, last = r.get("first_tenth_ops_per_sec", 0), r.get("last_tenth_ops_per_sec", 0)
        kept = f"{100 * last / first:.0f} %" if first else "-"
        out.append(
            f"| {r['phase']} | {r['clients']} | {r['ops']:,} | {r['seconds']:.1f} | {r['ops_per_sec']:,.0f} "
            f"| {first:,.0f} | {last:,.0f} | {kept} |"
        )
    return out


def main():
    rows = load(sys.argv[1])
    lines = ["# Huge directories: benchmark report", ""]
    by_suite = defaultdict(list)
    for r in rows:
        by_suite[r.get("suite")].append(r)
    if by_suite.get("shared"):
        lines += shared_table(by_suite["shared"]) + [""]
    if by_suite.get("multi"):
        lines += multi_table(by_suite["multi"]) + [""]
    if by_suite.get("scale"):
        lines += scale_table(by_suite["scale"]) + [""]
    if len(sys.argv) > 2:
        with open(sys.argv[2]) as f:
            text = f.read().strip()
        if text:
            lines += ["## Redistribution, balance and memory", "", "```", text, "```", ""]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
