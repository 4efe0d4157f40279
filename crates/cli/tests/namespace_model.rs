//! Random sequences of namespace operations applied to a real 4-server cluster and to a
//! `BTreeMap` model of POSIX semantics; results (errno by errno) and whole trees compared.

mod common;

use common::TestCluster;
use plusfs_client::Client;
use plusfs_proto::path::{is_within, join, rebase, split};
use plusfs_proto::{Errno, FileKind};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Dir,
    File,
}

#[derive(Debug, Clone)]
enum Op {
    Mkdir(String),
    Create(String),
    Unlink(String),
    Rmdir(String),
    Rename(String, String),
    Stat(String),
    Symlink(String),
}

/// The reference: path -> kind, POSIX rules.
struct Model {
    tree: BTreeMap<String, Kind>,
}

type R = Result<(), Errno>;

impl Model {
    fn new() -> Model {
        Model { tree: BTreeMap::from([("/".to_string(), Kind::Dir)]) }
    }

    /// Resolves the parent of `p`: ENOENT/ENOTDIR like path lookup.
    fn parent_ok(&self, p: &str) -> R {
        let (parent, _) = split(p).expect("not root");
        let mut cur = String::from("/");
        for comp in parent.split('/').filter(|c| !c.is_empty()) {
            cur = join(&cur, comp);
            match self.tree.get(&cur) {
                None => return Err(Errno::ENOENT),
                Some(Kind::File) => return Err(Errno::ENOTDIR),
                Some(Kind::Dir) => {}
            }
        }
        Ok(())
    }

    fn children(&self, p: &str) -> Vec<String> {
        self.tree.keys().filter(|k| *k != p && split(k).map(|(d, _)| d) == Some(p)).cloned().collect()
    }

    fn apply(&mut self, op: &Op) -> R {
        match op {
            Op::Mkdir(p) | Op::Create(p) | Op::Symlink(p) => {
                self.parent_ok(p)?;
                if self.tree.contains_key(p) {
                    return Err(Errno::EEXIST);
                }
                let kind = if matches!(op, Op::Mkdir(_)) { Kind::Dir } else { Kind::File };
                self.tree.insert(p.clone(), kind);
                Ok(())
            }
            Op::Unlink(p) => {
                self.parent_ok(p)?;
                match self.tree.get(p) {
                    None => Err(Errno::ENOENT),
                    Some(Kind::Dir) => Err(Errno::EISDIR),
                    Some(Kind::File) => {
                        self.tree.remove(p);
                        Ok(())
                    }
                }
            }
            Op::Rmdir(p) => {
                self.parent_ok(p)?;
                match self.tree.get(p) {
                    None => Err(Errno::ENOENT),
                    Some(Kind::File) => Err(Errno::ENOTDIR),
                    Some(Kind::Dir) if !self.children(p).is_empty() => Err(Errno::ENOTEMPTY),
                    Some(Kind::Dir) => {
                        self.tree.remove(p);
                        Ok(())
                    }
                }
            }
            Op::Stat(p) => {
                self.parent_ok(p)?;
                self.tree.get(p).map(|_| ()).ok_or(Errno::ENOENT)
            }
            Op::Rename(s, d) => self.rename(s, d),
        }
    }

    fn rename(&mut self, s: &str, d: &str) -> R {
        self.parent_ok(s)?;
        let sk = *self.tree.get(s).ok_or(Errno::ENOENT)?;
        if s == d {
            return Ok(());
        }
        self.parent_ok(d)?;
        let dk = self.tree.get(d).copied();
        match (sk, dk) {
            (Kind::Dir, Some(Kind::File)) => return Err(Errno::ENOTDIR),
            (Kind::File, Some(Kind::Dir)) => return Err(Errno::EISDIR),
            _ => {}
        }
        if sk == Kind::Dir && is_within(d, s) {
            return Err(Errno::EINVAL);
        }
        if dk == Some(Kind::Dir) && !self.children(d).is_empty() {
            return Err(Errno::ENOTEMPTY);
        }
        self.tree.remove(d);
        let moved: Vec<(String, Kind)> =
            self.tree.iter().filter(|(k, _)| is_within(k, s)).map(|(k, v)| (k.clone(), *v)).collect();
        for (k, v) in moved {
            self.tree.remove(&k);
            self.tree.insert(rebase(&k, s, d), v);
        }
        Ok(())
    }
}

fn random_path(rng: &mut StdRng) -> String {
    let names = ["a", "b", "c"];
    let depth = rng.gen_range(1..=3);
    let mut p = String::new();
    for _ in 0..depth {
        p.push('/');
        p.push_str(names[rng.gen_range(0..names.len())]);
    }
    p
}

fn random_op(rng: &mut StdRng) -> Op {
    let p = random_path(rng);
    match rng.gen_range(0..100) {
        0..=24 => Op::Mkdir(p),
        25..=44 => Op::Create(p),
        45..=54 => Op::Unlink(p),
        55..=64 => Op::Rmdir(p),
        65..=84 => Op::Rename(p, random_path(rng)),
        85..=94 => Op::Stat(p),
        _ => Op::Symlink(p),
    }
}

