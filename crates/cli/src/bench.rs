//! `plusfs bench`: a metadata load generator in the spirit of mdtest.
//!
//! Each client is a task with its own connections that runs its operations one at a time
//! (unbatched). Phases run in the order given (default: create, stat, unlink), every client
//! starting together. `--target` may be repeated to run the same phases on plusfs and on
//! local directories through system calls in one run, so their ratio is measured under
//! the same machine load.

use crate::largefile::{LargeIo, SharedFile};
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
    /// Opens each file and closes it again (mdtest's open+close; a FUSE mount's
    /// open, flush and release).
    Open,
    /// Every client lists its directory (rate: entries listed per second).
    Readdir,
    Unlink,
    /// Creates the files with `--size` bytes of contents each.
    Write,
    /// Reads the files whole.
    Read,
    /// The wire probe: each client sends as many bytes as the write phase writes to the
    /// servers, which store nothing (plusfs target only).
    ProbeWrite,
    /// The wire probe the other way: as many bytes as the read phase reads.
    ProbeRead,
}

impl Phase {
    /// Whether the phase moves file bytes (its rate is also given in MiB/s).
    pub(crate) fn moves_data(self) -> bool {
        matches!(self, Phase::Write | Phase::Read | Phase::ProbeWrite | Phase::ProbeRead)
    }
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
    /// First part of the file names (PREFIX.CLIENT.I; with --unique PREFIX I): a run
    /// that fills a directory uses another prefix than the runs measured in it.
    #[arg(long, default_value = "f")]
    pub(crate) prefix: String,
    /// Where to run: `plusfs` or `local:PATH` (repeatable; default plusfs).
    #[arg(long = "target")]
    targets: Vec<String>,
    /// Entries per batch request (1: one request per operation, no batching).
    #[arg(long, short = 'b', default_value_t = 1)]
    pub(crate) batch: usize,
    /// Shared directories: client i works in DIR/d<i % N> (0: DIR itself).
    #[arg(long, default_value_t = 0)]
    dirs: usize,
    /// Huge-directory threshold of the directories the bench creates: a number of
    /// entries, 0 (always distributed), `never`, or `cluster` (the cluster's, default).
    #[arg(long, value_parser = plusfs_proto::Threshold::parse, default_value = "cluster")]
    threshold: plusfs_proto::Threshold,
    /// Bytes per file of the write and read phases (suffixes k, M, G: binary).
    #[arg(long, default_value = "4096", value_parser = crate::largefile::parse_size)]
    pub(crate) size: usize,
    /// Large-file mode: the write and read phases move each file's bytes in calls of
    /// this many bytes (like IOR's -t; default: the whole file in one call).
    #[arg(long, value_parser = crate::largefile::parse_size)]
    pub(crate) block: Option<usize>,
    /// Large-file mode: the clients write and read their regions of one file, DIR/shared
    /// (N-to-1, strided: region i * clients + k is client k's i-th).
    #[arg(long)]
    pub(crate) shared_file: bool,
    /// Each client handles its files in a random order (seed 002's random access).
    #[arg(long)]
    random: bool,
    /// Drop the kernel's page cache before each phase (needs root): cold-cache reads.
    #[arg(long)]
    drop_caches: bool,
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
    /// Rates over the first and the last tenth of the operations (plusfs target).
    pub(crate) first_tenth_ops_per_sec: f64,
    pub(crate) last_tenth_ops_per_sec: f64,
    /// File bytes per second (write, read and probe phases).
    pub(crate) mib_per_sec: f64,
    /// Client requests per MiB moved (write, read and probe phases on plusfs).
    pub(crate) requests_per_mib: f64,
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
            first_tenth_ops_per_sec: 0.0,
            last_tenth_ops_per_sec: 0.0,
            mib_per_sec: match phase.moves_data() {
                true => (ops * a.size as u64) as f64 / seconds / (1 << 20) as f64,
                false => 0.0,
            },
            requests_per_mib: 0.0,
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

/// Runs the bench for a target that drives one server engine in-process (`engine` or
/// `engine:PATH`); supplied by the binary, which holds that target's module.
pub type EngineTarget = fn(&BenchArgs, Option<&std::path::Path>) -> Result<Vec<Outcome>>;

/// Runs every target of `a` and prints the results (and ratios between targets).
pub fn run(a: BenchArgs, cluster: Option<PathBuf>, engine: EngineTarget) -> Result<ExitCode> {
    if a.clients == 0 || a.files == 0 || a.batch == 0 || a.block == Some(0) {
        bail!("--clients, --files, --batch and --block must be positive");
    }
    if (a.block.is_some() || a.shared_file) && a.batch > 1 {
        bail!("--block and --shared-file move files one by one: leave --batch at 1");
    }
    if a.prefix.is_empty() || a.prefix.contains('/') || a.prefix.contains('\0') {
        bail!("--prefix '{}' is no file name: give one without '/'", a.prefix);
    }
    let targets = if a.targets.is_empty() { vec!["plusfs".to_string()] } else { a.targets.clone() };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let mut results: Vec<Outcome> = Vec::new();
    for t in &targets {
        let outcomes = match parse_target(t)? {
            Target::Plusfs => rt.block_on(run_plusfs(&a, crate::load_map(cluster.as_ref())?))?,
            Target::Local(p) => run_local(&a, &p)?,
            Target::Engine(p) => engine(&a, p.as_deref())?,
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
    if o.first_tenth_ops_per_sec <= 0.0 || o.last_tenth_ops_per_sec <= 0.0 {
        println!("{name}: too short a run to compare its first and last tenth");
    } else {
        println!(
            "{name}: first tenth {:.0} ops/s, last tenth {:.0} ops/s ({:.0} % kept)",
            o.first_tenth_ops_per_sec,
            o.last_tenth_ops_per_sec,
            100.0 * o.last_tenth_ops_per_sec / o.first_tenth_ops_per_sec
        );
    }
    let mib = match (o.mib_per_sec > 0.0, o.requests_per_mib > 0.0) {
        (true, true) => {
            format!(" ({:.1} MiB/s of {} B files, {:.2} requests/MiB)", o.mib_per_sec, a.size, o.requests_per_mib)
        }
        (true, false) => format!(" ({:.1} MiB/s of {} B files)", o.mib_per_sec, a.size),
        _ => String::new(),
    };
    println!(
        "{name}: {:.0} ops/s{mib}{msgs} [{}; batch {}, {} clients, {} ops, {:.2} s{}]",
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
        (format!("{base}/c{client}"), (0..a.files).map(|i| format!("{}{i}", a.prefix)).collect())
    } else if a.dirs > 0 {
        (format!("{base}/d{}", client % a.dirs), (0..a.files).map(|i| format!("{}.{client}.{i}", a.prefix)).collect())
    } else {
        (base.to_string(), (0..a.files).map(|i| format!("{}.{client}.{i}", a.prefix)).collect())
    }
}

/// The files client `client` handles in `phase`: in creation order, or shuffled (a
/// different order per phase) with `--random`.
fn phase_files(a: &BenchArgs, base: &str, client: usize, phase: Phase) -> (String, Vec<String>) {
    let (dir, mut names) = client_files(a, base, client);
    if a.random {
        use rand::seq::SliceRandom;
        use rand::SeedableRng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(client as u64 * 16 + phase as u64);
        names.shuffle(&mut rng);
    }
    (dir, names)
}

/// Client `client`'s large-file settings, when `--block` or `--shared-file` is given.
fn large_io(a: &BenchArgs, base: &str, client: usize) -> Option<LargeIo> {
    (a.block.is_some() || a.shared_file).then(|| LargeIo {
        block: a.block.unwrap_or(a.size).max(1),
        size: a.size,
        shared: a.shared_file.then(|| SharedFile {
            path: plusfs_proto::path::join(base, "shared"),
            client,
            clients: a.clients,
        }),
    })
}

/// Empties the kernel's page cache (root only), so reads come from the disks.
fn drop_caches() -> Result<()> {
    // SAFETY: sync(2) has no preconditions.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3").context("--drop-caches needs root (/proc/sys/vm/drop_caches)")
}

/// The directories the clients work in.
fn work_dirs(a: &BenchArgs, base: &str) -> Vec<String> {
    let mut dirs: Vec<String> = (0..a.clients).map(|c| client_files(a, base, c).0).collect();
    dirs.sort();
    dirs.dedup();
    dirs
}

/// Rates over the first and last tenth of the operations, from (time, ops) marks of all
/// clients.
fn tenth_rates(mut marks: Vec<(f64, u64)>, total: u64) -> (f64, f64) {
    marks.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (mut done, mut t10, mut t90, mut end) = (0u64, None, None, 0.0);
    for (t, n) in marks {
        done += n;
        end = t;
        if t10.is_none() && done * 10 >= total {
            t10 = Some(t);
        }
        if t90.is_none() && done * 10 >= total * 9 {
            t90 = Some(t);
        }
    }
    let tenth = total as f64 / 10.0;
    let first = t10.map_or(0.0, |t| if t > 0.0 { tenth / t } else { 0.0 });
    let last = t90.map_or(0.0, |t| if end > t { tenth / (end - t) } else { 0.0 });
    (first, last)
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
    let parent = plusfs_proto::path::split(&base).map_or("/".to_string(), |(d, _)| d.to_string());
    admin.mkdir_all(&parent, 0o755).await?;
    for d in std::iter::once(base.clone()).chain(work_dirs(a, &base)) {
        match admin.mkdir_with(&d, 0o755, a.threshold, 0).await {
            Err(e) if e.errno == plusfs_proto::Errno::EEXIST => {}
            r => {
                r?;
            }
        }
    }
    let mut out = Vec::new();
    for &phase in &a.phases {
        if a.drop_caches {
            drop_caches()?;
        }
        if a.shared_file && phase == Phase::Write {
            admin.create(&plusfs_proto::path::join(&base, "shared"), 0o644, false).await?;
        }
        let barrier = Arc::new(std::sync::Barrier::new(a.clients + 1));
        let threads: Vec<_> = (0..a.clients)
            .map(|ci| {
                let files = phase_files(a, &base, ci, phase);
                let (map, barrier, batch, size) = (map.clone(), barrier.clone(), a.batch, a.size);
                let large = large_io(a, &base, ci);
                std::thread::spawn(move || plusfs_client_thread(map, phase, files, (batch, size, large), barrier))
            })
            .collect();
        // Two barriers: all clients connected; then the server counters are read (so the
        // clients' pings are not charged to the phase) and everyone starts together.
        barrier.wait();
        let before_servers = server_msgs_in(&admin).await?;
        barrier.wait();
        let start = Instant::now();
        let mut errors = 0;
        let (mut replies, mut requests, mut marks, mut listed) = (0, 0, Vec::new(), 0u64);
        for t in threads {
            let r = t.join().map_err(|_| anyhow::anyhow!("bench client panicked"))??;
            errors += r.errors;
            marks.extend(r.marks);
            listed += r.listed;
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
        if phase == Phase::Readdir {
            o.ops = listed;
            o.ops_per_sec = listed as f64 / seconds;
        }
        o.messages_per_op = (server_msgs + replies) as f64 / o.ops.max(1) as f64;
        o.requests = requests;
        if phase.moves_data() {
            let mib = (o.ops * a.size as u64) as f64 / (1 << 20) as f64;
            o.requests_per_mib = requests as f64 / mib.max(f64::MIN_POSITIVE);
        }
        (o.first_tenth_ops_per_sec, o.last_tenth_ops_per_sec) = tenth_rates(marks, o.ops);
        out.push(o);
    }
    Ok(out)
}

/// What one bench client thread did.
struct ClientRun {
    errors: u64,
    first_error: Option<plusfs_client::FsError>,
    counters: plusfs_client::CountersSnapshot,
    /// (seconds since start, operations done) after each request or batch.
    marks: Vec<(f64, u64)>,
    /// Entries listed (readdir phase).
    listed: u64,
}

/// One bench client: a thread with its own single-threaded runtime and connections, so a
/// request and its reply never hop between threads inside the client.
fn plusfs_client_thread(
    map: ClusterMap,
    phase: Phase,
    (dir, names): (String, Vec<String>),
    (batch, size, large): (usize, usize, Option<LargeIo>),
    barrier: Arc<std::sync::Barrier>,
) -> Result<ClientRun> {
    let contents = vec![0x5au8; large.as_ref().map_or(size, |l| l.block.min(size))];
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async move {
        let c = Client::new(map, ClientOptions::default());
        let ready = c.wait_ready(std::time::Duration::from_secs(10)).await;
        barrier.wait();
        barrier.wait();
        ready?;
        let before = c.counters();
        let start = Instant::now();
        let mut run =
            ClientRun { errors: 0, first_error: None, counters: Default::default(), marks: Vec::new(), listed: 0 };
        if matches!(phase, Phase::ProbeWrite | Phase::ProbeRead) {
            if let Err(e) = crate::largefile::probe(&c, size * names.len(), phase == Phase::ProbeWrite).await {
                run.errors += 1;
                run.first_error = Some(e);
            }
        } else if let Some(io) = large.as_ref().filter(|_| matches!(phase, Phase::Write | Phase::Read)) {
            for (i, name) in names.iter().enumerate() {
                let (p, at) = io.target(&plusfs_proto::path::join(&dir, name), i);
                let r = match phase {
                    Phase::Write => crate::largefile::write(&c, io, &p, at, &contents).await,
                    _ => crate::largefile::read(&c, io, &p, at).await,
                };
                if let Err(e) = r {
                    run.errors += 1;
                    run.first_error.get_or_insert(e);
                }
                run.marks.push((start.elapsed().as_secs_f64(), 1));
            }
        } else if phase == Phase::Readdir {
            match c.readdir(&dir).await {
                Ok(entries) => run.listed = entries.len() as u64,
                Err(e) => {
                    run.errors += 1;
                    run.first_error = Some(e);
                }
            }
        } else if batch > 1 && matches!(phase, Phase::Write | Phase::Read) {
            // BFO: batch-file writes and reads of `batch` files per call.
            for chunk in names.chunks(batch) {
                run.marks.push((start.elapsed().as_secs_f64(), 0));
                let paths: Vec<String> = chunk.iter().map(|n| plusfs_proto::path::join(&dir, n)).collect();
                let errors: Vec<plusfs_client::FsError> = if phase == Phase::Write {
                    let files =
                        paths.iter().map(|p| plusfs_client::NewFile::new(p.clone(), contents.clone())).collect();
                    c.batch_write(files).await.into_iter().filter_map(Result::err).collect()
                } else {
                    let got = c.batch_read(&paths, plusfs_client::DEFAULT_READ_BUFFER).await;
                    got.into_iter()
                        .zip(&paths)
                        .filter_map(|(r, p)| match r {
                            Ok((_, d)) if d.len() == contents.len() => None,
                            Ok(_) => Some(plusfs_client::FsError::new("bench read", p, plusfs_proto::Errno::EIO)),
                            Err(e) => Some(e),
                        })
                        .collect()
                };
                run.errors += errors.len() as u64;
                if let Some(e) = errors.into_iter().next() {
                    run.first_error.get_or_insert(e);
                }
                run.marks.push((start.elapsed().as_secs_f64(), chunk.len() as u64));
            }
        } else if batch <= 1 || matches!(phase, Phase::Write | Phase::Read | Phase::Open) {
            for name in &names {
                let p = plusfs_proto::path::join(&dir, name);
                let r = match phase {
                    Phase::Create => c.create(&p, 0o644, true).await.map(drop),
                    Phase::Stat => c.lstat(&p).await.map(drop),
                    Phase::Open => match c.open(&p).await {
                        Ok(fh) => c.close(&fh).await,
                        Err(e) => Err(e),
                    },
                    Phase::Unlink => c.unlink(&p).await,
                    Phase::Write => match c.create(&p, 0o644, true).await {
                        Ok(_) => c.write(&p, 0, &contents).await.map(drop),
                        Err(e) => Err(e),
                    },
                    Phase::Read => match c.read_all(&p).await {
                        Ok(d) if d.len() == contents.len() => Ok(()),
                        Ok(d) => Err(plusfs_client::FsError::new("bench read", &p, plusfs_proto::Errno::EIO)
                            .with_detail(format!("{} bytes, {} expected", d.len(), contents.len()))),
                        Err(e) => Err(e),
                    },
                    Phase::Readdir | Phase::ProbeWrite | Phase::ProbeRead => unreachable!("run above"),
                };
                if let Err(e) = r {
                    run.errors += 1;
                    run.first_error.get_or_insert(e);
                }
                if names.len() >= 100 {
                    run.marks.push((start.elapsed().as_secs_f64(), 1));
                }
            }
        } else {
            let op = match phase {
                Phase::Create => BatchOp::Create { exclusive: true },
                Phase::Stat => BatchOp::Stat,
                Phase::Unlink => BatchOp::Unlink,
                Phase::Readdir | Phase::Write | Phase::Read | Phase::Open | Phase::ProbeWrite | Phase::ProbeRead => {
                    unreachable!("run one by one above")
                }
            };
            for chunk in names.chunks(batch) {
                run.marks.push((start.elapsed().as_secs_f64(), 0));
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
                run.marks.push((start.elapsed().as_secs_f64(), chunk.len() as u64));
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
        if matches!(phase, Phase::ProbeWrite | Phase::ProbeRead) {
            eprintln!("plusfs: bench: the {phase:?} phase has no meaning on local:{}; skipped", root.display());
            continue;
        }
        if a.drop_caches {
            drop_caches()?;
        }
        if a.shared_file && phase == Phase::Write {
            std::fs::OpenOptions::new().write(true).create(true).truncate(false).open(format!("{base}/shared"))?;
        }
        let start = Instant::now();
        let handles: Vec<_> = (0..a.clients)
            .map(|ci| {
                let (dir, names) = phase_files(a, &base, ci, phase);
                let paths: Vec<String> = names.iter().map(|n| format!("{dir}/{n}")).collect();
                let (size, large) = (a.size, large_io(a, &base, ci));
                std::thread::spawn(move || {
                    let contents = vec![0x5au8; large.as_ref().map_or(size, |l| l.block.min(size))];
                    if phase == Phase::Readdir {
                        return std::fs::read_dir(&dir).map_or(1, |d| u64::from(d.count() == 0));
                    }
                    let mut errors = 0u64;
                    for (i, p) in paths.iter().enumerate() {
                        let r = match &large {
                            Some(io) if matches!(phase, Phase::Write | Phase::Read) => {
                                local_large(phase, io, io.target(p, i), &contents)
                            }
                            _ => local_op(phase, p, &contents),
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

/// One operation of `phase` on local file `p`; `contents` is what the write phase writes.
fn local_op(phase: Phase, p: &str, contents: &[u8]) -> std::io::Result<()> {
    match phase {
        Phase::Create => std::fs::OpenOptions::new().write(true).create_new(true).open(p).map(drop),
        Phase::Stat => std::fs::symlink_metadata(p).map(drop),
        Phase::Open => std::fs::File::open(p).map(drop),
        Phase::Unlink => std::fs::remove_file(p),
        Phase::Write => std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(p)
            .and_then(|mut f| std::io::Write::write_all(&mut f, contents)),
        Phase::Read => std::fs::read(p).and_then(|d| match d.len() == contents.len() {
            true => Ok(()),
            false => Err(std::io::Error::other(format!("{} bytes, {} expected", d.len(), contents.len()))),
        }),
        Phase::Readdir | Phase::ProbeWrite | Phase::ProbeRead => unreachable!("run or skipped by the caller"),
    }
}

/// The large-file write or read of `io.size` bytes at `at` of local file `path`, in calls
/// of `io.block` bytes.
fn local_large(phase: Phase, io: &LargeIo, (path, at): (String, u64), contents: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let f = match phase {
        Phase::Write if io.shared.is_none() => std::fs::OpenOptions::new().write(true).create_new(true).open(&path)?,
        Phase::Write => std::fs::OpenOptions::new().write(true).open(&path)?,
        _ => std::fs::File::open(&path)?,
    };
    let mut buf = vec![0u8; contents.len()];
    let mut done = 0;
    while done < io.size {
        let n = io.block.min(io.size - done);
        match phase {
            Phase::Write => f.write_all_at(&contents[..n], at + done as u64)?,
            _ => f.read_exact_at(&mut buf[..n], at + done as u64)?,
        }
        done += n;
    }
    Ok(())
}
