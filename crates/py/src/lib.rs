//! The Python module `plusfs` (imported as `plusfs._plusfs` behind `plusfs/__init__.py`).
//!
//! Each `Client` calls the cluster through a [`BlockingClient`] (a runtime of two threads
//! and the connections on it); every call releases the GIL while it waits for the cluster.
//! A `Client` used in a process forked from the one that connected it (`multiprocessing`
//! with the fork start method) transparently gets a fresh runtime and fresh connections
//! there on its first call, and keeps its descriptors. Failures raise
//! `OSError(errno, strerror, path)`.

use plusfs_client::{Acl, AclKind, BlockingClient, Client as Core, ClientOptions, FsError, OpenFlags};
use plusfs_placement::ClusterMap;
use plusfs_proto::{Attr, Errno, Semantics};
use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;

fn os_error(e: FsError) -> PyErr {
    PyOSError::new_err((e.errno.raw(), e.errno.description(), e.path))
}

fn semantics(stop_on_failure: bool) -> Semantics {
    if stop_on_failure {
        Semantics::StopOnFailure
    } else {
        Semantics::PerformAll
    }
}

/// Attributes of a file, with the field names of `os.stat_result`.
#[pyclass(frozen, get_all, module = "plusfs")]
#[derive(Clone)]
pub struct Stat {
    st_ino: u64,
    st_mode: u32,
    st_nlink: u32,
    st_uid: u32,
    st_gid: u32,
    st_size: u64,
    st_atime: f64,
    st_mtime: f64,
    st_ctime: f64,
}

impl From<&Attr> for Stat {
    fn from(a: &Attr) -> Stat {
        let kind = a.kind.mode_bits();
        let t = |ts: plusfs_proto::Timespec| ts.sec as f64 + ts.nsec as f64 / 1e9;
        Stat {
            st_ino: a.ino,
            st_mode: kind | a.mode,
            st_nlink: a.nlink,
            st_uid: a.uid,
            st_gid: a.gid,
            st_size: a.size,
            st_atime: t(a.atime),
            st_mtime: t(a.mtime),
            st_ctime: t(a.ctime),
        }
    }
}

#[pymethods]
impl Stat {
    fn __repr__(&self) -> String {
        format!("plusfs.Stat(st_ino={}, st_mode=0o{:o}, st_size={})", self.st_ino, self.st_mode, self.st_size)
    }
}

/// A connection to one plusfs cluster.
#[pyclass(frozen, module = "plusfs")]
pub struct Client {
    bridge: BlockingClient,
}

impl Client {
    /// Runs the future `call` makes of the client, without the GIL.
    fn run<'a, T, F>(&'a self, py: Python<'_>, call: impl FnOnce(&'a Core) -> F + Send) -> PyResult<T>
    where
        T: Send,
        F: std::future::Future<Output = Result<T, FsError>>,
    {
        py.detach(|| self.bridge.run(call)).map_err(os_error)
    }
}

fn code<T>(r: Result<T, Errno>, ok: impl FnOnce(T) -> i64) -> i64 {
    match r {
        Ok(v) => ok(v),
        Err(e) => -(e.raw() as i64),
    }
}

#[pymethods]
impl Client {
    /// `mkdir`; `threshold` (entries, 0 = distributed from creation, "never", or None for
    /// the cluster's) and `width` (storing servers, 0 = the cluster's) set its huge-directory
    /// policy.
    #[pyo3(signature = (path, mode = 0o755, threshold = None, width = 0))]
    fn mkdir(&self, py: Python<'_>, path: &str, mode: u32, threshold: Option<&str>, width: u32) -> PyResult<()> {
        let t = parse_threshold(threshold)?.unwrap_or(plusfs_proto::Threshold::Cluster);
        self.run(py, |c| c.mkdir_with(path, mode, t, width)).map(drop)
    }

