//! `plusfs`: one binary for servers, local clusters, file commands, benchmarks and fsck.
//! Everything here parses flags and prints; the work is done by the library crates.

mod acl;
mod bench;
mod cert;
mod cluster;
mod cp;
mod data;
mod elastic;
mod engine_bench;
mod files;
mod fsck;
mod groups;
mod init;
mod largefile;
mod mount;
mod mpirun;
mod netns;
mod quota;
mod sim;
mod top;
mod xbench;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use plusfs_client::{Client, ClientOptions};
use plusfs_placement::ClusterMap;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "plusfs", version, about = "plusfs: a parallel file system whose metadata service scales out")]
struct Cli {
    /// Cluster map file (written by `plusfs cluster up` as DIR/cluster.toml).
    #[arg(long, global = true, env = "PLUSFS_CLUSTER")]
    cluster: Option<PathBuf>,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run one OSD+ server of a cluster.
    Server(cluster::ServerArgs),
    /// Start, stop and inspect clusters.
    #[command(subcommand)]
    Cluster(cluster::ClusterCmd),
    /// Create directories.
    Mkdir(files::MkdirArgs),
    /// Create empty files (existing ones are left as they are).
    Touch(files::PathsArgs),
    /// Show attributes.
    Stat(files::StatArgs),
    /// List directories.
    Ls(files::LsArgs),
    /// Remove files (and trees with -r).
    Rm(files::RmArgs),
    /// Remove empty directories.
    Rmdir(files::PathsArgs),
    /// Rename or move an entry.
    Mv(files::MvArgs),
    /// Make a hard link (`ln TARGET LINK`) or a symbolic one (`ln -s TARGET LINK`).
    Ln(files::LnArgs),
    /// Print the target of a symbolic link.
    Readlink(files::PathsArgs),
    /// Change permission bits (octal mode).
    Chmod(files::ChmodArgs),
    /// Change the owner and/or group (`OWNER`, `OWNER:GROUP`, `:GROUP`).
    Chown(files::ChownArgs),
    /// Change the group.
    Chgrp(files::ChgrpArgs),
    /// Show or change how huge directories are spread over servers.
    Hugedir(files::HugedirArgs),
    /// Show the POSIX ACLs of files and directories (numeric ids).
    Getfacl(acl::GetfaclArgs),
    /// Set, change or remove POSIX ACLs (`--set ACL`, `-m ENTRIES`, `-b`; `-d` for a
    /// directory's default ACL).
    Setfacl(acl::SetfaclArgs),
    /// Quotas of directory trees, users and groups (files and bytes, enforced by the
    /// servers): `set`, `clear`, `show`, `report`.
    Quota(quota::QuotaArgs),
    /// Copy a local file into the cluster (`-` reads standard input).
    Put(data::PutArgs),
    /// Copy a cluster file to a local file (`-` writes standard output).
    Get(data::GetArgs),
    /// Print files.
    Cat(data::CatArgs),
    /// Copy trees between local file systems and clusters with batch-file I/O (like cp -a).
    Cp(cp::CpArgs),
    /// Mount the cluster with FUSE.
    Mount(mount::MountArgs),
    /// Unmount a plusfs mount.
    Umount(mount::UmountArgs),
    /// Metadata load generator: create, stat and unlink many files.
    Bench(bench::BenchArgs),
    /// Cross-server operation benchmark (mkdir, update- or read-dominated mixes) under
    /// the cluster's protocol: throughput, mean/p99 latency, messages per operation.
    Xbench(xbench::XbenchArgs),
    /// Check the namespace invariants of a cluster (and, with --replicas, that the members
    /// of every replica group hold the same store and file data).
    Fsck(fsck::FsckArgs),
    /// A cluster's private network (`cluster up --netns`): run commands on its hosts,
    /// partition, heal, shape its links.
    #[command(subcommand)]
    Netns(netns::NetnsCmd),
    /// A scaling model: placement balance and moved fraction for many servers, and rates
    /// fitted to measured runs, validated, extrapolated.
    #[command(subcommand)]
    Sim(sim::SimCmd),
    /// The cluster CA and the identities it issues (mutual TLS).
    #[command(subcommand)]
    Cert(cert::CertCmd),
    /// Every server's operations per second and p99 latency, refreshed each second (from
    /// the servers' metrics endpoints).
    Top(top::TopArgs),
}

