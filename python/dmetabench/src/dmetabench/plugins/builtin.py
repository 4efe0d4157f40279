"""The pre-defined benchmarks of seed 003 Table 3.5. Every operation is one system call
through `os` (`os.open`/`os.close`, `os.stat`, `os.unlink`, `os.mkdir`), so no hidden calls
are measured (seed 003 §4.2.1)."""

from __future__ import annotations

import os
import sys

from .base import Benchmark

CREATE = os.O_CREAT | os.O_EXCL | os.O_WRONLY


def _make_files(count: int) -> None:
    for i in range(count):
        os.close(os.open(str(i), CREATE, 0o644))


def _remove_files(count: int) -> None:
    for i in range(count):
        try:
            os.unlink(str(i))
        except FileNotFoundError:
            pass


class MakeFiles(Benchmark):
    """Creates empty files for `--runtime` seconds; a new subdirectory every
    `problemsize` files keeps directories from growing without bound."""

    abstract = False
    time_limited = True
    payload = b""

    def doBench(self) -> None:
        per_dir = max(1, int(self.param_dict["problemsize"]))
        done = 0
        sub = 0
        while not self.stop_requested():
            d = f"d{sub}"
            os.mkdir(d)
            for i in range(per_dir):
                if self.stop_requested():
                    break
                fd = os.open(f"{d}/{i}", CREATE, 0o644)
                if self.payload:
                    os.write(fd, self.payload)
                os.close(fd)
                done += 1
                self.progress = done
            sub += 1


class MakeFiles64byte(MakeFiles):
    """MakeFiles writing 64 bytes into every file."""

    payload = b"x" * 64


class MakeFiles65byte(MakeFiles):
    """MakeFiles writing 65 bytes into every file."""

    payload = b"x" * 65


class MakeDirs(Benchmark):
    """Creates directories for `--runtime` seconds, `problemsize` per parent."""

    abstract = False
    time_limited = True

    def doBench(self) -> None:
        per_dir = max(1, int(self.param_dict["problemsize"]))
        done = 0
        sub = 0
        while not self.stop_requested():
            parent = f"d{sub}"
            os.mkdir(parent)
            for i in range(per_dir):
                if self.stop_requested():
                    break
                os.mkdir(f"{parent}/{i}")
                done += 1
                self.progress = done
            sub += 1


class MakeOnedirFiles(Benchmark):
    """All processes create files in one common directory; `problemsize` is the total,
    every process creates its share."""

    abstract = False

    def prepare(self) -> None:
        os.makedirs(self.param_dict["shared_dir"], exist_ok=True)
        os.chdir(self.param_dict["shared_dir"])

    def doBench(self) -> None:
        procs, me = self.param_dict["procs"], self.param_dict["procno"]
        share = int(self.param_dict["problemsize"]) // procs
        for i in range(share):
            os.close(os.open(f"p{me}.{i}", CREATE, 0o644))
            self.progress = i + 1

    def cleanup(self) -> None:
        procs, me = self.param_dict["procs"], self.param_dict["procno"]
        for i in range(int(self.param_dict["problemsize"]) // procs):
            try:
                os.unlink(f"p{me}.{i}")
            except FileNotFoundError:
                pass
        os.chdir("/")


class _WithFiles(Benchmark):
    """Creates `problemsize` files in prepare and removes them in cleanup."""

    def prepare(self) -> None:
        super().prepare()
        _make_files(int(self.param_dict["problemsize"]))

    def cleanup(self) -> None:
        _remove_files(int(self.param_dict["problemsize"]))
        super().cleanup()


class DeleteFiles(_WithFiles):
    """Removes `problemsize` files with `unlink()`."""

    abstract = False

    def doBench(self) -> None:
        for i in range(int(self.param_dict["problemsize"])):
            os.unlink(str(i))
            self.progress = i + 1


class StatFiles(_WithFiles):
    """`stat()` of `problemsize` files (Listing 3.1)."""

    abstract = False

    def doBench(self) -> None:
        for i in range(int(self.param_dict["problemsize"])):
            os.stat(str(i))
            self.progress = i + 1


def drop_caches() -> str:
    """Drops the page, dentry and inode caches (root only); says what happened."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "caches dropped"
    except OSError as e:
        return f"caches NOT dropped ({e.strerror}; needs root)"


class StatNocacheFiles(StatFiles):
    """StatFiles after dropping the operating system's caches (seed 003 §3.4.3)."""

    def prepare(self) -> None:
        super().prepare()
        msg = drop_caches()
        self.param_dict.setdefault("notes", []).append(msg)
        if "NOT" in msg:
            print(f"dmetabench: StatNocacheFiles: {msg}", file=sys.stderr)


class StatMultinodeFiles(_WithFiles):
    """Each process stats the files another process created on another node, so no
    client-side cache of the creator helps (needs at least two nodes)."""

    abstract = False
    needs_nodes = 2

    def doBench(self) -> None:
        partner = self.param_dict["partner_dir"]
        for i in range(int(self.param_dict["problemsize"])):
            os.stat(os.path.join(partner, str(i)))
            self.progress = i + 1


class OpenCloseFiles(_WithFiles):
    """An `open()`/`close()` pair on each of `problemsize` files."""

    abstract = False

    def doBench(self) -> None:
        for i in range(int(self.param_dict["problemsize"])):
            os.close(os.open(str(i), os.O_RDONLY))
            self.progress = i + 1
