//! A local plusfs cluster: N server processes on loopback, one data directory each.
//!
//! Used by `plusfs cluster up/down`, by the multi-process tests and by benchmarks, so all
//! three start servers the same way. Layout of the data directory:
//! ```text
//! DIR/cluster.toml       the cluster map (free loopback ports picked at creation)
//! DIR/server-N/          server N's store
//! DIR/server-N.log       its log
//! DIR/server-N.pid       its process id while it runs
//! DIR/server-N-mK/       with `--replicas`: member K of server N's replica group
//! DIR/server-N-mK.log    (and .pid), instead of the three above
//! DIR/netns.toml         with `--netns`: the private network (plusfs_netns)
//! DIR/proxy-N.pid        with `--netns`: the delaying proxy in front of server N
//!                        (proxy-N-mK.pid: in front of its member K)
//! ```
//! With a private network each server runs in its own network namespace behind its
//! delaying proxy, at the address the map gives it; this process reaches them (to wait
//! until they answer) from a thread moved into the first client host's namespace.

pub mod procs;

use anyhow::{bail, Context, Result};
use plusfs_client::{Client, ClientOptions};
use plusfs_netns::{Net, NsHandle};
use plusfs_placement::{ClusterMap, HugedirSettings, MemberEntry, ServerEntry, SyncMode, TlsSettings};
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Servers of a new local cluster when the caller does not say.
pub const DEFAULT_SERVERS: usize = 4;

/// A cluster of server processes started from this process.
pub struct LocalCluster {
    exe: PathBuf,
    data: PathBuf,
    map: ClusterMap,
    /// Server processes by name (`server-N`, or `server-N-mK` for members).
    children: Vec<(String, Child)>,
    /// The private network, if the cluster has one.
    net: Option<Net>,
    /// The delaying proxies this value started (with a private network), by name.
    proxies: Vec<(String, Child)>,
    /// The map was made by this value: replica groups are created on the first start of
    /// their members (never again: a member whose data is lost must not found a group).
    new_cluster: bool,
    /// Server processes found running by [`LocalCluster::up`] (not started by it).
    already_running: usize,
}

/// Cluster-wide settings written into a new cluster map.
#[derive(Debug, Clone, Default)]
pub struct ClusterSettings {
    pub sync: SyncMode,
    pub hugedirs: HugedirSettings,
    pub data: plusfs_placement::DataSettings,
    pub txn: plusfs_placement::TxnSettings,
    pub delegations: plusfs_placement::DelegSettings,
    /// Servers and client hosts in network namespaces (`cluster up --netns`).
    pub netns: Option<NetSettings>,
    /// Members of each server slot's replica group (0 or 1: unreplicated).
    pub replicas: usize,
    /// Replica group timing and snapshots.
    pub replication: plusfs_placement::ReplicationSettings,
    /// Plain TCP, any peer trusted (`cluster up --insecure`); otherwise a new cluster gets
    /// a CA and certificates (see [`make_certs`]).
    pub insecure: bool,
    /// No metrics endpoints (`cluster up --no-metrics`); otherwise every server process
    /// gets one (`metrics` in the map).
    pub no_metrics: bool,
    /// The pace of migrations after a change of the server set.
    pub rebalance: plusfs_placement::RebalanceSettings,
    /// Seconds a client-direct I/O capability stays valid (`[tls] capability_secs`).
    pub capability_secs: Option<u64>,
    /// Connections per bounded certificate and server (`[tls] conns_per_identity`).
    pub conns_per_identity: Option<u32>,
    /// Seconds a client connection may stay idle (`[tls] idle_secs`).
    pub idle_secs: Option<u64>,
}

/// Opens (appending; made 0600 if new) a log of a server or proxy: what servers log names
/// users' paths.
fn private_log(path: PathBuf) -> std::io::Result<fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    fs::OpenOptions::new().create(true).append(true).mode(0o600).open(path)
}

/// Name of the process (and of its data directory, log and pid file) of server `id`, or
/// of its member `member`.
pub fn proc_name(id: u32, member: Option<u64>) -> String {
    match member {
        Some(m) => format!("server-{id}-m{m}"),
        None => format!("server-{id}"),
    }
}

/// Name of the delaying proxy (and of its log and pid file) in front of server `id`, or of
/// its member `member`.
fn proxy_name(id: u32, member: Option<u64>) -> String {
    format!("proxy-{}", proc_name(id, member).trim_start_matches("server-"))
}

/// The processes of server slot `s`: its members', or its own.
fn procs_of(s: &ServerEntry) -> Vec<Option<u64>> {
    if s.members.is_empty() {
        vec![None]
    } else {
        s.members.iter().map(|m| Some(m.id)).collect()
    }
}

