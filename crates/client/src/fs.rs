//! POSIX-like calls over the cluster.

use crate::error::FsError;
use crate::pool::{CountersSnapshot, Pool};
use plusfs_placement::ClusterMap;
use plusfs_proto::path::{self, PathError};
use plusfs_proto::{
    Attr, DirEntry, Dirents, Errno, FileKind, FsckData, Ino, Reply, Request, ServerId, ServerStatus, SetAttr, Statfs,
    TimeSet, WireError,
};
use std::sync::Arc;

/// Client settings; `Default` gives the values stated on each field.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Pipelined connections per server (default 1).
    pub conns_per_server: usize,
    /// Resends of an idempotent request after a broken connection (default 3).
    pub retries: u32,
    /// Owner recorded on created entries (default: the effective uid of this process).
    pub uid: u32,
    /// Group recorded on created entries (default: the effective gid of this process).
    pub gid: u32,
    /// Entries fetched per readdir request (default 1024).
    pub readdir_page: u32,
    /// Most entries in one batch request; larger batches are cut (default 4096).
    pub max_batch: usize,
}

impl Default for ClientOptions {
    fn default() -> Self {
        // SAFETY: geteuid/getegid have no preconditions and cannot fail.
        #[allow(unsafe_code)]
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        ClientOptions { conns_per_server: 1, retries: 3, uid, gid, readdir_page: 1024, max_batch: 4096 }
    }
}

/// An open file: the handle `open`/`create` return and `close` takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileHandle {
    pub path: String,
    pub ino: Ino,
    pub server: ServerId,
    pub attr: Attr,
}

/// The async client. Cheap to clone; clones share connections and counters.
#[derive(Clone)]
pub struct Client {
    map: Arc<ClusterMap>,
    pool: Arc<Pool>,
    pub(crate) opts: ClientOptions,
    pub(crate) fds: Arc<crate::fds::FdTable>,
}

fn path_err(op: &'static str, raw: &str, e: PathError) -> FsError {
    FsError::new(op, raw, e.errno).with_detail(e.reason)
}

impl Client {
    /// A client for the cluster in `map`. Connections open on first use.
    pub fn new(map: ClusterMap, opts: ClientOptions) -> Client {
        let pool = Arc::new(Pool::new(&map, opts.conns_per_server, opts.retries));
        Client { map: Arc::new(map), pool, opts, fds: Arc::default() }
    }

    /// The cluster map in use.
    pub fn map(&self) -> &ClusterMap {
        &self.map
    }

    /// Messages, bytes and requests sent so far by this client (and its clones).
    pub fn counters(&self) -> CountersSnapshot {
        self.pool.counters().snapshot()
    }

    /// Home server of the directory object at normalised `dir` (Eq. 1).
    pub fn home(&self, dir: &str) -> ServerId {
        self.map.home_of_dir(dir)
    }

    /// Sends a raw request to one server (tools such as fsck and status use this).
    pub async fn call_server(&self, server: ServerId, req: &Request) -> Result<Reply, FsError> {
        match self.pool.call(server, req).await {
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
        match self.pool.call(server, &req).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => Err(self.server_error(op, shown, e).await),
            Err(e) => Err(FsError::new(op, shown, e.errno()).with_detail(e.to_string())),
        }
    }

    async fn server_error(&self, op: &'static str, shown: &str, e: WireError) -> FsError {
        let errno = match &e.missing_dir {
            Some(dir) => self.classify_missing(dir).await,
            None => e.errno,
        };
        FsError::new(op, shown, errno)
    }

    /// A directory object is missing: ENOTDIR if some ancestor is not a directory, else
    /// ENOENT. Only runs on error paths.
    async fn classify_missing(&self, dir: &str) -> Errno {
        let mut cur = dir.to_string();
        loop {
            let Some((parent, _)) = path::split(&cur) else { return Errno::ENOENT };
            let req = Request::Stat { path: cur.clone() };
            match self.pool.call(self.home(parent), &req).await {
                Ok(Ok(Reply::Attr(a))) if a.kind != FileKind::Dir => return Errno::ENOTDIR,
                Ok(Err(WireError { missing_dir: Some(p), .. })) => cur = p,
                _ => return Errno::ENOENT,
            }
        }
    }

