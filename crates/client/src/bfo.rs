//! Batch-file I/O (seed 002 §3): whole files written and read many at a time.
//!
//! [`Client::batch_write`] groups files by directory and by the server holding their
//! entries (the directory's home, or Eq. 2 for a distributed directory) and sends each
//! server its files' contents in `BatchWrite` requests of up to [`REQUEST_BYTES`]; every
//! request is one data append and one store write on the server. [`Client::batch_read`]
//! does the same with `BatchRead`, each request asking for at most a share of the caller's
//! buffer. Requests to different servers and directories are in flight together. Files
//! over the cluster's `small_file_bytes`, and hard-linked files, go one by one through the
//! ordinary calls.

use crate::error::FsError;
use crate::fs::Client;
use crate::routing::Reroute;
use futures::stream::{self, StreamExt};
use plusfs_proto::path;
use plusfs_proto::{Attr, Errno, FileRead, FileWrite, Reply, Request, Semantics, ServerId, Timespec, WireError};
use std::collections::BTreeMap;

/// Most file bytes in one batch request.
pub const REQUEST_BYTES: usize = 8 << 20;
/// Most files in one batch request.
const REQUEST_FILES: usize = 1024;
/// Batch requests in flight at once.
const IN_FLIGHT: usize = 8;
/// Default reply budget of a batch read (seed 002 §5.4: 64 MiB buffers).
pub const DEFAULT_READ_BUFFER: u64 = 64 << 20;

/// A file for [`Client::batch_write`]: its path, whole contents and attributes.
#[derive(Debug, Clone)]
pub struct NewFile {
    pub path: String,
    pub data: Vec<u8>,
    pub mode: u32,
    /// Owner and group; `None`: the client's.
    pub owner: Option<(u32, u32)>,
    /// Modification time to record; `None`: now.
    pub mtime: Option<Timespec>,
}

impl NewFile {
    /// A file with mode 0644, the client's owner, and the current time.
    pub fn new(path: impl Into<String>, data: Vec<u8>) -> NewFile {
        NewFile { path: path.into(), data, mode: 0o644, owner: None, mtime: None }
    }
}

/// Files of one directory, by index into the caller's list.
type DirGroups = BTreeMap<String, Vec<(usize, String)>>;
/// A file's index in the caller's list and its name in its directory.
type Member = (usize, String);
/// One request's worth of files for a server (and shard incarnation).
type Chunk<'a> = (ServerId, Option<u64>, Vec<&'a Member>);
/// A file read whole: its attributes and bytes.
pub type FileContents = (Attr, Vec<u8>);

impl Client {
    /// Splits normalised paths by parent directory; bad paths fail at once.
    fn group_by_dir<T>(&self, op: &'static str, paths: &[&str], out: &mut [Option<Result<T, FsError>>]) -> DirGroups {
        let mut groups = DirGroups::new();
        for (i, raw) in paths.iter().enumerate() {
            match self.norm(op, raw) {
                Err(e) => out[i] = Some(Err(e)),
                Ok(p) => match path::split(&p) {
                    Some((d, n)) => groups.entry(d.to_string()).or_default().push((i, n.to_string())),
                    None => out[i] = Some(Err(FsError::new(op, *raw, Errno::EISDIR))),
                },
            }
        }
        groups
    }

    /// BFOw: creates or replaces every file with its contents, attributes and time. One
    /// result per file, in order.
    pub async fn batch_write(&self, files: Vec<NewFile>) -> Vec<Result<Attr, FsError>> {
        let small = self.map().data.small_file_bytes as usize;
        let paths: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
        let mut out: Vec<Option<Result<Attr, FsError>>> = (0..files.len()).map(|_| None).collect();
        let groups = self.group_by_dir("write", &paths, &mut out);
        let mut alone = Vec::new();
        let mut requests = Vec::new();
        for (dir, members) in groups {
            let (big, batched): (Vec<_>, Vec<_>) = members.into_iter().partition(|(i, _)| files[*i].data.len() > small);
            alone.extend(big.into_iter().map(|(i, _)| i));
            requests.push((dir, batched));
        }
        let files = &files;
        // Futures are built first, not in a stream closure, so the returned future is `Send`.
        let writes: Vec<_> = requests
            .into_iter()
            .map(|(dir, members)| async move { self.write_dir(&dir, &members, files).await })
            .collect();
        let results: Vec<Vec<(usize, Result<Attr, Errno>)>> =
            stream::iter(writes).buffer_unordered(IN_FLIGHT).collect().await;
        for (i, r) in results.into_iter().flatten() {
            match r {
                Ok(a) => out[i] = Some(Ok(a)),
                // Not in the entry's server (a hard link): written on its own below.
                Err(Errno::EXDEV) => alone.push(i),
                Err(e) => out[i] = Some(Err(FsError::new("write", files[i].path.clone(), e))),
            }
        }
        let singles: Vec<_> =
            alone.into_iter().map(|i| async move { (i, self.write_whole(&files[i]).await) }).collect();
        let singles: Vec<(usize, Result<Attr, FsError>)> =
            stream::iter(singles).buffer_unordered(IN_FLIGHT).collect().await;
        for (i, r) in singles {
            out[i] = Some(r);
        }
        out.into_iter().map(|r| r.expect("every file has a result")).collect()
    }

