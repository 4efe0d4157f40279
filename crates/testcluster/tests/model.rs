//! Model tests with shrinking on the in-process cluster: generated sequences of namespace
//! operations (hard links, exchanges, huge directories, renames of whole subtrees) checked
//! against the reference model of `plusfs_testcluster::model`, under each commit protocol
//! (cx, 2pc, serial; the protocol is part of each case's setup).
//!
//! - `model_without_faults`: every answer must be the model's, errno by errno, and the
//!   whole tree, every directory's distribution and fsck must match at the end.
//! - `model_under_faults`: the same sequences with a seeded fault layer (lost requests and
//!   replies, duplicates, delays) and fault steps (a server crashed, cut off, or crashed at
//!   a failpoint). A definite answer must still be the model's; an uncertain one (EIO and
//!   the like: the request may or may not have been applied) is resolved after healing
//!   the cluster: the tree must then be the model's with the operation applied, or without
//!   it. Serial execution keeps no log, so its cases only delay and duplicate.
//!
//! A failure is shrunk to a short sequence and reported with its setup (fault seed,
//! protocol) and the generator seed. `PLUSFS_MODEL_CASES`, `PLUSFS_MODEL_SEED` and
//! `PLUSFS_MODEL_SHRINK` change the number of cases, the generator seed and the shrinking
//! budget.

use plusfs_client::{Client, ClientOptions};
use plusfs_placement::TxnProtocol;
use plusfs_proto::{Errno, Threshold};
use plusfs_testcluster::model::{
    check_answer, check_distribution, compare, explore, fsck_clean, run_exact, run_op, seen, Answer, Case, Entry,
    Expect, FaultSource, Model, NoFault, Op, Setup, Step, Tally, Totals,
};
use plusfs_testcluster::{FailAction, FailStep, Failpoint, Faults, Options, TestCluster};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;
use tokio::task::JoinSet;

/// Servers of every in-process cluster.
const SERVERS: u32 = 4;
/// The test directory of every case.
const TOP: &str = "/t";
/// How long a crashed server stays down and a cut lasts (unless healed earlier).
const OUTAGE: Duration = Duration::from_millis(30);
/// Longest wait for one answer before the case fails as hung.
const OP_LIMIT: Duration = Duration::from_secs(20);

/// A fault step of `model_under_faults`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Fault {
    /// kill -9 of a server, restarted after [`OUTAGE`].
    Crash(u32),
    /// A server cut off from everyone for [`OUTAGE`].
    Cut(u32),
    /// A server crashes when it next reaches this failpoint.
    Arm(u32, FailStep),
}

/// Failpoints a case may crash a server at: Cx, two-phase commit (renames, links and
/// exchanges use it under every protocol), redistribution, file data.
const FAILPOINTS: [FailStep; 12] = [
    FailStep::CxAfterResult,
    FailStep::CxBeforeVote,
    FailStep::CxAfterVote,
    FailStep::CxAfterCommitRecord,
    FailStep::CoordinatorAfterVotes,
    FailStep::CoordinatorAfterCommitRecord,
    FailStep::ParticipantAfterPrepareRecord,
    FailStep::DistributeAfterIntent,
    FailStep::DistributeAfterEntries,
    FailStep::DistributeAfterShards,
    FailStep::StoringBeforeShardObject,
    FailStep::DataAfterAppend,
];

/// Faults for the lossy protocols; none as steps for serial (it is not crash-safe).
struct Random;

impl FaultSource for Random {
    type Fault = Fault;
    fn faults(setup: &Setup) -> Option<BoxedStrategy<Fault>> {
        if !lossy(setup.protocol) {
            return None;
        }
        let server = 0..SERVERS;
        Some(
            prop_oneof![
                server.clone().prop_map(Fault::Crash),
                server.clone().prop_map(Fault::Cut),
                (server, proptest::sample::select(FAILPOINTS.to_vec())).prop_map(|(s, f)| Fault::Arm(s, f)),
            ]
            .boxed(),
        )
    }
}

/// True for the protocols that keep a log and so survive lost messages and crashes.
fn lossy(protocol: TxnProtocol) -> bool {
    protocol != TxnProtocol::Serial
}

