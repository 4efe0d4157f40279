//! Directory delegations through real mounts: two mounts and a library client taking turns
//! on one directory against a model, a recall invalidating what the holder's kernel kept
//! under the delegation, a mount that hangs (SIGSTOP) while it holds a delegation, and a
//! mount killed (kill -9) in the middle of a `tar x`.

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

/// Waits up to `within` for `cond`; whether it came.
fn comes_within(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if cond() {
            return true;
        }
        if start.elapsed() > within {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// While mount A holds a directory's delegation its kernel keeps the directory's names
/// (missing ones too) and its files' attributes for the delegation TTL, far past the usual
/// TTL; when mount B changes the directory, the recall makes A invalidate them, so A sees
/// B's new name and new mode within the usual TTL (1 s), not the delegation TTL (60 s).
#[test]
fn a_recall_invalidates_what_the_holders_kernel_kept() {
    if !fuse_available() {
        return;
    }
    // A slow answer to a recall on a busy machine must not be taken for a hung holder.
    let cluster = ProcCluster::start_delegations(3, DelegSettings { recall_timeout_ms: 10_000, ..Default::default() });
    let (a, b) = (Mount::new(&cluster), Mount::new(&cluster));
    let (ad, bd) = (a.path().join("d"), b.path().join("d"));
    fs::create_dir(&ad).unwrap();
    fs::write(ad.join("f"), b"kept").unwrap();
    fs::set_permissions(ad.join("f"), std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    assert!(a.delegations().0 >= 1, "mount A holds the new directory");

    // A's kernel keeps `x` as missing past the usual TTL: the second stat, 1.3 s later, is
    // answered without asking the mount (one failed lookup, not two).
    let (_, missed_before) = a.op_counts("lookup");
    let out = sh(&format!(
        "cd {} && stat -c %a f && ! stat x 2>/dev/null && sleep 1.3 && ! stat x 2>/dev/null && stat -c %a f",
        ad.display()
    ));
    assert_eq!(out.split_whitespace().collect::<Vec<_>>(), ["644", "644"]);
    let (_, missed) = a.op_counts("lookup");
    assert_eq!(missed - missed_before, 1, "A's kernel kept `x` as missing past the usual TTL");
    let (given, invalidated_before) = a.kernel_cache();
    assert!(given >= 2, "answers under the delegation were given its TTL: {given}");

    // B changes the directory: the server recalls A's delegation first.
    fs::write(bd.join("x"), b"from B").unwrap();
    fs::set_permissions(bd.join("f"), std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let usual = Duration::from_millis(1000);
    let (ax, af) = (ad.join("x"), ad.join("f"));
    assert!(comes_within(usual, || fs::read(&ax).is_ok_and(|d| d == b"from B")), "A sees B's new name");
    let mode = || fs::metadata(&af).map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777);
    assert!(comes_within(usual, || mode().is_ok_and(|m| m == 0o600)), "A sees B's chmod: {:?}", mode());
    let (_, invalidated) = a.kernel_cache();
    assert!(invalidated > invalidated_before, "the recall invalidated A's kernel entries");
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
