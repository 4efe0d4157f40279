//! Client-direct large-file I/O on real multi-process clusters: random writes and reads
//! against a model, what a large write costs the entry server, kill -9 of a data server
//! and of the entry server during large writes, and a data server gone mid-read.

mod common;

use common::{bytes, digest, ProcCluster};
use plusfs_client::Client;
use plusfs_proto::Errno;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::Duration;

const MIB: usize = 1 << 20;

/// Operations of kind `op` server `id` has served so far.
async fn ops(c: &Client, id: u32, op: &str) -> u64 {
    let st = c.server_status(id).await.unwrap();
    st.ops.iter().find(|(name, _)| name == op).map_or(0, |(_, n)| *n)
}

/// Operations of kind `op` all servers have served.
async fn all_ops(c: &Client, cluster: &ProcCluster, op: &str) -> Vec<u64> {
    let mut out = Vec::new();
    for id in cluster.cluster.ids() {
        out.push(ops(c, id, op).await);
    }
    out
}

/// Writes of random sizes (1 B to 9 MiB) at random offsets of a file up to 40 MiB, each
/// followed by a read of a random range, all compared with a model of the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_large_writes_and_reads_match_a_model() {
    let cluster = ProcCluster::start(4);
    let c = cluster.client();
    c.create("/f", 0o644, true).await.unwrap();
    let mut model: Vec<u8> = Vec::new();
    let mut rng = StdRng::seed_from_u64(17);
    for step in 0..40u64 {
        let len = match step % 4 {
            0 => rng.gen_range(1..4096),
            1 => rng.gen_range(MIB..3 * MIB),
            _ => rng.gen_range(1..9 * MIB),
        };
        let offset = rng.gen_range(0..32 * MIB);
        let data = bytes(step, len);
        let a = c.write("/f", offset as u64, &data).await.unwrap();
        if model.len() < offset + len {
            model.resize(offset + len, 0);
        }
        model[offset..offset + len].copy_from_slice(&data);
        assert_eq!(a.size, model.len() as u64, "size after write {step}");
        let from = rng.gen_range(0..model.len());
        let n = rng.gen_range(0..(model.len() - from).min(12 * MIB) + 1);
        let got = c.read("/f", from as u64, n).await.unwrap();
        assert!(got == model[from..from + n], "read of {n} bytes at {from} after write {step}");
    }
    let whole = c.read_all("/f").await.unwrap();
    assert_eq!(digest(&whole), digest(&model), "the whole file");
    // A read past the end is short, a read wholly past it empty.
    let end = model.len() as u64;
    assert_eq!(c.read("/f", end - 10, 4 * MIB).await.unwrap(), model[model.len() - 10..]);
    assert!(c.read("/f", end + 1, 4 * MIB).await.unwrap().is_empty());
    cluster.assert_fsck_clean();
}

