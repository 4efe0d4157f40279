//! The file-data store of one server: append-only segment files ("packs") addressed by
//! extents.
//!
//! File data is appended to the *active* segment, `seg-NNNNNNNN.pack` in the store's
//! directory; a segment that reaches its size limit is sealed and a new one started.
//! Every appended buffer becomes one *record*: a 24-byte header (magic, length, CRC-32C
//! of the data, owner inode) followed by the data. An [`Extent`] (segment, offset of the
//! data, length) is what the metadata keeps in a file's inode.
//!
//! The layout serves batch-file I/O (seed 002): [`DataStore::append`] writes the data of
//! many files contiguously with one write call (and one `fdatasync` when durable), and
//! [`DataStore::read_many`] sorts extents by (segment, offset) and merges neighbours that
//! lie within a gap into large reads, the paper's ORDER_LIST (§3.2, Alg. 1).
//!
//! Space of deleted or overwritten data is reclaimed by [`compact`]: live records of a
//! segment are copied to the active one, the owner's metadata is switched to the copies in
//! one atomic update ([`LiveIndex::relocate`]), and only then is the old segment deleted.
//! A crash before the switch leaves unreferenced copies (garbage for a later compaction);
//! a crash after it leaves an unreferenced segment that [`collect_garbage`] deletes. Live
//! data is never without a referenced copy.
//!
//! On open, the active segment's tail is checked record by record and cut after the last
//! whole record: an append torn by a crash was never acknowledged.

mod compact;
mod record;
pub mod replica;

pub use compact::{
    candidates, collect_garbage, compact, compact_segments, live_bytes, CompactStats, Live, LiveIndex, Move,
};

pub use bytes::Bytes;
use parking_lot::{Mutex, RwLock};
use record::{RecordHeader, HEADER_LEN};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{IoSlice, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use thiserror::Error;

/// Where one piece of file data lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Extent {
    pub segment: u32,
    /// Offset of the data (after its record header) in the segment file.
    pub offset: u64,
    pub len: u32,
}

/// Settings of a data store.
#[derive(Debug, Clone)]
pub struct DataOptions {
    /// Size at which the active segment is sealed (default 64 MiB). A single append larger
    /// than this gets a segment of its own.
    pub segment_bytes: u64,
    /// `fdatasync` every append before returning (`sync = always`).
    pub sync: bool,
    /// Appends fail with ENOSPC when they would leave less free space than this on the
    /// store's file system, so the metadata store beside it never runs out (compaction,
    /// which frees space, may use the reserve). Default 64 MiB.
    pub reserve_bytes: u64,
    /// The store is one member's copy of a replicated server slot (see [`replica`]): its
    /// segments may have holes where records of later log entries were placed first, so
    /// opening it never cuts a segment's tail, and appends start a new segment.
    pub replica: bool,
}

impl Default for DataOptions {
    fn default() -> Self {
        DataOptions { segment_bytes: 64 << 20, sync: false, reserve_bytes: 64 << 20, replica: false }
    }
}

/// A data-store failure.
#[derive(Debug, Error)]
pub enum DataError {
    #[error("{op} {path}: {source}")]
    Io { op: &'static str, path: String, source: std::io::Error },
    #[error("segment {segment} at offset {offset}: {reason}")]
    Corrupt { segment: u32, offset: u64, reason: String },
    #[error("extent {0:?} lies outside its segment")]
    OutOfRange(Extent),
    #[error("segment {0} does not exist")]
    NoSegment(u32),
    #[error("a single record holds at most 4 GiB - 1")]
    TooLarge,
    #[error("no space: {needed} bytes to write, {free} free, {reserve} kept in reserve")]
    NoSpace { needed: u64, free: u64, reserve: u64 },
}

impl DataError {
    /// The errno a client should see.
    pub fn errno(&self) -> i32 {
        match self {
            DataError::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            DataError::TooLarge => libc::EFBIG,
            DataError::NoSpace { .. } => libc::ENOSPC,
            _ => libc::EIO,
        }
    }
}

pub(crate) fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> DataError {
    let path = path.display().to_string();
    move |source| DataError::Io { op, path, source }
}

/// Size of one segment file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentInfo {
    pub id: u32,
    pub bytes: u64,
    /// True for the segment appends go to.
    pub active: bool,
}

/// Counters of store activity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DataStats {
    /// Append calls and the records they wrote.
    pub appends: u64,
    pub records: u64,
    pub bytes_written: u64,
    /// Read system calls and the bytes they read (merged reads count once).
    pub reads: u64,
    pub bytes_read: u64,
    pub syncs: u64,
    /// Read system calls by size: up to 4 KiB, 64 KiB, 256 KiB, 1 MiB, and larger (the
    /// I/O-size distribution of seed 002 Fig. 12).
    pub read_sizes: [u64; 5],
}

