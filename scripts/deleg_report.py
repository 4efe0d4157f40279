"""Report of scripts/deleg_bench.sh: medians over runs, ratios taken within each run."""

import json
import statistics
import sys

STEPS = ["tar-x", "find-again", "cp-r", "git-checkout", "rm-rf"]
TARGETS = ["deleg", "nodeleg", "tmpfs"]


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip().startswith("{")]


def med(values):
    return statistics.median(values) if values else float("nan")


def step_rows(rows, setup):
    files = {
        "tar-x": setup["tree_files"],
        "find-again": setup["tree_files"],
        "cp-r": setup["tree_files"],
        "git-checkout": setup["git_files"],
        "rm-rf": 2 * setup["tree_files"] + setup["git_files"],
    }
    out = [
        "| step (sync included) | files | tmpfs s | delegations s | ratio | FUSE req/file | server msg/file "
        "| nodeleg s | ratio | FUSE req/file | server msg/file |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for step in STEPS:
        by = {(r["target"], r["run"]): r for r in rows if r.get("step") == step}
        runs = sorted({run for (_, run) in by})
        cells = [step, f"{files[step]:,}", f"{med([by[('tmpfs', r)]['seconds'] for r in runs]):.2f}"]
        for target in ["deleg", "nodeleg"]:
            ratios = [by[(target, r)]["seconds"] / by[("tmpfs", r)]["seconds"] for r in runs]
            cells += [
                f"{med([by[(target, r)]['seconds'] for r in runs]):.2f}",
                f"{med(ratios):.1f}×",
                f"{med([by[(target, r)]['fuse'] for r in runs]) / files[step]:.1f}",
                f"{med([by[(target, r)]['requests'] for r in runs]) / files[step]:.2f}",
            ]
        out.append("| " + " | ".join(cells) + " |")
    return out


def md_rows(rows, mnt, nodeleg, local):
    names = {"plusfs": "native", f"local:{mnt}": "deleg", f"local:{nodeleg}": "nodeleg", f"local:{local}": "tmpfs"}
    rate = {}
    for r in rows:
        if r.get("step") == "md" and r.get("target") in names:
            if r.get("errors"):
                raise SystemExit(f"errors in an mdtest-style run: {r}")
            key = (names[r["target"]], r["phase"], r["clients"])
            rate.setdefault(key, {})[r["run"]] = r["ops_per_sec"]
    out = [
        "| phase | processes | native API (unbatched) ops/s | mount, delegations | ÷ native 1 process "
        "| mount, nodeleg | ÷ native 1 process | tmpfs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for phase in ["create", "stat", "unlink"]:
        for c in [1, 2, 4]:
            base = rate.get(("native", phase, 1), {})
            cells = [phase, str(c), f"{med(list(rate.get(('native', phase, c), {}).values())):,.0f}"]
            for target in ["deleg", "nodeleg"]:
                got = rate.get((target, phase, c), {})
                ratios = [got[run] / base[run] for run in got if run in base]
                cells += [f"{med(list(got.values())):,.0f}", f"{med(ratios):.2f}"]
            cells.append(f"{med(list(rate.get(('tmpfs', phase, c), {}).values())):,.0f}")
            out.append("| " + " | ".join(cells) + " |")
    return out


def main():
    rows = load(sys.argv[1])
    mnt, nodeleg, local = sys.argv[2:5]
    setup = next(r for r in rows if r.get("step") == "setup")
    runs = max(r.get("run", 0) for r in rows)
    lines = [
        "# Directory delegations: mount vs -o nodeleg vs tmpfs",
        "",
        f"{setup['servers']} servers on loopback; medians of {runs} runs; ratios are to tmpfs within each run.",
        "",
        *step_rows(rows, setup),
        "",
        "mdtest-style, empty files, each process in its own directory (rates: median ops/s; "
        "÷ native: the median over runs of the rate divided by one native-API process's rate in that run):",
        "",
        *md_rows(rows, mnt, nodeleg, local),
    ]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