    fn norm(&self, op: &'static str, raw: &str) -> Result<String, FsError> {
        path::normalize(raw).map_err(|e| path_err(op, raw, e))
    }

    /// Normalises the target of a namespace change: `.`/`..` as last component is EINVAL,
    /// `/` gets `root_errno`.
    fn target(&self, op: &'static str, raw: &str, root_errno: Errno) -> Result<(String, String), FsError> {
        let p = self.norm(op, raw)?;
        let last = path::raw_last_component(raw);
        if last == "." || last == ".." {
            return Err(FsError::new(op, raw, Errno::EINVAL).with_detail("'.' and '..' cannot be targets"));
        }
        if p == "/" {
            return Err(FsError::new(op, raw, root_errno));
        }
        let parent = path::split(&p).map(|(d, _)| d.to_string()).unwrap_or_default();
        Ok((p, parent))
    }

    /// `mkdir(2)`.
    pub async fn mkdir(&self, raw: &str, mode: u32) -> Result<Attr, FsError> {
        let (p, parent) = self.target("create directory", raw, Errno::EEXIST)?;
        let req = Request::Mkdir { path: p, mode: mode & 0o7777, uid: self.opts.uid, gid: self.opts.gid };
        expect_attr(self.rpc("create directory", raw, self.home(&parent), req).await?, raw)
    }

    /// `mkdir -p`: creates missing ancestors; an existing directory is not an error.
    pub async fn mkdir_all(&self, raw: &str, mode: u32) -> Result<Attr, FsError> {
        let p = self.norm("create directory", raw)?;
        match self.lstat(&p).await {
            Ok(a) if a.kind == FileKind::Dir => return Ok(a),
            Ok(_) => return Err(FsError::new("create directory", raw, Errno::EEXIST)),
            Err(e) if e.errno != Errno::ENOENT => return Err(e),
            Err(_) => {}
        }
        if let Some((parent, _)) = path::split(&p) {
            Box::pin(self.mkdir_all(parent, mode)).await?;
        }
        match self.mkdir(&p, mode).await {
            Err(e) if e.errno == Errno::EEXIST => self.lstat(&p).await,
            r => r,
        }
    }

    /// `rmdir(2)`.
    pub async fn rmdir(&self, raw: &str) -> Result<(), FsError> {
        let (p, parent) = self.target("remove directory", raw, Errno::EBUSY)?;
        self.rpc("remove directory", raw, self.home(&parent), Request::Rmdir { path: p }).await.map(drop)
    }

    /// Creates a regular file (`open(O_CREAT)`, with `O_EXCL` when `exclusive`) and returns
    /// its handle. An existing file is opened unless `exclusive`.
    pub async fn create(&self, raw: &str, mode: u32, exclusive: bool) -> Result<FileHandle, FsError> {
        self.make_node(raw, FileKind::File, mode, exclusive).await
    }

    /// Creates a regular file or FIFO (`mknod(2)`), failing if the name exists.
    pub async fn mknod(&self, raw: &str, kind: FileKind, mode: u32) -> Result<FileHandle, FsError> {
        if matches!(kind, FileKind::Dir | FileKind::Symlink) {
            return Err(FsError::new("create", raw, Errno::EINVAL));
        }
        self.make_node(raw, kind, mode, true).await
    }

    async fn make_node(&self, raw: &str, kind: FileKind, mode: u32, exclusive: bool) -> Result<FileHandle, FsError> {
        let (p, parent) = self.target("create", raw, Errno::EISDIR)?;
        let server = self.home(&parent);
        let req = Request::Create {
            path: p.clone(),
            kind,
            mode: mode & 0o7777,
            uid: self.opts.uid,
            gid: self.opts.gid,
            exclusive,
        };
        let attr = expect_attr(self.rpc("create", raw, server, req).await?, raw)?;
        Ok(FileHandle { path: p, ino: attr.ino, server, attr })
    }

