//! Bad input: POSIX errnos with the path in the message, and garbage on a server socket
//! that ends only its own connection.

mod common;

use common::{rss_mib, ProcCluster};
use plusfs_proto::{decode_response, encode_request, Cred, Errno, Frame, Request, MAX_FRAME_LEN};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posix_errors_name_the_path() {
    let cluster = ProcCluster::start(4);
    let c = cluster.client();
    c.mkdir("/d", 0o755).await.unwrap();
    c.mkdir("/d/full", 0o755).await.unwrap();
    c.create("/d/full/x", 0o644, true).await.unwrap();
    c.create("/d/f", 0o644, true).await.unwrap();

    let long_name = format!("/d/{}", "n".repeat(256));
    let long_path = "/abcdefg".repeat(600);
    let cases: Vec<(&str, Result<(), plusfs_client::FsError>, Errno)> = vec![
        ("long name", c.create(&long_name, 0o644, true).await.map(drop), Errno::ENAMETOOLONG),
        ("long path", c.mkdir(&long_path, 0o755).await.map(drop), Errno::ENAMETOOLONG),
        ("NUL", c.create("/d/a\0b", 0o644, true).await.map(drop), Errno::EINVAL),
        ("empty path", c.lstat("").await.map(drop), Errno::ENOENT),
        ("relative to /", c.lstat("d/nope").await.map(drop), Errno::ENOENT),
        ("dot target", c.rmdir("/d/.").await, Errno::EINVAL),
        ("dotdot target", c.mkdir("/d/..", 0o755).await.map(drop), Errno::EINVAL),
        ("mkdir existing", c.mkdir("/d", 0o755).await.map(drop), Errno::EEXIST),
        ("mkdir root", c.mkdir("/", 0o755).await.map(drop), Errno::EEXIST),
        ("missing parent", c.create("/nope/x", 0o644, true).await.map(drop), Errno::ENOENT),
        ("file as dir", c.create("/d/f/x", 0o644, true).await.map(drop), Errno::ENOTDIR),
        ("deep file as dir", c.mkdir("/d/f/x/y", 0o755).await.map(drop), Errno::ENOTDIR),
        ("rmdir file", c.rmdir("/d/f").await, Errno::ENOTDIR),
        ("rmdir non-empty", c.rmdir("/d/full").await, Errno::ENOTEMPTY),
        ("unlink dir", c.unlink("/d/full").await, Errno::EISDIR),
        ("unlink missing", c.unlink("/d/none").await, Errno::ENOENT),
        (
            "rename onto non-empty dir",
            c.rename("/d", "/e").await.and(c.rename("/e/full", "/e/full2").await).and({
                c.mkdir("/other", 0o755).await.unwrap();
                c.rename("/other", "/e").await
            }),
            Errno::ENOTEMPTY,
        ),
        ("rename dir onto file", c.rename("/e/full2", "/e/f").await, Errno::ENOTDIR),
        ("rename file onto dir", c.rename("/e/f", "/e/full2").await, Errno::EISDIR),
        ("rename into itself", c.rename("/e", "/e/full2/sub").await, Errno::EINVAL),
        ("readlink of file", c.readlink("/e/f").await.map(drop), Errno::EINVAL),
        ("excl create", c.create("/e/f", 0o644, true).await.map(drop), Errno::EEXIST),
    ];
    for (what, got, want) in cases {
        let e = got.expect_err(what);
        assert_eq!(e.errno, want, "{what}: {e}");
        assert!(e.to_string().contains('/') || e.path.is_empty(), "{what}: message names no path: {e}");
    }
    cluster.assert_fsck_clean();
}

