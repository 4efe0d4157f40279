//! Inode number → path, with the kernel's lookup counts.

use plusfs_proto::path::{is_within, rebase, split};
use std::collections::HashMap;

struct Node {
    path: String,
    lookups: u64,
}

/// The inodes the kernel knows, by number. `/` (1) is always known.
pub(crate) struct Inodes {
    nodes: HashMap<u64, Node>,
    by_path: HashMap<String, u64>,
}

impl Inodes {
    pub fn new() -> Inodes {
        let mut t = Inodes { nodes: HashMap::new(), by_path: HashMap::new() };
        t.nodes.insert(1, Node { path: "/".into(), lookups: 1 });
        t.by_path.insert("/".into(), 1);
        t
    }

    pub fn path(&self, ino: u64) -> Option<String> {
        self.nodes.get(&ino).map(|n| n.path.clone())
    }

    /// Inode number of the parent of `dir` (1 for `/` and unknown parents).
    pub fn parent_ino(&self, dir: &str) -> u64 {
        split(dir).and_then(|(p, _)| self.by_path.get(p).copied()).unwrap_or(1)
    }

    /// The kernel was given `ino` for `path` (one more lookup).
    pub fn remember(&mut self, ino: u64, path: &str) {
        let n = self.nodes.entry(ino).or_insert_with(|| Node { path: path.to_string(), lookups: 0 });
        if n.path != path {
            self.by_path.remove(&n.path);
            n.path = path.to_string();
        }
        n.lookups += 1;
        self.by_path.insert(path.to_string(), ino);
    }

    /// The kernel dropped `count` lookups of `ino`.
    pub fn forget(&mut self, ino: u64, count: u64) {
        if ino == 1 {
            return;
        }
        if let Some(n) = self.nodes.get_mut(&ino) {
            n.lookups = n.lookups.saturating_sub(count);
            if n.lookups == 0 {
                let path = n.path.clone();
                self.nodes.remove(&ino);
                if self.by_path.get(&path) == Some(&ino) {
                    self.by_path.remove(&path);
                }
            }
        }
    }

    /// `src` was renamed to `dst`: it and everything known below it moved.
    pub fn renamed(&mut self, src: &str, dst: &str) {
        let moved: Vec<u64> = self.nodes.iter().filter(|(_, n)| is_within(&n.path, src)).map(|(i, _)| *i).collect();
        // Whatever was known at the destination is gone (replaced).
        if let Some(old) = self.by_path.remove(dst) {
            if !moved.contains(&old) {
                self.nodes.remove(&old);
            }
        }
        for ino in moved {
            let n = self.nodes.get_mut(&ino).expect("listed");
            self.by_path.remove(&n.path);
            n.path = rebase(&n.path, src, dst);
            self.by_path.insert(n.path.clone(), ino);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renames_move_descendants_and_forget_drops() {
        let mut t = Inodes::new();
        t.remember(5, "/a");
        t.remember(6, "/a/b");
        t.remember(7, "/a/b/c");
        t.remember(8, "/ab");
        t.renamed("/a", "/x");
        assert_eq!(t.path(7).as_deref(), Some("/x/b/c"));
        assert_eq!(t.path(8).as_deref(), Some("/ab"));
        assert_eq!(t.parent_ino("/x/b"), 5);
        t.forget(7, 1);
        assert_eq!(t.path(7), None);
        t.forget(1, 100);
        assert_eq!(t.path(1).as_deref(), Some("/"));
    }
}
