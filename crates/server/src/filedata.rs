//! File contents on the server side.
//!
//! A regular file's inode lists its [`Piece`]s; each names a record in some server's data
//! store (`plusfs-data`). That server keeps, in its metadata store, the record's extent
//! (`R<id>`) and a back reference by place (`G<segment><offset>`) for compaction, written in
//! the same store batch as the inode change that starts using the record, so a crash never
//! leaves an inode pointing at a record the server does not know.
//!
//! Placement (cluster map `[data]`): bytes below `small_file_bytes` (1 MiB) are stored by
//! the server holding the file's entry when they are written — a directory's small files
//! sit together, for batch I/O; bytes beyond go in `chunk_bytes` (4 MiB) chunks on the
//! server CRUSH picks for (inode, chunk index). A file renamed to another server keeps its
//! records where they are; its pieces say where.
//!
//! Compaction runs in the background: segments whose live share fell under half are
//! copied out and deleted; the switch of the moved records' extents is one store batch,
//! made while writers are held off (`data_gate`). Writers hold the gate shared from their
//! append until their index entries are committed, so a compaction that picks its
//! segments under the exclusive gate never misses a record that is about to be used.

use crate::engine::call::Call;
use crate::engine::errors::{eio, err, OpError, OpResult};
use crate::engine::host::Via;
use crate::engine::perm;
use crate::engine::records::RecordLoc;
use crate::engine::Engine;
use crate::failpoint::Failpoints;
use crate::links::Found;
use crate::links::Links;
use crate::peers::Peers;
use bytes::Bytes;
use futures::future::join_all;
use plusfs_data::{DataError, Live, LiveIndex, Move};
use plusfs_proto::filedata::{overlay, records, truncate};
use plusfs_proto::Payload;
use plusfs_proto::{
    Attr, Capability, Errno, FileKind, Ino, Inode, Piece, Receipt, Reply, Request, ServerId, Timespec, MAX_FILE_SIZE,
    MAX_RECORD, MAY_READ, MAY_WRITE,
};
use plusfs_store::Batch;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

/// How often the background compaction looks at the segments.
const COMPACT_EVERY: Duration = Duration::from_secs(30);
/// Segments whose live bytes are at most this share of their size are compacted.
pub(crate) const COMPACT_LIVE_RATIO: f64 = 0.5;
/// The active segment is sealed for compaction once it holds this much and is mostly dead.
const SEAL_FOR_COMPACTION: u64 = 1 << 20;

pub(crate) fn data_err(e: DataError) -> plusfs_proto::WireError {
    tracing::error!(cause = %e, "data store failure");
    err(Errno(e.errno()), format!("data store: {e}")).into()
}

/// Runs blocking data-store work off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, DataError> + Send + 'static,
) -> OpResult<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| err(Errno::EIO, format!("data task failed: {e}")))?
        .map_err(data_err)
        .map_err(OpError::from)
}

/// File data: writes, reads, capabilities of client-direct I/O, records on other
/// servers, compaction of this server's data store.
pub(crate) struct FileData {
    engine: Arc<Engine>,
    peers: Arc<Peers>,
    failpoints: Arc<Failpoints>,
    links: Arc<Links>,
    /// Signs the capabilities and receipts of client-direct I/O (a cluster with TLS).
    pub(crate) caps: Option<plusfs_tls::CapKey>,
}

impl FileData {
    pub(crate) fn new(
        engine: Arc<Engine>,
        peers: Arc<Peers>,
        failpoints: Arc<Failpoints>,
        links: Arc<Links>,
        caps: Option<plusfs_tls::CapKey>,
    ) -> FileData {
        FileData { engine, peers, failpoints, links, caps }
    }
}

impl FileData {
    /// The regular file at `p` (as addressed by `via`), locked with `lock`, on which `c`
    /// has the permissions `want` (`MAY_*` bits), or which `c` owns and reaches through a
    /// descriptor.
    async fn file_target(self: &Arc<Self>, p: &str, via: Via, lock: bool, c: &Call, want: u32) -> OpResult<Found> {
        let found = self.links.find(p, via, lock, c).await?;
        if let Found::Here(t) = &found {
            match t.inode.kind {
                FileKind::File => {}
                FileKind::Dir => return Err(err(Errno::EISDIR, format!("'{p}' is a directory"))),
                _ => return Err(err(Errno::EINVAL, format!("'{p}' is not a regular file"))),
            }
            let i = &t.inode;
            // Through a descriptor its owner opened, the owner's I/O needs no mode bits
            // (`Cred::through_handle`).
            if c.owner_through_handle(i.uid) {
                return Ok(found);
            }
            for w in [MAY_READ, MAY_WRITE].into_iter().filter(|w| want & w != 0) {
                perm::check_acl(c, i.mode, i.uid, i.gid, i.access_acl().as_ref(), w, p)?;
            }
        }
        Ok(found)
    }

