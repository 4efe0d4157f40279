//! Directory delegations through real mounts: two mounts and a library client taking turns
//! on one directory against a model, a mount that hangs (SIGSTOP) while it holds a
//! delegation, and a mount killed (kill -9) in the middle of a `tar x`.

mod common;
mod mounts;

use common::ProcCluster;
use mounts::tar_kill::sync_mount;
use mounts::{deleg_counters, fuse_available, sh, Mount};
use plusfs_client::{Client, ClientOptions};
use plusfs_placement::DelegSettings;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

fn delegating(cluster: &ProcCluster) -> Client {
    let opts = ClientOptions { retries: 5, delegations: true, ..Default::default() };
    Client::new(cluster.cluster.map().clone(), opts)
}

/// One step of the interleaving test.
#[derive(Debug, Clone)]
enum Step {
    Write(String, Vec<u8>),
    Unlink(String),
    Rename(String, String),
    Read(String),
    List,
}

fn random_step(rng: &mut StdRng) -> Step {
    let names = ["a", "b", "c", "d", "e", "f"];
    let name = |rng: &mut StdRng| names[rng.gen_range(0..names.len())].to_string();
    match rng.gen_range(0..10) {
        0..=3 => {
            let data = (0..rng.gen_range(0..2000)).map(|_| rng.gen()).collect();
            Step::Write(name(rng), data)
        }
        4 => Step::Unlink(name(rng)),
        5 | 6 => Step::Rename(name(rng), name(rng)),
        7 | 8 => Step::Read(name(rng)),
        _ => Step::List,
    }
}

/// What a step returns: an errno, or the contents read / names listed.
type Outcome = Result<Vec<u8>, i32>;

/// The step applied to the model (a sequential directory).
fn model_step(model: &mut BTreeMap<String, Vec<u8>>, step: &Step) -> Outcome {
    match step {
        Step::Write(n, data) => {
            model.insert(n.clone(), data.clone());
            Ok(Vec::new())
        }
        Step::Unlink(n) => model.remove(n).map(|_| Vec::new()).ok_or(libc::ENOENT),
        Step::Rename(a, b) => {
            let data = model.remove(a).ok_or(libc::ENOENT)?;
            model.insert(b.clone(), data);
            Ok(Vec::new())
        }
        Step::Read(n) => model.get(n).cloned().ok_or(libc::ENOENT),
        Step::List => Ok(model.keys().cloned().collect::<Vec<_>>().join("/").into_bytes()),
    }
}

/// The step done through a mount, on directory `dir`.
fn mount_step(dir: &Path, step: &Step) -> Outcome {
    let errno = |e: std::io::Error| e.raw_os_error().unwrap_or(-1);
    match step {
        Step::Write(n, data) => fs::write(dir.join(n), data).map(|_| Vec::new()).map_err(errno),
        Step::Unlink(n) => fs::remove_file(dir.join(n)).map(|_| Vec::new()).map_err(errno),
        Step::Rename(a, b) => fs::rename(dir.join(a), dir.join(b)).map(|_| Vec::new()).map_err(errno),
        Step::Read(n) => fs::read(dir.join(n)).map_err(errno),
        Step::List => {
            let mut names: Vec<String> =
                fs::read_dir(dir).map_err(errno)?.map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
            names.sort();
            Ok(names.join("/").into_bytes())
        }
    }
}

/// The step done through the library, on directory `dir`.
async fn library_step(c: &Client, dir: &str, step: &Step) -> Outcome {
    let errno = |e: plusfs_client::FsError| e.errno.raw();
    let p = |n: &str| format!("{dir}/{n}");
    match step {
        Step::Write(n, data) => {
            c.create(&p(n), 0o644, false).await.map_err(errno)?;
            c.truncate(&p(n), 0).await.map_err(errno)?;
            if !data.is_empty() {
                c.write(&p(n), 0, data).await.map_err(errno)?;
            }
            Ok(Vec::new())
        }
        Step::Unlink(n) => c.unlink(&p(n)).await.map(|_| Vec::new()).map_err(errno),
        Step::Rename(a, b) => c.rename(&p(a), &p(b)).await.map(|_| Vec::new()).map_err(errno),
        Step::Read(n) => c.read_all(&p(n)).await.map_err(errno),
        Step::List => {
            let mut names: Vec<String> = c.readdir(dir).await.map_err(errno)?.into_iter().map(|e| e.name).collect();
            names.sort();
            Ok(names.join("/").into_bytes())
        }
    }
}