/// A 48 MiB write costs its entry server one commit and no relayed bytes: the chunks go
/// from the client to every data server; the read fetches them from there too.
/// A sparse file past 4 GiB through the library: regions across the 2 GiB and 4 GiB
/// boundaries and at the end read back byte for byte, holes as zeros, through the relayed
/// and the direct paths (offsets do not fit 32 bits anywhere on the way).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sparse_file_past_four_gib_reads_back_its_regions_and_holes() {
    const GIB: u64 = 1 << 30;
    let cluster = ProcCluster::start(3);
    let c = cluster.client();
    c.create("/sparse", 0o644, true).await.unwrap();
    let size = 4 * GIB + 8 * MIB as u64 + 17;
    let regions: Vec<(u64, Vec<u8>)> =
        [(0, 5000), (2 * GIB - 777, 3 * MIB + 11), (4 * GIB - MIB as u64 / 2, 3 * MIB), (size - 4099, 4099)]
            .into_iter()
            .enumerate()
            .map(|(i, (off, len))| (off, bytes(100 + i as u64, len)))
            .collect();
    for (off, data) in &regions {
        c.write("/sparse", *off, data).await.unwrap();
    }
    assert_eq!(c.lstat("/sparse").await.unwrap().size, size);
    for (off, data) in &regions {
        let got = c.read("/sparse", *off, data.len()).await.unwrap();
        assert_eq!(digest(&got), digest(data), "region at {off}");
    }
    for off in [5 * MIB as u64, 3 * GIB, 4 * GIB + 4 * MIB as u64] {
        assert!(c.read("/sparse", off, 2 * MIB).await.unwrap().iter().all(|&b| b == 0), "hole at {off}");
    }
    // A read across the 4 GiB boundary that starts in a hole.
    let from = 4 * GIB - MIB as u64;
    let got = c.read("/sparse", from, 2 * MIB).await.unwrap();
    assert!(got[..MIB / 2].iter().all(|&b| b == 0));
    assert_eq!(digest(&got[MIB / 2..]), digest(&regions[2].1[..3 * MIB / 2]));
    assert_eq!(c.read("/sparse", size - 10, 100).await.unwrap(), regions[3].1[4089..]);
    cluster.assert_fsck_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_write_stores_its_chunks_on_every_server_and_commits_once() {
    let cluster = ProcCluster::start(4);
    let c = cluster.client();
    c.create("/big", 0o644, true).await.unwrap();
    let entry = c.home("/");
    let data = bytes(5, 48 * MIB);
    let (puts0, writes0, commits0) =
        (all_ops(&c, &cluster, "data_put").await, ops(&c, entry, "write").await, ops(&c, entry, "commit_write").await);
    // The first MiB (below small_file_bytes) goes to the entry server as one Write.
    c.write("/big", 0, &data).await.unwrap();
    let puts: Vec<u64> = all_ops(&c, &cluster, "data_put").await.iter().zip(&puts0).map(|(a, b)| a - b).collect();
    assert_eq!(ops(&c, entry, "commit_write").await - commits0, 1, "one commit for 47 chunked MiB");
    assert_eq!(ops(&c, entry, "write").await - writes0, 1, "one relayed write, of the first MiB");
    assert_eq!(puts.iter().sum::<u64>(), 47, "one record per chunked MiB: {puts:?}");
    assert!(puts.iter().all(|&n| n > 0), "every server stores chunks of the file: {puts:?}");

    let (layouts0, reads0) = (ops(&c, entry, "layout").await, ops(&c, entry, "read").await);
    let back = c.read("/big", 0, data.len()).await.unwrap();
    assert_eq!(digest(&back), digest(&data));
    assert_eq!(ops(&c, entry, "layout").await - layouts0, 1, "one layout for the read");
    assert_eq!(ops(&c, entry, "read").await - reads0, 0, "no bytes relayed by the entry server");
    cluster.assert_fsck_clean();
}

/// kill -9 of a data server, then of the file's entry server, while a client writes large
/// files: every acknowledged file reads back whole; a file whose write failed holds a
/// prefix of what was written (its last commit), never other bytes; fsck is clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_nine_of_data_and_entry_servers_during_large_writes() {
    let mut cluster = ProcCluster::start(3);
    let c = cluster.client();
    c.mkdir("/w", 0o755).await.unwrap();
    let entry = c.home("/w");
    let data_server = cluster.cluster.ids().into_iter().find(|&id| id != entry).unwrap();
    for victim in [data_server, entry] {
        let (progress_tx, mut progress) = tokio::sync::watch::channel(0usize);
        let writer = {
            let c = cluster.client();
            tokio::spawn(async move {
                let (mut acked, mut failed) = (Vec::new(), Vec::new());
                for i in 0..200u64 {
                    let p = format!("/w/v{victim}-{i}");
                    let data = bytes(i, 3 * MIB + (i as usize % 5) * 700_000);
                    if c.create(&p, 0o644, true).await.is_err() {
                        failed.push((p, data));
                        break;
                    }
                    match c.write(&p, 0, &data).await {
                        Ok(_) => {
                            acked.push((p, data));
                            progress_tx.send_replace(acked.len());
                        }
                        Err(_) => {
                            failed.push((p, data));
                            break;
                        }
                    }
                }
                (acked, failed)
            })
        };
        progress.wait_for(|&n| n >= 3).await.expect("the writer ran");
        cluster.cluster.kill(victim).unwrap();
        let (acked, failed) = writer.await.unwrap();
        assert!(acked.len() < 200 && !failed.is_empty(), "the kill of server {victim} stopped the writer");
        cluster.cluster.start(victim).unwrap();
        cluster.cluster.wait_ready(Duration::from_secs(20)).unwrap();
        let fresh = cluster.client();
        for (p, d) in &acked {
            let back = fresh.read_all(p).await.unwrap();
            assert_eq!((back.len(), digest(&back)), (d.len(), digest(d)), "{p} after kill -9 of {victim}");
        }
        for (p, d) in &failed {
            let back = fresh.read_all(p).await.unwrap_or_default();
            assert!(d.starts_with(&back), "{p}: {} bytes that are not a prefix of what was written", back.len());
        }
    }
    cluster.assert_fsck_clean();
}

