"""Plugins that drive plusfs through its client API (the `plusfs` Python module) instead of
system calls: one request per operation, or, in the Batch variants, one request per
`--batch` entries (`openv`/`statv`/`unlinkv`). `--workdir` is then a path inside plusfs and
the cluster map comes from `--plusfs-cluster` or `PLUSFS_CLUSTER`."""

from __future__ import annotations

import os

import plusfs

from .base import Benchmark


def _check(results: list, what: str) -> None:
    bad = [r for r in results if isinstance(r, int) and r < 0]
    if bad:
        raise OSError(-bad[0], f"{what}: {len(bad)} entries failed, first: {os.strerror(-bad[0])}")


class PlusfsBenchmark(Benchmark):
    """Connects in prepare; works in `workdir` inside plusfs; removes it in cleanup."""

    abstract = True

    def prepare(self) -> None:
        cluster = self.param_dict.get("plusfs_cluster") or os.environ.get("PLUSFS_CLUSTER")
        if not cluster:
            raise ValueError("plusfs plugins need --plusfs-cluster FILE or PLUSFS_CLUSTER")
        self.fs = plusfs.connect(cluster)
        self.dir = str(self.param_dict["workdir"])
        self.fs.makedirs(self.dir)
        self.batch = max(1, int(self.param_dict.get("batch") or 1000))
        self.names = [str(i) for i in range(int(self.param_dict["problemsize"]))]

    def _create_all(self) -> None:
        for i in range(0, len(self.names), self.batch):
            chunk = self.names[i : i + self.batch]
            fds = self.fs.openv(self.dir, chunk, create=True, exclusive=True)
            _check(fds, "create")
            self.fs.closev(fds)

    def _remove_tree(self, path: str) -> None:
        names = self.fs.listdir(path)
        files, dirs = [], []
        for n, st in zip(names, self.fs.statv(path, names), strict=True):
            (dirs if not isinstance(st, int) and (st.st_mode & 0o170000) == 0o040000 else files).append(n)
        if files:
            self.fs.unlinkv(path, files)
        for d in dirs:
            self._remove_tree(f"{path}/{d}")
        self.fs.rmdir(path)

    def cleanup(self) -> None:
        try:
            self._remove_tree(self.dir)
        except FileNotFoundError:
            pass


class PlusfsMakeFiles(PlusfsBenchmark):
    """MakeFiles through the API: create + close per file, a subdirectory every
    `problemsize` files, for `--runtime` seconds."""

    abstract = False
    time_limited = True

    def doBench(self) -> None:  # noqa: N802
        done, sub = 0, 0
        while not self.stop_requested():
            d = f"{self.dir}/d{sub}"
            self.fs.mkdir(d)
            for name in self.names:
                if self.stop_requested():
                    break
                self.fs.close(self.fs.open(f"{d}/{name}", create=True, exclusive=True))
                done += 1
                self.progress = done
            sub += 1


class PlusfsStatFiles(PlusfsBenchmark):
    abstract = False

    def prepare(self) -> None:
        super().prepare()
        self._create_all()

    def doBench(self) -> None:  # noqa: N802
        for i, name in enumerate(self.names):
            self.fs.lstat(f"{self.dir}/{name}")
            self.progress = i + 1


class PlusfsStatMultinodeFiles(PlusfsStatFiles):
    """StatMultinodeFiles through the API: each process stats the files a process on another
    node created (its `partner_dir`), so neither the kernel's cache nor the client's
    delegations of the creator help (needs at least two nodes)."""

    needs_nodes = 2

    def doBench(self) -> None:  # noqa: N802
        partner = str(self.param_dict["partner_dir"])
        for i, name in enumerate(self.names):
            self.fs.lstat(f"{partner}/{name}")
            self.progress = i + 1


class PlusfsDeleteFiles(PlusfsStatFiles):
    def doBench(self) -> None:  # noqa: N802
        for i, name in enumerate(self.names):
            self.fs.unlink(f"{self.dir}/{name}")
            self.progress = i + 1


class PlusfsOpenCloseFiles(PlusfsStatFiles):
    def doBench(self) -> None:  # noqa: N802
        for i, name in enumerate(self.names):
            self.fs.close(self.fs.open(f"{self.dir}/{name}"))
            self.progress = i + 1


