//! `plusfs server` and `plusfs cluster up|down|status`.

use anyhow::{Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use plusfs_client::{Client, ClientOptions};
use plusfs_localcluster::{ClusterSettings, LocalCluster};
use plusfs_placement::{ClusterMap, HugedirSettings, SyncMode, ThresholdSetting};
use plusfs_server::ServerConfig;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Args)]
pub struct ServerArgs {
    /// This server's id in the cluster map.
    #[arg(long)]
    id: u32,
    /// Directory for this server's store.
    #[arg(long)]
    data: PathBuf,
    /// Request-serving threads (default: one per CPU). 1 serves everything on one thread,
    /// which lowers latency a little when several servers share a machine's cores.
    #[arg(long, env = "PLUSFS_SERVER_THREADS")]
    threads: Option<usize>,
    /// Listen on this address instead of the one the cluster map gives this server (a
    /// server on a private network listens behind its delaying proxy).
    #[arg(long)]
    listen: Option<String>,
    /// For a replicated server: which member of its replica group this process is.
    #[arg(long)]
    member: Option<u64>,
    /// Create the replica group of a new cluster (its lowest member does it; a group that
    /// exists is left as it is). `cluster up` passes it on a new cluster's first start.
    #[arg(long)]
    bootstrap: bool,
    /// A new server not yet in the map (needs --listen): it starts, then `plusfs cluster
    /// add --address ADDR` puts it in and objects move to it.
    #[arg(long, requires = "listen")]
    join: bool,
    /// Where a replica-group member listens for Raft messages (default: its `raft`
    /// address in the map; a member on a private network listens behind its proxy).
    #[arg(long, requires = "member")]
    raft_listen: Option<String>,
}

