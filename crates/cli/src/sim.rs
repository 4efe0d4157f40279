//! `plusfs sim`: a scaling model of plusfs beyond the machine it is measured on.
//!
//! * `placement` places directory paths with the real CRUSH straw2 code for 16…1,024
//!   servers: the busiest server's share against the mean (the balance that bounds
//!   aggregate throughput) and the fraction of directories that move when one server
//!   joins, against the ideal 1/(N+1).
//! * `rates` is a closed queueing model solved by mean-value analysis: C clients each
//!   issue one operation at a time; an operation needs `D` seconds of CPU on a station of
//!   `k` cores (the machine here; a server's core when extrapolating) and `Z` seconds that
//!   use no CPU there (wake-ups, and two link crossings of the one-way delay `d`). The
//!   multi-core station is Seidmann's approximation: a queue with demand `D/k` plus a delay
//!   of `D(k-1)/k`. Calibrated on the 1-server runs (`D` from the machine's busy CPU per
//!   operation with 4 clients, `Z` from one client's latency) and on the 0-delay network
//!   run (the proxy's CPU per operation), validated on every other measured point (error in
//!   the report), then extrapolated to 64 and 256 servers that each have a core of their
//!   own, the busiest server (placement balance) bounding the total.

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use plusfs_placement::{ClusterMap, ServerEntry};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Subcommand)]
pub enum SimCmd {
    /// Placement balance and moved fraction for N servers (real straw2 code).
    Placement {
        /// Server counts.
        #[arg(long, value_delimiter = ',', default_value = "16,64,256,1024")]
        servers: Vec<u32>,
        /// Directory paths placed per server.
        #[arg(long, default_value_t = 300)]
        dirs_per_server: u32,
    },
    /// Fit the rate model to measured runs, report its error, extrapolate.
    Rates(RatesArgs),
}

#[derive(Args)]
pub struct RatesArgs {
    /// Loopback runs of 1, 2, 4, 8 servers (scripts/model_calibrate.sh).
    #[arg(long)]
    calibration: PathBuf,
    /// Runs on the private network at several delays (scripts/network_bench.sh).
    #[arg(long)]
    network: PathBuf,
    /// Cores of the measuring machine (default: this machine's).
    #[arg(long)]
    cores: Option<f64>,
}

pub fn run(c: SimCmd) -> Result<ExitCode> {
    match c {
        SimCmd::Placement { servers, dirs_per_server } => placement(&servers, dirs_per_server),
        SimCmd::Rates(a) => rates(&a),
    }
    .map(|_| ExitCode::SUCCESS)
}

fn map_of(n: u32) -> ClusterMap {
    ClusterMap::with_servers((0..n).map(|id| ServerEntry::new(id, format!("sim:{id}"), 1.0)).collect())
}

/// The synthetic directory paths placed for `n` servers (`per_server` each).
fn sim_dirs(n: u32, per_server: u32) -> impl Iterator<Item = String> {
    (0..n as u64 * per_server as u64).map(|i| format!("/u{}/d{}", i % 997, i))
}

/// Directories per server of `map` for the synthetic paths.
fn loads(map: &ClusterMap, per_server: u32) -> Vec<u64> {
    let mut load = vec![0u64; map.servers.len()];
    for p in sim_dirs(map.servers.len() as u32, per_server) {
        load[map.home_of_dir(&p) as usize] += 1;
    }
    load
}

/// The mean share of directories over the busiest server's (1: perfect balance).
fn balance(load: &[u64]) -> f64 {
    let total: u64 = load.iter().sum();
    (total as f64 / load.len() as f64) / *load.iter().max().expect("servers") as f64
}

/// Prints, per server count, the busiest and idlest server's share of directories
/// against the mean, and the fraction that moves when one more server joins.
fn placement(servers: &[u32], per_server: u32) -> Result<()> {
    println!(
        "| servers | dirs | busiest / mean | idlest / mean | moved when one joins | ideal 1/(N+1) | moved / ideal |"
    );
    println!("|---|---|---|---|---|---|---|");
    for &n in servers {
        if n == 0 {
            bail!("a cluster has at least one server");
        }
        let (now, grown) = (map_of(n), map_of(n + 1));
        let dirs = n as u64 * per_server as u64;
        let load = loads(&now, per_server);
        let moved = sim_dirs(n, per_server).filter(|p| grown.home_of_dir(p) != now.home_of_dir(p)).count() as u64;
        let mean = dirs as f64 / n as f64;
        let max = *load.iter().max().expect("servers") as f64;
        let min = *load.iter().min().expect("servers") as f64;
        let frac = moved as f64 / dirs as f64;
        let ideal = 1.0 / (n as f64 + 1.0);
        println!(
            "| {n} | {dirs} | {:.2} | {:.2} | {:.4} | {ideal:.4} | {:.2} |",
            max / mean,
            min / mean,
            frac,
            frac / ideal
        );
    }
    Ok(())
}

