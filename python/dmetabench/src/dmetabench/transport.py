"""How the master talks to its workers: MPI (mpi4py) across nodes, or local worker
processes connected by pipes. Both carry the same commands (see worker.py)."""

from __future__ import annotations

import multiprocessing as mp


class LocalTransport:
    """`procs` worker processes on this node (the default when not under mpirun)."""

    def __init__(self, procs: int):
        ctx = mp.get_context("spawn")
        self.conns = {}
        self.procs = []
        for rank in range(1, procs + 1):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_local_worker, args=(child,), daemon=True)
            p.start()
            self.conns[rank] = parent
            self.procs.append(p)

    @property
    def workers(self) -> list[int]:
        return sorted(self.conns)

    def send(self, rank: int, msg: dict) -> None:
        self.conns[rank].send(msg)

    def recv(self, rank: int) -> dict:
        return self.conns[rank].recv()

    def close(self) -> None:
        for rank in self.workers:
            try:
                self.send(rank, {"cmd": "exit"})
            except (BrokenPipeError, OSError):
                pass
        for p in self.procs:
            p.join(timeout=10)


def _local_worker(conn) -> None:
    from .worker import serve

    serve(conn.recv, conn.send)


class MPITransport:
    """Rank 0 is the master; every other rank is a worker."""

    def __init__(self, comm):
        self.comm = comm

    @property
    def workers(self) -> list[int]:
        return list(range(1, self.comm.Get_size()))

    def send(self, rank: int, msg: dict) -> None:
        self.comm.send(msg, dest=rank)

    def recv(self, rank: int) -> dict:
        return self.comm.recv(source=rank)

    def close(self) -> None:
        for rank in self.workers:
            self.send(rank, {"cmd": "exit"})


def mpi_world():
    """The MPI communicator when running under mpirun with more than one process, else None."""
    import os

    if not any(k in os.environ for k in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")):
        return None
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    return comm if comm.Get_size() > 1 else None
