//! A reference model of the namespace for model tests with shrinking.
//!
//! [`Model`] is the POSIX namespace below one test directory as plusfs documents it:
//! directories, files and symbolic links, hard links (one inode under several names, its
//! link count visible through `lstat`), `rename` with `RENAME_EXCHANGE` ([`Op::Exchange`]),
//! file contents, and the huge-directory policy of every directory (when it must be
//! distributed over several servers). [`Model::apply`] answers what the cluster must
//! answer, errno by errno; [`Model::tree`] is what a walk of the cluster must find
//! ([`observe`]).
//!
//! [`Reference`] turns the model into a `proptest` state machine: it generates operations
//! (biased towards paths that exist) and, through [`FaultSource`], fault steps for tests
//! that inject faults. [`explore`] runs a test over many generated sequences, shrinks a
//! failing one and panics with the shrunk sequence, its setup and the seed that replays
//! it. [`run_exact`] is the fault-free check both the in-process and the multi-process
//! model tests use.
//!
//! Where plusfs picks one of several errors POSIX allows, the model follows plusfs (as the
//! multi-process tests `links.rs` and `namespace_model.rs` pin it): a path through a file or
//! symbolic link is ENOTDIR (no symbolic link is followed inside a path); `link` of a
//! directory is EPERM before the new name is looked at; directories cannot be exchanged
//! (EINVAL). Where two of an operation's errors hold at once and plusfs checks them on
//! different servers, [`Expect::Fail`] lists both.

use plusfs_client::{fsck, Client, FsError};
use plusfs_placement::TxnProtocol;
use plusfs_proto::path::{is_within, join, rebase, split};
use plusfs_proto::{Attr, DistState, Errno, FileKind, Threshold};
use proptest::prelude::*;
use proptest::sample::select;
use proptest::strategy::Union;
use proptest::test_runner::{Config, FileFailurePersistence, RngSeed, TestCaseError, TestError, TestRunner};
use proptest_state_machine::ReferenceStateMachine;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Names of generated paths (short lists collide often, which is the point).
pub const NAMES: [&str; 3] = ["a", "b", "c"];
/// Target of every generated symbolic link (its length is the link's size).
pub const TARGET: &str = "/somewhere";
/// Deepest generated path (renames may move entries deeper).
const MAX_DEPTH: usize = 3;

/// One namespace operation, on paths relative to the test directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Mkdir(String),
    /// `mkdir_with(path, Threshold::Entries(threshold), width)`: a directory distributed
    /// once it holds more than `threshold` entries (from creation for 0).
    MkdirHuge(String, u64, u32),
    /// Exclusive create (EEXIST for any existing entry).
    Create(String),
    Symlink(String),
    /// `len` bytes of `byte` at offset 0.
    Write(String, u8, u8),
    Unlink(String),
    Rmdir(String),
    Rename(String, String),
    /// `rename(a, b)` with `RENAME_EXCHANGE`.
    Exchange(String, String),
    /// `link(src, dst)`.
    Link(String, String),
    /// `lstat`; the kind, link count and size must be the model's.
    Stat(String),
    /// `set_policy(path, Entries(0))`: distribute the directory now.
    Distribute(String),
}

impl Op {
    /// Short name of the operation, for the totals.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Mkdir(_) => "mkdir",
            Op::MkdirHuge(..) => "mkdir_huge",
            Op::Create(_) => "create",
            Op::Symlink(_) => "symlink",
            Op::Write(..) => "write",
            Op::Unlink(_) => "unlink",
            Op::Rmdir(_) => "rmdir",
            Op::Rename(..) => "rename",
            Op::Exchange(..) => "exchange",
            Op::Link(..) => "link",
            Op::Stat(_) => "stat",
            Op::Distribute(_) => "distribute",
        }
    }
}

/// The huge-directory policy and state of a directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Policy {
    /// Distributed once it holds more entries than this (`None`: the cluster's setting,
    /// which the tests leave far above what they create).
    pub threshold: Option<u64>,
    /// Storing servers (0: the cluster's setting).
    pub width: u32,
    /// Was over its threshold at some point, so it may be distributed (it never goes back).
    pub crossed: bool,
}

/// One name in the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    Dir(Policy),
    /// A regular file: the model's id of its inode (shared by its hard links).
    File(u64),
    /// A symbolic link to [`TARGET`]: the model's id of its inode.
    Symlink(u64),
}

impl Entry {
    fn kind(&self) -> FileKind {
        match self {
            Entry::Dir(_) => FileKind::Dir,
            Entry::File(_) => FileKind::File,
            Entry::Symlink(_) => FileKind::Symlink,
        }
    }

