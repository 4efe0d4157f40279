//! `plusfs cluster init`: the files a cluster of several machines starts from. For a list
//! of hosts it places the server slots (and the members of replicated ones) on them,
//! makes a CA and one server identity per host, and writes:
//!
//! - `OUT/ca/`: the CA (its key signs new identities: keep it on the admin machine);
//! - `OUT/admin/`: the cluster map for the admin machine, with the admin identity;
//! - `OUT/hosts/HOST/`: what to copy to `/etc/plusfs` (or `--etc`) on each host: the map,
//!   the CA certificate, the host's server identity, and one `NAME.env` per server process
//!   it runs, for the systemd unit `plusfs-server@NAME` (packaging/systemd).

use anyhow::{bail, Context, Result};
use plusfs_placement::{ClusterMap, MemberEntry, ServerEntry, SyncMode, TlsSettings};
use plusfs_tls::{Authority, Identity, Role, Validity};
use std::path::{Path, PathBuf};

/// What `cluster init` is asked for.
#[derive(Debug, Clone)]
pub struct InitPlan {
    /// The machines' addresses (names or IPs), in order.
    pub hosts: Vec<String>,
    /// Server slots (default: one per host).
    pub servers: usize,
    /// Members per slot (1: unreplicated).
    pub replicas: usize,
    /// Client port of slot 0; slot S listens on `port + S`.
    pub port: u16,
    /// Raft port of slot 0 (replicated slots); slot S uses `raft_port + S`.
    pub raft_port: u16,
    /// Where each host keeps the bundle (`/etc/plusfs`).
    pub etc: PathBuf,
    /// Where each host keeps the servers' data (`/var/lib/plusfs`).
    pub data_root: PathBuf,
    /// Durability setting of the cluster.
    pub sync: SyncMode,
    /// Validity of the certificates, in days.
    pub days: u32,
}

/// One server process: its slot, member and host.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Placed {
    slot: u32,
    member: Option<u64>,
    host: String,
}

impl Placed {
    /// The process's name (data directory, env file, systemd instance).
    fn name(&self) -> String {
        match self.member {
            Some(m) => format!("server-{}-m{m}", self.slot),
            None => format!("server-{}", self.slot),
        }
    }
}

/// Places every slot's processes: slot S's members on hosts S, S+1, ... (mod the hosts),
/// so each host carries as many as any other and no slot has two members on one host.
fn place(plan: &InitPlan) -> Result<Vec<Placed>> {
    let h = plan.hosts.len();
    if h == 0 {
        bail!("no hosts: give --hosts a,b,c");
    }
    if plan.replicas == 0 || plan.replicas > h {
        bail!("--replicas {} needs at least as many hosts ({h} given)", plan.replicas);
    }
    if plan.servers == 0 || plan.servers > 1000 {
        bail!("--servers must be between 1 and 1000");
    }
    let mut sorted = plan.hosts.clone();
    sorted.sort();
    if sorted.windows(2).any(|w| w[0] == w[1]) {
        bail!("a host is listed twice");
    }
    let mut out = Vec::new();
    for s in 0..plan.servers {
        for k in 0..plan.replicas {
            let member = (plan.replicas > 1).then_some(k as u64 + 1);
            out.push(Placed { slot: s as u32, member, host: plan.hosts[(s + k) % h].clone() });
        }
    }
    Ok(out)
}

fn addr(host: &str, port: u16) -> String {
    match host.contains(':') {
        true => format!("[{host}]:{port}"),
        false => format!("{host}:{port}"),
    }
}

/// The cluster map of `placed` (TLS settings filled in by the caller).
fn map_of(plan: &InitPlan, placed: &[Placed]) -> Result<ClusterMap> {
    let mut servers = Vec::new();
    for s in 0..plan.servers as u32 {
        let port = plan.port.checked_add(s as u16).context("client port out of range")?;
        let raft = plan.raft_port.checked_add(s as u16).context("raft port out of range")?;
        let mine: Vec<&Placed> = placed.iter().filter(|p| p.slot == s).collect();
        let mut entry = ServerEntry::new(s, addr(&mine[0].host, port), 1.0);
        if plan.replicas > 1 {
            entry.members = mine
                .iter()
                .map(|p| MemberEntry {
                    id: p.member.expect("a member"),
                    address: addr(&p.host, port),
                    raft: addr(&p.host, raft),
                    metrics: None,
                })
                .collect();
        }
        servers.push(entry);
    }
    let mut map = ClusterMap::with_servers(servers);
    map.sync = plan.sync;
    Ok(map)
}

