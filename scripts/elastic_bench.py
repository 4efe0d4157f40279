#!/usr/bin/env python3
"""An elastic cluster, measured (issue "An elastic cluster").

For each N in SERVERS (default 4 8): a new N-server local cluster (TLS, the default) is
filled with DIRS directories of FILES small files each plus BIG large files (`plusfs cp`
of a generated tree); a load of `plusfs bench create unlink` runs in repeated short rounds
in the background; a server is added (`plusfs cluster add --wait`), then one is drained
(`plusfs cluster drain --wait`). Measured from `cluster status --json` before and after:
the fraction of directory objects and of file bytes that moved (ideal 1/(N+1) when adding;
the drained server's share when draining), the time from the command to a balanced map,
the migration rate, and the load's throughput while objects moved against before.
PACE="OBJECTS MIB" sets the map's [rebalance] pace.

Then (SHARD_ENTRIES, default 1,000,000; 0 skips) a 3-server cluster whose directory /huge
is spread over two of them with SHARD_ENTRIES entries each (`plusfs bench create`,
batches of 1,000) has one of those two drained: the time until the map is balanced, which
includes moving that server's shard to a server that stays, and the shard's entries per
second.

JSON lines go to OUT/elastic.jsonl; a Markdown table to stdout.

    PLUSFS=target/release/plusfs python3 scripts/elastic_bench.py
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

PLUSFS = os.environ.get("PLUSFS") or sys.exit("set PLUSFS to the plusfs binary")
SERVERS = [int(n) for n in os.environ.get("SERVERS", "4 8").split()]
DIRS = int(os.environ.get("DIRS", "4000"))
FILES = int(os.environ.get("FILES", "2"))
BIG = int(os.environ.get("BIG", "12"))
BIG_MIB = int(os.environ.get("BIG_MIB", "8"))
LOAD_FILES = int(os.environ.get("LOAD_FILES", "300"))
LOAD_CLIENTS = int(os.environ.get("LOAD_CLIENTS", "4"))
OUT = Path(os.environ.get("OUT", "bench/out"))
# The map's [rebalance] pace (objects/s and MiB/s per server; empty: the defaults).
PACE = os.environ.get("PACE", "").split()
SHARD_ENTRIES = int(os.environ.get("SHARD_ENTRIES", "1000000"))


def run(*args: str, env: dict | None = None) -> str:
    """Runs plusfs with `args`; its stdout (raises with its stderr on failure)."""
    p = subprocess.run([PLUSFS, *args], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"plusfs {' '.join(args)} failed: {p.stdout}{p.stderr}")
    return p.stdout


def statuses(data: Path) -> dict[int, dict]:
    """Every answering server's status, by id."""
    p = subprocess.run([PLUSFS, "cluster", "status", "--json", "--data", str(data)], capture_output=True, text=True)
    out = {}
    for line in p.stdout.splitlines():
        s = json.loads(line)
        if "down" not in s:
            out[s["id"]] = s
    return out


def make_tree(root: Path) -> int:
    """DIRS directories (40 per parent) of FILES 4 KiB files, and BIG large files; bytes."""
    total = 0
    block = os.urandom(4096)
    for d in range(DIRS):
        p = root / "tree" / f"p{d % 40}" / f"d{d}"
        p.mkdir(parents=True, exist_ok=True)
        for f in range(FILES):
            (p / f"f{f}").write_bytes(block)
            total += 4096
    big = root / "tree" / "big"
    big.mkdir(parents=True, exist_ok=True)
    chunk = os.urandom(1 << 20)
    for b in range(BIG):
        with open(big / f"b{b}", "wb") as fh:
            for _ in range(BIG_MIB):
                fh.write(chunk)
        total += BIG_MIB << 20
    return total