    fn inode(&self) -> Option<u64> {
        match *self {
            Entry::Dir(_) => None,
            Entry::File(id) | Entry::Symlink(id) => Some(id),
        }
    }
}

/// What the model allows as the answer to an operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    Done,
    /// Refused with one of these errors, nothing changed.
    Fail(Vec<Errno>),
}

impl Expect {
    /// True if `got` is an allowed answer.
    pub fn admits(&self, got: &Result<Answer, Errno>) -> bool {
        match (self, got) {
            (Expect::Done, Ok(_)) => true,
            (Expect::Fail(allowed), Err(e)) => allowed.contains(e),
            _ => false,
        }
    }
}

impl From<Result<(), Errno>> for Expect {
    fn from(r: Result<(), Errno>) -> Expect {
        match r {
            Ok(()) => Expect::Done,
            Err(e) => Expect::Fail(vec![e]),
        }
    }
}

type R = Result<(), Errno>;

/// The namespace below the test directory (whose path in the model is `/`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Model {
    entries: BTreeMap<String, Entry>,
    /// Contents of regular files by inode id.
    data: BTreeMap<u64, Vec<u8>>,
    next_id: u64,
}

impl Model {
    /// An empty test directory with huge-directory threshold `top` (`None`: the cluster's).
    pub fn new(top: Option<u64>) -> Model {
        let root = Policy { threshold: top, width: 0, crossed: top == Some(0) };
        Model { entries: BTreeMap::from([("/".to_string(), Entry::Dir(root))]), data: BTreeMap::new(), next_id: 1 }
    }

    /// The entry at `p`.
    pub fn get(&self, p: &str) -> Option<Entry> {
        self.entries.get(p).copied()
    }

    /// Every path but the test directory's own.
    pub fn paths(&self) -> Vec<String> {
        self.entries.keys().filter(|k| *k != "/").cloned().collect()
    }

    /// Every directory with its policy (the test directory is `/`).
    pub fn dirs(&self) -> Vec<(String, Policy)> {
        self.entries
            .iter()
            .filter_map(|(k, e)| match e {
                Entry::Dir(p) => Some((k.clone(), *p)),
                _ => None,
            })
            .collect()
    }

    /// Applies `op` and returns the answer the cluster must give.
    pub fn apply(&mut self, op: &Op) -> Expect {
        match op {
            Op::Mkdir(p) => self.make(p, Entry::Dir(Policy::default())).into(),
            Op::MkdirHuge(p, t, w) => {
                let policy = Policy { threshold: Some(*t), width: *w, crossed: *t == 0 };
                self.make(p, Entry::Dir(policy)).into()
            }
            Op::Create(p) => self.make_file(p, false).into(),
            Op::Symlink(p) => self.make_file(p, true).into(),
            Op::Write(p, len, byte) => self.write(p, *len as usize, *byte).into(),
            Op::Unlink(p) => self.unlink(p).into(),
            Op::Rmdir(p) => self.rmdir(p).into(),
            Op::Rename(s, d) => self.rename(s, d).into(),
            Op::Exchange(a, b) => self.exchange(a, b),
            Op::Link(s, d) => self.link(s, d).into(),
            Op::Stat(p) => self.lookup(p).map(drop).into(),
            Op::Distribute(p) => self.distribute(p).into(),
        }
    }

    /// Resolves the parent of `p` as path lookup does: ENOENT or ENOTDIR on the way.
    fn parent_ok(&self, p: &str) -> R {
        let (parent, _) = split(p).expect("not the test directory");
        let mut cur = String::from("/");
        for comp in parent.split('/').filter(|c| !c.is_empty()) {
            cur = join(&cur, comp);
            match self.entries.get(&cur) {
                None => return Err(Errno::ENOENT),
                Some(Entry::Dir(_)) => {}
                Some(_) => return Err(Errno::ENOTDIR),
            }
        }
        Ok(())
    }

    /// The entry at `p` after a successful lookup of its parent.
    fn lookup(&self, p: &str) -> Result<Entry, Errno> {
        self.parent_ok(p)?;
        self.get(p).ok_or(Errno::ENOENT)
    }

    fn children(&self, dir: &str) -> usize {
        self.entries.keys().filter(|k| *k != dir && split(k).map(|(d, _)| d) == Some(dir)).count()
    }

    /// Inserts a new name and notes whether its parent went over its threshold.
    fn insert(&mut self, p: &str, e: Entry) {
        self.entries.insert(p.to_string(), e);
        let (parent, _) = split(p).expect("not the test directory");
        let count = self.children(parent) as u64;
        if let Some(Entry::Dir(policy)) = self.entries.get_mut(parent) {
            if policy.threshold.is_some_and(|t| count > t) {
                policy.crossed = true;
            }
        }
    }

