"""Turns bench/out/raw.jsonl into bench/out/report.md (printed) and charts (PNG).

Medians over runs; ratios (batch speed-ups, fractions of the engine, plusfs vs local) are
computed within one run first, then the median of those ratios is taken.
"""

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

PHASES = ("create", "stat", "unlink")


def median(xs):
    xs = list(xs)
    return statistics.median(xs) if xs else float("nan")


def load(raw_path):
    return [json.loads(line) for line in Path(raw_path).read_text().splitlines() if line.strip()]


def baseline(rows):
    base = [r for r in rows if r["suite"] == "baseline"]
    if not base:
        return
    print("## 1 server, 1 client, unbatched, vs local file systems\n")
    print("| phase | plusfs ops/s | tmpfs ops/s | disk ops/s | plusfs/tmpfs | plusfs/disk | msgs/op |")
    print("|---|---|---|---|---|---|---|")
    for phase in PHASES:
        by_run = defaultdict(dict)
        for r in base:
            if r["phase"] == phase:
                kind = "plusfs" if r["target"] == "plusfs" else ("tmpfs" if "/dev/shm" in r["target"] else "disk")
                by_run[r["run"]][kind] = r
        runs = [v for v in by_run.values() if len(v) == 3]
        if not runs:
            continue
        rate = {k: median(v[k]["ops_per_sec"] for v in runs) for k in ("plusfs", "tmpfs", "disk")}
        rt = median(v["plusfs"]["ops_per_sec"] / v["tmpfs"]["ops_per_sec"] for v in runs)
        rd = median(v["plusfs"]["ops_per_sec"] / v["disk"]["ops_per_sec"] for v in runs)
        msgs = median(v["plusfs"]["messages_per_op"] for v in runs)
        print(
            f"| {phase} | {rate['plusfs']:,.0f} | {rate['tmpfs']:,.0f} | {rate['disk']:,.0f} "
            f"| {rt:.1%} | {rd:.1%} | {msgs:.1f} |"
        )
    print()


def batch_tables(rows):
    sel = [r for r in rows if r["suite"] == "batch"]
    if not sel:
        return {}
    plus = [r for r in sel if r["target"] == "plusfs"]
    eng = [r for r in sel if r["target"].startswith("engine")]
    key = lambda r: (r["mode"], r["servers"], r["phase"], r["batch"])  # noqa: E731
    rate, engine, msgs = defaultdict(list), defaultdict(list), defaultdict(list)
    per_run = {}
    for r in plus:
        rate[key(r)].append(r["ops_per_sec"])
        msgs[key(r)].append(r["messages_per_op"])
        per_run[key(r) + (r["run"],)] = r["ops_per_sec"]
    eng_run = {}
    for r in eng:
        engine[key(r)].append(r["ops_per_sec"])
        eng_run[key(r) + (r["run"],)] = r["ops_per_sec"]
    batches = sorted({r["batch"] for r in plus})
    servers = sorted({r["servers"] for r in plus})
    runs = sorted({r["run"] for r in plus})
    for mode in ("shared", "unique"):
        title = "one shared directory" if mode == "shared" else "a directory per client"
        print(f"## 8 clients, {title}: ops/s by batch size (median of {len(runs)} runs)\n")
        cols = " | ".join(f"b={b}" for b in batches)
        print(f"| phase | servers | {cols} | engine b={batches[-1]} | msgs/op b={batches[0]} → b={batches[-1]} |")
        print("|---|---|" + "---|" * len(batches) + "---|---|")
        for phase in PHASES:
            for n in servers:
                cells = [f"{median(rate[(mode, n, phase, b)]):,.0f}" for b in batches]
                e = median(engine[(mode, n, phase, batches[-1])])
                m1 = median(msgs[(mode, n, phase, batches[0])])
                mb = median(msgs[(mode, n, phase, batches[-1])])
                print(f"| {phase} | {n} | " + " | ".join(cells) + f" | {e:,.0f} | {m1:.3f} → {mb:.4f} |")
        print()

    big, small = batches[-1], batches[0]
    print(f"## Speed-up of batch {big} over batch {small}, and fraction of the engine (same run)\n")
    print(f"| mode | servers | phase | speed-up (median) | per run | plusfs / engine at batch {big} (median) |")
    print("|---|---|---|---|---|---|")
    for mode in ("shared", "unique"):
        for n in servers:
            for phase in PHASES:
                ups = [
                    per_run[(mode, n, phase, big, r)] / per_run[(mode, n, phase, small, r)]
                    for r in runs
                    if (mode, n, phase, big, r) in per_run and (mode, n, phase, small, r) in per_run
                ]
                frac = [
                    per_run[(mode, n, phase, big, r)] / eng_run[(mode, n, phase, big, r)]
                    for r in runs
                    if (mode, n, phase, big, r) in per_run and (mode, n, phase, big, r) in eng_run
                ]
                print(
                    f"| {mode} | {n} | {phase} | {median(ups):.1f}x | "
                    + ", ".join(f"{u:.1f}x" for u in ups)
                    + f" | {median(frac):.0%} |"
                )
    print()
    return {"rate": rate, "engine": engine, "batches": batches, "servers": servers}


def charts(data, out_dir):
    if not data:
        return
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib not installed: no charts; `make venv`)\n")
        return
    batches, servers = data["batches"], data["servers"]
    for mode in ("shared", "unique"):
        fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
        for ax, phase in zip(axes, PHASES, strict=True):
            for n in servers:
                ys = [median(data["rate"][(mode, n, phase, b)]) for b in batches]
                ax.plot(batches, ys, marker="o", label=f"plusfs, {n} server{'s' if n > 1 else ''}")
            ys = [median(data["engine"][(mode, servers[-1], phase, b)]) for b in batches]
            ax.plot(batches, ys, linestyle="--", color="gray", label="engine (in-process)")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_title(f"{phase}")
            ax.set_xlabel("batch size (entries per request)")
            ax.set_ylabel("operations/s")
            ax.grid(True, which="both", alpha=0.3)
        axes[0].legend(fontsize=8)
        where = "one shared directory" if mode == "shared" else "one directory per client"
        fig.suptitle(f"plusfs batch operations, 8 clients, {where} (median of runs)")
        fig.tight_layout()
        path = Path(out_dir) / f"batch-{mode}.png"
        fig.savefig(path, dpi=110)
        fig.savefig(path.with_suffix(".svg"))
        plt.close(fig)
        print(f"![{mode}]({path.name})\n")


def counts(rows):
    for r in rows:
        if r["suite"] == "count":
            print("## 100,000 creates, batch 1000, one directory\n")
            print(
                f"{r['ops']:,} files: {r['requests']} requests, "
                f"{r['messages_per_op'] * r['ops']:.0f} messages in all, {r['ops_per_sec']:,.0f} creates/s\n"
            )
    sync = [r for r in rows if r["suite"] == "sync"]
    if sync:
        print("## sync = always, 8 clients\n")
        for r in sync:
            print(f"- batch {r['batch']}: {r['ops_per_sec']:,.0f} creates/s")
        print()


def status_files(out_dir):
    for f in sorted(Path(out_dir).glob("status-*.txt")):
        print(f"### cluster status after `{f.stem[len('status-') :]}`\n")
        print("```")
        print(f.read_text().rstrip())
        print("```\n")


def main(raw_path: str, out_dir: str) -> None:
    rows = load(raw_path)
    print("# plusfs benchmark report\n")
    print("Medians over runs; ratios are computed within each run, then the median is taken.\n")
    baseline(rows)
    data = batch_tables(rows)
    charts(data, out_dir)
    counts(rows)
    status_files(out_dir)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