/// The private network of a new cluster.
#[derive(Debug, Clone, Default)]
pub struct NetSettings {
    /// Client hosts (namespaces `c0`, `c1`, …) besides the servers.
    pub clients: usize,
    /// Every link's shape.
    pub shape: plusfs_netns::shape::LinkShape,
}

/// Path of the cluster map inside a data directory.
pub fn map_path(data: &Path) -> PathBuf {
    data.join("cluster.toml")
}

/// `n` distinct loopback ports free at the time of the call, chosen at random below the
/// kernel's ephemeral range: a port from that range (what binding port 0 gives) can be
/// taken by any outgoing connection's local end before the server that was meant to
/// listen on it starts, which a busy test suite made happen. The listeners stay open
/// until all are chosen, so no port is given twice.
pub fn free_ports(n: usize) -> Result<Vec<u16>> {
    use std::hash::{BuildHasher, Hasher};
    let ephemeral_low = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| t.split_whitespace().next().and_then(|w| w.parse::<u16>().ok()))
        .unwrap_or(32768);
    let (low, high) = (10_000u16, ephemeral_low.clamp(12_000, 32_768));
    let mut listeners = Vec::with_capacity(n);
    let mut tries = 0;
    while listeners.len() < n {
        tries += 1;
        if tries > 20 * n + 200 {
            // A crowded range: fall back to ports the kernel picks.
            let l = std::net::TcpListener::bind("127.0.0.1:0").context("cannot find a free loopback port")?;
            listeners.push(l);
            continue;
        }
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(tries as u64);
        let port = low + (h.finish() % u64::from(high - low)) as u16;
        if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            listeners.push(l);
        }
    }
    listeners.iter().map(|l| Ok(l.local_addr()?.port())).collect()
}

/// Server `id` on the private network `net`: on its own host, or a group of `replicas`
/// members on theirs (Raft on [`plusfs_netns::RAFT_PORT`] of each).
fn host_servers(net: &Net, id: u32, replicas: usize) -> ServerEntry {
    if replicas <= 1 {
        return ServerEntry::new(id, net.server_address(id).expect("planned"), 1.0);
    }
    let members: Vec<MemberEntry> = (0..replicas as u64)
        .map(|k| {
            let host = plusfs_netns::host_name(id, Some(k));
            let ip = net.member(&host).expect("planned").addr;
            MemberEntry {
                id: k,
                address: net.host_address(&host).expect("planned"),
                raft: format!("{ip}:{}", plusfs_netns::RAFT_PORT),
                metrics: None,
            }
        })
        .collect();
    ServerEntry { id, address: members[0].address.clone(), weight: 1.0, members, metrics: None }
}

/// Gives every server process of `servers` a metrics address on its own host: a free
/// port on loopback, [`METRICS_PORT`] on a private network's hosts.
fn assign_metrics(servers: &mut [ServerEntry], private: bool) -> Result<()> {
    let procs: usize = servers.iter().map(|s| s.members.len().max(1)).sum();
    let mut ports = if private { Vec::new() } else { free_ports(procs)? }.into_iter();
    let mut addr = |client: &str| -> String {
        let host = client.rsplit_once(':').map_or(client, |(h, _)| h);
        match ports.next() {
            Some(p) => format!("{host}:{p}"),
            None => format!("{host}:{METRICS_PORT}"),
        }
    };
    for s in servers {
        if s.members.is_empty() {
            s.metrics = Some(addr(&s.address));
        }
        for m in &mut s.members {
            m.metrics = Some(addr(&m.address));
        }
    }
    Ok(())
}

/// The metrics port of a server process on a private network's host.
pub const METRICS_PORT: u16 = 7200;

/// Server slots `ids`, each a group of `replicas` members on loopback (a client and a Raft
/// port each).
fn replicated_servers(ids: &[u32], replicas: usize) -> Result<Vec<ServerEntry>> {
    let mut ports = free_ports(ids.len() * replicas * 2)?.into_iter();
    let mut next = || ports.next().map(|p| format!("127.0.0.1:{p}")).expect("enough ports");
    Ok(ids
        .iter()
        .map(|&id| {
            let members: Vec<MemberEntry> = (0..replicas as u64)
                .map(|m| MemberEntry { id: m, address: next(), raft: next(), metrics: None })
                .collect();
            ServerEntry { id, address: members[0].address.clone(), weight: 1.0, members, metrics: None }
        })
        .collect())
}

