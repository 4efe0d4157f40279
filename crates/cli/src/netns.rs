//! `plusfs netns …`: work with the private network of a cluster started with
//! `plusfs cluster up --netns` — run a command on one of its client hosts, partition and
//! heal it, change its links' shape, list its hosts; and the delaying proxy the cluster
//! runs in front of each server.

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use plusfs_netns::shape::{parse_duration_us, parse_loss_ppm, parse_rate, LinkShape};
use plusfs_netns::{Net, NsHandle};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Link shape flags, shared by `cluster up --netns` and `netns shape`.
#[derive(Args, Clone, Default)]
pub struct ShapeArgs {
    /// One-way delay added to every link (e.g. 100us, 1ms), by a user-space proxy in front
    /// of each server.
    #[arg(long, value_parser = parse_duration_us)]
    pub delay: Option<u64>,
    /// Uniform jitter around the delay (e.g. 20us).
    #[arg(long, value_parser = parse_duration_us)]
    pub jitter: Option<u64>,
    /// Rate limit of every link (e.g. 1gbit; 0 for none).
    #[arg(long, value_parser = parse_rate)]
    pub rate: Option<u64>,
    /// Packets dropped on arrival at every host (e.g. 0.1%).
    #[arg(long, value_parser = parse_loss_ppm)]
    pub loss: Option<u32>,
}

impl ShapeArgs {
    /// `base` with the flags given here applied.
    pub fn over(&self, base: LinkShape) -> LinkShape {
        LinkShape {
            delay_us: self.delay.unwrap_or(base.delay_us),
            jitter_us: self.jitter.unwrap_or(base.jitter_us),
            rate_bps: self.rate.unwrap_or(base.rate_bps),
            loss_ppm: self.loss.unwrap_or(base.loss_ppm),
        }
    }

    /// True when any flag was given.
    pub fn any(&self) -> bool {
        self.delay.is_some() || self.jitter.is_some() || self.rate.is_some() || self.loss.is_some()
    }
}

