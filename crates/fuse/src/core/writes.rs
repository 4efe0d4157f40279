//! Write gathering: sequential writes to a file are kept in one buffer of up to
//! [`WRITE_BUFFER`] bytes and sent as one write. A full buffer (or one a write does not
//! continue) is sent in the background (write-behind) while the next one fills: up to
//! [`MAX_BEHIND`] sends per file of disjoint ranges are under way at once (a send waits for
//! those it overlaps, so a file's bytes land in the order written), and their first error
//! is returned by the file's next write and again by its next flush or fsync. This module
//! only keeps the buffers; the core sends what it hands back.

use super::types::Caller;
use plusfs_proto::path::is_within;
use plusfs_proto::{Attr, SetAttr};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// Largest gathered write.
pub const WRITE_BUFFER: usize = 16 << 20;
/// Background sends of one file under way at once.
pub const MAX_BEHIND: usize = 8;

/// Bytes written to a file and not yet sent.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Pending {
    /// Who wrote them (the opener of the handle they came through): they are sent as it.
    pub caller: Caller,
    /// The file's path when they were written.
    pub path: String,
    /// Where they go.
    pub offset: u64,
    /// The bytes.
    pub data: Vec<u8>,
}

impl Pending {
    /// The offset just past the bytes.
    pub fn end(&self) -> u64 {
        self.offset + self.data.len() as u64
    }
}

/// A full buffer being sent in the background.
#[derive(Debug)]
pub(crate) struct Sending {
    /// The file's inode.
    pub ino: u64,
    /// The file's path when the bytes were written.
    pub path: String,
    /// Where the bytes go.
    pub offset: u64,
    /// The offset just past the bytes.
    pub end: u64,
    /// The send: the file's attributes after it, or the errno for the application.
    pub task: tokio::task::JoinHandle<Result<Attr, plusfs_proto::Errno>>,
}

/// What a file holds back: gathered bytes, a buffer being sent, and attribute changes
/// to send after them (`attrs.rs`), with the caller they are sent for.
#[derive(Debug, Default)]
pub(crate) struct Gathered {
    pub data: Option<Pending>,
    /// Background sends under way, oldest first.
    pub sending: Vec<Sending>,
    /// The error of a background send, kept until a flush or fsync reports it (a write
    /// that met it reported it too).
    pub failed: Option<plusfs_proto::Errno>,
    pub set: Option<(Caller, SetAttr)>,
    /// The path the held-back changes were made under.
    pub set_path: String,
}

impl Gathered {
    /// Whether nothing is held back.
    pub fn is_empty(&self) -> bool {
        self.data.is_none() && self.sending.is_empty() && self.set.is_none() && self.failed.is_none()
    }

    /// `a` grown to the end of the gathered bytes (what the file's size is once they are
    /// stored).
    pub fn grown(&self, mut a: Attr) -> Attr {
        if let Some(p) = &self.data {
            a.size = a.size.max(p.end());
        }
        for s in &self.sending {
            a.size = a.size.max(s.end);
        }
        a
    }

    /// Whether something held back belongs to a file at or below `path`.
    fn within(&self, path: &str) -> bool {
        self.data.as_ref().is_some_and(|p| is_within(&p.path, path))
            || self.sending.iter().any(|s| is_within(&s.path, path))
            || (self.set.is_some() && is_within(&self.set_path, path))
    }
}

/// One file's held-back writes behind its write lock: whoever holds the lock may add to
/// them or send them, so a file's writes reach the servers in order.
pub(crate) type Slot = Arc<tokio::sync::Mutex<Gathered>>;

/// The gathered writes of every file, by inode number.
#[derive(Default)]
pub(crate) struct Writes {
    slots: Mutex<HashMap<u64, Slot>>,
}

impl Writes {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Slot>> {
        self.slots.lock().expect("pending writes")
    }

    /// The write slot of `ino` (made empty on first use).
    pub fn slot(&self, ino: u64) -> Slot {
        self.lock().entry(ino).or_default().clone()
    }

