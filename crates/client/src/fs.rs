//! POSIX-like calls over the cluster.

use crate::error::FsError;
use crate::types::{ClientOptions, FileHandle};
use plusfs_placement::ClusterMap;
use plusfs_proto::path::{self, PathError};
use plusfs_proto::{
    Attr, Cred, DirEntry, Dirents, DistReport, Errno, FileKind, FsckData, Reply, Request, ServerId, ServerStatus,
    SetAttr, Statfs, Threshold, TimeSet, WireError,
};
use plusfs_rpc::{CountersSnapshot, Pool};
use std::sync::Arc;

/// The async client. Cheap to clone; clones share connections and counters.
#[derive(Clone)]
pub struct Client {
    /// The cluster map, shared by the client's clones and replaced by a newer epoch.
    map: crate::epochs::SharedMap,
    pub(crate) pool: Arc<Pool>,
    pub(crate) opts: ClientOptions,
    pub(crate) fds: Arc<crate::fds::FdTable>,
    pub(crate) dist: Arc<crate::routing::DistCache>,
    pub(crate) cx: Arc<crate::opids::CxIds>,
    /// Working directory relative paths resolve against (normalised).
    cwd: Arc<str>,
    /// Who calls: every request carries it, servers check permissions against it.
    pub(crate) caller: Cred,
    /// Directory delegations, when asked for (`deleg`).
    pub(crate) delegs: Option<Arc<crate::deleg::Delegations>>,
    /// Paths seen to be directories (`lstat` asks their home at once).
    dir_hints: Arc<crate::dirhints::DirHints>,
    /// Whether this client may drive Cx itself (see [`ClientOptions::direct_io`]).
    pub(crate) trusted: bool,
    /// The bounded (user or node) identity this process presents, if any: callers are
    /// admitted by it here as the servers will admit them, so what a delegation answers
    /// locally is what the servers would answer.
    bounds: Option<Arc<plusfs_tls::Identity>>,
    /// Bytes moved by client-direct I/O and capabilities received.
    pub(crate) direct: Arc<crate::types::DirectStats>,
}

fn path_err(op: &'static str, raw: &str, e: PathError) -> FsError {
    FsError::new(op, raw, e.errno).with_detail(e.reason)
}

/// Whether this process presents an identity that may name data records itself (direct
/// I/O): any on an insecure cluster, an admin or server one on a cluster with TLS; and the
/// identity when it is a bounded one (user, node).
fn trusted_identity(map: &ClusterMap) -> (bool, Option<plusfs_tls::Identity>) {
    if map.tls.is_insecure() {
        return (true, None);
    }
    let Some(dir) = plusfs_rpc::identity_dir(&map.tls) else { return (false, None) };
    match plusfs_tls::serial_of_file(&dir.join("cert.pem")) {
        Ok((id, _)) if id.is_admin() => (true, None),
        Ok((id, _)) => (false, Some(id)),
        Err(_) => (false, None),
    }
}

impl Client {
    /// A client for the cluster in `map`. Connections open on first use.
    pub fn new(map: ClusterMap, opts: ClientOptions) -> Client {
        let pool = Arc::new(Pool::new(&map, opts.conns_per_server, opts.retries));
        Client::with_pool(map, opts, pool)
    }

    /// A client whose calls go through `pool` (an in-process test cluster's transport).
    pub fn with_pool(map: ClusterMap, opts: ClientOptions, pool: Arc<Pool>) -> Client {
        let (trusted, bounds) = trusted_identity(&map);
        // Delegations and client-direct I/O are every identity's (servers replay a flush
        // with the checks of single requests; data servers check capabilities); client-
        // driven Cx is trusted clients'.
        let session = rand::random::<u64>() | 1;
        let claimed = Cred::new(opts.uid, opts.gid, opts.groups.clone());
        let caller = Cred { session, ..claimed.clone() };
        let map = Arc::new(map);
        let delegs = opts.delegations.then(|| crate::deleg::Delegations::new(pool.clone(), map.clone(), session));
        let map = crate::epochs::SharedMap::new(map, opts.map_file.clone());
        Client {
            map,
            pool,
            opts,
            fds: Arc::default(),
            dist: Arc::default(),
            cx: Arc::default(),
            cwd: Arc::from("/"),
            caller,
            delegs,
            dir_hints: Arc::default(),
            trusted,
            bounds: bounds.map(Arc::new),
            direct: Arc::default(),
        }
        .as_caller(claimed)
    }

    /// The working directory relative paths resolve against (`/` at first).
    pub fn cwd(&self) -> &str {
        &self.cwd
    }

