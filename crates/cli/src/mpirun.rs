//! `plusfs netns mpirun`: an MPI program over the client hosts of a `--netns` cluster.
//!
//! The machine's own namespace has no route to the private network, so `mpirun` itself
//! runs on the first client host; it reaches the other hosts through `plusfs netns rsh`
//! (its remote shell), which starts the MPI daemon in that host's namespace. Each host's
//! processes run in a UTS namespace named after the host, so MPI, `gethostname` and
//! DMetabench's placement discovery see one node per host.

use anyhow::{bail, Context, Result};
use plusfs_netns::{Net, NsHandle};
use std::path::Path;
use std::process::ExitCode;

/// Runs `cmd` with `ppn` processes on each of `hosts` (default: every client host).
pub fn mpirun(net: &Net, data: &Path, hosts: &[String], ppn: usize, mpirun: &str, cmd: &[String]) -> Result<ExitCode> {
    let chosen: Vec<&plusfs_netns::Member> = if hosts.is_empty() {
        net.clients().collect()
    } else {
        hosts
            .iter()
            .map(|h| net.member(h).with_context(|| format!("no host '{h}' (hosts: {})", net.names().join(", "))))
            .collect::<Result<_>>()?
    };
    let Some(first) = chosen.first() else { bail!("the cluster in {} has no client hosts", data.display()) };
    if ppn == 0 {
        bail!("--ppn must be at least 1");
    }
    let hostfile = data.join("mpi-hosts");
    let lines: Vec<String> = chosen.iter().map(|m| format!("{} slots={ppn}", m.addr)).collect();
    std::fs::write(&hostfile, lines.join("\n") + "\n")
        .with_context(|| format!("cannot write {}", hostfile.display()))?;
    let exe = std::env::current_exe().context("cannot find the plusfs program")?;
    let agent = format!("{} netns rsh --data {}", exe.display(), data.display());
    let mut command = std::process::Command::new(mpirun);
    #[allow(unsafe_code)]
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        command.arg("--allow-run-as-root");
    }
    command
        .arg("--hostfile")
        .arg(&hostfile)
        .args(["-np", &(chosen.len() * ppn).to_string()])
        .args(["--mca", "plm_rsh_agent", &agent])
        // Only the private network: the loopback of each namespace is its own.
        .args(["--mca", "btl_tcp_if_include", "10.213.0.0/16", "--mca", "oob_tcp_if_include", "10.213.0.0/16"])
        .args(["-x", "PLUSFS_CLUSTER"])
        .args(cmd)
        .env("PLUSFS_CLUSTER", plusfs_localcluster::map_path(data));
    let ns = NsHandle::open(&first.ns)?;
    ns.apply_as_host(&mut command, &first.name);
    eprintln!(
        "mpirun: {} process(es) on {}",
        chosen.len() * ppn,
        chosen.iter().map(|m| m.name.as_str()).collect::<Vec<_>>().join(", ")
    );
    let status = command.status().with_context(|| format!("cannot run {mpirun}"))?;
    drop(ns);
    Ok(match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(c) => ExitCode::from(c.clamp(1, 255) as u8),
        None => ExitCode::FAILURE,
    })
}
