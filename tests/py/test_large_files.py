"""Checksummed files of 0 B to past 4 GiB, written through one interface at random offsets
in random sizes and read back through every other: the Python module, the C library
(libplusfs through ctypes) and a FUSE mount, on a real local cluster of 3 servers.

The file past 4 GiB is sparse (written regions around the 4 GiB boundary and at its end,
holes that must read as zeros), so the test checks 64-bit offsets without moving 4 GiB.
Needs the `plusfs` binary ($PLUSFS_BIN), libplusfs.so ($PLUSFS_LIB) and, for the mount,
root and /dev/fuse: without them the mount cases fail unless PLUSFS_ALLOW_SKIP=1.
"""

import ctypes
import hashlib
import os
import random
import subprocess
import time
from pathlib import Path

import plusfs  # built by `make pymodule` (maturin)
import pytest

MIB = 1 << 20
GIB = 1 << 30
# Sizes around the boundaries that matter: empty, one byte, a page, the direct-I/O
# threshold (1 MiB), several records and chunks.
DENSE_SIZES = [0, 1, 4095, 4097, MIB - 1, MIB + 1, 9 * MIB + 7]
SPARSE_SIZE = 4 * GIB + 8 * MIB + 17


def target_dir() -> Path:
    return Path(os.environ.get("CARGO_TARGET_DIR", str(Path.home() / ".cache/plusfs/target"))) / "debug"


def plusfs_bin() -> str:
    return os.environ.get("PLUSFS_BIN") or str(target_dir() / "plusfs")


def skip_or_fail(reason: str):
    if os.environ.get("PLUSFS_ALLOW_SKIP") == "1":
        pytest.skip(reason)
    pytest.fail(f"{reason} (set PLUSFS_ALLOW_SKIP=1 to skip instead)")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    data = tmp_path_factory.mktemp("cluster")
    exe = plusfs_bin()
    assert Path(exe).exists(), f"plusfs binary not found at {exe} (set PLUSFS_BIN)"
    up = [exe, "cluster", "up", "--servers", "3", "--data", str(data), "--detach"]
    subprocess.run(up, check=True, capture_output=True)
    yield str(data / "cluster.toml")
    subprocess.run([exe, "cluster", "down", "--data", str(data)], check=False, capture_output=True)


@pytest.fixture(scope="module")
def mount(cluster, tmp_path_factory):
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        skip_or_fail("the mount needs root and /dev/fuse")
    mnt = tmp_path_factory.mktemp("mnt")
    env = dict(os.environ, PLUSFS_CLUSTER=cluster)
    subprocess.run([plusfs_bin(), "mount", str(mnt)], check=True, capture_output=True, env=env)
    deadline = time.monotonic() + 20
    while not os.path.ismount(mnt):
        assert time.monotonic() < deadline, "the mount did not appear"
        time.sleep(0.05)
    yield mnt
    subprocess.run(["fusermount3", "-u", str(mnt)], check=False, capture_output=True)


class Python:
    """The `plusfs` Python module."""

    def __init__(self, cluster, _mnt):
        self.fs = plusfs.connect(cluster)

    def create(self, path):
        self.fs.write(path, b"", 0)

    def pwrite(self, path, offset, data):
        self.fs.write(path, data, offset)

    def pread(self, path, offset, length):
        return self.fs.read(path, offset, length)

    def size(self, path):
        return self.fs.stat(path).st_size

    def truncate(self, path, size):
        self.fs.truncate(path, size)


