//! A private network for a plusfs cluster on one machine: each server and each client host
//! in its own network namespace with its own address, all linked by veth pairs to a bridge
//! in a hub namespace, so the cluster map holds real, distinct host addresses.
//!
//! ```text
//!  plusfs-TAG-s0 (10.213.1.1)   plusfs-TAG-s1 (10.213.1.2) …   plusfs-TAG-c0 (10.213.2.1) …
//!        eth0                         eth0                              eth0
//!          \___ s0 ___________ s1 ___ br0 (plusfs-TAG-hub) ___ c0 _____/
//! ```
//! The hub has no address and nothing links it to the machine's own namespace or
//! interfaces: traffic stays between the namespaces made here, and there is no route out.
//! Links are shaped per member: a token bucket (`tc tbf`) on both ends for the rate,
//! nftables `numgen random` drops on arrival for loss, and delay by a user-space proxy in
//! front of each server ([`proxy`]; this kernel has no netem). Partitions are nftables
//! rules in the members' namespaces. Deleting the namespaces deletes every link, qdisc and
//! rule with them, so [`destroy_namespaces`] leaves nothing behind, also after a crash: it removes
//! every namespace named after the cluster, whether or not the state file survived.

mod cmd;
pub mod proxy;
pub mod shape;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use shape::LinkShape;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

/// Port the servers' public addresses use (each server is its own host).
pub const SERVER_PORT: u16 = 7000;
/// Port a server listens on inside its namespace, behind its proxy.
pub const INNER_PORT: u16 = 7001;
/// Port a replica-group member exchanges Raft messages on (its proxy's: Raft links are
/// delayed like the others).
pub const RAFT_PORT: u16 = 7100;
/// Port a member listens on for Raft messages inside its namespace, behind its proxy.
pub const RAFT_INNER_PORT: u16 = 7101;

/// The host name of server `id`, or of its replica-group member `member`.
pub fn host_name(id: u32, member: Option<u64>) -> String {
    match member {
        Some(k) => format!("s{id}m{k}"),
        None => format!("s{id}"),
    }
}
/// Name of the state file in a cluster's data directory.
pub const STATE_FILE: &str = "netns.toml";

/// One host of the private network.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Member {
    /// `s<ID>` for server ID (`s<ID>m<K>` for member K of a replicated one), `c<K>` for
    /// client host K.
    pub name: String,
    /// Its network namespace.
    pub ns: String,
    /// Its address on the bridge.
    pub addr: Ipv4Addr,
    /// A server's own one-way delay and jitter in µs, instead of the network's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay: Option<(u64, u64)>,
}

/// A cluster's private network, as planned and (once created) as it exists.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Net {
    /// Short id of the cluster (from its data directory) in every namespace name.
    pub tag: String,
    /// The hub namespace holding the bridge.
    pub hub: String,
    /// Every link's shape.
    pub shape: LinkShape,
    /// Servers, then client hosts.
    pub members: Vec<Member>,
}

/// Fails unless this process may create network namespaces.
pub fn require_root() -> Result<()> {
    #[allow(unsafe_code)]
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        bail!("a cluster on network namespaces needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN); run it as root");
    }
    Ok(())
}

/// The tag of the cluster in `data` (a canonical path): 6 hex digits of its FNV-1a hash.
pub fn tag_for(data: &Path) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for b in data.as_os_str().as_encoded_bytes() {
        h = (h ^ u32::from(*b)).wrapping_mul(0x0100_0193);
    }
    format!("{:06x}", h & 0xff_ffff)
}

impl Net {
    /// Plans the network of the cluster in `data`: `servers` servers (each a host, or
    /// `replicas` hosts, one per member, when more than 1), `clients` client hosts.
    pub fn plan(data: &Path, servers: &[u32], replicas: usize, clients: usize, shape: LinkShape) -> Result<Net> {
        if servers.iter().any(|&id| id >= 250) || clients > 250 || replicas > 7 {
            bail!("a private network holds at most 250 servers (ids 0-249) of at most 7 members, and 250 client hosts");
        }
        let tag = tag_for(data);
        let member =
            |name: String, addr: Ipv4Addr| Member { ns: format!("plusfs-{tag}-{name}"), name, addr, delay: None };
        let mut members: Vec<Member> = Vec::new();
        for &id in servers {
            if replicas > 1 {
                for k in 0..replicas as u64 {
                    let addr = Ipv4Addr::new(10, 213, 10 + k as u8, id as u8 + 1);
                    members.push(member(host_name(id, Some(k)), addr));
                }
            } else {
                members.push(member(host_name(id, None), Ipv4Addr::new(10, 213, 1, id as u8 + 1)));
            }
        }
        members.extend((0..clients).map(|k| member(format!("c{k}"), Ipv4Addr::new(10, 213, 2, k as u8 + 1))));
        Ok(Net { hub: format!("plusfs-{tag}-hub"), tag, shape, members })
    }

