//! Large-file I/O straight between the client and the data servers.
//!
//! Bytes of a file at or beyond `[data] small_file_bytes` live in `chunk_bytes` chunks on
//! the servers CRUSH picks for (inode, chunk index). A large write stores them there
//! itself — `DataPut` of records of at most [`MAX_RECORD`] bytes, up to
//! [`ClientOptions::io_window`](crate::ClientOptions) in flight, every server of the
//! cluster busy at once for a striped file — and then sends the file's entry server one
//! `CommitWrite` naming the records: a small metadata update per [`COMMIT_BYTES`] instead
//! of relaying every byte through the entry server. Commits go in file order, so a client
//! that dies part-way leaves the file at its last committed size, holding only bytes that
//! were written; records stored but never committed are dropped when the server refuses
//! the commit (and left as unused space, which `plusfs fsck` lists, when the client dies
//! before it can say so or the commit's answer is lost: it may have been applied).
//!
//! A large read asks the entry server for the pieces of its range (`Layout`) and fetches
//! them from their servers (`DataGet`, at most [`IO_CHUNK`] bytes per request, the same
//! window). A record dropped meanwhile (the range was rewritten or truncated) makes the
//! read start again from a new layout.
//!
//! A client that is no admin does the same under capabilities (`plusfs_proto::caps`): the
//! layout comes with a read capability its `DataGet`s present; a write first asks a
//! `Layout` with `write` for each segment (a write capability over its bytes, checked with
//! write permission), each `DataPut` presents it and is answered with a receipt, and the
//! commit (or the drop of records not committed) names the receipts. An admin's write
//! needs no capability and asks only the file's attributes.

use crate::error::FsError;
use crate::file::IO_CHUNK;
use crate::fs::Client;
use bytes::Bytes;
use futures::stream::{self, StreamExt, TryStreamExt};
use plusfs_proto::{
    Attr, Capability, Errno, FileKind, Ino, Payload, Piece, Receipt, Reply, Request, ServerId, MAX_RECORD,
};
use std::sync::atomic::Ordering;

/// Bytes stored on the data servers between two commits of one write.
pub const COMMIT_BYTES: usize = 64 << 20;
/// Reads of at least this many bytes fetch the pieces from their servers directly.
pub const DIRECT_READ_MIN: usize = 1 << 20;
/// Writes whose chunked part is at least this long store it on the data servers directly
/// (a shorter one costs fewer round trips relayed by the entry server).
pub const DIRECT_WRITE_MIN: usize = 1 << 20;
/// Times a read starts again from a new layout, or a commit from a new stat.
const ATTEMPTS: usize = 4;

/// One fetch of a direct read: `len` bytes at `dst` in the output, from `(record, skip,
/// len)` ranges on `server`.
struct Fetch {
    server: ServerId,
    dst: usize,
    len: usize,
    ranges: Vec<(u64, u64, u64)>,
}

impl Client {
    /// Bytes written and read by client-direct I/O, and capabilities received, so far.
    pub fn direct_io_stats(&self) -> (u64, u64, u64) {
        let d = &self.direct;
        (d.written.load(Ordering::Relaxed), d.read.load(Ordering::Relaxed), d.capabilities.load(Ordering::Relaxed))
    }

    /// Where the part of bytes `[offset, offset + len)` that [`Self::write_direct`]
    /// stores starts: the chunked part of the file, when at least [`DIRECT_WRITE_MIN`]
    /// bytes long.
    pub(crate) fn direct_write_from(&self, offset: u64, len: usize) -> Option<u64> {
        if !self.opts.direct_io {
            return None;
        }
        let from = offset.max(self.map().data.small_file_bytes);
        let end = offset + len as u64;
        (end >= from + DIRECT_WRITE_MIN as u64).then_some(from)
    }

    /// Whether a read of `len` bytes fetches the pieces from their servers itself.
    pub(crate) fn reads_directly(&self, len: usize) -> bool {
        self.opts.direct_io && len >= DIRECT_READ_MIN
    }