class Load:
    """`plusfs bench create unlink` rounds in a loop; each round's interval and rates."""

    def __init__(self, env: dict):
        self.env = env
        self.rounds: list[tuple[float, float, float]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        k = 0
        while not self.stop.is_set() and k < 2000:
            t0 = time.monotonic()
            p = subprocess.run(
                [
                    PLUSFS,
                    "bench",
                    "create",
                    "unlink",
                    "-n",
                    str(LOAD_FILES),
                    "-c",
                    str(LOAD_CLIENTS),
                    "--unique",
                    "--dir",
                    f"/load{k % 4}",
                ],
                capture_output=True,
                text=True,
                env=self.env,
            )
            t1 = time.monotonic()
            if p.returncode == 0:
                ops = 2 * LOAD_FILES * LOAD_CLIENTS
                self.rounds.append((t0, t1, ops / (t1 - t0)))
            k += 1

    def rate(self, start: float, end: float, inside: bool) -> float | None:
        """Median rate of rounds inside [start, end] (or wholly before `start`)."""
        if inside:
            got = [r for (a, b, r) in self.rounds if a < end and b > start]
        else:
            got = [r for (a, b, r) in self.rounds if b <= start]
        return statistics.median(got) if got else None

    def count(self, start: float, end: float) -> int:
        return sum(1 for (a, b, _) in self.rounds if a < end and b > start)


def change(cmd: list[str], data: Path, env: dict) -> tuple[float, str]:
    t0 = time.monotonic()
    out = run(*cmd, "--data", str(data), "--wait", env=env)
    return time.monotonic() - t0, out


def measure(n: int, work: Path) -> list[dict]:
    data = work / f"c{n}"
    env = dict(os.environ, PLUSFS_CLUSTER=str(data / "cluster.toml"))
    pace = ["--rebalance-objects", PACE[0], "--rebalance-mib", PACE[1]] if PACE else []
    run("cluster", "up", "--servers", str(n), "--data", str(data), "--detach", *pace)
    results = []
    try:
        src = work / "src"
        if not src.exists():
            make_tree(src)
        run("cp", "-r", "-q", str(src / "tree"), "plusfs:/tree", env=env)
        before = statuses(data)
        dirs = sum(s["dir_objects"] for s in before.values())
        data_bytes = sum(s["data_live_bytes"] for s in before.values())
        load = Load(env)
        load.thread.start()
        time.sleep(8)
        t_add = time.monotonic()
        secs, out = change(["cluster", "add"], data, env)
        t_bal = time.monotonic()
        time.sleep(3)
        after = statuses(data)
        new_id = max(after)
        moved_dirs = after[new_id]["dir_objects"]
        moved_bytes = after[new_id]["data_live_bytes"]
        steady = load.rate(t_add, t_bal, inside=False)
        during = load.rate(t_add, t_bal, inside=True)
        results.append(
            {
                "servers": n,
                "change": "add",
                "dir_objects": dirs,
                "data_bytes": data_bytes,
                "moved_dirs": moved_dirs,
                "moved_bytes": moved_bytes,
                "moved_fraction": moved_dirs / dirs,
                "moved_bytes_fraction": moved_bytes / max(data_bytes, 1),
                "ideal": 1 / (n + 1),
                "seconds": secs,
                "objects_per_sec": moved_dirs / secs,
                "mib_per_sec": moved_bytes / secs / (1 << 20),
                "load_steady": steady,
                "load_during": during,
                "load_rounds_during": load.count(t_add, t_bal),
                "load_ratio": (during / steady) if (during and steady) else None,
            }
        )
        # Drain one of the original servers.
        victim = 1
        held = after[victim]
        dirs = sum(s["dir_objects"] for s in after.values())
        live = sum(s["data_live_bytes"] for s in after.values())
        t_dr = time.monotonic()
        secs, out = change(["cluster", "drain", "--server", str(victim)], data, env)
        t_end = time.monotonic()
        load.stop.set()
        load.thread.join()
        results.append(
            {
                "servers": n + 1,
                "change": "drain",
                "dir_objects": dirs,
                "moved_dirs": held["dir_objects"],
                "moved_fraction": held["dir_objects"] / dirs,
                "moved_bytes": held["data_live_bytes"],
                "moved_bytes_fraction": held["data_live_bytes"] / max(live, 1),
                "ideal": 1 / (n + 1),
                "seconds": secs,
                "objects_per_sec": held["dir_objects"] / secs,
                "mib_per_sec": held["data_live_bytes"] / secs / (1 << 20),
                "load_steady": load.rate(t_dr, t_end, inside=False),
                "load_during": load.rate(t_dr, t_end, inside=True),
                "load_rounds_during": load.count(t_dr, t_end),
            }
        )
        r = results[-1]
        r["load_ratio"] = (r["load_during"] / r["load_steady"]) if (r["load_during"] and r["load_steady"]) else None
        run("cluster", "remove", "--server", str(victim), "--data", str(data), env=env)
        fsck = run("fsck", env=env)
        for r in results:
            r["fsck"] = fsck.strip().splitlines()[-1]
    finally:
        subprocess.run([PLUSFS, "cluster", "down", "--data", str(data)], capture_output=True)
        shutil.rmtree(data, ignore_errors=True)
    return results


def measure_shard_drain(work: Path) -> dict:
    """Drains a server holding a SHARD_ENTRIES-entry shard of /huge (see the module text)."""
    data = work / "shard"
    env = dict(os.environ, PLUSFS_CLUSTER=str(data / "cluster.toml"))
    run("cluster", "up", "--servers", "3", "--data", str(data), "--detach")
    try:
        run("mkdir", "/huge", env=env)
        run("hugedir", "--width", "2", "--threshold", "0", "/huge", env=env)
        clients = 4
        t0 = time.monotonic()
        run(
            "bench",
            "create",
            "-n",
            str(SHARD_ENTRIES * 2 // clients),
            "-c",
            str(clients),
            "-b",
            "1000",
            "-d",
            "/huge",
            env=env,
        )
        fill = time.monotonic() - t0
        held = {i: dict(s["shards"]).get("/huge", 0) for i, s in statuses(data).items()}
        victim = max((i for i in held if i != 0), key=lambda i: held[i])
        secs, _ = change(["cluster", "drain", "--server", str(victim)], data, env)
        after = {i: dict(s["shards"]).get("/huge", 0) for i, s in statuses(data).items()}
        run("cluster", "remove", "--server", str(victim), "--data", str(data), env=env)
        fsck = run("fsck", env=env).strip().splitlines()[-1]
        return {
            "change": "drain of a shard",
            "shard_entries": held[victim],
            "fill_seconds": fill,
            "seconds": secs,
            "entries_per_sec": held[victim] / secs,
            "before": held,
            "after": after,
            "fsck": fsck,
        }
    finally:
        subprocess.run([PLUSFS, "cluster", "down", "--data", str(data)], capture_output=True)
        shutil.rmtree(data, ignore_errors=True)


def fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="elastic-"))
    all_results = []
    try:
        with open(OUT / "elastic.jsonl", "a") as out:
            for n in SERVERS:
                for r in measure(n, work):
                    out.write(json.dumps(r) + "\n")
                    out.flush()
                    all_results.append(r)
                    print(json.dumps(r), file=sys.stderr)
            if SHARD_ENTRIES:
                shard = measure_shard_drain(work)
                out.write(json.dumps(shard) + "\n")
                print(json.dumps(shard), file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        "| servers | change | dir objects | moved | moved / ideal | bytes moved | time (s) | objects/s | MiB/s "
        "| load before | load during (rounds) | ratio |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in all_results:
        print(
            f"| {r['servers']} | {r['change']} | {r['dir_objects']} | {r['moved_dirs']} "
            f"({r['moved_fraction']:.3f}) | {r['moved_fraction'] / r['ideal']:.2f} | "
            f"{r['moved_bytes'] / (1 << 20):.1f} MiB ({r['moved_bytes_fraction']:.3f}) | {r['seconds']:.1f} | "
            f"{r['objects_per_sec']:.0f} | {r['mib_per_sec']:.1f} | {fmt(r['load_steady'], '.0f')} | "
            f"{fmt(r['load_during'], '.0f')} ({r['load_rounds_during']}) | {fmt(r['load_ratio'], '.2f')} |"
        )


if __name__ == "__main__":
    main()
