//! A hostile client next to honest ones, on a real TLS cluster: what one user sends cannot
//! grow a server's memory past its budgets, hold its descriptors with half-open handshakes
//! or idle connections, or keep other users waiting.

mod common;

use common::{rss_mib, ProcCluster};
use plusfs_client::{Client, ClientOptions};
use plusfs_proto::{encode_request, Cred, Request};
use plusfs_tls::{Authority, ClientTls, Identity, Ranges, Role, RootClaim, TlsFiles, Validity};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

type Tls = plusfs_tls::tokio_rustls::client::TlsStream<TcpStream>;

/// Settings of the clusters here: idle client connections (and clients that read no
/// reply) are closed after 4 s, so the tests see it happen.
fn settings() -> plusfs_localcluster::ClusterSettings {
    plusfs_localcluster::ClusterSettings { idle_secs: Some(4), ..Default::default() }
}

/// Issues a user certificate `name` (uids and gids 1000-1999) of `tc`'s CA into `dir`.
fn issue_user(tc: &ProcCluster, dir: &Path, name: &str) -> PathBuf {
    let ca = Authority::load(&tc.cluster.data().join("certs/ca")).unwrap();
    let role = Role::User {
        uids: Ranges::parse("1000-1999").unwrap(),
        gids: Ranges::parse("1000-1999").unwrap(),
        root: RootClaim::Squash,
    };
    let out = dir.join(name);
    ca.issue(&Identity { name: name.into(), role }, Validity::days(1), &out).unwrap();
    out
}

fn client_as(tc: &ProcCluster, identity: &Path) -> Client {
    let mut map = tc.cluster.map().clone();
    map.tls.identity = Some(identity.to_path_buf());
    Client::new(map, ClientOptions { retries: 1, ..Default::default() })
}

/// A TLS connection to server 0 presenting `identity`, for raw frames.
async fn tls_raw(tc: &ProcCluster, identity: &Path) -> Tls {
    let ca = tc.cluster.map().tls.ca.clone().unwrap();
    let tls = ClientTls::load(&TlsFiles { ca, identity: identity.to_path_buf() }).unwrap();
    let tcp = TcpStream::connect(&tc.cluster.map().servers[0].address).await.unwrap();
    tls.connect(tcp).await.unwrap()
}

fn logged(tc: &ProcCluster, what: &str) -> usize {
    tc.cluster.logs().iter().map(|p| std::fs::read_to_string(p).unwrap_or_default().matches(what).count()).sum()
}

