"""DMetabench's multi-node experiments on a replicated cluster under link delay: `plusfs
netns mpirun` over the client hosts of a `--netns` cluster, each host a node of its own
name. Network namespaces need root: without it this test fails unless PLUSFS_ALLOW_SKIP=1."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_plusfs_plugins import plusfs_bin
from test_run import ARGS, only_dir

# The whole runs' options, with the plusfs-native stat plugins.
OPTIONS = [*ARGS[2:], "--operations", "PlusfsStatMultinodeFiles,PlusfsStatFiles"]


def test_multinode_stat_over_the_network_kit(tmp_path):
    if os.geteuid() != 0:
        if os.environ.get("PLUSFS_ALLOW_SKIP") == "1":
            pytest.skip("network namespaces need root")
        pytest.fail("network namespaces need root (set PLUSFS_ALLOW_SKIP=1 to skip)")
    exe = plusfs_bin()
    assert Path(exe).exists(), f"plusfs binary not found at {exe} (set PLUSFS_BIN)"
    data = tmp_path / "cluster"
    up = [exe, "cluster", "up", "--servers", "2", "--replicas", "3", "--netns", "--clients", "2"]
    subprocess.run([*up, "--delay", "1ms", "--data", str(data), "--detach"], check=True, capture_output=True)
    try:
        results = tmp_path / "results"
        cmd = [
            exe,
            "netns",
            "mpirun",
            "--data",
            str(data),
            "--ppn",
            "2",
            "--",
            sys.executable,
            "-m",
            "dmetabench.cli",
            *OPTIONS,
            "--workdir",
            "/dmb",
            "--results",
            str(results),
        ]
        # The worker processes import dmetabench from this test's environment.
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "3 workers on 2 node(s)" in proc.stderr, proc.stderr
        rd = only_dir(results)
        hosts = json.loads((rd / "environment.json").read_text())
        assert set(hosts) == {"c0", "c1"}, "each client host is a node of its own name"
        names = {p.name for p in rd.glob("results-*.tsv")}
        # One process per node on two nodes (the plan keeps the nodes' process counts equal).
        assert "results-PlusfsStatMultinodeFiles-2-2.tsv" in names, names
        assert "results-PlusfsStatMultinodeFiles-1-1.tsv" not in names, "it needs two nodes"
        assert "results-PlusfsStatFiles-1-1.tsv" in names, names
        rows = (rd / "results-PlusfsStatMultinodeFiles-2-2.tsv").read_text().splitlines()
        assert len(rows) > 2, rows
    finally:
        subprocess.run([exe, "cluster", "down", "--data", str(data)], check=False, capture_output=True)