/// Makes a new cluster's CA in `data/certs/ca` and its identities: `server` (every server
/// presents it) and `admin` (the default identity of clients that use the map); returns
/// the map's `[tls]`.
pub fn make_certs(data: &Path) -> Result<TlsSettings> {
    use plusfs_tls::{Authority, Identity, Role, Validity};
    let certs = data.join("certs");
    let ca = Authority::create(&certs.join("ca"))?;
    for (name, role) in [("server", Role::Server), ("admin", Role::Admin)] {
        ca.issue(&Identity { name: name.into(), role }, Validity::days(CERT_DAYS), &certs.join(name))?;
    }
    Ok(TlsSettings {
        ca: Some(certs.join("ca").join("ca.pem")),
        identity: Some(certs.join("admin")),
        server_identity: Some(certs.join("server")),
        revoked: Vec::new(),
        capability_secs: None,
        conns_per_identity: None,
        idle_secs: None,
    })
}

/// How long the certificates of a new local cluster are valid.
const CERT_DAYS: u32 = 365;

impl LocalCluster {
    /// Creates a new cluster map for `servers` servers (default [`DEFAULT_SERVERS`]) in
    /// `data`, or reuses the one there (restarting the same cluster with its data; `servers`,
    /// if given, must match). Does not start anything.
    pub fn prepare(
        exe: &Path,
        data: &Path,
        servers: Option<usize>,
        settings: &ClusterSettings,
    ) -> Result<LocalCluster> {
        fs::create_dir_all(data).with_context(|| format!("cannot create {}", data.display()))?;
        let data = data.canonicalize()?;
        let path = map_path(&data);
        let mut net = Net::load(&data)?;
        let new_cluster = !path.exists();
        let map = if path.exists() {
            let map = ClusterMap::load(&path)?;
            if settings.netns.is_some() && net.is_none() {
                bail!(
                    "{} holds a cluster on loopback; --netns makes a new cluster: use another --data",
                    data.display()
                );
            }
            if servers.is_some_and(|n| n != map.servers.len()) {
                bail!(
                    "{} holds a {}-server cluster; use the same --servers or another --data",
                    data.display(),
                    map.servers.len()
                );
            }
            map
        } else {
            let servers = servers.unwrap_or(DEFAULT_SERVERS);
            if servers == 0 || servers > 1000 {
                bail!("--servers must be between 1 and 1000");
            }
            let ids: Vec<u32> = (0..servers as u32).collect();
            if settings.replicas > 7 {
                bail!("--replicas must be at most 7");
            }
            let mut servers = match &settings.netns {
                Some(ns) => {
                    plusfs_netns::require_root()?;
                    let replicas = settings.replicas.max(1);
                    let planned = Net::plan(&data, &ids, replicas, ns.clients.max(1), ns.shape)?;
                    let servers = ids.iter().map(|&id| host_servers(&planned, id, replicas)).collect();
                    planned.save(&data)?;
                    net = Some(planned);
                    servers
                }
                None if settings.replicas > 1 => replicated_servers(&ids, settings.replicas)?,
                None => free_ports(servers)?
                    .into_iter()
                    .zip(0u32..)
                    .map(|(port, id)| ServerEntry::new(id, format!("127.0.0.1:{port}"), 1.0))
                    .collect(),
            };
            if !settings.no_metrics {
                assign_metrics(&mut servers, settings.netns.is_some())?;
            }
            let map = ClusterMap {
                epoch: 1,
                sync: settings.sync,
                hugedirs: settings.hugedirs.clone(),
                data: settings.data.clone(),
                txn: settings.txn.clone(),
                delegations: settings.delegations.clone(),
                replication: settings.replication.clone(),
                tls: match settings.insecure {
                    true => TlsSettings::default(),
                    false => TlsSettings {
                        capability_secs: settings.capability_secs,
                        conns_per_identity: settings.conns_per_identity,
                        idle_secs: settings.idle_secs,
                        ..make_certs(&data)?
                    },
                },
                servers,
                migration: None,
                retired: Vec::new(),
                keeper: 0,
                rebalance: settings.rebalance.clone(),
                retry: Default::default(),
            };
            plusfs_netns::write_durably(&path, map.to_toml().as_bytes())?;
            map
        };
        Ok(LocalCluster {
            exe: exe.to_path_buf(),
            data,
            map,
            children: Vec::new(),
            net,
            proxies: Vec::new(),
            new_cluster,
            already_running: 0,
        })
    }

