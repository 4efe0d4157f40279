//! Replica groups of three members in one process, over real TCP on loopback, each member
//! with its own RocksDB log and store: replication, loss of the leader and its return,
//! no acknowledgement without a quorum, and a dead member replaced by a new one that
//! catches up from a snapshot.

use openraft::ChangeMembers;
use plusfs_replica::Node;
use plusfs_replica::{check, Group, GroupError, MemberId, Timing};
use rocksdb::{Options, WriteBatch, DB};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;

fn open_store(dir: &Path) -> Arc<DB> {
    let mut o = Options::default();
    o.create_if_missing(true);
    // A stopped member's tasks may still be letting go of the store: try for a while.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match DB::open(&o, dir) {
            Ok(db) => return Arc::new(db),
            Err(_) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("cannot open the store {}: {e}", dir.display()),
        }
    }
}

async fn start(id: MemberId, root: &Path, addr: &str, timing: &Timing) -> Group {
    let dir = root.join(format!("m{id}"));
    std::fs::create_dir_all(&dir).unwrap();
    let listener = TcpListener::bind(addr).await.expect("the member's address is free");
    Group::start(id, &dir, open_store(&dir.join("store")), None, listener, timing).await.expect("member starts")
}

/// Three free loopback addresses.
async fn addresses(n: usize) -> Vec<String> {
    let mut out = Vec::new();
    for _ in 0..n {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        out.push(l.local_addr().unwrap().to_string());
    }
    out
}

fn batch(key: &str) -> Vec<u8> {
    let mut b = WriteBatch::default();
    b.put(key.as_bytes(), b"v");
    b.data().to_vec()
}

/// The member that leads, once one does (waiting up to 15 s).
async fn leader(groups: &[Group]) -> &Group {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(g) = groups.iter().find(|g| g.is_leader()) {
            return g;
        }
        assert!(Instant::now() < deadline, "no leader elected");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Writes keys `names` through whichever member leads, following leader changes.
async fn write_all(groups: &[Group], names: impl Iterator<Item = String>) {
    for k in names {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let w = tokio::time::timeout(Duration::from_secs(15), leader(groups).await.write(batch(&k))).await;
            match w.unwrap_or_else(|_| panic!("write of {k} not acknowledged in 15 s")) {
                Ok(()) => break,
                Err(GroupError::NotLeader(_)) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("write of {k}: {e}"),
            }
        }
    }
}

/// Waits until every member of `groups` has applied what the leader has.
async fn caught_up(groups: &[Group]) {
    let target = leader(groups).await.status().last_log.expect("a log");
    for g in groups {
        assert!(g.wait_applied(target, Duration::from_secs(20)).await, "member {} caught up", g.id);
    }
}

fn has(g: &Group, key: &str) -> bool {
    g.store().get(key.as_bytes()).unwrap().is_some()
}

fn keys(prefix: &str, n: usize) -> impl Iterator<Item = String> + '_ {
    (0..n).map(move |i| format!("{prefix}{i:05}"))
}

async fn three(root: &Path, timing: &Timing) -> (Vec<Group>, BTreeMap<MemberId, String>) {
    let addrs = addresses(3).await;
    let members: BTreeMap<MemberId, String> = (1..=3).zip(addrs).collect();
    let mut groups = Vec::new();
    for (id, addr) in &members {
        groups.push(start(*id, root, addr, timing).await);
    }
    groups[0].initialize(&plusfs_replica::raft_nodes(&members)).await.unwrap();
    (groups, members)
}