    /// `chdir(2)`: the same client with working directory `raw` (resolved against the
    /// current one), which must be a directory. Trees deeper than `PATH_MAX` are walked
    /// this way: each call's path is limited, not the tree's depth.
    pub async fn chdir(&self, raw: &str) -> Result<Client, FsError> {
        let p = self.norm("change directory to", raw)?;
        let a = self.inner().lstat(&p).await.map_err(|e| FsError { op: "change directory to", ..e })?;
        if a.kind != FileKind::Dir {
            return Err(FsError::new("change directory to", raw, Errno::ENOTDIR));
        }
        let mut c = self.clone();
        c.cwd = Arc::from(p);
        Ok(c)
    }

    /// The same client (connections, caches, descriptors) calling as `cred`: servers
    /// check its permissions, and what it creates belongs to it — what a mount does for
    /// each caller.
    ///
    /// With a bounded identity the caller is admitted as the servers will admit it (root
    /// squashed, groups outside the ranges dropped); a caller it refuses keeps its claim
    /// and uses no delegation, so the servers refuse each of its requests.
    pub fn as_caller(&self, cred: Cred) -> Client {
        let mut c = self.clone();
        let cred = match self.bounds.as_deref().map(|id| id.admit(cred.clone())) {
            None => cred,
            Some(Ok(admitted)) => Cred { verifier: cred.verifier, ..admitted },
            Some(Err(_)) => {
                c.delegs = None;
                cred
            }
        };
        (c.opts.uid, c.opts.gid, c.opts.groups) = (cred.uid, cred.gid, cred.groups.clone());
        c.caller = Cred { session: self.caller.session, ..cred };
        c
    }

    /// The same client, with the same caller, asking that what it creates be recorded as
    /// owned by `uid`:`gid`. Servers honour this only for a root caller (a restore such
    /// as `plusfs cp`); other callers' entries are theirs.
    pub fn as_owner(&self, uid: u32, gid: u32) -> Client {
        let mut c = self.clone();
        c.opts.uid = uid;
        c.opts.gid = gid;
        c
    }

    /// The same client allowing paths of up to `n` bytes in one call (see
    /// [`ClientOptions::path_max`](crate::ClientOptions::path_max)).
    pub fn with_path_max(&self, n: usize) -> Client {
        let mut c = self.clone();
        c.opts.path_max = n;
        c
    }

    /// This client for calls with paths it built itself (already resolved and normalised),
    /// which only the tree's limit applies to.
    pub(crate) fn inner(&self) -> Client {
        self.with_path_max(path::MAX_TREE_PATH_LEN)
    }

    /// The credential this client's requests carry.
    pub fn caller(&self) -> &Cred {
        &self.caller
    }

    /// The cluster map in use (the newest this client has learnt of).
    pub fn map(&self) -> Arc<ClusterMap> {
        self.map.get()
    }

    /// Messages, bytes and requests sent so far by this client (and its clones).
    pub fn counters(&self) -> CountersSnapshot {
        self.pool.counters().snapshot()
    }

    /// Home server of the directory object at normalised `dir` (Eq. 1).
    pub fn home(&self, dir: &str) -> ServerId {
        self.map().home_of_dir(dir)
    }

    /// Sends `req` to `server` as this client's caller, after the queued work of the
    /// delegated directories it touches (`deleg`).
    pub(crate) async fn send(
        &self,
        server: ServerId,
        req: &Request,
    ) -> Result<plusfs_proto::Response, plusfs_rpc::CallError> {
        self.map.follow(&self.pool).await;
        if let Some(d) = &self.delegs {
            if let Err(e) = d.before(req).await {
                let why = format!("delegated work in {} could not be written back first: {e}", e.path);
                return Ok(Err(plusfs_proto::WireError::new(plusfs_proto::Errno::EIO, why)));
            }
        }
        let routed_with = self.map().epoch;
        let sent = self.pool.call_as(server, &self.caller, req).await;
        // Perhaps the server left the cluster: with a newer map, an idempotent request goes
        // to the home it names (another may have taken effect on an attempt before the
        // last; a request about no directory is not rerouted).
        if matches!(&sent, Err(plusfs_rpc::CallError::Connect { .. })) && req.is_idempotent() {
            self.map.rescue(&self.pool).await;
            if self.map().epoch > routed_with {
                let map = self.map();
                let dir = match req {
                    Request::Once { op, .. } => op.target_dir(),
                    other => other.target_dir(),
                };
                if let Some(home) = dir.map(|d| map.home_of_dir(d)).filter(|&h| h != server) {
                    tracing::debug!(server, home, "server unreachable; resending to the home of the newer map");
                    return self.pool.call_as(home, &self.caller, req).await;
                }
            }
        }
        sent
    }