async fn apply(c: &Client, op: &Op) -> R {
    let r = match op {
        Op::Mkdir(p) => c.mkdir(p, 0o755).await.map(drop),
        Op::Create(p) => c.create(p, 0o644, true).await.map(drop),
        Op::Symlink(p) => c.symlink("/somewhere", p).await.map(drop),
        Op::Unlink(p) => c.unlink(p).await,
        Op::Rmdir(p) => c.rmdir(p).await,
        Op::Rename(s, d) => c.rename(s, d).await,
        Op::Stat(p) => c.lstat(p).await.map(drop),
    };
    r.map_err(|e| e.errno)
}

/// The whole tree as the cluster shows it, walked with readdir and stat.
async fn walk(c: &Client) -> BTreeMap<String, Kind> {
    let mut out = BTreeMap::from([("/".to_string(), Kind::Dir)]);
    let mut stack = vec!["/".to_string()];
    while let Some(dir) = stack.pop() {
        let entries = c.readdir(&dir).await.expect("readdir");
        let attr = c.lstat(&dir).await.expect("stat dir");
        let subdirs = entries.iter().filter(|e| e.kind == FileKind::Dir).count();
        assert_eq!(attr.size as usize, entries.len(), "size of {dir}");
        assert_eq!(attr.nlink as usize, 2 + subdirs, "link count of {dir}");
        for e in entries {
            let p = join(&dir, &e.name);
            let st = c.lstat(&p).await.expect("stat entry");
            assert_eq!(st.kind, e.kind, "kind of {p}");
            assert_eq!(st.ino, e.ino, "inode of {p}");
            if e.kind == FileKind::Dir {
                out.insert(p.clone(), Kind::Dir);
                stack.push(p);
            } else {
                out.insert(p, Kind::File);
            }
        }
    }
    out
}

async fn run_seed(cluster: &TestCluster, seed: u64, steps: usize) {
    let c = cluster.client();
    // Each seed works below its own top directory so seeds can share a cluster.
    let top = format!("/seed{seed}");
    c.mkdir(&top, 0o755).await.unwrap();
    let mut model = Model::new();
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut succeeded, mut dir_renames) = (0, 0);
    for step in 0..steps {
        let op = random_op(&mut rng);
        if let Op::Rename(s, _) = &op {
            dir_renames += usize::from(model.tree.get(s) == Some(&Kind::Dir));
        }
        let expected = model.apply(&op);
        succeeded += usize::from(expected.is_ok());
        let scoped = match &op {
            Op::Mkdir(p) => Op::Mkdir(format!("{top}{p}")),
            Op::Create(p) => Op::Create(format!("{top}{p}")),
            Op::Symlink(p) => Op::Symlink(format!("{top}{p}")),
            Op::Unlink(p) => Op::Unlink(format!("{top}{p}")),
            Op::Rmdir(p) => Op::Rmdir(format!("{top}{p}")),
            Op::Stat(p) => Op::Stat(format!("{top}{p}")),
            Op::Rename(s, d) => Op::Rename(format!("{top}{s}"), format!("{top}{d}")),
        };
        let got = apply(&c, &scoped).await;
        assert_eq!(got, expected, "seed {seed} step {step}: {op:?}");
        if step % 50 == 49 || step + 1 == steps {
            let tree = walk(&c).await;
            let ours: BTreeMap<String, Kind> =
                tree.into_iter().filter(|(k, _)| is_within(k, &top)).map(|(k, v)| (rebase(&k, &top, "/"), v)).collect();
            assert_eq!(ours, model.tree, "seed {seed} tree after step {step}");
        }
    }
    // The sequence must exercise the namespace, not only its error paths.
    assert!(succeeded >= steps / 10, "seed {seed}: only {succeeded} of {steps} operations succeeded");
    assert!(dir_renames > 0, "seed {seed}: no directory rename attempted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_matches_model() {
    let cluster = TestCluster::start(4);
    for seed in 1..=6 {
        run_seed(&cluster, seed, 300).await;
    }
    cluster.assert_fsck_clean();
    cluster.assert_no_errors_logged();
}

/// The same sequences when every directory is distributed from creation (threshold 0),
/// and when directories turn huge after two entries: renames of distributed directories
/// and their ancestors, rmdir of distributed directories, moves between shards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_matches_model_with_distributed_directories() {
    for threshold in [0, 2] {
        let cluster = TestCluster::start_hugedirs(4, Some(threshold));
        for seed in 7..=9 {
            run_seed(&cluster, seed, 300).await;
        }
        cluster.assert_fsck_clean();
        cluster.assert_no_errors_logged();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_matches_model_on_one_server() {
    let cluster = TestCluster::start(1);
    run_seed(&cluster, 42, 300).await;
    cluster.assert_fsck_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_keep_the_namespace_consistent() {
    let cluster = TestCluster::start(4);
    let mut tasks = Vec::new();
    for seed in 100..104 {
        let c = cluster.client();
        tasks.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed);
            for _ in 0..200 {
                // All clients share the same small tree: errors are expected, corruption not.
                let _ = apply(&c, &random_op(&mut rng)).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    walk(&cluster.client()).await;
    cluster.assert_fsck_clean();
    cluster.assert_no_errors_logged();
}