    /// Writes `data` at `offset` of the file at `path` (created if missing); returns its
    /// new size.
    #[pyo3(signature = (path, data, offset = 0))]
    fn write(&self, py: Python<'_>, path: &str, data: Vec<u8>, offset: u64) -> PyResult<u64> {
        let a = self.run(py, |c| async move {
            c.create(path, 0o644, false).await?;
            c.write(path, offset, &data).await
        })?;
        Ok(a.size)
    }

    /// BFOw (seed 002 §3.3): creates or replaces many whole files at once; `files` is a
    /// list of `(path, bytes)`. Returns 0 or a negated errno per file.
    #[pyo3(signature = (files, mode = 0o644))]
    fn batch_write(&self, py: Python<'_>, files: Vec<(String, Vec<u8>)>, mode: u32) -> PyResult<Vec<i64>> {
        let new: Vec<plusfs_client::NewFile> = files
            .into_iter()
            .map(|(path, data)| plusfs_client::NewFile { mode, ..plusfs_client::NewFile::new(path, data) })
            .collect();
        let out = self.run(py, |c| async move { Ok::<_, FsError>(c.batch_write(new).await) })?;
        Ok(out.into_iter().map(|r| code(r.map_err(|e| e.errno), |_| 0)).collect())
    }

    /// BFOr (seed 002 §3.2): the whole contents of many files; `bytes` or a negated errno
    /// per path. `buffer` bounds the bytes asked of the servers at once.
    #[pyo3(signature = (paths, buffer = 64 << 20))]
    fn batch_read(&self, py: Python<'_>, paths: Vec<String>, buffer: u64) -> PyResult<Vec<Py<PyAny>>> {
        let out = self.run(py, |c| async move { Ok::<_, FsError>(c.batch_read(&paths, buffer).await) })?;
        out.into_iter()
            .map(|r| match r {
                Ok((_, data)) => Ok(pyo3::types::PyBytes::new(py, &data).into_any().unbind()),
                Err(e) => Ok((-(e.errno.raw() as i64)).into_pyobject(py)?.into_any().unbind()),
            })
            .collect()
    }

    /// Reads up to `length` bytes at `offset` (the whole file when `length` is None).
    #[pyo3(signature = (path, offset = 0, length = None))]
    fn read(&self, py: Python<'_>, path: &str, offset: u64, length: Option<usize>) -> PyResult<Vec<u8>> {
        match length {
            Some(n) => self.run(py, |c| c.read(path, offset, n)),
            None => {
                let all = self.run(py, |c| c.read_all(path))?;
                Ok(all.get(offset as usize..).map(<[u8]>::to_vec).unwrap_or_default())
            }
        }
    }

    /// `truncate(2)`.
    fn truncate(&self, py: Python<'_>, path: &str, size: u64) -> PyResult<()> {
        self.run(py, |c| c.truncate(path, size)).map(drop)
    }

    /// Changes a directory's huge-directory policy; returns its distribution as a dict
    /// (`state`, `threshold`, `set`, `entries` per server).
    #[pyo3(signature = (path, threshold = None, width = None))]
    fn set_hugedir(
        &self,
        py: Python<'_>,
        path: &str,
        threshold: Option<&str>,
        width: Option<u32>,
    ) -> PyResult<std::collections::HashMap<String, Py<PyAny>>> {
        let t = parse_threshold(threshold)?;
        let d = self.run(py, |c| c.set_policy(path, t, width))?;
        Ok(dist_dict(py, &d))
    }

    /// A directory's distribution as a dict (`state`, `threshold`, `set`, `entries`).
    fn hugedir(&self, py: Python<'_>, path: &str) -> PyResult<std::collections::HashMap<String, Py<PyAny>>> {
        let d = self.run(py, |c| c.distribution(path))?;
        Ok(dist_dict(py, &d))
    }

    /// `mkdir -p`.
    #[pyo3(signature = (path, mode = 0o755))]
    fn makedirs(&self, py: Python<'_>, path: &str, mode: u32) -> PyResult<()> {
        self.run(py, |c| c.mkdir_all(path, mode)).map(drop)
    }

