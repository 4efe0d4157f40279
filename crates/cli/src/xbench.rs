//! `plusfs xbench`: throughput, latency and messages of cross-server operations (seed 004
//! §IV.B–D) under the cluster's `[txn] protocol`.
//!
//! Every process works in one shared directory, distributed over all servers from its
//! creation (as OrangeFS spreads a directory's entries), so the entry of `d` and the
//! directory object of `d` are on different servers for most names:
//! - `mkdir`: each process makes `--ops` directories;
//! - `update`: 80 % updates (half mkdir of new names, half rmdir of prepared ones) and
//!   20 % stats of prepared directories — metarates' update-dominated mix;
//! - `read`: the same with 20 % updates and 80 % stats.
//!
//! `--conflict-pct P` makes P % of the stats look at a directory the process made in this
//! run (whose Cx commitment is usually still pending), which forces immediate commitments
//! (seed 004 Fig. 8).

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use plusfs_client::{Client, ClientOptions};
use plusfs_placement::ClusterMap;
use plusfs_proto::{Errno, Threshold};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Barrier};
use std::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Workload {
    Mkdir,
    Update,
    Read,
}

#[derive(Debug, Args)]
pub struct XbenchArgs {
    /// Which mix to run.
    #[arg(long, value_enum, default_value = "update")]
    workload: Workload,
    /// Concurrent client processes (threads with their own connections).
    #[arg(long, default_value_t = 8)]
    procs: usize,
    /// Timed operations per process.
    #[arg(long, default_value_t = 2000)]
    ops: usize,
    /// Directories each process prepares (untimed) for the update and read mixes; they are
    /// the targets of the rmdirs and stats (default: enough that the rmdirs never run out).
    #[arg(long)]
    prepared: Option<usize>,
    /// Percentage of stats aimed at directories made in this run (injected conflicts).
    #[arg(long, default_value_t = 0)]
    conflict_pct: u32,
    /// The shared directory (made if missing; must not exist with other content).
    #[arg(long, default_value = "/xbench")]
    dir: String,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Leave the run's Cx operations pending at the end (to measure recovery).
    #[arg(long)]
    leave_pending: bool,
}

/// What one process measured.
#[derive(Default)]
struct ProcRun {
    latencies_us: Vec<u32>,
    cross: u64,
    errors: u64,
    first_error: Option<String>,
    client_msgs_in: u64,
}

/// Cluster-wide counters read before and after the timed part.
#[derive(Default, Clone)]
struct Totals {
    msgs_in: u64,
    commit_msgs: u64,
    immediate: u64,
    invalidated: u64,
    rounds: u64,
}

async fn totals(c: &Client) -> Result<Totals> {
    let mut t = Totals::default();
    for s in &c.map().servers {
        let st = c.server_status(s.id).await?;
        t.msgs_in += st.msgs_in;
        // Requests of the commitment (each has a reply).
        let commit_ops: u64 = st
            .ops
            .iter()
            .filter(|(n, _)| matches!(n.as_str(), "cx_vote" | "cx_decide" | "cx_urge" | "cx_launch"))
            .map(|(_, n)| n)
            .sum();
        t.commit_msgs += 2 * commit_ops;
        t.immediate += st.cx_immediate;
        t.invalidated += st.cx_invalidated;
        t.rounds += st.cx_rounds;
    }
    Ok(t)
}