    /// One file through the ordinary calls: create (truncating an existing file), write,
    /// and attributes only where they differ from what `create` gave.
    async fn write_whole(&self, f: &NewFile) -> Result<Attr, FsError> {
        let c = match f.owner {
            Some((uid, gid)) => self.as_owner(uid, gid),
            None => self.clone(),
        };
        let mut attr = c.create(&f.path, f.mode, false).await?.attr;
        if attr.size > 0 {
            attr = c.truncate(&f.path, 0).await?;
        }
        if !f.data.is_empty() {
            attr = c.write(&f.path, 0, &f.data).await?;
        }
        let mut set = plusfs_proto::SetAttr::default();
        if attr.mode & 0o7777 != f.mode & 0o7777 {
            set.mode = Some(f.mode);
        }
        if let Some((uid, gid)) = f.owner.filter(|o| *o != (attr.uid, attr.gid)) {
            (set.uid, set.gid) = (Some(uid), Some(gid));
        }
        if let Some(t) = f.mtime {
            set.mtime = Some(plusfs_proto::TimeSet::At(t));
            set.atime = Some(plusfs_proto::TimeSet::At(t));
        }
        if set == plusfs_proto::SetAttr::default() {
            return Ok(attr);
        }
        c.setattr(&f.path, set).await
    }

    /// The batched files of one directory: routed per server, re-routed after redirects.
    async fn write_dir(
        &self,
        dir: &str,
        members: &[(usize, String)],
        files: &[NewFile],
    ) -> Vec<(usize, Result<Attr, Errno>)> {
        let mut done = Vec::with_capacity(members.len());
        let mut pending: Vec<&(usize, String)> = members.iter().collect();
        for _ in 0..super::batch::MAX_ROUNDS {
            if pending.is_empty() {
                break;
            }
            let chunks = self.route_chunks(dir, &pending, |m| files[m.0].data.len());
            let calls: Vec<_> = chunks
                .into_iter()
                .map(|(server, shard, chunk)| async move {
                    let req = Request::BatchWrite {
                        dir: dir.to_string(),
                        files: chunk
                            .iter()
                            .map(|(i, name)| {
                                let f = &files[*i];
                                let (uid, gid) = f.owner.unwrap_or((self.opts.uid, self.opts.gid));
                                FileWrite {
                                    name: name.clone(),
                                    data: f.data.clone(),
                                    mode: f.mode & 0o7777,
                                    uid,
                                    gid,
                                    mtime: f.mtime,
                                }
                            })
                            .collect(),
                        semantics: Semantics::PerformAll,
                    };
                    let r = self.raw_call("write", server, &Client::addressed(req, shard)).await;
                    (shard, chunk, r)
                })
                .collect();
            let replies: Vec<_> = stream::iter(calls).buffer_unordered(IN_FLIGHT).collect().await;
            pending.clear();
            for (shard, chunk, reply) in replies {
                match reply {
                    Ok(Ok(Reply::Batch(b))) => {
                        let mut attrs = b.attrs.into_iter();
                        for (m, e) in chunk.iter().zip(b.errnos) {
                            let r = if e == Errno::OK { attrs.next().ok_or(Errno::EPROTO) } else { Err(e) };
                            done.push((m.0, r));
                        }
                    }
                    Ok(Ok(_)) => done.extend(chunk.iter().map(|m| (m.0, Err(Errno::EPROTO)))),
                    Ok(Err((e, _))) => self.reroute_chunk(dir, shard, e, chunk, &mut pending, &mut done).await,
                    Err(e) => done.extend(chunk.iter().map(|m| (m.0, Err(e.errno)))),
                }
            }
        }
        done.extend(pending.iter().map(|m| (m.0, Err(Errno::EAGAIN))));
        done
    }

