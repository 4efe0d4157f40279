//! File data that moves in a migration.
//!
//! The small-file bytes a directory's old home stored for its files travel with the
//! directory: the new home copies them into its own data store before the entries become
//! visible there (so a directory's small files stay together, which batch-file I/O
//! needs), and the old home drops its records when it drops its copy of the entries.
//! Chunks of large files are moved in a second stage, once every directory is at its new
//! home, by the server holding each file's entry: those on a server being drained, and
//! those CRUSH now places on another server; shared inodes (hard links) likewise by their
//! home. A moved chunk is copied, the inode's pieces switched under its lock (only if they
//! did not change meanwhile) and the old record dropped.

use super::Migration;
use crate::engine::errors::{eio, err, OpResult};
use crate::engine::locks::Scope;
use bytes::Bytes;
use plusfs_placement::ClusterMap;
use plusfs_proto::filedata::overlay;
use plusfs_proto::{DistState, Errno, FileKind, Ino, Inode, Piece, ServerId};
use plusfs_store::Batch;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes fetched per request when data travels.
const FETCH_BYTES: u64 = 8 << 20;

/// Whether piece `p` of a file whose directory `old` hands over travels with it: the
/// small-file bytes the old home stored itself.
pub(crate) fn travels_with_dir(p: &Piece, small: u64, old: ServerId) -> bool {
    p.server == old && p.file_off < small
}

/// Where piece `p` of file `ino`, whose entry is on server `holder`, belongs now, if it
/// must move: off a drained (or removed) server, or a chunk CRUSH places elsewhere since
/// the epoch the migration started from.
pub(crate) fn new_place(map: &ClusterMap, holder: ServerId, ino: Ino, p: &Piece) -> Option<ServerId> {
    let small = map.data.small_file_bytes;
    let chunk = map.data.chunk_bytes.max(1);
    let draining = map.server(p.server).is_none_or(|s| s.weight == 0.0);
    if p.file_off < small {
        return draining.then_some(holder).filter(|&h| h != p.server);
    }
    let idx = p.file_off / chunk;
    let now = map.chunk_server(ino, idx);
    let moved = map.previous_chunk_server(ino, idx) == Some(p.server) && now != p.server;
    (draining || moved).then_some(now)
}

/// Where an inode whose pieces move is kept here.
#[derive(Clone, Copy)]
enum Held<'a> {
    /// Embedded in entry `name` of directory `dir` (at `path`).
    Entry { path: &'a str, dir: Ino, name: &'a str },
    /// A shared inode object (hard links).
    Shared(Ino),
}

impl Migration {
    /// Copies into this server's data store the bytes of `entries` that travel with their
    /// directory from `old`, switching their pieces to the copies. Returns the bytes.
    pub(crate) async fn bring_data(self: &Arc<Self>, old: ServerId, entries: &mut [(String, Inode)]) -> OpResult<u64> {
        let small = self.engine.map().data.small_file_bytes;
        // (entry, piece) of every travelling piece.
        let wanted: Vec<(usize, usize)> = entries
            .iter()
            .enumerate()
            .filter(|(_, (_, i))| i.kind == FileKind::File && i.link_home.is_none())
            .flat_map(|(e, (_, i))| {
                i.pieces.iter().enumerate().filter(|(_, p)| travels_with_dir(p, small, old)).map(move |(k, _)| (e, k))
            })
            .collect();
        let mut moved = 0;
        let mut from = 0;
        while from < wanted.len() {
            let mut to = from;
            let mut bytes = 0;
            while to < wanted.len() && (to == from || bytes < FETCH_BYTES) {
                bytes += entries[wanted[to].0].1.pieces[wanted[to].1].len;
                to += 1;
            }
            let part = &wanted[from..to];
            let ranges: Vec<(u64, u64, u64)> = part
                .iter()
                .map(|&(e, k)| {
                    let p = &entries[e].1.pieces[k];
                    (p.record, p.skip, p.len)
                })
                .collect();
            let data = self.filedata.fetch_ranges(old, ranges).await?;
            let owners: Vec<Ino> = part.iter().map(|&(e, _)| entries[e].1.ino).collect();
            let ids = self.store_local(&owners, data).await?;
            for (&(e, k), id) in part.iter().zip(ids) {
                let p = &mut entries[e].1.pieces[k];
                (p.server, p.record, p.skip) = (self.engine.id(), id, 0);
            }
            moved += bytes;
            from = to;
        }
        self.migration.bytes_out.fetch_add(moved, Ordering::Relaxed);
        Ok(moved)
    }

    /// Appends records (one per owner and buffer) to this server's data store with one
    /// write and indexes them; answers their ids.
    pub(super) async fn store_local(self: &Arc<Self>, owners: &[Ino], data: Vec<Bytes>) -> OpResult<Vec<u64>> {
        let gate = self.engine.data_gate().read().await;
        let store = self.engine.data().clone();
        let recs: Vec<(Ino, Bytes)> = owners.iter().copied().zip(data).collect();
        let extents = crate::filedata::blocking(move || {
            let refs: Vec<(u64, &[u8])> = recs.iter().map(|(o, b)| (*o, &b[..])).collect();
            store.append_records(&refs)
        })
        .await?;
        let mut b = Batch::new();
        let mut ids = Vec::with_capacity(extents.len());
        for (extent, &owner) in extents.into_iter().zip(owners) {
            ids.push(self.engine.index_record(extent, owner, &mut b).await?);
        }
        self.engine.apply(b).await?;
        drop(gate);
        Ok(ids)
    }

