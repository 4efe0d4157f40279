//! Mutual TLS and identities on a real cluster: connections without a valid certificate of
//! the cluster CA are refused without harm to the server or other connections; a user
//! identity acts only within its uid and gid ranges, its root squashed or refused; admin
//! and server-only requests need their role.

mod common;

use common::ProcCluster;
use plusfs_client::{Client, ClientOptions};
use plusfs_proto::{Cred, Errno, Reply, Request};
use plusfs_rpc::{Connection, Counters};
use plusfs_tls::{Authority, ClientTls, Identity, Ranges, Role, RootClaim, TlsFiles, Validity};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The cluster CA of `tc` (the one `cluster up` made).
fn cluster_ca(tc: &ProcCluster) -> Authority {
    Authority::load(&tc.cluster.data().join("certs/ca")).unwrap()
}

fn user(name: &str, root: RootClaim) -> Identity {
    let role =
        Role::User { uids: Ranges::parse("1000-1999").unwrap(), gids: Ranges::parse("1000-1999").unwrap(), root };
    Identity { name: name.into(), role }
}

/// A client of `tc` that presents the identity in `dir`.
fn client_as(tc: &ProcCluster, dir: &Path) -> Client {
    let mut map = tc.cluster.map().clone();
    map.tls.identity = Some(dir.to_path_buf());
    Client::new(map, ClientOptions { retries: 2, ..Default::default() })
}

/// One `Ping` over a new connection to server 0 presenting `identity` (a directory).
async fn ping_as(tc: &ProcCluster, ca: &Path, identity: &Path) -> Result<(), String> {
    let tls = ClientTls::load(&TlsFiles { ca: ca.to_path_buf(), identity: identity.to_path_buf() })
        .map_err(|e| e.to_string())?;
    let addr = &tc.cluster.map().servers[0].address;
    let c =
        Connection::connect_with(addr, Arc::new(Counters::default()), Some(&tls)).await.map_err(|e| e.to_string())?;
    match c.call(&Cred::server(), &Request::Ping).await.map_err(|e| e.to_string())? {
        Ok(Reply::Pong { .. }) => Ok(()),
        other => Err(format!("{other:?}")),
    }
}

/// Sends `bytes` on a plain TCP connection to server 0 and reads until it is closed.
fn raw_exchange(tc: &ProcCluster, bytes: &[u8]) -> Vec<u8> {
    let mut s = std::net::TcpStream::connect(&tc.cluster.map().servers[0].address).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let _ = s.write_all(bytes);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    out
}