impl From<SyncArg> for SyncMode {
    fn from(s: SyncArg) -> SyncMode {
        match s {
            SyncArg::Os => SyncMode::Os,
            SyncArg::Always => SyncMode::Always,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
pub enum SyncArg {
    /// WAL written before each reply: survives a process crash, NOT a power loss or kernel
    /// crash (what the OS had not yet written back is lost, acknowledged or not).
    Os,
    /// WAL also fsynced before each reply (group commit): survives a power loss.
    Always,
}

#[derive(Subcommand)]
pub enum ClusterCmd {
    /// Write the files a cluster of several machines starts from: a CA, the map, and one
    /// bundle per host (its map, CA certificate, server identity and systemd env files) to
    /// copy to --etc on that host. See docs/operations.md, "Several machines".
    Init {
        /// The machines' addresses, comma-separated (e.g. 10.0.0.1,10.0.0.2,10.0.0.3).
        #[arg(long, value_delimiter = ',', required = true)]
        hosts: Vec<String>,
        /// Server slots (default: one per host).
        #[arg(long)]
        servers: Option<usize>,
        /// Members per slot: 3 keeps every slot up through the loss of one machine.
        #[arg(long, default_value_t = 1)]
        replicas: usize,
        /// Client port of slot 0 (slot S listens on PORT+S).
        #[arg(long, default_value_t = 7000)]
        port: u16,
        /// Raft port of slot 0 (slot S uses RAFT_PORT+S).
        #[arg(long, default_value_t = 7100)]
        raft_port: u16,
        /// Where each host keeps its bundle.
        #[arg(long, default_value = "/etc/plusfs")]
        etc: PathBuf,
        /// Where each host keeps its servers' data.
        #[arg(long, default_value = "/var/lib/plusfs")]
        data_root: PathBuf,
        /// Durability setting (`always` where machines can lose power).
        #[arg(long, value_enum, default_value = "always")]
        sync: SyncArg,
        /// Validity of the certificates, in days.
        #[arg(long, default_value_t = 365)]
        days: u32,
        /// The new directory to write into.
        #[arg(long)]
        out: PathBuf,
    },
    /// Start N servers on loopback with data under DIR (or restart the cluster in DIR).
    Up {
        /// Number of servers of a new cluster (default 4); an existing cluster keeps its own.
        #[arg(long)]
        servers: Option<usize>,
        #[arg(long)]
        data: PathBuf,
        /// Durability setting of a new cluster: `os` (default, fastest) loses recent
        /// acknowledged operations on a power loss; choose `always` where machines can
        /// lose power.
        #[arg(long, value_enum, default_value = "os")]
        sync: SyncArg,
        /// Huge-directory threshold of a new cluster: entries above which a directory is
        /// spread over several servers, 0 (from the first entry) or `never`.
        #[arg(long, default_value = "8000", value_parser = parse_threshold)]
        hugedir_threshold: ThresholdSetting,
        /// Storing servers of a distributed directory (0: all).
        #[arg(long, default_value_t = 0)]
        hugedir_width: u32,
        /// Free bytes each server keeps on its data file system (writes that would use them
        /// get ENOSPC, so metadata always has room).
        #[arg(long, default_value_t = 64 << 20)]
        data_reserve: u64,
        /// Size of the data segments compaction copies and frees (at most --data-reserve).
        #[arg(long, default_value_t = 64 << 20)]
        data_segment: u64,
        /// Protocol of mkdir and rmdir: cx (concurrent execution, lazy batched commitment),
        /// 2pc (two-phase commit) or serial (OrangeFS-style).
        #[arg(long, default_value = "cx")]
        txn: plusfs_placement::TxnProtocol,
        /// Cx timeout trigger: commit pending operations at least this often (ms).
        #[arg(long, default_value_t = 1000)]
        commit_timeout_ms: u64,
        /// Cx threshold trigger: commit as soon as this many operations are pending.
        #[arg(long, default_value_t = 512)]
        commit_threshold: u32,
        /// Cx log limit per server in bytes (new operations wait while it is full).
        #[arg(long, default_value_t = 16 << 20)]
        max_log_bytes: u64,
        /// Return once all servers answer, leaving them running.
        #[arg(long)]
        detach: bool,
        /// Put every server, and --clients client hosts, in its own network namespace with
        /// its own address on a private bridge (needs root); run clients with `plusfs netns
        /// exec c0 -- CMD`.
        #[arg(long)]
        netns: bool,
        /// Client hosts of a --netns cluster (namespaces c0, c1, …).
        #[arg(long, default_value_t = 2, requires = "netns")]
        clients: usize,
        /// Members of each server's replica group in a new cluster (1: unreplicated). With
        /// 3 a server keeps serving after the loss of any one member: an acknowledged
        /// change, file contents included, is in the Raft logs of a majority of its members,
        /// fsynced there whatever --sync says (the map's `[replication] fsync_log = false`
        /// opts out), and another member takes over within about 1.5 s.
        #[arg(long, default_value_t = 1)]
        replicas: usize,
        /// Plain TCP and no certificates: anyone who reaches a server may act as any uid
        /// (for benchmarks and comparisons). By default the cluster gets a CA in DIR/certs,
        /// servers and clients authenticate each other with mutual TLS, and the map names
        /// the admin identity clients present unless PLUSFS_IDENTITY names another.
        #[arg(long)]
        insecure: bool,
        /// No metrics endpoints. By default every server process serves Prometheus metrics
        /// on a port of its host (`metrics` in the map, shown by `cluster status`).
        #[arg(long)]
        no_metrics: bool,
        /// Pace of migrations after `cluster add/drain/reweight`: directory objects each
        /// server moves per second at most.
        #[arg(long, default_value_t = 1000)]
        rebalance_objects: u32,
        /// Pace of migrations: MiB of file data each server moves per second at most.
        #[arg(long, default_value_t = 50)]
        rebalance_mib: u32,
        #[command(flatten)]
        shape: crate::netns::ShapeArgs,
    },
    /// Stop the servers of the local cluster in DIR.
    Down {
        #[arg(long)]
        data: PathBuf,
    },
    /// Per-server counters: objects, entries, operations, messages, bytes.
    Status {
        /// Data directory of a local cluster (instead of --cluster).
        #[arg(long)]
        data: Option<PathBuf>,
        /// One JSON object per server (all counters) instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Replace a member of a replicated server (dead or alive) by a new one: the new member
    /// joins, catches up from the others (a snapshot if needed), then takes the old one's
    /// vote; the map is updated. With --data (a local cluster) the new member's process is
    /// started on free loopback ports unless addresses are given, and the old one stopped.
    Replace {
        /// The replicated server whose member is replaced.
        #[arg(long)]
        group: u32,
        /// The member to replace.
        #[arg(long)]
        member: u64,
        /// Where the new member serves clients (host:port).
        #[arg(long)]
        address: Option<String>,
        /// Where the new member exchanges Raft messages (host:port).
        #[arg(long)]
        raft: Option<String>,
        /// Data directory of a local cluster (instead of --cluster).
        #[arg(long)]
        data: Option<PathBuf>,
    },
    /// Add a server: the map service makes a new epoch and the directory objects (and
    /// file data) it now homes move to it in the background, at the pace of the map's
    /// `[rebalance]` settings. With --data (a local cluster) the server is started on a
    /// free loopback port.
    Add {
        /// Where the new server serves (host:port); a local cluster picks a free port.
        #[arg(long)]
        address: Option<String>,
        /// A replica group's members on other machines, comma-separated, each
        /// CLIENT_ADDR/RAFT_ADDR (host:port/host:port): the group joins at weight 0, is
        /// reweighted once its members (started from the map this writes) answer.
        #[arg(long, value_delimiter = ',', conflicts_with = "address")]
        members: Vec<String>,
        /// Members of the new replica group of a local cluster (default: as many as its
        /// other groups have).
        #[arg(long)]
        replicas: Option<usize>,
        /// Its share of objects relative to the others (default 1).
        #[arg(long, default_value_t = 1.0)]
        weight: f64,
        /// Data directory of a local cluster (instead of --cluster).
        #[arg(long)]
        data: Option<PathBuf>,
        /// Wait until the cluster is balanced, with a progress bar.
        #[arg(long)]
        wait: bool,
    },
    /// Drain a server: weight 0, so every object it holds moves to the others (then
    /// `cluster remove` may take it out).
    Drain {
        #[arg(long)]
        server: u32,
        #[arg(long)]
        data: Option<PathBuf>,
        /// Wait until it is empty, with a progress bar.
        #[arg(long)]
        wait: bool,
    },
    /// Change a server's weight (its share of objects); objects move accordingly.
    Reweight {
        #[arg(long)]
        server: u32,
        #[arg(long)]
        weight: f64,
        #[arg(long)]
        data: Option<PathBuf>,
        #[arg(long)]
        wait: bool,
    },
    /// Take a drained server out of the map (refused while it holds anything); a local
    /// cluster's server process is stopped.
    Remove {
        #[arg(long)]
        server: u32,
        #[arg(long)]
        data: Option<PathBuf>,
    },
    /// Reclaim the space of deleted and overwritten file data on every server now.
    Compact {
        /// Compact data segments whose live share is at most this percentage.
        #[arg(long, default_value_t = 50)]
        live_percent: u32,
    },
}

/// Raises this process's limit of open descriptors to its hard limit: a server holds one
/// per connection, and a service's default of 1,024 is soon reached by many clients.
fn raise_open_files() {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit read and write only the struct passed.
    #[allow(unsafe_code)]
    let raised = unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max && {
            let want = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
            libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0
        }
    };
    if raised {
        tracing::debug!(from = lim.rlim_cur, to = lim.rlim_max, "open-file limit raised");
    }
}

/// Runs one server until SIGTERM or SIGINT.
pub fn server(a: ServerArgs, cluster: Option<PathBuf>) -> Result<()> {
    // Everything a server writes (store, data segments, snapshots) is its users' data:
    // private to the account it runs as.
    // SAFETY: umask(2) only sets this process's file creation mask.
    #[allow(unsafe_code)]
    unsafe {
        libc::umask(0o077);
    }
    raise_open_files();
    let map = crate::load_map(cluster.as_ref())?;
    let config = ServerConfig {
        id: a.id,
        map,
        data_dir: a.data,
        member: a.member,
        bootstrap: a.bootstrap,
        map_path: cluster,
        join: a.join,
        raft_listen: a.raft_listen,
    };
    let rt = match a.threads {
        Some(0) => anyhow::bail!("--threads must be at least 1"),
        Some(1) => tokio::runtime::Builder::new_current_thread().enable_all().build()?,
        Some(n) => tokio::runtime::Builder::new_multi_thread().worker_threads(n).enable_all().build()?,
        None => tokio::runtime::Builder::new_multi_thread().enable_all().build()?,
    };
    let exit = rt.block_on(async move {
        let listener = match &a.listen {
            Some(addr) => tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| plusfs_server::StartError::Listen { addr: addr.clone(), source })?,
            None => plusfs_server::bind(&config.map, config.id, config.member).await?,
        };
        let (tx, rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            use tokio::signal::unix::{signal, SignalKind};
            let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
            let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
            tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
            tracing::info!("shutting down");
            let _ = tx.send(true);
        });
        anyhow::Ok(plusfs_server::run(config, listener, rx).await?)
    })?;
    match exit {
        plusfs_server::Exit::Stopped => Ok(()),
        plusfs_server::Exit::Deposed(_) => {
            // Start afresh as a follower: same process (and pid file), same arguments,
            // without creating the group again.
            drop(rt);
            restart_self()
        }
    }
}

/// Replaces this process by a fresh run of the same command (without `--bootstrap`).
fn restart_self() -> Result<()> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().context("cannot find this program to restart it")?;
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).filter(|a| a != "--bootstrap").collect();
    let e = std::process::Command::new(exe).args(args).exec();
    Err(anyhow::anyhow!("cannot restart as a follower: {e}"))
}