/// Reads whatever `s` yields until it ends (EOF or an error) or `limit` passes: true if
/// it ended, i.e. the server closed the connection.
async fn closed_within<S: tokio::io::AsyncRead + Unpin>(s: &mut S, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

/// Six users pipeline 15 MB reads on four connections each and never read the replies:
/// the server's memory stays bounded (its budgets fill, it stops reading them), another
/// user and an admin are served meanwhile, and the hogs' connections are closed once they
/// read nothing for the idle limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_users_neither_grow_a_server_nor_hold_up_others() {
    let tc = ProcCluster::start_settings(1, &settings());
    let t = tempfile::tempdir().unwrap();
    let admin = tc.client();
    admin.create("/big", 0o644, true).await.unwrap();
    admin.write("/big", 0, &vec![3u8; 15 << 20]).await.unwrap();
    let pid = tc.cluster.pid(0).expect("server pid");
    let before = rss_mib(pid);

    let read = Request::Read { path: "/big".into(), offset: 0, len: 15 << 20 };
    let mut hogs = Vec::new();
    for u in 0..6 {
        let id = issue_user(&tc, t.path(), &format!("hog{u}"));
        for _ in 0..4 {
            let mut s = tls_raw(&tc, &id).await;
            let read = read.clone();
            hogs.push(tokio::spawn(async move {
                let mut sent = 0;
                for i in 0..100 {
                    let frame = encode_request(i, &Cred::new(1000, 1000, vec![]), &read).unwrap().to_bytes();
                    // The server stops reading a connection over budget: the writes block.
                    match tokio::time::timeout(Duration::from_secs(2), s.write_all(&frame)).await {
                        Ok(Ok(())) => sent += 1,
                        _ => break,
                    }
                }
                (s, sent)
            }));
        }
    }
    let honest = client_as(&tc, &issue_user(&tc, t.path(), "honest"));
    let mut peak = before;
    let mut honest_waits = Vec::new();
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        peak = peak.max(rss_mib(pid));
        let t0 = Instant::now();
        honest.stat("/big").await.expect("another user is served");
        honest_waits.push(t0.elapsed());
        admin.lstat("/").await.expect("an admin is served");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut held = Vec::new();
    for h in hogs {
        let (s, sent) = h.await.unwrap();
        assert!(sent > 0);
        held.push(s);
    }
    peak = peak.max(rss_mib(pid));
    let slowest = honest_waits.iter().max().unwrap();
    eprintln!(
        "server RSS {before} MiB before, {peak} MiB at most under 24 hog connections; honest stat at most {slowest:?}"
    );
    assert!(peak < 512, "server RSS {before} -> {peak} MiB under unread replies");
    assert!(*slowest < Duration::from_secs(2), "an honest user waited {slowest:?}");

    // The hogs read nothing: the server closes them after the idle limit.
    for s in held.iter_mut() {
        assert!(closed_within(s, Duration::from_secs(20)).await, "a hog's connection stayed open");
    }
    assert!(logged(&tc, "its replies cannot be sent") >= 1);
    honest.stat("/big").await.expect("served after the attack");
}

/// Connections that never finish (or never start) a TLS handshake: at most
/// `PENDING_PER_ADDRESS` from one address wait, the rest are closed at once, the waiting
/// ones are closed after the handshake limit, and clients from other addresses connect
/// and are served meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_open_handshakes_are_bounded_and_timed_out() {
    let tc = ProcCluster::start_settings(1, &settings());
    let addr: std::net::SocketAddr = tc.cluster.map().servers[0].address.parse().unwrap();
    let attacker: std::net::SocketAddr = "127.0.0.2:0".parse().unwrap();
    let mut loris = Vec::new();
    for _ in 0..100 {
        let sock = TcpSocket::new_v4().unwrap();
        sock.bind(attacker).unwrap();
        let mut s = sock.connect(addr).await.unwrap();
        // Half a TLS record header, then nothing.
        s.write_all(&[0x16, 0x03]).await.unwrap();
        loris.push(s);
    }
    let t0 = Instant::now();
    tc.client().lstat("/").await.expect("another address is served");
    let served_in = t0.elapsed();
    let rss = rss_mib(tc.cluster.pid(0).expect("server pid"));
    eprintln!("server RSS {rss} MiB with 100 half-open connections");
    assert!(rss < 512, "{rss} MiB");
    let checks = loris.into_iter().map(|mut s| async move {
        let closed = closed_within(&mut s, Duration::from_millis(500)).await;
        (closed, s)
    });
    let checked = futures::future::join_all(checks).await;
    let refused_at_once = checked.iter().filter(|(closed, _)| *closed).count();
    let mut waiting: Vec<TcpStream> = checked.into_iter().filter(|(c, _)| !c).map(|(_, s)| s).collect();
    eprintln!("{refused_at_once} of 100 half-open connections refused at once; an admin served in {served_in:?}");
    assert!(served_in < Duration::from_secs(2), "{served_in:?}");
    assert!(refused_at_once >= 30, "only {refused_at_once} refused at once");
    assert!(!waiting.is_empty() && waiting.len() <= 64, "{} waiting", waiting.len());
    let started = Instant::now();
    let closes = waiting.iter_mut().map(|s| closed_within(s, Duration::from_secs(15)));
    let closed = futures::future::join_all(closes).await;
    assert!(closed.iter().all(|c| *c), "a half-open handshake stayed open");
    assert!(started.elapsed() >= Duration::from_secs(5), "closed before the handshake limit");
    eprintln!("the waiting ones were closed after {:?}", started.elapsed());
    assert!(logged(&tc, "no TLS handshake within") >= 1);
    assert!(logged(&tc, "too many handshakes under way") >= 1);
}

