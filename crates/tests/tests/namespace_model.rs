//! Model tests with shrinking against real server processes: generated sequences of
//! namespace operations (hard links, exchanges, huge directories, renames of whole
//! subtrees) run on 4-server clusters of `plusfs server` processes (and on 2 servers of
//! three replica-group members each), one cluster per commit protocol (cx, 2pc, serial), and are checked against the reference model of
//! `plusfs_testcluster::model` errno by errno, with the whole tree, every directory's
//! distribution and fsck compared after each case. Each case works below a directory of
//! its own, so the cases of one protocol share its cluster. A failure is shrunk and
//! reported with its setup and seed (`PLUSFS_MODEL_SEED`, `PLUSFS_MODEL_CASES` as in the
//! in-process model test).

mod common;

use common::ProcCluster;
use plusfs_client::Client;
use plusfs_localcluster::ClusterSettings;
use plusfs_placement::{TxnProtocol, TxnSettings};
use plusfs_proto::{Errno, Threshold};
use plusfs_testcluster::model::{explore, observe, run_exact, run_op, NoFault, Op, Setup, Step, Tally, World, NAMES};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::runtime::Runtime;

/// Process clusters by protocol, started when a case first needs one.
struct Clusters {
    servers: usize,
    /// Members of each server's replica group (1: unreplicated).
    replicas: usize,
    started: RefCell<HashMap<&'static str, ProcCluster>>,
}

impl Clusters {
    fn new(servers: usize, replicas: usize) -> Clusters {
        Clusters { servers, replicas, started: RefCell::default() }
    }

    /// A new client of the cluster running `protocol`.
    fn client(&self, protocol: TxnProtocol) -> Client {
        let mut started = self.started.borrow_mut();
        let cluster = started.entry(protocol.name()).or_insert_with(|| {
            let txn = TxnSettings { protocol, ..TxnSettings::default() };
            let settings = ClusterSettings { txn, replicas: self.replicas, ..ClusterSettings::default() };
            ProcCluster::start_settings(self.servers, &settings)
        });
        cluster.client()
    }

    /// Fails if any server of any cluster logged an error.
    fn assert_no_errors_logged(&self) {
        for cluster in self.started.borrow().values() {
            cluster.assert_no_errors_logged();
        }
    }
}