    /// Removes one name; a file's contents go with its last name.
    fn remove(&mut self, p: &str) -> Option<Entry> {
        let e = self.entries.remove(p)?;
        if let Some(id) = e.inode() {
            if !self.entries.values().any(|o| o.inode() == Some(id)) {
                self.data.remove(&id);
            }
        }
        Some(e)
    }

    fn make(&mut self, p: &str, e: Entry) -> R {
        self.parent_ok(p)?;
        if self.entries.contains_key(p) {
            return Err(Errno::EEXIST);
        }
        self.insert(p, e);
        Ok(())
    }

    fn make_file(&mut self, p: &str, symlink: bool) -> R {
        let id = self.next_id;
        let e = if symlink { Entry::Symlink(id) } else { Entry::File(id) };
        self.make(p, e)?;
        self.next_id += 1;
        if !symlink {
            self.data.insert(id, Vec::new());
        }
        Ok(())
    }

    fn write(&mut self, p: &str, len: usize, byte: u8) -> R {
        match self.lookup(p)? {
            Entry::Dir(_) => Err(Errno::EISDIR),
            // Writing through a symbolic link's own name is refused (it has no data).
            Entry::Symlink(_) => Err(Errno::EINVAL),
            Entry::File(id) => {
                let data = self.data.entry(id).or_default();
                if data.len() < len {
                    data.resize(len, 0);
                }
                data[..len].fill(byte);
                Ok(())
            }
        }
    }

    fn unlink(&mut self, p: &str) -> R {
        match self.lookup(p)? {
            Entry::Dir(_) => Err(Errno::EISDIR),
            _ => {
                self.remove(p);
                Ok(())
            }
        }
    }

    fn rmdir(&mut self, p: &str) -> R {
        match self.lookup(p)? {
            Entry::Dir(_) if self.children(p) > 0 => Err(Errno::ENOTEMPTY),
            Entry::Dir(_) => {
                self.remove(p);
                Ok(())
            }
            _ => Err(Errno::ENOTDIR),
        }
    }

    fn rename(&mut self, s: &str, d: &str) -> R {
        let se = self.lookup(s)?;
        if s == d {
            return Ok(());
        }
        self.parent_ok(d)?;
        let de = self.get(d);
        match (se.kind(), de.map(|e| e.kind())) {
            (FileKind::Dir, Some(k)) if k != FileKind::Dir => return Err(Errno::ENOTDIR),
            (k, Some(FileKind::Dir)) if k != FileKind::Dir => return Err(Errno::EISDIR),
            _ => {}
        }
        if se.kind() == FileKind::Dir && is_within(d, s) {
            return Err(Errno::EINVAL);
        }
        if matches!(de, Some(Entry::Dir(_))) && self.children(d) > 0 {
            return Err(Errno::ENOTEMPTY);
        }
        if se.inode().is_some() && se.inode() == de.and_then(|e| e.inode()) {
            // Two names of one file: POSIX says do nothing.
            return Ok(());
        }
        self.remove(d);
        let moved: Vec<(String, Entry)> =
            self.entries.iter().filter(|(k, _)| is_within(k, s)).map(|(k, v)| (k.clone(), *v)).collect();
        for (k, _) in &moved {
            self.entries.remove(k);
        }
        for (k, v) in moved {
            let to = rebase(&k, s, d);
            if k == s {
                self.insert(&to, v);
            } else {
                self.entries.insert(to, v);
            }
        }
        Ok(())
    }

    fn exchange(&mut self, a: &str, b: &str) -> Expect {
        let ae = match self.lookup(a) {
            Ok(e) => e,
            Err(e) => return Expect::Fail(vec![e]),
        };
        if a == b {
            return Expect::Done;
        }
        // `a` is checked on its server, `b` on its own: either error may come first.
        let mut errs = Vec::new();
        match self.lookup(b) {
            Err(e) => errs.push(e),
            Ok(Entry::Dir(_)) => errs.push(Errno::EINVAL),
            Ok(_) => {}
        }
        if matches!(ae, Entry::Dir(_)) {
            errs.push(Errno::EINVAL);
        }
        if !errs.is_empty() {
            errs.dedup();
            return Expect::Fail(errs);
        }
        let be = self.get(b).expect("looked up");
        self.entries.insert(a.to_string(), be);
        self.entries.insert(b.to_string(), ae);
        Expect::Done
    }

    fn link(&mut self, s: &str, d: &str) -> R {
        let se = self.lookup(s)?;
        if matches!(se, Entry::Dir(_)) {
            return Err(Errno::EPERM);
        }
        self.make(d, se)
    }