/// Keeps large buffers (the 1-4 MiB frames and records of file data) in the heap: glibc
/// otherwise maps each one afresh and the kernel zeroes every page of it on first touch,
/// which cost a quarter of a server's cycles while it stored file data. Freed memory is
/// kept up to 256 MiB instead of being given back at once.
fn tune_allocator() {
    // SAFETY: mallopt(3) only changes the allocator's thresholds; called before any thread
    // starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
}

/// The `plusfs` command: parses the command line, sets up logging and runs the command
/// (the `plusfs` binary, and the test crate's copy of it, are this function).
pub fn main() -> ExitCode {
    tune_allocator();
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("PLUSFS_LOG").unwrap_or_else(|_| "info".into());
    // Colours only for a terminal: a server's log file gets plain text.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(colour).init();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("plusfs: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    let cluster = cli.cluster;
    match cli.command {
        Cmd::Server(a) => cluster::server(a, cluster).map(|_| ExitCode::SUCCESS),
        Cmd::Cluster(c) => cluster::cluster(c, cluster),
        Cmd::Bench(a) => bench::run(a, cluster, engine_bench::run),
        Cmd::Xbench(a) => xbench::run(a, cluster),
        Cmd::Mount(a) => mount::mount(a, cluster),
        Cmd::Umount(a) => mount::umount(a),
        Cmd::Netns(c) => netns::run(c, cluster),
        Cmd::Sim(c) => sim::run(c),
        Cmd::Cert(c) => cert::run(c, cluster).map(|_| ExitCode::SUCCESS),
        Cmd::Top(a) => top::run(a, cluster).map(|_| ExitCode::SUCCESS),
        Cmd::Cp(a) => {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
            rt.block_on(async move {
                let client = cluster.as_ref().map(|c| connect(Some(c))).transpose()?;
                cp::run(client, a).await
            })
        }
        other => {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
            rt.block_on(async move {
                let client = connect(cluster.as_ref())?;
                Ok(match other {
                    Cmd::Mkdir(a) => files::mkdir(&client, a).await,
                    Cmd::Touch(a) => files::touch(&client, a).await,
                    Cmd::Stat(a) => files::stat(&client, a).await,
                    Cmd::Ls(a) => files::ls(&client, a).await,
                    Cmd::Rm(a) => files::rm(&client, a).await,
                    Cmd::Rmdir(a) => files::rmdir(&client, a).await,
                    Cmd::Mv(a) => files::mv(&client, a).await,
                    Cmd::Ln(a) => files::ln(&client, a).await,
                    Cmd::Readlink(a) => files::readlink(&client, a).await,
                    Cmd::Chmod(a) => files::chmod(&client, a).await,
                    Cmd::Chown(a) => files::chown(&client, a).await,
                    Cmd::Chgrp(a) => files::chgrp(&client, a).await,
                    Cmd::Hugedir(a) => files::hugedir(&client, a).await,
                    Cmd::Getfacl(a) => acl::getfacl(&client, a).await,
                    Cmd::Setfacl(a) => acl::setfacl(&client, a).await,
                    Cmd::Quota(a) => quota::run(&client, a).await,
                    Cmd::Put(a) => data::put(&client, a).await,
                    Cmd::Get(a) => data::get(&client, a).await,
                    Cmd::Cat(a) => data::cat(&client, a).await,
                    Cmd::Fsck(a) => fsck::run(&client, a).await?,
                    Cmd::Server(_)
                    | Cmd::Cluster(_)
                    | Cmd::Bench(_)
                    | Cmd::Xbench(_)
                    | Cmd::Mount(_)
                    | Cmd::Umount(_)
                    | Cmd::Netns(_)
                    | Cmd::Sim(_)
                    | Cmd::Cert(_)
                    | Cmd::Top(_)
                    | Cmd::Cp(_) => {
                        unreachable!("handled above")
                    }
                })
            })
        }
    }
}

/// Loads the cluster map named by `--cluster`/`PLUSFS_CLUSTER`.
pub(crate) fn load_map(cluster: Option<&PathBuf>) -> Result<ClusterMap> {
    let path = cluster.context("no cluster map: pass --cluster FILE or set PLUSFS_CLUSTER")?;
    Ok(ClusterMap::load(path)?)
}

/// A client for the cluster named by `--cluster`.
pub(crate) fn connect(cluster: Option<&PathBuf>) -> Result<Client> {
    let opts = ClientOptions { map_file: cluster.cloned(), ..Default::default() };
    Ok(Client::new(load_map(cluster)?, opts))
}