class C:
    """libplusfs, the C library, through ctypes: plusfs_open/pwrite/pread/ftruncate."""

    def __init__(self, cluster, _mnt):
        lib = os.environ.get("PLUSFS_LIB") or str(target_dir() / "libplusfs.so")
        assert Path(lib).exists(), f"libplusfs not found at {lib} (set PLUSFS_LIB)"
        self.lib = ctypes.CDLL(lib)
        self.lib.plusfs_connect.restype = ctypes.c_void_p
        self.lib.plusfs_connect.argtypes = [ctypes.c_char_p]
        self.lib.plusfs_open.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint]
        self.lib.plusfs_close.argtypes = [ctypes.c_void_p, ctypes.c_int]
        for f in (self.lib.plusfs_pread, self.lib.plusfs_pwrite):
            f.restype = ctypes.c_ssize_t
            f.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64]
        self.lib.plusfs_ftruncate.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64]
        self.fs = self.lib.plusfs_connect(cluster.encode())
        assert self.fs, "plusfs_connect failed"

    def _open(self, path, flags=os.O_RDWR):
        fd = self.lib.plusfs_open(self.fs, path.encode(), flags, 0o644)
        assert fd >= 0, f"plusfs_open({path}): errno {-fd}"
        return fd

    def create(self, path):
        self.lib.plusfs_close(self.fs, self._open(path, os.O_RDWR | os.O_CREAT))

    def pwrite(self, path, offset, data):
        fd = self._open(path)
        try:
            n = self.lib.plusfs_pwrite(self.fs, fd, data, len(data), offset)
            assert n == len(data), f"plusfs_pwrite({path}, {offset}, {len(data)}) = {n}"
        finally:
            self.lib.plusfs_close(self.fs, fd)

    def pread(self, path, offset, length):
        fd = self._open(path, os.O_RDONLY)
        try:
            buf = ctypes.create_string_buffer(length)
            n = self.lib.plusfs_pread(self.fs, fd, buf, length, offset)
            assert n >= 0, f"plusfs_pread({path}, {offset}, {length}): errno {-n}"
            return buf.raw[:n]
        finally:
            self.lib.plusfs_close(self.fs, fd)

    def size(self, path):
        """The size as reads see it: the first offset where a 1-byte read returns nothing."""
        lo, hi = 0, 1
        while self.pread(path, hi - 1, 1):
            lo, hi = hi, hi * 2
        while lo < hi:  # reads at offsets < lo return a byte; at hi - 1 none
            mid = (lo + hi) // 2
            lo, hi = (mid + 1, hi) if self.pread(path, mid, 1) else (lo, mid)
        return lo

    def truncate(self, path, size):
        fd = self._open(path)
        try:
            assert self.lib.plusfs_ftruncate(self.fs, fd, size) == 0
        finally:
            self.lib.plusfs_close(self.fs, fd)


class Mount:
    """A FUSE mount: os.pwrite/os.pread on the kernel's files."""

    def __init__(self, _cluster, mnt):
        self.mnt = mnt

    def _p(self, path):
        return os.path.join(self.mnt, path.lstrip("/"))

    def create(self, path):
        os.close(os.open(self._p(path), os.O_RDWR | os.O_CREAT, 0o644))

    def pwrite(self, path, offset, data):
        fd = os.open(self._p(path), os.O_WRONLY)
        try:
            view = memoryview(data)
            while view:
                n = os.pwrite(fd, view, offset)
                view, offset = view[n:], offset + n
        finally:
            os.close(fd)

    def pread(self, path, offset, length):
        fd = os.open(self._p(path), os.O_RDONLY)
        try:
            out = bytearray()
            while len(out) < length:
                got = os.pread(fd, length - len(out), offset + len(out))
                if not got:
                    break
                out += got
            return bytes(out)
        finally:
            os.close(fd)

    def size(self, path):
        return os.stat(self._p(path)).st_size

    def truncate(self, path, size):
        os.truncate(self._p(path), size)


IFACES = {"python": Python, "c": C, "mount": Mount}


class Model:
    """What a file must hold: written regions over zeros, up to `size`."""

    def __init__(self):
        self.regions = []  # (offset, bytes), later ones win
        self.size = 0

    def write(self, offset, data):
        self.regions.append((offset, data))
        self.size = max(self.size, offset + len(data))

    def truncate(self, size):
        self.regions = [(o, d[: max(0, size - o)]) for o, d in self.regions if o < size]
        self.size = size

    def read(self, offset, length):
        end = min(self.size, offset + length)
        if offset >= end:
            return b""
        out = bytearray(end - offset)
        for o, d in self.regions:
            lo, hi = max(o, offset), min(o + len(d), end)
            if lo < hi:
                out[lo - offset : hi - offset] = d[lo - o : hi - o]
        return bytes(out)


