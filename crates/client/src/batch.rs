//! Batch operations: one operation on many entries of a directory (seed 000 §3).
//!
//! A batch is split by server ([`Client::route_batch`]: the directory's home, or for a
//! distributed directory the storing servers by Eq. 2), each server's part is cut into
//! requests of at most `max_batch` entries and a few MiB, the parts go out in parallel, and
//! the results come back in the caller's order (seed 000 §3.1, Fig. 6). Entries a server
//! hands back (redirect, directory distributed midway, stale cache) are routed again.

use crate::error::FsError;
use crate::fs::Client;
use crate::routing::Reroute;
use crate::types::OpenFlags;
use futures::future::join_all;
use plusfs_proto::path;
use plusfs_proto::{Attr, BatchOp, BatchReply, Errno, FileKind, Ino, Reply, Request, Semantics, ServerId, WireError};

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

impl Client {
    /// Which server holds which entries of `dir`: (server, shard incarnation, indexes into
    /// `names`) for the entries `idx`. A directory this client knows to be distributed is
    /// split by Eq. 2 (seed 000 Fig. 6); any other goes whole to its home.
    pub fn route_batch(&self, dir: &str, names: &[String], idx: &[usize]) -> Vec<(ServerId, Option<u64>, Vec<usize>)> {
        let mut parts: Vec<(ServerId, Option<u64>, Vec<usize>)> = Vec::new();
        for &i in idx {
            let (server, shard) = self.locate(dir, &names[i]);
            match parts.iter_mut().find(|p| p.0 == server) {
                Some(p) => p.2.push(i),
                None => parts.push((server, shard, vec![i])),
            }
        }
        parts
    }

    /// Runs one batch operation and returns one outcome per name, in the caller's order.
    /// `Err` only when the directory itself cannot be used (it does not exist, is not a
    /// directory, or its path is invalid). Entries a server sends back (the directory is
    /// distributed, became distributed midway, or the cached distribution was stale) are
    /// routed again and sent to their storing servers.
    pub async fn batch(
        &self,
        op: BatchOp,
        dir_raw: &str,
        names: &[String],
        mode: u32,
        semantics: Semantics,
    ) -> Result<Vec<Outcome>, FsError> {
        let verb = batch_verb(op);
        let dir = self.norm(verb, dir_raw)?;
        let mut out = vec![Outcome::NotPerformed; names.len()];
        let mut pending: Vec<usize> = (0..names.len()).collect();
        if op == BatchOp::Stat && semantics == Semantics::PerformAll {
            if let Some(known) = self.deleg_statv(dir_raw, &dir, names).await {
                pending.clear();
                for (i, k) in known?.into_iter().enumerate() {
                    match k {
                        Some(Ok(a)) => out[i] = Outcome::Done(Some(a)),
                        Some(Err(e)) => out[i] = Outcome::Failed(e),
                        None => pending.push(i),
                    }
                }
            }
        }
        let mut waiting = crate::routing::distribution_wait();
        let mut rounds = 0;
        while rounds < MAX_ROUNDS {
            if pending.is_empty() {
                break;
            }
            let parts = self.route_batch(&dir, names, &pending);
            let replies = join_all(parts.into_iter().map(|(server, shard, idx)| {
                let dir = dir.clone();
                async move {
                    let part = Part { op, dir: &dir, names, server, shard, mode, semantics };
                    self.batch_on_server(&part, &idx).await
                }
            }))
            .await;
            pending.clear();
            let mut wait = false;
            for r in replies {
                let r = r?;
                for (i, o) in r.done {
                    out[i] = o;
                }
                pending.extend(r.redo);
                if let Some(e) = r.error {
                    match self.reroute(&dir, e.1, e.0) {
                        Reroute::Retry => {}
                        Reroute::Wait => wait = true,
                        Reroute::Fail(e) => return Err(self.server_error(verb, dir_raw, e).await),
                    }
                }
            }
            pending.sort_unstable();
            if wait && !pending.is_empty() {
                if !waiting.wait().await {
                    break;
                }
            } else {
                rounds += 1;
            }
        }
        if !pending.is_empty() {
            let detail = "the directory's distribution kept changing";
            return Err(FsError::new(verb, dir_raw, Errno::EAGAIN).with_detail(detail));
        }
        if op == BatchOp::Stat {
            self.fill_dir_attrs(&dir, names, &mut out).await;
        }
        Ok(out)
    }

