//! Batch-file operations (seed 002 §3): whole small files written and read many at a time.
//!
//! `BatchWrite` (BFOw, Alg. 2): the data of every file of the request goes to the data store
//! in one append — one system call, one `fdatasync` under `sync = always` — and then all
//! their inodes (new pieces, size, times, attributes) and record index entries are written
//! in one store batch. Until that batch commits the new records are unreferenced bytes
//! (garbage for compaction), so after a crash each file is either wholly new or untouched.
//!
//! `BatchRead` (BFOr, Alg. 1): the entries are looked up in one batched read, the extents
//! of all files are sorted by (segment, offset) and read with neighbours merged within the
//! cluster's `merge_gap_bytes` (the ORDER_LIST), and each file's bytes come back whole.
//! Phase 1 (layouts) and phase 2 (data) run inside one request on the server that holds
//! the entries, so a batch costs one message pair per server. A reply stops near the
//! `max_bytes` the client asked for (its buffer); the rest is asked for again.
//!
//! Pieces on other servers (chunks of large files, files written before their directory
//! was distributed) are fetched with one `DataGet` per server. Hard-linked files (whose
//! inode is elsewhere) are read and written one by one by the client, and so are writes of
//! files over `small_file_bytes`.

use crate::batch::Batches;
use crate::engine::attrs::count_entry;
use crate::engine::call::Call;
use crate::engine::errors::{check_dir_path, eio, err, OpError, OpResult};
use crate::engine::host::Via;
use crate::engine::perm;
use crate::engine::Engine;
use crate::filedata::FileData;
use crate::hugedir::HugeDirs;
use plusfs_proto::filedata::records;
use plusfs_proto::path::check_name;
use plusfs_proto::{
    Attr, BatchReply, Errno, FileKind, FileRead, FileWrite, Inode, Piece, Reply, Semantics, Timespec, MAY_READ,
    MAY_WRITE,
};
use plusfs_store::Batch;
use std::collections::HashSet;
use std::sync::Arc;

/// Most file bytes in one `BatchRead` reply, whatever the client asks (frames are at most
/// 16 MiB); a file bigger than this, or than the client's `max_bytes`, is read alone.
const MAX_REPLY_BYTES: u64 = 12 << 20;

/// Batch-file operations (BFO): reads and writes of many small files in one request.
pub(crate) struct Bfo {
    engine: Arc<Engine>,
    batches: Arc<Batches>,
    filedata: Arc<FileData>,
    hugedirs: Arc<HugeDirs>,
}

impl Bfo {
    pub(crate) fn new(
        engine: Arc<Engine>,
        batches: Arc<Batches>,
        filedata: Arc<FileData>,
        hugedirs: Arc<HugeDirs>,
    ) -> Bfo {
        Bfo { engine, batches, filedata, hugedirs }
    }
}

