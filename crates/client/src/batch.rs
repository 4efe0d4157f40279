//! Batch operations: one operation on many entries of a directory (seed 000 §3).
//!
//! A batch is split by server ([`Client::route_batch`]: today every entry of a directory
//! lives on the directory's home server; huge directories will split by name), each
//! server's part is cut into requests of at most `max_batch` entries and a few MiB, the
//! parts go out in parallel, and the results come back in the caller's order.

use crate::error::FsError;
use crate::fs::{expect_batch, Client};
use futures::future::join_all;
use plusfs_proto::path;
use plusfs_proto::{Attr, BatchOp, BatchReply, Errno, FileKind, Ino, Reply, Request, Semantics, ServerId};

/// Largest total of name bytes in one batch request (frames stay far below the maximum).
const MAX_BATCH_BYTES: usize = 4 << 20;

/// What happened to one entry of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Performed; the attributes where the operation yields them (create, open, stat, mkdir).
    Done(Option<Attr>),
    Failed(Errno),
    /// Not attempted: an earlier entry on the same server failed under stop-on-failure.
    NotPerformed,
}

impl Outcome {
    /// The entry's result with "not performed" as `ECANCELED`.
    pub fn into_result(self) -> Result<Option<Attr>, Errno> {
        match self {
            Outcome::Done(a) => Ok(a),
            Outcome::Failed(e) => Err(e),
            Outcome::NotPerformed => Err(Errno::ECANCELED),
        }
    }
}

/// `openv` flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpenFlags {
    /// `O_CREAT`.
    pub create: bool,
    /// `O_EXCL` (with `create`).
    pub exclusive: bool,
}

impl Client {
    /// Which server holds which entries of `dir`: (server, indexes into `names`).
    pub fn route_batch(&self, dir: &str, names: &[String]) -> Vec<(ServerId, Vec<usize>)> {
        vec![(self.home(dir), (0..names.len()).collect())]
    }

    /// Runs one batch operation and returns one outcome per name, in the caller's order.
    /// `Err` only when the directory itself cannot be used (it does not exist, is not a
    /// directory, or its path is invalid).
    pub async fn batch(
        &self,
        op: BatchOp,
        dir_raw: &str,
        names: &[String],
        mode: u32,
        semantics: Semantics,
    ) -> Result<Vec<Outcome>, FsError> {
        let verb = batch_verb(op);
        let dir = path::normalize(dir_raw).map_err(|e| FsError::new(verb, dir_raw, e.errno).with_detail(e.reason))?;
        let mut out = vec![Outcome::NotPerformed; names.len()];
        let parts = self.route_batch(&dir, names);
        let replies = join_all(parts.into_iter().map(|(server, idx)| {
            let dir = dir.clone();
            async move {
                let r = self.batch_on_server(op, &dir, dir_raw, names, server, &idx, mode, semantics).await;
                (idx, r)
            }
        }))
        .await;
        for (idx, r) in replies {
            for (i, o) in idx.into_iter().zip(r?) {
                out[i] = o;
            }
        }
        if op == BatchOp::Stat {
            self.fill_dir_attrs(&dir, names, &mut out).await;
        }
        Ok(out)
    }