    /// Starts every server (every member of a replicated one) that is not running, and
    /// waits until all answer: on a running cluster it starts only what is missing (a
    /// member that died, a server stopped by hand), so it can be run again at any time.
    /// What runs is found in the process table (`procs`), whoever started it.
    pub fn up(exe: &Path, data: &Path, servers: Option<usize>, settings: &ClusterSettings) -> Result<LocalCluster> {
        let mut c = LocalCluster::prepare(exe, data, servers, settings)?;
        let running = procs::server_procs(&c.map_file());
        let all: Vec<(u32, Option<u64>)> =
            c.map.servers.iter().flat_map(|s| procs_of(s).into_iter().map(move |m| (s.id, m))).collect();
        let missing: Vec<(u32, Option<u64>)> =
            all.iter().copied().filter(|&(id, m)| !running.iter().any(|p| p.id == id && p.member == m)).collect();
        if let Some(net) = &c.net {
            if missing.len() == all.len() {
                // Rules and links start afresh: whatever a crash left is removed first.
                plusfs_netns::destroy_namespaces(&c.data)?;
                net.create()?;
            }
            for &(id, m) in &missing {
                if !pid_file_alive(&c.data, &proxy_name(id, m)) {
                    c.start_proxy(id, m)?;
                }
            }
        }
        for &(id, m) in &missing {
            c.start_proc(id, m, &[])?;
        }
        c.already_running = all.len() - missing.len();
        c.wait_ready(Duration::from_secs(30))?;
        c.new_cluster = false;
        Ok(c)
    }

    /// How many server processes were already running when [`LocalCluster::up`] ran.
    pub fn already_running(&self) -> usize {
        self.already_running
    }

    /// The private network, if the cluster has one.
    pub fn net(&self) -> Option<&Net> {
        self.net.as_ref()
    }

