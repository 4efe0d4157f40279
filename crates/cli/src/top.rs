//! `plusfs top`: operations per second and p99 latency of every server, refreshed each
//! second, read from the servers' metrics endpoints (for operators without a Prometheus).

use anyhow::{bail, Context, Result};
use plusfs_placement::{ClusterMap, ServerEntry};
use std::collections::HashMap;
use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct TopArgs {
    /// Seconds between refreshes.
    #[arg(long, default_value_t = 1.0)]
    interval: f64,
    /// Stop after this many refreshes (default: until interrupted).
    #[arg(long)]
    count: Option<u64>,
}

/// What one scrape of one process says about requests.
#[derive(Default, Clone)]
struct Sample {
    /// Requests served, by operation.
    by_op: HashMap<String, f64>,
    /// Cumulative bucket counts over all operations, by upper bound.
    buckets: Vec<(f64, f64)>,
    connections: f64,
}

/// One metric line of the text format: name, labels, value.
fn parse_line(line: &str) -> Option<(&str, HashMap<&str, &str>, f64)> {
    let (series, value) = line.rsplit_once(' ')?;
    let value: f64 = value.parse().ok()?;
    let (name, labels) = match series.split_once('{') {
        Some((name, rest)) => {
            let body = rest.strip_suffix('}')?;
            let labels = body
                .split(',')
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.trim(), v.trim().trim_matches('"')))
                .collect();
            (name, labels)
        }
        None => (series, HashMap::new()),
    };
    Some((name, labels, value))
}

fn parse(text: &str) -> Sample {
    let mut s = Sample::default();
    let mut buckets: HashMap<String, f64> = HashMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let Some((name, labels, value)) = parse_line(line) else { continue };
        match name {
            "plusfs_request_duration_seconds_count" => {
                *s.by_op.entry(labels.get("op").copied().unwrap_or("?").to_string()).or_default() += value;
            }
            "plusfs_request_duration_seconds_bucket" => {
                *buckets.entry(labels.get("le").copied().unwrap_or("+Inf").to_string()).or_default() += value;
            }
            "plusfs_connections" => s.connections += value,
            _ => {}
        }
    }
    let mut b: Vec<(f64, f64)> = buckets
        .into_iter()
        .map(|(le, n)| (if le == "+Inf" { f64::INFINITY } else { le.parse().unwrap_or(0.0) }, n))
        .collect();
    b.sort_by(|x, y| x.0.total_cmp(&y.0));
    s.buckets = b;
    s
}

/// The 99th percentile of what happened between two samples (upper bound of its bucket).
fn p99(prev: &Sample, cur: &Sample) -> Option<f64> {
    let before: HashMap<u64, f64> = prev.buckets.iter().map(|(le, n)| (le.to_bits(), *n)).collect();
    let delta: Vec<(f64, f64)> =
        cur.buckets.iter().map(|(le, n)| (*le, n - before.get(&le.to_bits()).copied().unwrap_or(0.0))).collect();
    let total = delta.last()?.1;
    if total <= 0.0 {
        return None;
    }
    delta.iter().find(|(_, n)| *n >= 0.99 * total).map(|(le, _)| *le)
}

