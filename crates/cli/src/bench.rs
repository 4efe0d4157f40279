//! `plusfs bench`: a metadata load generator in the spirit of mdtest.
//!
//! Each client is a task with its own connections that runs its operations one at a time
//! (unbatched). Phases run in the order given (default: create, stat, unlink), every client
//! starting together. `--target` may be repeated to run the same phases on plusfs and on
//! local directories through system calls in one run, so their ratio is measured under
//! the same machine load.

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use plusfs_client::{Client, ClientOptions};
use plusfs_placement::ClusterMap;
use plusfs_proto::{BatchOp, Semantics};
use serde::Serialize;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Create,
    Stat,
    Unlink,
}

#[derive(Args)]
pub struct BenchArgs {
    /// Phases to run, in order.
    #[arg(value_enum, default_values = ["create", "stat", "unlink"])]
    pub(crate) phases: Vec<Phase>,
    /// Files per client (like mdtest -n).
    #[arg(long, short = 'n', default_value_t = 1000)]
    pub(crate) files: usize,
    /// Concurrent clients, each with its own connections.
    #[arg(long, short = 'c', default_value_t = 1)]
    pub(crate) clients: usize,
    /// All clients work in one shared directory (default).
    #[arg(long, conflicts_with = "unique")]
    shared: bool,
    /// Each client works in a directory of its own (like mdtest -u).
    #[arg(long)]
    pub(crate) unique: bool,
    /// Directory to work in (created if missing).
    #[arg(long, short = 'd', default_value = "/bench")]
    pub(crate) dir: String,
    /// Where to run: `plusfs` or `local:PATH` (repeatable; default plusfs).
    #[arg(long = "target")]
    targets: Vec<String>,
    /// Entries per batch request (1: one request per operation, no batching).
    #[arg(long, short = 'b', default_value_t = 1)]
    pub(crate) batch: usize,
    /// Print results as JSON lines.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
pub(crate) struct Outcome {
    pub(crate) target: String,
    pub(crate) phase: Phase,
    pub(crate) batch: usize,
    pub(crate) clients: usize,
    pub(crate) ops: u64,
    pub(crate) errors: u64,
    pub(crate) seconds: f64,
    pub(crate) ops_per_sec: f64,
    /// Messages each operation cost: client requests + replies, plus server-to-server
    /// messages (from the servers' counters). Zero for local targets.
    pub(crate) messages_per_op: f64,
    pub(crate) requests: u64,
}

impl Outcome {
    /// The outcome of one phase on a target without messages (local, engine).
    pub(crate) fn timed(target: String, phase: Phase, a: &BenchArgs, errors: u64, seconds: f64) -> Outcome {
        let ops = (a.files * a.clients) as u64;
        Outcome {
            target,
            phase,
            batch: a.batch,
            clients: a.clients,
            ops,
            errors,
            seconds,
            ops_per_sec: ops as f64 / seconds,
            messages_per_op: 0.0,
            requests: 0,
        }
    }
}

enum Target {
    Plusfs,
    Local(PathBuf),
    /// The store engine driven in-process: the upper limit of a server on this machine.
    Engine(Option<PathBuf>),
}

fn parse_target(t: &str) -> Result<Target> {
    if t == "plusfs" {
        Ok(Target::Plusfs)
    } else if let Some(p) = t.strip_prefix("local:") {
        Ok(Target::Local(PathBuf::from(p)))
    } else if t == "engine" {
        Ok(Target::Engine(None))
    } else if let Some(p) = t.strip_prefix("engine:") {
        Ok(Target::Engine(Some(PathBuf::from(p))))
    } else {
        bail!("unknown target '{t}': use plusfs, local:PATH, engine or engine:PATH")
    }
}

pub fn run(a: BenchArgs, cluster: Option<PathBuf>) -> Result<ExitCode> {
    if a.clients == 0 || a.files == 0 || a.batch == 0 {
        bail!("--clients, --files and --batch must be positive");
    }
    let targets = if a.targets.is_empty() { vec!["plusfs".to_string()] } else { a.targets.clone() };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let mut results: Vec<Outcome> = Vec::new();
    for t in &targets {
        let outcomes = match parse_target(t)? {
            Target::Plusfs => rt.block_on(run_plusfs(&a, crate::load_map(cluster.as_ref())?))?,
            Target::Local(p) => run_local(&a, &p)?,
            Target::Engine(p) => crate::engine_bench::run(&a, p.as_deref())?,
        };
        for o in outcomes {
            print_outcome(&a, &o);
            results.push(o);
        }
    }
    if !a.json && targets.len() > 1 {
        for phase in &a.phases {
            let rate = |t: &str| results.iter().find(|o| o.target == t && o.phase == *phase).map(|o| o.ops_per_sec);
            if let Some(base) = rate(&targets[0]) {
                for t in &targets[1..] {
                    if let Some(r) = rate(t) {
                        println!("{phase:?}: {} / {t} = {:.2}", targets[0], base / r);
                    }
                }
            }
        }
    }
    let failed = results.iter().any(|o| o.errors > 0);
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

fn print_outcome(a: &BenchArgs, o: &Outcome) {
    if a.json {
        println!("{}", serde_json::to_string(o).expect("serialisable"));
        return;
    }
    let name = format!("{:?}", o.phase).to_lowercase();
    let msgs = if o.target == "plusfs" {
        format!(", {} requests, {:.3} messages/op", o.requests, o.messages_per_op)
    } else {
        String::new()
    };
    println!(
        "{name}: {:.0} ops/s{msgs} [{}; batch {}, {} clients, {} ops, {:.2} s{}]",
        o.ops_per_sec,
        o.target,
        o.batch,
        o.clients,
        o.ops,
        o.seconds,
        if o.errors > 0 { format!(", {} ERRORS", o.errors) } else { String::new() }
    );
}

/// The directory and file names client `client` works on.
pub(crate) fn client_files(a: &BenchArgs, base: &str, client: usize) -> (String, Vec<String>) {
    if a.unique {
        (format!("{base}/c{client}"), (0..a.files).map(|i| format!("f{i}")).collect())
    } else {
        (base.to_string(), (0..a.files).map(|i| format!("f.{client}.{i}")).collect())
    }
}

/// Messages received anywhere in the cluster: every message is received exactly once,
/// by a server (requests from clients and peers, replies from peers) or by a client.
async fn server_msgs_in(client: &Client) -> Result<u64> {
    let mut total = 0;
    for s in &client.map().servers {
        total += client.server_status(s.id).await?.msgs_in;
    }
    Ok(total)
}

async fn run_plusfs(a: &BenchArgs, map: ClusterMap) -> Result<Vec<Outcome>> {
    let admin = Client::new(map.clone(), ClientOptions::default());
    let base = plusfs_proto::path::normalize(&a.dir).map_err(|e| anyhow::anyhow!("bad --dir: {}", e.reason))?;
    admin.mkdir_all(&base, 0o755).await?;
    if a.unique {
        for c in 0..a.clients {
            admin.mkdir_all(&format!("{base}/c{c}"), 0o755).await?;
        }
    }
    let mut out = Vec::new();
    for &phase in &a.phases {
        let barrier = Arc::new(std::sync::Barrier::new(a.clients + 1));
        let threads: Vec<_> = (0..a.clients)
            .map(|ci| {
                let files = client_files(a, &base, ci);
                let (map, barrier, batch) = (map.clone(), barrier.clone(), a.batch);
                std::thread::spawn(move || plusfs_client_thread(map, phase, files, batch, barrier))
            })
            .collect();
        // Two barriers: all clients connected; then the server counters are read (so the
        // clients' pings are not charged to the phase) and everyone starts together.
        barrier.wait();
        let before_servers = server_msgs_in(&admin).await?;
        barrier.wait();
        let start = Instant::now();
        let mut errors = 0;
        let (mut replies, mut requests) = (0, 0);
        for t in threads {
            let r = t.join().map_err(|_| anyhow::anyhow!("bench client panicked"))??;
            errors += r.errors;
            replies += r.counters.msgs_in;
            requests += r.counters.requests;
            if let Some(f) = r.first_error {
                eprintln!("plusfs: bench: {f}");
            }
        }
        let seconds = start.elapsed().as_secs_f64();
        // The status requests of the second scan are themselves counted once per server.
        let server_msgs = server_msgs_in(&admin).await?.saturating_sub(before_servers + map.servers.len() as u64);
        let mut o = Outcome::timed("plusfs".into(), phase, a, errors, seconds);
        o.messages_per_op = (server_msgs + replies) as f64 / o.ops as f64;
        o.requests = requests;
        out.push(o);
    }
    Ok(out)
}

/// What one bench client thread did.
struct ClientRun {
    errors: u64,
    first_error: Option<plusfs_client::FsError>,
    counters: plusfs_client::CountersSnapshot,
}

/// One bench client: a thread with its own single-threaded runtime and connections, so a
/// request and its reply never hop between threads inside the client.
fn plusfs_client_thread(
    map: ClusterMap,
    phase: Phase,
    (dir, names): (String, Vec<String>),
    batch: usize,
    barrier: Arc<std::sync::Barrier>,
) -> Result<ClientRun> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async move {
        let c = Client::new(map, ClientOptions::default());
        let ready = c.wait_ready(std::time::Duration::from_secs(10)).await;
        barrier.wait();
        barrier.wait();
        ready?;
        let before = c.counters();
        let mut run = ClientRun { errors: 0, first_error: None, counters: Default::default() };
        if batch <= 1 {
            for name in &names {
                let p = plusfs_proto::path::join(&dir, name);
                let r = match phase {
                    Phase::Create => c.create(&p, 0o644, true).await.map(drop),
                    Phase::Stat => c.lstat(&p).await.map(drop),
                    Phase::Unlink => c.unlink(&p).await,
                };
                if let Err(e) = r {
                    run.errors += 1;
                    run.first_error.get_or_insert(e);
                }
            }
        } else {
            let op = match phase {
                Phase::Create => BatchOp::Create { exclusive: true },
                Phase::Stat => BatchOp::Stat,
                Phase::Unlink => BatchOp::Unlink,
            };
            for chunk in names.chunks(batch) {
                match c.batch(op, &dir, chunk, 0o644, Semantics::PerformAll).await {
                    Ok(out) => {
                        for (o, name) in out.into_iter().zip(chunk) {
                            if let Err(e) = o.into_result() {
                                run.errors += 1;
                                let p = plusfs_proto::path::join(&dir, name);
                                run.first_error.get_or_insert_with(|| plusfs_client::FsError::new("bench", p, e));
                            }
                        }
                    }
                    Err(e) => {
                        run.errors += chunk.len() as u64;
                        run.first_error.get_or_insert(e);
                    }
                }
            }
        }
        run.counters = c.counters() - before;
        Ok(run)
    })
}