class PlusfsBatchMakeFiles(PlusfsBenchmark):
    """Creates files `--batch` at a time with `openv` (and `closev`) for `--runtime`
    seconds, a subdirectory every `problemsize` files."""

    abstract = False
    time_limited = True

    def doBench(self) -> None:  # noqa: N802
        done, sub = 0, 0
        while not self.stop_requested():
            d = f"{self.dir}/d{sub}"
            self.fs.mkdir(d)
            for i in range(0, len(self.names), self.batch):
                if self.stop_requested():
                    break
                fds = self.fs.openv(d, self.names[i : i + self.batch], create=True, exclusive=True)
                _check(fds, "openv")
                self.fs.closev(fds)
                done += len(fds)
                self.progress = done
            sub += 1


class PlusfsBatchStatFiles(PlusfsStatFiles):
    def doBench(self) -> None:  # noqa: N802
        for i in range(0, len(self.names), self.batch):
            _check(self.fs.statv(self.dir, self.names[i : i + self.batch]), "statv")
            self.progress = min(len(self.names), i + self.batch)


class PlusfsBatchDeleteFiles(PlusfsStatFiles):
    def doBench(self) -> None:  # noqa: N802
        for i in range(0, len(self.names), self.batch):
            _check(self.fs.unlinkv(self.dir, self.names[i : i + self.batch]), "unlinkv")
            self.progress = min(len(self.names), i + self.batch)


class PlusfsBatchOpenCloseFiles(PlusfsStatFiles):
    def doBench(self) -> None:  # noqa: N802
        for i in range(0, len(self.names), self.batch):
            fds = self.fs.openv(self.dir, self.names[i : i + self.batch])
            _check(fds, "openv")
            _check(self.fs.closev(fds), "closev")
            self.progress = min(len(self.names), i + self.batch)


class PlusfsFileData(PlusfsBenchmark):
    """Files of `--filesize` bytes (default 4096), `problemsize` of them."""

    abstract = True

    def prepare(self) -> None:
        super().prepare()
        self.size = int(self.param_dict.get("filesize") or 4096)
        self.data = bytes((i * 7) % 251 for i in range(self.size))
        self.paths = [f"{self.dir}/{n}" for n in self.names]


class PlusfsWriteFiles(PlusfsFileData):
    """WriteFiles through the API, one file at a time (create + write)."""

    abstract = False

    def doBench(self) -> None:  # noqa: N802
        for i, p in enumerate(self.paths):
            self.fs.write(p, self.data)
            self.progress = i + 1


class PlusfsBatchWriteFiles(PlusfsFileData):
    """WriteFiles with BFO: `--batch` whole files per `batch_write` (seed 002 §3.3)."""

    abstract = False

    def doBench(self) -> None:  # noqa: N802
        for i in range(0, len(self.paths), self.batch):
            chunk = self.paths[i : i + self.batch]
            _check(self.fs.batch_write([(p, self.data) for p in chunk]), "batch_write")
            self.progress = i + len(chunk)


class PlusfsReadFiles(PlusfsFileData):
    """ReadFiles through the API, one whole file at a time; the files are written (in
    batches) by prepare."""

    abstract = False

    def prepare(self) -> None:
        super().prepare()
        for i in range(0, len(self.paths), self.batch):
            _check(self.fs.batch_write([(p, self.data) for p in self.paths[i : i + self.batch]]), "prepare")

    def doBench(self) -> None:  # noqa: N802
        for i, p in enumerate(self.paths):
            if len(self.fs.read(p)) != self.size:
                raise OSError(5, f"{p}: short read")
            self.progress = i + 1


class PlusfsBatchReadFiles(PlusfsReadFiles):
    """ReadFiles with BFO: `--batch` whole files per `batch_read` (seed 002 §3.2)."""

    def doBench(self) -> None:  # noqa: N802
        for i in range(0, len(self.paths), self.batch):
            chunk = self.paths[i : i + self.batch]
            got = self.fs.batch_read(chunk)
            _check(got, "batch_read")
            if any(len(g) != self.size for g in got):
                raise OSError(5, "short batch read")
            self.progress = i + len(chunk)