impl Bfo {
    /// `BatchWrite`: creates or replaces the files, data in one append, inodes in one batch.
    pub(crate) async fn batch_write(
        self: &Arc<Self>,
        dir: &str,
        files: Vec<FileWrite>,
        semantics: Semantics,
        via: Via,
        c: &Call,
    ) -> OpResult<Reply> {
        check_dir_path(dir)?;
        let guard = self.batches.lock_names(dir, files.iter().map(|f| f.name.as_str())).await;
        let mut host = self.engine.host(dir, via)?;
        if !host.shard && self.engine.over_threshold(&host.obj) {
            drop(guard);
            let info = self.hugedirs.distribute(dir).await?;
            return Err(OpError::Redirect(Box::new(info.unwrap_or_else(|| self.engine.dist_info(dir, &host.obj)))));
        }
        perm::check_search(c, &host.obj, dir)?;
        let may_create = perm::check_dir_write(c, &host.obj, dir).is_ok();
        let names: Vec<&str> = files.iter().map(|f| f.name.as_str()).collect();
        let found: Vec<Option<Inode>> = {
            let valid: Vec<&str> = names.iter().copied().filter(|n| check_name(n).is_ok()).collect();
            let mut got = self.engine.store().get_entries(host.obj.ino, &valid).map_err(eio)?.into_iter();
            names.iter().map(|n| if check_name(n).is_ok() { got.next().flatten() } else { None }).collect()
        };
        // Decide every file first: (index, current inode) of those to store.
        let mut errnos = vec![Errno::OK; files.len()];
        let mut todo: Vec<(usize, Option<Inode>)> = Vec::new();
        let mut seen = HashSet::new();
        let small = self.engine.map().data.small_file_bytes;
        for (i, f) in files.iter().enumerate() {
            let e = match (&found[i], check_name(&f.name)) {
                (_, Err(e)) => e.errno,
                _ if !seen.insert(f.name.as_str()) => Errno::EINVAL,
                _ if f.data.len() as u64 > small => Errno::EFBIG,
                (Some(e), _) if e.kind == FileKind::Dir => Errno::EISDIR,
                (Some(e), _) if e.kind != FileKind::File => Errno::EINVAL,
                // A hard-linked file's inode is elsewhere: the client writes it alone.
                (Some(e), _) if e.link_home.is_some() => Errno::EXDEV,
                (Some(e), _) if !perm::may_acl(c, e.mode, e.uid, e.gid, e.access_acl().as_ref(), MAY_WRITE) => {
                    Errno::EACCES
                }
                (None, _) if !may_create => Errno::EACCES,
                (cur, _) => {
                    todo.push((i, cur.clone()));
                    continue;
                }
            };
            errnos[i] = e;
            if semantics == Semantics::StopOnFailure {
                errnos[i + 1..].iter_mut().for_each(|x| *x = Errno::ECANCELED);
                break;
            }
        }
        // Phase 1: every file's bytes in one append.
        let mut inos = Vec::with_capacity(todo.len());
        for (_, cur) in &todo {
            inos.push(match cur {
                Some(e) => e.ino,
                None => self.engine.new_ino().await?,
            });
        }
        let gate = self.engine.data_gate().read().await;
        let stored: Vec<usize> = todo.iter().map(|t| t.0).filter(|&i| !files[i].data.is_empty()).collect();
        let owners: Vec<u64> =
            todo.iter().zip(&inos).filter(|((i, _), _)| !files[*i].data.is_empty()).map(|(_, o)| *o).collect();
        let data = self.engine.data().clone();
        let (files, extents) = tokio::task::spawn_blocking(move || {
            let recs: Vec<(u64, &[u8])> =
                stored.iter().zip(&owners).map(|(&i, &o)| (o, files[i].data.as_slice())).collect();
            let r = if recs.is_empty() { Ok(Vec::new()) } else { data.append_records(&recs) };
            (files, r)
        })
        .await
        .map_err(|e| err(Errno::EIO, format!("data task failed: {e}")))?;
        let mut extents = extents.map_err(crate::filedata::data_err)?.into_iter();
        // Phase 2: all inodes and index entries in one store write.
        let mut b = Batch::counted();
        let mut remote = Vec::new();
        let mut attrs = Vec::with_capacity(todo.len());
        let now = Timespec::now();
        for ((i, cur), ino) in todo.into_iter().zip(inos) {
            let f = &files[i];
            let new = cur.is_none();
            let mut inode = match cur {
                Some(e) => e,
                None => {
                    count_entry(&mut host.obj, FileKind::File, 1);
                    Inode::new(ino, FileKind::File, f.mode, f.uid, f.gid)
                }
            };
            let before = records(&inode.pieces);
            inode.pieces.clear();
            if !f.data.is_empty() {
                let extent = extents.next().ok_or_else(|| err(Errno::EIO, "fewer extents than records"))?;
                let id = self.engine.index_record(extent, ino, &mut b).await?;
                inode.pieces.push(Piece {
                    file_off: 0,
                    len: f.data.len() as u64,
                    server: self.engine.id(),
                    record: id,
                    skip: 0,
                });
            }
            remote.extend(self.engine.drop_unused(&before, &Default::default(), &mut b)?);
            inode.size = f.data.len() as u64;
            if new {
                // Root records the owner it asks for (`new_owner`); everyone inherits.
                let n = perm::new_entry(c, &host.obj, (f.uid, f.gid), f.mode, FileKind::File);
                (inode.uid, inode.gid, inode.mode, inode.xattrs) = (n.uid, n.gid, n.mode, n.xattrs);
            } else if c.is_root() {
                (inode.mode, inode.uid, inode.gid) = (f.mode & 0o7777, f.uid, f.gid);
                plusfs_proto::acl::chmod_xattrs(&mut inode.xattrs, inode.mode);
            } else {
                // An unprivileged writer keeps the owner; setuid goes as with any write.
                inode.mode = perm::kill_suid(inode.mode);
            }
            inode.mtime = f.mtime.unwrap_or(now);
            inode.atime = inode.mtime;
            inode.ctime = now;
            b.put_entry(host.obj.ino, &f.name, &inode);
            attrs.push(Attr::of_inode(&inode));
        }
        let answer = Reply::Batch(BatchReply { errnos, attrs, dist: None });
        if matches!(&answer, Reply::Batch(r) if !r.attrs.is_empty()) {
            host.obj.mtime = now;
            host.obj.ctime = now;
            host.save(&mut b, dir);
            // Recorded with the files: a resend after another client renamed one of them
            // gets this answer, it does not write the file again.
            c.answer_with_next_batch(&Ok(answer.clone()));
            self.engine.apply_for(c, b).await?;
        }
        drop(gate);
        drop(guard);
        self.filedata.drop_remote(remote).await;
        if !host.shard && self.engine.over_threshold(&host.obj) {
            self.hugedirs.ensure_distributing(dir);
        }
        Ok(answer)
    }

