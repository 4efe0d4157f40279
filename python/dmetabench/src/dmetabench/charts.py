"""Charts (seed 003 §3.3.10): the combined time chart, performance vs number of
processes, performance vs number of nodes; several result sets on one chart."""

from __future__ import annotations

from pathlib import Path

from . import analysis
from . import results as res


def _plt():
    try:
        import matplotlib
    except ImportError as e:
        raise SystemExit("dmetabench: charts need matplotlib (pip install matplotlib)") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, out: Path) -> list[Path]:
    out.parent.mkdir(parents=True, exist_ok=True)
    paths = [out.with_suffix(".png"), out.with_suffix(".svg")]
    for p in paths:
        fig.savefig(p, dpi=110)
    return paths


def time_chart(result_file: Path, out: Path) -> list[Path]:
    """Operations completed, COV and ops/s over time for one configuration (Fig. 3.11)."""
    plt = _plt()
    s = analysis.summarize(res.read(result_file))
    t = [r.timestamp for r in s.intervals]
    fig, (a, b, c) = plt.subplots(3, 1, sharex=True, figsize=(8, 7))
    a.plot(t, [r.total for r in s.intervals], color="tab:blue")
    a.set_ylabel("operations completed")
    b.plot(t, [r.cov for r in s.intervals], color="tab:red")
    b.set_ylabel("COV")
    c.plot(t, [r.rate for r in s.intervals], color="tab:green")
    c.axhline(s.stonewall_rate, linestyle="--", color="gray", label=f"stonewall {s.stonewall_rate:,.0f} ops/s")
    c.set_ylabel("operations/s")
    c.set_xlabel("time (s)")
    c.legend(loc="lower right", fontsize=8)
    for ax in (a, b, c):
        ax.grid(alpha=0.3)
    fig.suptitle(f"{s.operation}: {s.nodes} node(s), {s.procs} process(es)")
    fig.tight_layout()
    paths = _save(fig, out)
    plt.close(fig)
    return paths


def _summaries(resultdirs: list[Path], operation: str, fixed: int | None) -> dict[str, list[analysis.Summary]]:
    out = {}
    for d in resultdirs:
        ss = [analysis.summarize(res.read(f), [fixed] if fixed else []) for f in res.result_files(d)]
        out[Path(d).name] = [s for s in ss if s.operation == operation]
    return out


def _value(s: analysis.Summary, fixed: int | None) -> float:
    return s.fixed.get(fixed, 0.0) if fixed else s.stonewall_rate


def scaling_chart(
    resultdirs: list[Path],
    operation: str,
    out: Path,
    by: str = "procs",
    nodes: int | None = None,
    ppn: int | None = None,
    fixed: int | None = None,
) -> list[Path]:
    """Stonewall (or fixed-operations) performance against the number of processes
    (`by="procs"`, nodes fixed, default 1) or of nodes (`by="nodes"`, ppn fixed, default 1),
    one line per result set (Figs. 3.12-3.13)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, ss in _summaries(resultdirs, operation, fixed).items():
        if by == "procs":
            sel = sorted((s for s in ss if s.nodes == (nodes or 1)), key=lambda s: s.procs)
            xs = [s.procs for s in sel]
        else:
            sel = sorted((s for s in ss if s.ppn == (ppn or 1)), key=lambda s: s.nodes)
            xs = [s.nodes for s in sel]
        if sel:
            ax.plot(xs, [_value(s, fixed) for s in sel], marker="o", label=label)
    ax.set_xlabel("number of processes" if by == "procs" else "number of nodes")
    ax.set_ylabel(f"operations/s ({'for ' + str(fixed) + ' operations' if fixed else 'stonewall'})")
    ax.set_title(operation)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths = _save(fig, out)
    plt.close(fig)
    return paths
