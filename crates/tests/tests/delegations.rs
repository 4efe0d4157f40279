//! Directory delegations on real multi-process clusters: a holder's batched work seen by
//! another client after recall, in both directions, step by step against a model; few
//! server requests per created file; a server killed while a delegation is out.

mod common;

use common::ProcCluster;
use plusfs_client::{Client, ClientOptions};
use std::collections::BTreeMap;

fn delegating(cluster: &ProcCluster) -> Client {
    let opts = ClientOptions { retries: 5, delegations: true, ..Default::default() };
    Client::new(cluster.cluster.map().clone(), opts)
}

/// The directory's names and contents as `c` sees them.
async fn listing(c: &Client, dir: &str) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    for e in c.readdir(dir).await.unwrap() {
        let p = format!("{dir}/{}", e.name);
        out.insert(e.name, c.read_all(&p).await.unwrap());
    }
    out
}

/// Waits (at most 5 s) until `holder` has no delegation left. The server answers the
/// other client once the holder's returning flush is applied; the holder takes in that
/// flush's own answer a moment later.
async fn returned(holder: &Client) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while holder.delegations_held() != 0 {
        assert!(std::time::Instant::now() < deadline, "the recall did not return the delegation");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_batches_its_work_and_others_see_it_after_recall() {
    let cluster = ProcCluster::start(3);
    let (a, b) = (delegating(&cluster), cluster.client());
    a.mkdir("/d", 0o755).await.unwrap();
    let mut model: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let before = a.counters().requests;
    for i in 0..200 {
        let p = format!("/d/f{i}");
        a.create(&p, 0o644, true).await.unwrap();
        let data = format!("contents of {i}").into_bytes();
        a.write(&p, 0, &data).await.unwrap();
        model.insert(format!("f{i}"), data);
    }
    a.rename("/d/f1", "/d/g1").await.unwrap();
    let moved = model.remove("f1").unwrap();
    model.insert("g1".into(), moved);
    a.unlink("/d/f2").await.unwrap();
    model.remove("f2");
    assert_eq!(a.lstat("/d/f2").await.unwrap_err().errno, plusfs_proto::Errno::ENOENT);
    let sent = a.counters().requests - before;
    assert!(a.delegations_held() == 1, "the holder has the delegation");
    assert!(sent <= 20, "200 creates and writes under a delegation sent {sent} requests");

    // Another client's look recalls the delegation: it sees exactly the holder's history.
    assert_eq!(listing(&b, "/d").await, model);
    returned(&a).await;

    // The other way round: b changes the directory, a (delegating again) sees it.
    b.create("/d/from-b", 0o644, true).await.unwrap();
    b.write("/d/from-b", 0, b"b was here").await.unwrap();
    model.insert("from-b".into(), b"b was here".to_vec());
    for i in 200..210 {
        let p = format!("/d/f{i}");
        a.create(&p, 0o600, true).await.unwrap();
        model.insert(format!("f{i}"), Vec::new());
    }
    assert_eq!(a.read_all("/d/from-b").await.unwrap(), b"b was here");
    assert_eq!(listing(&a, "/d").await, model);
    assert_eq!(listing(&b, "/d").await, model);
    let st = b.lstat("/d").await.unwrap();
    assert_eq!(st.size, model.len() as u64, "the directory's entry count agrees after recall");
    a.sync().await.unwrap();
    cluster.assert_fsck_clean();
    cluster.assert_no_errors_logged();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_resent_after_its_server_restarts_is_applied_once() {
    // Queued work waits for a sync (no timed write-back during the test).
    let settings = plusfs_placement::DelegSettings { writeback_ms: 600_000, ..Default::default() };
    let mut cluster = ProcCluster::start_delegations(3, settings);
    let a = delegating(&cluster);
    a.mkdir("/k", 0o755).await.unwrap();
    for i in 0..20 {
        a.create(&format!("/k/f{i}"), 0o644, true).await.unwrap();
    }
    assert_eq!(a.delegations_held(), 1);
    assert!(a.delegated_pending() >= 18, "creates queued at the kill: {}", a.delegated_pending());
    let home = a.home("/k");
    cluster.cluster.kill(home).expect("kill the directory's server");
    let restart = async {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        cluster.cluster.start(home).expect("restart");
    };
    // The flush waits for the server (resending the same numbered flush), then lands once.
    let (synced, ()) = tokio::join!(a.sync(), restart);
    synced.unwrap();
    for i in 20..30 {
        a.create(&format!("/k/f{i}"), 0o644, true).await.unwrap();
    }
    a.sync().await.unwrap();
    let b = cluster.client();
    let names: Vec<String> = b.readdir("/k").await.unwrap().into_iter().map(|e| e.name).collect();
    assert_eq!(names.len(), 30, "every create once: {names:?}");
    assert_eq!(b.lstat("/k").await.unwrap().size, 30);
    cluster.assert_fsck_clean();
}

/// A file that was hard-linked keeps its link form with one link left; the holder must not
/// take it for a plain entry (its unlink would be refused by the server after being
/// acknowledged).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_link_of_a_once_linked_file_is_unlinked_for_everyone() {
    let cluster = ProcCluster::start(3);
    let a = delegating(&cluster);
    a.mkdir("/h", 0o755).await.unwrap();
    for round in 0..3 {
        for i in 0..3 {
            a.create(&format!("/h/other{round}.{i}"), 0o644, true).await.unwrap();
        }
        a.create("/h/n0", 0o644, true).await.unwrap();
        a.link("/h/n0", "/h/n1").await.unwrap();
        a.link("/h/n1", "/h/n2").await.unwrap();
        a.unlink("/h/n0").await.unwrap();
        a.unlink("/h/n2").await.unwrap();
        assert_eq!(a.lstat("/h/n1").await.unwrap().nlink, 1);
        assert_eq!(a.delegations_held(), 1, "the directory is delegated");
        a.unlink("/h/n1").await.unwrap();
        assert_eq!(a.lstat("/h/n1").await.unwrap_err().errno, plusfs_proto::Errno::ENOENT);
    }
    a.sync().await.expect("nothing the holder acknowledged was refused");
    let b = cluster.client();
    let names: Vec<String> = b.readdir("/h").await.unwrap().into_iter().map(|e| e.name).collect();
    assert!(!names.iter().any(|n| n.starts_with('n')), "{names:?}");
    assert_eq!(names.len(), 9);
    cluster.assert_fsck_clean();
}

/// A holder cut off from the directory's server (here: the server stopped) for longer than
/// the recall timeout stops answering from its delegation, which the server may have
/// revoked meanwhile; it answers locally again once it hears from the server, and nothing
/// is lost (the call that timed out had its flush in flight to the stopped server).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_cut_off_from_its_server_stops_answering_locally() {
    let settings = plusfs_placement::DelegSettings { writeback_ms: 600_000, ..Default::default() };
    let cluster = ProcCluster::start_delegations(3, settings);
    let a = delegating(&cluster);
    a.mkdir("/c", 0o755).await.unwrap();
    for i in 0..5 {
        a.create(&format!("/c/f{i}"), 0o644, true).await.unwrap();
    }
    assert_eq!(a.delegations_held(), 1);
    let before = a.counters().requests;
    a.lstat("/c/f0").await.unwrap();
    assert_eq!(a.counters().requests, before, "answered locally while the lease holds");

    let server = cluster.cluster.pid(a.home("/c")).expect("the directory's server runs") as i32;
    // SAFETY: kill(2) on a server process this test started.
    unsafe { libc::kill(server, libc::SIGSTOP) };
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let cut_off = tokio::time::timeout(std::time::Duration::from_millis(700), a.lstat("/c/f1")).await;
    // SAFETY: as above.
    unsafe { libc::kill(server, libc::SIGCONT) };
    assert!(cut_off.is_err(), "without a lease the holder asks the (stopped) server: {cut_off:?}");

    assert_eq!(a.lstat("/c/f1").await.unwrap().kind, plusfs_proto::FileKind::File);
    tokio::time::sleep(std::time::Duration::from_millis(800)).await; // a recall poll answered
    let before = a.counters().requests;
    a.create("/c/f5", 0o644, true).await.unwrap();
    assert_eq!(a.counters().requests, before, "local again once the lease is renewed");
    a.sync().await.unwrap();
    let b = cluster.client();
    assert_eq!(b.readdir("/c").await.unwrap().len(), 6, "every create once");
    cluster.assert_fsck_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_lists_and_stats_its_directory_locally_as_the_servers_would() {
    use plusfs_proto::{Errno, FileKind, Semantics};
    let cluster = ProcCluster::start(3);
    let (a, b) = (delegating(&cluster), cluster.client());
    a.mkdir("/d", 0o755).await.unwrap();
    a.mkdir("/d/sub", 0o700).await.unwrap();
    for i in 0..20 {
        a.create(&format!("/d/f{i:02}"), 0o640, true).await.unwrap();
        a.write(&format!("/d/f{i:02}"), 0, &vec![b'x'; i]).await.unwrap();
    }
    a.unlink("/d/f03").await.unwrap();
    assert_eq!(a.delegations_held(), 1, "the creates were delegated");

    let before = a.counters().requests;
    let mine = a.readdir("/d").await.unwrap();
    let names: Vec<String> = mine.iter().map(|e| e.name.clone()).chain(["f03".to_string()]).collect();
    let stats = a.statv("/d", &names, Semantics::PerformAll).await.unwrap();
    let sent = a.counters().requests - before;
    // Only the subdirectory's own attributes come from a server (its object's home), and
    // the recall listener may renew its lease meanwhile; from the servers, the listing and
    // the stat would take five requests.
    assert!(sent <= 2, "a listing and a batch stat under a delegation sent {sent} requests");
    assert_eq!(mine.len(), 20, "19 files and the subdirectory: {mine:?}");
    assert!(mine.windows(2).all(|w| w[0].name < w[1].name), "listed in name order");
    assert_eq!(stats.last().unwrap().clone().unwrap_err(), Errno::ENOENT);
    let sub = stats[names.iter().position(|n| n == "sub").unwrap()].clone().unwrap();
    assert_eq!((sub.kind, sub.mode & 0o7777), (FileKind::Dir, 0o700), "the subdirectory's own attributes");

    // Invalid names are refused as the server refuses them.
    let odd = a.statv("/d", &["f00".into(), "a/b".into(), ".".into()], Semantics::PerformAll).await.unwrap();
    assert!(odd[0].is_ok(), "{odd:?}");
    assert_eq!((odd[1].clone().unwrap_err(), odd[2].clone().unwrap_err()), (Errno::EINVAL, Errno::EINVAL));
    assert_eq!(a.delegations_held(), 1, "still delegated");

    // Another client (which recalls the delegation) sees the same listing and attributes.
    let theirs = b.readdir("/d").await.unwrap();
    returned(&a).await;
    assert_eq!(theirs, mine);
    let their_stats = b.statv("/d", &names, Semantics::PerformAll).await.unwrap();
    assert_eq!(their_stats, stats);

    // An entry changed through the server is not known locally: the listing is the server's.
    for i in 20..23 {
        a.create(&format!("/d/f{i}"), 0o640, true).await.unwrap();
    }
    assert_eq!(a.delegations_held(), 1, "delegated again");
    a.link("/d/f00", "/d/hard").await.unwrap();
    let names: Vec<String> = a.readdir("/d").await.unwrap().into_iter().map(|e| e.name).collect();
    assert!(names.contains(&"hard".to_string()) && names.contains(&"f22".to_string()), "{names:?}");
    let theirs: Vec<String> = b.readdir("/d").await.unwrap().into_iter().map(|e| e.name).collect();
    assert_eq!(theirs, names);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_created_and_removed_between_flushes_is_not_written_back() {
    let cluster = ProcCluster::start(3);
    let (a, b) = (delegating(&cluster), cluster.client());
    a.mkdir("/d", 0o755).await.unwrap();
    a.create("/d/kept", 0o644, true).await.unwrap();
    a.write("/d/kept", 0, b"kept").await.unwrap();
    assert_eq!(a.delegations_held(), 1, "delegated");
    a.sync().await.unwrap();
    // Ten temporary files of 20 KiB each, written, changed and removed before any flush.
    let data = vec![7u8; 20 << 10];
    for i in 0..10 {
        let p = format!("/d/tmp{i}");
        a.create(&p, 0o600, true).await.unwrap();
        a.write(&p, 0, &data).await.unwrap();
        a.chmod(&p, 0o640).await.unwrap();
        a.unlink(&p).await.unwrap();
    }
    let shown = a.lstat_dir("/d").await.unwrap();
    let before = a.counters().bytes_out;
    a.sync().await.unwrap();
    let sent = a.counters().bytes_out - before;
    // The flush carries ten directory touches (~150 bytes); the creates, chmods and unlinks
    // of the temporary files would make it ~800 bytes.
    assert!(sent < 400, "the temporary files were written back: {sent} bytes sent");
    // Another client sees what the holder showed: only the kept file, the same directory times.
    let names: Vec<String> = b.readdir("/d").await.unwrap().into_iter().map(|e| e.name).collect();
    assert_eq!(names, vec!["kept".to_string()]);
    let seen = b.lstat_dir("/d").await.unwrap();
    assert_eq!((seen.mtime, seen.ctime, seen.size), (shown.mtime, shown.ctime, shown.size));
    assert_eq!(b.read_all("/d/kept").await.unwrap(), b"kept");
    cluster.assert_fsck_clean();
}

/// Waits up to 2 s for `cond`.
async fn eventually(cond: impl Fn() -> bool, what: &str) {
    let start = std::time::Instant::now();
    while !cond() {
        assert!(start.elapsed() < std::time::Duration::from_secs(2), "not within 2 s: {what}");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// The names, kinds, modes and sizes of `names` in `dir` as `c` sees them (`None`: missing).
async fn looks(c: &Client, dir: &str, names: &[String]) -> Vec<Option<(plusfs_proto::FileKind, u32, u64)>> {
    let mut out = Vec::new();
    for n in names {
        out.push(c.lstat(&format!("{dir}/{n}")).await.ok().map(|a| (a.kind, a.mode, a.size)));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_a_read_delegation_and_a_change_recalls_it() {
    let cluster = ProcCluster::start(3);
    let (w, r1, r2) = (cluster.client(), delegating(&cluster), delegating(&cluster));
    w.mkdir("/r", 0o755).await.unwrap();
    for i in 0..30 {
        let p = format!("/r/f{i:02}");
        w.create(&p, 0o644, true).await.unwrap();
        w.write(&p, 0, &vec![b'r'; i]).await.unwrap();
    }
    // Present and missing names (as a compiler's include search or Python's imports probe).
    let names: Vec<String> = (0..40).map(|i| format!("f{i:02}")).collect();
    let truth = looks(&w, "/r", &names).await;

    // Both readers read often enough to be granted a read delegation each; from then on
    // their lookups, stats and listings are answered without a request.
    for r in [&r1, &r2] {
        assert_eq!(looks(r, "/r", &names[..6]).await, truth[..6]);
        assert_eq!(r.delegations_held(), 1, "a read delegation after a few reads");
        let before = r.counters().requests;
        assert_eq!(looks(r, "/r", &names).await, truth);
        let listed: Vec<String> = r.readdir("/r").await.unwrap().into_iter().map(|e| e.name).collect();
        assert_eq!(listed, names[..30]);
        let sent = r.counters().requests - before;
        assert!(sent <= 1, "40 lookups and a listing under a read delegation sent {sent} requests");
    }
    assert_eq!((r1.delegations_held(), r2.delegations_held()), (1, 1), "readers share the directory");

    // A change by a third client recalls both; each reader then sees it.
    w.create("/r/new", 0o600, true).await.unwrap();
    w.unlink("/r/f00").await.unwrap();
    w.chmod("/r/f01", 0o600).await.unwrap();
    // (Each reader forgets its delegation when the answer to its return arrives, which may
    // come a moment after the server went on with the change.)
    eventually(|| (r1.delegations_held(), r2.delegations_held()) == (0, 0), "the change recalled both").await;
    let names: Vec<String> = names.into_iter().chain(["new".to_string()]).collect();
    let truth = looks(&w, "/r", &names).await;
    for r in [&r1, &r2] {
        assert_eq!(looks(r, "/r", &names).await, truth);
        assert_eq!(r.delegations_held(), 1, "delegated again");
    }

    // A reader's own change goes to the server without recalling its own read delegation
    // (the other reader's is recalled) and is seen by the reader at once.
    r1.create("/r/by-r1", 0o644, true).await.unwrap();
    eventually(|| (r1.delegations_held(), r2.delegations_held()) == (1, 0), "r2's recalled, r1's kept").await;
    assert_eq!(r1.lstat("/r/by-r1").await.unwrap().mode & 0o777, 0o644);
    let listed: Vec<String> = r1.readdir("/r").await.unwrap().into_iter().map(|e| e.name).collect();
    assert!(listed.contains(&"by-r1".to_string()) && !listed.contains(&"f00".to_string()), "{listed:?}");

    // Changing it again turns the read delegation into a write delegation: the next
    // creates are batched, and the other reader sees them after its recall.
    for i in 0..20 {
        r1.create(&format!("/r/w{i}"), 0o644, true).await.unwrap();
    }
    assert_eq!(r1.delegations_held(), 1);
    assert!(r1.delegated_pending() >= 15, "creates queued under the write delegation");
    let theirs: Vec<String> = r2.readdir("/r").await.unwrap().into_iter().map(|e| e.name).collect();
    assert_eq!(theirs.iter().filter(|n| n.starts_with('w')).count(), 20, "{theirs:?}");
    assert_eq!(r1.delegated_pending(), 0, "written back on recall");
    r1.sync().await.expect("no read delegation ended is reported as lost work");
    r2.sync().await.unwrap();
    cluster.assert_fsck_clean();
    cluster.assert_no_errors_logged();
}

/// A distributed (huge) directory is delegated per storing server: each storing server
/// grants the shard of the names Eq. 2 places on it, and the holder batches its work per
/// shard; another client's look at the directory recalls the shards it reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_directory_is_delegated_per_storing_server() {
    use plusfs_proto::{DistState, Threshold};
    let cluster = ProcCluster::start_hugedirs(4, Some(8000));
    let (a, b) = (delegating(&cluster), cluster.client());
    a.mkdir_with("/h", 0o755, Threshold::Entries(0), 0).await.unwrap();
    a.create("/h/first", 0o644, true).await.unwrap(); // learns the distribution
    let info = a.cached_distribution("/h").expect("the client knows /h is distributed");
    assert_eq!((info.state, info.set.len()), (DistState::Distributed, 4));
    let mut model: BTreeMap<String, Vec<u8>> = BTreeMap::from([("first".to_string(), Vec::new())]);

    let before = a.counters().requests;
    for i in 0..400 {
        let p = format!("/h/f{i}");
        a.create(&p, 0o644, true).await.unwrap();
        let data = format!("huge {i}").into_bytes();
        a.write(&p, 0, &data).await.unwrap();
        model.insert(format!("f{i}"), data);
    }
    for i in (0..400).step_by(4) {
        a.unlink(&format!("/h/f{i}")).await.unwrap();
        model.remove(&format!("f{i}"));
    }
    assert_eq!(a.lstat("/h/f0").await.unwrap_err().errno, plusfs_proto::Errno::ENOENT);
    let sent = a.counters().requests - before;
    assert_eq!(a.delegations_held(), 4, "one delegation per storing server");
    // Without delegations: 400 creates, 400 writes and 100 unlinks, one request each.
    assert!(sent <= 60, "900 operations in a huge directory under delegations sent {sent} requests");

    // Another client's listing recalls every shard and sees exactly the holder's history.
    assert_eq!(listing(&b, "/h").await, model);
    assert_eq!(b.lstat("/h").await.unwrap().size, model.len() as u64, "the shards' counts agree");
    // A change through one storing server recalls only that shard.
    a.create("/h/again0", 0o644, true).await.unwrap();
    a.create("/h/again1", 0o644, true).await.unwrap();
    b.create("/h/from-b", 0o600, true).await.unwrap();
    assert_eq!(a.lstat("/h/from-b").await.unwrap().mode & 0o777, 0o600);
    a.sync().await.unwrap();
    model.extend(["again0", "again1", "from-b"].map(|n| (n.to_string(), Vec::new())));
    assert_eq!(listing(&b, "/h").await, model);
    cluster.assert_fsck_clean();
    cluster.assert_no_errors_logged();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_changes_its_directory_attributes_locally_and_others_see_them() {
    use plusfs_proto::{TimeSet, Timespec};
    let cluster = ProcCluster::start(3);
    let (a, b) = (delegating(&cluster), cluster.client());
    a.mkdir("/d", 0o755).await.unwrap();
    a.create("/d/f", 0o644, true).await.unwrap();
    a.write("/d/f", 0, b"f").await.unwrap();
    assert_eq!(a.delegations_held(), 1, "delegated");

    // What tar does to a directory it extracted: owner, mode, times. The group and the
    // search bits may change here: /d has no subdirectory.
    let (at, mt) = (Timespec { sec: 1_000_000, nsec: 5 }, Timespec { sec: 2_000_000, nsec: 7 });
    let (shown, sent) = plusfs_client::counting(async {
        a.chown("/d", Some(0), Some(100)).await.unwrap();
        a.chmod("/d", 0o750).await.unwrap();
        a.create("/d/g", 0o644, true).await.unwrap();
        a.utimens("/d", Some(TimeSet::At(at)), Some(TimeSet::At(mt))).await.unwrap();
        a.lstat_dir("/d").await.unwrap()
    })
    .await;
    assert_eq!(sent, 0, "the directory's own attributes changed through a server");
    assert_eq!((shown.mode & 0o7777, shown.gid, shown.atime, shown.mtime), (0o750, 100, at, mt));
    assert_eq!(a.delegations_held(), 1, "the holder kept its delegation");

    // Another client sees exactly what the holder showed, after the recall.
    let seen = b.lstat_dir("/d").await.unwrap();
    assert_eq!(
        (seen.mode, seen.uid, seen.gid, seen.atime, seen.mtime, seen.ctime, seen.size),
        (shown.mode, shown.uid, shown.gid, shown.atime, shown.mtime, shown.ctime, shown.size)
    );

    // With a subdirectory, a change of search bits must reach every server: it is sent.
    a.mkdir("/d/sub", 0o755).await.unwrap();
    a.create("/d/h", 0o644, true).await.unwrap();
    a.chmod("/d", 0o700).await.unwrap();
    assert_eq!(b.lstat_dir("/d").await.unwrap().mode & 0o7777, 0o700);
    let names: Vec<String> = b.readdir("/d").await.unwrap().into_iter().map(|e| e.name).collect();
    assert_eq!(names, ["f", "g", "h", "sub"]);

    // A caller who may write but does not own: `touch` (times set to now) of another
    // user's file and of the directory, answered locally and accepted by the server.
    b.mkdir("/w", 0o777).await.unwrap();
    let old = b.create("/w/roots", 0o666, true).await.unwrap().attr.mtime;
    let opts = ClientOptions { retries: 5, delegations: true, uid: 1000, gid: 1000, ..Default::default() };
    let u = Client::new(cluster.cluster.map().clone(), opts);
    u.create("/w/mine", 0o644, true).await.unwrap();
    u.create("/w/mine2", 0o644, true).await.unwrap();
    assert_eq!(u.delegations_held(), 1, "the user holds /w");
    let ((file, dir), sent) = plusfs_client::counting(async {
        u.utimens("/w/roots", Some(TimeSet::Now), Some(TimeSet::Now)).await.unwrap();
        u.utimens("/w", Some(TimeSet::Now), Some(TimeSet::Now)).await.unwrap();
        let explicit = u.utimens("/w", None, Some(TimeSet::At(mt))).await.unwrap_err();
        assert_eq!(explicit.errno, plusfs_proto::Errno::EPERM, "explicit times need the owner");
        (u.lstat("/w/roots").await.unwrap(), u.lstat_dir("/w").await.unwrap())
    })
    .await;
    assert_eq!(sent, 0, "answered under the delegation");
    u.sync().await.expect("the server accepted the holder's work");
    assert!(file.mtime > old);
    assert_eq!(b.lstat("/w/roots").await.unwrap().mtime, file.mtime);
    assert_eq!(b.lstat_dir("/w").await.unwrap().mtime, dir.mtime);
    a.sync().await.unwrap();
    cluster.assert_fsck_clean();
    cluster.assert_no_errors_logged();
}