    fn rmdir(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        self.run(py, |c| c.rmdir(path))
    }

    fn unlink(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        self.run(py, |c| c.unlink(path))
    }

    fn rename(&self, py: Python<'_>, src: &str, dst: &str) -> PyResult<()> {
        self.run(py, |c| c.rename(src, dst))
    }

    /// `os.link`: a new name `dst` for the file `src`.
    fn link(&self, py: Python<'_>, src: &str, dst: &str) -> PyResult<()> {
        self.run(py, |c| c.link(src, dst)).map(drop)
    }

    fn stat(&self, py: Python<'_>, path: &str) -> PyResult<Stat> {
        self.run(py, |c| c.stat(path)).map(|a| Stat::from(&a))
    }

    fn lstat(&self, py: Python<'_>, path: &str) -> PyResult<Stat> {
        self.run(py, |c| c.lstat(path)).map(|a| Stat::from(&a))
    }

    /// The access ACL of `path` in short text form (`user::rw-,user:1001:r-x,...`;
    /// its mode bits as an ACL when it has none), or with `default=True` the directory's
    /// default ACL (`None` when it has none).
    #[pyo3(signature = (path, default = false))]
    fn getfacl(&self, py: Python<'_>, path: &str, default: bool) -> PyResult<Option<String>> {
        let kind = if default { AclKind::Default } else { AclKind::Access };
        Ok(self.run(py, |c| c.shown_acl(path, kind))?.map(|a| a.to_text()))
    }

    /// Sets the access ACL of `path` (or with `default=True` its default ACL) from text
    /// in the form `getfacl` gives; `None` removes it.
    #[pyo3(signature = (path, acl, default = false))]
    fn setfacl(&self, py: Python<'_>, path: &str, acl: Option<&str>, default: bool) -> PyResult<()> {
        let kind = if default { AclKind::Default } else { AclKind::Access };
        let acl = match acl {
            Some(t) => Some(Acl::from_text(t).map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?),
            None => None,
        };
        self.run(py, |c| c.set_acl(path, kind, acl.as_ref()))
    }

    fn listdir(&self, py: Python<'_>, path: &str) -> PyResult<Vec<String>> {
        self.run(py, |c| c.readdir(path)).map(|v| v.into_iter().map(|e| e.name).collect())
    }

    /// Opens (or creates) a file; returns a descriptor of this client.
    #[pyo3(signature = (path, create = false, exclusive = false, mode = 0o644))]
    fn open(&self, py: Python<'_>, path: &str, create: bool, exclusive: bool, mode: u32) -> PyResult<i32> {
        self.run(py, |c| c.open_fd(path, OpenFlags { create, exclusive, ..Default::default() }, mode))
    }

    fn close(&self, py: Python<'_>, fd: i32) -> PyResult<()> {
        self.run(py, |c| c.close_fd(fd))
    }

    /// `openv`: descriptors or negated errnos, one per name.
    #[pyo3(signature = (dir, names, create = false, exclusive = false, mode = 0o644, stop_on_failure = false))]
    #[allow(clippy::too_many_arguments)]
    fn openv(
        &self,
        py: Python<'_>,
        dir: &str,
        names: Vec<String>,
        create: bool,
        exclusive: bool,
        mode: u32,
        stop_on_failure: bool,
    ) -> PyResult<Vec<i64>> {
        let flags = OpenFlags { create, exclusive, ..Default::default() };
        let out = self.run(py, |c| c.openv(dir, &names, flags, mode, semantics(stop_on_failure)))?;
        Ok(out.into_iter().map(|r| code(r, |fd| fd as i64)).collect())
    }

