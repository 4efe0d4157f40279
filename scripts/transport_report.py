"""Markdown report of scripts/transport_bench.sh: medians over runs of seconds per step and
target, ratios to tmpfs and to the FUSE floor on the same transport, FUSE requests per
extracted file (lookups and getattrs among them) and microseconds per FUSE request, and
mdtest-style rates."""

import json
import statistics
import sys
from collections import defaultdict

OTHERS = ["floor-devfuse", "floor-uring", "tmpfs"]


def plusfs_targets(rows: list[dict]) -> list[str]:
    """The plusfs mounts measured, in the order they first appear."""
    seen: list[str] = []
    for r in rows:
        t = r.get("target") or r.get("where", "")
        if t.startswith("plusfs") and t not in seen:
            seen.append(t)
    return seen


def floor_of(target: str) -> str:
    """The floor on the same transport as plusfs mount `target`."""
    return "floor-uring" if "uring" in target else "floor-devfuse"


def median(xs) -> float:
    return statistics.median(list(xs))


def steps_table(rows: list[dict]) -> None:
    """Seconds (median of the runs) per step and target, with ratios."""
    mounts = plusfs_targets(rows)
    floors = {t: floor_of(t) for t in mounts}
    secs: dict[tuple, list[float]] = defaultdict(list)
    fuse: dict[tuple, list[tuple]] = defaultdict(list)
    for r in rows:
        if r.get("step") == "mdtest":
            continue
        secs[(r["step"], r["target"])].append(r["seconds"])
        if r["target"].startswith("plusfs"):
            looked = (r.get("lookup"), r.get("getattr"))
            fuse[(r["step"], r["target"])].append((r["fuse"], r["files"], r["seconds"], *looked))
    present = [t for t in mounts + OTHERS if any(k[1] == t for k in secs)]
    steps = sorted({k[0] for k in secs}, key=["tar-x", "ls-lR", "rm-rf", "git-clone", "c-build"].index)
    print("## Real work, seconds (median of runs)\n")
    print("| step | " + " | ".join(present) + " | plusfs / tmpfs | plusfs / floor (same transport) |")
    print("|---|" + "---|" * (len(present) + 2))
    for step in steps:
        med = {t: median(secs[(step, t)]) for t in present if secs.get((step, t))}
        cells = [f"{med[t]:.2f}" if t in med else "–" for t in present]
        tm = med.get("tmpfs")
        vs_tmpfs = ", ".join(f"{t[7:]} {med[t] / tm:.1f}×" for t in floors if t in med and tm)
        vs_floor = ", ".join(f"{t[7:]} {med[t] / med[f]:.2f}×" for t, f in floors.items() if t in med and f in med)
        print(f"| {step} | " + " | ".join(cells) + f" | {vs_tmpfs} | {vs_floor or '–'} |")
    print("\n## FUSE requests of the plusfs mounts (median of runs)\n")
    print("| step | target | FUSE requests | per file | lookups | getattrs | µs per request |")
    print("|---|---|---|---|---|---|---|")
    for (step, target), xs in sorted(fuse.items()):
        reqs = median(x[0] for x in xs)
        per_file = median(x[0] / x[1] for x in xs if x[1]) if any(x[1] for x in xs) else None
        us = median(x[2] * 1e6 / x[0] for x in xs if x[0])
        pf = f"{per_file:.1f}" if per_file is not None else "–"
        looks = [median(x[i] for x in xs) if all(x[i] is not None for x in xs) else None for i in (3, 4)]
        lk, ga = (f"{v:.0f}" if v is not None else "–" for v in looks)
        print(f"| {step} | {target} | {reqs:.0f} | {pf} | {lk} | {ga} | {us:.1f} |")


def mdtest_table(rows: list[dict]) -> None:
    """Creates and removes per second, 1 process (median of runs)."""
    rates: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        if r.get("step") == "mdtest":
            rates[(r["phase"], r["where"])].append(r["ops_per_sec"])
    if not rates:
        return
    mounts = plusfs_targets(rows)
    floors = {t: floor_of(t) for t in mounts}
    wheres = [w for w in ["native-api"] + mounts + OTHERS if any(k[1] == w for k in rates)]
    print("\n## mdtest-style rates, operations/s, 1 process (median of runs)\n")
    print("| phase | " + " | ".join(wheres) + " | mount / native API | mount / floor |")
    print("|---|" + "---|" * (len(wheres) + 2))
    for phase in ["create", "unlink"]:
        med = {w: median(rates[(phase, w)]) for w in wheres if rates.get((phase, w))}
        cells = [f"{med[w]:,.0f}" if w in med else "–" for w in wheres]
        api = med.get("native-api")
        vs_api = ", ".join(f"{t[7:]} {med[t] / api:.2f}" for t in floors if t in med and api)
        vs_floor = ", ".join(f"{t[7:]} {med[t] / med[f]:.2f}" for t, f in floors.items() if t in med and f in med)
        print(f"| {phase} | " + " | ".join(cells) + f" | {vs_api} | {vs_floor or '–'} |")


def main() -> None:
    rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip().startswith("{")]
    print("# The mount over /dev/fuse and io_uring vs tmpfs and the FUSE floor\n")
    steps_table(rows)
    mdtest_table(rows)


if __name__ == "__main__":
    main()