fn run_local(a: &BenchArgs, root: &std::path::Path) -> Result<Vec<Outcome>> {
    let base = root.join(a.dir.trim_start_matches('/'));
    std::fs::create_dir_all(&base).with_context(|| format!("cannot create {}", base.display()))?;
    if a.unique {
        for c in 0..a.clients {
            std::fs::create_dir_all(base.join(format!("c{c}")))?;
        }
    }
    let base = Arc::new(base.to_string_lossy().into_owned());
    let mut out = Vec::new();
    for &phase in &a.phases {
        let start = Instant::now();
        let handles: Vec<_> = (0..a.clients)
            .map(|ci| {
                let (dir, names) = client_files(a, &base, ci);
                let paths: Vec<String> = names.iter().map(|n| format!("{dir}/{n}")).collect();
                std::thread::spawn(move || {
                    let mut errors = 0u64;
                    for p in &paths {
                        let r = match phase {
                            Phase::Create => std::fs::OpenOptions::new().write(true).create_new(true).open(p).map(drop),
                            Phase::Stat => std::fs::symlink_metadata(p).map(drop),
                            Phase::Unlink => std::fs::remove_file(p),
                        };
                        if let Err(e) = r {
                            if errors == 0 {
                                eprintln!("plusfs: bench: {p}: {e}");
                            }
                            errors += 1;
                        }
                    }
                    errors
                })
            })
            .collect();
        let errors: u64 = handles.into_iter().map(|h| h.join().unwrap_or(1)).sum();
        let seconds = start.elapsed().as_secs_f64();
        out.push(Outcome::timed(format!("local:{}", root.display()), phase, a, errors, seconds));
    }
    Ok(out)
}