/// One measured rate: configuration → median operations per second (and CPU per op).
#[derive(Default)]
struct Point {
    rates: Vec<f64>,
    busy_per_op: Vec<f64>,
    server_per_op: Vec<f64>,
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn lines(path: &Path) -> Result<Vec<serde_json::Value>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    text.lines()
        .filter(|l| l.trim_start().starts_with('{'))
        .map(|l| serde_json::from_str(l).with_context(|| format!("bad JSON line in {}", path.display())))
        .collect()
}

/// One-way delay in µs of a network run's label (`loopback` has none and no proxy).
fn delay_us(label: &str) -> Option<f64> {
    match label {
        "loopback" => None,
        l => plusfs_netns::shape::parse_duration_us(l).ok().map(|d| d as f64),
    }
}

fn rates(a: &RatesArgs) -> Result<()> {
    let cores = a.cores.unwrap_or_else(|| std::thread::available_parallelism().map_or(2.0, |n| n.get() as f64));
    // Loopback points: (servers, clients, phase).
    let mut cal: BTreeMap<(u64, u64, String), Point> = BTreeMap::new();
    for d in lines(&a.calibration)? {
        let key = (
            d["servers"].as_u64().unwrap_or(0),
            d["clients"].as_u64().unwrap_or(0),
            d["phase"].as_str().unwrap_or("").to_string(),
        );
        let ops = d["ops"].as_f64().unwrap_or(0.0).max(1.0);
        let p = cal.entry(key).or_default();
        p.rates.push(d["ops_per_sec"].as_f64().unwrap_or(0.0));
        p.busy_per_op.push(d["busy_cpu"].as_f64().unwrap_or(0.0) / ops);
        p.server_per_op.push(d["server_cpu"].as_f64().unwrap_or(0.0) / ops);
    }
    // Network points: (delay label, phase) of the unbatched batch part, 4 clients, 8 servers.
    let mut net: BTreeMap<(String, String), Vec<f64>> = BTreeMap::new();
    let mut net_clients = 4.0;
    for d in lines(&a.network)? {
        if d["part"] == "batch" && d["batch"].as_u64() == Some(1) {
            net_clients = d["clients"].as_f64().unwrap_or(4.0);
            let key = (d["delay"].as_str().unwrap_or("").to_string(), d["phase"].as_str().unwrap_or("").to_string());
            net.entry(key).or_default().push(d["ops_per_sec"].as_f64().unwrap_or(0.0));
        }
    }
    println!("Cores of the measuring machine: {cores}.\n");
    println!("| phase | point | measured ops/s | model ops/s | error | role |");
    println!("|---|---|---|---|---|---|");
    let mut worst: f64 = 0.0;
    // Placement balance of the extrapolated clusters, computed once for every phase.
    let balances: Vec<(u32, f64)> = [64u32, 256].into_iter().map(|n| (n, balance(&loads(&map_of(n), 300)))).collect();
    for phase in ["create", "stat", "unlink"] {
        let get = |n: u64, c: u64| cal.get(&(n, c, phase.to_string()));
        let (Some(one), Some(four)) = (get(1, 1), get(1, 4)) else { continue };
        // CPU per operation, and the rest of one client's latency with an idle machine.
        let cpu = median(&four.busy_per_op);
        let idle = (1.0 / median(&one.rates) - cpu).max(0.0);
        for ((n, c, ph), p) in &cal {
            if ph != phase {
                continue;
            }
            let role = if *n == 1 { "calibration" } else { "validation" };
            let m = mva(*c as usize, cpu, idle, cores);
            let got = median(&p.rates);
            let err = (m - got) / got;
            if role == "validation" {
                worst = worst.max(err.abs());
            }
            println!(
                "| {phase} | {n} servers, {c} clients, loopback | {got:.0} | {m:.0} | {:+.0} % | {role} |",
                err * 100.0
            );
        }
        // The proxies' CPU per operation from the 0-delay network run; then the delays.
        let Some(zero) = net.get(&("0us".to_string(), phase.to_string())) else { continue };
        let clients = net_clients as usize;
        let proxy = solve_extra_cpu(median(zero), clients, cpu, idle, cores);
        for ((label, ph), r) in &net {
            if ph != phase {
                continue;
            }
            let Some(d) = delay_us(label) else { continue };
            let m = mva(clients, cpu + proxy, idle + 2.0 * d * 1e-6, cores);
            let got = median(r);
            let err = (m - got) / got;
            let role = if label == "0us" { "calibration (proxy CPU)" } else { "validation" };
            if role == "validation" {
                worst = worst.max(err.abs());
            }
            println!(
                "| {phase} | 8 servers, {net_clients} clients, delay {label} | {got:.0} | {m:.0} | {:+.0} % | {role} |",
                err * 100.0
            );
        }
        println!(
            "| {phase} | fitted | | | | CPU {:.0} µs/op, other latency {:.0} µs/op, proxies' CPU {:.0} µs/op |",
            cpu * 1e6,
            idle * 1e6,
            proxy * 1e6
        );
        extrapolate(phase, &cal, idle, proxy, &balances);
    }
    println!("\nLargest validation error: {:.0} %.", worst * 100.0);
    Ok(())
}