/// The test directory of a case, made with the setup's huge-directory threshold. Its name
/// comes from the setup, so every run of a case (while it is shrunk) places its paths on
/// the same servers; the tree of an earlier run is moved aside to `/old<n>` first.
async fn top_dir(c: &Client, setup: &Setup, n: usize) -> Result<String, String> {
    let top = format!("/case{}", setup.seed);
    match c.rename(&top, &format!("/old{n}")).await {
        Err(e) if e.errno != Errno::ENOENT => return Err(format!("move {top} aside: {e}")),
        _ => {}
    }
    let threshold = setup.top.map_or(Threshold::Cluster, Threshold::Entries);
    c.mkdir_with(&top, 0o755, threshold, 0).await.map_err(|e| format!("mkdir {top}: {e}"))?;
    Ok(top)
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

/// Runs `cases` generated cases of up to 40 steps on clusters of `servers` servers of
/// `replicas` member processes each.
fn model_test(name: &str, (servers, replicas): (usize, usize), cases: u32) {
    let rt = runtime();
    let clusters = Clusters::new(servers, replicas);
    let tally = Tally::default();
    let next = AtomicUsize::new(0);
    let started = Instant::now();
    explore::<NoFault>(name, cases, 40, |(world, steps, counter)| {
        let client = clusters.client(world.setup.protocol);
        let n = next.fetch_add(1, Ordering::Relaxed);
        run_case(&rt, &client, n, (&world, &steps, &counter), &tally)
    });
    eprintln!("{name}: {:.1} s", started.elapsed().as_secs_f64());
    totals_and_logs(name, &tally, &clusters);
}

/// Runs one generated case below its own directory and adds its counts to `tally`.
fn run_case(
    rt: &Runtime,
    client: &Client,
    n: usize,
    (world, steps, counter): (&World, &[Step<NoFault>], &Option<Arc<AtomicUsize>>),
    tally: &Tally,
) -> Result<(), String> {
    let t = rt.block_on(async {
        let top = top_dir(client, &world.setup, n).await?;
        run_exact(client, &top, world, steps, counter, 10).await
    })?;
    tally.lock().expect("tally").add(&t);
    Ok(())
}

#[test]
fn namespace_matches_model() {
    model_test("namespace_matches_model", (4, 1), 16);
}

/// The same on replicated servers: every server a group of three member processes.
#[test]
fn namespace_matches_model_on_replicated_servers() {
    model_test("namespace_matches_model_on_replicated_servers", (2, 3), 8);
}

/// Across an epoch change: halfway through the cases a server is added to every cluster
/// (`plusfs cluster add --wait`, in the background) while the next cases run, so their
/// operations meet directories moving to the new server; each must still match the model.
#[test]
fn namespace_matches_model_across_an_epoch_change() {
    let name = "namespace_matches_model_across_an_epoch_change";
    let cases = 12;
    let rt = runtime();
    let clusters = Clusters::new(3, 1);
    let tally = Tally::default();
    let next = AtomicUsize::new(0);
    let adds = std::sync::Mutex::new(Vec::new());
    explore::<NoFault>(name, cases, 40, |(world, steps, counter)| {
        let client = clusters.client(world.setup.protocol);
        let n = next.fetch_add(1, Ordering::Relaxed);
        if n == cases as usize / 2 {
            for cluster in clusters.started.borrow().values() {
                let (data, map) = (cluster.cluster.data().to_path_buf(), cluster.cluster.map_file());
                adds.lock().expect("adds").push(std::thread::spawn(move || {
                    let out = std::process::Command::new(common::exe())
                        .args(["cluster", "add", "--wait", "--data"])
                        .arg(&data)
                        .env("PLUSFS_CLUSTER", map)
                        .output()
                        .expect("run cluster add");
                    (data, out)
                }));
            }
        }
        run_case(&rt, &client, n, (&world, &steps, &counter), &tally)
    });
    let added = adds.into_inner().expect("adds");
    assert!(!added.is_empty(), "no server was added: too few cases ran");
    for h in added {
        let (data, out) = h.join().expect("cluster add thread");
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        // The added server is stopped with the cluster (whose test value knows only its own).
        let _ = plusfs_localcluster::down(&data, std::time::Duration::from_secs(5));
        assert!(out.status.success() && text.contains("balanced at epoch"), "cluster add failed: {text}");
    }
    totals_and_logs(name, &tally, &clusters);
}

fn totals_and_logs(name: &str, tally: &Tally, clusters: &Clusters) {
    let totals = tally.lock().expect("tally").clone();
    eprintln!("{name}: {totals:?}");
    totals.assert_exercised();
    clusters.assert_no_errors_logged();
}

#[test]
fn namespace_matches_model_on_one_server() {
    model_test("namespace_matches_model_on_one_server", (1, 1), 8);
}

/// A random operation of the model's kinds on the small shared tree.
fn random_op(rng: &mut StdRng) -> Op {
    let path = |rng: &mut StdRng| {
        let depth = rng.gen_range(1..=3);
        (0..depth).map(|_| format!("/{}", NAMES[rng.gen_range(0..NAMES.len())])).collect::<String>()
    };
    let (p, q) = (path(rng), path(rng));
    match rng.gen_range(0..10) {
        0 | 1 => Op::Mkdir(p),
        2 | 3 => Op::Create(p),
        4 => Op::Unlink(p),
        5 => Op::Rmdir(p),
        6 => Op::Rename(p, q),
        7 => Op::Link(p, q),
        8 => Op::Exchange(p, q),
        _ => Op::MkdirHuge(p, rng.gen_range(0..3), 0),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_keep_the_namespace_consistent() {
    let cluster = ProcCluster::start(4);
    cluster.client().mkdir("/shared", 0o755).await.unwrap();
    let mut tasks = Vec::new();
    for seed in 100..104 {
        let c = cluster.client();
        tasks.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed);
            for _ in 0..200 {
                // All clients share the same small tree: errors are expected, corruption not.
                let _ = run_op(&c, "/shared", &random_op(&mut rng)).await;
            }
        }));
    }
    // Bounded: a lock cycle between servers (seen in about 1 run in 10, before and after
    // issue 15: a directory left "distributing") fails the test instead of hanging CI.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(120);
    for t in tasks {
        let done = tokio::time::timeout_at(deadline, t).await;
        done.expect("the clients' operations did not finish within 120 s (servers stuck)").unwrap();
    }
    // Whatever the interleaving, the tree is walkable and consistent with itself.
    let tree = observe(&cluster.client(), "/shared").await.unwrap();
    tree.consistent().unwrap();
    cluster.assert_fsck_clean();
    cluster.assert_no_errors_logged();
}