pub fn cluster(c: ClusterCmd, cluster: Option<PathBuf>) -> Result<ExitCode> {
    match c {
        ClusterCmd::Init { hosts, servers, replicas, port, raft_port, etc, data_root, sync, days, out } => {
            let sync = SyncMode::from(sync);
            let servers = servers.unwrap_or(hosts.len());
            let plan = crate::init::InitPlan { hosts, servers, replicas, port, raft_port, etc, data_root, sync, days };
            for line in crate::init::init(&plan, &out)? {
                println!("{line}");
            }
            Ok(ExitCode::SUCCESS)
        }
        ClusterCmd::Up {
            servers,
            data,
            sync,
            hugedir_threshold,
            hugedir_width,
            data_reserve,
            data_segment,
            txn,
            commit_timeout_ms,
            commit_threshold,
            max_log_bytes,
            detach,
            netns,
            clients,
            replicas,
            insecure,
            no_metrics,
            rebalance_objects,
            rebalance_mib,
            shape,
        } => {
            if shape.any() && !netns {
                anyhow::bail!("--delay, --jitter, --rate and --loss shape a private network: add --netns");
            }
            let netns =
                netns.then(|| plusfs_localcluster::NetSettings { clients, shape: shape.over(Default::default()) });
            let sync = SyncMode::from(sync);
            let hugedirs = HugedirSettings { threshold: hugedir_threshold, width: hugedir_width };
            let data_settings = plusfs_placement::DataSettings {
                reserve_bytes: data_reserve,
                segment_bytes: data_segment,
                ..Default::default()
            };
            let txn =
                plusfs_placement::TxnSettings { protocol: txn, commit_timeout_ms, commit_threshold, max_log_bytes };
            up(
                servers,
                data,
                &ClusterSettings {
                    sync,
                    hugedirs,
                    data: data_settings,
                    txn,
                    netns,
                    replicas,
                    insecure,
                    no_metrics,
                    rebalance: plusfs_placement::RebalanceSettings {
                        objects_per_sec: rebalance_objects,
                        mib_per_sec: rebalance_mib,
                        ..Default::default()
                    },
                    ..Default::default()
                },
                detach,
            )
        }
        ClusterCmd::Down { data } => {
            let n = plusfs_localcluster::down(&data, Duration::from_secs(10))?;
            println!("stopped {n} servers");
            Ok(ExitCode::SUCCESS)
        }
        ClusterCmd::Status { data, json } => {
            let file = match data {
                Some(d) => plusfs_localcluster::map_path(&d),
                None => cluster.context("pass --data DIR or --cluster FILE")?,
            };
            // The map service's map (the file may be older); the file's if it is down.
            let map = crate::elastic::Admin::open(&file)?.current().or_else(|_| ClusterMap::load(&file))?;
            match json {
                true => status_json(map),
                false => status(map),
            }
        }
        ClusterCmd::Add { address, members, replicas, weight, data, wait } => {
            let how = crate::elastic::Joining { address, members, replicas };
            crate::elastic::add(how, weight, data.as_deref(), cluster.as_ref(), wait)
        }
        ClusterCmd::Drain { server, data, wait } => {
            crate::elastic::reweight(server, 0.0, data.as_deref(), cluster.as_ref(), wait)
        }
        ClusterCmd::Reweight { server, weight, data, wait } => {
            if !(weight >= 0.0 && weight.is_finite()) {
                anyhow::bail!("--weight must be a finite number of at least 0");
            }
            crate::elastic::reweight(server, weight, data.as_deref(), cluster.as_ref(), wait)
        }
        ClusterCmd::Remove { server, data } => crate::elastic::remove(server, data.as_deref(), cluster.as_ref()),
        ClusterCmd::Compact { live_percent } => compact(crate::load_map(cluster.as_ref())?, live_percent),
        ClusterCmd::Replace { group, member, address, raft, data } => {
            crate::groups::replace(group, member, (address, raft), data, cluster)
        }
    }
}

