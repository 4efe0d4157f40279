//! Quotas, enforced by the servers: a tree quota and user quotas on files and bytes, the
//! create and the byte that cross a limit refused with EDQUOT wherever they land, usage
//! exact (equal to fsck's recount) also after kill -9 of a server in the middle of the
//! work, soft limits with their grace, a server added after the quotas were set, and
//! `tar x` and `dd` through the mount.

mod common;
mod mounts;

use common::ProcCluster;
use plusfs_client::{Client, FsError};
use plusfs_proto::quota::{Limit, Limits, Owner, QuotaTarget, Usage};
use plusfs_proto::{Cred, Errno};
use std::time::Duration;

const ALICE: u32 = 1000;
const BOB: u32 = 1001;

fn user(c: &Client, uid: u32) -> Client {
    c.as_caller(Cred { umask: 0, ..Cred::new(uid, uid, vec![]) })
}

fn files(n: u64) -> Limits {
    Limits { files: Limit { hard: Some(n), soft: None }, ..Limits::default() }
}

fn bytes(n: u64) -> Limits {
    Limits { bytes: Limit { hard: Some(n), soft: None }, ..Limits::default() }
}

async fn used(c: &Client, target: &QuotaTarget) -> Usage {
    c.quota_of(target).await.unwrap().used
}

/// Creates files `prefix0..` spread over `dirs` until one is refused; returns how many
/// were made and the refusal.
async fn fill(c: &Client, dirs: &[&str], prefix: &str, max: usize) -> (usize, FsError) {
    for i in 0..max {
        let p = format!("{}/{prefix}{i}", dirs[i % dirs.len()]);
        if let Err(e) = c.create(&p, 0o644, true).await {
            return (i, e);
        }
    }
    panic!("{max} creates and no refusal");
}

/// Waits for the mkdirs of `dirs` to be committed on their servers (a Cx mkdir answers
/// before), so usage read next counts them: a stat of each waits for pending work.
async fn settle(c: &Client, dirs: &[String]) {
    for d in dirs {
        c.stat(d).await.unwrap();
    }
}

