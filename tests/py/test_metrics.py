"""The metrics endpoints of a real local cluster parse with the Prometheus project's own
text parser (`prometheus_client`), and their histograms are consistent: per operation the
`+Inf` bucket equals `_count`, buckets never decrease, and the counts move with work done.

Needs the `plusfs` binary ($PLUSFS_BIN).
"""

import os
import subprocess
import tempfile
import tomllib
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families


def plusfs_bin() -> str:
    target = Path(os.environ.get("CARGO_TARGET_DIR", str(Path.home() / ".cache/plusfs/target")))
    return os.environ.get("PLUSFS_BIN") or str(target / "debug" / "plusfs")


@pytest.fixture(scope="module")
def cluster():
    data = Path(tempfile.mkdtemp(prefix="plusfs-metrics-"))
    exe = plusfs_bin()
    subprocess.run(
        [exe, "cluster", "up", "--servers", "2", "--data", str(data), "--detach"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    try:
        yield exe, data / "cluster.toml"
    finally:
        subprocess.run([exe, "cluster", "down", "--data", str(data)], capture_output=True, timeout=120)


def scrape(addr: str) -> dict:
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def count_of(families: dict, op: str) -> float:
    f = families.get("plusfs_request_duration_seconds")
    if f is None:
        return 0.0
    return sum(s.value for s in f.samples if s.name.endswith("_count") and s.labels.get("op") == op)


def test_every_endpoint_parses_and_histograms_are_consistent(cluster):
    exe, map_file = cluster
    servers = tomllib.loads(map_file.read_text())["servers"]
    addrs = [s["metrics"] for s in servers]
    before = [scrape(a) for a in addrs]
    env = dict(os.environ, PLUSFS_CLUSTER=str(map_file))
    subprocess.run([exe, "mkdir", "/p"], check=True, env=env, capture_output=True, timeout=60)
    subprocess.run(
        [exe, "touch"] + [f"/p/f{i}" for i in range(30)], check=True, env=env, capture_output=True, timeout=60
    )
    after = [scrape(a) for a in addrs]
    moved = 0.0
    for fams in after:
        assert fams["plusfs_ops"].type == "counter"
        assert fams["plusfs_connections"].type == "gauge"
        hist = fams["plusfs_request_duration_seconds"]
        assert hist.type == "histogram"
        by_op: dict = {}
        for s in hist.samples:
            by_op.setdefault(s.labels.get("op"), []).append(s)
        for op, series in by_op.items():
            buckets = [s for s in series if s.name.endswith("_bucket")]
            bounds = [float(s.labels["le"]) for s in buckets]
            assert bounds == sorted(bounds) and bounds[0] == pytest.approx(1e-5), op
            values = [s.value for s in buckets]
            assert values == sorted(values), f"{op}: cumulative buckets never decrease"
            count = next(s.value for s in series if s.name.endswith("_count"))
            assert values[-1] == count, f"{op}: +Inf bucket equals _count"
    for b, a in zip(before, after, strict=True):
        moved += sum(count_of(a, op) - count_of(b, op) for op in ("batch", "create", "mkdir", "cx_exec", "sub_exec"))
    assert moved >= 2, "the work done shows in the histograms"
