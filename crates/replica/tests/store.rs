//! A store that writes through its replica group: the leader's engine batches (directory
//! objects, entries) appear in every member's copy, also after the leader changes.

use plusfs_proto::{DirObject, FileKind, Inode};
use plusfs_replica::{Group, MemberId, Timing};
use plusfs_store::{commit, Batch, DirStore, RocksStore, StoreRead};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;

struct Member {
    group: Group,
    store: Arc<RocksStore>,
}

async fn leader(members: &[Member]) -> &Member {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(m) = members.iter().find(|m| m.group.is_leader()) {
            return m;
        }
        assert!(Instant::now() < deadline, "no leader elected");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn inode(ino: u64) -> Inode {
    Inode { ino, kind: FileKind::File, ..Inode::subdir(ino) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_batches_reach_every_member_and_only_the_leader_writes() {
    let root = tempfile::tempdir().unwrap();
    let mut listeners = Vec::new();
    let mut addrs: BTreeMap<MemberId, String> = BTreeMap::new();
    for id in 1..=3 {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        addrs.insert(id, l.local_addr().unwrap().to_string());
        listeners.push((id, l));
    }
    let mut members = Vec::new();
    for (id, l) in listeners {
        let dir = root.path().join(format!("m{id}"));
        let store = Arc::new(RocksStore::open(&dir.join("store"), false).unwrap());
        let group = Group::start(id, &dir, store.db().clone(), None, l, &Timing::default()).await.unwrap();
        members.push(Member { group, store });
    }
    members[0].group.initialize(&plusfs_replica::raft_nodes(&addrs)).await.unwrap();
    let lead = leader(&members).await;
    lead.store.replicate_through(Arc::new(lead.group.replicator()), None).unwrap();
    // Many batches in flight at once (pipelined), as a busy server commits them.
    let mut pending = Vec::new();
    for i in 0..200u64 {
        let mut b = Batch::new();
        b.put_dir(&format!("/d{i}"), &DirObject::new(100 + i, 0o755, 0, 0));
        b.put_entry(1, &format!("d{i}"), &Inode::subdir(100 + i));
        b.put_entry(100 + i, "f", &inode(1000 + i));
        pending.push(lead.store.submit(b));
    }
    for p in pending {
        p.await.expect("answered").expect("committed");
    }
    // Once acknowledged, the leader reads its own writes.
    assert_eq!(lead.store.get_dir("/d199").unwrap().unwrap().ino, 299);
    let last = lead.group.status().last_log.unwrap();
    for m in &members {
        assert!(m.group.wait_applied(last, Duration::from_secs(20)).await);
        for i in 0..200u64 {
            assert_eq!(
                m.store.get_dir(&format!("/d{i}")).unwrap().map(|d| d.ino),
                Some(100 + i),
                "member {}",
                m.group.id
            );
            assert_eq!(m.store.get_entry(100 + i, "f").unwrap().map(|e| e.ino), Some(1000 + i));
        }
    }
    // A follower's store that is made to write through the group is refused: it does not lead.
    let follower = members.iter().find(|m| !m.group.is_leader()).unwrap();
    follower.store.replicate_through(Arc::new(follower.group.replicator()), None).unwrap();
    let mut b = Batch::new();
    b.put_dir("/nope", &DirObject::new(7, 0o755, 0, 0));
    let e = commit(follower.store.as_ref(), b).await.expect_err("a follower does not write");
    assert!(e.to_string().contains("outcome unknown") && e.to_string().contains("leader"), "{e}");
    assert!(members.iter().all(|m| m.store.get_dir("/nope").unwrap().is_none()));
    for m in members {
        m.group.stop().await;
    }
}