    /// `Write`: stores `data` at `offset` (the end with `append`), updates size and times.
    pub(crate) async fn write_file(
        self: &Arc<Self>,
        p: &str,
        offset: u64,
        data: Bytes,
        append: bool,
        via: Via,
        c: &Call,
    ) -> OpResult<Reply> {
        // Bytes of a write (not appending) that go to other servers are stored before the
        // entry is locked, so writers of one file overlap their transfers.
        let early = match append {
            false => self.put_remote_unlocked(p, offset, &data, via, c).await?,
            true => None,
        };
        let mut stored: Vec<(ServerId, u64)> =
            early.iter().flat_map(|(_, pieces)| pieces.iter().map(|q| (q.server, q.record))).collect();
        let r = self.write_locked(p, (offset, data, append), early, via, c, &mut stored).await;
        if !stored.is_empty() {
            // The write failed, was forwarded, or the path names another file by now:
            // the records it stored on other servers are nobody's.
            self.drop_remote(stored).await;
        }
        r
    }

    /// The part of `Write` under the entry's lock; `early` are the pieces stored on other
    /// servers before it for inode `early.0`, used if the entry is still that inode.
    /// `stored` lists the records stored on other servers for this write (the early ones,
    /// and those stored here); it is emptied once the write commits.
    async fn write_locked(
        self: &Arc<Self>,
        p: &str,
        (offset, data, append): (u64, Bytes, bool),
        early: Option<(Ino, Vec<Piece>)>,
        via: Via,
        c: &Call,
        stored: &mut Vec<(ServerId, u64)>,
    ) -> OpResult<Reply> {
        let mut t = match self.file_target(p, via, true, c, MAY_WRITE).await? {
            Found::Here(t) => t,
            Found::Elsewhere { home, ino } => {
                let req = Request::Write { path: p.into(), offset, data: data.into(), append };
                return self.links.forward(home, ino, req, c).await;
            }
        };
        let early = match early {
            Some((ino, pieces)) if ino == t.inode.ino => Some(pieces),
            Some(_) => {
                // Placed for another file than the path names now: nobody's.
                self.drop_remote(std::mem::take(stored)).await;
                None
            }
            None => None,
        };
        let inode = &mut t.inode;
        let off = if append { inode.size } else { offset };
        let end = off.checked_add(data.len() as u64).filter(|&e| e <= MAX_FILE_SIZE).ok_or_else(|| {
            err(Errno::EFBIG, format!("'{p}': writing {} bytes at {off} passes the maximum file size", data.len()))
        })?;
        let before = records(&inode.pieces);
        let parts = self.placement(inode.ino, off, end);
        let bytes_of = |range: (u64, u64)| data.slice((range.0 - off) as usize..(range.1 - off) as usize);
        // Other servers' parts first, without holding this server's data gate (a peer's
        // compaction may be waiting for its own gate while its writers call us).
        let mut new_pieces = Vec::new();
        match early {
            Some(pieces) => new_pieces = pieces,
            None => {
                for &(at, server, range) in parts.iter().filter(|p| p.1 != self.engine.id()) {
                    let put = self.put_remote(server, inode.ino, at, bytes_of(range)).await?;
                    stored.extend(put.iter().map(|q| (q.server, q.record)));
                    new_pieces.extend(put);
                }
            }
        }
        let gate = self.engine.data_gate().read().await;
        let mut b = Batch::counted();
        for &(at, _, range) in parts.iter().filter(|p| p.1 == self.engine.id()) {
            new_pieces.extend(self.put_local(inode.ino, at, bytes_of(range), &mut b).await?);
        }
        lay_over(inode, new_pieces, (end, !data.is_empty()), c);
        let remote = self.engine.drop_unused(&before, &records(&inode.pieces), &mut b)?;
        t.save(&mut b);
        self.failpoints.hit(crate::failpoint::FailStep::DataAfterAppend).await;
        let answer = Ok(Reply::Attr(Attr::of_inode(&t.inode)));
        c.answer_with_next_batch(&answer);
        self.engine.apply_for(c, b).await?;
        stored.clear();
        drop(gate);
        self.drop_remote(remote).await;
        answer.map_err(OpError::from)
    }