/// The fault probabilities of a case, drawn from its seed.
fn link_faults(setup: &Setup) -> Faults {
    let mut rng = StdRng::seed_from_u64(setup.seed);
    let lossy = lossy(setup.protocol);
    let mut p = |max: f64| if rng.gen_bool(0.6) { rng.gen_range(0.0..max) } else { 0.0 };
    Faults {
        drop_request: if lossy { p(0.05) } else { 0.0 },
        drop_reply: if lossy { p(0.05) } else { 0.0 },
        duplicate: p(0.2),
        delay: p(0.5),
        max_delay: Duration::from_micros(StdRng::seed_from_u64(!setup.seed).gen_range(50..1000)),
    }
}

/// Starts the case's cluster and makes the test directory with the setup's threshold.
async fn start(setup: &Setup) -> Result<(TestCluster, Client), String> {
    let opts = Options { servers: SERVERS as usize, seed: setup.seed, protocol: setup.protocol, ..Options::default() };
    let cluster = TestCluster::start(opts).await.map_err(|e| format!("start: {e}"))?;
    let client = cluster.client_with(ClientOptions { retries: 3, ..ClientOptions::default() });
    let threshold = setup.top.map_or(Threshold::Cluster, Threshold::Entries);
    client.mkdir_with(TOP, 0o755, threshold, 0).await.map_err(|e| format!("mkdir {TOP}: {e}"))?;
    Ok((cluster, client))
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

#[test]
fn model_without_faults() {
    let rt = runtime();
    let tally = Tally::default();
    let started = Instant::now();
    explore::<NoFault>("model_without_faults", 128, 40, |(world, steps, counter)| {
        rt.block_on(async {
            let (_cluster, client) = start(&world.setup).await?;
            let t = run_exact(&client, TOP, &world, &steps, &counter, 10).await?;
            tally.lock().expect("tally").add(&t);
            Ok(())
        })
    });
    let totals = tally.lock().expect("tally").clone();
    eprintln!("model_without_faults: {:.1} s, {totals:?}", started.elapsed().as_secs_f64());
    totals.assert_exercised();
    assert_eq!(totals.protocols.len(), 3, "every protocol ran: {totals:?}");
}

#[test]
fn model_under_faults() {
    let rt = runtime();
    let tally = Tally::default();
    let started = Instant::now();
    explore::<Random>("model_under_faults", 96, 40, |case| {
        let t = rt.block_on(run_faulty(case))?;
        tally.lock().expect("tally").add(&t);
        Ok(())
    });
    let totals = tally.lock().expect("tally").clone();
    eprintln!("model_under_faults: {:.1} s, {totals:?}", started.elapsed().as_secs_f64());
    totals.assert_exercised();
    assert!(totals.faults > 0 && totals.uncertain > 0, "no fault landed: {totals:?}");
}

/// One case of `model_under_faults`.
struct Faulty {
    cluster: Arc<TestCluster>,
    client: Client,
    faults: Faults,
    model: Model,
    /// Armed failpoints and the tasks that restart their servers once they crash.
    armed: Vec<(u32, Arc<Failpoint>, tokio::task::JoinHandle<()>)>,
    /// Restarts after crashes and heals after cuts.
    background: JoinSet<()>,
    totals: Totals,
}

async fn run_faulty((world, steps, counter): Case<Fault>) -> Result<Totals, String> {
    let (cluster, client) = start(&world.setup).await?;
    let faults = link_faults(&world.setup);
    cluster.net().set_faults(faults.clone());
    let mut totals = Totals { cases: 1, ..Totals::default() };
    *totals.protocols.entry(world.setup.protocol.name()).or_default() += 1;
    let mut case = Faulty {
        cluster: Arc::new(cluster),
        client,
        faults,
        model: world.model.clone(),
        armed: Vec::new(),
        background: JoinSet::new(),
        totals,
    };
    for (i, step) in steps.iter().enumerate() {
        seen(&counter);
        let r = match step {
            Step::Op(op) => case.op(op).await,
            Step::Fault(f) => {
                case.fault(f).await;
                Ok(())
            }
        };
        r.map_err(|e| format!("step {} {step:?}: {e}", i + 1))?;
    }
    case.finish().await
}

/// Answers that prove the request was refused and nothing happened.
fn definite(e: Errno) -> bool {
    matches!(
        e,
        Errno::ENOENT
            | Errno::ENOTDIR
            | Errno::EEXIST
            | Errno::EISDIR
            | Errno::ENOTEMPTY
            | Errno::EINVAL
            | Errno::EPERM
    )
}

impl Faulty {
    /// Runs `op`: a definite answer must be the model's; an uncertain one is resolved.
    async fn op(&mut self, op: &Op) -> Result<(), String> {
        let before = self.model.clone();
        let expected = self.model.apply(op);
        let got = match tokio::time::timeout(OP_LIMIT, run_op(&self.client, TOP, op)).await {
            Ok(r) => r,
            Err(_) => return Err(format!("no answer in {OP_LIMIT:?}")),
        };
        self.totals.steps += 1;
        match &got {
            Err(e) if !definite(*e) => self.resolve(before, &got).await,
            _ => {
                if got.is_ok() {
                    *self.totals.done.entry(op.name()).or_default() += 1;
                }
                check_answer(&self.model, op, &expected, &got)
            }
        }
    }

    /// After an uncertain answer: heals everything, then the cluster must hold the model
    /// with the operation applied or without it, which becomes the model.
    async fn resolve(&mut self, before: Model, got: &Result<Answer, Errno>) -> Result<(), String> {
        self.totals.uncertain += 1;
        self.heal().await?;
        if let Err(applied) = compare(&self.client, TOP, &self.model).await {
            if let Err(not_applied) = compare(&self.client, TOP, &before).await {
                return Err(format!(
                    "answered {got:?}; neither applied nor not:\napplied: {applied}\nnot applied: {not_applied}"
                ));
            }
            self.model = before;
        }
        self.cluster.net().set_faults(self.faults.clone());
        Ok(())
    }

    /// Injects a fault step.
    async fn fault(&mut self, f: &Fault) {
        self.totals.faults += 1;
        let cluster = self.cluster.clone();
        match *f {
            Fault::Crash(id) => {
                cluster.crash(id).await;
                self.background.spawn(async move {
                    tokio::time::sleep(OUTAGE).await;
                    cluster.restart(id).await.expect("restart after a crash");
                });
            }
            Fault::Cut(id) => {
                let mut others: Vec<u32> = (0..SERVERS).filter(|&s| s != id).collect();
                others.push(plusfs_testcluster::client_node(0));
                cluster.net().partition(&[id], &others);
                self.background.spawn(async move {
                    tokio::time::sleep(OUTAGE).await;
                    cluster.net().heal();
                });
            }
            Fault::Arm(id, name) => {
                let fp = cluster.failpoint(id, name, FailAction::Crash);
                let reached = fp.clone();
                let watcher = tokio::spawn(async move {
                    reached.reached().await;
                    cluster.disarm(id, reached.step());
                    tokio::time::sleep(OUTAGE).await;
                    cluster.restart(id).await.expect("restart after a failpoint");
                });
                self.armed.push((id, fp, watcher));
            }
        }
    }

    /// Ends every fault: no more link faults, partitions healed, failpoints disarmed, every
    /// server up, no cross-server operation pending.
    async fn heal(&mut self) -> Result<(), String> {
        let net = self.cluster.net();
        net.set_faults(Faults::none());
        for (id, fp, watcher) in self.armed.drain(..) {
            self.cluster.disarm(id, fp.step());
            if fp.hits() == 0 {
                watcher.abort();
            } else {
                watcher.await.map_err(|e| format!("restart task: {e}"))?;
            }
        }
        while let Some(r) = self.background.join_next().await {
            r.map_err(|e| format!("background task: {e}"))?;
        }
        net.heal();
        self.cluster.restart_all().await.map_err(|e| format!("restart: {e}"))?;
        if !self.cluster.settle(Duration::from_secs(20)).await {
            return Err("cross-server operations still pending 20 s after the faults ended".into());
        }
        Ok(())
    }

    /// Heals, then the cluster must be the model, distributed as it proves, fsck clean.
    async fn finish(mut self) -> Result<Totals, String> {
        self.heal().await?;
        compare(&self.client, TOP, &self.model).await.map_err(|e| format!("at the end: {e}"))?;
        let wait = Duration::from_secs(10);
        self.totals.distributed = check_distribution(&self.client, TOP, &self.model, wait, false).await?;
        fsck_clean(&self.client).await?;
        Ok(self.totals)
    }
}

/// The model's own answers on a few hand-written cases, so a wrong model cannot hide
/// behind a cluster that is wrong the same way.
#[test]
fn the_model_follows_posix() {
    let mut m = Model::new(None);
    let done = Expect::Done;
    let fail = |e: Errno| Expect::Fail(vec![e]);
    let p = |s: &str| s.to_string();
    assert_eq!(m.apply(&Op::Mkdir(p("/a"))), done);
    assert_eq!(m.apply(&Op::Create(p("/a/f"))), done);
    assert_eq!(m.apply(&Op::Link(p("/a/f"), p("/g"))), done);
    assert_eq!(m.apply(&Op::Link(p("/a"), p("/h"))), fail(Errno::EPERM));
    assert_eq!(m.apply(&Op::Link(p("/a/f"), p("/g"))), fail(Errno::EEXIST));
    assert_eq!(m.apply(&Op::Rename(p("/a/f"), p("/g"))), done, "two names of one file");
    assert_eq!(m.tree().links.iter().next().map(Vec::len), Some(2));
    assert_eq!(m.apply(&Op::Rename(p("/a"), p("/a/x"))), fail(Errno::EINVAL));
    assert_eq!(m.apply(&Op::Rmdir(p("/a"))), fail(Errno::ENOTEMPTY));
    assert_eq!(m.apply(&Op::Create(p("/g/x"))), fail(Errno::ENOTDIR));
    assert_eq!(m.apply(&Op::Exchange(p("/a"), p("/g"))), fail(Errno::EINVAL));
    assert_eq!(m.apply(&Op::Symlink(p("/s"))), done);
    assert_eq!(m.apply(&Op::Exchange(p("/s"), p("/g"))), done);
    assert_eq!(m.get("/g").map(|e| matches!(e, Entry::Symlink(_))), Some(true));
    assert_eq!(m.apply(&Op::Unlink(p("/a/f"))), done);
    assert_eq!(m.tree().nodes["/s"].nlink, 1, "one name left");
    assert_eq!(m.apply(&Op::MkdirHuge(p("/h"), 1, 2)), done);
    m.apply(&Op::Create(p("/h/1")));
    assert!(!m.dirs().iter().any(|(d, pol)| d == "/h" && pol.crossed));
    m.apply(&Op::Create(p("/h/2")));
    assert!(m.dirs().iter().any(|(d, pol)| d == "/h" && pol.crossed), "crossed its threshold");
}

// Bugs the model tests found, each reduced to a minimal deterministic case (all fixed;
// these keep them fixed).

/// A cluster with the given protocol and test-directory threshold, and a client.
async fn small(protocol: TxnProtocol, top: Option<u64>) -> (TestCluster, Client) {
    start(&Setup { seed: 1, protocol, top }).await.expect("start")
}

/// Shrunk from `model_without_faults`: `link` between two names of one distributed
/// directory answers EBUSY when the client has not cached the distribution (the server's
/// redirect loop takes the redirect of the source lookup for the destination's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn link_within_a_distributed_directory() {
    let (cluster, c) = small(TxnProtocol::Cx, None).await;
    c.mkdir_with("/t/c", 0o755, Threshold::Entries(0), 0).await.unwrap();
    c.create("/t/c/x", 0o644, true).await.unwrap();
    let fresh = cluster.client();
    assert_eq!(fresh.link("/t/c/missing", "/t/c/y").await.unwrap_err().errno, Errno::ENOENT);
    assert_eq!(fresh.link("/t/c/x", "/t/c/y").await.map(|a| a.nlink), Ok(2));
}

