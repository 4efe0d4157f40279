"""Whole runs: local worker processes (the default) and under `mpirun -np 3`; then
analysis, charts and the environment profile of the result set."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from dmetabench import analysis
from dmetabench.cli import main

ARGS = [
    "--operations",
    "MakeFiles,StatFiles,DeleteFiles",
    "--problemsize",
    "200",
    "--runtime",
    "0.5",
    "--interval",
    "0.05",
    "--vmstat-seconds",
    "1",
]


def only_dir(root: Path) -> Path:
    dirs = [d for d in root.iterdir() if d.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def check_result_set(rd: Path, procs: list[int]):
    names = {p.name for p in rd.glob("results-*.tsv")}
    for p in procs:
        for op in ("MakeFiles", "StatFiles", "DeleteFiles"):
            assert f"results-{op}-1-{p}.tsv" in names
    summaries = analysis.analyze(rd, [100])
    for s in summaries:
        assert s.total_ops > 0 and s.stonewall_rate > 0
        if s.operation != "MakeFiles":
            assert s.total_ops == 200 * s.procs
    assert (rd / "environment.json").stat().st_size > 0


def test_local_run_analyze_chart_env(tmp_path, capsys):
    work, results = tmp_path / "work", tmp_path / "results"
    work.mkdir()
    assert main([*ARGS, "--workdir", str(work), "--procs", "2", "--results", str(results)]) == 0
    rd = only_dir(results)
    check_result_set(rd, [1, 2])
    assert list(work.iterdir()) == [], "test data removed"

    assert main(["analyze", str(rd), "--fixed-ops", "100"]) == 0
    out = capsys.readouterr().out
    assert "SUMMARY rate" in out and "File creation" in out

    assert main(["chart", "time", str(rd / "results-MakeFiles-1-2.tsv"), "--out", str(tmp_path / "t")]) == 0
    assert main(["chart", "procs", str(rd), str(rd), "--operation", "StatFiles", "--out", str(tmp_path / "p")]) == 0
    assert main(["chart", "nodes", str(rd), "--operation", "StatFiles", "--out", str(tmp_path / "n")]) == 0
    for stem in ("t", "p", "n"):
        for ext in (".png", ".svg"):
            assert (tmp_path / f"{stem}{ext}").stat().st_size > 1000

    assert main(["env", str(rd)]) == 0
    env = capsys.readouterr().out
    assert "kernel" in env and "target:" in env and "vmstat" in env


def test_pathlist(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    lst = tmp_path / "paths"
    lst.write_text(f"{a}\n{b}\n")
    args = [
        "--operations",
        "StatFiles",
        "--problemsize",
        "50",
        "--vmstat-seconds",
        "0",
        "--procs",
        "2",
        "--pathlist",
        str(lst),
        "--results",
        str(tmp_path / "r"),
    ]
    assert main(args) == 0
    assert {p.name for p in only_dir(tmp_path / "r").glob("results-*")} == {
        "results-StatFiles-1-1.tsv",
        "results-StatFiles-1-2.tsv",
    }


def test_mpirun_three_processes(tmp_path):
    mpirun = shutil.which("mpirun")
    assert mpirun, "Open MPI is installed by `make venv` (openmpi-bin)"
    work, results = tmp_path / "work", tmp_path / "results"
    work.mkdir()
    cmd = [
        mpirun,
        "--allow-run-as-root",
        "--oversubscribe",
        "-np",
        "3",
        sys.executable,
        "-m",
        "dmetabench.cli",
        *ARGS,
        "--workdir",
        str(work),
        "--results",
        str(results),
    ]
    env = dict(os.environ, OMPI_MCA_rmaps_base_oversubscribe="1")
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "2 workers on 1 node(s)" in proc.stderr
    check_result_set(only_dir(results), [1, 2])
