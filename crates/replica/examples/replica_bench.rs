//! What replication costs, measured at the store: batches of directory entries written
//! (a) straight to a store with `sync = os`, (b) with `sync = always`, (c) through a group
//! of one member, (d) through a group of three; all in this process on loopback, so the
//! members share the machine's cores. Then the time a new member takes to catch up from a
//! snapshot of a store of `--entries` entries.
//!
//! Last, the failover time: the leader of a three-member group stopped `--kills` times.
//!
//!     cargo run --release -p plusfs-replica --example replica_bench -- [--count 4000] [--entries 1000000] [--kills 20]

use plusfs_proto::Inode;
use plusfs_replica::Node;
use plusfs_replica::{Group, MemberId, Timing};
use plusfs_store::{Batch, DirStore, RocksStore, StoreRead};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;

/// CPU seconds this process has used.
fn cpu() -> f64 {
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the struct it is given.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 * 1e-6;
    t(u.ru_utime) + t(u.ru_stime)
}

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

struct Members {
    groups: Vec<Group>,
    stores: Vec<Arc<RocksStore>>,
}

async fn group(root: &Path, n: u64, timing: &Timing) -> Members {
    let mut ls = Vec::new();
    let mut addrs = BTreeMap::new();
    for id in 1..=n {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        addrs.insert(id, l.local_addr().unwrap().to_string());
        ls.push((id, l));
    }
    let (mut groups, mut stores) = (Vec::new(), Vec::new());
    for (id, l) in ls {
        let dir = root.join(format!("m{id}"));
        let store = Arc::new(RocksStore::open(&dir.join("store"), false).unwrap());
        groups.push(Group::start(id, &dir, store.db().clone(), None, l, timing).await.unwrap());
        stores.push(store);
    }
    groups[0].initialize(&plusfs_replica::raft_nodes(&addrs)).await.unwrap();
    while !groups[0].is_leader() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stores[0].replicate_through(Arc::new(groups[0].replicator()), None).unwrap();
    Members { groups, stores }
}

/// Writes `count` batches of `per` entries with up to `window` in flight: (batches/s, CPU µs per batch).
async fn run(store: &RocksStore, count: u64, per: u64, window: usize, base: u64) -> (f64, f64) {
    let (t0, c0) = (Instant::now(), cpu());
    let mut inflight = std::collections::VecDeque::new();
    for i in 0..count {
        let mut b = Batch::new();
        for j in 0..per {
            let ino = base + i * per + j;
            b.put_entry(1, &format!("f{ino}"), &Inode::subdir(ino));
        }
        inflight.push_back(store.submit(b));
        if inflight.len() >= window {
            inflight.pop_front().unwrap().await.unwrap().unwrap();
        }
    }
    for p in inflight {
        p.await.unwrap().unwrap();
    }
    let secs = t0.elapsed().as_secs_f64();
    (count as f64 / secs, (cpu() - c0) / count as f64 * 1e6)
}

async fn write_case(name: &str, count: u64, per: u64, window: usize) {
    let root = tempfile::tempdir().unwrap();
    let (rate, cpu_per) = match name {
        "store sync=os" | "store sync=always" => {
            let s = RocksStore::open(&root.path().join("s"), name.ends_with("always")).unwrap();
            run(&s, count, per, window, 1 << 20).await
        }
        _ => {
            let r = if name.contains("R=3") { 3 } else { 1 };
            let m = group(root.path(), r, &Timing::default()).await;
            let out = run(&m.stores[0], count, per, window, 1 << 20).await;
            for g in m.groups {
                g.stop().await;
            }
            out
        }
    };
    println!(
        "{{\"case\":\"{name}\",\"entries_per_batch\":{per},\"in_flight\":{window},\"batches\":{count},\"batches_per_s\":{rate:.0},\"entries_per_s\":{:.0},\"cpu_us_per_batch\":{cpu_per:.1}}}",
        rate * per as f64
    );
}