    /// Starts the delaying proxy in front of server `id` (its member `member`) in its
    /// namespace.
    fn start_proxy(&mut self, id: u32, member: Option<u64>) -> Result<()> {
        let net = self.net.as_ref().expect("a private network");
        let host = plusfs_netns::host_name(id, member);
        let ns = &net.member(&host).with_context(|| format!("no host {host} in the network"))?.ns;
        let name = proxy_name(id, member);
        let log = private_log(self.data.join(format!("{name}.log")))?;
        let mut cmd = Command::new(&self.exe);
        cmd.args(["netns", "proxy", "--host", &host, "--data"])
            .arg(&self.data)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0);
        let handle = NsHandle::open(ns)?;
        handle.apply(&mut cmd);
        let child = cmd.spawn().with_context(|| format!("cannot start the proxy of host {host}"))?;
        fs::write(self.data.join(format!("{name}.pid")), child.id().to_string())?;
        self.proxies.push((name, child));
        Ok(())
    }

    /// The cluster map.
    pub fn map(&self) -> &ClusterMap {
        &self.map
    }

    /// The cluster map file.
    pub fn map_file(&self) -> PathBuf {
        map_path(&self.data)
    }

    /// The data directory.
    pub fn data(&self) -> &Path {
        &self.data
    }

    /// Server ids in map order.
    pub fn ids(&self) -> Vec<u32> {
        self.map.servers.iter().map(|s| s.id).collect()
    }

    /// Starts server `id` (every member of a replicated one) as child processes, each in
    /// its own process group, so a terminal's Ctrl-C reaches only the command that started
    /// it.
    pub fn start(&mut self, id: u32) -> Result<()> {
        self.start_with_env(id, &[])
    }

    /// Starts server `id` with extra environment variables (fault-injection tests set
    /// `PLUSFS_FAILPOINT`).
    pub fn start_with_env(&mut self, id: u32, env: &[(&str, &str)]) -> Result<()> {
        let s = self.map.server(id).with_context(|| format!("no server {id} in the map"))?.clone();
        for m in procs_of(&s) {
            self.start_proc(id, m, env)?;
        }
        Ok(())
    }

    /// Starts member `member` of replicated server `id`.
    pub fn start_member(&mut self, id: u32, member: u64) -> Result<()> {
        self.start_proc(id, Some(member), &[])
    }

    /// Starts every member of replicated server `id`, which joins a running cluster: its
    /// lowest member makes the replica group on this first start.
    pub fn start_new_group(&mut self, id: u32) -> Result<()> {
        let s = self.map.server(id).with_context(|| format!("no server {id} in the map"))?.clone();
        anyhow::ensure!(!s.members.is_empty(), "server {id} is not replicated");
        let was_new = std::mem::replace(&mut self.new_cluster, true);
        let started = s.members.iter().try_for_each(|m| self.start_proc(id, Some(m.id), &[]));
        self.new_cluster = was_new;
        started
    }

    /// New members for a replica group of `replicas` on free loopback ports (ids 0, 1, …),
    /// with metrics endpoints if the cluster's servers have them.
    pub fn new_group_members(&self, replicas: usize) -> Result<Vec<MemberEntry>> {
        let with_metrics =
            self.map.servers.iter().any(|s| s.metrics.is_some() || s.members.iter().any(|m| m.metrics.is_some()));
        let ports = free_ports(replicas * 3)?;
        Ok(ports
            .chunks(3)
            .enumerate()
            .map(|(i, p)| MemberEntry {
                id: i as u64,
                address: format!("127.0.0.1:{}", p[0]),
                raft: format!("127.0.0.1:{}", p[1]),
                metrics: with_metrics.then(|| format!("127.0.0.1:{}", p[2])),
            })
            .collect())
    }

    fn start_proc(&mut self, id: u32, member: Option<u64>, env: &[(&str, &str)]) -> Result<()> {
        let name = proc_name(id, member);
        let dir = self.data.join(&name);
        // A replica group is made on the first start of its members (a new cluster's, or
        // a group joining a running one).
        let bootstrap = self.new_cluster && member.is_some() && !dir.exists();
        fs::create_dir_all(&dir)?;
        let log = private_log(self.data.join(format!("{name}.log")))?;
        let mut cmd = Command::new(&self.exe);
        cmd.arg("server")
            .arg("--cluster")
            .arg(self.map_file())
            .arg("--id")
            .arg(id.to_string())
            .arg("--data")
            .arg(&dir)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0);
        if let Some(m) = member {
            cmd.arg("--member").arg(m.to_string());
        }
        if bootstrap {
            cmd.arg("--bootstrap");
        }
        // In its namespace, behind its proxy; the handle stays open until the spawn.
        let mut handle = None;
        if let Some(net) = &self.net {
            let host = plusfs_netns::host_name(id, member);
            let ns = &net.member(&host).with_context(|| format!("no host {host} in the network"))?.ns;
            cmd.arg("--listen").arg(format!("127.0.0.1:{}", plusfs_netns::INNER_PORT));
            if member.is_some() {
                cmd.arg("--raft-listen").arg(format!("127.0.0.1:{}", plusfs_netns::RAFT_INNER_PORT));
            }
            let h = NsHandle::open(ns)?;
            h.apply(&mut cmd);
            handle = Some(h);
        }
        let child = cmd.spawn().with_context(|| format!("cannot start {}", self.exe.display()))?;
        drop(handle);
        fs::write(self.data.join(format!("{name}.pid")), child.id().to_string())?;
        self.children.retain(|(n, _)| *n != name);
        self.children.push((name, child));
        Ok(())
    }

    /// Waits until every server answers a ping. Safe to call from async code: the pings
    /// run on a thread of their own.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let from = self.net.as_ref().and_then(|n| n.clients().next().map(|c| c.ns.clone()));
        for s in self.map.servers.clone() {
            loop {
                if ping(&self.map, s.id, from.as_deref())? {
                    break;
                }
                for m in procs_of(&s) {
                    let name = proc_name(s.id, m);
                    if let Some((_, child)) = self.children.iter_mut().find(|(n, _)| *n == name) {
                        if let Some(status) = child.try_wait()? {
                            bail!(
                                "server {} exited ({status}) during start-up; see {}",
                                s.id,
                                self.data.join(format!("{name}.log")).display()
                            );
                        }
                    }
                }
                if Instant::now() > deadline {
                    bail!("server {} did not answer within {timeout:?}", s.id);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(())
    }

    /// Process id of server `id` (its first member's, if replicated), if this cluster
    /// object started it and it runs.
    pub fn pid(&self, id: u32) -> Option<u32> {
        let name = proc_name(id, self.map.server(id)?.members.first().map(|m| m.id));
        self.children.iter().find(|(n, _)| *n == name).map(|(_, c)| c.id())
    }

    /// Whether the process of unreplicated server `id` this cluster object started has
    /// exited (it is reaped then).
    pub fn has_exited(&mut self, id: u32) -> Result<bool> {
        let name = proc_name(id, None);
        match self.children.iter_mut().find(|(n, _)| *n == name) {
            Some((_, child)) => Ok(child.try_wait()?.is_some()),
            None => Ok(true),
        }
    }

    /// Process id of member `member` of server `id`, if this cluster object started it.
    pub fn member_pid(&self, id: u32, member: u64) -> Option<u32> {
        let name = proc_name(id, Some(member));
        self.children.iter().find(|(n, _)| *n == name).map(|(_, c)| c.id())
    }

    /// A new member for replicated server `id` on free loopback ports, with the next id.
    pub fn new_member(&self, id: u32) -> Result<MemberEntry> {
        let s = self.map.server(id).with_context(|| format!("no server {id} in the map"))?;
        anyhow::ensure!(!s.members.is_empty(), "server {id} is not replicated");
        let ports = free_ports(3)?;
        let next = s.members.iter().map(|m| m.id).max().unwrap_or(0) + 1;
        let with_metrics = s.members.iter().any(|m| m.metrics.is_some());
        Ok(MemberEntry {
            id: next,
            address: format!("127.0.0.1:{}", ports[0]),
            raft: format!("127.0.0.1:{}", ports[1]),
            metrics: with_metrics.then(|| format!("127.0.0.1:{}", ports[2])),
        })
    }

    /// Reads the cluster map file again (after a command changed it).
    pub fn reload_map(&mut self) -> Result<()> {
        self.map = ClusterMap::load(&self.map_file())?;
        Ok(())
    }

    /// Replaces the cluster map (its file written durably first).
    pub fn set_map(&mut self, map: ClusterMap) -> Result<()> {
        map.validate()?;
        plusfs_netns::write_durably(&self.map_file(), map.to_toml().as_bytes())?;
        self.map = map;
        Ok(())
    }

    /// Stops member `member` of server `id` from its pid file, whoever started it
    /// (SIGTERM, then SIGKILL after `grace`). Returns whether it was running.
    pub fn stop_member_by_pid(&mut self, id: u32, member: u64, grace: Duration) -> Result<bool> {
        let name = proc_name(id, Some(member));
        if self.children.iter().any(|(n, _)| *n == name) {
            self.signal_and_reap_proc(&name, libc::SIGTERM)?;
            return Ok(true);
        }
        let pid_file = self.data.join(format!("{name}.pid"));
        let Some(pid) = fs::read_to_string(&pid_file).ok().and_then(|t| t.trim().parse::<u32>().ok()) else {
            return Ok(false);
        };
        let running = terminate(pid, grace);
        let _ = fs::remove_file(&pid_file);
        Ok(running)
    }

    /// Each member of replicated server `id` and its view of the group (`None`: it did
    /// not answer).
    pub fn group_views(&self, id: u32) -> Result<Vec<(u64, Option<plusfs_proto::GroupInfo>)>> {
        let from = self.net.as_ref().and_then(|n| n.clients().next().map(|c| c.ns.clone()));
        let s = self.map.server(id).with_context(|| format!("no server {id} in the map"))?;
        group_views((&self.map.tls, s), from.as_deref())
    }

    /// The member of replicated server `id` that serves it now, if one does.
    pub fn serving_member(&self, id: u32) -> Result<Option<u64>> {
        Ok(self.group_views(id)?.into_iter().find(|(_, g)| g.as_ref().is_some_and(|g| g.serving)).map(|(m, _)| m))
    }

    /// Log files of every server process (members' for replicated servers).
    pub fn logs(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for s in &self.map.servers {
            for m in procs_of(s) {
                out.push(self.data.join(format!("{}.log", proc_name(s.id, m))));
            }
        }
        out
    }

    /// Kills server `id` (every member of a replicated one) with SIGKILL (a crash) and
    /// reaps it.
    pub fn kill(&mut self, id: u32) -> Result<()> {
        self.signal_and_reap(id, libc::SIGKILL)
    }

    /// Kills member `member` of server `id` with SIGKILL and reaps it.
    pub fn kill_member(&mut self, id: u32, member: u64) -> Result<()> {
        self.signal_and_reap_proc(&proc_name(id, Some(member)), libc::SIGKILL)
    }

    /// Stops server `id` with SIGTERM and waits for it.
    pub fn stop(&mut self, id: u32) -> Result<()> {
        self.signal_and_reap(id, libc::SIGTERM)
    }

    fn signal_and_reap(&mut self, id: u32, sig: i32) -> Result<()> {
        let Some(s) = self.map.server(id).cloned() else { return Ok(()) };
        for m in procs_of(&s) {
            self.signal_and_reap_proc(&proc_name(id, m), sig)?;
        }
        Ok(())
    }

    fn signal_and_reap_proc(&mut self, name: &str, sig: i32) -> Result<()> {
        if let Some(pos) = self.children.iter().position(|(n, _)| n == name) {
            let (_, mut child) = self.children.remove(pos);
            send_signal(child.id(), sig);
            child.wait()?;
            let _ = fs::remove_file(self.data.join(format!("{name}.pid")));
        }
        Ok(())
    }

    /// Leaves the servers running after this value is dropped (`cluster up --detach`).
    pub fn detach(mut self) {
        self.children.clear();
        self.proxies.clear();
    }

    /// Stops every server started by this value (and its proxies and network).
    pub fn shutdown(&mut self) -> Result<()> {
        for id in self.ids() {
            self.stop(id)?;
        }
        self.stop_network()
    }

    fn stop_network(&mut self) -> Result<()> {
        for (name, mut p) in self.proxies.drain(..) {
            send_signal(p.id(), libc::SIGKILL);
            let _ = p.wait();
            let _ = fs::remove_file(self.data.join(format!("{name}.pid")));
        }
        if self.net.is_some() {
            plusfs_netns::destroy_namespaces(&self.data)?;
        }
        Ok(())
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for (_, child) in &mut self.children {
            send_signal(child.id(), libc::SIGTERM);
        }
        for (_, child) in &mut self.children {
            let _ = child.wait();
        }
        if !self.children.is_empty() || !self.proxies.is_empty() {
            if let Err(e) = self.stop_network() {
                eprintln!("cannot remove the cluster's network: {e:#}");
            }
        }
    }
}

/// Asks each member of replicated server `s` for its view of the group, on a private
/// runtime and thread (moved into namespace `from` if given): (member, its answer or
/// `None` if it did not answer within 2 s).
fn group_views(
    (tls, s): (&TlsSettings, &ServerEntry),
    from: Option<&str>,
) -> Result<Vec<(u64, Option<plusfs_proto::GroupInfo>)>> {
    let members = s.members.clone();
    let tls = tls.clone();
    let from = from.map(NsHandle::open).transpose()?;
    std::thread::spawn(move || -> Result<Vec<(u64, Option<plusfs_proto::GroupInfo>)>> {
        if let Some(ns) = from {
            ns.enter().context("cannot enter the client namespace")?;
        }
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        Ok(rt.block_on(async {
            let mut out = Vec::new();
            for m in members {
                let ask = async {
                    let counters = std::sync::Arc::new(plusfs_rpc::Counters::default());
                    let c = plusfs_rpc::Connection::connect_to(&m.address, counters, &tls).await.ok()?;
                    match c.call(&plusfs_proto::Cred::server(), &plusfs_proto::Request::GroupStatus).await {
                        Ok(Ok(plusfs_proto::Reply::Group(g))) => Some(g),
                        _ => None,
                    }
                };
                out.push((m.id, tokio::time::timeout(Duration::from_secs(2), ask).await.ok().flatten()));
            }
            out
        }))
    })
    .join()
    .map_err(|_| anyhow::anyhow!("group status thread panicked"))?
}

/// One ping of server `id` on a private runtime and thread (moved into namespace `from`
/// if given); `Ok(false)` if it did not answer.
fn ping(map: &ClusterMap, id: u32, from: Option<&str>) -> Result<bool> {
    let map = map.clone();
    let from = from.map(NsHandle::open).transpose()?;
    let answered = std::thread::spawn(move || -> Result<bool> {
        if let Some(ns) = from {
            ns.enter().context("cannot enter the client namespace")?;
        }
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        rt.block_on(async {
            let client = Client::new(map, ClientOptions { retries: 0, ..Default::default() });
            let ping = client.call_server(id, &plusfs_proto::Request::Ping);
            // Only the right server counts: another process on that address is not it.
            let answer = tokio::time::timeout(Duration::from_secs(2), ping).await;
            Ok(matches!(answer, Ok(Ok(plusfs_proto::Reply::Pong { server, .. })) if server == id))
        })
    })
    .join()
    .map_err(|_| anyhow::anyhow!("ping thread panicked"))??;
    Ok(answered)
}

#[allow(unsafe_code)]
fn send_signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) with a pid of a child this process started; no memory is touched.
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