/// Shrunk from `model_without_faults`: under the serial protocol, rmdir of a file, a
/// symbolic link or a path through a file answers ENOENT instead of ENOTDIR (the
/// participant's "no directory object" comes first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serial_rmdir_of_a_non_directory() {
    let (_cluster, c) = small(TxnProtocol::Serial, None).await;
    c.create("/t/f", 0o644, true).await.unwrap();
    c.symlink("/x", "/t/s").await.unwrap();
    for p in ["/t/f", "/t/s", "/t/f/x"] {
        assert_eq!(c.rmdir(p).await.unwrap_err().errno, Errno::ENOTDIR, "rmdir {p}");
    }
}

/// Shrunk from `model_under_faults`: with the server holding an ancestor's entry down, a
/// path through a file answers ENOENT (the client's ENOTDIR-or-ENOENT lookup takes any
/// failure for "absent") where only ENOTDIR or an uncertain EIO is true.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_through_a_file_while_a_server_is_down() {
    let (cluster, c) = small(TxnProtocol::Cx, None).await;
    let name = ["b", "c", "d", "e", "f", "g"].into_iter().find(|n| c.home(&format!("/t/{n}")) != c.home("/t")).unwrap();
    c.create(&format!("/t/{name}"), 0o644, true).await.unwrap();
    cluster.crash(c.home("/t")).await;
    let e = c.create(&format!("/t/{name}/a"), 0o644, true).await.unwrap_err().errno;
    assert_ne!(e, Errno::ENOENT, "'/t/{name}' exists: ENOTDIR, or EIO while that cannot be checked");
}

