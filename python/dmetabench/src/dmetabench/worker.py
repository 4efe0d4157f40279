"""The worker side: runs the phases of a benchmark plugin; a supervisor thread logs
progress every interval (seed 003 Fig. 3.7)."""

from __future__ import annotations

import os
import socket
import threading
import time
import traceback

from . import envprofile
from .plugins import registry


class Supervisor(threading.Thread):
    """Samples `plugin.progress` at every multiple of `interval` after `t0`; stops a
    time-limited plugin after `runtime` seconds; ends with the sample after the benchmark
    finished, so a process's last row is its final count."""

    def __init__(self, plugin, interval: float, runtime: float | None, t0: float):
        super().__init__(daemon=True)
        self.plugin, self.interval, self.runtime, self.t0 = plugin, interval, runtime, t0
        self.finished = threading.Event()
        self.samples: list[tuple[float, int]] = []

    def run(self) -> None:
        k = 1
        while True:
            delay = self.t0 + k * self.interval - time.monotonic()
            if delay > 0:
                self.finished.wait(delay)
                # Finishing early does not end the interval: wait for its end.
                rest = self.t0 + k * self.interval - time.monotonic()
                if rest > 0:
                    time.sleep(rest)
            done = self.finished.is_set()
            self.samples.append((round(k * self.interval, 6), int(self.plugin.progress)))
            if self.runtime is not None and k * self.interval >= self.runtime - 1e-9:
                self.plugin.request_stop()
            if done:
                return
            k += 1


def run_bench(plugin, interval: float, runtime: float | None, start_at: float) -> tuple[list, float]:
    """Runs `plugin.doBench()` from wall-clock time `start_at` under a supervisor; returns
    the time log and the exact seconds doBench took."""
    wait = start_at - time.time()
    if wait > 0:
        time.sleep(wait)
    sup = Supervisor(plugin, interval, runtime if plugin.time_limited else None, time.monotonic())
    sup.start()
    try:
        plugin.doBench()
    finally:
        elapsed = time.monotonic() - sup.t0
        sup.finished.set()
        sup.join()
    return sup.samples, elapsed


class WorkerState:
    """What a worker remembers between the phases of one task."""

    def __init__(self):
        self.plugin = None
        self.cwd = os.getcwd()


def handle(state: WorkerState, msg: dict) -> dict:
    """Serves one command from the master; errors are returned, never raised."""
    cmd = msg["cmd"]
    try:
        if cmd == "discover":
            return {"host": socket.gethostname(), "pid": os.getpid()}
        if cmd == "env":
            return {"env": envprofile.collect(msg["workdir"], msg.get("vmstat_seconds", 15))}
        if cmd == "prepare":
            cls = registry(msg.get("plugin_paths"))[msg["operation"]]
            state.plugin = cls(dict(msg["params"]))
            state.plugin.prepare()
            return {"ok": True, "notes": state.plugin.param_dict.get("notes", [])}
        if cmd == "bench":
            samples, elapsed = run_bench(state.plugin, msg["interval"], msg.get("runtime"), msg["start_at"])
            return {"ok": True, "samples": samples, "elapsed": elapsed}
        if cmd == "cleanup":
            if state.plugin is not None:
                state.plugin.cleanup()
            state.plugin = None
            os.chdir(state.cwd)
            return {"ok": True}
        return {"error": f"unknown command {cmd!r}"}
    except Exception as e:  # noqa: BLE001 -- any plugin error goes back to the master, which reports it
        return {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}


def serve(recv, send) -> None:
    """Worker main loop: commands until `exit`."""
    state = WorkerState()
    while True:
        msg = recv()
        if msg["cmd"] == "exit":
            return
        send(handle(state, msg))
