"""Preprocessing of result files (seed 003 §3.3.9, Listings 3.4-3.5).

For every interval: total operations completed (a process that has finished keeps its last
count), total rate, and the standard deviation and coefficient of variation of the
operations each process completed during the interval. The stonewall average divides the
total at the moment the first process finished by that moment; the wall-clock average
divides the final total by the end of the last process; the fixed-operations average
divides the total at the first moment it reached N operations by that moment (0 when it
never did)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from . import results as res


@dataclass
class Interval:
    timestamp: float
    total: int
    rate: float
    stdev: float
    cov: float


@dataclass
class Summary:
    operation: str
    nodes: int
    procs: int
    intervals: list[Interval]
    stonewall_time: float
    stonewall_ops: int
    stonewall_rate: float
    wallclock_time: float
    total_ops: int
    wallclock_rate: float
    fixed: dict[int, float]
    # Exact totals/time from timing.tsv (mdtest accounting), when recorded.
    exact_rate: float | None = None

    @property
    def ppn(self) -> int:
        return self.procs // self.nodes if self.nodes else 0


def _key(t: float) -> float:
    return round(t, 6)


def intervals(result: res.RunResult) -> list[Interval]:
    """Listing 3.4 rows for one result."""
    times = sorted({_key(t) for s in result.samples.values() for t, _ in s})
    per_proc = {p: {_key(t): n for t, n in s} for p, s in result.samples.items()}
    last = {p: 0 for p in per_proc}
    prev_total, prev_t = None, None
    rows = []
    for t in times:
        deltas = []
        for p, values in per_proc.items():
            now = values.get(t, last[p])
            deltas.append(now - last[p])
            last[p] = now
        total = sum(last.values())
        if prev_total is None:
            rate, sd, cov = 0.0, 0.0, 0.0
        else:
            rate = (total - prev_total) / (t - prev_t)
            sd = statistics.stdev(deltas) if len(deltas) > 1 else 0.0
            mean = statistics.fmean(deltas)
            cov = sd / mean if mean else 0.0
        rows.append(Interval(t, total, rate, sd, cov))
        prev_total, prev_t = total, t
    return rows


def summarize(result: res.RunResult, fixed_ops: list[int] | None = None) -> Summary:
    rows = intervals(result)
    ends = [max(t for t, _ in s) for s in result.samples.values() if s]
    stonewall_time = _key(min(ends)) if ends else 0.0
    wall_time = _key(max(ends)) if ends else 0.0
    at = {r.timestamp: r.total for r in rows}
    stonewall_ops = at.get(stonewall_time, 0)
    total = rows[-1].total if rows else 0
    fixed = {}
    for n in fixed_ops or []:
        hit = next((r for r in rows if r.total >= n), None)
        fixed[n] = hit.total / hit.timestamp if hit and hit.timestamp > 0 else 0.0
    return Summary(
        operation=result.operation,
        nodes=result.nodes,
        procs=result.procs,
        intervals=rows,
        stonewall_time=stonewall_time,
        stonewall_ops=stonewall_ops,
        stonewall_rate=stonewall_ops / stonewall_time if stonewall_time else 0.0,
        wallclock_time=wall_time,
        total_ops=total,
        wallclock_rate=total / wall_time if wall_time else 0.0,
        fixed=fixed,
    )


def interval_lines(s: Summary) -> list[str]:
    """Listing 3.4 text: operation, nodes, procs, time, total, rate, stdev, COV."""
    return [
        f"{s.operation}\t{s.nodes}\t{s.procs}\t{r.timestamp:g}\t{r.total}\t{r.rate:.0f}\t{r.stdev:.1f}\t{r.cov:.3f}"
        for r in s.intervals
    ]


def summary_line(s: Summary, fixed_ops: list[int]) -> str:
    """Listing 3.5 text: operation, nodes, ppn, procs, stonewall, fixed-operation averages."""
    cells = [s.operation, str(s.nodes), str(s.ppn), str(s.procs), f"{s.stonewall_rate:.0f}"]
    cells += [f"{s.fixed.get(n, 0.0):.0f}" for n in fixed_ops]
    return "\t".join(cells)


MDTEST_NAMES = {
    "MakeFiles": "File creation",
    "MakeFiles64byte": "File creation (64 B)",
    "MakeFiles65byte": "File creation (65 B)",
    "MakeOnedirFiles": "File creation (one dir)",
    "MakeDirs": "Directory creation",
    "StatFiles": "File stat",
    "StatNocacheFiles": "File stat (no cache)",
    "StatMultinodeFiles": "File stat (other node)",
    "DeleteFiles": "File removal",
    "OpenCloseFiles": "File open/close",
}


def mdtest_table(summaries: list[Summary]) -> str:
    """An mdtest-style `SUMMARY rate` table: per operation, over its configurations, the
    max/min/mean/std dev of total operations / time of the slowest process (mdtest's
    accounting: exact when timing.tsv has it, else to the interval), then per configuration
    the interval-based wall-clock and stonewall rates beside the exact one."""
    lines = [
        f"SUMMARY rate: (of {len(summaries)} configurations)",
        "",
        f"   {'Operation':<28}{'Max':>15}{'Min':>15}{'Mean':>15}{'Std Dev':>15}",
        f"   {'---------':<28}{'---':>15}{'---':>15}{'----':>15}{'-------':>15}",
    ]
    by_op: dict[str, list[Summary]] = {}
    for s in summaries:
        by_op.setdefault(s.operation, []).append(s)
    for op, ss in by_op.items():
        rates = [s.exact_rate or s.wallclock_rate for s in ss]
        sd = statistics.stdev(rates) if len(rates) > 1 else 0.0
        name = MDTEST_NAMES.get(op, op)
        lines.append(f"   {name:<26}: {max(rates):15.3f}{min(rates):15.3f}{statistics.fmean(rates):15.3f}{sd:15.3f}")
    lines.append("")
    lines.append(
        f"   {'configuration':<36}{'total ops':>11}{'wall s':>8}{'wall ops/s':>13}{'stonewall ops/s':>17}"
        f"{'exact ops/s':>13}"
    )
    for s in summaries:
        cfg = f"{s.operation} {s.nodes} nodes x {s.ppn} ppn"
        exact = f"{s.exact_rate:13.1f}" if s.exact_rate else f"{'-':>13}"
        lines.append(
            f"   {cfg:<36}{s.total_ops:>11}{s.wallclock_time:>8.2f}{s.wallclock_rate:>13.1f}{s.stonewall_rate:>17.1f}"
            + exact
        )
    return "\n".join(lines)


def analyze(directory: Path, fixed_ops: list[int] | None = None) -> list[Summary]:
    """Summarises every result file of a result set and writes `summary-*.tsv` files and
    `summary.tsv` next to them."""
    directory = Path(directory)
    fixed_ops = fixed_ops or []
    files = res.result_files(directory)
    if not files:
        raise FileNotFoundError(f"no results-*.tsv in {directory}")
    summaries = [summarize(res.read(f), fixed_ops) for f in files]
    timing = res.read_timing(directory)
    for s in summaries:
        ops, secs = timing.get((s.operation, s.nodes, s.procs), (0, 0.0))
        s.exact_rate = ops / secs if secs else None
    summaries.sort(key=lambda s: (s.operation, s.nodes, s.procs))
    for s in summaries:
        out = directory / f"summary-{s.operation}-{s.nodes}-{s.procs}.tsv"
        out.write_text("\n".join(interval_lines(s)) + "\n")
    (directory / "summary.tsv").write_text("\n".join(summary_line(s, fixed_ops) for s in summaries) + "\n")
    return summaries