/// Writes the cluster's files into `out` (which must not exist yet); returns what it wrote,
/// one line per item, for the user.
pub fn init(plan: &InitPlan, out: &Path) -> Result<Vec<String>> {
    if out.exists() {
        bail!("{} exists: cluster init writes a new directory", out.display());
    }
    let placed = place(plan)?;
    let map = map_of(plan, &placed)?;
    map.validate()?;
    let ca = Authority::create(&out.join("ca"))?;
    let validity = || Validity::days(plan.days);
    let mut report = vec![format!("CA: {} (keep its key on the admin machine only)", out.join("ca").display())];

    // The admin machine: the map with the admin identity, certificates where they are here.
    let admin = out.join("admin");
    ca.issue(&Identity { name: "admin".into(), role: Role::Admin }, validity(), &admin.join("admin"))?;
    std::fs::copy(out.join("ca").join("ca.pem"), admin.join("ca.pem"))?;
    let mut admin_map = map.clone();
    admin_map.tls = TlsSettings {
        ca: Some(admin.join("ca.pem")),
        identity: Some(admin.join("admin")),
        server_identity: None,
        ..TlsSettings::default()
    };
    plusfs_netns::write_durably(&admin.join("cluster.toml"), admin_map.to_toml().as_bytes())?;
    report.push(format!("admin: {} (PLUSFS_CLUSTER for plusfs commands)", admin.join("cluster.toml").display()));

    // Each host: the map with paths under --etc, its server identity, its env files.
    let mut host_map = map;
    host_map.tls = TlsSettings {
        ca: Some(plan.etc.join("ca.pem")),
        identity: None,
        server_identity: Some(plan.etc.join("server")),
        ..TlsSettings::default()
    };
    for host in &plan.hosts {
        let dir = out.join("hosts").join(host);
        let server = Identity { name: format!("server-{host}"), role: Role::Server };
        ca.issue(&server, validity(), &dir.join("server"))?;
        std::fs::copy(out.join("ca").join("ca.pem"), dir.join("ca.pem"))?;
        plusfs_netns::write_durably(&dir.join("cluster.toml"), host_map.to_toml().as_bytes())?;
        let mut names = Vec::new();
        for p in placed.iter().filter(|p| &p.host == host) {
            let data = plan.data_root.join(p.name());
            let mut args = format!(
                "--cluster {} --id {} --data {}",
                plan.etc.join("cluster.toml").display(),
                p.slot,
                data.display()
            );
            if let Some(m) = p.member {
                args.push_str(&format!(" --member {m}"));
                // The lowest member creates the group on its first start (and leaves an
                // existing group as it is on every later one).
                if m == 1 {
                    args.push_str(" --bootstrap");
                }
            }
            std::fs::write(dir.join(format!("{}.env", p.name())), format!("PLUSFS_ARGS={args}\n"))?;
            names.push(p.name());
        }
        report.push(format!("host {host}: {} -> {} ({})", dir.display(), plan.etc.display(), names.join(", ")));
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(hosts: &[&str], servers: usize, replicas: usize) -> InitPlan {
        InitPlan {
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            servers,
            replicas,
            port: 7000,
            raft_port: 7100,
            etc: "/etc/plusfs".into(),
            data_root: "/var/lib/plusfs".into(),
            sync: SyncMode::Always,
            days: 30,
        }
    }

    #[test]
    fn members_spread_over_hosts_one_per_host_per_slot() {
        let placed = place(&plan(&["a", "b", "c"], 3, 3)).unwrap();
        assert_eq!(placed.len(), 9);
        for s in 0..3 {
            let mut hosts: Vec<&str> = placed.iter().filter(|p| p.slot == s).map(|p| p.host.as_str()).collect();
            hosts.sort();
            assert_eq!(hosts, ["a", "b", "c"], "slot {s}");
        }
        let map = map_of(&plan(&["a", "b", "c"], 2, 3), &place(&plan(&["a", "b", "c"], 2, 3)).unwrap()).unwrap();
        map.validate().unwrap();
        assert_eq!(map.servers[1].members[0].address, "b:7001");
        assert_eq!(map.servers[1].members[2].raft, "a:7101");
    }

    #[test]
    fn impossible_plans_are_refused_with_the_reason() {
        let e = place(&plan(&["a", "b"], 2, 3)).unwrap_err().to_string();
        assert!(e.contains("--replicas 3 needs at least as many hosts (2 given)"), "{e}");
        assert!(place(&plan(&["a", "a"], 2, 1)).unwrap_err().to_string().contains("twice"));
        assert!(place(&plan(&[], 1, 1)).is_err());
    }
}
