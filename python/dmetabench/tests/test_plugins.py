"""Every built-in plugin against a temporary directory, through the worker's command
handler (the same path a real run takes), and user plugins from --plugin-path."""

import itertools
import os
import time

import pytest
from dmetabench.plugins import registry
from dmetabench.worker import WorkerState, handle

OPS = [
    "MakeFiles",
    "MakeFiles64byte",
    "MakeFiles65byte",
    "MakeOnedirFiles",
    "MakeDirs",
    "DeleteFiles",
    "StatFiles",
    "StatNocacheFiles",
    "StatMultinodeFiles",
    "OpenCloseFiles",
]


def params(tmp_path, **extra):
    p = {
        "problemsize": 50,
        "runtime": 0.3,
        "workdir": str(tmp_path / "p0"),
        "shared_dir": str(tmp_path / "shared"),
        "procno": 0,
        "procs": 1,
        "nodes": 1,
        "ppn": 1,
        "hostname": "h",
        "partner_dir": str(tmp_path / "p0"),
    }
    p.update(extra)
    return p


def test_all_builtins_are_registered():
    assert set(OPS) <= set(registry())


@pytest.mark.parametrize("op", OPS)
def test_plugin_runs_and_cleans_up(tmp_path, op):
    state = WorkerState()
    assert handle(state, {"cmd": "prepare", "operation": op, "params": params(tmp_path)}).get("ok")
    reply = handle(state, {"cmd": "bench", "interval": 0.05, "runtime": 0.3, "start_at": time.time()})
    assert reply.get("ok"), reply
    samples = reply["samples"]
    assert samples and samples[-1][1] > 0
    assert [t for t, _ in samples] == sorted(t for t, _ in samples)
    assert all(a[1] <= b[1] for a, b in itertools.pairwise(samples)), "progress never goes back"
    cls = registry()[op]
    if not cls.time_limited:
        assert samples[-1][1] == 50
    else:
        assert samples[-1][0] >= 0.3 - 1e-9
    assert handle(state, {"cmd": "cleanup"}).get("ok")
    assert not (tmp_path / "p0").exists()


def test_makefiles_payload_and_subdirectories(tmp_path):
    state = WorkerState()
    handle(state, {"cmd": "prepare", "operation": "MakeFiles64byte", "params": params(tmp_path, problemsize=10)})
    handle(state, {"cmd": "bench", "interval": 0.05, "runtime": 0.2, "start_at": time.time()})
    d = tmp_path / "p0"
    assert len(list(d.glob("d*"))) >= 2, "a new subdirectory every problemsize files"
    assert os.path.getsize(d / "d0" / "0") == 64
    handle(state, {"cmd": "cleanup"})


def test_errors_are_reported_not_raised(tmp_path):
    state = WorkerState()
    reply = handle(
        state,
        {
            "cmd": "prepare",
            "operation": "StatMultinodeFiles",
            "params": params(tmp_path, partner_dir=str(tmp_path / "missing")),
        },
    )
    assert reply.get("ok")
    reply = handle(state, {"cmd": "bench", "interval": 0.05, "start_at": time.time()})
    assert "FileNotFoundError" in reply["error"]
    handle(state, {"cmd": "cleanup"})


def test_user_plugins_from_a_path(tmp_path):
    plugin = tmp_path / "mine.py"
    plugin.write_text(
        "import os\n"
        "from dmetabench.plugins import Benchmark\n"
        "class ListDir(Benchmark):\n"
        "    abstract = False\n"
        "    def doBench(self):\n"
        "        for i in range(int(self.param_dict['problemsize'])):\n"
        "            os.listdir('.')\n"
        "            self.progress = i + 1\n"
    )
    assert "ListDir" in registry([str(tmp_path)])
    state = WorkerState()
    msg = {
        "cmd": "prepare",
        "operation": "ListDir",
        "plugin_paths": [str(tmp_path)],
        "params": params(tmp_path),
    }
    assert handle(state, msg).get("ok")
    reply = handle(state, {"cmd": "bench", "interval": 0.05, "start_at": time.time()})
    assert reply["samples"][-1][1] == 50
    handle(state, {"cmd": "cleanup"})
