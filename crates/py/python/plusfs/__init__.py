"""plusfs: Python client of the plusfs parallel file system.

    import plusfs
    fs = plusfs.connect("cluster.toml")
    fs.makedirs("/data/run1")
    fds = fs.openv("/data/run1", names, create=True)     # one request per server
    stats = fs.statv("/data/run1", names)

Errors raise OSError with the errno and the path. Batch calls return one result per name:
a descriptor / Stat / 0 on success, a negated errno on failure (-ECANCELED: not performed
because an earlier entry failed under stop_on_failure=True).
"""

from ._plusfs import Client, Stat, connect

__all__ = ["Client", "Stat", "connect"]
__version__ = "0.1.0"