    /// One server's part: cut into requests; under perform-all they are pipelined, under
    /// stop-on-failure sent one after another until one reports a failure.
    #[allow(clippy::too_many_arguments)]
    async fn batch_on_server(
        &self,
        op: BatchOp,
        dir: &str,
        dir_raw: &str,
        names: &[String],
        server: ServerId,
        idx: &[usize],
        mode: u32,
        semantics: Semantics,
    ) -> Result<Vec<Outcome>, FsError> {
        let chunks = self.cut(names, idx);
        let request = |chunk: &[usize]| Request::Batch {
            op,
            dir: dir.to_string(),
            names: chunk.iter().map(|&i| names[i].clone()).collect(),
            mode: mode & 0o7777,
            uid: self.opts.uid,
            gid: self.opts.gid,
            semantics,
        };
        let mut out = Vec::with_capacity(idx.len());
        match semantics {
            Semantics::PerformAll => {
                let replies =
                    join_all(chunks.iter().map(|c| self.rpc_batch(batch_verb(op), dir_raw, server, request(c)))).await;
                for (chunk, reply) in chunks.iter().zip(replies) {
                    out.extend(outcomes(chunk.len(), reply?, op));
                }
            }
            Semantics::StopOnFailure => {
                for chunk in &chunks {
                    if out.iter().any(|o| matches!(o, Outcome::Failed(_))) {
                        out.extend(std::iter::repeat_n(Outcome::NotPerformed, chunk.len()));
                        continue;
                    }
                    let reply = self.rpc_batch(batch_verb(op), dir_raw, server, request(chunk)).await?;
                    out.extend(outcomes(chunk.len(), reply, op));
                }
            }
        }
        Ok(out)
    }

    async fn rpc_batch(
        &self,
        verb: &'static str,
        shown: &str,
        server: ServerId,
        req: Request,
    ) -> Result<BatchReply, FsError> {
        expect_batch(self.rpc(verb, shown, server, req).await?, shown)
    }

    /// Cuts `idx` into requests of at most `max_batch` entries and [`MAX_BATCH_BYTES`].
    fn cut(&self, names: &[String], idx: &[usize]) -> Vec<Vec<usize>> {
        let max = self.opts.max_batch.max(1);
        let mut chunks = Vec::new();
        let mut cur = Vec::new();
        let mut bytes = 0;
        for &i in idx {
            let len = names[i].len() + 2;
            if !cur.is_empty() && (cur.len() == max || bytes + len > MAX_BATCH_BYTES) {
                chunks.push(std::mem::take(&mut cur));
                bytes = 0;
            }
            cur.push(i);
            bytes += len;
        }
        if !cur.is_empty() {
            chunks.push(cur);
        }
        chunks
    }

    /// `statv` gives subdirectories only their inode number; their attributes live in their
    /// own objects, so fetch those (in parallel).
    async fn fill_dir_attrs(&self, dir: &str, names: &[String], out: &mut [Outcome]) {
        let dirs: Vec<usize> = (0..out.len())
            .filter(|&i| matches!(&out[i], Outcome::Done(Some(a)) if a.kind == FileKind::Dir && a.incarnation == 0))
            .collect();
        let fetched = join_all(dirs.iter().map(|&i| {
            let p = path::join(dir, &names[i]);
            async move {
                let req = Request::DirStat { path: p.clone() };
                self.rpc("stat", &p, self.home(&p), req).await
            }
        }))
        .await;
        for (i, r) in dirs.into_iter().zip(fetched) {
            out[i] = match r {
                Ok(Reply::Attr(a)) => Outcome::Done(Some(a)),
                Ok(_) => Outcome::Failed(Errno::EPROTO),
                Err(e) => Outcome::Failed(e.errno),
            };
        }
    }

    /// `openv`: opens (or, with `flags.create`, creates) files of `dir`; the result of each
    /// entry is a file descriptor of this client.
    pub async fn openv(
        &self,
        dir: &str,
        names: &[String],
        flags: OpenFlags,
        mode: u32,
        semantics: Semantics,
    ) -> Result<Vec<Result<i32, Errno>>, FsError> {
        let op = if flags.create { BatchOp::Create { exclusive: flags.exclusive } } else { BatchOp::Open };
        let dir_n = path::normalize(dir).map_err(|e| FsError::new("open", dir, e.errno))?;
        let out = self.batch(op, dir, names, mode, semantics).await?;
        let server = self.home(&dir_n);
        Ok(out
            .into_iter()
            .zip(names)
            .map(|(o, name)| {
                let attr = o.into_result()?.ok_or(Errno::EPROTO)?;
                Ok(self.fds.insert(crate::fs::FileHandle {
                    path: path::join(&dir_n, name),
                    ino: attr.ino,
                    server,
                    attr,
                }))
            })
            .collect())
    }