/// Commits every pending Cx operation in `dir` (a listing of it commits them first) and
/// waits until no server has one left (or 30 s pass).
async fn settle(c: &Client, dir: &str) -> Result<()> {
    c.readdir(dir).await?;
    let deadline = Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let mut pending = 0;
        for s in &c.map().servers {
            pending += c.server_status(s.id).await?.cx_pending;
        }
        if pending == 0 || Instant::now() > deadline {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

pub fn run(a: XbenchArgs, cluster: Option<PathBuf>) -> Result<ExitCode> {
    if a.procs == 0 || a.ops == 0 {
        bail!("--procs and --ops must be positive");
    }
    if a.conflict_pct > 100 {
        bail!("--conflict-pct is a percentage (0-100)");
    }
    let map = crate::load_map(cluster.as_ref())?;
    let base = plusfs_proto::path::normalize(&a.dir).map_err(|e| anyhow::anyhow!("bad --dir: {}", e.reason))?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let admin = Client::new(map.clone(), ClientOptions::default());
    rt.block_on(async {
        match admin.mkdir_with(&base, 0o755, Threshold::Entries(0), 0).await {
            Err(e) if e.errno == Errno::EEXIST => Ok(()),
            r => r.map(drop),
        }
    })?;
    let run_id = std::process::id();
    let barrier = Arc::new(Barrier::new(a.procs + 1));
    let threads: Vec<_> = (0..a.procs)
        .map(|i| {
            let (map, barrier, base) = (map.clone(), barrier.clone(), base.clone());
            let update_pct = match a.workload {
                Workload::Mkdir => 0,
                Workload::Update => 80,
                Workload::Read => 20,
            };
            let prepared = a.prepared.unwrap_or(a.ops * update_pct / 200 + a.ops / 10 + 16);
            let (workload, ops, conflict) = (a.workload, a.ops, a.conflict_pct);
            std::thread::spawn(move || {
                proc_thread(map, &base, format!("{run_id}-{i}"), (workload, ops, prepared, conflict), barrier)
            })
        })
        .collect();
    eprintln!("preparing {} processes ...", a.procs);
    barrier.wait(); // prepared
    rt.block_on(settle(&admin, &base))?;
    let before = rt.block_on(totals(&admin))?;
    let start = Instant::now();
    barrier.wait(); // go
    let runs: Vec<ProcRun> = threads.into_iter().map(|t| t.join().expect("bench thread")).collect::<Result<_>>()?;
    let seconds = start.elapsed().as_secs_f64();
    let after = rt.block_on(totals(&admin))?;
    if !a.leave_pending {
        rt.block_on(settle(&admin, &base))?;
    }
    let settled = rt.block_on(totals(&admin))?;
    report(&a, &map, &runs, seconds, (&before, &after, &settled));
    Ok(if runs.iter().any(|r| r.errors > 0) { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize] as f64
}

fn report(a: &XbenchArgs, map: &ClusterMap, runs: &[ProcRun], seconds: f64, t: (&Totals, &Totals, &Totals)) {
    let (before, after, settled) = t;
    let mut lat: Vec<u32> = runs.iter().flat_map(|r| r.latencies_us.iter().copied()).collect();
    lat.sort_unstable();
    let ops = lat.len() as u64;
    let cross: u64 = runs.iter().map(|r| r.cross).sum();
    let errors: u64 = runs.iter().map(|r| r.errors).sum();
    let mean = lat.iter().map(|&x| x as f64).sum::<f64>() / ops.max(1) as f64;
    let client_in: u64 = runs.iter().map(|r| r.client_msgs_in).sum();
    // Every message is received once: by a server or by a client. Commitment still
    // running at the end is counted by waiting for it.
    let msgs = settled.msgs_in - before.msgs_in + client_in;
    let commit = settled.commit_msgs - before.commit_msgs;
    let protocol = map.txn.protocol.name();
    let workload = format!("{:?}", a.workload).to_lowercase();
    let fields = [
        ("protocol", format!("\"{protocol}\"")),
        ("servers", map.servers.len().to_string()),
        ("workload", format!("\"{workload}\"")),
        ("procs", a.procs.to_string()),
        ("conflict_pct", a.conflict_pct.to_string()),
        ("ops", ops.to_string()),
        ("cross_server_ops", cross.to_string()),
        ("errors", errors.to_string()),
        ("seconds", format!("{seconds:.3}")),
        ("ops_per_s", format!("{:.0}", ops as f64 / seconds)),
        ("mean_us", format!("{mean:.0}")),
        ("p99_us", format!("{:.0}", percentile(&lat, 0.99))),
        ("msgs", msgs.to_string()),
        ("msgs_per_op", format!("{:.2}", msgs as f64 / ops.max(1) as f64)),
        ("commit_msgs", commit.to_string()),
        ("commit_share_pct", format!("{:.1}", 100.0 * commit as f64 / msgs.max(1) as f64)),
        ("rounds", (settled.rounds - before.rounds).to_string()),
        ("immediate", (after.immediate - before.immediate).to_string()),
        ("invalidated", (settled.invalidated - before.invalidated).to_string()),
    ];
    if a.json {
        let body: Vec<String> = fields.iter().map(|(k, v)| format!("\"{k}\": {v}")).collect();
        println!("{{{}}}", body.join(", "));
        return;
    }
    for (k, v) in fields {
        println!("{k:>18}: {}", v.trim_matches('"'));
    }
    if let Some(e) = runs.iter().find_map(|r| r.first_error.clone()) {
        println!("first error: {e}");
    }
}

/// One process: prepares its directories, waits for the start, runs its operations.
fn proc_thread(
    map: ClusterMap,
    base: &str,
    tag: String,
    (workload, ops, prepared, conflict_pct): (Workload, usize, usize, u32),
    barrier: Arc<Barrier>,
) -> Result<ProcRun> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async move {
        let c = Client::new(map.clone(), ClientOptions::default());
        let mut run = ProcRun::default();
        let fail = |run: &mut ProcRun, e: plusfs_client::FsError| {
            run.errors += 1;
            run.first_error.get_or_insert_with(|| e.to_string());
        };
        let name = |kind: &str, k: usize| format!("{base}/{tag}-{kind}{k}");
        let mut pool: Vec<String> = Vec::new();
        if workload != Workload::Mkdir {
            for k in 0..prepared {
                let p = name("p", k);
                match c.mkdir(&p, 0o755).await {
                    Ok(_) => pool.push(p),
                    Err(e) => fail(&mut run, e),
                }
            }
        }
        barrier.wait();
        barrier.wait();
        let before = c.counters();
        let update_pct = match workload {
            Workload::Mkdir => 100,
            Workload::Update => 80,
            Workload::Read => 20,
        };
        let mut made: Vec<String> = Vec::new();
        let mut rng = tag.bytes().fold(0x9e37_79b9_7f4a_7c15u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut updates = 0usize;
        for k in 0..ops {
            let roll = (next() % 100) as u32;
            let t = Instant::now();
            let (p, result) = if roll < update_pct {
                updates += 1;
                // Updates alternate: mkdir of a new name, rmdir of a prepared one.
                if workload == Workload::Mkdir || updates % 2 == 1 || pool.len() < 2 {
                    let p = name("n", k);
                    let r = c.mkdir(&p, 0o755).await.map(drop);
                    if r.is_ok() {
                        made.push(p.clone());
                    }
                    (p, r)
                } else {
                    let p = pool.pop().expect("pool has entries");
                    let r = c.rmdir(&p).await;
                    (p, r)
                }
            } else {
                let own_recent = !made.is_empty() && (next() % 100) < conflict_pct as u64;
                let p = if own_recent {
                    made[made.len() - 1 - (next() as usize % made.len().min(8))].clone()
                } else if pool.is_empty() {
                    made.last().cloned().unwrap_or_else(|| base.to_string())
                } else {
                    pool[next() as usize % pool.len()].clone()
                };
                let r = c.lstat(&p).await.map(drop);
                (p, r)
            };
            run.latencies_us.push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
            if roll < update_pct {
                let (parent, _) = plusfs_proto::path::split(&p).expect("a child path");
                let (entry_server, _) = c.locate(parent, plusfs_proto::path::split(&p).map_or("", |x| x.1));
                run.cross += u64::from(entry_server != c.home(&p));
            }
            if let Err(e) = result {
                fail(&mut run, e);
            }
        }
        run.client_msgs_in = c.counters().msgs_in - before.msgs_in;
        Ok(run)
    })
}