    /// `Layout`: the attributes of the regular file at `p` and its pieces that hold bytes
    /// of `[offset, offset + len)` (the caller reads them from their servers itself), with
    /// a capability for `holder` to read the file's records or, with `write`, to store
    /// records for those bytes (checked with read or write permission).
    pub(crate) async fn layout(
        self: &Arc<Self>,
        p: &str,
        (offset, len, write): (u64, u64, bool),
        holder: String,
        via: Via,
        c: &Call,
    ) -> OpResult<Reply> {
        let want = if write { MAY_WRITE } else { MAY_READ };
        let inode = match self.file_target(p, via, false, c, want).await? {
            Found::Here(t) => t.inode,
            Found::Elsewhere { home, ino } => {
                let req = Request::Layout { path: p.into(), offset, len, write, holder };
                return self.links.forward(home, ino, req, c).await;
            }
        };
        let end = offset.saturating_add(len);
        let pieces = inode.pieces.iter().filter(|q| q.end() > offset && q.file_off < end).copied().collect();
        let range = if write { (offset, len) } else { (0, u64::MAX) };
        let cap = self.issue_cap(inode.ino, write, range, holder);
        Ok(Reply::Layout { attr: Attr::of_inode(&inode), pieces, cap })
    }

    /// A signed capability for `holder` over bytes `range` of file `ino` (none for an
    /// empty holder or a cluster without TLS).
    fn issue_cap(&self, ino: Ino, write: bool, (offset, len): (u64, u64), holder: String) -> Option<Capability> {
        let key = self.caps.as_ref().filter(|_| !holder.is_empty())?;
        let expires = plusfs_tls::now_secs() + self.engine.map().tls.capability_secs();
        let mut cap = Capability { ino, write, offset, len, expires, holder, mac: Vec::new() };
        key.sign_cap(&mut cap);
        Some(cap)
    }

    /// `CommitWrite`: lays `pieces`, records a client stored on the data servers, over
    /// bytes `[offset, offset + len)` of file `ino` at `p`, as `Write` would have.
    pub(crate) async fn commit_write(
        self: &Arc<Self>,
        p: &str,
        ino: Ino,
        (offset, len): (u64, u64),
        (pieces, receipts): (Vec<Piece>, Vec<Receipt>),
        via: Via,
        c: &Call,
    ) -> OpResult<Reply> {
        let mut t = match self.file_target(p, via, true, c, MAY_WRITE).await? {
            Found::Here(t) => t,
            Found::Elsewhere { home, ino: at } => {
                let req = Request::CommitWrite { path: p.into(), ino, offset, len, pieces, receipts };
                return self.links.forward(home, at, req, c).await;
            }
        };
        if t.inode.ino != ino {
            return Err(err(Errno::ESTALE, format!("'{p}' is another file than the one written")));
        }
        let end = committed_end(p, offset, len, &pieces)?;
        if let Some(q) = pieces.iter().find(|q| !self.engine.map().servers.iter().any(|s| s.id == q.server)) {
            return Err(err(Errno::EINVAL, format!("'{p}': a committed piece names unknown server {}", q.server)));
        }
        let before = records(&t.inode.pieces);
        lay_over(&mut t.inode, pieces, (end, len > 0), c);
        let gate = self.engine.data_gate().read().await;
        let mut b = Batch::counted();
        let remote = self.engine.drop_unused(&before, &records(&t.inode.pieces), &mut b)?;
        t.save(&mut b);
        let answer = Reply::Attr(Attr::of_inode(&t.inode));
        c.answer_with_next_batch(&Ok(answer.clone()));
        self.engine.apply_for(c, b).await?;
        drop(gate);
        self.drop_remote(remote).await;
        Ok(answer)
    }

    /// The parts of a write of `data` at `offset` that go to other servers, stored before
    /// the entry is locked: the inode they were placed for and their pieces. `None` when
    /// the file is elsewhere (a hard link's home decides), the range is invalid (the
    /// locked path reports it), or nothing goes to another server.
    async fn put_remote_unlocked(
        self: &Arc<Self>,
        p: &str,
        offset: u64,
        data: &Bytes,
        via: Via,
        c: &Call,
    ) -> OpResult<Option<(Ino, Vec<Piece>)>> {
        let Found::Here(t) = self.file_target(p, via, false, c, MAY_WRITE).await? else { return Ok(None) };
        let Some(end) = offset.checked_add(data.len() as u64).filter(|&e| e <= MAX_FILE_SIZE) else {
            return Ok(None);
        };
        let ino = t.inode.ino;
        let parts = self.placement(ino, offset, end);
        if parts.iter().all(|q| q.1 == self.engine.id()) {
            return Ok(None);
        }
        let mut pieces = Vec::new();
        for &(at, server, (from, to)) in parts.iter().filter(|q| q.1 != self.engine.id()) {
            let bytes = data.slice((from - offset) as usize..(to - offset) as usize);
            match self.put_remote(server, ino, at, bytes).await {
                Ok(stored) => pieces.extend(stored),
                Err(e) => {
                    self.drop_remote(pieces.iter().map(|q: &Piece| (q.server, q.record)).collect()).await;
                    return Err(e);
                }
            }
        }
        Ok(Some((ino, pieces)))
    }