/// A client connection idle past `[tls] idle_secs` is closed by the server; a client
/// reopens a connection idle half as long before using it, so its calls never fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_and_clients_reopen_them() {
    let tc = ProcCluster::start_settings(1, &settings());
    let t = tempfile::tempdir().unwrap();
    let alice = issue_user(&tc, t.path(), "alice");
    let mut raw = tls_raw(&tc, &alice).await;
    let ping = encode_request(1, &Cred::new(1000, 1000, vec![]), &Request::Ping).unwrap().to_bytes();
    raw.write_all(&ping).await.unwrap();
    let t0 = Instant::now();
    assert!(closed_within(&mut raw, Duration::from_secs(12)).await, "an idle connection stayed open");
    let after = t0.elapsed();
    assert!(after >= Duration::from_secs(3), "closed after {after:?}, before the idle limit");

    // Many idle connections of one user: each holds a little memory, up to the cap.
    let mut idle = Vec::new();
    for _ in 0..200 {
        idle.push(tls_raw(&tc, &alice).await);
    }
    let rss = rss_mib(tc.cluster.pid(0).expect("server pid"));
    eprintln!("server RSS {rss} MiB with 200 idle connections of one user");
    assert!(rss < 512, "{rss} MiB");
    drop(idle);

    let c = client_as(&tc, &alice);
    c.lstat("/").await.unwrap();
    for pause in [1, 3, 5] {
        tokio::time::sleep(Duration::from_secs(pause)).await;
        c.lstat("/").await.unwrap_or_else(|e| panic!("a call after {pause} s idle failed: {e}"));
    }
    assert!(logged(&tc, "closing connection idle") >= 1);
}

/// The home of a distributed directory inside another user's closed directory tells a
/// stranger who asks it for an entry nothing: `EACCES`, not a redirect naming the
/// directory's inode number and servers. Its owner is redirected and reaches the entries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_distributed_directory_behind_a_closed_one_tells_strangers_nothing() {
    use plusfs_proto::{Errno, Threshold};
    let tc = ProcCluster::start_settings(3, &settings());
    let t = tempfile::tempdir().unwrap();
    let admin = tc.client();
    admin.mkdir("/priv", 0o700).await.unwrap();
    admin.chown("/priv", Some(1000), Some(1000)).await.unwrap();
    admin.mkdir_with("/priv/huge", 0o777, Threshold::Entries(0), 0).await.unwrap();
    let home = tc.cluster.map().home_of_dir("/priv/huge");
    let id = issue_user(&tc, t.path(), "users");
    let as_user = |uid: u32| {
        let mut map = tc.cluster.map().clone();
        map.tls.identity = Some(id.clone());
        Client::new(map, ClientOptions { uid, gid: uid, groups: vec![], retries: 1, ..Default::default() })
    };
    let (owner, stranger) = (as_user(1000), as_user(1001));
    let probe = Request::Stat { path: "/priv/huge/x".into() };
    let e = owner.call_server(home, &probe).await.unwrap_err();
    assert_eq!(e.errno, Errno::EREMCHG, "the owner is sent to the shards: {e}");
    owner.create("/priv/huge/x", 0o644, true).await.unwrap();
    let e = stranger.call_server(home, &probe).await.unwrap_err();
    assert_eq!(e.errno, Errno::EACCES, "a stranger is refused, not redirected: {e}");
    let told = format!("{e:?}");
    assert!(!told.contains("entries are on servers") && !told.contains("redirect"), "{told}");
    assert_eq!(stranger.lstat("/priv/huge/x").await.unwrap_err().errno, Errno::EACCES);
}
