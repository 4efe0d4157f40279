//! Running `ip`, `tc` and `nft`, with errors that say which command failed and why.

use anyhow::{bail, Context, Result};
use std::io::Write;
use std::process::{Command, Stdio};

/// Runs `prog args…`; fails with its standard error.
pub(crate) fn run(prog: &str, args: &[&str]) -> Result<()> {
    let out = Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {prog} (install iproute2 and nftables)"))?;
    if !out.status.success() {
        bail!("{prog} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// `ip args…`.
pub(crate) fn ip(args: &[&str]) -> Result<()> {
    run("ip", args)
}

/// `ip -n NS args…`.
pub(crate) fn ip_in(ns: &str, args: &[&str]) -> Result<()> {
    let mut all = vec!["-n", ns];
    all.extend_from_slice(args);
    run("ip", &all)
}

/// `tc -n NS args…`.
pub(crate) fn tc_in(ns: &str, args: &[&str]) -> Result<()> {
    let mut all = vec!["-n", ns];
    all.extend_from_slice(args);
    run("tc", &all)
}

/// Loads an nftables `script` in namespace `ns` (one transaction: all or nothing).
pub(crate) fn nft_in(ns: &str, script: &str) -> Result<()> {
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot run nft (install nftables)")?;
    child.stdin.take().expect("piped stdin").write_all(script.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!("nft in {ns}: {}\n{script}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// The named network namespaces (`ip netns list`).
pub(crate) fn namespaces() -> Result<Vec<String>> {
    let dir = std::path::Path::new("/run/netns");
    if !dir.exists() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).context("cannot list /run/netns")? {
        out.push(e?.file_name().to_string_lossy().into_owned());
    }
    out.sort();
    Ok(out)
}