fn refusals_logged(tc: &ProcCluster) -> usize {
    tc.cluster
        .logs()
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap_or_default().matches("connection refused").count())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_without_a_valid_certificate_are_refused_and_others_go_on() {
    let tc = ProcCluster::start(2);
    let t = tempfile::tempdir().unwrap();
    let ca_pem = tc.cluster.map().tls.ca.clone().expect("a cluster with TLS by default");
    let admin = tc.client();
    admin.mkdir("/kept", 0o755).await.unwrap();
    let ca = cluster_ca(&tc);
    ca.issue(&user("alice", RootClaim::Squash), Validity::days(1), &t.path().join("alice")).unwrap();
    ping_as(&tc, &ca_pem, &t.path().join("alice")).await.expect("a valid identity gets in");
    // A client of alice's that keeps its connections open across the revocation below.
    let alice = client_as(&tc, &t.path().join("alice")).as_caller(Cred::new(1500, 1500, vec![]));
    alice.lstat("/kept").await.expect("alice may look");

    // Another CA's certificate.
    let other = Authority::create(&t.path().join("other-ca")).unwrap();
    other.issue(&user("eve", RootClaim::Squash), Validity::days(1), &t.path().join("eve")).unwrap();
    let eve = ping_as(&tc, &ca_pem, &t.path().join("eve")).await.unwrap_err();
    assert!(eve.contains("TLS") || eve.contains("lost") || eve.contains("closed"), "{eve}");
    // An expired one of the right CA.
    let now = time::OffsetDateTime::now_utc();
    let old = Validity { not_before: now - time::Duration::days(3), not_after: now - time::Duration::days(1) };
    ca.issue(&user("old", RootClaim::Squash), old, &t.path().join("old")).unwrap();
    ping_as(&tc, &ca_pem, &t.path().join("old")).await.expect_err("an expired certificate is refused");
    // No certificate at all: a TLS client that presents none.
    let roots = {
        let mut r = plusfs_tls::tokio_rustls::rustls::RootCertStore::empty();
        r.add(first_der(&std::fs::read(&ca_pem).unwrap()).into()).unwrap();
        r
    };
    let config = plusfs_tls::tokio_rustls::rustls::ClientConfig::builder_with_provider(Arc::new(
        plusfs_tls::tokio_rustls::rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(&tc.cluster.map().servers[0].address).await.unwrap();
    let connector = plusfs_tls::tokio_rustls::TlsConnector::from(Arc::new(config));
    let name = plusfs_tls::tokio_rustls::rustls::pki_types::ServerName::try_from(plusfs_tls::SERVER_NAME).unwrap();
    let anonymous = async {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = connector.connect(name, tcp).await?;
        let frame = plusfs_proto::encode_request(1, &Cred::server(), &Request::Ping).unwrap().to_bytes();
        s.write_all(&frame).await?;
        let mut buf = [0u8; 1];
        s.read_exact(&mut buf).await
    };
    assert!(anonymous.await.is_err(), "a client without a certificate must get no answer");
    // Garbage, and a plain-text request, instead of a handshake: closed without an answer.
    assert!(raw_exchange(&tc, b"GET / HTTP/1.0\r\n\r\n garbage garbage").iter().all(|&b| b != b'P'));
    let plain = plusfs_proto::encode_request(1, &Cred::server(), &Request::Ping).unwrap().to_bytes();
    let answer = raw_exchange(&tc, &plain);
    assert!(plusfs_proto::Frame::parse(bytes::Bytes::from(answer)).is_err(), "no plusfs frame in plain text");
    // Revoked after issue: refused from the next connection on.
    let (code, out, err) = tc.cli(&["cert", "revoke", "--cert", t.path().join("alice/cert.pem").to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    let revoked = ping_as(&tc, &ca_pem, &t.path().join("alice")).await.unwrap_err();
    assert!(!revoked.is_empty());
    // Connections made before the revocation are closed at their next request (servers
    // look at the map every 2 s).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while alice.lstat("/kept").await.is_ok() {
        assert!(std::time::Instant::now() < deadline, "a revoked identity's open connection still serves");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The server is unharmed and so is the admitted client.
    admin.lstat("/kept").await.expect("the first client goes on");
    admin.mkdir("/after", 0o755).await.unwrap();
    assert!(refusals_logged(&tc) >= 6, "every refusal is logged: {}", refusals_logged(&tc));
    tc.assert_fsck_clean();
}

/// A certificate that expires while its connections are open: they close at their next
/// request, as a revoked one's do, and no new one is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_certificate_closes_its_open_connections() {
    let tc = ProcCluster::start(1);
    let t = tempfile::tempdir().unwrap();
    let ca_pem = tc.cluster.map().tls.ca.clone().expect("TLS");
    let now = time::OffsetDateTime::now_utc();
    let brief = Validity { not_before: now - time::Duration::hours(1), not_after: now + time::Duration::seconds(4) };
    cluster_ca(&tc).issue(&user("brief", RootClaim::Squash), brief, &t.path().join("brief")).unwrap();
    let tls = ClientTls::load(&TlsFiles { ca: ca_pem.clone(), identity: t.path().join("brief") }).unwrap();
    let addr = &tc.cluster.map().servers[0].address;
    let c = Connection::connect_with(addr, Arc::new(Counters::default()), Some(&tls)).await.unwrap();
    let alice = Cred::new(1000, 1000, vec![]);
    assert!(matches!(c.call(&alice, &Request::Ping).await, Ok(Ok(Reply::Pong { .. }))), "served while valid");
    tokio::time::sleep(Duration::from_secs(6)).await;
    let after = c.call(&alice, &Request::Ping).await;
    assert!(!matches!(after, Ok(Ok(_))), "an expired certificate's open connection still serves: {after:?}");
    assert!(!c.is_alive(), "the server closes the connection");
    ping_as(&tc, &ca_pem, &t.path().join("brief")).await.expect_err("and admits no new one");
    tc.assert_no_errors_logged();
}

/// Every file a cluster makes that holds users' data or a key is private: server data
/// directories 0700 (and all below them no one else's), logs 0600, keys 0600 in 0700
/// identity directories; `cert issue` refuses a directory another local user could have
/// prepared (world-writable, someone else's, a symbolic link).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_on_disk_are_private_and_keys_are_written_safely() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let tc = ProcCluster::start(2);
    let admin = tc.client();
    admin.create("/secret", 0o600, true).await.unwrap();
    admin.write("/secret", 0, &vec![7u8; 3 << 20]).await.unwrap();
    admin.fsync("/secret").await.unwrap();
    let data = tc.cluster.data();
    let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().mode() & 0o7777;
    let mut checked = 0;
    for s in 0..2 {
        let dir = data.join(format!("server-{s}"));
        assert_eq!(mode(&dir), 0o700, "{}", dir.display());
        let mut stack = vec![dir];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                let p = e.path();
                assert_eq!(mode(&p) & 0o077, 0, "{} is readable by others", p.display());
                checked += 1;
                if p.is_dir() {
                    stack.push(p);
                }
            }
        }
        assert_eq!(mode(&data.join(format!("server-{s}.log"))), 0o600);
    }
    assert!(checked > 10, "the walk saw the stores ({checked} entries)");
    for id in ["admin", "server"] {
        assert_eq!(mode(&data.join("certs").join(id)), 0o700);
        assert_eq!(mode(&data.join("certs").join(id).join("key.pem")), 0o600);
    }
    assert_eq!(mode(&data.join("certs/ca/ca.key")), 0o600);

    // `cert issue` into directories someone else may have prepared.
    let t = tempfile::tempdir().unwrap();
    let ca = cluster_ca(&tc);
    let alice = user("alice", RootClaim::Squash);
    let open = t.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let theirs = t.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(1000), Some(1000)).unwrap();
    let link = t.path().join("link");
    std::os::unix::fs::symlink(t.path().join("elsewhere"), &link).unwrap();
    std::fs::create_dir(t.path().join("elsewhere")).unwrap();
    for bad in [&open, &theirs, &link] {
        let e = ca.issue(&alice, Validity::days(1), bad).unwrap_err().to_string();
        assert!(e.contains("refusing"), "{}: {e}", bad.display());
        assert!(std::fs::read_dir(bad).unwrap().next().is_none(), "nothing written into {}", bad.display());
    }
    let mine = t.path().join("mine");
    std::fs::create_dir(&mine).unwrap();
    std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o700)).unwrap();
    ca.issue(&alice, Validity::days(1), &mine).expect("a private directory of mine");
    assert_eq!(mode(&mine.join("key.pem")), 0o600);
    let fresh = t.path().join("new/alice");
    ca.issue(&alice, Validity::days(1), &fresh).unwrap();
    assert_eq!(mode(&fresh), 0o700);
}