    /// The public address of server `id`'s host (what the cluster map says), or of host
    /// `name`'s server (`s0m1`).
    pub fn server_address(&self, id: u32) -> Option<String> {
        self.host_address(&host_name(id, None))
    }

    /// The public address of the server on host `name`.
    pub fn host_address(&self, name: &str) -> Option<String> {
        self.member(name).map(|m| format!("{}:{SERVER_PORT}", m.addr))
    }

    /// The member called `name` (`s0`, `c1`, …).
    pub fn member(&self, name: &str) -> Option<&Member> {
        self.members.iter().find(|m| m.name == name)
    }

    /// The client hosts.
    pub fn clients(&self) -> impl Iterator<Item = &Member> {
        self.members.iter().filter(|m| m.name.starts_with('c'))
    }

    /// Reads the state file of the cluster in `data`, if it has a private network.
    pub fn load(data: &Path) -> Result<Option<Net>> {
        let path = data.join(STATE_FILE);
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok(Some(toml::from_str(&text).with_context(|| format!("cannot parse {}", path.display()))?)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
        }
    }

    /// Writes the state file (to a temporary name, fsynced, renamed, directory fsynced).
    pub fn save(&self, data: &Path) -> Result<()> {
        let text = toml::to_string(self).context("cannot encode the network state")?;
        write_durably(&data.join(STATE_FILE), text.as_bytes())
    }

    /// Creates the namespaces, bridge, links, qdiscs and rules. On failure removes what
    /// it made.
    pub fn create(&self) -> Result<()> {
        require_root()?;
        if let Some(n) = cmd::namespaces()?.into_iter().find(|n| n.starts_with(&format!("plusfs-{}-", self.tag))) {
            bail!("namespace {n} already exists: `plusfs cluster down` removes the old network first");
        }
        let made = self.create_all();
        if made.is_err() {
            let _ = destroy_tag(&self.tag);
        }
        made
    }

    fn create_all(&self) -> Result<()> {
        cmd::ip(&["netns", "add", &self.hub])?;
        cmd::ip_in(&self.hub, &["link", "set", "lo", "up"])?;
        cmd::ip_in(&self.hub, &["link", "add", "br0", "type", "bridge"])?;
        cmd::ip_in(&self.hub, &["link", "set", "br0", "up"])?;
        for m in &self.members {
            cmd::ip(&["netns", "add", &m.ns])?;
            cmd::ip_in(&self.hub, &["link", "add", &m.name, "type", "veth", "peer", "name", "eth0", "netns", &m.ns])?;
            cmd::ip_in(&self.hub, &["link", "set", &m.name, "master", "br0"])?;
            cmd::ip_in(&self.hub, &["link", "set", &m.name, "up"])?;
            cmd::ip_in(&m.ns, &["addr", "add", &format!("{}/16", m.addr), "dev", "eth0"])?;
            cmd::ip_in(&m.ns, &["link", "set", "eth0", "up"])?;
            cmd::ip_in(&m.ns, &["link", "set", "lo", "up"])?;
            cmd::nft_in(&m.ns, &rules(self.shape.loss_ppm))?;
            self.shape_rate(m, self.shape.rate_bps)?;
        }
        Ok(())
    }

    /// Sets the rate limit of `m`'s link, both directions (0 removes it).
    fn shape_rate(&self, m: &Member, bps: u64) -> Result<()> {
        for (ns, dev) in [(m.ns.as_str(), "eth0"), (self.hub.as_str(), m.name.as_str())] {
            if bps == 0 {
                // Nothing to remove is fine.
                let _ = cmd::tc_in(ns, &["qdisc", "del", "dev", dev, "root"]);
                continue;
            }
            // A bucket of at least 4 ms of traffic and of one 64 KiB GSO segment.
            let burst = (bps / 8 / 250).max(256 << 10).to_string();
            let rate = shape::tc_rate(bps);
            cmd::tc_in(
                ns,
                &["qdisc", "replace", "dev", dev, "root", "tbf", "rate", &rate, "burst", &burst, "latency", "20ms"],
            )?;
        }
        Ok(())
    }

