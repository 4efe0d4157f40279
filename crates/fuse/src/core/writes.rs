//! Write gathering: sequential writes to a file are kept in one buffer of up to
//! [`WRITE_BUFFER`] bytes and sent as one request. This module only keeps the buffers;
//! the core sends what it hands back.

use plusfs_proto::path::is_within;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

/// Largest gathered write.
pub const WRITE_BUFFER: usize = 4 << 20;

/// Bytes written to a file and not yet sent.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Pending {
    /// The file's path when they were written.
    pub path: String,
    /// Where they go.
    pub offset: u64,
    /// The bytes.
    pub data: Vec<u8>,
}

/// The gathered writes of every file, by inode number.
#[derive(Default)]
pub(crate) struct Writes {
    pending: Mutex<HashMap<u64, Pending>>,
}

impl Writes {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Pending>> {
        self.pending.lock().expect("pending writes")
    }

    /// Takes the gathered bytes of `ino` (to send them).
    pub fn take(&self, ino: u64) -> Option<Pending> {
        self.lock().remove(&ino)
    }

    /// The files with gathered bytes at or below `path`.
    pub fn within(&self, path: &str) -> Vec<u64> {
        self.lock().iter().filter(|(_, p)| is_within(&p.path, path)).map(|(i, _)| *i).collect()
    }

    /// Gathers `data` written at `offset` of `ino` (known as `path`). Returns the bytes
    /// it cannot be gathered with (to send now): a buffer it does not continue or that it
    /// would make larger than [`WRITE_BUFFER`]; `data` then starts a new buffer.
    pub fn gather(&self, ino: u64, path: &str, offset: u64, data: &[u8]) -> Option<Pending> {
        let mut pending = self.lock();
        if let Some(p) = pending.get_mut(&ino) {
            if p.path == path && p.offset + p.data.len() as u64 == offset && p.data.len() + data.len() <= WRITE_BUFFER {
                p.data.extend_from_slice(data);
                return None;
            }
        }
        pending.insert(ino, Pending { path: path.to_string(), offset, data: data.to_vec() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_writes_are_gathered_and_others_hand_back_the_buffer() {
        let w = Writes::default();
        assert_eq!(w.gather(5, "/a", 0, b"ab"), None);
        assert_eq!(w.gather(5, "/a", 2, b"cd"), None);
        let sent = w.gather(5, "/a", 10, b"x").expect("not a continuation");
        assert_eq!(sent, Pending { path: "/a".into(), offset: 0, data: b"abcd".to_vec() });
        assert_eq!(w.within("/"), vec![5]);
        assert!(w.within("/b").is_empty());
        let full = vec![0; WRITE_BUFFER];
        assert!(w.gather(5, "/a", 11, &full).is_some(), "a buffer never grows past WRITE_BUFFER");
        assert_eq!(w.take(5).map(|p| p.data.len()), Some(WRITE_BUFFER));
        assert_eq!(w.take(5), None);
    }
}