/// The [`DataStats::read_sizes`] bucket of a read of `n` bytes.
pub fn size_bucket(n: u64) -> usize {
    match n {
        0..=4096 => 0,
        4097..=65_536 => 1,
        65_537..=262_144 => 2,
        262_145..=1_048_576 => 3,
        _ => 4,
    }
}

struct Active {
    id: u32,
    file: Arc<File>,
    len: u64,
}

/// The data store of one server. Appends are serialised; reads run in parallel.
pub struct DataStore {
    dir: PathBuf,
    opts: DataOptions,
    active: Mutex<Active>,
    sealed: RwLock<HashMap<u32, Arc<File>>>,
    stats: Mutex<DataStats>,
}

/// Bytes an unprivileged writer may still use on the file system holding `dir`.
pub fn free_bytes(dir: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid C string and `st` a properly sized out-parameter.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

/// Extents this long are read alone, never merged with neighbours.
pub const LARGE_EXTENT: u32 = 512 << 10;
/// Longest read that merges several extents.
pub const MAX_MERGED_READ: u64 = 8 << 20;

pub(crate) fn segment_name(id: u32) -> String {
    format!("seg-{id:08}.pack")
}

pub(crate) fn parse_segment_name(name: &str) -> Option<u32> {
    name.strip_prefix("seg-")?.strip_suffix(".pack")?.parse().ok()
}

impl DataStore {
    /// Opens (or creates) the store in `dir`, cutting a torn tail off the active segment.
    pub fn open(dir: &Path, opts: DataOptions) -> Result<DataStore, DataError> {
        std::fs::create_dir_all(dir).map_err(io("create", dir))?;
        let mut ids: Vec<u32> = std::fs::read_dir(dir)
            .map_err(io("list", dir))?
            .filter_map(|e| e.ok().and_then(|e| parse_segment_name(&e.file_name().to_string_lossy())))
            .collect();
        ids.sort_unstable();
        let mut sealed = HashMap::new();
        for &id in ids.iter().rev().skip(1) {
            let path = dir.join(segment_name(id));
            sealed.insert(id, Arc::new(File::open(&path).map_err(io("open", &path))?));
        }
        let active_id = ids.last().copied().unwrap_or(1);
        let path = dir.join(segment_name(active_id));
        let file = OpenOptions::new().read(true).append(true).create(true).open(&path).map_err(io("open", &path))?;
        let on_disk = file.metadata().map_err(io("stat", &path))?.len();
        let len =
            if opts.replica { on_disk } else { record::valid_length(&file, active_id).map_err(io("scan", &path))? };
        if len < on_disk {
            tracing::warn!(segment = active_id, cut = on_disk - len, "cutting a torn tail off the active segment");
            file.set_len(len).map_err(io("truncate", &path))?;
            file.sync_data().map_err(io("sync", &path))?;
        }
        let replica = opts.replica;
        let store = DataStore {
            dir: dir.to_path_buf(),
            opts,
            active: Mutex::new(Active { id: active_id, file: Arc::new(file), len }),
            sealed: RwLock::new(sealed),
            stats: Mutex::default(),
        };
        if replica && len > 0 {
            // Appends never follow a hole or another leader's unfinished records.
            store.seal_active()?;
        }
        Ok(store)
    }

    /// Appends `bufs` contiguously (one record each, `owner` recorded in every header) with
    /// one write call, and with `sync` one `fdatasync`. Returns their extents in order.
    pub fn append(&self, owner: u64, bufs: &[&[u8]]) -> Result<Vec<Extent>, DataError> {
        let records: Vec<(u64, &[u8])> = bufs.iter().map(|b| (owner, *b)).collect();
        self.append_records(&records)
    }

    /// Appends records of possibly different owners contiguously, as [`DataStore::append`].
    pub fn append_records(&self, records: &[(u64, &[u8])]) -> Result<Vec<Extent>, DataError> {
        let needed: u64 = records.iter().map(|r| HEADER_LEN as u64 + r.1.len() as u64).sum();
        let free = free_bytes(&self.dir).map_err(io("statvfs", &self.dir))?;
        if free < needed.saturating_add(self.opts.reserve_bytes) {
            return Err(DataError::NoSpace { needed, free, reserve: self.opts.reserve_bytes });
        }
        self.append_unreserved(records)
    }

    /// [`DataStore::append_records`] without the free-space reserve (compaction).
    pub(crate) fn append_unreserved(&self, records: &[(u64, &[u8])]) -> Result<Vec<Extent>, DataError> {
        let bufs: Vec<&[u8]> = records.iter().map(|r| r.1).collect();
        let total: u64 = bufs.iter().map(|b| HEADER_LEN as u64 + b.len() as u64).sum();
        if bufs.iter().any(|b| b.len() >= u32::MAX as usize) {
            return Err(DataError::TooLarge);
        }
        let mut active = self.active.lock();
        if active.len > 0 && active.len + total > self.opts.segment_bytes {
            self.roll(&mut active)?;
        }
        let headers: Vec<[u8; HEADER_LEN]> =
            records.iter().map(|(owner, b)| RecordHeader::for_data(*owner, b).encode()).collect();
        let mut slices = Vec::with_capacity(bufs.len() * 2);
        let mut extents = Vec::with_capacity(bufs.len());
        let mut at = active.len;
        for (h, b) in headers.iter().zip(&bufs) {
            slices.push(IoSlice::new(h));
            slices.push(IoSlice::new(b));
            extents.push(Extent { segment: active.id, offset: at + HEADER_LEN as u64, len: b.len() as u32 });
            at += HEADER_LEN as u64 + b.len() as u64;
        }
        let path = self.dir.join(segment_name(active.id));
        let mut file: &File = &active.file;
        if let Err(e) = write_all_vectored(&mut file, &mut slices) {
            // Cut what part of the records reached the file, so the next append starts
            // where the extents say (the file is opened for appending).
            if let Err(cut) = active.file.set_len(active.len) {
                tracing::error!(segment = active.id, cause = %cut, "cannot cut a failed append; sealing the segment");
                self.roll(&mut active)?;
            }
            return Err(io("write", &path)(e));
        }
        if self.opts.sync {
            active.file.sync_data().map_err(io("sync", &path))?;
        }
        active.len = at;
        let mut st = self.stats.lock();
        st.appends += 1;
        st.records += bufs.len() as u64;
        st.bytes_written += total;
        st.syncs += u64::from(self.opts.sync);
        Ok(extents)
    }

    /// Seals the active segment and starts the next one.
    fn roll(&self, active: &mut Active) -> Result<(), DataError> {
        let old = active.id;
        let path = self.dir.join(segment_name(old));
        active.file.sync_data().map_err(io("sync", &path))?;
        let id = old + 1;
        let new_path = self.dir.join(segment_name(id));
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .create_new(true)
            .open(&new_path)
            .map_err(io("create", &new_path))?;
        // The new segment's name must survive a crash before anything is acknowledged in it.
        File::open(&self.dir).and_then(|d| d.sync_all()).map_err(io("sync", &self.dir))?;
        let sealed = std::mem::replace(&mut active.file, Arc::new(file));
        self.sealed.write().insert(old, sealed);
        active.id = id;
        active.len = 0;
        tracing::debug!(sealed = old, active = id, "new data segment");
        Ok(())
    }

    /// Makes every append so far durable (`fdatasync` of the active segment).
    pub fn sync(&self) -> Result<(), DataError> {
        let active = self.active.lock();
        let path = self.dir.join(segment_name(active.id));
        active.file.sync_data().map_err(io("sync", &path))?;
        self.stats.lock().syncs += 1;
        Ok(())
    }

    /// The records of a sealed or active segment as (extent, owner), by scanning it: what
    /// an index rebuild or a consistency check needs.
    pub fn scan_segment(&self, id: u32) -> Result<Vec<(Extent, u64)>, DataError> {
        let file = self.file(id)?;
        let path = self.dir.join(segment_name(id));
        let (records, _) = record::scan(&file, id).map_err(io("scan", &path))?;
        Ok(records.into_iter().map(|r| (r.extent, r.owner)).collect())
    }

    /// Seals the active segment (the next append starts a new one); compaction seals a
    /// segment before copying out of it.
    pub fn seal_active(&self) -> Result<(), DataError> {
        let mut active = self.active.lock();
        if active.len > 0 {
            self.roll(&mut active)?;
        }
        Ok(())
    }

    fn file(&self, segment: u32) -> Result<Arc<File>, DataError> {
        if let Some(f) = self.sealed.read().get(&segment) {
            return Ok(f.clone());
        }
        let active = self.active.lock();
        if active.id == segment {
            return Ok(active.file.clone());
        }
        drop(active);
        // A roll may have sealed it between the two looks (it holds the active segment's
        // lock while it does, so it is done now).
        self.sealed.read().get(&segment).cloned().ok_or(DataError::NoSegment(segment))
    }

    /// The data of one extent, checked against its record's CRC.
    pub fn read(&self, e: &Extent) -> Result<Bytes, DataError> {
        Ok(self.read_many(&[*e], 0)?.pop().expect("one extent read"))
    }

    /// The data of many extents, in the order given. Extents are read sorted by (segment,
    /// offset); neighbours less than `max_gap` bytes apart are read with one system call
    /// (seed 002's ORDER_LIST) up to [`MAX_MERGED_READ`] bytes, extents of at least
    /// [`LARGE_EXTENT`] bytes are read on their own (seed 002 §3.2.2), and each record is
    /// checked against its CRC. Each result is a slice of the buffer its read filled (one
    /// `pread` per run, no further copy).
    pub fn read_many(&self, extents: &[Extent], max_gap: u64) -> Result<Vec<Bytes>, DataError> {
        let mut order: Vec<usize> = (0..extents.len()).collect();
        order.sort_by_key(|&i| (extents[i].segment, extents[i].offset));
        let mut out: Vec<Bytes> = vec![Bytes::new(); extents.len()];
        let mut i = 0;
        while i < order.len() {
            // A run: extents of one segment whose records are at most max_gap apart.
            let first = extents[order[i]];
            let start = first.offset - HEADER_LEN as u64;
            let mut end = first.offset + first.len as u64;
            let mut j = i + 1;
            while j < order.len() && first.len < LARGE_EXTENT {
                let e = extents[order[j]];
                if e.segment != first.segment
                    || e.len >= LARGE_EXTENT
                    || (e.offset - HEADER_LEN as u64).saturating_sub(end) > max_gap
                    || e.offset + e.len as u64 - start > MAX_MERGED_READ
                {
                    break;
                }
                end = end.max(e.offset + e.len as u64);
                j += 1;
            }
            let span = self.read_span(first.segment, start, end)?;
            for &k in &order[i..j] {
                let e = extents[k];
                let at = (e.offset - HEADER_LEN as u64 - start) as usize;
                out[k] = record::check(span.slice(at..at + HEADER_LEN + e.len as usize), e)?;
            }
            i = j;
        }
        Ok(out)
    }

    fn read_span(&self, segment: u32, start: u64, end: u64) -> Result<Bytes, DataError> {
        let file = self.file(segment)?;
        let mut buf = vec![0u8; (end - start) as usize];
        file.read_exact_at(&mut buf, start).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => {
                DataError::OutOfRange(Extent { segment, offset: start + HEADER_LEN as u64, len: (end - start) as u32 })
            }
            _ => DataError::Io {
                op: "read",
                path: self.dir.join(segment_name(segment)).display().to_string(),
                source: e,
            },
        })?;
        let mut st = self.stats.lock();
        st.reads += 1;
        st.bytes_read += end - start;
        st.read_sizes[size_bucket(end - start)] += 1;
        Ok(Bytes::from(buf))
    }

    /// Every segment with its size, in id order.
    pub fn segments(&self) -> Vec<SegmentInfo> {
        let active = self.active.lock();
        let sealed = self.sealed.read();
        let mut out: Vec<SegmentInfo> = sealed
            .iter()
            .map(|(&id, f)| SegmentInfo { id, bytes: f.metadata().map(|m| m.len()).unwrap_or(0), active: false })
            .collect();
        out.push(SegmentInfo { id: active.id, bytes: active.len, active: true });
        out.sort_by_key(|s| s.id);
        out
    }

    /// Deletes a sealed segment. The caller guarantees nothing references it any more.
    pub fn delete_segment(&self, id: u32) -> Result<(), DataError> {
        if self.active.lock().id == id {
            return Err(DataError::Corrupt {
                segment: id,
                offset: 0,
                reason: "the active segment cannot be deleted".into(),
            });
        }
        self.sealed.write().remove(&id).ok_or(DataError::NoSegment(id))?;
        let path = self.dir.join(segment_name(id));
        std::fs::remove_file(&path).map_err(io("delete", &path))?;
        tracing::info!(segment = id, "data segment deleted");
        Ok(())
    }

    /// Activity counters.
    pub fn stats(&self) -> DataStats {
        *self.stats.lock()
    }
}

/// `write_all` over `IoSlice`s (stable Rust lacks `Write::write_all_vectored`).
fn write_all_vectored(w: &mut impl Write, mut slices: &mut [IoSlice<'_>]) -> std::io::Result<()> {
    IoSlice::advance_slices(&mut slices, 0);
    while !slices.is_empty() {
        match w.write_vectored(slices) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut slices, n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