/// Kills process `pid` at once (SIGKILL, as a crash test does).
pub fn kill_pid(pid: u32) {
    send_signal(pid, libc::SIGKILL);
}

/// Whether process `pid` exists (a child that died stays until it is reaped).
pub fn alive(pid: u32) -> bool {
    #[allow(unsafe_code)]
    // SAFETY: signal 0 only checks that the process exists.
    unsafe {
        libc::kill(pid as i32, 0) == 0
    }
}

/// Stops the servers of the cluster in `data` from their pid files (`cluster down`):
/// SIGTERM, then SIGKILL after `grace`; then its proxies and private network, if any
/// (also what a crash left of them). Returns how many servers were stopped.
pub fn down(data: &Path, grace: Duration) -> Result<usize> {
    let map = ClusterMap::load(&map_path(data)).with_context(|| format!("no cluster in {}", data.display()))?;
    let stopped = stop_servers(data, &map, grace)?;
    for s in &map.servers {
        for m in procs_of(s) {
            let pid_file = data.join(format!("{}.pid", proxy_name(s.id, m)));
            if let Some(pid) = fs::read_to_string(&pid_file).ok().and_then(|t| t.trim().parse::<u32>().ok()) {
                if alive(pid) {
                    send_signal(pid, libc::SIGKILL);
                }
                let _ = fs::remove_file(&pid_file);
            }
        }
    }
    plusfs_netns::destroy_namespaces(data)?;
    Ok(stopped)
}