    /// Routes `members` of `dir` to servers and cuts each server's share into requests
    /// of at most [`REQUEST_FILES`] files and [`REQUEST_BYTES`] bytes (by `size`).
    fn route_chunks<'a>(
        &self,
        dir: &str,
        members: &[&'a (usize, String)],
        size: impl Fn(&(usize, String)) -> usize,
    ) -> Vec<Chunk<'a>> {
        let mut per_server: Vec<Chunk<'a>> = Vec::new();
        for m in members {
            let (server, shard) = self.locate(dir, &m.1);
            match per_server.iter_mut().find(|p| p.0 == server) {
                Some(p) => p.2.push(m),
                None => per_server.push((server, shard, vec![m])),
            }
        }
        let mut out = Vec::new();
        for (server, shard, ms) in per_server {
            let (mut cur, mut bytes) = (Vec::new(), 0);
            for m in ms {
                let n = size(m) + m.1.len();
                if !cur.is_empty() && (cur.len() == REQUEST_FILES || bytes + n > REQUEST_BYTES) {
                    out.push((server, shard, std::mem::take(&mut cur)));
                    bytes = 0;
                }
                cur.push(m);
                bytes += n;
            }
            if !cur.is_empty() {
                out.push((server, shard, cur));
            }
        }
        out
    }

    /// BFOr: the whole contents (and attributes) of every file, in order. `buffer` bounds
    /// the bytes asked of the servers at once (default [`DEFAULT_READ_BUFFER`]).
    pub async fn batch_read(&self, paths: &[String], buffer: u64) -> Vec<Result<FileContents, FsError>> {
        let raw: Vec<&str> = paths.iter().map(String::as_str).collect();
        let mut out: Vec<Option<Result<FileContents, FsError>>> = (0..paths.len()).map(|_| None).collect();
        let groups = self.group_by_dir("read", &raw, &mut out);
        let share = (buffer.max(1 << 20) / IN_FLIGHT as u64).max(1 << 20);
        let reads: Vec<_> = groups
            .into_iter()
            .map(|(dir, members)| async move { self.read_dir(&dir, &members, share).await })
            .collect();
        let results: Vec<Vec<(usize, Result<FileContents, Errno>)>> =
            stream::iter(reads).buffer_unordered(IN_FLIGHT).collect().await;
        let mut alone = Vec::new();
        for (i, r) in results.into_iter().flatten() {
            match r {
                Ok(x) => out[i] = Some(Ok(x)),
                Err(Errno::EXDEV) => alone.push(i),
                Err(e) => out[i] = Some(Err(FsError::new("read", paths[i].clone(), e))),
            }
        }
        let singles: Vec<_> = alone
            .into_iter()
            .map(|i| async move {
                let r = async {
                    let attr = self.lstat(&paths[i]).await?;
                    let data = self.read(&paths[i], 0, attr.size as usize).await?;
                    Ok((attr, data))
                };
                (i, r.await)
            })
            .collect();
        let singles: Vec<(usize, Result<FileContents, FsError>)> =
            stream::iter(singles).buffer_unordered(IN_FLIGHT).collect().await;
        for (i, r) in singles {
            out[i] = Some(r);
        }
        out.into_iter().map(|r| r.expect("every file has a result")).collect()
    }

    /// The files of one directory: one request per server at a time, each asking for at
    /// most `share` bytes, repeated for files a full reply did not reach. Files to read
    /// alone come back as `EXDEV`.
    async fn read_dir(
        &self,
        dir: &str,
        members: &[(usize, String)],
        share: u64,
    ) -> Vec<(usize, Result<FileContents, Errno>)> {
        let mut done = Vec::with_capacity(members.len());
        let mut pending: Vec<&(usize, String)> = members.iter().collect();
        let mut rounds = 0;
        while !pending.is_empty() && rounds < super::batch::MAX_ROUNDS * 64 {
            rounds += 1;
            let chunks = self.route_chunks(dir, &pending, |_| 0);
            let calls: Vec<_> = chunks
                .into_iter()
                .map(|(server, shard, chunk)| async move {
                    let req = Request::BatchRead {
                        dir: dir.to_string(),
                        names: chunk.iter().map(|m| m.1.clone()).collect(),
                        max_bytes: share,
                    };
                    let r = self.raw_call("read", server, &Client::addressed(req, shard)).await;
                    (shard, chunk, r)
                })
                .collect();
            let replies: Vec<_> = stream::iter(calls).buffer_unordered(IN_FLIGHT).collect().await;
            pending.clear();
            for (shard, chunk, reply) in replies {
                match reply {
                    Ok(Ok(Reply::Files(files))) => {
                        for (m, f) in chunk.iter().zip(files) {
                            match f {
                                FileRead::Data { attr, data } => done.push((m.0, Ok((attr, data)))),
                                FileRead::Failed(e) => done.push((m.0, Err(e))),
                                FileRead::Alone => done.push((m.0, Err(Errno::EXDEV))),
                                FileRead::NotRead => pending.push(m),
                            }
                        }
                    }
                    Ok(Ok(_)) => done.extend(chunk.iter().map(|m| (m.0, Err(Errno::EPROTO)))),
                    Ok(Err((e, _))) => self.reroute_chunk(dir, shard, e, chunk, &mut pending, &mut done).await,
                    Err(e) => done.extend(chunk.iter().map(|m| (m.0, Err(e.errno)))),
                }
            }
        }
        done.extend(pending.iter().map(|m| (m.0, Err(Errno::EAGAIN))));
        done
    }

    /// A batch request refused as a whole: route its files again, or fail them.
    async fn reroute_chunk<'a, T>(
        &self,
        dir: &str,
        shard: Option<u64>,
        e: WireError,
        chunk: Vec<&'a (usize, String)>,
        pending: &mut Vec<&'a (usize, String)>,
        done: &mut Vec<(usize, Result<T, Errno>)>,
    ) {
        match self.reroute(dir, shard, e) {
            Reroute::Retry => pending.extend(chunk),
            Reroute::Wait => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                pending.extend(chunk)
            }
            Reroute::Fail(e) => done.extend(chunk.iter().map(|m| (m.0, Err(e.errno)))),
        }
    }
}