#[derive(Subcommand)]
pub enum NetnsCmd {
    /// Run CMD on a host of the network (`c0`, `c1`, … or a server's `s0`, …) with
    /// PLUSFS_CLUSTER set to the cluster's map.
    Exec {
        /// Data directory of the cluster (default: the directory of PLUSFS_CLUSTER).
        #[arg(long)]
        data: Option<PathBuf>,
        /// The host.
        host: String,
        /// The command and its arguments (after `--`).
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
    /// Cut the network between groups of hosts: `partition s0,c0 s1,s2` (a `|` between
    /// groups is allowed). Hosts in no group keep talking to everyone. Replaces any
    /// earlier partition.
    Partition {
        #[arg(long)]
        data: Option<PathBuf>,
        /// Comma-separated host names, one argument per group.
        #[arg(required = true, num_args = 2..)]
        groups: Vec<String>,
    },
    /// Remove every partition.
    Heal {
        #[arg(long)]
        data: Option<PathBuf>,
    },
    /// Change the links' delay, jitter, rate or loss while the cluster runs.
    Shape {
        #[arg(long)]
        data: Option<PathBuf>,
        /// Change only this host's link (a delay only for a server's: its proxy adds it).
        #[arg(long)]
        host: Option<String>,
        #[command(flatten)]
        shape: ShapeArgs,
    },
    /// The hosts, their namespaces and addresses, and the links' shape.
    List {
        #[arg(long)]
        data: Option<PathBuf>,
    },
    /// Run an MPI program over client hosts: `mpirun` starts on the first host and
    /// reaches the others through `plusfs netns rsh`; every host has its own host name
    /// (`c0`, `c1`, …), so MPI and DMetabench see one node per host. PLUSFS_CLUSTER is
    /// passed to every process.
    Mpirun {
        #[arg(long)]
        data: Option<PathBuf>,
        /// Client hosts to run on, comma-separated (default: every client host).
        #[arg(long, value_delimiter = ',')]
        hosts: Vec<String>,
        /// Processes per host.
        #[arg(long, default_value_t = 1)]
        ppn: usize,
        /// The mpirun program.
        #[arg(long, default_value = "mpirun")]
        mpirun: String,
        /// The program and its arguments (after `--`).
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
    /// (Internal) the remote shell `netns mpirun` gives mpirun: runs the words of CMD
    /// with `sh -c` on host HOST (its name or address), as ssh would.
    #[command(hide = true)]
    Rsh {
        #[arg(long)]
        data: PathBuf,
        host: String,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        cmd: Vec<String>,
    },
    /// (Internal) the delaying proxy in front of the server on host HOST (`s0`, `s0m1`);
    /// `cluster up --netns` starts it.
    #[command(hide = true)]
    Proxy {
        #[arg(long)]
        data: PathBuf,
        #[arg(long)]
        host: String,
    },
}

/// The cluster directory from `--data` or from the directory of `PLUSFS_CLUSTER`.
fn data_dir(data: Option<PathBuf>, cluster: Option<&PathBuf>) -> Result<PathBuf> {
    match (data, cluster) {
        (Some(d), _) => Ok(d),
        (None, Some(c)) => Ok(c.parent().map(Path::to_path_buf).unwrap_or_default()),
        (None, None) => bail!("pass --data DIR (the cluster's data directory) or set PLUSFS_CLUSTER"),
    }
}

fn load(data: &Path) -> Result<Net> {
    let data = data.canonicalize().with_context(|| format!("no cluster in {}", data.display()))?;
    Net::load(&data)?
        .with_context(|| format!("the cluster in {} has no private network (cluster up --netns)", data.display()))
}

pub fn run(c: NetnsCmd, cluster: Option<PathBuf>) -> Result<ExitCode> {
    match c {
        NetnsCmd::Exec { data, host, cmd } => {
            let data = data_dir(data, cluster.as_ref())?.canonicalize()?;
            let net = load(&data)?;
            let m =
                net.member(&host).with_context(|| format!("no host '{host}' (hosts: {})", net.names().join(", ")))?;
            let mut command = std::process::Command::new(&cmd[0]);
            command.args(&cmd[1..]).env("PLUSFS_CLUSTER", plusfs_localcluster::map_path(&data));
            let ns = NsHandle::open(&m.ns)?;
            ns.apply_as_host(&mut command, &m.name);
            let e = command.exec();
            drop(ns);
            bail!("cannot run {}: {e}", cmd[0])
        }
        NetnsCmd::Mpirun { data, hosts, ppn, mpirun, cmd } => {
            let data = data_dir(data, cluster.as_ref())?.canonicalize()?;
            crate::mpirun::mpirun(&load(&data)?, &data, &hosts, ppn, &mpirun, &cmd)
        }
        NetnsCmd::Rsh { data, host, cmd } => {
            let net = load(&data)?;
            let m = net
                .members
                .iter()
                .find(|m| m.name == host || m.addr.to_string() == host)
                .with_context(|| format!("no host '{host}' (hosts: {})", net.names().join(", ")))?;
            let mut command = std::process::Command::new("/bin/sh");
            command.arg("-c").arg(cmd.join(" "));
            let ns = NsHandle::open(&m.ns)?;
            ns.apply_as_host(&mut command, &m.name);
            let e = command.exec();
            drop(ns);
            bail!("cannot run a shell on {host}: {e}")
        }
        NetnsCmd::Partition { data, groups } => {
            let net = load(&data_dir(data, cluster.as_ref())?)?;
            let groups: Vec<Vec<String>> = groups
                .iter()
                .filter(|g| g.as_str() != "|")
                .map(|g| g.split(',').filter(|n| !n.is_empty()).map(str::to_string).collect())
                .collect();
            if groups.len() < 2 {
                bail!("give at least two groups of hosts, e.g. `partition s0,c0 s1,s2`");
            }
            net.partition(&groups)?;
            println!("partitioned: {}", groups.iter().map(|g| g.join(",")).collect::<Vec<_>>().join(" | "));
            Ok(ExitCode::SUCCESS)
        }
        NetnsCmd::Heal { data } => {
            load(&data_dir(data, cluster.as_ref())?)?.heal()?;
            println!("healed");
            Ok(ExitCode::SUCCESS)
        }
        NetnsCmd::Shape { data, host, shape } => {
            let data = data_dir(data, cluster.as_ref())?.canonicalize()?;
            let mut net = load(&data)?;
            if !shape.any() {
                bail!("give --delay, --jitter, --rate or --loss");
            }
            let base = match &host {
                Some(h) => {
                    let m =
                        net.member(h).with_context(|| format!("no host '{h}' (hosts: {})", net.names().join(", ")))?;
                    let (delay_us, jitter_us) = m.delay.unwrap_or((net.shape.delay_us, net.shape.jitter_us));
                    LinkShape { delay_us, jitter_us, ..net.shape }
                }
                None => net.shape,
            };
            let new = shape.over(base);
            net.reshape(&data, host.as_deref(), new)?;
            println!("links: {new}");
            Ok(ExitCode::SUCCESS)
        }
        NetnsCmd::List { data } => {
            let net = load(&data_dir(data, cluster.as_ref())?)?;
            println!("links: {}", net.shape);
            for m in &net.members {
                println!("{:<5} {:<16} {}", m.name, m.addr, m.ns);
            }
            Ok(ExitCode::SUCCESS)
        }
        NetnsCmd::Proxy { data, host } => {
            let net = load(&data)?;
            let listen = net.host_address(&host).with_context(|| format!("no host {host}"))?;
            let inner = |port: u16| format!("127.0.0.1:{port}").parse::<std::net::SocketAddr>();
            let mut links = vec![(listen.parse()?, inner(plusfs_netns::INNER_PORT)?)];
            // A replica-group member's Raft messages cross the same delayed link.
            if host.contains('m') {
                let ip = net.member(&host).with_context(|| format!("no host {host}"))?.addr;
                links.push(((ip, plusfs_netns::RAFT_PORT).into(), inner(plusfs_netns::RAFT_INNER_PORT)?));
            }
            plusfs_netns::proxy::run(&links, &data.canonicalize()?, &host)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}