/// Parses a cluster huge-directory threshold: a number of entries or `never`.
pub fn parse_threshold(s: &str) -> Result<ThresholdSetting, String> {
    match s {
        "never" => Ok(ThresholdSetting::Word("never".into())),
        n => {
            n.parse().map(ThresholdSetting::Entries).map_err(|_| format!("'{s}' is not a number of entries or 'never'"))
        }
    }
}

fn up(servers: Option<usize>, data: PathBuf, settings: &ClusterSettings, detach: bool) -> Result<ExitCode> {
    let exe = std::env::current_exe()?;
    let mut c = LocalCluster::up(&exe, &data, servers, settings)?;
    let procs: usize = c.map().servers.iter().map(|s| s.members.len().max(1)).sum();
    match c.already_running() {
        0 => {}
        n if n == procs => println!("all {n} server processes were already running"),
        n => println!("{n} of {procs} server processes were already running; started the other {}", procs - n),
    }
    println!("cluster of {} servers is up; map: {}", c.map().servers.len(), c.map_file().display());
    println!("export PLUSFS_CLUSTER={}", c.map_file().display());
    if detach {
        c.detach();
        return Ok(ExitCode::SUCCESS);
    }
    println!("press Ctrl-C to stop");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        tokio::select! { _ = tokio::signal::ctrl_c() => {}, _ = term.recv() => {} }
        anyhow::Ok(())
    })?;
    c.shutdown()?;
    println!("cluster stopped");
    Ok(ExitCode::SUCCESS)
}