/// Throughput of `clients` closed-loop clients whose operations each need `cpu` seconds
/// on a station of `cores` cores and `other` seconds elsewhere (exact mean-value analysis
/// over the client count, Seidmann's approximation for the cores).
fn mva(clients: usize, cpu: f64, other: f64, cores: f64) -> f64 {
    let (queue_demand, fixed) = (cpu / cores, other + cpu * (cores - 1.0) / cores);
    let (mut x, mut q) = (0.0, 0.0);
    for n in 1..=clients {
        let r = queue_demand * (1.0 + q);
        x = n as f64 / (fixed + r);
        q = x * r;
    }
    x
}

/// The extra CPU per operation that makes the model give `rate` (bisection).
fn solve_extra_cpu(rate: f64, clients: usize, cpu: f64, other: f64, cores: f64) -> f64 {
    let (mut lo, mut hi) = (-cpu, 0.01);
    for _ in 0..100 {
        let mid = (lo + hi) / 2.0;
        match mva(clients, cpu + mid, other, cores) > rate {
            true => lo = mid,
            false => hi = mid,
        }
    }
    (lo + hi) / 2.0
}

/// Aggregate rates for 64 and 256 servers, each on a core of its own with clients on
/// hosts of their own, over links of 100 µs and 1 ms: per-server capacity from the
/// servers' own CPU per operation, the busiest server (placement balance) bounding all.
fn extrapolate(phase: &str, cal: &BTreeMap<(u64, u64, String), Point>, idle: f64, proxy: f64, balances: &[(u32, f64)]) {
    let Some(p) = cal.get(&(1, 4, phase.to_string())) else { return };
    let server_cpu = median(&p.server_per_op);
    for &(n, balance) in balances {
        // The busiest server sees 1/balance times its share: as if every server had
        // `balance` of a core. Clients' own CPU is on their hosts (in `other`).
        let capacity = n as f64 * balance / server_cpu;
        for d in [100.0, 1000.0] {
            for c in [n as usize, 16 * n as usize] {
                let other = idle + proxy.max(0.0) + 2.0 * d * 1e-6;
                let x = mva(c, server_cpu, other, n as f64 * balance);
                println!(
                    "| {phase} | predicted: {n} servers, {c} clients, delay {d} µs | | {x:.0} | | {:.0} % of the servers' capacity |",
                    100.0 * x / capacity
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_value_analysis_has_the_right_limits() {
        // One client: no queueing, one operation per (cpu + other).
        assert!((mva(1, 50e-6, 150e-6, 2.0) - 1.0 / 200e-6).abs() < 1.0);
        // Many clients: the cores saturate at cores / cpu.
        let x = mva(500, 50e-6, 150e-6, 2.0);
        assert!(x <= 1.0001 * 2.0 / 50e-6 && x > 0.97 * 2.0 / 50e-6, "{x}");
        // More delay, fewer operations; solving for extra CPU inverts the model.
        assert!(mva(4, 50e-6, 1e-3, 2.0) < mva(4, 50e-6, 1e-4, 2.0));
        let extra = solve_extra_cpu(mva(4, 80e-6, 100e-6, 2.0), 4, 50e-6, 100e-6, 2.0);
        assert!((extra - 30e-6).abs() < 1e-7, "{extra}");
    }

    #[test]
    fn durations_of_network_labels() {
        assert_eq!(delay_us("loopback"), None);
        assert_eq!(delay_us("100us"), Some(100.0));
        assert_eq!(delay_us("1ms"), Some(1000.0));
    }
}