    /// Splits `[off, end)` by where its bytes go: (file offset, server, range).
    fn placement(&self, ino: Ino, off: u64, end: u64) -> Vec<(u64, ServerId, (u64, u64))> {
        let small = self.engine.map().data.small_file_bytes;
        let chunk = self.engine.map().data.chunk_bytes;
        let mut out = Vec::new();
        let mut at = off;
        while at < end {
            let (server, stop) = if at < small {
                (self.engine.id(), end.min(small))
            } else {
                let idx = at / chunk;
                (self.engine.map().chunk_server(ino, idx), end.min((idx + 1) * chunk))
            };
            out.push((at, server, (at, stop)));
            at = stop;
        }
        out
    }

    /// Appends `bytes` (file offset `at`) to this server's data store as records of at most
    /// [`MAX_RECORD`] bytes; their index entries go into `b`.
    async fn put_local(self: &Arc<Self>, owner: Ino, at: u64, bytes: Bytes, b: &mut Batch) -> OpResult<Vec<Piece>> {
        self.put_local_parts(owner, at, records_of(&bytes), b).await
    }

    /// [`Self::put_local`] of records already cut (at most [`MAX_RECORD`] bytes each),
    /// shared with the blocking task, not copied, and appended with one write.
    pub(crate) async fn put_local_parts(
        self: &Arc<Self>,
        owner: Ino,
        at: u64,
        parts: Vec<Bytes>,
        b: &mut Batch,
    ) -> OpResult<Vec<Piece>> {
        let lens: Vec<u64> = parts.iter().map(|p| p.len() as u64).collect();
        let data = self.engine.data().clone();
        let extents = blocking(move || {
            let recs: Vec<(u64, &[u8])> = parts.iter().map(|p| (owner, &p[..])).collect();
            data.append_records(&recs)
        })
        .await?;
        let mut pieces = Vec::with_capacity(lens.len());
        let mut file_off = at;
        for (len, extent) in lens.into_iter().zip(extents) {
            let id = self.engine.index_record(extent, owner, b).await?;
            pieces.push(Piece { file_off, len, server: self.engine.id(), record: id, skip: 0 });
            file_off += len;
        }
        Ok(pieces)
    }

    /// Stores `bytes` on another server (`DataPut`, one record per request, in parallel).
    pub(crate) async fn put_remote(
        self: &Arc<Self>,
        server: ServerId,
        owner: Ino,
        at: u64,
        bytes: Bytes,
    ) -> OpResult<Vec<Piece>> {
        let parts = records_of(&bytes);
        // Each part with the file offset of its first byte.
        let placed: Vec<(u64, &Bytes)> = parts
            .iter()
            .scan(at, |off, part| {
                let here = *off;
                *off += part.len() as u64;
                Some((here, part))
            })
            .collect();
        let puts = placed.iter().map(|&(file_off, part)| {
            let req = Request::DataPut { owner, data: part.clone().into(), file_off, cap: None };
            async move { self.peers.pool.call(server, &req).await }
        });
        let mut pieces = Vec::new();
        let mut failed = None;
        for (&(file_off, part), r) in placed.iter().zip(join_all(puts).await) {
            match r {
                Ok(Ok(Reply::Record(id))) => {
                    pieces.push(Piece { file_off, len: part.len() as u64, server, record: id, skip: 0 })
                }
                Ok(Ok(other)) => failed = failed.or(Some(err(Errno::EIO, format!("unexpected reply {other:?}")))),
                Ok(Err(e)) => failed = failed.or(Some(e.into())),
                Err(e) => failed = failed.or(Some(err(Errno::EIO, format!("data server {server}: {e}")))),
            }
        }
        if let Some(e) = failed {
            // The parts stored are nobody's.
            self.drop_remote(pieces.iter().map(|q| (q.server, q.record)).collect()).await;
            return Err(e);
        }
        Ok(pieces)
    }

    /// `DataPut`: one record of `owner` holding file bytes at `file_off`, with its own
    /// store write; under a capability (checked at admission), answered with a receipt.
    pub(crate) async fn data_put(
        self: &Arc<Self>,
        owner: Ino,
        data: Bytes,
        file_off: u64,
        cap: Option<Capability>,
        c: &Call,
    ) -> OpResult<Reply> {
        if data.len() as u64 > MAX_RECORD {
            return Err(err(Errno::EINVAL, format!("a record holds at most {MAX_RECORD} bytes")));
        }
        let len = data.len() as u64;
        let gate = self.engine.data_gate().read().await;
        let mut b = Batch::new();
        let pieces = self.put_local_parts(owner, 0, vec![data], &mut b).await?;
        self.engine.apply_for(c, b).await?;
        drop(gate);
        let record = pieces.first().map_or(0, |p| p.record);
        let (Some(cap), Some(key)) = (cap, self.caps.as_ref()) else { return Ok(Reply::Record(record)) };
        let (server, expires, holder) = (self.engine.id(), cap.expires, cap.holder);
        let mut receipt = Receipt { server, record, owner, file_off, len, expires, holder, mac: Vec::new() };
        key.sign_receipt(&mut receipt);
        Ok(Reply::Receipt(receipt))
    }