/// Asserts every server's counters equal a recount of what it stores.
async fn assert_exact(c: &Client) {
    let wrong = c.quota_check(false).await.unwrap();
    assert!(wrong.is_empty(), "counters differ from the recount: {wrong:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tree_and_user_quotas_refuse_the_create_and_the_byte_that_cross_them() {
    let tc = ProcCluster::start(3);
    let root = tc.client();
    let (alice, bob) = (user(&root, ALICE), user(&root, BOB));
    root.mkdir("/proj", 0o777).await.unwrap();
    // Subdirectories whose objects (and so entries) live on different servers.
    let mut dirs = Vec::new();
    for i in 0..12 {
        let d = format!("/proj/d{i}");
        alice.mkdir(&d, 0o777).await.unwrap();
        dirs.push(d);
    }
    let homes: std::collections::BTreeSet<u32> = dirs.iter().map(|d| root.home(d)).collect();
    assert!(homes.len() >= 2, "the directories span servers: {homes:?}");
    for i in 0..5 {
        alice.create(&format!("/proj/d0/pre{i}"), 0o644, true).await.unwrap();
    }
    alice.write("/proj/d0/pre0", 0, &[7u8; 1000]).await.unwrap();

    // A tree quota set on a populated tree counts what is there: 12 directories, 5 files.
    let tree = QuotaTarget::Tree("/proj".into());
    assert_eq!(alice.quota_set(&tree, Some(files(40))).await.unwrap_err().errno, Errno::EPERM, "admins only");
    root.quota_set(&tree, Some(files(40))).await.unwrap();
    assert_eq!(used(&root, &tree).await, Usage { files: 17, bytes: 1000 });
    assert_exact(&root).await;

    // 23 more fit, wherever they land; the 24th is refused, for any user.
    let refs: Vec<&str> = dirs.iter().map(String::as_str).collect();
    let (made, e) = fill(&alice, &refs, "f", 100).await;
    assert_eq!((made, e.errno), (23, Errno::EDQUOT), "{e}");
    assert!(e.to_string().contains("/proj/d"), "the error names the path: {e}");
    assert_eq!(bob.create("/proj/d3/bob", 0o644, true).await.unwrap_err().errno, Errno::EDQUOT);
    assert_eq!(alice.mkdir("/proj/d1/sub", 0o755).await.err().map(|e| e.errno), Some(Errno::EDQUOT));
    assert_eq!(used(&root, &tree).await.files, 40);
    // Outside the tree nothing is limited; inside, a removal makes room for one.
    root.create("/outside", 0o644, true).await.unwrap();
    alice.unlink("/proj/d5/f5").await.unwrap();
    bob.create("/proj/d5/bob", 0o644, true).await.unwrap();
    assert_eq!(bob.create("/proj/d6/bob", 0o644, true).await.unwrap_err().errno, Errno::EDQUOT);

    // A user's bytes: the write that crosses the limit is refused, the one up to it not.
    let alice_q = QuotaTarget::Uid(ALICE);
    let base = used(&root, &alice_q).await.bytes as u64;
    root.quota_set(&alice_q, Some(bytes(base + 5000))).await.unwrap();
    alice.write("/proj/d2/f2", 0, &[1u8; 3000]).await.unwrap();
    alice.write("/proj/d7/f7", 0, &[2u8; 2000]).await.unwrap();
    assert_eq!(used(&root, &alice_q).await.bytes as u64, base + 5000);
    let e = alice.write("/proj/d8/f8", 0, &[3u8]).await.unwrap_err();
    assert_eq!(e.errno, Errno::EDQUOT, "{e}");
    let e = alice.truncate("/proj/d9/f9", 10).await.unwrap_err();
    assert_eq!(e.errno, Errno::EDQUOT, "{e}");
    // Bob is not alice: his bytes still go.
    bob.write("/proj/d5/bob", 0, &[4u8; 100]).await.unwrap();
    // Shrinking a file gives room back.
    alice.truncate("/proj/d2/f2", 1000).await.unwrap();
    alice.write("/proj/d8/f8", 0, &[3u8; 2000]).await.unwrap();

    // Lifting the quotas lifts the refusals; the counters stay exact throughout.
    root.quota_set(&tree, None).await.unwrap();
    root.quota_set(&alice_q, None).await.unwrap();
    alice.create("/proj/d1/free", 0o644, true).await.unwrap();
    alice.write("/proj/d1/free", 0, &[5u8; 10_000]).await.unwrap();
    let report = root.quota_report().await.unwrap();
    assert!(report.iter().all(|l| l.quota.is_none()), "{report:?}");
    assert!(report.iter().any(|l| l.owner == Owner::Uid(ALICE)), "usage is still counted: {report:?}");
    assert_exact(&root).await;
    tc.assert_fsck_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_stays_exact_after_kill_9_mid_work_and_the_limit_holds_after_restarts() {
    let mut tc = ProcCluster::start(3);
    let root = tc.client();
    let bob = user(&root, BOB);
    root.mkdir("/w", 0o777).await.unwrap();
    let dirs: Vec<String> = (0..6).map(|i| format!("/w/d{i}")).collect();
    for d in &dirs {
        bob.mkdir(d, 0o777).await.unwrap();
    }
    let bob_q = QuotaTarget::Uid(BOB);
    settle(&root, &dirs).await;
    let start = used(&root, &bob_q).await.files as u64;
    root.quota_set(&bob_q, Some(files(start + 60))).await.unwrap();

    // Bob creates and removes while one server is killed and started again.
    let victim = root.home(&dirs[1]);
    let worker = {
        let (bob, dirs) = (bob.clone(), dirs.clone());
        tokio::spawn(async move {
            let (mut ok, mut failed) = (0u32, 0u32);
            for i in 0..200 {
                let p = format!("{}/k{i}", dirs[i % dirs.len()]);
                match bob.create(&p, 0o644, true).await {
                    Ok(_) => ok += 1,
                    Err(_) => failed += 1,
                }
                if i % 3 == 0 {
                    let _ = bob.unlink(&p).await;
                }
            }
            (ok, failed)
        })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(!worker.is_finished(), "the kill lands in the middle of the work");
    tc.cluster.kill(victim).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    tc.cluster.start(victim).unwrap();
    tc.cluster.wait_ready(Duration::from_secs(20)).unwrap();
    let (ok, failed) = worker.await.unwrap();
    assert!(ok > 0 && failed > 0, "some creates went and some met the limit or the dead server: {ok} / {failed}");
    assert_exact(&root).await;

    // Whatever happened, bob's usage never passed the limit, and the limit still holds.
    let (_, e) = fill(&bob, &dirs.iter().map(String::as_str).collect::<Vec<_>>(), "after", 200).await;
    assert_eq!(e.errno, Errno::EDQUOT, "{e}");
    assert_eq!(used(&root, &bob_q).await.files as u64, start + 60);
    assert_exact(&root).await;
    tc.assert_fsck_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_soft_limit_is_a_hard_one_once_its_grace_is_over() {
    let tc = ProcCluster::start(2);
    let root = tc.client();
    root.mkdir("/s", 0o777).await.unwrap();
    let tree = QuotaTarget::Tree("/s".into());
    let limits = Limits { files: Limit { hard: Some(20), soft: Some(5) }, grace_secs: 2, ..Limits::default() };
    let bad = Limits { files: Limit { hard: Some(5), soft: Some(20) }, ..Limits::default() };
    assert_eq!(root.quota_set(&tree, Some(bad)).await.unwrap_err().errno, Errno::EINVAL);
    root.quota_set(&tree, Some(limits)).await.unwrap();
    // Above the soft limit during the grace period: allowed.
    for i in 0..8 {
        root.create(&format!("/s/f{i}"), 0o644, true).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    // Grace over: refused while above the soft limit...
    let e = root.create("/s/late", 0o644, true).await.unwrap_err();
    assert_eq!(e.errno, Errno::EDQUOT, "{e}");
    // ...and allowed again once back under it.
    for i in 0..4 {
        root.unlink(&format!("/s/f{i}")).await.unwrap();
    }
    root.create("/s/late", 0o644, true).await.unwrap();
    assert_exact(&root).await;

    // The same through the command line.
    root.mkdir("/s/cli", 0o755).await.unwrap();
    let (code, _, err) = tc.cli(&["quota", "set", "/s/cli", "--files", "2", "--bytes", "1k"]);
    assert_eq!(code, 0, "{err}");
    root.create("/s/cli/a", 0o644, true).await.unwrap();
    eprintln!("DBG {:?}", root.quota_report().await.unwrap());
    let r = root.write("/s/cli/a", 0, &[0u8; 1024]).await;
    eprintln!("DBG {r:?} {:?}", root.quota_report().await.unwrap());
    r.unwrap();
    root.create("/s/cli/b", 0o644, true).await.unwrap();
    assert_eq!(root.create("/s/cli/c", 0o644, true).await.unwrap_err().errno, Errno::EDQUOT);
    let (code, out, err) = tc.cli(&["quota", "show", "/s/cli"]);
    assert_eq!(code, 0, "{err}");
    let row = out.lines().find(|l| l.starts_with("tree /s/cli")).unwrap_or_else(|| panic!("no row: {out}"));
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cols[2..], ["2", "-", "2", "1024", "-", "1024"], "{out}");
    let (code, out, _) = tc.cli(&["quota", "report"]);
    assert!(code == 0 && out.contains("tree /s/cli") && out.contains("tree /s"), "{out}");
    let (code, _, err) = tc.cli(&["quota", "set", "--uid", "5", "--bytes", "3X"]);
    assert!(code != 0 && err.contains("unknown size suffix"), "{err}");
    let (code, _, err) = tc.cli(&["quota", "clear", "/s/cli"]);
    assert_eq!(code, 0, "{err}");
    root.create("/s/cli/c", 0o644, true).await.unwrap();
    tc.assert_fsck_clean();
}

/// Stops every server of the cluster in a data directory when dropped, those `cluster add`
/// started included.
struct DownOnDrop(std::path::PathBuf);

impl Drop for DownOnDrop {
    fn drop(&mut self) {
        let _ = plusfs_localcluster::down(&self.0, Duration::from_secs(5));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_added_to_the_cluster_enforces_the_quotas_set_before() {
    let tc = ProcCluster::start(2);
    let _down = DownOnDrop(tc.cluster.data().to_path_buf());
    let root = tc.client();
    let bob = user(&root, BOB);
    root.mkdir("/g", 0o777).await.unwrap();
    let dirs: Vec<String> = (0..16).map(|i| format!("/g/d{i}")).collect();
    for d in &dirs {
        bob.mkdir(d, 0o777).await.unwrap();
    }
    let tree = QuotaTarget::Tree("/g".into());
    root.quota_set(&tree, Some(files(60))).await.unwrap();
    root.quota_set(&QuotaTarget::Uid(BOB), Some(files(70))).await.unwrap();
    for (i, d) in dirs.iter().enumerate() {
        bob.create(&format!("{d}/before{i}"), 0o644, true).await.unwrap();
    }
    let data = tc.cluster.data().display().to_string();
    let (code, out, err) = tc.cli(&["cluster", "add", "--data", &data, "--wait"]);
    assert_eq!(code, 0, "cluster add failed:\n{out}\n{err}");
    let map = plusfs_placement::ClusterMap::load(&tc.cluster.map_file()).unwrap();
    assert_eq!(map.servers.len(), 3);
    let new_id = map.servers.iter().map(|s| s.id).max().unwrap();
    let fresh = Client::new(map.clone(), plusfs_client::ClientOptions { retries: 5, ..Default::default() });
    let bob = user(&fresh, BOB);
    let lands_on_new = dirs.iter().filter(|d| fresh.home(d) == new_id).count();
    assert!(lands_on_new > 0, "some directories moved to the new server");
    // The new server took the quota table: the tree's limit holds wherever files land.
    let (made, e) = fill(&bob, &dirs.iter().map(String::as_str).collect::<Vec<_>>(), "after", 200).await;
    assert_eq!((made, e.errno), (60 - 32, Errno::EDQUOT), "{e}");
    assert_eq!(used(&fresh, &tree).await.files, 60);
    assert_exact(&fresh).await;
    tc.assert_fsck_clean();
}

/// Through the mount: `tar x` into a tree at its files limit and a write past a bytes
/// limit fail with "Disk quota exceeded", and exactly the limit is used.
#[test]
fn edquot_through_the_mount_for_tar_and_writes() {
    use mounts::{as_user, fuse_available, sh, Mount};
    if !fuse_available() {
        return;
    }
    let tc = ProcCluster::start(3);
    let m = Mount::with_options(&tc, &["allow_other"]);
    let d = m.path().display().to_string();
    sh(&format!("mkdir -m 777 {d}/mq {d}/mb"));
    let (code, _, err) = tc.cli(&["quota", "set", "/mq", "--files", "30"]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = tc.cli(&["quota", "set", "/mb", "--bytes", "64k"]);
    assert_eq!(code, 0, "{err}");
    // A tree of 4 directories and 40 files, 10 bytes each.
    let src = tempfile::tempdir().unwrap();
    let s = src.path().display().to_string();
    sh(&format!(
        "cd {s} && mkdir t && for i in 0 1 2 3; do mkdir t/d$i; for j in $(seq 1 10); do echo 123456789 > t/d$i/f$j; \
         done; done && tar -cf t.tar t"
    ));
    let (ok, _, err) = as_user(BOB, &[], &format!("tar -xf {s}/t.tar -C {d}/mq"));
    assert!(!ok && err.contains("Disk quota exceeded"), "tar stops at the limit: {err}");
    let n: usize = sh(&format!("find {d}/mq -mindepth 1 | wc -l")).trim().parse().unwrap();
    assert_eq!(n, 30, "exactly the limit was made");
    let (ok, _, err) = as_user(BOB, &[], &format!("dd if=/dev/zero of={d}/mb/big bs=4k count=32 conv=fsync"));
    assert!(!ok && err.contains("Disk quota exceeded"), "128 KiB do not fit in 64 KiB: {err}");
    let size: u64 = sh(&format!("stat -c %s {d}/mb/big")).trim().parse().unwrap();
    assert!(size <= 64 << 10, "no more than the limit was kept: {size}");
    let (code, out, _) = tc.cli(&["quota", "report"]);
    let row = out.lines().find(|l| l.starts_with("tree /mq")).unwrap_or_else(|| panic!("{out}"));
    assert_eq!(row.split_whitespace().nth(2), Some("30"), "{out}");
    assert_eq!(code, 0);
    drop(m);
    tc.assert_fsck_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moving_files_between_servers_does_not_open_room_past_the_limit() {
    let tc = ProcCluster::start(3);
    let root = tc.client();
    let bob = user(&root, BOB);
    root.mkdir("/m", 0o777).await.unwrap();
    let mut dirs: Vec<String> = Vec::new();
    for i in 0.. {
        let d = format!("/m/d{i}");
        if dirs.iter().all(|o| root.home(o) != root.home(&d)) {
            bob.mkdir(&d, 0o777).await.unwrap();
            dirs.push(d);
        }
        if dirs.len() == 2 {
            break;
        }
    }
    let bob_q = QuotaTarget::Uid(BOB);
    settle(&root, &dirs).await;
    let start = used(&root, &bob_q).await.files as u64;
    root.quota_set(&bob_q, Some(files(start + 20))).await.unwrap();
    let (made, e) = fill(&bob, &[dirs[0].as_str()], "f", 100).await;
    assert_eq!((made, e.errno), (20, Errno::EDQUOT));
    // Renames move the usage to the other server; the room they leave behind is taken
    // back by the master, so no create goes past the limit afterwards.
    for i in 0..10 {
        bob.rename(&format!("{}/f{i}", dirs[0]), &format!("{}/f{i}", dirs[1])).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let refused = bob.create(&format!("{}/after", dirs[0]), 0o644, true).await.unwrap_err();
    assert_eq!(refused.errno, Errno::EDQUOT, "{refused}");
    assert_eq!(bob.create(&format!("{}/after", dirs[1]), 0o644, true).await.unwrap_err().errno, Errno::EDQUOT);
    assert_eq!(used(&root, &bob_q).await.files as u64, start + 20);
    assert_exact(&root).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_create_makes_what_fits_and_refuses_the_rest() {
    use plusfs_client::{NewFile, OpenFlags};
    use plusfs_proto::Semantics;
    let tc = ProcCluster::start(2);
    let root = tc.client();
    root.mkdir("/b", 0o755).await.unwrap();
    root.quota_set(&QuotaTarget::Tree("/b".into()), Some(files(10))).await.unwrap();
    let names: Vec<String> = (0..15).map(|i| format!("n{i}")).collect();
    let flags = OpenFlags { create: true, ..OpenFlags::default() };
    let out = root.openv("/b", &names, flags, 0o644, Semantics::PerformAll).await.unwrap();
    let made = out.iter().filter(|r| r.is_ok()).count();
    assert_eq!(made, 10, "{out:?}");
    assert!(out[10..].iter().all(|r| *r == Err(Errno::EDQUOT)), "{out:?}");
    // A batch-file write past the limit is refused as a whole (one store batch).
    let files: Vec<NewFile> = (0..3).map(|i| NewFile::new(format!("/b/bfo{i}"), vec![1u8; 10])).collect();
    let written = root.batch_write(files).await;
    assert!(written.iter().all(|r| r.as_ref().is_err_and(|e| e.errno == Errno::EDQUOT)), "{written:?}");
    assert_eq!(used(&root, &QuotaTarget::Tree("/b".into())).await.files, 10);
    // Each server shows its share in `cluster status`.
    let (code, out, err) = tc.cli(&["cluster", "status"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("quota tree /b:"), "{out}");
    assert_exact(&root).await;
}

/// Files and bytes below `dir` as a walk sees them (directories count as files; a tree's
/// root does not).
async fn walk(c: &Client, dir: &str) -> Usage {
    let mut total = Usage::default();
    let mut todo = vec![dir.to_string()];
    while let Some(d) = todo.pop() {
        for e in c.readdir(&d).await.unwrap() {
            let p = format!("{d}/{}", e.name);
            total.files += 1;
            match e.kind {
                plusfs_proto::FileKind::Dir => todo.push(p),
                _ => total.bytes += c.lstat(&p).await.unwrap().size as i64,
            }
        }
    }
    total
}

/// A seeded random run of creates, writes, truncates, renames (within and into the tree),
/// mkdirs, rmdirs and unlinks under a tree quota and a user quota: afterwards every
/// counter equals the servers' recount and the tree's usage equals a walk of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_equals_the_recount_after_a_random_run() {
    use rand::{Rng, SeedableRng};
    let seed = std::env::var("PLUSFS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(42u64);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let tc = ProcCluster::start(3);
    let root = tc.client();
    let bob = user(&root, BOB);
    for d in ["/r", "/out"] {
        root.mkdir(d, 0o777).await.unwrap();
    }
    let tree = QuotaTarget::Tree("/r".into());
    root.quota_set(&tree, Some(Limits { files: Limit { hard: Some(25), soft: None }, ..bytes(20_000) })).await.unwrap();
    root.quota_set(&QuotaTarget::Uid(BOB), Some(files(35))).await.unwrap();
    let dirs = ["/r", "/r/a", "/r/b", "/r/a/c", "/out"];
    for d in ["/r/a", "/r/b", "/r/a/c"] {
        bob.mkdir(d, 0o777).await.unwrap();
    }
    let (mut refused, mut done) = (0, 0);
    for i in 0..400 {
        let d = dirs[rng.gen_range(0..dirs.len())];
        let name = format!("{d}/x{}", rng.gen_range(0..25));
        let r = match rng.gen_range(0..8) {
            0 | 1 => bob.create(&name, 0o644, false).await.map(drop),
            2 => bob.write(&name, rng.gen_range(0..2000), &vec![7u8; rng.gen_range(1..3000)]).await.map(drop),
            3 => bob.truncate(&name, rng.gen_range(0..5000)).await.map(drop),
            4 => {
                let to = format!("{}/x{}", dirs[rng.gen_range(0..dirs.len())], rng.gen_range(0..25));
                bob.rename(&name, &to).await
            }
            5 => bob.unlink(&name).await,
            6 if i % 3 == 0 => bob.mkdir(&format!("{d}/s{}", rng.gen_range(0..4)), 0o777).await.map(drop),
            _ => bob.rmdir(&format!("{d}/s{}", rng.gen_range(0..4))).await,
        };
        match r {
            Ok(()) => done += 1,
            Err(e) if e.errno == Errno::EDQUOT => refused += 1,
            Err(_) => {}
        }
    }
    assert!(done > 100 && refused > 0, "the run did work and met the limits: {done} done, {refused} refused");
    assert_exact(&root).await;
    // Cx commits lazily: a mkdir or rmdir just answered may still be pending on its
    // directory's server, where usage is counted; it settles within moments.
    let mut tries = 0;
    let (counted, walked) = loop {
        let (counted, walked) = (used(&root, &tree).await, walk(&root, "/r").await);
        tries += 1;
        if counted == walked || tries == 50 {
            break (counted, walked);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(counted, walked, "the tree's usage is what a walk finds");
    assert_exact(&root).await;
    tc.assert_fsck_clean();
}