    /// One server's part: cut into requests; under perform-all they are pipelined, under
    /// stop-on-failure sent one after another until one reports a failure. Entries not
    /// performed because of routing come back in `redo`.
    async fn batch_on_server(&self, part: &Part<'_>, idx: &[usize]) -> Result<PartResult, FsError> {
        let chunks = self.cut(part.names, idx);
        let request = |chunk: &[usize]| {
            let req = Request::Batch {
                op: part.op,
                dir: part.dir.to_string(),
                names: chunk.iter().map(|&i| part.names[i].clone()).collect(),
                mode: part.mode & 0o7777,
                uid: self.opts.uid,
                gid: self.opts.gid,
                semantics: part.semantics,
            };
            Client::addressed(req, part.shard)
        };
        let mut result = PartResult::default();
        let verb = batch_verb(part.op);
        match part.semantics {
            Semantics::PerformAll => {
                let replies =
                    join_all(chunks.iter().map(|c| async move { self.raw_call(verb, part.server, &request(c)).await }))
                        .await;
                for (chunk, reply) in chunks.iter().zip(replies) {
                    result.absorb(chunk, reply?, part);
                }
            }
            Semantics::StopOnFailure => {
                let mut stopped = false;
                for chunk in &chunks {
                    if stopped {
                        result.done.extend(chunk.iter().map(|&i| (i, Outcome::NotPerformed)));
                        continue;
                    }
                    let reply = self.raw_call(verb, part.server, &request(chunk)).await?;
                    stopped = result.absorb(chunk, reply, part);
                }
            }
        }
        Ok(result)
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
                if let Some(a) = self.deleg_dir_attr(&p).await {
                    return Ok(Reply::Attr(a));
                }
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
        let dir_n = self.norm("open", dir)?;
        let out = self.batch(op, dir, names, mode, semantics).await?;
        Ok(out
            .into_iter()
            .zip(names)
            .map(|(o, name)| {
                let attr = o.into_result()?.ok_or(Errno::EPROTO)?;
                Ok(self.fds.insert(crate::types::FileHandle {
                    path: path::join(&dir_n, name),
                    ino: attr.ino,
                    server: self.locate(&dir_n, name).0,
                    attr,
                    append: flags.append,
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

/// How many rounds of re-routing a batch goes through before giving up (EAGAIN).
pub(crate) const MAX_ROUNDS: usize = 12;

/// What one server's share of a batch is about.
struct Part<'a> {
    op: BatchOp,
    dir: &'a str,
    names: &'a [String],
    server: ServerId,
    shard: Option<u64>,
    mode: u32,
    semantics: Semantics,
}

/// What came back from one server's share.
#[derive(Default)]
struct PartResult {
    /// Outcomes of the entries this server decided.
    done: Vec<(usize, Outcome)>,
    /// Entries to route again.
    redo: Vec<usize>,
    /// A routing error (redirect, stale cache) with the shard incarnation it was sent with.
    error: Option<(WireError, Option<u64>)>,
}

impl PartResult {
    /// Takes one request's reply; true when it reports a failed entry (stop-on-failure).
    fn absorb(&mut self, chunk: &[usize], reply: Result<Reply, (WireError, Option<u64>)>, part: &Part) -> bool {
        match reply {
            Ok(Reply::Batch(b)) => {
                let performed = b.errnos.len().min(chunk.len());
                let failed = b.errnos.iter().any(|e| *e != Errno::OK);
                let learnt = b.dist.clone();
                let outs = outcomes(chunk.len(), b, part.op);
                match learnt {
                    // The directory became distributed midway: the rest goes to its storing servers.
                    Some(info) => {
                        self.done.extend(chunk[..performed].iter().copied().zip(outs));
                        self.redo.extend(&chunk[performed..]);
                        if self.error.is_none() {
                            self.error = Some((WireError::redirect(info), None));
                        }
                    }
                    None => self.done.extend(chunk.iter().copied().zip(outs)),
                }
                failed
            }
            Ok(other) => {
                let e = WireError::new(Errno::EPROTO, format!("unexpected reply {other:?}"));
                self.error = Some((e, None));
                self.redo.extend(chunk);
                false
            }
            Err((e, _)) => {
                self.redo.extend(chunk);
                self.error = Some((e, part.shard));
                false
            }
        }
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