    /// `BatchRead`: whole files, extents read in on-disk order with near ones merged.
    pub(crate) async fn batch_read(
        self: &Arc<Self>,
        dir: &str,
        names: &[String],
        max_bytes: u64,
        via: Via,
        c: &Call,
    ) -> OpResult<Reply> {
        check_dir_path(dir)?;
        let max_bytes = max_bytes.min(MAX_REPLY_BYTES);
        let d = self.engine.host(dir, via)?.obj;
        perm::check_search(c, &d, dir)?;
        let valid: Vec<&str> = names.iter().map(String::as_str).filter(|n| check_name(n).is_ok()).collect();
        let mut found = self.engine.store().get_entries(d.ino, &valid).map_err(eio)?.into_iter();
        let mut out: Vec<FileRead> = Vec::with_capacity(names.len());
        // Phase 1: the layout of every file; (file, piece) pairs to read.
        let mut wanted: Vec<(usize, Piece)> = Vec::new();
        let mut total = 0u64;
        for name in names {
            let entry = if check_name(name).is_ok() { found.next().flatten() } else { None };
            let r = match entry {
                _ if check_name(name).is_err() => FileRead::Failed(Errno::EINVAL),
                None => FileRead::Failed(Errno::ENOENT),
                Some(e) if e.kind == FileKind::Dir => FileRead::Failed(Errno::EISDIR),
                Some(e) if e.kind != FileKind::File => FileRead::Failed(Errno::EINVAL),
                Some(e)
                    if e.link_home.is_none()
                        && !perm::may_acl(c, e.mode, e.uid, e.gid, e.access_acl().as_ref(), MAY_READ) =>
                {
                    FileRead::Failed(Errno::EACCES)
                }
                // Hard links, and files too big for one reply, are read on their own.
                Some(e) if e.link_home.is_some() || e.size > max_bytes => FileRead::Alone,
                Some(e) if total + e.size > max_bytes => FileRead::NotRead,
                Some(e) => {
                    total += e.size;
                    wanted.extend(e.pieces.iter().map(|p| (out.len(), *p)));
                    FileRead::Data { attr: Attr::of_inode(&e), data: vec![0; e.size as usize] }
                }
            };
            out.push(r);
        }
        // Phase 2: this server's extents in one sorted, merged pass; pieces on other servers
        // (files written before their directory was distributed, chunks of large files)
        // with one `DataGet` per server, in parallel.
        let pieces = self.fetch_pieces(&wanted).await?;
        for ((file, piece), bytes) in wanted.iter().zip(pieces) {
            if let FileRead::Data { data, .. } = &mut out[*file] {
                let at = piece.file_off as usize;
                data[at..at + bytes.len()].copy_from_slice(&bytes);
            }
        }
        Ok(Reply::Files(out))
    }

    /// The bytes of `(file, piece)` pairs, in order: local pieces in one merged pass,
    /// remote ones with one `DataGet` per server, all at once.
    async fn fetch_pieces(self: &Arc<Self>, wanted: &[(usize, Piece)]) -> OpResult<Vec<bytes::Bytes>> {
        let mut by_server: std::collections::BTreeMap<plusfs_proto::ServerId, Vec<usize>> = Default::default();
        for (i, (_, p)) in wanted.iter().enumerate() {
            by_server.entry(p.server).or_default().push(i);
        }
        let fetches = by_server.into_iter().map(|(server, idx)| async move {
            let ranges: Vec<(u64, u64, u64)> =
                idx.iter().map(|&i| (wanted[i].1.record, wanted[i].1.skip, wanted[i].1.len)).collect();
            let parts = self.filedata.fetch_ranges(server, ranges).await?;
            Ok::<_, plusfs_proto::WireError>(idx.into_iter().zip(parts).collect::<Vec<_>>())
        });
        let mut out = vec![bytes::Bytes::new(); wanted.len()];
        for r in futures::future::join_all(fetches).await {
            for (i, bytes) in r? {
                out[i] = bytes;
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use crate::engine::host::Via;
    use crate::testkit::{root, Kit};
    use plusfs_proto::{FileRead, FileWrite, Reply, Semantics};

    #[tokio::test]
    async fn files_written_in_one_batch_read_back_in_one() {
        let kit = Kit::new().await;
        let files: Vec<FileWrite> = (0..3)
            .map(|i| FileWrite {
                name: format!("b{i}"),
                data: vec![b'a' + i as u8; 100 * (i + 1)],
                mode: 0o644,
                uid: 0,
                gid: 0,
                mtime: None,
            })
            .collect();
        let bfo = &kit.osd.bfo;
        bfo.batch_write("/", files.clone(), Semantics::PerformAll, Via::Home, &root()).await.unwrap();
        let kit = kit.crash_and_restart().await;
        let names: Vec<String> = files.iter().map(|f| f.name.clone()).collect();
        let got = kit.osd.bfo.batch_read("/", &names, 1 << 20, Via::Home, &root()).await.unwrap();
        let Reply::Files(read) = got else { panic!("{got:?}") };
        for (f, r) in files.iter().zip(read) {
            assert!(matches!(&r, FileRead::Data { data, .. } if *data == f.data), "{}: {r:?}", f.name);
        }
    }
}
