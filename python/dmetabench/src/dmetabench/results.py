"""Result files: `results-<Operation>-<nodes>-<procs>.tsv` (seed 003 Listing 3.3)."""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

HEADER = ["Hostname", "Operation", "ProcessNo", "Timestamp", "OperationsDone"]


@dataclass
class RunResult:
    """The time log of one configuration: per process, (timestamp, operations done)."""

    operation: str
    nodes: int
    procs: int
    hosts: dict[int, str] = field(default_factory=dict)
    samples: dict[int, list[tuple[float, int]]] = field(default_factory=dict)

    @property
    def filename(self) -> str:
        return f"results-{self.operation}-{self.nodes}-{self.procs}.tsv"


def write(result: RunResult, directory: Path) -> Path:
    path = Path(directory) / result.filename
    with open(path, "w", newline="") as f:
        w = csv.writer(f, delimiter="\t", lineterminator="\n")
        w.writerow(HEADER)
        for proc in sorted(result.samples):
            for t, ops in result.samples[proc]:
                w.writerow([result.hosts.get(proc, ""), result.operation, proc, f"{t:g}", ops])
    return path


def read(path: Path) -> RunResult:
    """Reads a result file; nodes and procs come from its name."""
    path = Path(path)
    stem = path.stem
    if not stem.startswith("results-"):
        raise ValueError(f"{path}: not a result file (results-<Operation>-<nodes>-<procs>.tsv)")
    operation, nodes, procs = stem[len("results-") :].rsplit("-", 2)
    result = RunResult(operation=operation, nodes=int(nodes), procs=int(procs))
    with open(path, newline="") as f:
        rows = csv.reader(f, delimiter="\t")
        header = next(rows, None)
        if header != HEADER:
            raise ValueError(f"{path}: unexpected header {header}")
        for line_no, row in enumerate(rows, start=2):
            if not row:
                continue
            if len(row) != 5:
                raise ValueError(f"{path}:{line_no}: expected 5 columns, found {len(row)}")
            host, _op, proc, t, ops = row
            p = int(proc)
            result.hosts[p] = host
            result.samples.setdefault(p, []).append((float(t), int(ops)))
    for s in result.samples.values():
        s.sort()
    return result


TIMING = "timing.tsv"


def append_timing(directory: Path, result: RunResult, total: int, seconds: float) -> None:
    """Records the exact duration of a configuration (from the synchronised start to the
    end of the slowest process): mdtest's totals/time accounting, not quantised to the
    interval."""
    path = Path(directory) / TIMING
    new = not path.exists()
    with open(path, "a") as f:
        if new:
            f.write("Operation\tNodes\tProcs\tOperationsDone\tSeconds\n")
        f.write(f"{result.operation}\t{result.nodes}\t{result.procs}\t{total}\t{seconds:.6f}\n")


def read_timing(directory: Path) -> dict[tuple[str, int, int], tuple[int, float]]:
    """(operation, nodes, procs) -> (operations, seconds) from timing.tsv, if present."""
    path = Path(directory) / TIMING
    if not path.exists():
        return {}
    out = {}
    for line in path.read_text().splitlines()[1:]:
        op, nodes, procs, total, secs = line.split("\t")
        out[(op, int(nodes), int(procs))] = (int(total), float(secs))
    return out


def result_files(directory: Path) -> list[Path]:
    return sorted(Path(directory).glob("results-*.tsv"))