    /// Sends a raw request to one server (tools such as fsck and status use this).
    pub async fn call_server(&self, server: ServerId, req: &Request) -> Result<Reply, FsError> {
        match self.send(server, req).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => Err(FsError::new("query", format!("server {server}"), e.errno).with_detail(e.message)),
            Err(e) => Err(FsError::new("reach", format!("server {server}"), e.errno()).with_detail(e.to_string())),
        }
    }

    /// One request about `path`; server errors become [`FsError`]s naming `path`.
    pub(crate) async fn rpc(
        &self,
        op: &'static str,
        shown: &str,
        server: ServerId,
        req: Request,
    ) -> Result<Reply, FsError> {
        match self.send(server, &req).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => Err(self.server_error(op, shown, e).await),
            Err(e) => Err(FsError::new(op, shown, e.errno()).with_detail(e.to_string())),
        }
    }

    pub(crate) async fn server_error(&self, op: &'static str, shown: &str, e: WireError) -> FsError {
        let errno = match &e.missing_dir {
            Some(dir) => self.classify_missing(dir).await,
            None => e.errno,
        };
        let err = FsError::new(op, shown, errno);
        // An I/O error's cause is only known to the server: keep its words.
        if errno == Errno::EIO && !e.message.is_empty() {
            err.with_detail(e.message)
        } else {
            err
        }
    }

    /// A directory object is missing: ENOTDIR if some ancestor is not a directory, ENOENT
    /// if one is absent, and the error met if an ancestor cannot be looked at (a server
    /// down: EIO, not a guess). Only runs on error paths.
    async fn classify_missing(&self, dir: &str) -> Errno {
        let mut cur = dir.to_string();
        loop {
            let Some((parent, name)) = path::split(&cur) else { return Errno::ENOENT };
            let req = Request::Stat { path: cur.clone() };
            match self.entry_call(parent, name, &req).await {
                Ok(Ok((Reply::Attr(a), _))) if a.kind != FileKind::Dir => return Errno::ENOTDIR,
                Ok(Ok(_)) => return Errno::ENOENT,
                Ok(Err(WireError { missing_dir: Some(p), .. })) => cur = p,
                Ok(Err(e)) => return e.errno,
                Err(e) => return e.errno,
            }
        }
    }

    /// The absolute, normalised path of `raw` as given to call `op`: relative paths resolve
    /// against the working directory; `raw` is limited to `path_max` bytes, the result to
    /// the cluster's tree limit.
    pub(crate) fn norm(&self, op: &'static str, raw: &str) -> Result<String, FsError> {
        path::resolve(&self.cwd, raw, self.opts.path_max).map_err(|e| path_err(op, raw, e))
    }

    /// Normalises the target of a namespace change: `.`/`..` as last component is EINVAL,
    /// `/` gets `root_errno`. Returns (path, parent, name).
    fn target(&self, op: &'static str, raw: &str, root_errno: Errno) -> Result<(String, String, String), FsError> {
        let p = self.norm(op, raw)?;
        let last = path::raw_last_component(raw);
        if last == "." || last == ".." {
            return Err(FsError::new(op, raw, Errno::EINVAL).with_detail("'.' and '..' cannot be targets"));
        }
        if p == "/" {
            return Err(FsError::new(op, raw, root_errno));
        }
        let (parent, name) = path::split(&p).map(|(d, n)| (d.to_string(), n.to_string())).unwrap_or_default();
        Ok((p, parent, name))
    }

    /// `mkdir(2)`.
    pub async fn mkdir(&self, raw: &str, mode: u32) -> Result<Attr, FsError> {
        self.mkdir_with(raw, mode, Threshold::Cluster, 0).await
    }

    /// `mkdir(2)` with a huge-directory policy for the new directory: distributed once it
    /// holds more than `threshold` entries (`Entries(0)`: from creation) over `width`
    /// storing servers (0: the cluster's setting).
    pub async fn mkdir_with(&self, raw: &str, mode: u32, threshold: Threshold, width: u32) -> Result<Attr, FsError> {
        let (p, parent, name) = self.target("create directory", raw, Errno::EEXIST)?;
        let made = self.mkdir_two_server(raw, &p, (&parent, &name), mode & 0o7777, (threshold, width)).await?;
        if let Some(d) = &self.delegs {
            d.created(&p);
        }
        self.dir_hints.note(&p);
        Ok(made)
    }

    /// Changes the huge-directory policy of an existing directory; it is distributed at
    /// once if it already holds more entries than the new threshold.
    pub async fn set_policy(
        &self,
        raw: &str,
        threshold: Option<Threshold>,
        width: Option<u32>,
    ) -> Result<DistReport, FsError> {
        let p = self.norm("set the policy of", raw)?;
        let req = Request::SetPolicy { path: p.clone(), threshold, width };
        expect_dist(self.rpc("set the policy of", raw, self.home(&p), req).await?, raw)
    }

    /// A directory's distribution: state, threshold, storing set and entries per server.
    pub async fn distribution(&self, raw: &str) -> Result<DistReport, FsError> {
        let p = self.norm("stat", raw)?;
        expect_dist(self.rpc("stat", raw, self.home(&p), Request::DistStatus { path: p.clone() }).await?, raw)
    }

    /// `mkdir -p`: creates missing ancestors; an existing directory is not an error.
    pub async fn mkdir_all(&self, raw: &str, mode: u32) -> Result<Attr, FsError> {
        let p = self.norm("create directory", raw)?;
        match self.inner().lstat(&p).await {
            Ok(a) if a.kind == FileKind::Dir => return Ok(a),
            Ok(_) => return Err(FsError::new("create directory", raw, Errno::EEXIST)),
            Err(e) if e.errno != Errno::ENOENT => return Err(e),
            Err(_) => {}
        }
        if let Some((parent, _)) = path::split(&p) {
            Box::pin(self.inner().mkdir_all(parent, mode)).await?;
        }
        match self.inner().mkdir(&p, mode).await {
            Err(e) if e.errno == Errno::EEXIST => self.inner().lstat(&p).await,
            r => r,
        }
    }

    /// `rmdir(2)`.
    pub async fn rmdir(&self, raw: &str) -> Result<(), FsError> {
        let (p, parent, name) = self.target("remove directory", raw, Errno::EBUSY)?;
        self.rmdir_two_server(raw, &p, (&parent, &name)).await?;
        self.dir_hints.forget(&p);
        Ok(())
    }

    /// Creates a regular file (`open(O_CREAT)`, with `O_EXCL` when `exclusive`) and returns
    /// its handle. An existing file is opened unless `exclusive`.
    pub async fn create(&self, raw: &str, mode: u32, exclusive: bool) -> Result<FileHandle, FsError> {
        self.make_node(raw, FileKind::File, mode, exclusive, (0, 0)).await
    }

    /// As [`create`](Self::create), checking `access` (`plusfs_proto::MAY_READ |
    /// MAY_WRITE`) on a file that exists already (`EACCES`), as `open(O_CREAT)` does.
    pub async fn create_with(&self, raw: &str, mode: u32, exclusive: bool, access: u32) -> Result<FileHandle, FsError> {
        self.make_node(raw, FileKind::File, mode, exclusive, (0, access)).await
    }

    /// Creates a regular file, FIFO, socket or device (`mknod(2)`; `rdev` for devices),
    /// failing if the name exists.
    pub async fn mknod(&self, raw: &str, kind: FileKind, mode: u32, rdev: u32) -> Result<FileHandle, FsError> {
        if matches!(kind, FileKind::Dir | FileKind::Symlink) {
            return Err(FsError::new("create", raw, Errno::EINVAL));
        }
        self.make_node(raw, kind, mode, true, (rdev, 0)).await
    }

    async fn make_node(
        &self,
        raw: &str,
        kind: FileKind,
        mode: u32,
        exclusive: bool,
        (rdev, access): (u32, u32),
    ) -> Result<FileHandle, FsError> {
        let (p, parent, name) = self.target("create", raw, Errno::EISDIR)?;
        let local = self.deleg_create(raw, &parent, &name, kind, mode & 0o7777, exclusive, (rdev, access, None));
        if let Some(r) = local.await {
            let attr = r?;
            return Ok(FileHandle { path: p, ino: attr.ino, server: self.home(&parent), attr, append: false });
        }
        let req = Request::Create {
            path: p.clone(),
            kind,
            mode: mode & 0o7777,
            uid: self.opts.uid,
            gid: self.opts.gid,
            exclusive,
            rdev,
            access,
        };
        let (reply, server) = self.entry_rpc("create", raw, &parent, &name, req).await?;
        let attr = expect_attr(reply, raw)?;
        Ok(FileHandle { path: p, ino: attr.ino, server, attr, append: false })
    }

    /// Opens an existing entry (a directory too) and returns its handle: one round trip
    /// for a file, two for a directory. No access is checked at open (see `open_with`).
    pub async fn open(&self, raw: &str) -> Result<FileHandle, FsError> {
        self.open_with(raw, 0).await
    }

    /// As [`open`](Self::open), checking that the caller may do `access` to a file
    /// (`plusfs_proto::MAY_READ | MAY_WRITE`; `EACCES` if not).
    pub async fn open_with(&self, raw: &str, access: u32) -> Result<FileHandle, FsError> {
        let p = self.norm("open", raw)?;
        let dir_handle =
            |attr: Attr| FileHandle { path: p.clone(), ino: attr.ino, server: self.home(&p), attr, append: false };
        let Some((parent, name)) = path::split(&p) else {
            let req = Request::DirStat { path: p.clone() };
            return Ok(dir_handle(expect_attr(self.rpc("open", raw, self.home("/"), req).await?, raw)?));
        };
        if let Some(r) = self.deleg_open(raw, parent, name, access).await {
            let attr = r?;
            return Ok(FileHandle { path: p.clone(), ino: attr.ino, server: self.home(parent), attr, append: false });
        }
        let (reply, server) =
            self.entry_rpc("open", raw, parent, name, Request::Open { path: p.clone(), access }).await?;
        match reply {
            Reply::IsDir { .. } => {
                let req = Request::DirStat { path: p.clone() };
                Ok(dir_handle(expect_attr(self.rpc("open", raw, self.home(&p), req).await?, raw)?))
            }
            r => {
                let attr = expect_attr(r, raw)?;
                Ok(FileHandle { path: p.clone(), ino: attr.ino, server, attr, append: false })
            }
        }
    }

    /// `open(2)` returning a descriptor of this client's table (`flags.create` for O_CREAT).
    pub async fn open_fd(&self, raw: &str, flags: crate::types::OpenFlags, mode: u32) -> Result<i32, FsError> {
        let access = flags.access | if flags.truncate { plusfs_proto::MAY_WRITE } else { 0 };
        let mut fh = match flags.create {
            true => self.create_with(raw, mode, flags.exclusive, access).await?,
            false => self.open_with(raw, access).await?,
        };
        if flags.truncate && fh.attr.kind == FileKind::File && fh.attr.size > 0 {
            fh.attr = self.inner().truncate(&fh.path, 0).await?;
        }
        fh.append = flags.append;
        Ok(self.fds.insert(fh))
    }

    /// `close(2)` of a descriptor from `open_fd`/`openv`.
    pub async fn close_fd(&self, fd: i32) -> Result<(), FsError> {
        let fh = self.fds.get(fd).ok_or_else(|| FsError::new("close", format!("descriptor {fd}"), Errno::EBADF))?;
        self.close(&fh).await?;
        self.fds.remove(fd);
        Ok(())
    }

    /// Closes a handle from `open`/`create`.
    pub async fn close(&self, fh: &FileHandle) -> Result<(), FsError> {
        if fh.attr.kind == FileKind::Dir {
            return Ok(());
        }
        self.rpc("close", &fh.path, fh.server, Request::Close { ino: fh.ino }).await.map(drop)
    }

    /// `stat(2)`: follows symbolic links in the last component (relative targets resolve
    /// against the link's directory), at most 40 of them (ELOOP).
    pub async fn stat(&self, raw: &str) -> Result<Attr, FsError> {
        let mut p = self.norm("stat", raw)?;
        for _ in 0..40 {
            let a = self.inner().lstat(&p).await.map_err(|e| FsError { path: raw.to_string(), ..e })?;
            if a.kind != FileKind::Symlink {
                return Ok(a);
            }
            let target = self.inner().readlink(&p).await?;
            let dir = path::split(&p).map(|(d, _)| d.to_string()).unwrap_or_else(|| "/".into());
            let joined = if target.starts_with('/') { target } else { format!("{dir}/{target}") };
            // Built here, not given: only the tree's limit applies.
            p = path::resolve("/", &joined, path::MAX_TREE_PATH_LEN).map_err(|e| path_err("stat", raw, e))?;
        }
        Err(FsError::new("stat", raw, Errno::ELOOP))
    }

    /// `lstat(2)` of a path the caller believes is a directory: one request, to the
    /// directory's home (`lstat` asks the parent's server first). When it is not a
    /// directory there any more, answers as `lstat` does.
    pub async fn lstat_dir(&self, raw: &str) -> Result<Attr, FsError> {
        let p = self.norm("stat", raw)?;
        if let Some(a) = self.deleg_dir_attr(&p).await {
            return Ok(a);
        }
        match self.rpc("stat", raw, self.home(&p), Request::DirStat { path: p.clone() }).await {
            Ok(r) => {
                let a = expect_attr(r, raw)?;
                self.deleg_learn_dir(&p, &a).await;
                Ok(a)
            }
            Err(_) => self.inner().lstat(&p).await,
        }
    }

    /// `lstat(2)`: symbolic links are not followed.
    pub async fn lstat(&self, raw: &str) -> Result<Attr, FsError> {
        let p = self.norm("stat", raw)?;
        let Some((parent, name)) = path::split(&p) else {
            return expect_attr(self.rpc("stat", raw, self.home("/"), Request::DirStat { path: p }).await?, raw);
        };
        if let Some(r) = self.deleg_lookup(raw, parent, name).await {
            return r;
        }
        let home = self.home(&p);
        let dir_stat = || self.rpc("stat", raw, home, Request::DirStat { path: p.clone() });
        let entry = self.entry_rpc("stat", raw, parent, name, Request::Stat { path: p.clone() });
        // A hinted directory: its entry's server and its home at once (see dirhints.rs).
        let (entry, early) = match self.dir_hints.likely(&p) {
            true => {
                let (e, d) = futures::join!(entry, dir_stat());
                (e, Some(d))
            }
            false => (entry.await, None),
        };
        let entry = entry.inspect_err(|_| self.dir_hints.forget(&p))?;
        match entry.0 {
            Reply::IsDir { .. } => {
                self.dir_hints.note(&p);
                let answer = match early {
                    Some(Ok(r)) => r,
                    // Raced with a change, or not asked: ask the home now.
                    _ => dir_stat().await?,
                };
                expect_attr(answer, raw)
            }
            r => {
                self.dir_hints.forget(&p);
                expect_attr(r, raw)
            }
        }
    }

    /// `unlink(2)`.
    pub async fn unlink(&self, raw: &str) -> Result<(), FsError> {
        let (p, parent, name) = self.target("remove", raw, Errno::EISDIR)?;
        if let Some(r) = self.deleg_unlink(raw, &parent, &name).await {
            return r;
        }
        self.entry_rpc("remove", raw, &parent, &name, Request::Unlink { path: p }).await.map(drop)
    }

    /// One page of a directory listing: entries whose names sort after `after` (merged
    /// from every storing server when the directory is distributed).
    pub async fn readdir_page(&self, raw: &str, after: Option<String>, limit: u32) -> Result<Dirents, FsError> {
        let p = self.norm("open directory", raw)?;
        if let Some(all) = self.deleg_readdir(raw, &p).await {
            let mut entries = all?;
            if let Some(a) = &after {
                entries.drain(..entries.partition_point(|e| e.name <= *a));
            }
            let cap = if limit == 0 { 1024 } else { limit as usize };
            let more = entries.len() > cap;
            entries.truncate(cap);
            return Ok(Dirents { incarnation: 0, entries, more });
        }
        self.list_page(raw, &p, after, limit).await
    }

    /// The whole listing of a directory (without `.` and `..`), in name order. A
    /// distributed directory is listed from all its storing servers in parallel.
    pub async fn readdir(&self, raw: &str) -> Result<Vec<DirEntry>, FsError> {
        let p = self.norm("open directory", raw)?;
        if let Some(r) = self.deleg_readdir(raw, &p).await {
            return r;
        }
        let mut out = Vec::new();
        let mut after = None;
        let mut restarts = 0;
        loop {
            if let Some(info) = self.cached_distribution(&p) {
                if let Some(all) = self.list_shards(raw, &info).await? {
                    return Ok(all);
                }
                // The cached distribution was out of date: list again from the home.
                restarts += 1;
                if restarts > 12 {
                    let detail = "the directory's distribution kept changing";
                    return Err(FsError::new("open directory", raw, Errno::EAGAIN).with_detail(detail));
                }
                out.clear();
                after = None;
                continue;
            }
            let page = self.list_page(raw, &p, after.take(), self.opts.readdir_page).await?;
            if self.cached_distribution(&p).is_some() {
                // Learnt mid-way that it is distributed: list it from its shards.
                continue;
            }
            after = page.entries.last().map(|e| e.name.clone());
            out.extend(page.entries);
            if !page.more || after.is_none() {
                return Ok(out);
            }
        }
    }

    /// Every entry of a distributed directory: each storing server's shard paged through
    /// in parallel, merged by name. `None` when the cached distribution was out of date
    /// (dropped; the caller lists again).
    async fn list_shards(&self, raw: &str, info: &plusfs_proto::DistInfo) -> Result<Option<Vec<DirEntry>>, FsError> {
        let lists = futures::future::join_all(info.servers().into_iter().map(|s| async move {
            let mut all = Vec::new();
            let mut after: Option<String> = None;
            loop {
                let req = Client::addressed(
                    Request::Readdir { path: info.path.clone(), after: after.take(), limit: self.opts.readdir_page },
                    Some(info.incarnation),
                );
                match self.raw_call(raw, s, &req).await? {
                    Ok(Reply::Dirents(d)) => {
                        after = d.entries.last().map(|e| e.name.clone());
                        all.extend(d.entries);
                        if !d.more || after.is_none() {
                            return Ok(Ok(all));
                        }
                    }
                    Ok(other) => return Err(unexpected(raw, &other)),
                    Err((e, _)) => return Ok(Err(e)),
                }
            }
        }))
        .await;
        let mut out = Vec::new();
        for l in lists {
            match l? {
                Ok(entries) => out.extend(entries),
                Err(e) => match self.reroute(&info.path, Some(info.incarnation), e) {
                    crate::routing::Reroute::Fail(e) => return Err(self.server_error("open directory", raw, e).await),
                    _ => return Ok(None),
                },
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Some(out))
    }

    /// `rename(2)`. Renaming a directory moves its directory objects and those of all its
    /// descendants to their new home servers.
    pub async fn rename(&self, src_raw: &str, dst_raw: &str) -> Result<(), FsError> {
        let (src, src_parent, src_name) = self.target("move", src_raw, Errno::EBUSY)?;
        let (dst, dst_parent, dst_name) = self.target("move", dst_raw, Errno::EBUSY)?;
        if src == dst {
            self.inner().lstat(&src).await.map_err(|e| FsError { op: "move", ..e })?;
            return Ok(());
        }
        if src_parent == dst_parent {
            if let Some(r) = self.deleg_rename(src_raw, &src_parent, &src_name, &dst_name).await {
                return r;
            }
        }
        let req = Request::Rename { src, dst };
        self.entry_rpc("move", src_raw, &src_parent, &src_name, req).await.map(drop)
    }

    /// `renameat2(RENAME_EXCHANGE)`: entries `a` and `b` swap atomically. Both must exist
    /// and be non-directories (EINVAL for directories).
    pub async fn exchange(&self, a_raw: &str, b_raw: &str) -> Result<(), FsError> {
        let (a, a_parent, a_name) = self.target("exchange", a_raw, Errno::EBUSY)?;
        let (b, _, _) = self.target("exchange", b_raw, Errno::EBUSY)?;
        let req = Request::Exchange { a, b };
        self.entry_rpc("exchange", a_raw, &a_parent, &a_name, req).await.map(drop)
    }

    /// `link(2)`: a new name `dst` for the file (not directory) `src`; returns the file's
    /// attributes with the new link count.
    pub async fn link(&self, src_raw: &str, dst_raw: &str) -> Result<Attr, FsError> {
        let (src, src_parent, src_name) = self.target("link", src_raw, Errno::EPERM)?;
        let (dst, _, _) = self.target("link", dst_raw, Errno::EEXIST)?;
        let req = Request::Link { src, dst: dst.clone() };
        self.entry_rpc("link", src_raw, &src_parent, &src_name, req).await?;
        self.inner().lstat(&dst).await.map_err(|e| FsError { op: "link", ..e })
    }

    /// Changes attributes (`chmod`, `chown`, `utimens` in one call).
    pub async fn setattr(&self, raw: &str, set: SetAttr) -> Result<Attr, FsError> {
        let p = self.norm("change attributes of", raw)?;
        if let Some(r) = self.deleg_dir_setattr(raw, &p, &set).await {
            return r;
        }
        let dir_req = Request::DirSetAttr { path: p.clone(), set: set.clone() };
        let Some((parent, name)) = path::split(&p) else {
            return expect_attr(self.rpc("change attributes of", raw, self.home("/"), dir_req).await?, raw);
        };
        if let Some(r) = self.deleg_setattr(raw, parent, name, &set).await {
            return r;
        }
        let req = Request::SetAttr { path: p.clone(), set };
        match self.entry_rpc("change attributes of", raw, parent, name, req).await?.0 {
            Reply::IsDir { .. } => {
                expect_attr(self.rpc("change attributes of", raw, self.home(&p), dir_req).await?, raw)
            }
            r => expect_attr(r, raw),
        }
    }

    /// [`Self::setattr`] of a path the caller believes is a directory: one request, to
    /// the directory's home (`setattr` asks the parent's server first). When it is not a
    /// directory there any more, answers as `setattr` does.
    pub async fn setattr_dir(&self, raw: &str, set: SetAttr) -> Result<Attr, FsError> {
        let p = self.norm("change attributes of", raw)?;
        if let Some(r) = self.deleg_dir_setattr(raw, &p, &set).await {
            return r;
        }
        let req = Request::DirSetAttr { path: p.clone(), set: set.clone() };
        match self.rpc("change attributes of", raw, self.home(&p), req).await {
            Ok(r) => expect_attr(r, raw),
            Err(e) if matches!(e.errno, Errno::ENOENT | Errno::ENOTDIR) => self.setattr(raw, set).await,
            Err(e) => Err(e),
        }
    }

    /// `chmod(2)` (permission bits only).
    pub async fn chmod(&self, raw: &str, mode: u32) -> Result<Attr, FsError> {
        self.setattr(raw, SetAttr { mode: Some(mode & 0o7777), ..Default::default() }).await
    }

    /// `lchown(2)`; `None` leaves an id unchanged.
    pub async fn chown(&self, raw: &str, uid: Option<u32>, gid: Option<u32>) -> Result<Attr, FsError> {
        self.setattr(raw, SetAttr { uid, gid, ..Default::default() }).await
    }

    /// `utimensat(2)` without following symlinks.
    pub async fn utimens(&self, raw: &str, atime: Option<TimeSet>, mtime: Option<TimeSet>) -> Result<Attr, FsError> {
        self.setattr(raw, SetAttr { atime, mtime, ..Default::default() }).await
    }

    /// `symlink(2)`: creates `link` pointing at `target`.
    pub async fn symlink(&self, target: &str, link: &str) -> Result<Attr, FsError> {
        let (p, parent, name) = self.target("create symbolic link", link, Errno::EEXIST)?;
        if target.is_empty() || target.len() > path::MAX_PATH_LEN || target.contains('\0') {
            let errno = if target.len() > path::MAX_PATH_LEN { Errno::ENAMETOOLONG } else { Errno::EINVAL };
            return Err(FsError::new("create symbolic link", link, errno).with_detail("bad target"));
        }
        let local = self.deleg_create(link, &parent, &name, FileKind::Symlink, 0o777, true, (0, 0, Some(target)));
        if let Some(r) = local.await {
            return r;
        }
        let req = Request::Symlink { path: p, target: target.to_string(), uid: self.opts.uid, gid: self.opts.gid };
        expect_attr(self.entry_rpc("create symbolic link", link, &parent, &name, req).await?.0, link)
    }

    /// `readlink(2)`.
    pub async fn readlink(&self, raw: &str) -> Result<String, FsError> {
        let p = self.norm("read link", raw)?;
        let Some((parent, name)) = path::split(&p) else {
            return Err(FsError::new("read link", raw, Errno::EINVAL));
        };
        if let Some(t) = self.deleg_readlink(parent, name).await {
            return Ok(t);
        }
        match self.entry_rpc("read link", raw, parent, name, Request::Readlink { path: p.clone() }).await?.0 {
            Reply::Target(t) => Ok(t),
            other => Err(unexpected(raw, &other)),
        }
    }

    /// Totals over all servers (`statfs(2)`).
    pub async fn statfs(&self) -> Result<Statfs, FsError> {
        let mut total = Statfs::default();
        for s in &self.map().servers {
            match self.call_server(s.id, &Request::Statfs).await? {
                Reply::Statfs(st) => {
                    total.dir_objects += st.dir_objects;
                    total.entries += st.entries;
                }
                other => return Err(unexpected("statfs", &other)),
            }
        }
        Ok(total)
    }

    /// Counters of one server.
    pub async fn server_status(&self, server: ServerId) -> Result<ServerStatus, FsError> {
        match self.call_server(server, &Request::Status).await? {
            Reply::Status(s) => Ok(*s),
            other => Err(unexpected("status", &other)),
        }
    }

    /// The namespace records of one server, for fsck.
    pub async fn fsck_scan(&self, server: ServerId) -> Result<FsckData, FsError> {
        match self.call_server(server, &Request::FsckScan).await? {
            Reply::Fsck(d) => Ok(d),
            other => Err(unexpected("fsck", &other)),
        }
    }

    /// Waits until every server answers a ping, or the deadline passes.
    pub async fn wait_ready(&self, timeout: std::time::Duration) -> Result<(), FsError> {
        let deadline = tokio::time::Instant::now() + timeout;
        for s in &self.map().servers {
            loop {
                match self.call_server(s.id, &Request::Ping).await {
                    Ok(_) => break,
                    Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
                    Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
                }
            }
        }
        Ok(())
    }
}

fn expect_dist(r: Reply, raw: &str) -> Result<DistReport, FsError> {
    match r {
        Reply::Dist(d) => Ok(d),
        other => Err(unexpected(raw, &other)),
    }
}

fn expect_attr(r: Reply, raw: &str) -> Result<Attr, FsError> {
    match r {
        Reply::Attr(a) => Ok(a),
        other => Err(unexpected(raw, &other)),
    }
}

fn unexpected(raw: &str, r: &Reply) -> FsError {
    FsError::new("use", raw, Errno::EPROTO).with_detail(format!("unexpected reply {r:?}"))
}