def write_dense(iface, path, size, rng):
    """The whole file in random-sized pieces in random order, then a few overwrites and a
    truncation that cuts into the last piece."""
    model = Model()
    iface.create(path)
    cuts, at = [], 0
    while at < size:
        n = min(size - at, rng.choice([1, 7, 4096, 65_536, 300_001, MIB, 3 * MIB + 5]))
        cuts.append((at, n))
        at += n
    rng.shuffle(cuts)
    for off, n in cuts:
        data = rng.randbytes(n)
        iface.pwrite(path, off, data)
        model.write(off, data)
    for _ in range(3 if size else 0):
        off = rng.randrange(size)
        data = rng.randbytes(rng.randrange(1, min(size - off, 2 * MIB) + 1))
        iface.pwrite(path, off, data)
        model.write(off, data)
    if size > 2:
        cut = size - rng.randrange(1, min(size, 5000))
        iface.truncate(path, cut)
        model.truncate(cut)
        data = rng.randbytes(size - cut)
        iface.pwrite(path, cut, data)
        model.write(cut, data)
    return model


def write_sparse(iface, path, rng):
    """Regions of a file past 4 GiB: at 0, across 2 GiB, across 4 GiB and at the end."""
    model = Model()
    iface.create(path)
    for off in [0, 2 * GIB - 777, 4 * GIB - 3 * MIB // 2, SPARSE_SIZE - 4099]:
        data = rng.randbytes(min(3 * MIB + 11, SPARSE_SIZE - off))
        iface.pwrite(path, off, data)
        model.write(off, data)
    return model


def check(iface, path, model, rng, whole):
    """Size, the whole contents' digest (dense files) or every region and hole samples
    (the sparse one), and reads at random offsets in random sizes."""
    assert iface.size(path) == model.size, f"{path}: size"
    if whole:
        got = iface.pread(path, 0, model.size + 100)
        want = model.read(0, model.size)
        assert hashlib.sha256(got).hexdigest() == hashlib.sha256(want).hexdigest(), f"{path}: whole contents"
    else:
        for off, data in model.regions:
            want = model.read(off, len(data))
            assert iface.pread(path, off, len(data)) == want, f"{path}: region at {off}"
        for off in [5 * MIB, 3 * GIB, 4 * GIB + 4 * MIB]:
            assert iface.pread(path, off, 70_000) == bytes(70_000), f"{path}: hole at {off}"
    for _ in range(8 if model.size else 1):
        off = rng.randrange(model.size + 10)
        n = rng.randrange(0, 2 * MIB)
        assert iface.pread(path, off, n) == model.read(off, n), f"{path}: {n} bytes at {off}"


@pytest.mark.parametrize("writer", list(IFACES))
def test_files_written_through_one_interface_read_through_every_one(cluster, request, writer):
    ifaces = {}
    for name, cls in IFACES.items():
        mnt = request.getfixturevalue("mount") if name == "mount" else None
        ifaces[name] = cls(cluster, mnt)
    w = ifaces[writer]
    rng = random.Random(f"large-{writer}")
    base = f"/large-{writer}"
    ifaces["python"].fs.makedirs(base)
    files = [(f"{base}/dense-{size}", write_dense(w, f"{base}/dense-{size}", size, rng), True) for size in DENSE_SIZES]
    files.append((f"{base}/sparse", write_sparse(w, f"{base}/sparse", rng), False))
    if writer == "mount":
        # Written back at close; the other interfaces see it from then on.
        subprocess.run(["sync"], check=True)
    for name, r in ifaces.items():
        for path, model, whole in files:
            try:
                check(r, path, model, rng, whole)
            except AssertionError as e:
                raise AssertionError(f"written through {writer}, read through {name}: {e}") from e
