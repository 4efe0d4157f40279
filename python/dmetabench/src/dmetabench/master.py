"""The master: discovery, plan, and the three synchronised phases of every subtask
(seed 003 §3.3.3). Each phase is sent to all chosen workers and ends when all of them
have answered, which is the barrier at the start and end of every phase."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import plan as planning
from . import results as res
from .plugins import registry


@dataclass
class RunConfig:
    operations: list[str]
    workdir: str | None = None
    pathlist: list[str] | None = None
    problemsize: int = 1000
    runtime: float = 60.0
    interval: float = 0.1
    label: str = "run"
    nodestep: int = 1
    ppnstep: int = 1
    results_root: str = "dmetabench-results"
    plugin_paths: list[str] = field(default_factory=list)
    vmstat_seconds: int = 15
    max_procs: int | None = None
    min_procs: int | None = None
    # Passed to every plugin as is (plusfs plugins: plusfs_cluster, batch).
    extra: dict = field(default_factory=dict)


def log(msg: str) -> None:
    print(f"dmetabench: {msg}", file=sys.stderr, flush=True)


def _phase(transport, workers: list[int], msgs: list[dict]) -> list[dict]:
    for w, m in zip(workers, msgs, strict=True):
        transport.send(w, m)
    return [transport.recv(w) for w in workers]


def _partner(order: list[int], hosts: dict[int, str], i: int) -> int:
    """The next process in order that runs on another node (cyclic), or -1."""
    n = len(order)
    for k in range(1, n):
        j = (i + k) % n
        if hosts[order[j]] != hosts[order[i]]:
            return j
    return -1


def run(transport, cfg: RunConfig) -> Path:
    """Runs the whole plan; returns the result directory."""
    plugins = registry(cfg.plugin_paths)
    unknown = [op for op in cfg.operations if op not in plugins]
    if unknown:
        raise SystemExit(f"dmetabench: unknown operation(s) {', '.join(unknown)}; known: {', '.join(sorted(plugins))}")
    if not cfg.workdir and not cfg.pathlist:
        raise SystemExit("dmetabench: give --workdir or --pathlist")

    hosts = {
        w: r["host"]
        for w, r in zip(
            transport.workers,
            _phase(transport, transport.workers, [{"cmd": "discover"}] * len(transport.workers)),
            strict=True,
        )
    }
    table = planning.placement(hosts)
    order = planning.process_order(table)
    plan = planning.execution_plan(table, cfg.nodestep, cfg.ppnstep)
    if cfg.max_procs:
        plan = [e for e in plan if e.procs <= cfg.max_procs]
    if cfg.min_procs:
        plan = [e for e in plan if e.procs >= cfg.min_procs]
    log(
        f"{len(hosts)} workers on {len(table)} node(s): "
        + "; ".join(f"{n}: {table[n]}" for n in planning.node_order(table))
    )
    log("plan: " + ", ".join(f"{e.nodes}x{e.ppn}" for e in plan))

    stamp = time.strftime("%Y%m%d-%H%M%S")
    outdir = Path(cfg.results_root) / f"{cfg.label}-{stamp}"
    outdir.mkdir(parents=True, exist_ok=False)
    base = Path(cfg.workdir or cfg.pathlist[0]) / f".dmetabench-{cfg.label}-{stamp}"

    # Environment profile: one worker per node.
    first = [table[n][0] for n in planning.node_order(table)]
    target = cfg.workdir or cfg.pathlist[0]
    profiles = _phase(
        transport,
        first,
        [{"cmd": "env", "workdir": target, "vmstat_seconds": cfg.vmstat_seconds}] * len(first),
    )
    env = {hosts[w]: p.get("env", p) for w, p in zip(first, profiles, strict=True)}
    (outdir / "environment.json").write_text(json.dumps(env, indent=2))
    (outdir / "parameters.json").write_text(json.dumps({**cfg.__dict__, "hosts": hosts, "order": order}, indent=2))

    for entry in plan:
        for op in cfg.operations:
            cls = plugins[op]
            if getattr(cls, "needs_nodes", 1) > entry.nodes:
                log(f"{op} needs {cls.needs_nodes} nodes; skipped with {entry.nodes}")
                continue
            _subtask(transport, cfg, op, cls, entry, order, hosts, base, outdir)
    shutil.rmtree(base, ignore_errors=True)
    log(f"results in {outdir}")
    return outdir


def _subtask(transport, cfg, op, cls, entry, order, hosts, base, outdir) -> None:
    workers = [w for w in order if w in entry.workers]
    run_dir = base / f"{op}-{entry.nodes}-{entry.procs}"
    params = []
    for i, w in enumerate(workers):
        if cfg.pathlist:
            if i >= len(cfg.pathlist):
                raise SystemExit(f"dmetabench: --pathlist has {len(cfg.pathlist)} paths, {len(workers)} processes")
            wd = os.path.join(cfg.pathlist[i], f".dmetabench-{op}-{entry.nodes}-{entry.procs}-p{i}")
        else:
            wd = str(run_dir / f"p{i}")
        params.append(
            {
                "problemsize": cfg.problemsize,
                "runtime": cfg.runtime,
                "workdir": wd,
                "shared_dir": str(run_dir / "shared"),
                "procno": i,
                "procs": len(workers),
                "nodes": entry.nodes,
                "ppn": entry.ppn,
                "hostname": hosts[w],
                **cfg.extra,
            }
        )
    for i, p in enumerate(params):
        j = _partner(workers, hosts, i)
        p["partner_dir"] = params[j]["workdir"] if j >= 0 else p["workdir"]

    log(f"{op}: {entry.nodes} node(s) x {entry.ppn} process(es)")
    common = {"operation": op, "plugin_paths": cfg.plugin_paths}
    replies = _phase(transport, workers, [{"cmd": "prepare", "params": p, **common} for p in params])
    errors = [r["error"] for r in replies if "error" in r]
    samples = None
    if not errors:
        start_at = time.time() + 0.2
        bench = {
            "cmd": "bench",
            "interval": cfg.interval,
            "start_at": start_at,
            "runtime": cfg.runtime if cls.time_limited else None,
        }
        replies = _phase(transport, workers, [bench] * len(workers))
        errors = [r["error"] for r in replies if "error" in r]
        samples = [r.get("samples", []) for r in replies]
        elapsed = max((r.get("elapsed", 0.0) for r in replies), default=0.0)
    cleanup = _phase(transport, workers, [{"cmd": "cleanup"}] * len(workers))
    errors += [r["error"] for r in cleanup if "error" in r]
    if errors:
        log(f"{op} {entry.nodes}x{entry.ppn} failed: {errors[0]}")
        return
    result = res.RunResult(
        op,
        entry.nodes,
        entry.procs,
        hosts={i: hosts[w] for i, w in enumerate(workers)},
        samples={i: [tuple(x) for x in s] for i, s in enumerate(samples)},
    )
    path = res.write(result, outdir)
    total = sum(s[-1][1] for s in samples if s)
    res.append_timing(outdir, result, total, elapsed)
    log(f"  {total} operations in {elapsed:.3f} s ({total / elapsed if elapsed else 0:,.0f} ops/s) -> {path.name}")
