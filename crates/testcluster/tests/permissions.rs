//! Permission checks on the servers (pjdfstest-style cases, no kernel): other users,
//! groups, sticky and setgid directories, owner-only changes, and search permission of
//! ancestors held on other servers — also after a chmod of a top directory, a directory
//! rename, and a server crash in the middle of a chmod's propagation.

use plusfs_client::{fsck, Client, FsError};
use plusfs_placement::TxnProtocol;
use plusfs_proto::{Cred, Errno, Threshold, TimeSet, Timespec, MAY_READ, MAY_WRITE};
use plusfs_testcluster::{FailAction, FailStep, Options, TestCluster};
use std::time::Duration;

async fn start(protocol: TxnProtocol) -> TestCluster {
    TestCluster::start(Options { servers: 4, protocol, ..Options::default() }).await.expect("cluster starts")
}

/// A client calling as `uid`:`gid` with supplementary `groups`.
fn user(root: &Client, uid: u32, gid: u32, groups: &[u32]) -> Client {
    root.as_caller(Cred::new(uid, gid, groups.to_vec()))
}

fn errno<T: std::fmt::Debug>(r: Result<T, FsError>) -> Errno {
    r.expect_err("the call is refused").errno
}

/// A directory path under `parent` whose home differs from the homes of every path in
/// `avoid`, so its ancestors live on other servers.
fn elsewhere(c: &Client, parent: &str, prefix: &str, avoid: &[&str]) -> String {
    (0..)
        .map(|i| plusfs_proto::path::join(parent, &format!("{prefix}{i}")))
        .find(|p| avoid.iter().all(|a| c.home(a) != c.home(p)) && c.home(parent) != c.home(p))
        .expect("some name lands elsewhere")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_users_and_supplementary_groups() {
    let cluster = start(TxnProtocol::Cx).await;
    let root = cluster.client();
    root.mkdir("/d", 0o755).await.unwrap();
    root.chown("/d", Some(1000), Some(1000)).await.unwrap();
    let (owner, member, other) =
        (user(&root, 1000, 1000, &[]), user(&root, 2001, 2001, &[1000]), user(&root, 2000, 2000, &[]));
    owner.create("/d/f", 0o640, true).await.unwrap();
    let a = root.lstat("/d/f").await.unwrap();
    assert_eq!((a.uid, a.gid), (1000, 1000), "a non-root caller owns what it creates");
    owner.write("/d/f", 0, b"data").await.unwrap();
    assert_eq!(errno(other.read("/d/f", 0, 4).await), Errno::EACCES);
    assert_eq!(errno(other.open_with("/d/f", MAY_READ).await), Errno::EACCES);
    assert_eq!(member.read("/d/f", 0, 4).await.unwrap(), b"data", "a supplementary group grants its bits");
    assert_eq!(errno(member.write("/d/f", 0, b"x").await), Errno::EACCES);
    assert_eq!(errno(member.open_with("/d/f", MAY_READ | MAY_WRITE).await), Errno::EACCES);
    assert_eq!(errno(member.truncate("/d/f", 0).await), Errno::EACCES);
    // open(O_CREAT) of an existing file checks the access asked, as open does.
    assert_eq!(errno(member.create_with("/d/f", 0o644, false, MAY_WRITE).await), Errno::EACCES);
    member.create_with("/d/f", 0o644, false, MAY_READ).await.unwrap();
    assert_eq!(errno(other.create("/d/g", 0o644, true).await), Errno::EACCES, "no write permission on /d");
    assert_eq!(errno(other.mkdir("/d/s", 0o755).await), Errno::EACCES);
    assert_eq!(errno(other.unlink("/d/f").await), Errno::EACCES);
    assert_eq!(errno(other.setxattr("/d/f", "user.a", b"1", false, false).await), Errno::EACCES);
    owner.mkdir("/d/s", 0o700).await.unwrap();
    assert_eq!(errno(other.readdir("/d/s").await), Errno::EACCES);
    assert_eq!(errno(other.lstat("/d/s/x").await), Errno::EACCES, "no search permission on /d/s");
    owner.readdir("/d/s").await.unwrap();
    assert_eq!(root.read("/d/f", 0, 4).await.unwrap(), b"data", "root bypasses the bits");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sticky_directories() {
    let cluster = start(TxnProtocol::Cx).await;
    let root = cluster.client();
    root.mkdir("/t", 0o1777).await.unwrap();
    root.chown("/t", Some(10), Some(10)).await.unwrap();
    let (u1, u2, dir_owner) = (user(&root, 1, 1, &[]), user(&root, 2, 2, &[]), user(&root, 10, 10, &[]));
    u1.create("/t/a", 0o666, true).await.unwrap();
    u1.mkdir("/t/da", 0o777).await.unwrap();
    assert_eq!(errno(u2.unlink("/t/a").await), Errno::EPERM);
    assert_eq!(errno(u2.rename("/t/a", "/t/b").await), Errno::EPERM);
    assert_eq!(errno(u2.rmdir("/t/da").await), Errno::EPERM);
    u2.create("/t/c", 0o666, true).await.unwrap();
    assert_eq!(errno(u2.rename("/t/c", "/t/a").await), Errno::EPERM, "replacing another's entry");
    dir_owner.unlink("/t/c").await.unwrap();
    u1.rename("/t/a", "/t/b").await.unwrap();
    u1.unlink("/t/b").await.unwrap();
    u1.rmdir("/t/da").await.unwrap();
    // Hard links: the owner is the inode's.
    u1.create("/t/h", 0o644, true).await.unwrap();
    u1.link("/t/h", "/t/h2").await.unwrap();
    assert_eq!(errno(u2.unlink("/t/h2").await), Errno::EPERM);
    assert_eq!(errno(u2.rename("/t/h2", "/t/h3").await), Errno::EPERM);
    u1.rename("/t/h2", "/t/h3").await.unwrap();
    u1.unlink("/t/h3").await.unwrap();
    u1.unlink("/t/h").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setgid_directories_pass_their_group_on() {
    for protocol in [TxnProtocol::Cx, TxnProtocol::TwoPhase, TxnProtocol::Serial] {
        let cluster = start(protocol).await;
        let root = cluster.client();
        root.mkdir("/g", 0o2777).await.unwrap();
        root.chown("/g", None, Some(500)).await.unwrap();
        let u = user(&root, 7, 7, &[]);
        let sub = elsewhere(&root, "/g", "sub", &[]);
        let answered = u.mkdir(&sub, 0o755).await.unwrap();
        let a = root.stat(&sub).await.unwrap();
        assert_eq!((a.uid, a.gid, a.mode & 0o7777), (7, 500, 0o2755), "{protocol:?}");
        // mkdir answers with what the servers made.
        assert_eq!((answered.gid, answered.mode & 0o7777), (500, 0o2755), "{protocol:?}");
        let local = (0..).map(|i| format!("/g/l{i}")).find(|p| root.home(p) == root.home("/g")).unwrap();
        let answered = u.mkdir(&local, 0o755).await.unwrap();
        assert_eq!((answered.gid, answered.mode & 0o7777), (500, 0o2755), "{protocol:?}, one server");
        u.create("/g/f", 0o644, true).await.unwrap();
        let f = root.lstat("/g/f").await.unwrap();
        assert_eq!((f.uid, f.gid, f.mode & 0o7777), (7, 500, 0o644), "{protocol:?}");
        // And its own children search it with the ancestry it was given.
        u.create(&format!("{sub}/x"), 0o644, true).await.unwrap();
        assert_eq!(root.lstat(&format!("{sub}/x")).await.unwrap().gid, 500);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_only_changes() {
    let cluster = start(TxnProtocol::Cx).await;
    let root = cluster.client();
    root.mkdir("/o", 0o777).await.unwrap();
    let (owner, other) = (user(&root, 1, 1, &[3]), user(&root, 2, 2, &[]));
    owner.create("/o/f", 0o644, true).await.unwrap();
    assert_eq!(errno(other.chmod("/o/f", 0o777).await), Errno::EPERM);
    let at = Some(TimeSet::At(Timespec { sec: 5, nsec: 0 }));
    assert_eq!(errno(other.utimens("/o/f", at, at).await), Errno::EPERM);
    let now = Some(TimeSet::Now);
    assert_eq!(errno(other.utimens("/o/f", now, now).await), Errno::EACCES);
    owner.chmod("/o/f", 0o666).await.unwrap();
    other.utimens("/o/f", now, now).await.expect("write permission lets anyone set the times to now");
    owner.utimens("/o/f", at, at).await.unwrap();
    assert_eq!(errno(owner.chown("/o/f", Some(2), None).await), Errno::EPERM, "only root gives files away");
    assert_eq!(errno(owner.chown("/o/f", None, Some(4)).await), Errno::EPERM, "not a member of group 4");
    owner.chown("/o/f", None, Some(3)).await.unwrap();
    assert_eq!(root.lstat("/o/f").await.unwrap().gid, 3);
    // Setting setgid on a file of a group the caller is not in: the bit is dropped.
    root.chown("/o/f", None, Some(9)).await.unwrap();
    owner.chmod("/o/f", 0o2755).await.unwrap();
    assert_eq!(root.lstat("/o/f").await.unwrap().mode & 0o7777, 0o755);
    // A change of owner drops setuid (and setgid with group execution), as on Linux.
    root.chmod("/o/f", 0o6755).await.unwrap();
    root.chown("/o/f", Some(5), None).await.unwrap();
    assert_eq!(root.lstat("/o/f").await.unwrap().mode & 0o7777, 0o755);
    // Directories: owner-only chmod, times as for files.
    owner.mkdir("/o/d", 0o755).await.unwrap();
    assert_eq!(errno(other.chmod("/o/d", 0o777).await), Errno::EPERM);
    assert_eq!(errno(other.utimens("/o/d", at, at).await), Errno::EPERM);
    owner.chmod("/o/d", 0o700).await.unwrap();
    // A leaf directory's chmod changes only its own object, its ancestry included.
    assert_eq!(errno(other.create("/o/d/x", 0o644, true).await), Errno::EACCES);
    owner.chmod("/o/d", 0o777).await.unwrap();
    other.create("/o/d/x", 0o644, true).await.unwrap();
    let sub = elsewhere(&root, "/o/d", "s", &["/", "/o"]);
    other.mkdir(&sub, 0o777).await.unwrap();
    other.create(&format!("{sub}/y"), 0o644, true).await.unwrap();
    owner.chmod("/o/d", 0o766).await.unwrap();
    assert_eq!(errno(other.lstat(&format!("{sub}/y")).await), Errno::EACCES, "no search on /o/d any more");
    owner.lstat(&format!("{sub}/y")).await.unwrap();
}

/// `/a` (0700, root) on one server, `/a/b` and the file below on others: a caller that may
/// not search `/a` is refused deep below it, and the refusal follows chmod of `/a`.
async fn deep_search_follows_top_chmod(protocol: TxnProtocol) {
    let cluster = start(protocol).await;
    let root = cluster.client();
    root.mkdir("/a", 0o700).await.unwrap();
    let b = elsewhere(&root, "/a", "b", &["/"]);
    root.mkdir(&b, 0o777).await.unwrap();
    let c = elsewhere(&root, &b, "c", &["/", "/a"]);
    root.mkdir(&c, 0o777).await.unwrap();
    let f = format!("{c}/f");
    root.create(&f, 0o666, true).await.unwrap();
    let u = user(&root, 1, 1, &[]);
    assert_eq!(errno(u.lstat(&f).await), Errno::EACCES, "{protocol:?}: /a is not searchable");
    assert_eq!(errno(u.read(&f, 0, 1).await), Errno::EACCES);
    assert_eq!(errno(u.readdir(&c).await), Errno::EACCES);
    assert_eq!(errno(u.create(&format!("{c}/g"), 0o644, true).await), Errno::EACCES);
    root.chmod("/a", 0o711).await.unwrap();
    u.lstat(&f).await.expect("searchable after chmod of the top");
    u.create(&format!("{c}/g"), 0o644, true).await.unwrap();
    assert!(u.readdir(&c).await.unwrap().len() == 2);
    root.chmod(&b, 0o700).await.unwrap();
    assert_eq!(errno(u.lstat(&f).await), Errno::EACCES, "{protocol:?}: now the middle one is closed");
    root.chown(&b, Some(1), None).await.unwrap();
    u.lstat(&f).await.expect("owner's bits after chown");
    root.chmod("/a", 0o700).await.unwrap();
    assert_eq!(errno(u.lstat(&f).await), Errno::EACCES);
    // Group bits: a member of /a's group may search it once the group may.
    root.chmod("/a", 0o710).await.unwrap();
    root.chown("/a", None, Some(44)).await.unwrap();
    assert_eq!(errno(u.lstat(&f).await), Errno::EACCES);
    user(&root, 1, 1, &[44]).lstat(&f).await.expect("a member of /a's group");
    assert!(cluster.settle(Duration::from_secs(20)).await);
    let scans = fsck::scan_settled(&root, Duration::from_secs(10)).await.unwrap();
    assert!(fsck::check(&root, &scans).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_search_cx() {
    deep_search_follows_top_chmod(TxnProtocol::Cx).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_search_2pc() {
    deep_search_follows_top_chmod(TxnProtocol::TwoPhase).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_search_serial() {
    deep_search_follows_top_chmod(TxnProtocol::Serial).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distributed_directories_check_their_shards() {
    let cluster = start(TxnProtocol::Cx).await;
    let root = cluster.client();
    root.mkdir_with("/h", 0o777, Threshold::Entries(0), 0).await.unwrap();
    let (u1, u2) = (user(&root, 1, 1, &[]), user(&root, 2, 2, &[]));
    for i in 0..16 {
        u1.create(&format!("/h/f{i}"), 0o644, true).await.unwrap();
    }
    assert!(root.distribution("/h").await.unwrap().set.len() > 1, "spread over several servers");
    root.chmod("/h", 0o755).await.unwrap();
    for i in 0..16 {
        assert_eq!(errno(u1.create(&format!("/h/g{i}"), 0o644, true).await), Errno::EACCES, "shard {i}");
    }
    assert_eq!(u2.readdir("/h").await.unwrap().len(), 16);
    root.chmod("/h", 0o700).await.unwrap();
    assert_eq!(errno(u2.readdir("/h").await), Errno::EACCES);
    assert_eq!(errno(u2.lstat("/h/f3").await), Errno::EACCES);
    root.chown("/h", Some(2), None).await.unwrap();
    assert_eq!(u2.readdir("/h").await.unwrap().len(), 16);
    u2.unlink("/h/f3").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn directory_rename_rebases_the_ancestry() {
    let cluster = start(TxnProtocol::Cx).await;
    let root = cluster.client();
    root.mkdir("/open", 0o755).await.unwrap();
    root.mkdir("/closed", 0o700).await.unwrap();
    let x = elsewhere(&root, "/open", "x", &["/", "/closed"]);
    root.mkdir(&x, 0o755).await.unwrap();
    let y = elsewhere(&root, &x, "y", &["/"]);
    root.mkdir(&y, 0o755).await.unwrap();
    root.create(&format!("{y}/f"), 0o644, true).await.unwrap();
    let u = user(&root, 1, 1, &[]);
    u.lstat(&format!("{y}/f")).await.unwrap();
    let moved = x.replacen("/open", "/closed", 1);
    root.rename(&x, &moved).await.unwrap();
    let deep = format!("{}/f", y.replacen("/open", "/closed", 1));
    root.lstat(&deep).await.unwrap();
    assert_eq!(errno(u.lstat(&deep).await), Errno::EACCES, "moved under a closed directory");
    root.rename(&moved, &x).await.unwrap();
    u.lstat(&format!("{y}/f")).await.expect("moved back");
    // Moving a directory to another parent needs write permission on it (its "..").
    root.chmod("/closed", 0o777).await.unwrap();
    let owned = user(&root, 1, 1, &[]);
    owned.mkdir("/closed/mine", 0o555).await.unwrap();
    assert_eq!(errno(owned.rename("/closed/mine", &format!("{x}/mine")).await), Errno::EACCES);
    root.chmod(&x, 0o777).await.unwrap();
    owned.chmod("/closed/mine", 0o755).await.unwrap();
    owned.rename("/closed/mine", &format!("{x}/mine")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chmod_propagation_survives_a_coordinator_crash() {
    let cluster = start(TxnProtocol::Cx).await;
    let root = cluster.client();
    root.mkdir("/p", 0o700).await.unwrap();
    let q = elsewhere(&root, "/p", "q", &["/"]);
    root.mkdir(&q, 0o755).await.unwrap();
    root.create(&format!("{q}/f"), 0o644, true).await.unwrap();
    let u = user(&root, 1, 1, &[]);
    assert_eq!(errno(u.lstat(&format!("{q}/f")).await), Errno::EACCES);
    // The chmod's transaction is decided (commit record logged), then its coordinator
    // (the home of /p) dies before telling anyone: after the restart it finishes.
    let home = root.home("/p");
    let _fp = cluster.failpoint(home, FailStep::CoordinatorAfterCommitRecord, FailAction::Crash);
    let chmod = {
        let root = root.clone();
        tokio::spawn(async move { root.chmod("/p", 0o755).await })
    };
    tokio::time::timeout(Duration::from_secs(20), async {
        while cluster.crashes(home) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the coordinator crashed at the step");
    cluster.disarm(home, FailStep::CoordinatorAfterCommitRecord);
    cluster.restart(home).await.unwrap();
    let _ = chmod.await.unwrap();
    assert!(cluster.settle(Duration::from_secs(20)).await, "the transaction ends");
    assert_eq!(root.stat("/p").await.unwrap().mode & 0o7777, 0o755);
    u.lstat(&format!("{q}/f")).await.expect("the new bits reached the server below");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chmod_aborted_by_a_participant_crash_changes_nothing() {
    let cluster = start(TxnProtocol::Cx).await;
    let root = cluster.client();
    root.mkdir("/p", 0o700).await.unwrap();
    let q = elsewhere(&root, "/p", "q", &["/"]);
    root.mkdir(&q, 0o755).await.unwrap();
    let u = user(&root, 1, 1, &[]);
    let victim = root.home(&q);
    let _fp = cluster.failpoint(victim, FailStep::ParticipantAfterPrepareRecord, FailAction::Crash);
    let chmod = {
        let root = root.clone();
        tokio::spawn(async move { root.chmod("/p", 0o755).await })
    };
    tokio::time::timeout(Duration::from_secs(20), async {
        while cluster.crashes(victim) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the participant crashed at the step");
    cluster.disarm(victim, FailStep::ParticipantAfterPrepareRecord);
    cluster.restart(victim).await.unwrap();
    let answer = chmod.await.unwrap();
    assert!(cluster.settle(Duration::from_secs(20)).await, "the transaction ends");
    // All or nothing: the mode and what the server below checks agree.
    let mode = root.stat("/p").await.unwrap().mode & 0o7777;
    let deep = u.readdir(&q).await;
    match mode {
        0o755 => assert!(deep.is_ok(), "committed: {answer:?}"),
        _ => assert_eq!(errno(deep), Errno::EACCES, "aborted: {answer:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cx_mkdir_whose_coordinator_crashes_still_gets_its_ancestry() {
    let cluster = start(TxnProtocol::Cx).await;
    let root = cluster.client();
    root.mkdir("/s", 0o2777).await.unwrap();
    root.chown("/s", None, Some(500)).await.unwrap();
    let n = elsewhere(&root, "/s", "n", &[]);
    let coordinator = root.home("/s");
    let u = user(&root, 7, 7, &[]);
    // The coordinator dies after logging its Result: the participant may not reach it to
    // read /s's ancestry, and then fills it in at commitment.
    let _fp = cluster.failpoint(coordinator, FailStep::CxAfterResult, FailAction::Crash);
    let mkdir = {
        let (u, n) = (u.clone(), n.clone());
        tokio::spawn(async move { u.mkdir(&n, 0o755).await })
    };
    tokio::time::timeout(Duration::from_secs(20), async {
        while cluster.crashes(coordinator) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the coordinator crashed at the step");
    cluster.disarm(coordinator, FailStep::CxAfterResult);
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.restart(coordinator).await.unwrap();
    let _ = mkdir.await.unwrap();
    assert!(cluster.settle(Duration::from_secs(20)).await, "the operation ends");
    let a = root.stat(&n).await.expect("both Results were logged: the mkdir commits");
    assert_eq!((a.uid, a.gid, a.mode & 0o7777), (7, 500, 0o2755));
    u.create(&format!("{n}/f"), 0o644, true).await.unwrap();
    root.chmod("/s", 0o2770).await.unwrap();
    assert_eq!(errno(u.lstat(&format!("{n}/f")).await), Errno::EACCES, "the new object has /s in its ancestry");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cx_participant_cut_off_from_the_parent_fills_the_ancestry_at_commit() {
    let cluster = start(TxnProtocol::Cx).await;
    let root = cluster.client();
    root.mkdir("/s", 0o2777).await.unwrap();
    root.chown("/s", None, Some(500)).await.unwrap();
    root.lstat("/s/none").await.unwrap_err();
    let n = elsewhere(&root, "/s", "n", &[]);
    let (coordinator, participant) = (root.home("/s"), root.home(&n));
    cluster.net().partition(&[participant], &[coordinator]);
    let u = user(&root, 7, 7, &[]);
    u.mkdir(&n, 0o755).await.expect("both sides execute; commitment waits for the link");
    cluster.net().heal();
    assert!(cluster.settle(Duration::from_secs(20)).await, "the operation ends");
    let a = root.stat(&n).await.unwrap();
    assert_eq!((a.uid, a.gid, a.mode & 0o7777), (7, 500, 0o2755), "setgid inheritance at commitment");
    u.create(&format!("{n}/f"), 0o644, true).await.unwrap();
    root.chmod("/s", 0o2770).await.unwrap();
    assert_eq!(errno(u.lstat(&format!("{n}/f")).await), Errno::EACCES, "the new object has /s in its ancestry");
}

/// Count of requests named `op` a server has served.
async fn served(c: &Client, server: u32, op: &str) -> u64 {
    let s = c.server_status(server).await.unwrap();
    s.ops.iter().find(|(name, _)| name == op).map_or(0, |(_, n)| *n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cx_coordinator_pushes_the_parents_permissions() {
    let cluster = start(TxnProtocol::Cx).await;
    let root = cluster.client();
    root.mkdir("/p", 0o2777).await.unwrap();
    root.chown("/p", None, Some(500)).await.unwrap();
    let u = user(&root, 7, 7, &[]);
    let coordinator = root.home("/p");
    let mut made = Vec::new();
    for i in 0.. {
        let n = format!("/p/d{i}");
        if root.home(&n) != coordinator {
            made.push(n);
        }
        if made.len() == 20 {
            break;
        }
    }
    let participants: std::collections::BTreeSet<u32> = made.iter().map(|n| root.home(n)).collect();
    let asked_before = served(&root, coordinator, "dir_perms").await;
    let pushed_before = sum_served(&root, &participants, "cx_perms").await;
    for n in &made {
        let a = u.mkdir(n, 0o755).await.unwrap();
        assert_eq!((a.gid, a.mode & 0o7777), (500, 0o2755), "{n}: setgid inheritance from the pushed answer");
    }
    assert!(cluster.settle(Duration::from_secs(20)).await, "the operations commit");
    let asked = served(&root, coordinator, "dir_perms").await - asked_before;
    let pushed = sum_served(&root, &participants, "cx_perms").await - pushed_before;
    assert_eq!(pushed, made.len() as u64, "one push per mkdir");
    assert_eq!(asked, 0, "no participant asked the parent's home");
    // The objects carry /p in their ancestry: closing /p closes them.
    u.create(&format!("{}/f", made[0]), 0o644, true).await.unwrap();
    root.chmod("/p", 0o2770).await.unwrap();
    assert_eq!(errno(u.lstat(&format!("{}/f", made[0])).await), Errno::EACCES);
}

/// Sum over `servers` of the requests named `op` each served.
async fn sum_served(c: &Client, servers: &std::collections::BTreeSet<u32>, op: &str) -> u64 {
    let mut sum = 0;
    for s in servers {
        sum += served(c, *s, op).await;
    }
    sum
}