/// A runtime and a client that does not retry, for the admin commands that ask every
/// server in turn (a server that is down is reported at once).
fn admin_client(map: &ClusterMap) -> Result<(tokio::runtime::Runtime, Client)> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let client = {
        let _g = rt.enter();
        Client::new(map.clone(), ClientOptions { retries: 0, ..Default::default() })
    };
    Ok((rt, client))
}

fn compact(map: ClusterMap, live_percent: u32) -> Result<ExitCode> {
    let (rt, client) = admin_client(&map)?;
    let mut failed = false;
    for s in &map.servers {
        let before = rt.block_on(client.server_status(s.id)).map(|st| st.data_bytes);
        let r = rt.block_on(client.call_server(s.id, &plusfs_proto::Request::Compact { live_percent }));
        let after = rt.block_on(client.server_status(s.id)).map(|st| st.data_bytes);
        match (r, before, after) {
            (Ok(_), Ok(b), Ok(a)) => println!("server {}: data {b} -> {a} bytes", s.id),
            (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
                println!("server {}: {e}", s.id);
                failed = true;
            }
        }
    }
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

/// `cluster status --json`: every server's counters as one JSON line each.
fn status_json(map: ClusterMap) -> Result<ExitCode> {
    let (rt, client) = admin_client(&map)?;
    let mut failed = false;
    for s in &map.servers {
        match rt.block_on(client.server_status(s.id)) {
            Ok(st) => println!("{}", serde_json::to_string(&st)?),
            Err(e) => {
                println!("{}", serde_json::json!({ "id": s.id, "down": e.to_string() }));
                failed = true;
            }
        }
    }
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

fn status(map: ClusterMap) -> Result<ExitCode> {
    let (rt, client) = admin_client(&map)?;
    println!("{}", crate::elastic::epoch_line(&map));
    println!(
        "{:>3} {:<21} {:>9} {:>10} {:>10} {:>10} {:>12} {:>12} {:>9} {:>9} {:>7} {:>5}",
        "id",
        "address",
        "dirobjs",
        "entries",
        "msgs_in",
        "msgs_out",
        "bytes_in",
        "bytes_out",
        "batches",
        "writes",
        "fsyncs",
        "tx"
    );
    let mut failed = false;
    let mut ops_lines = Vec::new();
    let mut hugedirs = Vec::new();
    let mut shards: Vec<(u32, String, u64)> = Vec::new();
    for s in &map.servers {
        match rt.block_on(client.server_status(s.id)) {
            Ok(st) => {
                println!(
                    "{:>3} {:<21} {:>9} {:>10} {:>10} {:>10} {:>12} {:>12} {:>9} {:>9} {:>7} {:>5}",
                    s.id,
                    s.address,
                    st.dir_objects,
                    st.entries,
                    st.msgs_in,
                    st.msgs_out,
                    st.bytes_in,
                    st.bytes_out,
                    st.store_batches,
                    st.store_writes,
                    st.store_syncs,
                    st.tx_pending
                );
                let ops: Vec<String> = st.ops.iter().map(|(n, c)| format!("{n}={c}")).collect();
                ops_lines.push(format!("server {} ops: {}", s.id, ops.join(" ")));
                ops_lines.push(format!(
                    "server {} data: {} records in {} segments, {} bytes",
                    s.id, st.data_records, st.data_segments, st.data_bytes
                ));
                ops_lines.push(crate::elastic::placement_line(s, &st));
                let metrics: Vec<&str> = s
                    .metrics
                    .iter()
                    .chain(s.members.iter().filter_map(|m| m.metrics.as_ref()))
                    .map(String::as_str)
                    .collect();
                if !metrics.is_empty() {
                    ops_lines.push(format!(
                        "server {} metrics: http://{}/metrics",
                        s.id,
                        metrics.join("/metrics http://")
                    ));
                }
                if st.cx_executed > 0 || st.cx_pending > 0 {
                    ops_lines.push(format!(
                        "server {} cx: executed={} committed={} aborted={} rounds={} immediate={} invalidated={} \
                         pending={} log={}B (peak {}B)",
                        s.id,
                        st.cx_executed,
                        st.cx_committed,
                        st.cx_aborted,
                        st.cx_rounds,
                        st.cx_immediate,
                        st.cx_invalidated,
                        st.cx_pending,
                        st.cx_log_bytes,
                        st.cx_log_peak
                    ));
                }
                if st.delegations > 0 || st.deleg_flushes > 0 || st.deleg_recalls > 0 {
                    ops_lines.push(format!(
                        "server {} delegations: live={} flushes={} recalls={} revoked={}",
                        s.id, st.delegations, st.deleg_flushes, st.deleg_recalls, st.deleg_revoked
                    ));
                }
                for (def, used) in &st.quotas {
                    let who = match (&def.path, def.owner) {
                        (Some(p), plusfs_proto::quota::Owner::Tree(_)) => format!("tree {p}"),
                        (_, o) => o.to_string(),
                    };
                    ops_lines.push(format!(
                        "server {} quota {who}: {} files, {} bytes here (limits: files {}, bytes {})",
                        s.id,
                        used.files,
                        used.bytes,
                        def.limits.files.hard.map_or("-".into(), |l| l.to_string()),
                        def.limits.bytes.hard.map_or("-".into(), |l| l.to_string())
                    ));
                }
                hugedirs.extend(st.hugedirs);
                shards.extend(st.shards.into_iter().map(|(p, n)| (s.id, p, n)));
            }
            Err(e) => {
                println!("{:>3} {:<21} DOWN ({})", s.id, s.address, e.detail.unwrap_or_default());
                failed = true;
            }
        }
    }
    for l in ops_lines {
        println!("{l}");
    }
    let (group_lines, groups_up) = rt.block_on(crate::groups::status_lines(&map));
    if !group_lines.is_empty() {
        println!("replica groups:");
        for l in group_lines {
            println!("  {l}");
        }
    }
    failed |= !groups_up;
    if !hugedirs.is_empty() {
        println!("distributed directories:");
        hugedirs.sort_by(|a, b| a.path.cmp(&b.path));
        for d in &hugedirs {
            let per: Vec<String> =
                shards.iter().filter(|(_, p, _)| *p == d.path).map(|(s, _, n)| format!("{s}:{n}")).collect();
            println!(
                "  {} {} threshold={} (effective {}) set={:?} entries per server: {}",
                d.path,
                d.state,
                d.threshold,
                d.effective,
                d.set,
                per.join(" ")
            );
        }
    }
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}
