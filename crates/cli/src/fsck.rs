//! `plusfs fsck`: checks the namespace invariants across all servers.
//!
//! - every directory object sits on its home server (Eq. 1) and on no other;
//! - every subdirectory entry has its directory object, with the same inode number;
//! - every directory object but `/` has a subdirectory entry in its parent;
//! - no entry belongs to a directory object that is not on the same server;
//! - a distributed directory has a shard, with its inode and incarnation, on every server
//!   of its storing set and nowhere else, and every entry of a shard is on the server Eq. 2
//!   gives it;
//! - every shared inode (hard-linked file) has exactly as many link entries as its link
//!   count, and every link entry's shared inode exists on the home it names;
//! - every data record a file names exists on the server it names;
//! - every server's quota usage counters equal a recount of what it stores (`--repair`
//!   sets wrong ones right).
//!
//! Records no file names (left by a write a crash cut between storing and committing its
//! bytes) are reported as unused space, not as problems; `--reclaim` deletes those still
//! unused after the longest time a write's commit may follow its bytes.

use anyhow::Result;
use plusfs_client::fsck::{check, reclaimable, scan_settled, unused_records};
use plusfs_client::Client;
use std::process::ExitCode;
use std::time::Duration;

/// `plusfs fsck` options.
#[derive(clap::Args)]
pub struct FsckArgs {
    /// Also compare the members of every replica group: at the same log position their
    /// stores and the file data the stores refer to must be equal (checksums). Run it on
    /// a quiet cluster; members still applying are compared again for a few seconds.
    #[arg(long)]
    replicas: bool,
    /// Also delete the data records no file uses (the space a crash left between storing a
    /// write's bytes and committing them): those unused in two scans taken the longest
    /// time a commit may follow its bytes apart (needs an admin identity).
    #[arg(long)]
    reclaim: bool,
    /// Seconds between the two scans of `--reclaim` (default: how long a client-direct
    /// write capability stays valid, plus 10 s; a commit cannot come later).
    #[arg(long, value_name = "SECS", requires = "reclaim")]
    reclaim_after: Option<u64>,
    /// Set quota usage counters that disagree with the recount to the recount.
    #[arg(long)]
    repair: bool,
}

pub async fn run(client: &Client, args: FsckArgs) -> Result<ExitCode> {
    let namespace = namespace(client).await?;
    let quotas = quota_usage(client, args.repair).await?;
    if args.reclaim {
        let wait = args.reclaim_after.unwrap_or(client.map().tls.capability_secs() + 10);
        reclaim(client, Duration::from_secs(wait)).await?;
    }
    let replicas = !args.replicas || crate::groups::check_replicas(&client.map()).await;
    Ok(if replicas && quotas && namespace == ExitCode::SUCCESS { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// Recounts every server's quota usage and reports the counters that disagree (with
/// `repair`, sets them right). True when none disagreed or all were repaired.
async fn quota_usage(client: &Client, repair: bool) -> Result<bool> {
    let wrong = match client.quota_check(repair).await {
        Ok(w) => w,
        Err(e) if e.errno == plusfs_proto::Errno::EPERM => {
            println!("fsck: quota usage not recounted ({e}): needs root with an admin identity");
            return Ok(true);
        }
        Err(e) => return Err(e.into()),
    };
    for (server, m) in &wrong {
        println!(
            "fsck: server {server}: quota usage of {} counted {} files, {} bytes; it holds {} files, {} bytes{}",
            m.owner,
            m.counted.files,
            m.counted.bytes,
            m.actual.files,
            m.actual.bytes,
            if repair { " (repaired)" } else { "" }
        );
    }
    println!(
        "fsck: quota usage: {}",
        if wrong.is_empty() { "exact".to_string() } else { format!("{} counters wrong", wrong.len()) }
    );
    Ok(wrong.is_empty() || repair)
}

/// Deletes the records unused in two scans `wait` apart.
async fn reclaim(client: &Client, wait: Duration) -> Result<()> {
    let first = scan_settled(client, Duration::from_secs(10)).await?;
    if unused_records(&first).is_empty() {
        println!("fsck: no unused data records to reclaim");
        return Ok(());
    }
    println!("fsck: scanning again in {} s: records still unused then are reclaimed", wait.as_secs());
    tokio::time::sleep(wait).await;
    let second = scan_settled(client, Duration::from_secs(10)).await?;
    for (server, records) in reclaimable(&first, &second) {
        let bytes: u64 = records.iter().map(|(_, n)| n).sum();
        for chunk in records.chunks(1024) {
            let records = chunk.iter().map(|(id, _)| *id).collect();
            let req = plusfs_proto::Request::DataDrop { records, receipts: Vec::new() };
            client.call_server(server, &req).await?;
        }
        println!("fsck: server {server}: reclaimed {} unused data records ({bytes} bytes)", records.len());
    }
    Ok(())
}

async fn namespace(client: &Client) -> Result<ExitCode> {
    let scans = scan_settled(client, Duration::from_secs(10)).await?;
    let pending: u64 = scans.iter().map(|(_, d)| d.pending_tx).sum();
    if pending > 0 {
        println!("fsck: {pending} transactions still pending; results may show their effects");
    }
    let problems = check(client, &scans);
    let dirs: usize = scans.iter().map(|(_, d)| d.dirs.len()).sum();
    let subdirs: usize = scans.iter().map(|(_, d)| d.subdirs.len()).sum();
    for p in &problems {
        println!("fsck: {p}");
    }
    for (server, records, bytes) in unused_records(&scans) {
        println!("fsck: server {server} holds {records} data records ({bytes} bytes) no file uses (unused space)");
    }
    println!(
        "fsck: {} servers, {dirs} directory objects, {subdirs} subdirectory entries: {}",
        scans.len(),
        if problems.is_empty() { "clean".to_string() } else { format!("{} problems", problems.len()) }
    );
    Ok(if problems.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