    /// Stores `data` (bytes at `offset`, all at or beyond `small_file_bytes`) on the data
    /// servers and commits them to the file at `p`, [`COMMIT_BYTES`] at a time.
    pub(crate) async fn write_direct(
        &self,
        raw: &str,
        (p, dir, name): (&str, &str, &str),
        offset: u64,
        data: Bytes,
    ) -> Result<Attr, FsError> {
        // A client that is no admin learns the inode with its first write capability.
        let mut ino = match self.trusted {
            true => self.file_ino(raw, p).await?,
            false => 0,
        };
        let mut last = None;
        for start in (0..data.len()).step_by(COMMIT_BYTES) {
            let seg = data.slice(start..data.len().min(start + COMMIT_BYTES));
            let at = offset + start as u64;
            last = Some(self.write_segment(raw, (p, dir, name), &mut ino, at, &seg).await?);
        }
        last.ok_or_else(|| FsError::new("write", raw, Errno::EINVAL).with_detail("nothing to write"))
    }

    /// The inode number of the regular file at `p`.
    async fn file_ino(&self, raw: &str, p: &str) -> Result<Ino, FsError> {
        let a = self.lstat(p).await.map_err(|e| FsError { op: "write", ..e })?;
        regular(raw, &a)
    }

    /// What a write of bytes `[at, at + len)` to the file at `p` stores under: the file's
    /// inode number and, for a client that is no admin, a write capability over them.
    async fn write_grant(
        &self,
        raw: &str,
        (p, dir, name): (&str, &str, &str),
        at: u64,
        len: u64,
    ) -> Result<(Ino, Option<Capability>), FsError> {
        if self.trusted {
            return Ok((self.file_ino(raw, p).await?, None));
        }
        let req = Request::Layout { path: p.to_string(), offset: at, len, write: true, holder: String::new() };
        match self.entry_rpc("write", raw, dir, name, req).await?.0 {
            Reply::Layout { attr, cap: Some(cap), .. } => {
                self.direct.capabilities.fetch_add(1, Ordering::Relaxed);
                Ok((regular(raw, &attr)?, Some(cap)))
            }
            other => {
                let e = FsError::new("write", raw, Errno::EPROTO);
                Err(e.with_detail(format!("no write capability in {other:?}")))
            }
        }
    }