fn root() -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let p = t.path().to_path_buf();
    (t, p)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_replicate_and_survive_the_loss_of_the_leader() {
    let (_t, root) = root();
    let timing = Timing::default();
    let (mut groups, members) = three(&root, &timing).await;
    write_all(&groups, keys("a", 100)).await;
    caught_up(&groups).await;
    for g in &groups {
        assert!(keys("a", 100).all(|k| has(g, &k)), "member {} has every write", g.id);
    }
    // The leader goes; the two others elect one and go on.
    let old = leader(&groups).await.id;
    let term = leader(&groups).await.status().term;
    let at = groups.iter().position(|g| g.id == old).unwrap();
    let gone = groups.remove(at);
    let killed = Instant::now();
    gone.stop().await;
    let next = leader(&groups).await;
    assert_ne!(next.id, old);
    assert!(next.status().term > term, "a new term");
    eprintln!("new leader after {:?}", killed.elapsed());
    write_all(&groups, keys("b", 100)).await;
    // The old leader comes back from its stores and catches up.
    groups.push(start(old, &root, &members[&old], &timing).await);
    caught_up(&groups).await;
    for g in &groups {
        assert!(keys("a", 100).chain(keys("b", 100)).all(|k| has(g, &k)), "member {} has every write", g.id);
    }
    for g in groups {
        g.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_quorum_nothing_is_acknowledged() {
    let (_t, root) = root();
    let timing = Timing::default();
    let (mut groups, members) = three(&root, &timing).await;
    write_all(&groups, keys("a", 10)).await;
    let lead = leader(&groups).await.id;
    // Both followers stop: the leader may not acknowledge a write any more.
    let followers: Vec<MemberId> = groups.iter().map(|g| g.id).filter(|id| *id != lead).collect();
    for id in &followers {
        let at = groups.iter().position(|g| g.id == *id).unwrap();
        groups.remove(at).stop().await;
    }
    let alone = &groups[0];
    let w = tokio::time::timeout(Duration::from_secs(3), alone.write(batch("lost"))).await;
    assert!(!matches!(w, Ok(Ok(()))), "a write without a quorum was acknowledged: {w:?}");
    assert!(tokio::time::timeout(Duration::from_secs(3), alone.read_barrier()).await.map_or(true, |r| r.is_err()));
    // One follower returns: the group has a quorum again.
    groups.push(start(followers[0], &root, &members[&followers[0]], &timing).await);
    write_all(&groups, keys("c", 10)).await;
    caught_up(&groups).await;
    assert!(groups.iter().all(|g| keys("c", 10).all(|k| has(g, &k))));
    for g in groups {
        g.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_member_is_replaced_by_one_that_catches_up_from_a_snapshot() {
    let (_t, root) = root();
    // Snapshots every 50 entries and no log kept behind them: a new member needs one.
    let timing = Timing { snapshot_every: 50, keep_behind_snapshot: 0, ..Timing::default() };
    let (mut groups, _) = three(&root, &timing).await;
    write_all(&groups, keys("a", 300)).await;
    let lead = leader(&groups).await.id;
    let dead = groups.iter().map(|g| g.id).find(|id| *id != lead).unwrap();
    let at = groups.iter().position(|g| g.id == dead).unwrap();
    groups.remove(at).stop().await;
    std::fs::remove_dir_all(root.join(format!("m{dead}"))).unwrap();
    // A new member on a new address joins as a learner, then replaces the dead one.
    let addr = addresses(1).await.remove(0);
    groups.push(start(4, &root, &addr, &timing).await);
    let l = leader(&groups).await;
    l.raft().add_learner(4, Node::new(addr, ""), true).await.expect("the learner catches up");
    let voters: BTreeSet<MemberId> = groups.iter().map(|g| g.id).collect();
    l.raft().change_membership(ChangeMembers::ReplaceAllVoters(voters.clone()), false).await.unwrap();
    write_all(&groups, keys("b", 20)).await;
    caught_up(&groups).await;
    let new = groups.iter().find(|g| g.id == 4).unwrap();
    assert!(keys("a", 300).chain(keys("b", 20)).all(|k| has(new, &k)), "the new member has every write");
    assert!(root.join("m4/snapshot/current.meta").exists(), "it caught up from a snapshot");
    let st = leader(&groups).await.status();
    assert_eq!(st.voters.iter().copied().collect::<BTreeSet<_>>(), voters);
    // The members compare equal; a change made behind the group's back shows as divergence.
    let digests = || groups.iter().map(|g| (g.id, check::digest(g.store()).unwrap())).collect::<BTreeMap<_, _>>();
    let same = match check::compare(&digests()) {
        check::Verdict::Same(d) => d,
        other => panic!("members differ after catching up: {other:?}"),
    };
    assert_eq!(same.keys, 320, "every write counted once");
    new.store().put(b"a00007", b"tampered").unwrap();
    assert!(matches!(check::compare(&digests()), check::Verdict::Diverged(_)), "the tampered member is found");
    for g in groups {
        g.stop().await;
    }
}