    /// Opens an existing entry (a directory too) and returns its handle: one round trip
    /// for a file, two for a directory.
    pub async fn open(&self, raw: &str) -> Result<FileHandle, FsError> {
        let p = self.norm("open", raw)?;
        let dir_handle = |attr: Attr| FileHandle { path: p.clone(), ino: attr.ino, server: self.home(&p), attr };
        let Some((parent, _)) = path::split(&p) else {
            let req = Request::DirStat { path: p.clone() };
            return Ok(dir_handle(expect_attr(self.rpc("open", raw, self.home("/"), req).await?, raw)?));
        };
        let server = self.home(parent);
        match self.rpc("open", raw, server, Request::Open { path: p.clone() }).await? {
            Reply::IsDir { .. } => {
                let req = Request::DirStat { path: p.clone() };
                Ok(dir_handle(expect_attr(self.rpc("open", raw, self.home(&p), req).await?, raw)?))
            }
            r => {
                let attr = expect_attr(r, raw)?;
                Ok(FileHandle { path: p.clone(), ino: attr.ino, server, attr })
            }
        }
    }

    /// `open(2)` returning a descriptor of this client's table (`flags.create` for O_CREAT).
    pub async fn open_fd(&self, raw: &str, flags: crate::batch::OpenFlags, mode: u32) -> Result<i32, FsError> {
        let fh = if flags.create { self.create(raw, mode, flags.exclusive).await? } else { self.open(raw).await? };
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
            let a = self.lstat(&p).await.map_err(|e| FsError { path: raw.to_string(), ..e })?;
            if a.kind != FileKind::Symlink {
                return Ok(a);
            }
            let target = self.readlink(&p).await?;
            let dir = path::split(&p).map(|(d, _)| d.to_string()).unwrap_or_else(|| "/".into());
            let joined = if target.starts_with('/') { target } else { format!("{dir}/{target}") };
            p = self.norm("stat", &joined)?;
        }
        Err(FsError::new("stat", raw, Errno::ELOOP))
    }

    /// `lstat(2)`: symbolic links are not followed.
    pub async fn lstat(&self, raw: &str) -> Result<Attr, FsError> {
        let p = self.norm("stat", raw)?;
        let Some((parent, _)) = path::split(&p) else {
            return expect_attr(self.rpc("stat", raw, self.home("/"), Request::DirStat { path: p }).await?, raw);
        };
        match self.rpc("stat", raw, self.home(parent), Request::Stat { path: p.clone() }).await? {
            Reply::IsDir { .. } => {
                let server = self.home(&p);
                expect_attr(self.rpc("stat", raw, server, Request::DirStat { path: p }).await?, raw)
            }
            r => expect_attr(r, raw),
        }
    }

    /// `unlink(2)`.
    pub async fn unlink(&self, raw: &str) -> Result<(), FsError> {
        let (p, parent) = self.target("remove", raw, Errno::EISDIR)?;
        self.rpc("remove", raw, self.home(&parent), Request::Unlink { path: p }).await.map(drop)
    }

    /// One page of a directory listing: entries whose names sort after `after`.
    pub async fn readdir_page(&self, raw: &str, after: Option<String>, limit: u32) -> Result<Dirents, FsError> {
        let p = self.norm("open directory", raw)?;
        let req = Request::Readdir { path: p.clone(), after, limit };
        match self.rpc("open directory", raw, self.home(&p), req).await? {
            Reply::Dirents(d) => Ok(d),
            other => Err(unexpected(raw, &other)),
        }
    }

    /// The whole listing of a directory (without `.` and `..`), in name order.
    pub async fn readdir(&self, raw: &str) -> Result<Vec<DirEntry>, FsError> {
        let mut out = Vec::new();
        let mut after = None;
        loop {
            let page = self.readdir_page(raw, after.take(), self.opts.readdir_page).await?;
            after = page.entries.last().map(|e| e.name.clone());
            out.extend(page.entries);
            if !page.more || after.is_none() {
                return Ok(out);
            }
        }
    }

    /// `rename(2)`. Renaming a directory moves its directory objects and those of all its
    /// descendants to their new home servers.
    pub async fn rename(&self, src_raw: &str, dst_raw: &str) -> Result<(), FsError> {
        let (src, src_parent) = self.target("move", src_raw, Errno::EBUSY)?;
        let (dst, _) = self.target("move", dst_raw, Errno::EBUSY)?;
        if src == dst {
            self.lstat(&src).await.map_err(|e| FsError { op: "move", ..e })?;
            return Ok(());
        }
        let req = Request::Rename { src, dst };
        self.rpc("move", src_raw, self.home(&src_parent), req).await.map(drop)
    }

    /// Changes attributes (`chmod`, `chown`, `utimens` in one call).
    pub async fn setattr(&self, raw: &str, set: SetAttr) -> Result<Attr, FsError> {
        let p = self.norm("change attributes of", raw)?;
        let dir_req = Request::DirSetAttr { path: p.clone(), set: set.clone() };
        let Some((parent, _)) = path::split(&p) else {
            return expect_attr(self.rpc("change attributes of", raw, self.home("/"), dir_req).await?, raw);
        };
        let req = Request::SetAttr { path: p.clone(), set };
        match self.rpc("change attributes of", raw, self.home(parent), req).await? {
            Reply::IsDir { .. } => {
                expect_attr(self.rpc("change attributes of", raw, self.home(&p), dir_req).await?, raw)
            }
            r => expect_attr(r, raw),
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
        let (p, parent) = self.target("create symbolic link", link, Errno::EEXIST)?;
        if target.is_empty() || target.len() > path::MAX_PATH_LEN || target.contains('\0') {
            let errno = if target.len() > path::MAX_PATH_LEN { Errno::ENAMETOOLONG } else { Errno::EINVAL };
            return Err(FsError::new("create symbolic link", link, errno).with_detail("bad target"));
        }
        let req = Request::Symlink { path: p, target: target.to_string(), uid: self.opts.uid, gid: self.opts.gid };
        expect_attr(self.rpc("create symbolic link", link, self.home(&parent), req).await?, link)
    }

    /// `readlink(2)`.
    pub async fn readlink(&self, raw: &str) -> Result<String, FsError> {
        let p = self.norm("read link", raw)?;
        let Some((parent, _)) = path::split(&p) else {
            return Err(FsError::new("read link", raw, Errno::EINVAL));
        };
        match self.rpc("read link", raw, self.home(parent), Request::Readlink { path: p }).await? {
            Reply::Target(t) => Ok(t),
            other => Err(unexpected(raw, &other)),
        }
    }

    /// Totals over all servers (`statfs(2)`).
    pub async fn statfs(&self) -> Result<Statfs, FsError> {
        let mut total = Statfs::default();
        for s in &self.map.servers {
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
            Reply::Status(s) => Ok(s),
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
        for s in &self.map.servers {
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

fn expect_attr(r: Reply, raw: &str) -> Result<Attr, FsError> {
    match r {
        Reply::Attr(a) => Ok(a),
        other => Err(unexpected(raw, &other)),
    }
}

pub(crate) fn expect_batch(r: Reply, raw: &str) -> Result<plusfs_proto::BatchReply, FsError> {
    match r {
        Reply::Batch(b) => Ok(b),
        other => Err(unexpected(raw, &other)),
    }
}

fn unexpected(raw: &str, r: &Reply) -> FsError {
    FsError::new("use", raw, Errno::EPROTO).with_detail(format!("unexpected reply {r:?}"))
}