    fn distribute(&mut self, p: &str) -> R {
        match self.lookup(p)? {
            Entry::Dir(policy) => {
                let policy = Policy { threshold: Some(0), crossed: true, ..policy };
                self.entries.insert(p.to_string(), Entry::Dir(policy));
                Ok(())
            }
            _ => Err(Errno::ENOTDIR),
        }
    }

    /// The link count `lstat` must show for the entry `e` at `p`.
    fn nlink(&self, p: &str, e: Entry) -> u32 {
        match e.inode() {
            None => {
                2 + self
                    .entries
                    .iter()
                    .filter(|(k, v)| split(k).map(|(d, _)| d) == Some(p) && matches!(v, Entry::Dir(_)))
                    .count() as u32
            }
            Some(id) => self.entries.values().filter(|v| v.inode() == Some(id)).count() as u32,
        }
    }

    /// What `lstat` of `p` must show (its data too for a file).
    fn node(&self, p: &str) -> Option<Node> {
        let e = self.get(p)?;
        let (size, data) = match e {
            Entry::Dir(_) => (self.children(p) as u64, None),
            Entry::Symlink(_) => (TARGET.len() as u64, None),
            Entry::File(id) => {
                let d = self.data.get(&id).cloned().unwrap_or_default();
                (d.len() as u64, Some(d))
            }
        };
        Some(Node { kind: e.kind(), nlink: self.nlink(p, e), size, data })
    }

    /// What a walk of the cluster must find.
    pub fn tree(&self) -> Tree {
        let nodes = self.entries.keys().map(|k| (k.clone(), self.node(k).expect("present"))).collect();
        let mut by_inode: BTreeMap<u64, Vec<String>> = BTreeMap::new();
        for (k, e) in &self.entries {
            if let Some(id) = e.inode() {
                by_inode.entry(id).or_default().push(k.clone());
            }
        }
        Tree { nodes, links: by_inode.into_values().collect() }
    }
}

/// One name as `lstat` shows it, with a regular file's contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub kind: FileKind,
    pub nlink: u32,
    pub size: u64,
    pub data: Option<Vec<u8>>,
}

/// A namespace as a walk sees it: every name, and which names share an inode.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Tree {
    pub nodes: BTreeMap<String, Node>,
    /// The names of each non-directory inode, sorted.
    pub links: BTreeSet<Vec<String>>,
}

impl Tree {
    /// Checks the tree against itself: a directory's size is its number of entries and its
    /// link count 2 plus its subdirectories; a file's link count is its number of names.
    pub fn consistent(&self) -> Result<(), String> {
        let links: BTreeMap<&str, usize> =
            self.links.iter().flat_map(|names| names.iter().map(move |n| (n.as_str(), names.len()))).collect();
        for (p, n) in &self.nodes {
            let (size, nlink) = match n.kind {
                FileKind::Dir => {
                    let children: Vec<&Node> = self
                        .nodes
                        .iter()
                        .filter(|(k, _)| split(k).map(|(d, _)| d) == Some(p))
                        .map(|(_, v)| v)
                        .collect();
                    let subdirs = children.iter().filter(|c| c.kind == FileKind::Dir).count();
                    (children.len() as u64, 2 + subdirs as u32)
                }
                _ => (n.size, links.get(p.as_str()).copied().unwrap_or(0) as u32),
            };
            if (n.size, n.nlink) != (size, nlink) {
                return Err(format!(
                    "{p}: size {} nlink {}, its entries say size {size} nlink {nlink}",
                    n.size, n.nlink
                ));
            }
        }
        Ok(())
    }

    /// The differences from `want`, one per line (empty if none).
    pub fn diff(&self, want: &Tree) -> String {
        let mut out = Vec::new();
        for (p, n) in &want.nodes {
            match self.nodes.get(p) {
                None => out.push(format!("  {p}: missing, expected {n:?}")),
                Some(got) if got != n => out.push(format!("  {p}: found {got:?}, expected {n:?}")),
                Some(_) => {}
            }
        }
        for (p, n) in &self.nodes {
            if !want.nodes.contains_key(p) {
                out.push(format!("  {p}: unexpected {n:?}"));
            }
        }
        for l in self.links.symmetric_difference(&want.links) {
            let whose = if want.links.contains(l) { "expected" } else { "found" };
            out.push(format!("  names of one inode {whose} only: {l:?}"));
        }
        out.join("\n")
    }
}

