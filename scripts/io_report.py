"""Report of scripts/io_bench.sh: medians over runs of MiB/s, requests per MiB and CPU
seconds per GiB, per mode, process count, target and phase; ratios to the wire probe and
to tmpfs within each run."""

import json
import statistics
import sys
from collections import defaultdict

HEADER = (
    "| mode | procs | phase | target | MiB/s | ÷ probe | ÷ tmpfs | requests/MiB "
    "| server CPU s/GiB | mount CPU s/GiB |\n|---|---|---|---|---|---|---|---|---|---|"
)


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(v, spec):
    return format(v, spec) if v is not None else ""


class Results:
    """The JSON lines of one run of io_bench.sh, by (mode, clients, target, phase, run)."""

    def __init__(self, raw: str, mnt: str, local: str):
        names = {"plusfs": "native API", f"local:{mnt}": "mount", f"local:{local}": "tmpfs"}
        self.by = defaultdict(list)
        rows = [json.loads(line) for line in open(raw) if line.strip()]
        for r in rows:
            self.by[(r["mode"], r["clients"], names.get(r["target"], r["target"]), r["phase"], r["run"])].append(r)
        self.runs = sorted({r["run"] for r in rows})
        self.modes = sorted({r["mode"] for r in rows}, reverse=True)
        self.clients = sorted({r["clients"] for r in rows})

    def rate(self, key, run):
        got = self.by.get((*key, run))
        return got[0]["mib_per_sec"] if got else None

    def ratio(self, key, base_key):
        """Median over runs of the rate of `key` divided by that of `base_key`."""
        return med([
            (self.rate(key, run) or 0) / b for run in self.runs if (b := self.rate(base_key, run))
        ])

    def row(self, mode, c, phase, target):
        got = [x for run in self.runs for x in self.by.get((mode, c, target, phase, run), [])]
        if not got:
            return None
        probe = "probewrite" if phase == "write" else "proberead"
        key = (mode, c, target, phase)
        gib = [(g, g["mib_per_sec"] * g["seconds"] / 1024) for g in got]
        scpu = med([g["server_cpu"] / x for g, x in gib if x > 0])
        mcpu = med([g["mount_cpu"] / x for g, x in gib if x > 0])
        cells = [
            mode, str(c), phase, target, f"{med([g['mib_per_sec'] for g in got]):,.0f}",
            fmt(self.ratio(key, (mode, c, "native API", probe)), ".2f"),
            "1" if target == "tmpfs" else fmt(self.ratio(key, (mode, c, "tmpfs", phase)), ".3f"),
            fmt(med([g["requests_per_mib"] for g in got]), ".2f") if target == "native API" else "",
            fmt(scpu, ".2f") if target != "tmpfs" else "",
            fmt(mcpu, ".2f") if target == "mount" else "",
        ]
        return "| " + " | ".join(cells) + " |"

    def probe_row(self, mode, c, phase):
        probe = "probewrite" if phase == "write" else "proberead"
        p = med([self.rate((mode, c, "native API", probe), run) for run in self.runs])
        return None if p is None else f"| {mode} | {c} | {phase} | wire probe | {p:,.0f} | 1.00 | | 0.25 | | |"


def main() -> None:
    raw, mnt, local, size, block = sys.argv[1:6]
    res = Results(raw, mnt, local)
    print("# Large-file bandwidth: native API and mount vs tmpfs and the wire probe\n")
    print(f"{len(res.runs)} runs; each process moves {size} in calls of {block}; reads after the page cache")
    print("was dropped. Medians over runs; ÷ probe and ÷ tmpfs are medians of the per-run ratios. CPU s/GiB:")
    print("the servers' (and for the mount, the mount process's) CPU seconds per GiB moved.\n")
    print(HEADER)
    for mode in res.modes:
        for c in res.clients:
            for phase in ("write", "read"):
                lines = [res.probe_row(mode, c, phase)]
                lines += [res.row(mode, c, phase, t) for t in ("native API", "mount", "tmpfs")]
                for line in lines:
                    if line:
                        print(line)


if __name__ == "__main__":
    main()