/// A data server gone mid-read: the file with chunks there fails with EIO, a file whose
/// bytes are elsewhere still reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_server_gone_fails_only_the_files_it_holds() {
    let mut cluster = ProcCluster::start(3);
    let c = cluster.client();
    c.mkdir("/r", 0o755).await.unwrap();
    let entry = c.home("/r");
    let big = bytes(1, 24 * MIB);
    c.create("/r/big", 0o644, true).await.unwrap();
    c.write("/r/big", 0, &big).await.unwrap();
    let small = bytes(2, 100_000);
    c.create("/r/small", 0o644, true).await.unwrap();
    c.write("/r/small", 0, &small).await.unwrap();
    // The other server holding most of the big file's chunks.
    let mut victim = None;
    for id in cluster.cluster.ids().into_iter().filter(|&id| id != entry) {
        let held = c.server_status(id).await.unwrap().data_bytes;
        if victim.is_none_or(|(_, most)| held > most) {
            victim = Some((id, held));
        }
    }
    let (victim, held) = victim.unwrap();
    assert!(held >= 4 * MIB as u64, "server {victim} holds chunks of the file");
    cluster.cluster.kill(victim).unwrap();
    let reader = Client::new(cluster.cluster.map().clone(), plusfs_client::ClientOptions::default());
    let e = reader.read("/r/big", 0, big.len()).await.unwrap_err();
    assert_eq!(e.errno, Errno::EIO, "{e}");
    assert!(e.to_string().contains("/r/big"), "the error names the file: {e}");
    assert_eq!(reader.read_all("/r/small").await.unwrap(), small, "a file on the entry server reads");
    cluster.cluster.start(victim).unwrap();
    cluster.cluster.wait_ready(Duration::from_secs(20)).unwrap();
    assert_eq!(digest(&reader.read_all("/r/big").await.unwrap()), digest(&big), "and again once it is back");
}