/// A bounded identity holds at most `[tls] conns_per_identity` connections to a server:
/// one more is closed after its handshake (logged), admins are served all along, and a
/// slot frees when one of its connections closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_identity_holds_a_bounded_number_of_connections() {
    let settings = plusfs_localcluster::ClusterSettings { conns_per_identity: Some(4), ..Default::default() };
    let tc = ProcCluster::start_settings(1, &settings);
    let t = tempfile::tempdir().unwrap();
    let ca_pem = tc.cluster.map().tls.ca.clone().unwrap();
    cluster_ca(&tc).issue(&user("alice", RootClaim::Squash), Validity::days(1), &t.path().join("alice")).unwrap();
    let tls = ClientTls::load(&TlsFiles { ca: ca_pem.clone(), identity: t.path().join("alice") }).unwrap();
    let addr = tc.cluster.map().servers[0].address.clone();
    let alice = Cred::new(1000, 1000, vec![]);
    let mut held = Vec::new();
    for _ in 0..4 {
        let c = Connection::connect_with(&addr, Arc::new(Counters::default()), Some(&tls)).await.unwrap();
        assert!(matches!(c.call(&alice, &Request::Ping).await, Ok(Ok(Reply::Pong { .. }))));
        held.push(c);
    }
    assert!(ping_as(&tc, &ca_pem, &t.path().join("alice")).await.is_err(), "a fifth connection is refused");
    tc.client().lstat("/").await.expect("an admin is served meanwhile");
    drop(held.pop());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while ping_as(&tc, &ca_pem, &t.path().join("alice")).await.is_err() {
        assert!(std::time::Instant::now() < deadline, "a closed connection's slot was not freed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(refusals_logged(&tc) >= 1);
}

/// The DER of the first certificate in PEM text `pem`.
fn first_der(pem: &[u8]) -> Vec<u8> {
    use plusfs_tls::tokio_rustls::rustls::pki_types::pem::PemObject;
    plusfs_tls::tokio_rustls::rustls::pki_types::CertificateDer::from_pem_slice(pem).unwrap().to_vec()
}

fn identity_dir(tc: &ProcCluster, t: &Path, id: Identity) -> PathBuf {
    let dir = t.join(&id.name);
    cluster_ca(tc).issue(&id, Validity::days(1), &dir).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identities_bound_the_uids_a_client_may_claim() {
    let tc = ProcCluster::start(2);
    let t = tempfile::tempdir().unwrap();
    let admin = tc.client();
    admin.mkdir("/home", 0o777).await.unwrap();
    admin.chmod("/home", 0o1777).await.unwrap();
    let alice = client_as(&tc, &identity_dir(&tc, t.path(), user("alice", RootClaim::Squash)));
    let bob = client_as(&tc, &identity_dir(&tc, t.path(), user("bob", RootClaim::Refuse)));

    // Within the ranges: acts as the claimed uid.
    let a = alice.as_caller(Cred::new(1500, 1500, vec![]));
    a.mkdir("/home/a", 0o755).await.unwrap();
    a.create("/home/a/f", 0o644, true).await.unwrap();
    assert_eq!(admin.lstat("/home/a/f").await.unwrap().uid, 1500);
    // Outside them: EACCES, nothing made.
    let outside = alice.as_caller(Cred::new(2500, 1500, vec![]));
    assert_eq!(outside.mkdir("/home/x", 0o755).await.unwrap_err().errno, Errno::EACCES);
    let bad_gid = alice.as_caller(Cred::new(1500, 7, vec![]));
    assert_eq!(bad_gid.create("/home/y", 0o644, true).await.unwrap_err().errno, Errno::EACCES);
    assert_eq!(admin.lstat("/home/x").await.unwrap_err().errno, Errno::ENOENT);
    assert_eq!(admin.lstat("/home/y").await.unwrap_err().errno, Errno::ENOENT);
    // Root squashed to nobody: what it makes is nobody's, and root's files stay closed.
    let root = alice.as_caller(Cred::server());
    root.mkdir("/home/r", 0o755).await.unwrap();
    root.create("/home/r/f", 0o644, true).await.unwrap();
    assert_eq!(admin.lstat("/home/r").await.unwrap().uid, plusfs_tls::NOBODY);
    assert_eq!(admin.lstat("/home/r/f").await.unwrap().uid, plusfs_tls::NOBODY);
    admin.mkdir("/private", 0o700).await.unwrap();
    assert_eq!(root.mkdir("/private/z", 0o755).await.unwrap_err().errno, Errno::EACCES);
    // Root refused outright for an identity without squash.
    assert_eq!(bob.as_caller(Cred::server()).mkdir("/home/b", 0o755).await.unwrap_err().errno, Errno::EPERM);

    // Admin and server-only requests need their role.
    let policy = alice.as_caller(Cred::new(1500, 1500, vec![]));
    let e = policy.set_policy("/home/a", Some(plusfs_proto::Threshold::Entries(10)), None).await.unwrap_err();
    assert_eq!(e.errno, Errno::EPERM, "{e}");
    let server_only = Request::TxAbort { txid: 1 };
    let e = alice.call_server(0, &server_only).await.unwrap_err();
    assert_eq!(e.errno, Errno::EPERM, "{e}");
    // What requests carry inside is bounded too: a delegation flush's callers, a client-driven
    // sub-operation's inode (only new directories), data records by number.
    let flush = Request::DelegFlush {
        dir: "/home".into(),
        id: 1,
        seq: 1,
        creds: vec![Cred::server()],
        ops: vec![],
        release: false,
    };
    assert_eq!(
        bob.as_caller(Cred::new(1500, 1500, vec![])).call_server(0, &flush).await.unwrap_err().errno,
        Errno::EPERM
    );
    let setuid_root = plusfs_proto::Inode::new(1, plusfs_proto::FileKind::File, 0o4755, 0, 0);
    let forged = Request::SubExec {
        ops: vec![plusfs_proto::SubOp::InsertEntry {
            dir: "/home".into(),
            name: "evil".into(),
            inode: setuid_root,
            replace: plusfs_proto::Replace::Never,
            shard: None,
        }],
    };
    assert_eq!(a.call_server(0, &forged).await.unwrap_err().errno, Errno::EPERM);
    assert_eq!(admin.lstat("/home/evil").await.unwrap_err().errno, Errno::ENOENT);
    // Records by number need a capability (or receipts).
    let drop = Request::DataDrop { records: vec![1, 2, 3], receipts: vec![] };
    assert_eq!(a.call_server(0, &drop).await.unwrap_err().errno, Errno::EACCES);
    let get = Request::DataGet { ranges: vec![(1, 0, 4096)], cap: None };
    assert_eq!(a.call_server(0, &get).await.unwrap_err().errno, Errno::EACCES);
    // A user's large I/O goes to the data servers under capabilities.
    let big: Vec<u8> = (0..(5u32 << 20) + 3).map(|i| (i % 253) as u8).collect();
    a.create("/home/a/big", 0o600, true).await.unwrap();
    a.write("/home/a/big", 0, &big).await.unwrap();
    assert_eq!(a.read_all("/home/a/big").await.unwrap(), big);
    let outsider = alice.as_caller(Cred::new(1600, 1600, vec![]));
    assert_eq!(outsider.read_all("/home/a/big").await.unwrap_err().errno, Errno::EACCES);
    let alice_dir = t.path().join("alice");
    for args in [&["cluster", "compact"][..], &["fsck"][..]] {
        let out = std::process::Command::new(common::exe())
            .args(args)
            .env("PLUSFS_CLUSTER", tc.cluster.map_file())
            .env("PLUSFS_IDENTITY", &alice_dir)
            .output()
            .unwrap();
        let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(!out.status.success() && said.contains("admin identity"), "{args:?}: {said}");
    }
    let (code, out, err) = tc.cli(&["cluster", "compact"]);
    assert_eq!(code, 0, "the cluster's admin identity may: {out}{err}");
    tc.assert_fsck_clean();
}
