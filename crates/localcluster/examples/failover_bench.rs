//! Failover through real servers: a local cluster with `--replicas 3`; the member serving
//! the home of `/` is killed with SIGKILL `--kills` times while a client makes
//! directories there; the time from the kill to the first operation that succeeds on the
//! group's objects is measured each time. The killed member is restarted and catches up
//! before the next kill. One JSON line: p50, p99 and max in seconds.
//!
//!     PLUSFS=target/release/plusfs cargo run --release -p plusfs-localcluster --example failover_bench -- [--kills 20] [--servers 2]

use plusfs_client::{Client, ClientOptions};
use plusfs_localcluster::{ClusterSettings, LocalCluster};
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Waits until some member of server `id` serves, and returns it.
fn serving(c: &LocalCluster, id: u32) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(Some(m)) = c.serving_member(id) {
            return m;
        }
        assert!(Instant::now() < deadline, "no member of server {id} serves");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until every member of server `id` has applied what its leader has.
fn caught_up(c: &LocalCluster, id: u32) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let views = c.group_views(id).expect("group views");
        let applied: Vec<Option<u64>> = views.iter().map(|(_, g)| g.as_ref().and_then(|g| g.applied)).collect();
        if applied.iter().all(|a| a.is_some() && *a == applied[0]) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("server {id}'s members did not catch up");
}

fn main() {
    let kills = arg("--kills", 20) as usize;
    let servers = arg("--servers", 2) as usize;
    let exe = PathBuf::from(std::env::var("PLUSFS").expect("set PLUSFS to the plusfs binary"));
    let dir = tempfile::tempdir().expect("a temporary directory");
    let settings = ClusterSettings { replicas: 3, ..Default::default() };
    let mut cluster = LocalCluster::up(&exe, dir.path(), Some(servers), &settings).expect("cluster up");
    let home = cluster.map().home_of_dir("/");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let client = {
        let _g = rt.enter();
        Client::new(cluster.map().clone(), ClientOptions { retries: 5, ..Default::default() })
    };
    let mut times = Vec::new();
    for k in 0..kills {
        caught_up(&cluster, home);
        let victim = serving(&cluster, home);
        rt.block_on(client.mkdir(&format!("/before{k}"), 0o755)).expect("mkdir before the kill");
        let t0 = Instant::now();
        cluster.kill_member(home, victim).expect("kill");
        let mut n = 0;
        loop {
            match rt.block_on(client.mkdir(&format!("/after{k}-{n}"), 0o755)) {
                Ok(_) => break,
                Err(e) => eprintln!("kill {k}: {e} after {:?}", t0.elapsed()),
            }
            n += 1;
        }
        let took = t0.elapsed().as_secs_f64();
        eprintln!("kill {k}: member {victim} of server {home}; first operation after {took:.3} s");
        times.push(took);
        cluster.start_member(home, victim).expect("restart");
    }
    times.sort_by(f64::total_cmp);
    let pct = |p: f64| times[((times.len() as f64 * p).ceil() as usize).clamp(1, times.len()) - 1];
    println!(
        "{{\"case\":\"server failover\",\"servers\":{servers},\"kills\":{kills},\"p50_s\":{:.3},\"p99_s\":{:.3},\"max_s\":{:.3}}}",
        pct(0.5),
        pct(0.99),
        times[times.len() - 1]
    );
    cluster.shutdown().expect("shutdown");
}