/// What an operation returned beyond success, checked against the model.
#[derive(Debug, Clone)]
pub enum Answer {
    None,
    /// Attributes of the operation's path (stat, write) or new name (link).
    Attr(Attr),
    /// State of a directory after `set_policy`.
    Dist(DistState),
}

/// The path in the cluster of model path `p` below the test directory `top`.
pub fn full(top: &str, p: &str) -> String {
    if p == "/" {
        top.to_string()
    } else {
        format!("{top}{p}")
    }
}

/// Runs `op` on the cluster below `top`.
pub async fn run_op(c: &Client, top: &str, op: &Op) -> Result<Answer, Errno> {
    let f = |p: &str| full(top, p);
    let attr = |r: Result<Attr, FsError>| r.map(Answer::Attr);
    let none = |r: Result<(), FsError>| r.map(|()| Answer::None);
    let r = match op {
        Op::Mkdir(p) => c.mkdir(&f(p), 0o755).await.map(|_| Answer::None),
        Op::MkdirHuge(p, t, w) => c.mkdir_with(&f(p), 0o755, Threshold::Entries(*t), *w).await.map(|_| Answer::None),
        Op::Create(p) => match c.create(&f(p), 0o644, true).await {
            Ok(fh) => none(c.close(&fh).await),
            Err(e) => Err(e),
        },
        Op::Symlink(p) => c.symlink(TARGET, &f(p)).await.map(|_| Answer::None),
        Op::Write(p, len, byte) => attr(c.write(&f(p), 0, &vec![*byte; *len as usize]).await),
        Op::Unlink(p) => none(c.unlink(&f(p)).await),
        Op::Rmdir(p) => none(c.rmdir(&f(p)).await),
        Op::Rename(s, d) => none(c.rename(&f(s), &f(d)).await),
        Op::Exchange(a, b) => none(c.exchange(&f(a), &f(b)).await),
        Op::Link(s, d) => attr(c.link(&f(s), &f(d)).await),
        Op::Stat(p) => attr(c.lstat(&f(p)).await),
        Op::Distribute(p) => {
            c.set_policy(&f(p), Some(Threshold::Entries(0)), None).await.map(|d| Answer::Dist(d.state))
        }
    };
    r.map_err(|e| e.errno)
}

/// Checks the answer `got` to `op` against `expected` and, for answers carrying
/// attributes, against `model` (the state after `op`).
pub fn check_answer(model: &Model, op: &Op, expected: &Expect, got: &Result<Answer, Errno>) -> Result<(), String> {
    if !expected.admits(got) {
        return Err(format!("expected {expected:?}, got {got:?}"));
    }
    let at = match op {
        Op::Stat(p) | Op::Write(p, ..) | Op::Link(_, p) => p,
        _ => return Ok(()),
    };
    match (got, model.node(at)) {
        (Ok(Answer::Attr(a)), Some(n)) if (a.kind, a.nlink, a.size) != (n.kind, n.nlink, n.size) => Err(format!(
            "{at}: answered kind {:?} nlink {} size {}, expected kind {:?} nlink {} size {}",
            a.kind, a.nlink, a.size, n.kind, n.nlink, n.size
        )),
        (Ok(Answer::Dist(s)), _) if *s != DistState::Distributed => Err(format!("{at}: {s} after set_policy")),
        _ => Ok(()),
    }
}

/// Walks the cluster below `top` with readdir and lstat (and reads every file).
pub async fn observe(c: &Client, top: &str) -> Result<Tree, String> {
    let io = |what: &str, p: &str, e: FsError| format!("walk: {what} {p}: {e}");
    let mut tree = Tree::default();
    let mut inodes: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    let mut stack = vec!["/".to_string()];
    while let Some(dir) = stack.pop() {
        let entries = c.readdir(&full(top, &dir)).await.map_err(|e| io("readdir", &dir, e))?;
        let a = c.lstat(&full(top, &dir)).await.map_err(|e| io("lstat", &dir, e))?;
        tree.nodes.insert(dir.clone(), Node { kind: a.kind, nlink: a.nlink, size: a.size, data: None });
        for e in entries {
            let p = join(&dir, &e.name);
            let a = c.lstat(&full(top, &p)).await.map_err(|e| io("lstat", &p, e))?;
            if (a.kind, a.ino) != (e.kind, e.ino) {
                return Err(format!("walk: {p} listed as {:?} {}, lstat says {:?} {}", e.kind, e.ino, a.kind, a.ino));
            }
            match a.kind {
                FileKind::Dir => stack.push(p),
                kind => {
                    inodes.entry(a.ino).or_default().push(p.clone());
                    let data = match kind {
                        FileKind::File => Some(c.read_all(&full(top, &p)).await.map_err(|e| io("read", &p, e))?),
                        _ => None,
                    };
                    tree.nodes.insert(p, Node { kind, nlink: a.nlink, size: a.size, data });
                }
            }
        }
    }
    tree.links = inodes
        .into_values()
        .map(|mut v| {
            v.sort();
            v
        })
        .collect();
    Ok(tree)
}