/// Two mounts (no kernel caching, so every step reaches them) and a delegating library
/// client take turns of a few steps each on one directory; every step's outcome matches a
/// sequential model, so each turn saw exactly the history the others acknowledged.
#[test]
fn two_mounts_and_a_library_client_take_turns_on_one_directory() {
    if !fuse_available() {
        return;
    }
    // A slow answer to a recall on a busy machine must not be taken for a hung holder.
    let cluster = ProcCluster::start_delegations(3, DelegSettings { recall_timeout_ms: 10_000, ..Default::default() });
    let (a, b) = (Mount::with_options(&cluster, &["ttl=0"]), Mount::with_options(&cluster, &["ttl=0"]));
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let c = delegating(&cluster);
    rt.block_on(c.mkdir("/d", 0o755)).unwrap();
    let mut model = BTreeMap::new();
    let mut rng = StdRng::seed_from_u64(16);
    let mut steps = 0;
    let mut delegated = [false; 3];
    for turn in 0..60 {
        let actor = rng.gen_range(0..3);
        for _ in 0..rng.gen_range(1..=8) {
            let step = random_step(&mut rng);
            let want = model_step(&mut model, &step);
            let got = match actor {
                0 => mount_step(&a.path().join("d"), &step),
                1 => mount_step(&b.path().join("d"), &step),
                _ => rt.block_on(library_step(&c, "/d", &step)),
            };
            assert_eq!(got, want, "turn {turn} of actor {actor}, step {steps}: {step:?}");
            steps += 1;
        }
        delegated[actor] |= match actor {
            0 => a.delegations().0 > 0,
            1 => b.delegations().0 > 0,
            _ => c.delegations_held() > 0,
        };
    }
    assert_eq!(delegated, [true; 3], "each of the three held the directory at some turn");
    let (flushes, recalls, _) = deleg_counters(&cluster);
    assert!(flushes > 0 && recalls > 0, "delegations were used and recalled: {flushes} flushes, {recalls} recalls");
    rt.block_on(c.sync()).unwrap();
    sh(&format!("{} mount --sync {}", common::exe().display(), a.path().display()));
    let st = rt.block_on(cluster.client().lstat("/d")).unwrap();
    assert_eq!(st.size, model.len() as u64, "the directory's entry count");
    cluster.assert_fsck_clean();
    cluster.assert_no_errors_logged();
}

fn names(c: &Client, rt: &tokio::runtime::Runtime, dir: &str) -> Vec<String> {
    let mut v: Vec<String> = rt.block_on(c.readdir(dir)).unwrap().into_iter().map(|e| e.name).collect();
    v.sort();
    v
}

/// A mount stopped (SIGSTOP) while it holds a delegation with queued work: another client
/// needing the directory proceeds after the recall timeout and sees only what was written
/// back; the holder, resumed, has its late flush refused and its next sync fails with EIO.
#[test]
fn a_hung_holder_loses_its_delegation_and_its_next_sync_fails() {
    if !fuse_available() {
        return;
    }
    // Queued work stays queued until a sync or a recall.
    let settings = DelegSettings { writeback_ms: 600_000, ..Default::default() };
    let cluster = ProcCluster::start_delegations(3, settings);
    let m = Mount::new(&cluster);
    let d = m.path().join("d");
    fs::create_dir(&d).unwrap();
    for i in 0..5 {
        fs::write(d.join(format!("synced{i}")), b"on the servers").unwrap();
    }
    let (ok, err) = sync_mount(&cluster, &m);
    assert!(ok, "{err}");
    for i in 0..5 {
        fs::write(d.join(format!("queued{i}")), b"only in the mount").unwrap();
    }
    let (held, pending) = m.delegations();
    assert!(held >= 1 && pending >= 5, "the mount holds the directory with queued work: {held} held, {pending} queued");

    m.signal(libc::SIGSTOP);
    let resume = Resume(m.pid);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let other = cluster.client();
    let started = Instant::now();
    let seen = names(&other, &rt, "/d");
    let waited = started.elapsed();
    let synced: Vec<String> = (0..5).map(|i| format!("synced{i}")).collect();
    assert_eq!(seen, synced, "the other client sees what was written back, nothing queued");
    assert!(waited >= Duration::from_millis(900), "the recall waited for the holder ({waited:?})");
    assert!(waited < Duration::from_secs(15), "the recall wait is bounded ({waited:?})");
    rt.block_on(other.create("/d/from-other", 0o644, true)).unwrap();
    assert!(deleg_counters(&cluster).2 >= 1, "the server revoked the delegation");

    drop(resume);
    let (ok, err) = sync_mount(&cluster, &m);
    assert!(!ok && err.contains("Input/output error"), "the holder's sync reports its lost work: {err}");
    let (ok, err) = sync_mount(&cluster, &m);
    assert!(ok, "the loss is reported once: {err}");
    std::thread::sleep(Duration::from_millis(1100)); // past the mount's name cache
    let mut through_mount: Vec<String> =
        fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    through_mount.sort();
    let mut want = synced;
    want.insert(0, "from-other".into());
    assert_eq!(through_mount, want);
    assert_eq!(rt.block_on(other.lstat("/d")).unwrap().size, 6);
    cluster.assert_fsck_clean();
}

/// Resumes a stopped process when dropped (also when the test fails while it is stopped).
struct Resume(u32);

impl Drop for Resume {
    fn drop(&mut self) {
        // SAFETY: kill(2) on a process this test started.
        unsafe { libc::kill(self.0 as i32, libc::SIGCONT) };
    }
}

/// kill -9 of a mount in the middle of a `tar x`: after a new mount, fsck is clean, every
/// file a sync or fsync covered is complete, every other file is absent or holds a prefix
/// of what was written, never other bytes.
#[test]
fn a_mount_killed_during_tar_x_loses_only_unsynced_work() {
    mounts::tar_kill::killed_during_tar_x_loses_only_unsynced_work(&[]);
}