    /// The write slot of `ino` if it has one (nothing was gathered for it otherwise).
    pub fn get(&self, ino: u64) -> Option<Slot> {
        self.lock().get(&ino).cloned()
    }

    /// Forgets the slot of `ino` if nothing is gathered in it and nobody holds it (after
    /// the file's last release).
    pub fn drop_idle(&self, ino: u64) {
        let mut slots = self.lock();
        let idle =
            slots.get(&ino).is_some_and(|s| Arc::strong_count(s) == 1 && s.try_lock().is_ok_and(|g| g.is_empty()));
        if idle {
            slots.remove(&ino);
        }
    }

    /// The files with gathered bytes at or below `path`. Slots nobody holds are looked at
    /// without waiting; a held one is waited for (its holder may be gathering into it).
    pub async fn within(&self, path: &str) -> Vec<u64> {
        let mut busy = Vec::new();
        let mut out = Vec::new();
        for (ino, slot) in self.lock().iter() {
            match slot.try_lock() {
                Ok(held) if held.within(path) => out.push(*ino),
                Ok(_) => {}
                Err(_) => busy.push((*ino, slot.clone())),
            }
        }
        for (ino, slot) in busy {
            if slot.lock().await.within(path) {
                out.push(ino);
            }
        }
        out
    }
}

/// Gathers `data` written by `caller` at `offset` of a file known as `path` into its
/// slot's bytes. Returns the bytes it cannot be gathered with (to send now): a buffer of
/// another caller, one it does not continue or that it would make larger than
/// [`WRITE_BUFFER`]; `data` then starts a new buffer.
pub(crate) fn gather(
    pending: &mut Option<Pending>,
    (caller, path): (&Caller, &str),
    offset: u64,
    data: &[u8],
) -> Option<Pending> {
    if let Some(p) = pending {
        let continues = p.caller == *caller && p.path == path && p.end() == offset;
        if continues && p.data.len() + data.len() <= WRITE_BUFFER {
            p.data.extend_from_slice(data);
            return None;
        }
    }
    pending.replace(Pending { caller: caller.clone(), path: path.to_string(), offset, data: data.to_vec() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_writes_are_gathered_and_others_hand_back_the_buffer() {
        let mut p = None;
        let (root, alice) = (Caller::ROOT, Caller { uid: 1000, gid: 1000, groups: vec![] });
        assert_eq!(gather(&mut p, (&root, "/a"), 0, b"ab"), None);
        assert_eq!(gather(&mut p, (&root, "/a"), 2, b"cd"), None);
        let sent = gather(&mut p, (&root, "/a"), 10, b"x").expect("not a continuation");
        assert_eq!(sent, Pending { caller: root.clone(), path: "/a".into(), offset: 0, data: b"abcd".to_vec() });
        let theirs = gather(&mut p, (&alice, "/a"), 11, b"y").expect("another caller's bytes go apart");
        assert_eq!((theirs.caller, theirs.data), (root.clone(), b"x".to_vec()));
        let full = vec![0; WRITE_BUFFER];
        assert!(gather(&mut p, (&alice, "/a"), 12, &full).is_some(), "a buffer never grows past WRITE_BUFFER");
        assert_eq!(p.take().map(|p| p.data.len()), Some(WRITE_BUFFER));
    }

    #[tokio::test]
    async fn slots_are_found_by_path_and_dropped_when_idle() {
        let w = Writes::default();
        let p = Pending { caller: Caller::ROOT, path: "/d/a".into(), offset: 0, data: b"x".to_vec() };
        w.slot(5).lock().await.data = Some(p);
        assert_eq!(w.within("/d").await, vec![5]);
        assert!(w.within("/e").await.is_empty());
        w.drop_idle(5);
        assert!(w.lock().contains_key(&5), "a slot holding bytes stays");
        w.slot(5).lock().await.data.take();
        w.drop_idle(5);
        assert!(!w.lock().contains_key(&5));
        assert!(w.get(6).is_none() && w.lock().is_empty(), "looking does not make a slot");
    }
}