/// Compares the cluster below `top` with `model`.
pub async fn compare(c: &Client, top: &str, model: &Model) -> Result<(), String> {
    let seen = observe(c, top).await?;
    let diff = seen.diff(&model.tree());
    if diff.is_empty() {
        Ok(())
    } else {
        Err(format!("the cluster differs from the model:\n{diff}"))
    }
}

/// Checks every directory's distribution against the model; returns how many are
/// distributed. A directory the model never saw over its threshold must be nondistributed.
/// With `strict`, one that is over its threshold now (or has threshold 0) must be
/// distributed, after up to `wait` (inserts other than creates distribute in the
/// background); one that was over it only for a while may be either (Cx checks the
/// threshold when it commits, which may be after the directory shrank again). Without
/// `strict` (under faults, where a distribution may be left to the next insert), any
/// directory that was over its threshold may be either.
pub async fn check_distribution(
    c: &Client,
    top: &str,
    model: &Model,
    wait: Duration,
    strict: bool,
) -> Result<usize, String> {
    let servers = c.map().servers.len();
    let mut distributed = 0;
    for (p, policy) in model.dirs() {
        let over_now = policy.threshold.is_some_and(|t| t == 0 || model.children(&p) as u64 > t);
        let must = strict && policy.crossed && over_now;
        let (state, set) = dist_state(c, &full(top, &p), must, wait).await?;
        if (must && state != DistState::Distributed) || (!policy.crossed && state != DistState::Nondistributed) {
            return Err(format!("{p}: {state}, expected otherwise by policy {policy:?}"));
        }
        if state == DistState::Distributed {
            let width = if policy.width == 0 { servers } else { policy.width as usize };
            if set != width.min(servers) {
                return Err(format!("{p}: distributed over {set} servers, expected {width}"));
            }
            distributed += 1;
        }
    }
    Ok(distributed)
}

/// The distribution state of `p` and the size of its storing set, waiting up to `wait`
/// for `Distributed` if `want_distributed`.
async fn dist_state(c: &Client, p: &str, want_distributed: bool, wait: Duration) -> Result<(DistState, usize), String> {
    let deadline = Instant::now() + wait;
    loop {
        let d = c.distribution(p).await.map_err(|e| format!("distribution of {p}: {e}"))?;
        if !want_distributed || d.state == DistState::Distributed || Instant::now() > deadline {
            return Ok((d.state, d.set.len()));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Runs fsck over the whole cluster.
pub async fn fsck_clean(c: &Client) -> Result<(), String> {
    let scans = fsck::scan_settled(c, Duration::from_secs(20)).await.map_err(|e| format!("fsck scan: {e}"))?;
    let problems = fsck::check(c, &scans);
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!("fsck: {}", problems.join("; ")))
    }
}

/// How a test run is set up: drawn once per case, shrunk with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setup {
    /// Seed of the case's fault decisions.
    pub seed: u64,
    /// Protocol of mkdir and rmdir.
    pub protocol: TxnProtocol,
    /// Huge-directory threshold of the test directory (`None`: the cluster's).
    pub top: Option<u64>,
}

/// One step of a generated sequence: an operation, or a fault of type `F`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step<F> {
    Op(Op),
    Fault(F),
}

/// Where the fault steps of a test come from.
pub trait FaultSource: 'static {
    /// A fault step.
    type Fault: Clone + fmt::Debug + 'static;
    /// The faults a case with `setup` may meet (`None`: none).
    fn faults(setup: &Setup) -> Option<BoxedStrategy<Self::Fault>>;
}

/// No fault steps: every answer is exact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoFault {}

impl FaultSource for NoFault {
    type Fault = NoFault;
    fn faults(_: &Setup) -> Option<BoxedStrategy<NoFault>> {
        None
    }
}

/// The reference state: the case's setup and the model after the steps so far.
#[derive(Clone)]
pub struct World {
    pub setup: Setup,
    pub model: Model,
}

impl fmt::Debug for World {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The initial model is an empty directory: the setup says all.
        write!(f, "{:?}", self.setup)
    }
}

/// The model as a `proptest` reference state machine, with fault steps from `F`.
pub struct Reference<F>(PhantomData<F>);

impl<F: FaultSource> ReferenceStateMachine for Reference<F> {
    type State = World;
    type Transition = Step<F::Fault>;