    /// Tells other servers that records are no longer used. A failure leaves them as
    /// unreferenced space (logged), never a file without its data.
    pub(crate) async fn drop_remote(self: &Arc<Self>, gone: Vec<(ServerId, u64)>) {
        let mut by_server: std::collections::BTreeMap<ServerId, Vec<u64>> = Default::default();
        for (s, r) in gone {
            by_server.entry(s).or_default().push(r);
        }
        for (server, records) in by_server {
            let n = records.len();
            if let Err(e) = self.peers.pool.call(server, &Request::DataDrop { records, receipts: Vec::new() }).await {
                tracing::warn!(server, records = n, cause = %e, "cannot drop unused records; space stays used");
            }
        }
    }

    /// `DataDrop`: records no file uses. A client's (with receipts, checked at admission)
    /// names only records stored here.
    pub(crate) async fn data_drop(self: &Arc<Self>, ids: &[u64], receipts: &[Receipt]) -> OpResult<Reply> {
        if let Some(r) = receipts.iter().find(|r| r.server != self.engine.id()) {
            return Err(err(Errno::EACCES, format!("record {} was stored on server {}, not here", r.record, r.server)));
        }
        let gate = self.engine.data_gate().read().await;
        let mut b = Batch::new();
        self.engine.drop_local(ids, &mut b)?;
        self.engine.apply(b).await?;
        drop(gate);
        Ok(Reply::Done)
    }