#[test]
fn cli_messages_and_exit_codes() {
    let cluster = ProcCluster::start(2);
    let (code, _, err) = cluster.cli(&["mkdir", "/a/b"]);
    assert_eq!(code, 1);
    assert_eq!(err.trim(), "plusfs: cannot create directory '/a/b': No such file or directory");
    let (code, _, _) = cluster.cli(&["mkdir", "-p", "/a/b/c"]);
    assert_eq!(code, 0);
    let (code, _, _) = cluster.cli(&["touch", "/a/f1", "/a/f2"]);
    assert_eq!(code, 0);
    let (code, out, _) = cluster.cli(&["ls", "/a"]);
    assert_eq!((code, out.as_str()), (0, "b\nf1\nf2\n"));
    let (code, out, _) = cluster.cli(&["ls", "-la", "/a"]);
    assert_eq!(code, 0);
    assert!(out.lines().any(|l| l.starts_with("drwxr-xr-x") && l.ends_with(" b")), "{out}");
    assert!(out.lines().any(|l| l.ends_with(" ..")), "{out}");
    let (code, _, err) = cluster.cli(&["rm", "/a"]);
    assert_eq!((code, err.trim()), (1, "plusfs: cannot remove '/a': Is a directory"));
    let (code, _, _) = cluster.cli(&["ln", "-s", "/a/f1", "/a/l"]);
    assert_eq!(code, 0);
    let (code, out, _) = cluster.cli(&["readlink", "/a/l"]);
    assert_eq!((code, out.trim()), (0, "/a/f1"));
    let (_, out, _) = cluster.cli(&["stat", "/a/l"]);
    assert!(out.contains("symbolic link"), "{out}");
    let (_, out, _) = cluster.cli(&["stat", "-L", "/a/l"]);
    assert!(out.contains("regular file"), "{out}");
    let (code, _, err) = cluster.cli(&["ln", "-s", "loop", "/a/loop"]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = cluster.cli(&["stat", "-L", "/a/loop"]);
    assert_eq!((code, err.trim()), (1, "plusfs: cannot stat '/a/loop': Too many levels of symbolic links"));
    let data = cluster.cluster.data().to_str().unwrap().to_string();
    // `cluster up` on a running cluster starts nothing and says so.
    let (code, out, err) = cluster.cli(&["cluster", "up", "--data", &data, "--detach"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("all 2 server processes were already running"), "{out}");
    let (code, _, _) = cluster.cli(&["chmod", "600", "/a/f1"]);
    assert_eq!(code, 0);
    let (_, out, _) = cluster.cli(&["stat", "/a/f1"]);
    assert!(out.contains("(0600/-rw-------)"), "{out}");
    // Many operands: one batch per parent directory, errors per operand in order.
    let (code, _, err) = cluster.cli(&["touch", "/a/x1", "/nope/y", "/a/x2", "/a/x3", "/"]);
    assert_eq!(code, 1);
    assert_eq!(err.lines().collect::<Vec<_>>(), ["plusfs: cannot touch '/nope/y': No such file or directory"]);
    let (code, out, _) = cluster.cli(&["stat", "/a/x1", "/a/x3", "/"]);
    assert_eq!(code, 0);
    assert_eq!(out.matches("  File: ").count(), 3);
    let (code, _, err) = cluster.cli(&["rm", "/a/x1", "/a/x2", "/a/missing", "/a/x3"]);
    assert_eq!((code, err.trim()), (1, "plusfs: cannot remove '/a/missing': No such file or directory"));
    let (code, _, _) = cluster.cli(&["rm", "-f", "/a/missing"]);
    assert_eq!(code, 0);
    let (code, _, _) = cluster.cli(&["mv", "/a", "/z"]);
    assert_eq!(code, 0);
    let (code, _, _) = cluster.cli(&["rm", "-r", "/z"]);
    assert_eq!(code, 0);
    let (code, out, _) = cluster.cli(&["ls", "/"]);
    assert_eq!((code, out.as_str()), (0, ""));
    let (code, out, _) = cluster.cli(&["cluster", "status", "--data", cluster.cluster.data().to_str().unwrap()]);
    assert_eq!(code, 0);
    // mkdir runs as Cx sub-operations (or one local sub_exec when both objects share a server).
    assert!(["mkdir=", "cx_exec=", "sub_exec="].iter().any(|op| out.contains(op)), "{out}");
    assert!(out.contains("batch="), "file commands use batches: {out}");
    cluster.assert_fsck_clean();
}

fn raw(cluster: &ProcCluster) -> TcpStream {
    let s = TcpStream::connect(&cluster.cluster.map().servers[0].address).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

/// Reads until the server closes the connection; returns what it sent.
fn read_to_close(mut s: TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    s.read_to_end(&mut out).expect("server must close the connection, not hang");
    out
}

fn assert_still_serving(cluster: &ProcCluster) {
    let mut s = raw(cluster);
    let buf = encode_request(1, &Cred::server(), &Request::Ping).unwrap().to_bytes();
    s.write_all(&buf).unwrap();
    let mut reply = vec![0u8; 64];
    let n = s.read(&mut reply).unwrap();
    let frame = Frame::parse(bytes::Bytes::copy_from_slice(&reply[..n])).unwrap();
    assert!(matches!(decode_response(&frame).unwrap(), Ok(plusfs_proto::Reply::Pong { .. })));
}

#[test]
fn garbage_on_the_socket_closes_only_that_connection() {
    let cluster = ProcCluster::start_insecure(2);
    // Random bytes.
    let mut s = raw(&cluster);
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    read_to_close(s);
    assert_still_serving(&cluster);

    // An oversized length prefix.
    let mut s = raw(&cluster);
    s.write_all(&((MAX_FRAME_LEN as u32) + 1).to_be_bytes()).unwrap();
    read_to_close(s);

    // A truncated frame, then EOF.
    let buf = encode_request(1, &Cred::server(), &Request::Stat { path: "/x".into() }).unwrap().to_bytes();
    let mut s = raw(&cluster);
    s.write_all(&buf[..buf.len() - 2]).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    read_to_close(s);

    // A valid header with a garbage body: an EPROTO reply, then close.
    let mut buf = encode_request(7, &Cred::server(), &Request::Stat { path: "/x".into() }).unwrap().to_bytes();
    let n = buf.len();
    buf[n - 3..].copy_from_slice(&[0xff, 0xff, 0xff]);
    let mut s = raw(&cluster);
    s.write_all(&buf).unwrap();
    let reply = read_to_close(s);
    let frame = Frame::parse(bytes::Bytes::from(reply)).unwrap();
    assert_eq!(frame.header.request_id, 7);
    assert_eq!(decode_response(&frame).unwrap().unwrap_err().errno, Errno::EPROTO);

    // Unnormalised paths straight on the wire are refused, not normalised by the server.
    let buf = encode_request(
        8,
        &Cred::server(),
        &Request::Mkdir {
            path: "/a/../b".into(),
            mode: 0o755,
            uid: 0,
            gid: 0,
            threshold: Default::default(),
            width: 0,
        },
    )
    .unwrap()
    .to_bytes();
    let mut s = raw(&cluster);
    s.write_all(&buf).unwrap();
    let mut reply = vec![0u8; 256];
    let n = s.read(&mut reply).unwrap();
    let frame = Frame::parse(bytes::Bytes::copy_from_slice(&reply[..n])).unwrap();
    assert_eq!(decode_response(&frame).unwrap().unwrap_err().errno, Errno::EINVAL);
    assert_still_serving(&cluster);
}

#[test]
fn wrong_protocol_version_gets_a_clear_error() {
    let cluster = ProcCluster::start_insecure(1);
    let mut buf = encode_request(3, &Cred::server(), &Request::Ping).unwrap().to_bytes();
    buf[6] = 99; // version byte
    let mut s = raw(&cluster);
    s.write_all(&buf).unwrap();
    let reply = read_to_close(s);
    let frame = Frame::parse(bytes::Bytes::from(reply)).unwrap();
    let err = decode_response(&frame).unwrap().unwrap_err();
    assert_eq!(err.errno, Errno::EPROTO);
    assert!(err.message.contains("version 99"), "{}", err.message);
    assert_still_serving(&cluster);
}

/// A client that pipelines large reads and never reads the replies: the server holds at
/// most its connection's budget for it (the connection is not read further), its memory
/// stays bounded, and other clients are served meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_replies_do_not_grow_the_server() {
    let cluster = ProcCluster::start_insecure(1);
    let c = cluster.client();
    c.create("/big", 0o644, true).await.unwrap();
    c.write("/big", 0, &vec![3u8; 15 << 20]).await.unwrap();
    let pid = cluster.cluster.pid(0).expect("server pid");
    let before = rss_mib(pid);
    let mut hog = raw(&cluster);
    hog.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
    let read = Request::Read { path: "/big".into(), offset: 0, len: 15 << 20 };
    let mut sent = 0;
    for i in 0..100 {
        let frame = encode_request(i, &Cred::server(), &read).unwrap().to_bytes();
        // The server stops reading a connection over its budget: the writes then block.
        if hog.write_all(&frame).is_err() {
            break;
        }
        sent += 1;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let during = rss_mib(pid);
    assert!(sent > 0);
    assert!(during < before + 256, "server RSS {before} -> {during} MiB with {sent} unread 15 MB replies");
    // Others go on meanwhile.
    let t0 = std::time::Instant::now();
    c.stat("/big").await.expect("another client is served");
    assert!(t0.elapsed() < Duration::from_secs(5), "another client waited {:?}", t0.elapsed());
    drop(hog);
    assert_still_serving(&cluster);
}

/// A request whose handler panics is answered with EIO (and logged); the connection and
/// the server go on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_fails_only_its_request() {
    let mut cluster = ProcCluster::start_insecure(1);
    cluster.cluster.stop(0).unwrap();
    cluster.cluster.start_with_env(0, &[("PLUSFS_FAILPOINT", "panic:statfs_handler")]).unwrap();
    cluster.cluster.wait_ready(Duration::from_secs(20)).unwrap();
    let c = cluster.client();
    c.mkdir("/kept", 0o755).await.unwrap();
    for _ in 0..3 {
        let e = c.call_server(0, &Request::Statfs).await.unwrap_err();
        assert_eq!(e.errno, Errno::EIO, "{e}");
        assert!(e.to_string().contains("failed serving it"), "answered by the server, not timed out: {e}");
        assert!(c.lstat("/kept").await.is_ok(), "the server goes on");
    }
    let log = std::fs::read_to_string(&cluster.cluster.logs()[0]).unwrap();
    assert!(log.contains("request handler panicked"), "the panic is logged");
}