    /// Changes the shape of every link, or of `only`'s (by member name); running proxies
    /// pick up a new delay from the state file in `data` within 200 ms. A host's own delay
    /// applies to a server's link (its proxy adds it); client hosts have rate and loss only.
    pub fn reshape(&mut self, data: &Path, only: Option<&str>, shape: LinkShape) -> Result<()> {
        require_root()?;
        let targets: Vec<Member> = match only {
            Some(name) => vec![self.member(name).cloned().with_context(|| format!("no member '{name}'"))?],
            None => self.members.clone(),
        };
        for m in &targets {
            cmd::nft_in(&m.ns, &format!("flush chain inet plusfs loss\n{}", loss_rule(shape.loss_ppm)))?;
            self.shape_rate(m, shape.rate_bps)?;
        }
        match only {
            None => {
                self.shape = shape;
                self.members.iter_mut().for_each(|m| m.delay = None);
            }
            Some(name) => {
                let own = (shape.delay_us, shape.jitter_us);
                let m = self.members.iter_mut().find(|m| m.name == name).expect("checked");
                if own != (self.shape.delay_us, self.shape.jitter_us) {
                    if !name.starts_with('s') {
                        bail!("a delay applies to a server's link (its proxy adds it); '{name}' is a client host");
                    }
                    m.delay = Some(own);
                }
            }
        }
        self.save(data)
    }

    /// The one-way delay and jitter in µs on the link of host `name`.
    pub fn delay_of(&self, name: &str) -> (u64, u64) {
        self.member(name).and_then(|m| m.delay).unwrap_or((self.shape.delay_us, self.shape.jitter_us))
    }

    /// Cuts traffic between every two members of different `groups` (names like `s0`,
    /// `c1`); members in no group keep talking to everyone.
    pub fn partition(&self, groups: &[Vec<String>]) -> Result<()> {
        require_root()?;
        for g in groups {
            for name in g {
                if self.member(name).is_none() {
                    bail!("no member '{name}' (members: {})", self.names().join(", "));
                }
            }
        }
        self.heal()?;
        for (i, g) in groups.iter().enumerate() {
            let others: Vec<String> = groups
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .flat_map(|(_, o)| o.iter().map(|n| self.member(n).expect("checked").addr.to_string()))
                .collect();
            if others.is_empty() {
                continue;
            }
            let set = others.join(", ");
            for name in g {
                let m = self.member(name).expect("checked");
                let script = format!(
                    "add rule inet plusfs cut_in ip saddr {{ {set} }} drop\nadd rule inet plusfs cut_out ip daddr {{ {set} }} drop\n"
                );
                cmd::nft_in(&m.ns, &script)?;
            }
        }
        Ok(())
    }

    /// Removes every partition.
    pub fn heal(&self) -> Result<()> {
        require_root()?;
        for m in &self.members {
            cmd::nft_in(&m.ns, "flush chain inet plusfs cut_in\nflush chain inet plusfs cut_out\n")?;
        }
        Ok(())
    }

    /// Member names in order.
    pub fn names(&self) -> Vec<String> {
        self.members.iter().map(|m| m.name.clone()).collect()
    }
}

/// The nftables table of a member: loss on arrival over its link, partition chains.
fn rules(loss_ppm: u32) -> String {
    format!(
        "table inet plusfs {{
  chain loss {{ }}
  chain cut_in {{ }}
  chain cut_out {{ }}
  chain input {{ type filter hook input priority 0; policy accept; iifname \"eth0\" jump loss; jump cut_in; }}
  chain output {{ type filter hook output priority 0; policy accept; jump cut_out; }}
}}
{}",
        loss_rule(loss_ppm)
    )
}

fn loss_rule(loss_ppm: u32) -> String {
    match loss_ppm {
        0 => String::new(),
        p => format!("add rule inet plusfs loss numgen random mod 1000000 < {p} drop\n"),
    }
}

/// Removes the private network of the cluster in `data`: every namespace named after it,
/// and with them their links, qdiscs and rules (also what a crash left). The state file
/// stays, so `cluster up` of the same directory builds the network again. Returns how
/// many namespaces were removed.
pub fn destroy_namespaces(data: &Path) -> Result<usize> {
    destroy_tag(&tag_for(data))
}

fn destroy_tag(tag: &str) -> Result<usize> {
    let prefix = format!("plusfs-{tag}-");
    let mine: Vec<String> = cmd::namespaces()?.into_iter().filter(|n| n.starts_with(&prefix)).collect();
    if !mine.is_empty() {
        require_root()?;
    }
    for ns in &mine {
        cmd::ip(&["netns", "del", ns])?;
    }
    Ok(mine.len())
}

