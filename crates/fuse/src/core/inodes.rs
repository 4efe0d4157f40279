//! Inode number → path, with the kernel's lookup counts.

use plusfs_proto::path::{is_within, rebase, split};
use std::collections::HashMap;

struct Node {
    /// The names it is known under, the latest last (a hard-linked file has several).
    paths: Vec<String>,
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
        t.nodes.insert(1, Node { paths: vec!["/".into()], lookups: 1 });
        t.by_path.insert("/".into(), 1);
        t
    }

    /// A path of `ino` (the one it was last looked up under that still names it).
    pub fn path(&self, ino: u64) -> Option<String> {
        self.nodes.get(&ino).and_then(|n| n.paths.last().cloned())
    }

    /// The inode known under `path`.
    pub fn ino_of(&self, path: &str) -> Option<u64> {
        self.by_path.get(path).copied()
    }

    /// Inode number of the parent of `dir` (1 for `/` and unknown parents).
    pub fn parent_ino(&self, dir: &str) -> u64 {
        split(dir).and_then(|(p, _)| self.by_path.get(p).copied()).unwrap_or(1)
    }

    /// The kernel was given `ino` for `path` (one more lookup).
    pub fn remember(&mut self, ino: u64, path: &str) {
        if let Some(old) = self.by_path.insert(path.to_string(), ino).filter(|o| *o != ino) {
            if let Some(n) = self.nodes.get_mut(&old) {
                n.paths.retain(|p| p != path);
            }
        }
        let n = self.nodes.entry(ino).or_insert_with(|| Node { paths: Vec::new(), lookups: 0 });
        n.paths.retain(|p| p != path);
        n.paths.push(path.to_string());
        n.lookups += 1;
    }

    /// The name `path` was removed (its inode may live on under other names).
    pub fn unlinked(&mut self, path: &str) {
        if let Some(ino) = self.by_path.remove(path) {
            if let Some(n) = self.nodes.get_mut(&ino) {
                n.paths.retain(|p| p != path);
            }
        }
    }

    /// The kernel dropped `count` lookups of `ino`.
    pub fn forget(&mut self, ino: u64, count: u64) {
        if ino == 1 {
            return;
        }
        if let Some(n) = self.nodes.get_mut(&ino) {
            n.lookups = n.lookups.saturating_sub(count);
            if n.lookups == 0 {
                for path in &n.paths {
                    if self.by_path.get(path) == Some(&ino) {
                        self.by_path.remove(path);
                    }
                }
                self.nodes.remove(&ino);
            }
        }
    }

    /// Entries `a` and `b` (non-directories) swapped their inodes.
    pub fn exchanged(&mut self, a: &str, b: &str) {
        let (ia, ib) = (self.by_path.remove(a), self.by_path.remove(b));
        for (ino, from, to) in [(ia, a, b), (ib, b, a)] {
            let Some(ino) = ino else { continue };
            if let Some(n) = self.nodes.get_mut(&ino) {
                for p in n.paths.iter_mut().filter(|p| *p == from) {
                    *p = to.to_string();
                }
            }
            self.by_path.insert(to.to_string(), ino);
        }
    }

    /// `src` was renamed to `dst`: it and everything known below it moved.
    pub fn renamed(&mut self, src: &str, dst: &str) {
        // Whatever was known at the destination is gone (replaced).
        self.unlinked(dst);
        let moved: Vec<String> = self.by_path.keys().filter(|p| is_within(p, src)).cloned().collect();
        for old in moved {
            let ino = self.by_path.remove(&old).expect("listed");
            let new = rebase(&old, src, dst);
            if let Some(n) = self.nodes.get_mut(&ino) {
                for p in n.paths.iter_mut().filter(|p| **p == old) {
                    *p = new.clone();
                }
            }
            self.by_path.insert(new, ino);
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

    #[test]
    fn exchange_swaps_names() {
        let mut t = Inodes::new();
        t.remember(5, "/a");
        t.remember(6, "/b");
        t.exchanged("/a", "/b");
        assert_eq!(t.path(5).as_deref(), Some("/b"));
        assert_eq!(t.path(6).as_deref(), Some("/a"));
    }

    #[test]
    fn hard_links_keep_every_name() {
        let mut t = Inodes::new();
        t.remember(5, "/a");
        t.remember(5, "/d/b");
        assert_eq!(t.path(5).as_deref(), Some("/d/b"));
        t.unlinked("/d/b");
        assert_eq!(t.path(5).as_deref(), Some("/a"));
        t.renamed("/a", "/c");
        assert_eq!(t.path(5).as_deref(), Some("/c"));
        t.unlinked("/c");
        assert_eq!(t.path(5), None);
        // A name re-used by another inode leaves the first one's names.
        t.remember(6, "/x");
        t.remember(7, "/x");
        assert_eq!(t.path(6), None);
        assert_eq!(t.path(7).as_deref(), Some("/x"));
    }
}