    /// The records an old home drops with handed-over `entries` (their copies are at the
    /// new home).
    pub(crate) fn travelled_records(&self, entries: &[(String, Inode)]) -> Vec<u64> {
        let small = self.engine.map().data.small_file_bytes;
        entries
            .iter()
            .filter(|(_, i)| i.kind == FileKind::File && i.link_home.is_none())
            .flat_map(|(_, i)| {
                i.pieces.iter().filter(|p| travels_with_dir(p, small, self.engine.id())).map(|p| p.record)
            })
            .collect()
    }

    /// One pass of the data stage: moves every piece of the files whose entries are here
    /// that [`new_place`] sends elsewhere. Answers the bytes there were to move when it
    /// began (0: nothing was left).
    pub(crate) async fn move_data_once(self: &Arc<Self>, map: &ClusterMap) -> OpResult<u64> {
        let mut places: HashMap<Ino, String> = HashMap::new();
        for (p, d) in self.engine.store().dirs_within("/").map_err(eio)? {
            if d.dist.state == DistState::Nondistributed {
                places.insert(d.ino, p);
            }
        }
        for (p, d) in self.engine.store().shards_within("/").map_err(eio)? {
            places.insert(d.ino, p);
        }
        let mut todo = Vec::new();
        let mut left = 0;
        for (dir, name, inode) in self.engine.store().all_entries().map_err(eio)? {
            let bytes = self.misplaced_bytes(map, &inode);
            if let (true, None, Some(path)) = (bytes > 0, inode.link_home, places.get(&dir)) {
                left += bytes;
                todo.push((path.clone(), dir, name));
            }
        }
        // Shared inodes (hard links) held here: their pieces move like an entry's.
        for inode in self.engine.store().all_inodes().map_err(eio)? {
            let bytes = self.misplaced_bytes(map, &inode);
            if bytes > 0 {
                left += bytes;
                todo.push((String::new(), inode.ino, String::new()));
            }
        }
        let initial = left;
        self.migration.bytes_left.store(left, Ordering::Relaxed);
        let budget = map.rebalance.mib_per_sec as f64 * (1 << 20) as f64;
        for (path, dir, name) in todo {
            let started = Instant::now();
            let slot = match path.is_empty() {
                true => Held::Shared(dir),
                false => Held::Entry { path: &path, dir, name: &name },
            };
            let moved = self.move_entry_data(map, slot).await?;
            left = left.saturating_sub(moved);
            self.migration.bytes_left.store(left, Ordering::Relaxed);
            let due = Duration::from_secs_f64(moved as f64 / budget);
            if let Some(rest) = due.checked_sub(started.elapsed()) {
                tokio::time::sleep(rest).await;
            }
        }
        Ok(initial)
    }

    /// Bytes of `inode`'s pieces that [`new_place`] sends elsewhere.
    fn misplaced_bytes(&self, map: &ClusterMap, inode: &Inode) -> u64 {
        let me = self.engine.id();
        inode.pieces.iter().filter(|p| new_place(map, me, inode.ino, p).is_some()).map(|p| p.len).sum()
    }

    /// Moves the misplaced pieces of the inode `held` names under its lock. Answers the
    /// bytes moved.
    async fn move_entry_data(self: &Arc<Self>, map: &ClusterMap, held: Held<'_>) -> OpResult<u64> {
        let wanted = match held {
            Held::Entry { path, name, .. } => (path.to_string(), Scope::Name(name.to_string())),
            Held::Shared(ino) => crate::engine::links::inode_lock(ino),
        };
        let _g = self
            .engine
            .locks()
            .lock(&[wanted], None, true)
            .await
            .map_err(|c| err(Errno::EIO, format!("unexpected conflict with transaction {}", c.0)))?;
        let found = match held {
            Held::Entry { dir, name, .. } => self.engine.store().get_entry(dir, name),
            Held::Shared(ino) => self.engine.store().get_inode(ino),
        };
        let Some(mut inode) = found.map_err(eio)? else { return Ok(0) };
        let moving: Vec<(Piece, ServerId)> = inode
            .pieces
            .iter()
            .filter_map(|p| new_place(map, self.engine.id(), inode.ino, p).map(|t| (*p, t)))
            .collect();
        let mut gone = Vec::new();
        let mut added = Vec::new();
        let mut moved = 0;
        for (p, target) in moving {
            let data = self.filedata.fetch_ranges(p.server, vec![(p.record, p.skip, p.len)]).await?;
            let bytes = data.into_iter().next().unwrap_or_default();
            let copies = if target == self.engine.id() {
                let mut b = Batch::new();
                let gate = self.engine.data_gate().read().await;
                let copies = self.filedata.put_local_parts(inode.ino, p.file_off, vec![bytes], &mut b).await?;
                self.engine.apply(b).await?;
                drop(gate);
                copies
            } else {
                self.filedata.put_remote(target, inode.ino, p.file_off, bytes).await?
            };
            added.extend(copies.iter().map(|q| (q.server, q.record)));
            for q in copies {
                overlay(&mut inode.pieces, q);
            }
            gone.push((p.server, p.record));
            moved += p.len;
        }
        if moved == 0 {
            return Ok(0);
        }
        // Records still used by other pieces of the file stay.
        gone.retain(|g| !inode.pieces.iter().any(|q| (q.server, q.record) == *g));
        gone.sort_unstable();
        gone.dedup();
        let mut b = Batch::new();
        match held {
            Held::Entry { dir, name, .. } => b.put_entry(dir, name, &inode),
            Held::Shared(_) => b.put_inode(&inode),
        }
        if let Err(e) = self.engine.apply(b).await {
            self.filedata.drop_remote(added).await;
            return Err(e);
        }
        self.filedata.drop_remote(gone).await;
        self.migration.bytes_out.fetch_add(moved, Ordering::Relaxed);
        Ok(moved)
    }
}
