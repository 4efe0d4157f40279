"""The plusfs-native plugins against a real local plusfs cluster (server processes on
loopback, started with the `plusfs` binary: $PLUSFS_BIN, default the debug build)."""

import multiprocessing
import os
import subprocess
import time
from pathlib import Path

import plusfs  # built by `make pymodule` (maturin)
import pytest
from dmetabench.plugins import registry
from dmetabench.worker import WorkerState, handle


def plusfs_bin() -> str:
    if os.environ.get("PLUSFS_BIN"):
        return os.environ["PLUSFS_BIN"]
    target = os.environ.get("CARGO_TARGET_DIR", str(Path.home() / ".cache/plusfs/target"))
    return str(Path(target) / "debug" / "plusfs")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    data = tmp_path_factory.mktemp("cluster")
    exe = plusfs_bin()
    assert Path(exe).exists(), f"plusfs binary not found at {exe} (set PLUSFS_BIN)"
    subprocess.run(
        [exe, "cluster", "up", "--servers", "3", "--data", str(data), "--detach"], check=True, capture_output=True
    )
    yield str(data / "cluster.toml")
    subprocess.run([exe, "cluster", "down", "--data", str(data)], check=False, capture_output=True)


OPS = [
    "PlusfsMakeFiles",
    "PlusfsStatFiles",
    "PlusfsDeleteFiles",
    "PlusfsOpenCloseFiles",
    "PlusfsBatchMakeFiles",
    "PlusfsBatchStatFiles",
    "PlusfsBatchDeleteFiles",
    "PlusfsBatchOpenCloseFiles",
    "PlusfsWriteFiles",
    "PlusfsBatchWriteFiles",
    "PlusfsReadFiles",
    "PlusfsBatchReadFiles",
]


@pytest.mark.parametrize("op", OPS)
def test_plusfs_plugin(cluster, op):
    params = {
        "problemsize": 300,
        "runtime": 0.3,
        "workdir": f"/dmb/{op}/p0",
        "shared_dir": "/dmb/shared",
        "procno": 0,
        "procs": 1,
        "nodes": 1,
        "ppn": 1,
        "hostname": "h",
        "partner_dir": "",
        "plusfs_cluster": cluster,
        "batch": 100,
    }
    state = WorkerState()
    assert handle(state, {"cmd": "prepare", "operation": op, "params": params}).get("ok")
    reply = handle(state, {"cmd": "bench", "interval": 0.05, "runtime": 0.3, "start_at": time.time()})
    assert reply.get("ok"), reply
    final = reply["samples"][-1][1]
    if registry()[op].time_limited:
        assert final > 0
    else:
        assert final == 300
    assert handle(state, {"cmd": "cleanup"}).get("ok")
    fs = plusfs.connect(cluster)
    with pytest.raises(FileNotFoundError):
        fs.stat(f"/dmb/{op}/p0")


def test_python_module_basics(cluster):
    fs = plusfs.connect(cluster)
    fs.makedirs("/py/a/b")
    assert fs.listdir("/py/a") == ["b"]
    fds = fs.openv("/py/a", ["x", "y", "x", "bad/name"], create=True, exclusive=True)
    assert fds[0] >= 0 and fds[1] >= 0 and fds[2] == -17 and fds[3] == -22
    assert fs.closev([fds[0], fds[1], 9999]) == [0, 0, -9]
    st = fs.statv("/py/a", ["x", "nope", "b"])
    assert st[0].st_size == 0 and st[1] == -2 and st[2].st_mode & 0o040000
    with pytest.raises(FileExistsError) as e:
        fs.mkdir("/py/a")
    assert e.value.filename == "/py/a"
    assert fs.unlinkv("/py/a", ["x", "y"]) == [0, 0]
    fs.rmdir("/py/a/b")
    fs.rename("/py/a", "/py/c")
    assert fs.lstat("/py/c").st_nlink == 2
    fs.openv("/py/c", ["f"], create=True)
    fs.link("/py/c/f", "/py/g")
    assert fs.lstat("/py/g").st_nlink == 2 and fs.lstat("/py/c/f").st_ino == fs.lstat("/py/g").st_ino
    with pytest.raises(FileExistsError):
        fs.link("/py/c/f", "/py/g")
    fs.unlink("/py/c/f")
    assert fs.lstat("/py/g").st_nlink == 1


def test_hugedir_policy_from_python(cluster):
    c = plusfs.connect(cluster)
    c.mkdir("/pyhuge", 0o755, threshold="0")
    assert all(r >= 0 for r in c.openv("/pyhuge", [f"f{i}" for i in range(50)], create=True))
    d = c.hugedir("/pyhuge")
    assert d["state"] == "distributed"
    assert sum(d["entries"].values()) == 50
    assert len(d["set"]) == 3
    c.mkdir("/pysmall")
    assert c.set_hugedir("/pysmall", threshold="never")["threshold"] == "never"
    with pytest.raises(ValueError):
        c.set_hugedir("/pysmall", threshold="lots")


def test_file_contents_from_python(cluster):
    c = plusfs.connect(cluster)
    data = bytes(range(256)) * 5000
    assert c.write("/pydata", data) == len(data)
    assert c.read("/pydata") == data
    assert c.read("/pydata", 1000, 10) == data[1000:1010]
    files = [(f"/pybfo{i}", bytes([i]) * (i * 100)) for i in range(50)]
    assert c.batch_write(files + [("/", b"x")]) == [0] * 50 + [-21]
    got = c.batch_read([p for p, _ in files] + ["/pybfo-missing"])
    assert got[:50] == [d for _, d in files] and got[50] == -2
    c.truncate("/pydata", 3)
    assert c.read("/pydata") == data[:3]
    with pytest.raises(IsADirectoryError):
        c.read("/")


def _use_inherited_client(c, fd):
    c.mkdir("/pyfork/child")
    c.write("/pyfork/child/f", b"from the child")
    c.close(fd)


def test_client_used_in_a_forked_child(cluster):
    """A client used in a process forked after connecting (multiprocessing's fork start
    method, MPI) gets a fresh runtime and connections there and keeps its descriptors."""
    c = plusfs.connect(cluster)
    c.mkdir("/pyfork")
    fd = c.open("/pyfork/f", create=True)
    assert c.listdir("/pyfork") == ["f"]
    child = multiprocessing.get_context("fork").Process(target=_use_inherited_client, args=(c, fd))
    child.start()
    child.join(30)
    if child.is_alive():
        child.kill()
        child.join()
    assert child.exitcode == 0
    assert c.read("/pyfork/child/f") == b"from the child"
    c.close(fd)  # the child closed its own copy of the descriptor