    /// `Read`: up to `len` bytes at `offset`; holes read as zeros.
    pub(crate) async fn read_file(
        self: &Arc<Self>,
        p: &str,
        offset: u64,
        len: u32,
        via: Via,
        c: &Call,
    ) -> OpResult<Reply> {
        // A read may race with a rewrite or a compaction that moves what it looked up:
        // it then starts again from the inode.
        let mut last = None;
        for _ in 0..4 {
            let inode = match self.file_target(p, via, false, c, MAY_READ).await? {
                Found::Here(t) => t.inode,
                Found::Elsewhere { home, ino } => {
                    return self.links.forward(home, ino, Request::Read { path: p.into(), offset, len }, c).await
                }
            };
            match self.read_pieces(&inode, offset, len).await {
                Ok(data) => return Ok(Reply::Data(data)),
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("at least one attempt"))
    }

    async fn read_pieces(self: &Arc<Self>, inode: &Inode, offset: u64, len: u32) -> OpResult<Payload> {
        if offset >= inode.size {
            return Ok(Payload::default());
        }
        let end = inode.size.min(offset + len as u64);
        // (file offset, record, skip, len) per server.
        let mut wanted: std::collections::BTreeMap<ServerId, Vec<(u64, u64, u64, u64)>> = Default::default();
        for piece in inode.pieces.iter().filter(|q| q.end() > offset && q.file_off < end) {
            let from = piece.file_off.max(offset);
            let to = piece.end().min(end);
            let skip = piece.skip + (from - piece.file_off);
            wanted.entry(piece.server).or_default().push((from, piece.record, skip, to - from));
        }
        let fetches = wanted.iter().map(|(&server, ranges)| async move {
            let r: Vec<(u64, u64, u64)> = ranges.iter().map(|x| (x.1, x.2, x.3)).collect();
            let parts = self.fetch_ranges(server, r).await?;
            Ok::<_, OpError>(ranges.iter().map(|x| x.0).zip(parts).collect::<Vec<_>>())
        });
        // The file's bytes in order, holes as zeros.
        let mut found: Vec<(u64, Bytes)> = Vec::new();
        for fetched in join_all(fetches).await {
            found.extend(fetched?);
        }
        found.sort_by_key(|f| f.0);
        let mut chunks = Vec::with_capacity(found.len() * 2);
        let mut at = offset;
        for (from, bytes) in found {
            if from > at {
                chunks.push(Bytes::from(vec![0u8; (from - at) as usize]));
            }
            at = from + bytes.len() as u64;
            chunks.push(bytes);
        }
        if end > at {
            chunks.push(Bytes::from(vec![0u8; (end - at) as usize]));
        }
        Ok(Payload::from_chunks(chunks))
    }

    /// Local `(record, skip, len)` ranges, each as its own buffer (a slice of what the
    /// store read, not a copy). The records are read in (segment, offset) order,
    /// neighbours within `[data] merge_gap_bytes` with one call.
    pub(crate) async fn read_ranges(self: &Arc<Self>, ranges: &[(u64, u64, u64)]) -> OpResult<Vec<Bytes>> {
        self.read_owned_ranges(ranges, None).await
    }

    /// [`Self::read_ranges`] of records that must all belong to file `owner`, when given
    /// (a client's `DataGet` under a capability): EACCES for another file's record.
    async fn read_owned_ranges(
        self: &Arc<Self>,
        ranges: &[(u64, u64, u64)],
        owner: Option<Ino>,
    ) -> OpResult<Vec<Bytes>> {
        let ids: Vec<u64> = ranges.iter().map(|r| r.0).collect();
        let mut extents = Vec::with_capacity(ids.len());
        for (id, loc) in ids.iter().zip(self.engine.store().get_records(&ids).map_err(eio)?) {
            let bytes =
                loc.ok_or_else(|| err(Errno::EIO, format!("record {id} is not on server {}", self.engine.id())))?;
            let loc = RecordLoc::read(*id, &bytes)?;
            if let Some(o) = owner.filter(|o| *o != loc.owner) {
                return Err(err(Errno::EACCES, format!("record {id} belongs to another file than inode {o}")));
            }
            extents.push(loc.extent);
        }
        let data = self.engine.data().clone();
        let gap = self.engine.map().data.merge_gap_bytes;
        let records = blocking(move || data.read_many(&extents, gap)).await?;
        let mut out = Vec::with_capacity(ranges.len());
        for (rec, &(_, skip, len)) in records.into_iter().zip(ranges) {
            if skip.checked_add(len).is_none_or(|e| e > rec.len() as u64) {
                return Err(err(Errno::EIO, "range past record"));
            }
            out.push(rec.slice(skip as usize..(skip + len) as usize));
        }
        Ok(out)
    }

    /// `(record, skip, len)` ranges of `server`'s records, each as its own buffer: read
    /// here, or with one `DataGet` whose reply is cut back into the ranges (not copied).
    pub(crate) async fn fetch_ranges(
        self: &Arc<Self>,
        server: ServerId,
        ranges: Vec<(u64, u64, u64)>,
    ) -> OpResult<Vec<Bytes>> {
        if server == self.engine.id() {
            return self.read_ranges(&ranges).await;
        }
        let lens: Vec<u64> = ranges.iter().map(|r| r.2).collect();
        let all = match self.peers.pool.call(server, &Request::DataGet { ranges, cap: None }).await {
            Ok(Ok(Reply::Data(d))) => d.into_bytes(),
            Ok(Ok(other)) => return Err(err(Errno::EIO, format!("unexpected reply {other:?}"))),
            Ok(Err(e)) => return Err(e.into()),
            Err(e) => return Err(err(Errno::EIO, format!("data server {server}: {e}"))),
        };
        split_reply(&all, lens.into_iter())
    }

    /// `DataGet`: bytes of records here; under a capability (checked at admission), only
    /// of records of the capability's file.
    pub(crate) async fn data_get(
        self: &Arc<Self>,
        ranges: &[(u64, u64, u64)],
        cap: Option<&Capability>,
    ) -> OpResult<Reply> {
        let owner = cap.map(|c| c.ino);
        Ok(Reply::Data(Payload::from_chunks(self.read_owned_ranges(ranges, owner).await?)))
    }

    /// Changes a file's size (`truncate`); cut-off records are dropped.
    pub(crate) fn resize(&self, inode: &mut Inode, size: u64, b: &mut Batch) -> OpResult<Vec<(ServerId, u64)>> {
        if size > MAX_FILE_SIZE {
            return Err(err(Errno::EFBIG, format!("size {size} passes the maximum file size")));
        }
        let before = records(&inode.pieces);
        truncate(&mut inode.pieces, size);
        inode.size = size;
        inode.mtime = Timespec::now();
        inode.ctime = inode.mtime;
        self.engine.drop_unused(&before, &records(&inode.pieces), b)
    }

    /// `Fsync`: file data and metadata durable (the metadata already is with `sync =
    /// always`; data appends are synced here too).
    pub(crate) async fn fsync_file(self: &Arc<Self>, p: &str, via: Via, c: &Call) -> OpResult<Reply> {
        let inode = match self.file_target(p, via, false, c, 0).await? {
            Found::Here(t) => t.inode,
            Found::Elsewhere { home, ino } => {
                return self.links.forward(home, ino, Request::Fsync { path: p.into() }, c).await
            }
        };
        let mut servers: BTreeSet<ServerId> = inode.pieces.iter().map(|q| q.server).collect();
        servers.insert(self.engine.id());
        let data = self.engine.data().clone();
        blocking(move || data.sync()).await?;
        for s in servers.into_iter().filter(|s| *s != self.engine.id()) {
            match self.peers.pool.call(s, &Request::Fsync { path: String::new() }).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(e.into()),
                Err(e) => return Err(err(Errno::EIO, format!("data server {s}: {e}"))),
            }
        }
        Ok(Reply::Done)
    }