    /// One segment of [`Self::write_direct`] to file `*ino`: store, commit; again from a
    /// new stat (which updates `*ino`) when the path named another file by the time of the
    /// commit. A client that is no admin asks a write capability first (which updates
    /// `*ino` too).
    async fn write_segment(
        &self,
        raw: &str,
        (p, dir, name): (&str, &str, &str),
        ino: &mut Ino,
        at: u64,
        seg: &Bytes,
    ) -> Result<Attr, FsError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let cap = match self.trusted {
                true => None,
                false => {
                    let (now, cap) = self.write_grant(raw, (p, dir, name), at, seg.len() as u64).await?;
                    *ino = now;
                    cap
                }
            };
            let stored = self.put_records(raw, *ino, at, seg, cap.as_ref()).await?;
            let req = Request::CommitWrite {
                path: p.to_string(),
                ino: *ino,
                offset: at,
                len: seg.len() as u64,
                pieces: stored.pieces.clone(),
                receipts: stored.receipts.clone(),
            };
            match self.entry_call(dir, name, &req).await {
                Ok(Ok((Reply::Attr(a), _))) => return Ok(a),
                Ok(Ok((other, _))) => {
                    self.drop_records(&stored).await;
                    let e = FsError::new("write", raw, Errno::EPROTO);
                    return Err(e.with_detail(format!("unexpected reply {other:?}")));
                }
                // The server refused the commit: the records are nobody's.
                Ok(Err(e)) => {
                    self.drop_records(&stored).await;
                    if e.errno != Errno::ESTALE || attempt >= ATTEMPTS {
                        return Err(self.server_error("write", raw, e).await);
                    }
                    if self.trusted {
                        *ino = self.file_ino(raw, p).await?;
                    }
                }
                // No answer: the commit may have been applied, so the records stay (unused
                // space for fsck to list if it was not).
                Err(e) => return Err(FsError { op: "write", path: raw.to_string(), ..e }),
            }
        }
    }

    /// Stores `seg` (file bytes at `at`) as records on the chunk servers of file `ino`
    /// (under `cap`, if given), [`ClientOptions::io_window`](crate::ClientOptions) at once;
    /// the pieces in file order and their receipts.
    async fn put_records(
        &self,
        raw: &str,
        ino: Ino,
        at: u64,
        seg: &Bytes,
        cap: Option<&Capability>,
    ) -> Result<Stored, FsError> {
        let chunk = self.map().data.chunk_bytes.max(1);
        let mut cuts = Vec::new();
        let (mut off, end) = (at, at + seg.len() as u64);
        while off < end {
            let stop = end.min((off / chunk + 1) * chunk).min(off + MAX_RECORD);
            cuts.push((off, stop, self.map().chunk_server(ino, off / chunk)));
            off = stop;
        }
        let puts: Vec<_> = cuts
            .into_iter()
            .map(|(from, to, server)| {
                let data = seg.slice((from - at) as usize..(to - at) as usize).into();
                let req = Request::DataPut { owner: ino, data, file_off: from, cap: cap.cloned() };
                async move {
                    let piece = |record| Piece { file_off: from, len: to - from, server, record, skip: 0 };
                    let reply = self.rpc("write", raw, server, req).await?;
                    self.direct.written.fetch_add(to - from, Ordering::Relaxed);
                    match reply {
                        Reply::Record(record) => Ok((piece(record), None)),
                        Reply::Receipt(r) => Ok((piece(r.record), Some(r))),
                        other => Err(FsError::new("write", raw, Errno::EPROTO).with_detail(format!("{other:?}"))),
                    }
                }
            })
            .collect();
        let window = self.opts.io_window.max(1);
        let results: Vec<Result<(Piece, Option<Receipt>), FsError>> =
            stream::iter(puts).buffered(window).collect().await;
        let mut stored = Stored::default();
        let mut failed = None;
        for r in results {
            match r {
                Ok((piece, receipt)) => {
                    stored.pieces.push(piece);
                    stored.receipts.extend(receipt);
                }
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        match failed {
            Some(e) => {
                self.drop_records(&stored).await;
                Err(e)
            }
            None => Ok(stored),
        }
    }

    /// Tells the data servers that records stored for a write that was not committed are
    /// not used (best effort: a failure leaves them as unused space, logged).
    async fn drop_records(&self, stored: &Stored) {
        let mut by_server: std::collections::BTreeMap<ServerId, (Vec<u64>, Vec<Receipt>)> = Default::default();
        for q in &stored.pieces {
            by_server.entry(q.server).or_default().0.push(q.record);
        }
        for r in &stored.receipts {
            by_server.entry(r.server).or_default().1.push(r.clone());
        }
        for (server, (records, receipts)) in by_server {
            if let Err(e) = self.call_server(server, &Request::DataDrop { records, receipts }).await {
                tracing::warn!(server, error = %e, "cannot drop records of an uncommitted write");
            }
        }
    }

    /// `pread` of `len` bytes at `offset` from the data servers directly: the file's
    /// layout from its entry server, then its pieces from their servers.
    pub(crate) async fn read_direct(
        &self,
        raw: &str,
        (p, dir, name): (&str, &str, &str),
        offset: u64,
        len: usize,
    ) -> Result<Vec<u8>, FsError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let req =
                Request::Layout { path: p.to_string(), offset, len: len as u64, write: false, holder: String::new() };
            let (attr, pieces, cap) = match self.entry_rpc("read", raw, dir, name, req).await?.0 {
                Reply::Layout { attr, pieces, cap } => {
                    self.direct.capabilities.fetch_add(u64::from(cap.is_some()), Ordering::Relaxed);
                    (attr, pieces, cap)
                }
                other => {
                    let e = FsError::new("read", raw, Errno::EPROTO);
                    return Err(e.with_detail(format!("unexpected reply {other:?}")));
                }
            };
            match self.fetch_pieces(raw, (&attr, &pieces, cap.as_ref()), offset, len).await {
                Ok(out) => return Ok(out),
                // A capability that expired meanwhile is EACCES: a new layout brings another.
                Err(e) if matches!(e.errno, Errno::EIO | Errno::EACCES) && attempt < ATTEMPTS => {
                    tracing::debug!(path = raw, error = %e, "a piece moved or went away: reading a new layout");
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Bytes `[offset, offset + len)` (cut at the file's size) of a file laid out as
    /// `pieces`; holes read as zeros.
    async fn fetch_pieces(
        &self,
        raw: &str,
        (attr, pieces, cap): (&Attr, &[Piece], Option<&Capability>),
        offset: u64,
        len: usize,
    ) -> Result<Vec<u8>, FsError> {
        let end = attr.size.min(offset.saturating_add(len as u64));
        if offset >= end {
            return Ok(Vec::new());
        }
        let mut out = vec![0u8; (end - offset) as usize];
        let fetches = plan_fetches(pieces, offset, end);
        // The futures are built first (not in a stream closure) so the returned future is
        // `Send` for any caller lifetime.
        let gets: Vec<_> = fetches
            .iter()
            .map(|f| async move {
                let req = Request::DataGet { ranges: f.ranges.clone(), cap: cap.cloned() };
                match self.rpc("read", raw, f.server, req).await? {
                    Reply::Data(d) if d.len() == f.len => {
                        self.direct.read.fetch_add(d.len() as u64, Ordering::Relaxed);
                        Ok(d)
                    }
                    Reply::Data(d) => Err(FsError::new("read", raw, Errno::EIO).with_detail(format!(
                        "data server {} sent {} bytes, {} asked",
                        f.server,
                        d.len(),
                        f.len
                    ))),
                    other => Err(FsError::new("read", raw, Errno::EPROTO).with_detail(format!("{other:?}"))),
                }
            })
            .collect();
        let window = self.opts.io_window.max(1);
        let got: Vec<Payload> = stream::iter(gets).buffered(window).try_collect().await?;
        for (f, data) in fetches.iter().zip(got) {
            data.copy_to(&mut out[f.dst..f.dst + f.len]);
        }
        Ok(out)
    }
}

/// Records a write stored on the data servers, and their receipts (under a capability).
#[derive(Default)]
struct Stored {
    pieces: Vec<Piece>,
    receipts: Vec<Receipt>,
}

/// The inode number of regular file `a`, or why a write to it is refused.
fn regular(raw: &str, a: &Attr) -> Result<Ino, FsError> {
    match a.kind {
        FileKind::File => Ok(a.ino),
        FileKind::Dir => Err(FsError::new("write", raw, Errno::EISDIR)),
        _ => Err(FsError::new("write", raw, Errno::EINVAL).with_detail("not a regular file")),
    }
}

/// The `DataGet`s that read bytes `[offset, end)` of a file laid out as `pieces`: runs of
/// consecutive pieces on one server, at most [`IO_CHUNK`] bytes each.
fn plan_fetches(pieces: &[Piece], offset: u64, end: u64) -> Vec<Fetch> {
    let mut out: Vec<Fetch> = Vec::new();
    for q in pieces.iter().filter(|q| q.end() > offset && q.file_off < end) {
        let from = q.file_off.max(offset);
        let to = q.end().min(end);
        let dst = (from - offset) as usize;
        let n = (to - from) as usize;
        let range = (q.record, q.skip + (from - q.file_off), n as u64);
        match out.last_mut() {
            Some(f) if f.server == q.server && f.dst + f.len == dst && f.len + n <= IO_CHUNK => {
                f.len += n;
                f.ranges.push(range);
            }
            _ => out.push(Fetch { server: q.server, dst, len: n, ranges: vec![range] }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(file_off: u64, len: u64, server: ServerId, record: u64) -> Piece {
        Piece { file_off, len, server, record, skip: 0 }
    }

    #[test]
    fn fetches_join_neighbours_on_one_server_and_skip_holes() {
        let mib = 1 << 20;
        let pieces = [piece(0, mib, 1, 10), piece(mib, mib, 1, 11), piece(3 * mib, mib, 2, 12)];
        let f = plan_fetches(&pieces, 512 << 10, 4 * mib);
        assert_eq!(f.len(), 2);
        assert_eq!((f[0].server, f[0].dst, f[0].len), (1, 0, (mib + mib / 2) as usize));
        assert_eq!(f[0].ranges, vec![(10, 512 << 10, 512 << 10), (11, 0, mib)]);
        // The hole [2 MiB, 3 MiB) is not fetched: it stays zeros.
        assert_eq!((f[1].server, f[1].dst, f[1].len), (2, (mib * 5 / 2) as usize, mib as usize));
    }

    #[test]
    fn a_fetch_holds_at_most_one_io_chunk() {
        let mib = 1u64 << 20;
        let pieces: Vec<Piece> = (0..10).map(|i| piece(i * mib, mib, 3, i)).collect();
        let f = plan_fetches(&pieces, 0, 10 * mib);
        assert!(f.iter().all(|f| f.len <= IO_CHUNK));
        assert_eq!(f.iter().map(|f| f.len).sum::<usize>(), (10 * mib) as usize);
    }
}
