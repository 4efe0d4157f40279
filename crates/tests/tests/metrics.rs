//! Metrics endpoints on a real cluster: every server process serves Prometheus text over
//! HTTP whose counters move with operations (histogram counts equal operation counts);
//! `plusfs top` reads them; a FUSE mount serves its own operation histograms.

mod common;
mod mounts;

use common::ProcCluster;
use plusfs_proto::{Cred, Request};
use plusfs_rpc::{Connection, Counters};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::sync::Arc;

/// `GET path` from `addr`: the status line and the body.
fn http_get(addr: &str, path: &str) -> (String, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    (head.lines().next().unwrap().to_string(), body.to_string())
}

/// The samples of a scrape by series (name and labels as written), checking the text
/// format on the way: every sample's family has a `# TYPE` line before it, every value is
/// a number.
fn samples(text: &str) -> HashMap<String, f64> {
    let mut typed = std::collections::HashSet::new();
    let mut out = HashMap::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            typed.insert(parts.next().unwrap().to_string());
            let kind = parts.next().unwrap();
            assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("bad sample line: {line}"));
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("bad value: {line}"));
        let name = series.split('{').next().unwrap();
        let family = ["_bucket", "_count", "_sum"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(name);
        assert!(typed.contains(name) || typed.contains(family), "no # TYPE before {line}");
        out.insert(series.to_string(), value);
    }
    out
}

fn scrape(addr: &str) -> HashMap<String, f64> {
    let (status, body) = http_get(addr, "/metrics");
    assert!(status.contains("200"), "{status}");
    samples(&body)
}

fn get(s: &HashMap<String, f64>, series: &str) -> f64 {
    s.get(series).copied().unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_serve_metrics_that_move_with_operations() {
    let tc = ProcCluster::start(2);
    let map = tc.cluster.map().clone();
    let addr = map.servers[0].metrics.clone().expect("cluster up gives every server a metrics address");
    let c = tc.client();
    c.mkdir("/m", 0o755).await.unwrap();
    let before = scrape(&addr);
    // Exactly 40 stats on server 0, over one connection.
    let conn = Connection::connect_to(&map.servers[0].address, Arc::new(Counters::default()), &map.tls).await.unwrap();
    for _ in 0..40 {
        conn.call(&Cred::server(), &Request::Stat { path: "/m".into() }).await.unwrap().ok();
    }
    // A scrape brings the status in at most every 0.5 s.
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    let after = scrape(&addr);
    let count = r#"plusfs_request_duration_seconds_count{op="stat"}"#;
    let moved = get(&after, count) - get(&before, count);
    assert_eq!(moved, 40.0, "the stat histogram counts every stat");
    let ops = r#"plusfs_ops_total{op="stat"}"#;
    assert_eq!(get(&after, ops) - get(&before, ops), moved, "histogram count equals the operation count");
    let inf = r#"plusfs_request_duration_seconds_bucket{op="stat",le="+Inf"}"#;
    assert_eq!(get(&after, inf), get(&after, count), "the +Inf bucket holds every observation");
    let small = r#"plusfs_request_duration_seconds_bucket{op="stat",le="0.00001"}"#;
    assert!(after.contains_key(small), "buckets start at 10 µs");
    for name in [
        "plusfs_connections",
        "plusfs_tls_handshakes_total",
        "plusfs_messages_in_total",
        "plusfs_store_write_seconds_count",
        "plusfs_store_fsync_seconds_count",
        "plusfs_cx_pending",
        "plusfs_twopc_in_doubt",
        "plusfs_data_segments",
        "plusfs_hugedirs_distributing",
    ] {
        assert!(after.contains_key(name), "{name} is exported");
    }
    assert!(get(&after, "plusfs_connections") >= 1.0);
    assert!(get(&after, "plusfs_tls_handshakes_total") >= 1.0);
    assert!(get(&after, "plusfs_messages_in_total") > get(&before, "plusfs_messages_in_total"));
    let (status, _) = http_get(&addr, "/other");
    assert!(status.contains("404"), "{status}");
    // `plusfs top`: one refresh, a row per server with its rate.
    let (code, out, err) = tc.cli(&["top", "--count", "1", "--interval", "0.5"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("ops/s") && out.lines().filter(|l| l.trim_start().starts_with(['0', '1'])).count() == 2,
        "{out}"
    );
    let (_, status, _) = tc.cli(&["cluster", "status"]);
    assert!(status.contains(&format!("http://{addr}/metrics")), "cluster status shows the endpoints: {status}");
}

/// Idle connections to a metrics endpoint (opened, nothing sent) take no answering slot:
/// a scrape meanwhile is answered.
#[test]
fn idle_connections_do_not_deny_scrapes() {
    let tc = ProcCluster::start(1);
    let addr = tc.cluster.map().servers[0].metrics.clone().expect("a metrics address");
    let idle: Vec<std::net::TcpStream> = (0..16).map(|_| std::net::TcpStream::connect(&addr).unwrap()).collect();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let (status, body) = http_get(&addr, "/metrics");
    assert!(status.contains("200"), "{status}: {body}");
    drop(idle);
}

#[test]
fn a_mount_serves_histograms_of_its_operations() {
    if !mounts::fuse_available() {
        return;
    }
    let tc = ProcCluster::start(2);
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let m = mounts::Mount::with_options(&tc, &[&format!("metrics={addr}")]);
    let before = scrape(&addr);
    for i in 0..25 {
        std::fs::create_dir(m.path().join(format!("d{i}"))).unwrap();
    }
    let after = scrape(&addr);
    let mkdir = r#"plusfs_fuse_request_duration_seconds_count{op="mkdir"}"#;
    assert_eq!(get(&after, mkdir) - get(&before, mkdir), 25.0, "one mkdir per directory made");
    drop(m);
}