    /// `Fsync` with an empty path, from another server: sync this server's data store.
    pub(crate) async fn fsync_data(self: &Arc<Self>) -> OpResult<Reply> {
        let data = self.engine.data().clone();
        blocking(move || data.sync()).await?;
        Ok(Reply::Done)
    }

    /// Every record in this server's data store (id, bytes), from the record index:
    /// what `fsck` compares with the pieces the files name.
    pub(crate) async fn record_inventory(&self) -> OpResult<Vec<(u64, u64)>> {
        // Compaction switches records to their new segment under the gate: read the index
        // on either side of a switch, never across it (a record read in neither segment
        // would look lost).
        let _gate = self.engine.data_gate().read().await;
        let mut out = Vec::new();
        for seg in self.engine.data().segments() {
            let refs = self.engine.store().seg_refs(seg.id).map_err(eio)?;
            let ids: Vec<u64> = refs.iter().map(|r| r.1).collect();
            for ((off, id), loc) in refs.into_iter().zip(self.engine.store().get_records(&ids).map_err(eio)?) {
                let Some(bytes) = loc else { continue };
                let loc = RecordLoc::read(id, &bytes)?;
                // A back reference left by a move counts where the record is now.
                if loc.extent.segment == seg.id && loc.extent.offset == off {
                    out.push((id, loc.extent.len as u64));
                }
            }
        }
        Ok(out)
    }

    /// Background compaction loop.
    pub(crate) fn spawn_compactor(self: &Arc<Self>) {
        let osd = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(COMPACT_EVERY).await;
                let Some(osd) = osd.upgrade() else { return };
                if let Err(e) = osd.compact_now(COMPACT_LIVE_RATIO).await {
                    tracing::error!(cause = %e.message(), "compaction failed");
                }
            }
        });
    }

    /// One compaction pass (also used by tests and `plusfs` admin paths).
    pub(crate) async fn compact_now(self: &Arc<Self>, ratio: f64) -> OpResult<plusfs_data::CompactStats> {
        let osd = self.clone();
        let handle = tokio::runtime::Handle::current();
        let stats = tokio::task::spawn_blocking(move || {
            let mut index = RocksLiveIndex { osd: &osd, handle };
            let ids = {
                // With writers held off every appended record is in the index, so the
                // live counts below are exact for every sealed segment.
                let _gate = osd.engine.data_gate().blocking_write();
                let active = osd.engine.data().segments().into_iter().find(|s| s.active);
                if let Some(a) = active.filter(|a| a.bytes >= SEAL_FOR_COMPACTION) {
                    if plusfs_data::live_bytes(&index.live_in(a.id)?) as f64 <= ratio * a.bytes as f64 {
                        osd.engine.data().seal_active()?;
                    }
                }
                plusfs_data::candidates(osd.engine.data(), &index, ratio)?
            };
            plusfs_data::compact_segments(osd.engine.data(), &mut index, &ids)
        })
        .await
        .map_err(|e| err(Errno::EIO, format!("compaction task failed: {e}")))?
        .map_err(data_err)?;
        if stats.segments_compacted > 0 {
            tracing::info!(?stats, "data compacted");
        }
        Ok(stats)
    }
}

/// Compaction's view of the record index in the metadata store.
struct RocksLiveIndex<'a> {
    osd: &'a Arc<FileData>,
    handle: tokio::runtime::Handle,
}

fn index_err(e: impl std::fmt::Display) -> DataError {
    DataError::Corrupt { segment: 0, offset: 0, reason: format!("record index: {e}") }
}