    /// `closev`: closes descriptors from `openv`/`open_fd`; unknown ones get `EBADF`.
    pub async fn closev(&self, fds: &[i32], semantics: Semantics) -> Vec<Result<(), Errno>> {
        let mut out: Vec<Result<(), Errno>> = vec![Err(Errno::ECANCELED); fds.len()];
        let mut by_server: std::collections::BTreeMap<ServerId, Vec<(usize, Ino)>> = Default::default();
        for (i, fd) in fds.iter().enumerate() {
            match self.fds.get(*fd) {
                Some(h) => by_server.entry(h.server).or_default().push((i, h.ino)),
                None => {
                    out[i] = Err(Errno::EBADF);
                    if semantics == Semantics::StopOnFailure {
                        return out;
                    }
                }
            }
        }
        let replies = join_all(by_server.into_iter().map(|(server, items)| async move {
            let req = Request::CloseBatch { inos: items.iter().map(|x| x.1).collect(), semantics };
            (items, self.call_server(server, &req).await)
        }))
        .await;
        for (items, reply) in replies {
            let errnos = match reply {
                Ok(Reply::Batch(b)) => b.errnos,
                Ok(_) => vec![Errno::EPROTO; items.len()],
                Err(e) => vec![e.errno; items.len()],
            };
            for ((i, _), e) in items.iter().zip(errnos) {
                out[*i] = if e == Errno::OK { Ok(()) } else { Err(e) };
                if e == Errno::OK {
                    self.fds.remove(fds[*i]);
                }
            }
        }
        out
    }

    /// `statv`: `lstat` of many entries of `dir`.
    pub async fn statv(
        &self,
        dir: &str,
        names: &[String],
        semantics: Semantics,
    ) -> Result<Vec<Result<Attr, Errno>>, FsError> {
        let out = self.batch(BatchOp::Stat, dir, names, 0, semantics).await?;
        Ok(out.into_iter().map(|o| o.into_result().and_then(|a| a.ok_or(Errno::EPROTO))).collect())
    }

    /// `unlinkv`: removes many non-directory entries of `dir`.
    pub async fn unlinkv(
        &self,
        dir: &str,
        names: &[String],
        semantics: Semantics,
    ) -> Result<Vec<Result<(), Errno>>, FsError> {
        let out = self.batch(BatchOp::Unlink, dir, names, 0, semantics).await?;
        Ok(out.into_iter().map(|o| o.into_result().map(drop)).collect())
    }

    /// `mkdirv`: creates many subdirectories of `dir`.
    pub async fn mkdirv(
        &self,
        dir: &str,
        names: &[String],
        mode: u32,
        semantics: Semantics,
    ) -> Result<Vec<Result<Attr, Errno>>, FsError> {
        let out = self.batch(BatchOp::Mkdir, dir, names, mode, semantics).await?;
        Ok(out.into_iter().map(|o| o.into_result().and_then(|a| a.ok_or(Errno::EPROTO))).collect())
    }
}

/// Turns one reply into outcomes for a request of `len` entries.
fn outcomes(len: usize, reply: BatchReply, op: BatchOp) -> Vec<Outcome> {
    let with_attrs = !matches!(op, BatchOp::Unlink);
    let mut attrs = reply.attrs.into_iter();
    let mut out: Vec<Outcome> = reply
        .errnos
        .into_iter()
        .take(len)
        .map(|e| {
            if e != Errno::OK {
                Outcome::Failed(e)
            } else if with_attrs {
                attrs.next().map_or(Outcome::Failed(Errno::EPROTO), |a| Outcome::Done(Some(a)))
            } else {
                Outcome::Done(None)
            }
        })
        .collect();
    out.resize(len, Outcome::NotPerformed);
    out
}

fn batch_verb(op: BatchOp) -> &'static str {
    match op {
        BatchOp::Create { .. } => "create",
        BatchOp::Open => "open",
        BatchOp::Stat => "stat",
        BatchOp::Unlink => "remove",
        BatchOp::Mkdir => "create directory",
    }
}