/// `GET /metrics` from `addr`.
fn scrape(addr: &str) -> Result<String> {
    let sock = addr.parse().with_context(|| format!("metrics address '{addr}'"))?;
    let mut s = std::net::TcpStream::connect_timeout(&sock, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    write!(s, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    let (head, body) = out.split_once("\r\n\r\n").context("no HTTP answer")?;
    if !head.starts_with("HTTP/1.1 200") {
        bail!("{}", head.lines().next().unwrap_or(""));
    }
    Ok(body.to_string())
}

/// The metrics addresses of a slot: its members' or its own.
fn endpoints(s: &ServerEntry) -> Vec<String> {
    match s.members.is_empty() {
        true => s.metrics.iter().cloned().collect(),
        false => s.members.iter().filter_map(|m| m.metrics.clone()).collect(),
    }
}

/// One slot's sample: the sum over its processes that answered.
fn sample_slot(s: &ServerEntry) -> Option<Sample> {
    let mut total: Option<Sample> = None;
    for text in endpoints(s).iter().filter_map(|a| scrape(a).ok()) {
        let one = parse(&text);
        let t = total.get_or_insert_with(Sample::default);
        for (op, n) in one.by_op {
            *t.by_op.entry(op).or_default() += n;
        }
        for (le, n) in one.buckets {
            match t.buckets.iter_mut().find(|(l, _)| *l == le) {
                Some(b) => b.1 += n,
                None => t.buckets.push((le, n)),
            }
        }
        t.buckets.sort_by(|x, y| x.0.total_cmp(&y.0));
        t.connections += one.connections;
    }
    total
}

fn row(id: u32, prev: Option<&Sample>, cur: Option<&Sample>, secs: f64) -> String {
    let (Some(prev), Some(cur)) = (prev, cur) else {
        return format!("{id:>6}  {:>10}  {:>10}  {:>5}  (no metrics endpoint answered)", "-", "-", "-");
    };
    let mut rates: Vec<(String, f64)> = cur
        .by_op
        .iter()
        .map(|(op, n)| (op.clone(), (n - prev.by_op.get(op).copied().unwrap_or(0.0)) / secs))
        .filter(|(_, r)| *r > 0.0)
        .collect();
    rates.sort_by(|a, b| b.1.total_cmp(&a.1));
    let total: f64 = rates.iter().map(|(_, r)| r).sum();
    let p99 = match p99(prev, cur) {
        Some(s) if s.is_finite() => format!("{:.2} ms", s * 1e3),
        Some(_) => "> 42 s".into(),
        None => "-".into(),
    };
    let top: Vec<String> = rates.iter().take(4).map(|(op, r)| format!("{op} {r:.0}/s")).collect();
    format!("{id:>6}  {total:>10.1}  {p99:>10}  {:>5}  {}", cur.connections, top.join(", "))
}

pub fn run(a: TopArgs, cluster: Option<PathBuf>) -> Result<()> {
    let map = ClusterMap::load(cluster.as_ref().context("no cluster map: pass --cluster FILE or set PLUSFS_CLUSTER")?)?;
    if map.servers.iter().all(|s| endpoints(s).is_empty()) {
        bail!("no server of this cluster has a metrics address (`metrics = \"HOST:PORT\"` in the map)");
    }
    if !(0.1..=3600.0).contains(&a.interval) {
        bail!("--interval must be between 0.1 and 3600 seconds");
    }
    let interval = Duration::from_secs_f64(a.interval);
    let tty = std::io::stdout().is_terminal();
    let mut prev: Vec<Option<Sample>> = map.servers.iter().map(sample_slot).collect();
    let mut at = Instant::now();
    let mut shown = 0;
    while a.count.is_none_or(|n| shown < n) {
        std::thread::sleep(interval);
        let cur: Vec<Option<Sample>> = map.servers.iter().map(sample_slot).collect();
        let secs = at.elapsed().as_secs_f64();
        at = Instant::now();
        let mut out = String::new();
        if tty {
            out.push_str("\x1b[H\x1b[2J");
        }
        out.push_str(&format!("plusfs top: {} servers, every {:.1} s\n", map.servers.len(), a.interval));
        out.push_str(&format!("{:>6}  {:>10}  {:>10}  {:>5}  top operations\n", "server", "ops/s", "p99", "conns"));
        for (i, s) in map.servers.iter().enumerate() {
            out.push_str(&row(s.id, prev[i].as_ref(), cur[i].as_ref(), secs));
            out.push('\n');
        }
        print!("{out}");
        std::io::stdout().flush()?;
        prev = cur;
        shown += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_p99_come_from_deltas() {
        let t0 = "# HELP x\nplusfs_request_duration_seconds_bucket{op=\"stat\",le=\"0.001\"} 10\n\
                  plusfs_request_duration_seconds_bucket{op=\"stat\",le=\"0.002\"} 10\n\
                  plusfs_request_duration_seconds_bucket{op=\"stat\",le=\"+Inf\"} 10\n\
                  plusfs_request_duration_seconds_count{op=\"stat\"} 10\nplusfs_connections 3\n";
        let t1 = t0.replace("} 10", "} 110").replace("le=\"0.001\"} 110", "le=\"0.001\"} 20");
        let (a, b) = (parse(t0), parse(&t1));
        assert_eq!(b.connections, 3.0);
        assert_eq!(b.by_op["stat"], 110.0);
        // 100 new requests, 10 under 1 ms, the rest under 2 ms: p99 is the 2 ms bucket.
        assert_eq!(p99(&a, &b), Some(0.002));
        assert!(row(0, Some(&a), Some(&b), 2.0).contains("50.0"));
        assert_eq!(p99(&b, &b), None);
    }
}