    fn init_state() -> BoxedStrategy<World> {
        let protocol = select(vec![TxnProtocol::Cx, TxnProtocol::TwoPhase, TxnProtocol::Serial]);
        let top = prop_oneof![Just(None), (0u64..3).prop_map(Some)];
        (any::<u64>(), protocol, top)
            .prop_map(|(seed, protocol, top)| World { setup: Setup { seed, protocol, top }, model: Model::new(top) })
            .boxed()
    }

    fn transitions(world: &World) -> BoxedStrategy<Step<F::Fault>> {
        let ops = op_strategy(&world.model).prop_map(Step::Op);
        match F::faults(&world.setup) {
            Some(faults) => prop_oneof![12 => ops, 1 => faults.prop_map(Step::Fault)].boxed(),
            None => ops.boxed(),
        }
    }

    fn apply(mut world: World, step: &Step<F::Fault>) -> World {
        if let Step::Op(op) = step {
            world.model.apply(op);
        }
        world
    }
}

/// A path: one that exists (weight `old`), a new name in an existing directory (`new`),
/// or any short path (`any`).
fn path_strategy(model: &Model, old: u32, new: u32, any: u32) -> BoxedStrategy<String> {
    let any_path =
        proptest::collection::vec(select(NAMES.to_vec()), 1..=MAX_DEPTH).prop_map(|c| format!("/{}", c.join("/")));
    let mut choices = vec![(any, any_path.boxed())];
    let existing = model.paths();
    if !existing.is_empty() {
        choices.push((old, select(existing).boxed()));
    }
    let dirs: Vec<String> =
        model.dirs().into_iter().map(|(d, _)| d).filter(|d| d == "/" || d.matches('/').count() < MAX_DEPTH).collect();
    choices.push((new, (select(dirs), select(NAMES.to_vec())).prop_map(|(d, n)| join(&d, n)).boxed()));
    Union::new_weighted(choices).boxed()
}

/// An operation, weighted towards those that change the namespace, on paths chosen so
/// that most succeed.
fn op_strategy(model: &Model) -> BoxedStrategy<Op> {
    let new = || path_strategy(model, 1, 4, 1);
    let old = || path_strategy(model, 4, 1, 1);
    let two = || (old(), path_strategy(model, 2, 2, 1));
    prop_oneof![
        12 => new().prop_map(Op::Mkdir),
        6 => (new(), 0u64..3, prop_oneof![Just(0u32), Just(2u32)]).prop_map(|(p, t, w)| Op::MkdirHuge(p, t, w)),
        14 => new().prop_map(Op::Create),
        4 => new().prop_map(Op::Symlink),
        6 => (old(), 1u8..=8, any::<u8>()).prop_map(|(p, len, b)| Op::Write(p, len, b)),
        8 => old().prop_map(Op::Unlink),
        8 => old().prop_map(Op::Rmdir),
        14 => two().prop_map(|(s, d)| Op::Rename(s, d)),
        8 => (old(), old()).prop_map(|(a, b)| Op::Exchange(a, b)),
        12 => (old(), new()).prop_map(|(s, d)| Op::Link(s, d)),
        5 => old().prop_map(Op::Stat),
        3 => old().prop_map(Op::Distribute),
    ]
    .boxed()
}

/// Counts over the cases of one test, to prove the sequences did what they are for.
#[derive(Debug, Default, Clone)]
pub struct Totals {
    pub cases: usize,
    pub steps: usize,
    /// Successful operations by [`Op::name`].
    pub done: BTreeMap<&'static str, usize>,
    /// Directories found distributed at the ends of cases.
    pub distributed: usize,
    /// Answers that left the outcome open (resolved from the cluster afterwards).
    pub uncertain: usize,
    /// Fault steps injected.
    pub faults: usize,
    /// Cases by protocol name.
    pub protocols: BTreeMap<&'static str, usize>,
}

impl Totals {
    /// Successful operations named `name`.
    pub fn done(&self, name: &str) -> usize {
        self.done.get(name).copied().unwrap_or(0)
    }

    /// Adds another case's counts.
    pub fn add(&mut self, o: &Totals) {
        self.cases += o.cases;
        self.steps += o.steps;
        self.distributed += o.distributed;
        self.uncertain += o.uncertain;
        self.faults += o.faults;
        for (k, v) in &o.done {
            *self.done.entry(k).or_default() += v;
        }
        for (k, v) in &o.protocols {
            *self.protocols.entry(k).or_default() += v;
        }
    }

