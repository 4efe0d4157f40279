"""The plugin base class (seed 003 Listing 3.1)."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path


class Benchmark:
    """A benchmark operation. Subclasses implement `prepare`, `doBench` and `cleanup` and
    keep `self.progress` equal to the number of operations completed; the supervisor thread
    reads it every interval. Time-limited plugins set `time_limited = True` and stop when
    `self.stop_requested()` turns true (after `--runtime` seconds).

    `self.param_dict` holds: problemsize, runtime, workdir (this process's own directory),
    shared_dir (common to all processes of the run), procno (0..procs-1 in process order),
    procs, nodes, ppn, hostname, and `partner_dir` where a plugin works on another node's
    files."""

    name: str | None = None
    time_limited = False
    abstract = True

    def __init__(self, param_dict: dict):
        self.param_dict = param_dict
        self.progress = 0
        self._stop = threading.Event()

    # The supervisor calls this when the runtime of a time-limited plugin is over.
    def request_stop(self) -> None:
        self._stop.set()

    def stop_requested(self) -> bool:
        return self._stop.is_set()

    @property
    def workdir(self) -> Path:
        return Path(self.param_dict["workdir"])

    def prepare(self) -> None:
        os.makedirs(self.workdir, exist_ok=True)
        os.chdir(self.workdir)

    def doBench(self) -> None:
        raise NotImplementedError

    def cleanup(self) -> None:
        os.chdir("/")
        shutil.rmtree(self.workdir, ignore_errors=True)
