"""`dmetabench` command line: run (default), analyze, chart, env."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from . import analysis, charts, envprofile
from .master import RunConfig
from .master import run as run_master


def _run_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--operations", required=True, help="comma-separated plugin names, e.g. MakeFiles,StatFiles")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--workdir", help="directory the benchmark works in (shared by all processes)")
    where.add_argument("--pathlist", help="file with one working directory per process, in process order")
    p.add_argument(
        "--problemsize",
        type=int,
        default=1000,
        help="operations per process (files per subdirectory for time-limited plugins)",
    )
    p.add_argument("--runtime", type=float, default=60.0, help="seconds for time-limited plugins (default 60)")
    p.add_argument("--interval", type=float, default=0.1, help="time-log interval in seconds (default 0.1)")
    p.add_argument("--label", default="run", help="name of the result set")
    p.add_argument("--nodestep", type=int, default=1)
    p.add_argument("--ppnstep", type=int, default=1)
    p.add_argument(
        "--procs",
        type=int,
        default=os.cpu_count() or 1,
        help="worker processes without MPI (default: number of CPUs)",
    )
    p.add_argument("--max-procs", type=int, help="skip configurations with more processes")
    p.add_argument("--min-procs", type=int, help="skip configurations with fewer processes")
    p.add_argument("--results", default="dmetabench-results", help="where result sets are written")
    p.add_argument("--plugin-path", action="append", default=[], help="directory or file with more plugins")
    p.add_argument("--vmstat-seconds", type=int, default=15, help="vmstat before the run (default 15)")
    p.add_argument("--plusfs-cluster", help="cluster map for the Plusfs* plugins (default: $PLUSFS_CLUSTER)")
    p.add_argument("--batch", type=int, default=1000, help="entries per request of the PlusfsBatch* plugins")
    p.add_argument("--filesize", type=int, default=4096, help="bytes per file of the Write/ReadFiles plugins")


def _fixed(text: str | None) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()] if text else []


def cmd_run(args) -> int:
    pathlist = None
    if args.pathlist:
        pathlist = [line.strip() for line in Path(args.pathlist).read_text().splitlines() if line.strip()]
    cfg = RunConfig(
        operations=[o.strip() for o in args.operations.split(",") if o.strip()],
        workdir=args.workdir,
        pathlist=pathlist,
        problemsize=args.problemsize,
        runtime=args.runtime,
        interval=args.interval,
        label=args.label,
        nodestep=args.nodestep,
        ppnstep=args.ppnstep,
        results_root=args.results,
        plugin_paths=[str(Path(p).resolve()) for p in args.plugin_path],
        vmstat_seconds=args.vmstat_seconds,
        max_procs=args.max_procs,
        min_procs=args.min_procs,
        extra={
            "plusfs_cluster": args.plusfs_cluster or os.environ.get("PLUSFS_CLUSTER"),
            "batch": args.batch,
            "filesize": args.filesize,
        },
    )
    if args.interval <= 0 or args.problemsize < 1 or args.procs < 1:
        raise SystemExit("dmetabench: --interval, --problemsize and --procs must be positive")
    from .transport import LocalTransport, MPITransport, mpi_world

    comm = mpi_world()
    if comm is not None and comm.Get_rank() != 0:
        from .worker import serve

        serve(lambda: comm.recv(source=0), lambda m: comm.send(m, dest=0))
        return 0
    transport = MPITransport(comm) if comm is not None else LocalTransport(args.procs)
    try:
        outdir = run_master(transport, cfg)
    finally:
        transport.close()
    print(outdir)
    return 0


def cmd_analyze(args) -> int:
    fixed = _fixed(args.fixed_ops)
    summaries = analysis.analyze(Path(args.resultdir), fixed)
    for s in summaries:
        print("\n".join(analysis.interval_lines(s)))
        print()
    print("# operation\tnodes\tppn\tprocs\tstonewall" + "".join(f"\t{n} ops" for n in fixed))
    for s in summaries:
        print(analysis.summary_line(s, fixed))
    print()
    print(analysis.mdtest_table(summaries))
    return 0


def cmd_chart(args) -> int:
    out = Path(args.out)
    if args.kind == "time":
        paths = charts.time_chart(Path(args.result), out)
    else:
        paths = charts.scaling_chart(
            [Path(d) for d in args.resultdirs],
            args.operation,
            out,
            by=args.kind,
            nodes=args.nodes,
            ppn=args.ppn,
            fixed=int(args.fixed_ops) if args.fixed_ops else None,
        )
    for p in paths:
        print(p)
    return 0


def cmd_env(args) -> int:
    env = json.loads((Path(args.resultdir) / "environment.json").read_text())
    print(envprofile.render(env))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="dmetabench", description="distributed metadata benchmark")
    sub = parser.add_subparsers(dest="command")
    _run_parser(sub.add_parser("run", help="run benchmarks (the default command)"))
    a = sub.add_parser("analyze", help="per-interval totals, rates, COV, stonewall and summary")
    a.add_argument("resultdir")
    a.add_argument("--fixed-ops", help="also average over the first N operations, e.g. 10000,25000")
    c = sub.add_parser("chart", help="time chart or scaling charts (PNG and SVG)")
    csub = c.add_subparsers(dest="kind", required=True)
    t = csub.add_parser("time", help="operations, COV and ops/s over time of one result file")
    t.add_argument("result", help="a results-*.tsv file")
    t.add_argument("--out", required=True, help="output path without extension")
    for kind in ("procs", "nodes"):
        k = csub.add_parser(kind, help=f"performance vs number of {'processes' if kind == 'procs' else 'nodes'}")
        k.add_argument("resultdirs", nargs="+", help="one or more result sets, one line each")
        k.add_argument("--operation", required=True)
        k.add_argument("--nodes", type=int, help="fixed number of nodes (procs chart; default 1)")
        k.add_argument("--ppn", type=int, help="fixed processes per node (nodes chart; default 1)")
        k.add_argument("--fixed-ops", help="plot the average for this many operations instead of stonewall")
        k.add_argument("--out", required=True)
    e = sub.add_parser("env", help="print the environment profile of a result set")
    e.add_argument("resultdir")
    if not argv or argv[0] not in {"run", "analyze", "chart", "env", "-h", "--help"}:
        argv = ["run", *argv]
    args = parser.parse_args(argv)
    return {"run": cmd_run, "analyze": cmd_analyze, "chart": cmd_chart, "env": cmd_env}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