/// Stops process `pid` if it runs: SIGTERM, then SIGKILL after `grace`. Returns whether
/// it was running.
fn terminate(pid: u32, grace: Duration) -> bool {
    if !alive(pid) {
        return false;
    }
    send_signal(pid, libc::SIGTERM);
    let deadline = Instant::now() + grace;
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    if alive(pid) {
        send_signal(pid, libc::SIGKILL);
    }
    true
}

/// Starts server `id` of the local cluster in `data`, not yet in its map, listening on
/// `listen` and waiting to be added (`plusfs server --join`); it runs detached, with its
/// log and pid file where the cluster's other servers have theirs. Returns its pid.
pub fn spawn_joining(exe: &Path, data: &Path, id: u32, listen: &str) -> Result<u32> {
    let name = proc_name(id, None);
    let dir = data.join(&name);
    fs::create_dir_all(&dir)?;
    let log = private_log(data.join(format!("{name}.log")))?;
    let child = Command::new(exe)
        .arg("server")
        .arg("--cluster")
        .arg(map_path(data))
        .args(["--id", &id.to_string(), "--listen", listen, "--join", "--data"])
        .arg(&dir)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .with_context(|| format!("cannot start {}", exe.display()))?;
    fs::write(data.join(format!("{name}.pid")), child.id().to_string())?;
    Ok(child.id())
}