/// Four clients write disjoint strided records of one shared file at once — IO500
/// ior-hard's 47,008-byte records, then 2 MiB records that take the direct path — and
/// every record reads back as its writer wrote it (no lost or torn region).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_writing_disjoint_strided_records_of_one_file() {
    let cluster = ProcCluster::start(3);
    let c = cluster.client();
    for (name, record, per_client) in [("hard", 47_008usize, 40usize), ("large", 2 * MIB, 4)] {
        let p = format!("/{name}");
        c.create(&p, 0o644, true).await.unwrap();
        let clients = 4;
        let mut tasks = Vec::new();
        for k in 0..clients {
            let c = cluster.client();
            let p = p.clone();
            tasks.push(tokio::spawn(async move {
                for i in 0..per_client {
                    let slot = i * clients + k;
                    let data = bytes(((slot as u64) << 8) | (record as u64 % 255), record);
                    c.write(&p, (slot * record) as u64, &data).await.unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let whole = c.read_all(&p).await.unwrap();
        assert_eq!(whole.len(), clients * per_client * record, "{name}: size");
        for slot in 0..clients * per_client {
            let want = bytes(((slot as u64) << 8) | (record as u64 % 255), record);
            let got = &whole[slot * record..(slot + 1) * record];
            assert!(got == want.as_slice(), "{name}: record {slot} as its writer wrote it");
        }
    }
    cluster.assert_fsck_clean();
}

/// `plusfs bench` large-file modes and the wire probe on a real cluster: every phase
/// reports MiB/s and requests per MiB, the shared file ends with every client's regions.
#[test]
fn bench_large_file_modes_and_the_wire_probe() {
    let cluster = ProcCluster::start(3);
    let run = |args: &[&str]| -> Vec<serde_json::Value> {
        let (code, out, err) = cluster.cli(args);
        assert_eq!(code, 0, "{args:?}: {err}");
        out.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    };
    let phases = ["write", "read", "probe-write", "probe-read"];
    let base = ["bench", "--size", "8MiB", "--block", "2MiB", "-n", "2", "-c", "2", "--json"];
    let own: Vec<&str> = base.iter().chain(&phases).chain(&["--unique", "--dir", "/own"]).copied().collect();
    for o in run(&own) {
        assert_eq!(o["errors"], 0, "{o}");
        assert!(o["mib_per_sec"].as_f64().unwrap() > 0.0, "{o}");
        let per_mib = o["requests_per_mib"].as_f64().unwrap();
        // 2 MiB calls: at most a stat, two records and a commit per call on the direct path.
        assert!(per_mib > 0.0 && per_mib <= 2.5, "requests per MiB: {o}");
    }
    let shared: Vec<&str> = base.iter().chain(&["write", "read", "--shared-file", "--dir", "/sh"]).copied().collect();
    for o in run(&shared) {
        assert_eq!(o["errors"], 0, "{o}");
    }
    let c = Client::new(cluster.cluster.map().clone(), plusfs_client::ClientOptions::default());
    let rt = tokio::runtime::Runtime::new().unwrap();
    assert_eq!(rt.block_on(c.lstat("/sh/shared")).unwrap().size, 4 * 8 * MIB as u64, "2 clients x 2 regions");
    let (code, _, err) = cluster.cli(&["bench", "write", "--block", "0", "--dir", "/bad"]);
    assert!(code != 0 && err.contains("--block"), "a zero block is refused: {err}");
}

/// fsck compares the records files name with the records the servers hold: a record
/// stored and never committed (a client killed in between) is reported as unused space,
/// fsck stays clean; a file naming a record its server does not hold is a problem.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fsck_reports_unused_records_and_files_naming_missing_ones() {
    use plusfs_proto::{Piece, Reply, Request};
    let cluster = ProcCluster::start(2);
    let c = cluster.client();
    c.create("/f", 0o644, true).await.unwrap();
    let ino = c.lstat("/f").await.unwrap().ino;
    // A client that stored a record and died before its commit.
    let stored = c
        .call_server(1, &Request::DataPut { owner: ino, data: vec![7; 5000].into(), file_off: 2 << 20, cap: None })
        .await
        .unwrap();
    assert!(matches!(stored, Reply::Record(_)), "{stored:?}");
    let (code, out, _) = cluster.cli(&["fsck"]);
    assert_eq!(code, 0, "unused space is no problem: {out}");
    assert!(out.contains("server 1 holds 1 data records (5000 bytes) no file uses"), "{out}");

    // A commit naming a record that server 0 does not hold.
    let bogus = Piece { file_off: 2 << 20, len: 10, server: 0, record: 999_999, skip: 0 };
    let commit = Request::CommitWrite {
        path: "/f".into(),
        ino,
        offset: 2 << 20,
        len: 10,
        pieces: vec![bogus],
        receipts: vec![],
    };
    c.call_server(c.home("/"), &commit).await.unwrap();
    let (code, out, _) = cluster.cli(&["fsck"]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("names record 999999 of server 0, which it does not hold"), "{out}");
}
