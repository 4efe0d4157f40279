//! The file-descriptor table of a client: small integers for open files, as `openv`,
//! `closev` and the C library hand them out.

use crate::types::FileHandle;
use std::collections::HashMap;
use std::sync::Mutex;

/// Open files by descriptor. Descriptors start at 3 and are reused after close, lowest
/// first, like a process's.
#[derive(Default)]
pub struct FdTable {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    open: HashMap<i32, FileHandle>,
    free: std::collections::BTreeSet<i32>,
    next: i32,
}

impl FdTable {
    /// Registers an open file and returns its descriptor.
    pub fn insert(&self, h: FileHandle) -> i32 {
        let mut t = self.inner.lock().expect("fd table");
        let fd = match t.free.pop_first() {
            Some(fd) => fd,
            None => {
                t.next = t.next.max(3);
                let fd = t.next;
                t.next += 1;
                fd
            }
        };
        t.open.insert(fd, h);
        fd
    }

    /// The open file behind `fd`.
    pub fn get(&self, fd: i32) -> Option<FileHandle> {
        self.inner.lock().expect("fd table").open.get(&fd).cloned()
    }

    /// Forgets `fd`; returns what it was.
    pub fn remove(&self, fd: i32) -> Option<FileHandle> {
        let mut t = self.inner.lock().expect("fd table");
        let h = t.open.remove(&fd);
        if h.is_some() {
            t.free.insert(fd);
        }
        h
    }

    /// Number of open descriptors.
    pub fn len(&self) -> usize {
        self.inner.lock().expect("fd table").open.len()
    }

    /// True when nothing is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