async fn catch_up(entries: u64) {
    let root = tempfile::tempdir().unwrap();
    let timing = Timing { snapshot_every: 1000, keep_behind_snapshot: 0, ..Timing::default() };
    let m = group(root.path(), 3, &timing).await;
    let per = 1000;
    run(&m.stores[0], entries / per, per, 8, 1 << 20).await;
    // Let the last snapshot be taken, so the new member needs it.
    m.groups[0].raft().trigger().snapshot().await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let dir = root.path().join("m4");
    let store = Arc::new(RocksStore::open(&dir.join("store"), false).unwrap());
    let new = Group::start(4 as MemberId, &dir, store.db().clone(), None, l, &timing).await.unwrap();
    let t0 = Instant::now();
    m.groups[0].raft().add_learner(4, Node::new(addr, ""), true).await.unwrap();
    let last = m.groups[0].status().last_log.unwrap();
    assert!(new.wait_applied(last, Duration::from_secs(600)).await);
    let secs = t0.elapsed().as_secs_f64();
    let probe = format!("f{}", (1u64 << 20) + entries - 1);
    assert!(store.get_entry(1, &probe).unwrap().is_some(), "the new member has the last entry");
    let snap = std::fs::metadata(dir.join("snapshot/current")).map(|m| m.len()).unwrap_or(0);
    println!(
        "{{\"case\":\"snapshot catch-up\",\"entries\":{entries},\"seconds\":{secs:.2},\"snapshot_bytes\":{snap}}}"
    );
    new.stop().await;
    for g in m.groups {
        g.stop().await;
    }
}

/// Stops the leader of a three-member group `kills` times; each time, the time until a
/// write succeeds through a new leader. The stopped member then restarts from its stores.
async fn failover(kills: usize) {
    let root = tempfile::tempdir().unwrap();
    let timing = Timing::default();
    let mut m = group(root.path(), 3, &timing).await;
    let addrs: BTreeMap<MemberId, String> = m
        .groups
        .iter()
        .map(|g| {
            (g.id, g.raft().metrics().borrow().membership_config.membership().get_node(&g.id).unwrap().raft.clone())
        })
        .collect();
    let mut times = Vec::new();
    for k in 0..kills {
        let at = m.groups.iter().position(|g| g.is_leader()).expect("a leader");
        let old = m.groups.remove(at);
        let old_store = m.stores.remove(at);
        let id = old.id;
        let t0 = Instant::now();
        // Like a crash: the member stops answering at once.
        old.stop().await;
        drop(old_store);
        let mut n = 0u64;
        loop {
            if let Some(g) = m.groups.iter().find(|g| g.is_leader()) {
                let mut b = rocksdb::WriteBatch::default();
                b.put(format!("failover{k}-{n}"), b"v");
                if let Ok(Ok(())) = tokio::time::timeout(Duration::from_millis(500), g.write(b.data().to_vec())).await {
                    break;
                }
            }
            n += 1;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        times.push(t0.elapsed().as_secs_f64());
        // The stopped member comes back and catches up before the next kill.
        let dir = root.path().join(format!("m{id}"));
        let store = loop {
            match RocksStore::open(&dir.join("store"), false) {
                Ok(s) => break Arc::new(s),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        };
        let l = TcpListener::bind(&addrs[&id]).await.unwrap();
        let g = Group::start(id, &dir, store.db().clone(), None, l, &timing).await.unwrap();
        let last = m.groups.iter().find(|g| g.is_leader()).map(|g| g.status().last_log.unwrap()).unwrap();
        assert!(g.wait_applied(last, Duration::from_secs(30)).await);
        m.groups.push(g);
        m.stores.push(store);
    }
    times.sort_by(f64::total_cmp);
    let pct = |p: f64| times[((times.len() as f64 * p).ceil() as usize).clamp(1, times.len()) - 1];
    println!(
        "{{\"case\":\"failover\",\"kills\":{kills},\"p50_s\":{:.3},\"p99_s\":{:.3},\"max_s\":{:.3}}}",
        pct(0.5),
        pct(0.99),
        times[times.len() - 1]
    );
    for g in m.groups {
        g.stop().await;
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let count = arg("--count", 4000);
    let entries = arg("--entries", 1_000_000);
    for (per, window, n) in [(1, 16, count), (1000, 4, count / 40)] {
        if n == 0 {
            continue;
        }
        for case in ["store sync=os", "store sync=always", "group R=1", "group R=3"] {
            write_case(case, n, per, window).await;
        }
    }
    if entries > 0 {
        catch_up(entries).await;
    }
    let kills = arg("--kills", 20) as usize;
    if kills > 0 {
        failover(kills).await;
    }
}