/// The namespaces of the cluster in `data` that exist now.
pub fn existing(data: &Path) -> Result<Vec<String>> {
    let prefix = format!("plusfs-{}-", tag_for(data));
    Ok(cmd::namespaces()?.into_iter().filter(|n| n.starts_with(&prefix)).collect())
}

/// A handle on a namespace, to move a thread or a child process into it.
pub struct NsHandle(std::fs::File);

impl NsHandle {
    /// Opens namespace `ns`.
    pub fn open(ns: &str) -> Result<NsHandle> {
        let path = Path::new("/run/netns").join(ns);
        Ok(NsHandle(std::fs::File::open(&path).with_context(|| format!("no network namespace {ns}"))?))
    }

    /// Moves the calling thread into the namespace: sockets it opens from now on live
    /// there. (Threads it starts later inherit it; the others of the process do not.)
    pub fn enter(&self) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        #[allow(unsafe_code)]
        // SAFETY: setns(2) on a file descriptor this value owns.
        let r = unsafe { libc::setns(self.0.as_raw_fd(), libc::CLONE_NEWNET) };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Makes `cmd` start inside the namespace, in a UTS namespace of its own whose host
    /// name is `hostname` (so programs that tell nodes apart by host name, like MPI and
    /// DMetabench, see one node per host).
    pub fn apply_as_host(&self, cmd: &mut std::process::Command, hostname: &str) {
        use std::os::unix::process::CommandExt;
        self.apply(cmd);
        let name = hostname.as_bytes().to_vec();
        #[allow(unsafe_code)]
        // SAFETY: unshare(2) and sethostname(2) are async-signal-safe; `name` is owned by
        // the closure.
        unsafe {
            cmd.pre_exec(move || {
                if libc::unshare(libc::CLONE_NEWUTS) != 0 || libc::sethostname(name.as_ptr().cast(), name.len()) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }

    /// Makes `cmd` start inside the namespace.
    pub fn apply(&self, cmd: &mut std::process::Command) {
        use std::os::fd::AsRawFd;
        use std::os::unix::process::CommandExt;
        let fd = self.0.as_raw_fd();
        #[allow(unsafe_code)]
        // SAFETY: the closure only calls setns(2), which is async-signal-safe, on a
        // descriptor that stays open until the command has been spawned.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
}

/// Writes `bytes` to `path` so that a crash leaves the old or the new file, never a torn
/// or missing one: a temporary name, fsync, rename, fsync of the directory.
pub fn write_durably(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let dir = path.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).with_context(|| format!("cannot write {}", tmp.display()))?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot rename {} to {}", tmp.display(), path.display()))?;
    std::fs::File::open(&dir)?.sync_all()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_names_and_addresses_every_member() {
        let net = Net::plan(Path::new("/tmp/c1"), &[0, 1, 2], 1, 2, LinkShape::default()).unwrap();
        assert_eq!(net.names(), ["s0", "s1", "s2", "c0", "c1"]);
        assert_eq!(net.server_address(2).unwrap(), "10.213.1.3:7000");
        assert_eq!(net.member("c1").unwrap().addr, Ipv4Addr::new(10, 213, 2, 2));
        assert!(net.members.iter().all(|m| m.ns.starts_with(&format!("plusfs-{}-", net.tag))));
        assert_ne!(tag_for(Path::new("/tmp/c1")), tag_for(Path::new("/tmp/c2")));
        let back: Net = toml::from_str(&toml::to_string(&net).unwrap()).unwrap();
        assert_eq!(back, net);
        assert!(Net::plan(Path::new("/x"), &[250], 1, 0, LinkShape::default()).is_err());
        let replicated = Net::plan(Path::new("/tmp/c1"), &[0, 1], 3, 1, LinkShape::default()).unwrap();
        assert_eq!(replicated.names(), ["s0m0", "s0m1", "s0m2", "s1m0", "s1m1", "s1m2", "c0"]);
        assert_eq!(replicated.host_address("s1m2").unwrap(), "10.213.12.2:7000");
    }

    #[test]
    fn rules_hold_loss_and_partition_chains() {
        let r = rules(1000);
        assert!(r.contains("numgen random mod 1000000 < 1000 drop"));
        assert!(r.contains("chain cut_in") && r.contains("chain cut_out"));
        assert!(!rules(0).contains("numgen"));
    }
}