/// Shrunk from `model_under_faults` (serial, only delays): right after an insert takes a
/// directory over its threshold, renames into it answer ENOENT while it is being
/// distributed (the server routes the new entry to a storing server that has no shard
/// yet). Races with the background distribution: tried 10 times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rename_into_a_directory_being_distributed() {
    let mut wrong = Vec::new();
    for _ in 0..10 {
        let (_cluster, c) = small(TxnProtocol::TwoPhase, Some(2)).await;
        c.mkdir("/t/c", 0o755).await.unwrap();
        c.mkdir("/t/c/c", 0o755).await.unwrap();
        c.create("/t/b", 0o644, true).await.unwrap();
        c.mkdir("/t/a", 0o755).await.unwrap();
        let r = c.rename("/t/c/c", "/t/b").await.map_err(|e| e.errno);
        if r != Err(Errno::ENOTDIR) {
            wrong.push(r);
        }
    }
    assert!(wrong.is_empty(), "rename of a directory over a file answered {wrong:?}, not ENOTDIR");
}

/// Shrunk from `model_under_faults` (2pc, one lost request): when the COMMIT of a
/// directory rename to the new home of the directory object is lost, the rename is
/// acknowledged, and the new path answered ENOENT until the coordinator delivered the
/// decision again. Now every participant of a subtree move locks the destination from its
/// prepare on, so a lookup there waits for the decision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_waits_for_an_acknowledged_directory_rename() {
    let (cluster, c) = small(TxnProtocol::TwoPhase, None).await;
    c.mkdir("/t/d", 0o755).await.unwrap();
    c.mkdir("/t/d/a", 0o755).await.unwrap();
    let coordinator = c.home("/t/d");
    let to = (0..).map(|i| format!("/t/n{i}")).find(|p| c.home(p) != coordinator).unwrap();
    let fps: Vec<_> = cluster
        .ids()
        .into_iter()
        .map(|id| cluster.failpoint(id, FailStep::CoordinatorAfterCommitRecord, FailAction::Pause))
        .collect();
    let renaming = {
        let (c, to) = (cluster.client(), to.clone());
        tokio::spawn(async move { c.rename("/t/d/a", &to).await })
    };
    fps[coordinator as usize].reached().await;
    cluster.net().partition(&[coordinator], &[c.home(&to)]);
    fps[coordinator as usize].release();
    renaming.await.unwrap().unwrap();
    // The new home has not heard the decision: a lookup waits for it (never ENOENT).
    let looking = {
        let (c, to) = (c.clone(), to.clone());
        tokio::spawn(async move { c.lstat(&to).await.map(|a| a.kind).map_err(|e| e.errno) })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let early = looking.is_finished();
    cluster.net().heal();
    let seen = looking.await.unwrap();
    assert_eq!(seen, Ok(plusfs_proto::FileKind::Dir), "{to} after its rename was acknowledged");
    assert!(!early, "the lookup answered before the new home knew the decision");
}