impl LiveIndex for RocksLiveIndex<'_> {
    fn live_in(&self, segment: u32) -> Result<Vec<Live>, DataError> {
        let refs = self.osd.engine.store().seg_refs(segment).map_err(index_err)?;
        let ids: Vec<u64> = refs.iter().map(|r| r.1).collect();
        let locs = self.osd.engine.store().get_records(&ids).map_err(index_err)?;
        let mut out = Vec::new();
        for ((off, id), loc) in refs.into_iter().zip(locs) {
            let Some(bytes) = loc else { continue };
            let loc = RecordLoc::decode(&bytes).map_err(index_err)?;
            if loc.extent.segment == segment && loc.extent.offset == off {
                out.push(Live { key: id, owner: loc.owner, extent: loc.extent });
            }
        }
        Ok(out)
    }

    fn relocate(&mut self, moves: &[Move]) -> Result<(), DataError> {
        // The copies are written and synced; the old segment still holds the live data.
        crate::failpoint::hit_process(crate::failpoint::FailStep::CompactionBeforeSwitch);
        // Writers are held off while the index switches, so none drops a record between
        // the check and the write below.
        let _gate = self.osd.engine.data_gate().blocking_write();
        let ids: Vec<u64> = moves.iter().map(|m| m.key).collect();
        let current = self.osd.engine.store().get_records(&ids).map_err(index_err)?;
        let mut b = Batch::new();
        for (m, loc) in moves.iter().zip(current) {
            let Some(bytes) = loc else { continue }; // dropped meanwhile: the copy is garbage
            let loc = RecordLoc::decode(&bytes).map_err(index_err)?;
            if loc.extent != m.from {
                continue;
            }
            b.put_record(m.key, RecordLoc { extent: m.to, owner: loc.owner }.encode());
            b.del_seg_ref(m.from.segment, m.from.offset);
            b.put_seg_ref(m.to.segment, m.to.offset, m.key);
        }
        let commit = self.osd.engine.submit(b);
        self.handle.block_on(commit).map_err(|_| index_err("store closed"))?.map_err(index_err)?;
        // Switched, the old segment not yet deleted: a later pass deletes it.
        crate::failpoint::hit_process(crate::failpoint::FailStep::CompactionAfterSwitch);
        Ok(())
    }
}

/// Lays `pieces`, new bytes of a write by `c` ending at `end`, over `inode`; when bytes
/// were `written`, the size grows to `end` and the times are now's. Linux: a write by an
/// unprivileged process drops setuid (and setgid).
fn lay_over(inode: &mut Inode, pieces: Vec<Piece>, (end, written): (u64, bool), c: &Call) {
    if !c.is_root() {
        inode.mode = perm::kill_suid(inode.mode);
    }
    for piece in pieces {
        overlay(&mut inode.pieces, piece);
    }
    if written {
        inode.size = inode.size.max(end);
        inode.mtime = Timespec::now();
        inode.ctime = inode.mtime;
    }
}

/// The end of a committed range, after checking that `pieces` are sorted, do not overlap,
/// lie within `[offset, offset + len)`, are whole records (no skip) of at most
/// [`MAX_RECORD`] bytes, and that the range fits in a file.
fn committed_end(p: &str, offset: u64, len: u64, pieces: &[Piece]) -> OpResult<u64> {
    let end = offset.checked_add(len).filter(|&e| e <= MAX_FILE_SIZE).ok_or_else(|| {
        err(Errno::EFBIG, format!("'{p}': writing {len} bytes at {offset} passes the maximum file size"))
    })?;
    let mut at = offset;
    for q in pieces {
        let outside = q.file_off < at || q.file_off >= end || q.len > end - q.file_off;
        if outside || q.len == 0 || q.len > MAX_RECORD || q.skip != 0 {
            return Err(err(Errno::EINVAL, format!("'{p}': a committed piece lies outside the write or overlaps")));
        }
        at = q.end();
    }
    Ok(end)
}

/// `bytes` cut into records of at most [`MAX_RECORD`] bytes (shared, not copied).
fn records_of(bytes: &Bytes) -> Vec<Bytes> {
    (0..bytes.len())
        .step_by(MAX_RECORD as usize)
        .map(|at| bytes.slice(at..bytes.len().min(at + MAX_RECORD as usize)))
        .collect()
}

/// A `DataGet` reply cut back into its ranges of `lens` bytes (shared, not copied).
fn split_reply(all: &Bytes, lens: impl Iterator<Item = u64>) -> OpResult<Vec<Bytes>> {
    let mut at = 0usize;
    let mut out = Vec::new();
    for n in lens {
        let n = n as usize;
        if at + n > all.len() {
            return Err(err(Errno::EIO, "short data reply"));
        }
        out.push(all.slice(at..at + n));
        at += n;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use crate::engine::attrs::NewNode;
    use crate::engine::host::Via;
    use crate::testkit::{root, Kit};
    use plusfs_proto::{FileKind, Reply};

    #[tokio::test]
    async fn written_data_reads_back_after_a_restart() {
        let kit = Kit::new().await;
        let node = NewNode { target: None, rdev: 0, access: 0 };
        let c = root();
        kit.osd.namespace.create("/f", FileKind::File, 0o644, (0, 0), true, node, Via::Home, &c).await.unwrap();
        let data = bytes::Bytes::from_static(b"hello, plusfs");
        kit.osd.filedata.write_file("/f", 3, data, false, Via::Home, &c).await.unwrap();
        let kit = kit.crash_and_restart().await;
        let got = kit.osd.filedata.read_file("/f", 0, 64, Via::Home, &root()).await.unwrap();
        let Reply::Data(bytes) = got else { panic!("{got:?}") };
        assert_eq!(bytes.to_vec(), b"\0\0\0hello, plusfs");
    }
}