/// Stops unreplicated server `id` of the cluster in `data` from its pid file (SIGTERM, then
/// SIGKILL after `grace`). Returns whether it was running.
pub fn stop_server(data: &Path, id: u32, grace: Duration) -> Result<bool> {
    stop_named(data, &proc_name(id, None), grace)
}

/// Stops every process of server slot `s` (its members, if replicated) of the cluster in
/// `data` from their pid files. Returns how many were running.
pub fn stop_slot(data: &Path, s: &ServerEntry, grace: Duration) -> Result<usize> {
    let mut stopped = 0;
    for m in procs_of(s) {
        stopped += stop_named(data, &proc_name(s.id, m), grace)? as usize;
    }
    Ok(stopped)
}

fn stop_named(data: &Path, name: &str, grace: Duration) -> Result<bool> {
    let pid_file = data.join(format!("{name}.pid"));
    let Ok(text) = fs::read_to_string(&pid_file) else { return Ok(false) };
    let pid: u32 = text.trim().parse().with_context(|| format!("bad pid in {}", pid_file.display()))?;
    let was = terminate(pid, grace);
    let _ = fs::remove_file(&pid_file);
    Ok(was)
}

/// Whether the process in pid file `NAME.pid` of the cluster in `data` runs.
fn pid_file_alive(data: &Path, name: &str) -> bool {
    let pid = fs::read_to_string(data.join(format!("{name}.pid"))).ok().and_then(|t| t.trim().parse::<u32>().ok());
    pid.is_some_and(alive)
}

/// Stops every server process of the cluster: those of its pid files, and any other
/// `plusfs server` of its map (a member restarted by hand).
fn stop_servers(data: &Path, map: &ClusterMap, grace: Duration) -> Result<usize> {
    let mut stopped = stop_pid_files(data, map, grace)?;
    for p in procs::server_procs(&map_path(data)) {
        if terminate(p.pid, grace) {
            stopped += 1;
        }
    }
    Ok(stopped)
}

fn stop_pid_files(data: &Path, map: &ClusterMap, grace: Duration) -> Result<usize> {
    let mut stopped = 0;
    for s in &map.servers {
        for m in procs_of(s) {
            let pid_file = data.join(format!("{}.pid", proc_name(s.id, m)));
            let Ok(text) = fs::read_to_string(&pid_file) else { continue };
            let pid: u32 = text.trim().parse().with_context(|| format!("bad pid in {}", pid_file.display()))?;
            if terminate(pid, grace) {
                stopped += 1;
            }
            let _ = fs::remove_file(&pid_file);
        }
    }
    Ok(stopped)
}