    /// `closev`: 0 or a negated errno (-EBADF for unknown descriptors) per descriptor.
    #[pyo3(signature = (fds, stop_on_failure = false))]
    fn closev(&self, py: Python<'_>, fds: Vec<i32>, stop_on_failure: bool) -> Vec<i64> {
        let out = py.detach(|| self.bridge.run(|c| c.closev(&fds, semantics(stop_on_failure))));
        out.into_iter().map(|r| code(r, |_| 0)).collect()
    }

    /// `statv`: a Stat or a negated errno per name.
    #[pyo3(signature = (dir, names, stop_on_failure = false))]
    fn statv(&self, py: Python<'_>, dir: &str, names: Vec<String>, stop_on_failure: bool) -> PyResult<Vec<Py<PyAny>>> {
        let out = self.run(py, |c| c.statv(dir, &names, semantics(stop_on_failure)))?;
        out.into_iter()
            .map(|r| match r {
                Ok(a) => Ok(Py::new(py, Stat::from(&a))?.into_any()),
                Err(e) => Ok((-(e.raw() as i64)).into_pyobject(py)?.into_any().unbind()),
            })
            .collect()
    }

    /// `unlinkv`: 0 or a negated errno per name.
    #[pyo3(signature = (dir, names, stop_on_failure = false))]
    fn unlinkv(&self, py: Python<'_>, dir: &str, names: Vec<String>, stop_on_failure: bool) -> PyResult<Vec<i64>> {
        let out = self.run(py, |c| c.unlinkv(dir, &names, semantics(stop_on_failure)))?;
        Ok(out.into_iter().map(|r| code(r, |_| 0)).collect())
    }

    /// `mkdirv`: 0 or a negated errno per name.
    #[pyo3(signature = (dir, names, mode = 0o755, stop_on_failure = false))]
    fn mkdirv(
        &self,
        py: Python<'_>,
        dir: &str,
        names: Vec<String>,
        mode: u32,
        stop_on_failure: bool,
    ) -> PyResult<Vec<i64>> {
        let out = self.run(py, |c| c.mkdirv(dir, &names, mode, semantics(stop_on_failure)))?;
        Ok(out.into_iter().map(|r| code(r, |_| 0)).collect())
    }
}

/// Connects to the cluster described by a cluster map file.
#[pyfunction]
fn connect(cluster_file: &str) -> PyResult<Client> {
    let map = ClusterMap::load(std::path::Path::new(cluster_file))
        .map_err(|e| PyOSError::new_err((libc_enoent(), e.to_string(), cluster_file.to_string())))?;
    let bridge = BlockingClient::with_workers(map, ClientOptions::default(), 2)
        .map_err(|e| PyOSError::new_err((e.raw_os_error().unwrap_or(Errno::EIO.raw()), e.to_string())))?;
    Ok(Client { bridge })
}

fn libc_enoent() -> i32 {
    Errno::ENOENT.raw()
}

#[pymodule]
fn _plusfs(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Client>()?;
    m.add_class::<Stat>()?;
    m.add_function(wrap_pyfunction!(connect, m)?)?;
    Ok(())
}

fn parse_threshold(t: Option<&str>) -> PyResult<Option<plusfs_proto::Threshold>> {
    t.map(plusfs_proto::Threshold::parse)
        .transpose()
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))
}

fn dist_dict(py: Python<'_>, d: &plusfs_proto::DistReport) -> std::collections::HashMap<String, Py<PyAny>> {
    let mut m = std::collections::HashMap::new();
    m.insert("path".to_string(), d.path.clone().into_pyobject(py).expect("str").into_any().unbind());
    m.insert("state".to_string(), d.state.to_string().into_pyobject(py).expect("str").into_any().unbind());
    m.insert("threshold".to_string(), d.effective.to_string().into_pyobject(py).expect("str").into_any().unbind());
    m.insert("set".to_string(), d.set.clone().into_pyobject(py).expect("list").into_any().unbind());
    let entries: std::collections::HashMap<u32, u64> = d.entries.iter().copied().collect();
    m.insert("entries".to_string(), entries.into_pyobject(py).expect("dict").into_any().unbind());
    m
}