    /// Fails unless links, exchanges, renames and distribution all happened.
    pub fn assert_exercised(&self) {
        for name in ["link", "exchange", "rename", "rmdir", "mkdir_huge", "distribute", "write"] {
            assert!(self.done(name) > 0, "no {name} succeeded in {} cases: {self:?}", self.cases);
        }
        assert!(self.distributed > 0, "no directory was distributed: {self:?}");
    }
}

/// Observes how a case went; shared by the cases of one test.
pub type Tally = Arc<Mutex<Totals>>;

/// Counts one step that proptest's shrinking may drop if never reached.
pub fn seen(counter: &Option<Arc<AtomicUsize>>) {
    if let Some(c) = counter {
        c.fetch_add(1, Ordering::SeqCst);
    }
}

/// A generated case: setup, steps, and the counter of steps reached (for shrinking).
pub type Case<F> = (World, Vec<Step<F>>, Option<Arc<AtomicUsize>>);

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// Runs `test` on `cases` generated sequences of up to `max_steps` steps (more with
/// `PLUSFS_MODEL_CASES`, another generator seed with `PLUSFS_MODEL_SEED`). A failure is
/// shrunk (at most `PLUSFS_MODEL_SHRINK` reruns, default 256, and 2 minutes) and reported
/// with the shrunk sequence, its setup and the seed. No failure file is written.
pub fn explore<F: FaultSource>(
    name: &str,
    cases: u32,
    max_steps: usize,
    test: impl Fn(Case<F::Fault>) -> Result<(), String>,
) {
    let seed = env_u64("PLUSFS_MODEL_SEED").unwrap_or(1);
    let config = Config {
        cases: env_u64("PLUSFS_MODEL_CASES").map_or(cases, |n| n as u32),
        // A failing case's seed is kept in `tests/regressions/<name>.txt` (committed): every
        // later run replays it (and shrinks it again) before any new case.
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(Box::leak(
            format!("tests/regressions/{name}.txt").into_boxed_str(),
        )))),
        max_shrink_iters: env_u64("PLUSFS_MODEL_SHRINK").unwrap_or(256) as u32,
        max_shrink_time: 120_000,
        rng_seed: RngSeed::Fixed(seed),
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    let strategy = Reference::<F>::sequential_strategy(1..=max_steps);
    match runner.run(&strategy, |case| test(case).map_err(TestCaseError::fail)) {
        Ok(()) => {}
        Err(TestError::Fail(why, (world, steps, _))) => panic!("{}", report(name, &why, &world, &steps, seed)),
        Err(TestError::Abort(why)) => panic!("{name}: aborted: {why} (PLUSFS_MODEL_SEED={seed})"),
    }
}

/// The message of a failed test: why, the shrunk sequence, its setup, the seed.
fn report<F: fmt::Debug>(name: &str, why: &impl fmt::Display, world: &World, steps: &[Step<F>], seed: u64) -> String {
    let listed: Vec<String> = steps.iter().enumerate().map(|(i, s)| format!("  {:>3}. {s:?}", i + 1)).collect();
    format!(
        "{name}: {why}\nshrunk to {} steps, setup {:?}:\n{}\nreplay: PLUSFS_MODEL_SEED={seed} (generator seed)",
        steps.len(),
        world.setup,
        listed.join("\n")
    )
}

/// Applies fault-free `steps` to the cluster below `top` (already made with the setup's
/// threshold), checking every answer, the whole tree every `every` steps and at the end,
/// the distribution of every directory, and fsck. Returns the case's counts.
pub async fn run_exact(
    c: &Client,
    top: &str,
    world: &World,
    steps: &[Step<NoFault>],
    counter: &Option<Arc<AtomicUsize>>,
    every: usize,
) -> Result<Totals, String> {
    let mut model = world.model.clone();
    let mut totals = Totals { cases: 1, ..Totals::default() };
    *totals.protocols.entry(world.setup.protocol.name()).or_default() += 1;
    for (i, step) in steps.iter().enumerate() {
        seen(counter);
        let op = match step {
            Step::Op(op) => op,
            Step::Fault(f) => match *f {},
        };
        let expected = model.apply(op);
        let got = run_op(c, top, op).await;
        check_answer(&model, op, &expected, &got).map_err(|e| format!("step {} {op:?}: {e}", i + 1))?;
        totals.steps += 1;
        if got.is_ok() {
            *totals.done.entry(op.name()).or_default() += 1;
        }
        if (i + 1) % every == 0 {
            compare(c, top, &model).await.map_err(|e| format!("after step {}: {e}", i + 1))?;
        }
    }
    compare(c, top, &model).await.map_err(|e| format!("at the end: {e}"))?;
    totals.distributed = check_distribution(c, top, &model, Duration::from_secs(10), true).await?;
    fsck_clean(c).await?;
    Ok(totals)
}
