//! `plusfs quota`: set, lift, show and report quotas (files and bytes per directory tree,
//! user or group), enforced by the servers.

use crate::files::{exit, report};
use clap::{Args, Subcommand};
use plusfs_client::{Client, QuotaLine};
use plusfs_proto::quota::{Limit, Limits, Owner, QuotaTarget};

#[derive(Args)]
pub struct QuotaArgs {
    #[command(subcommand)]
    cmd: QuotaCmd,
}

#[derive(Subcommand)]
enum QuotaCmd {
    /// Set the quota of a directory tree (PATH), a user (--uid) or a group (--gid); root
    /// only. Limits not given are none.
    Set(SetArgs),
    /// Lift the quota of a tree, user or group (usage stays counted).
    Clear(WhoArgs),
    /// Show the usage and quota of a tree, user or group.
    Show(WhoArgs),
    /// Every quota and every owner's usage (summed over the servers).
    Report,
}

#[derive(Args)]
struct WhoArgs {
    /// The root of a directory tree.
    #[arg(conflicts_with_all = ["uid", "gid"], required_unless_present_any = ["uid", "gid"])]
    path: Option<String>,
    #[arg(long, conflicts_with = "gid")]
    uid: Option<u32>,
    #[arg(long)]
    gid: Option<u32>,
}

impl WhoArgs {
    fn target(&self) -> QuotaTarget {
        match (&self.path, self.uid, self.gid) {
            (Some(p), _, _) => QuotaTarget::Tree(p.clone()),
            (_, Some(u), _) => QuotaTarget::Uid(u),
            (_, _, Some(g)) => QuotaTarget::Gid(g),
            _ => unreachable!("clap requires one of them"),
        }
    }
}

#[derive(Args)]
struct SetArgs {
    #[command(flatten)]
    who: WhoArgs,
    /// Hard limit of files (directories and other entries count too).
    #[arg(long)]
    files: Option<u64>,
    /// Hard limit of bytes (file sizes; suffixes k, M, G, T: powers of 1024).
    #[arg(long, value_parser = parse_bytes)]
    bytes: Option<u64>,
    /// Soft limit of files: may be exceeded for the grace period.
    #[arg(long)]
    soft_files: Option<u64>,
    /// Soft limit of bytes.
    #[arg(long, value_parser = parse_bytes)]
    soft_bytes: Option<u64>,
    /// How long usage may stay above a soft limit, in seconds (default 7 days).
    #[arg(long, default_value_t = 7 * 24 * 3600)]
    grace: u64,
}

/// A byte count with an optional binary suffix.
fn parse_bytes(s: &str) -> Result<u64, String> {
    let (num, shift) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => return Err(format!("unknown size suffix '{c}' (k, M, G, T)")),
            };
            (&s[..i], shift)
        }
        _ => (s, 0),
    };
    let n: u64 = num.parse().map_err(|e| format!("'{s}': {e}"))?;
    n.checked_mul(1 << shift).ok_or_else(|| format!("'{s}' is too large"))
}

/// `plusfs quota`.
pub async fn run(c: &Client, a: QuotaArgs) -> std::process::ExitCode {
    let mut failed = false;
    let done = match a.cmd {
        QuotaCmd::Set(s) => {
            let limits = Limits {
                files: Limit { hard: s.files, soft: s.soft_files },
                bytes: Limit { hard: s.bytes, soft: s.soft_bytes },
                grace_secs: s.grace,
            };
            c.quota_set(&s.who.target(), Some(limits)).await
        }
        QuotaCmd::Clear(w) => c.quota_set(&w.target(), None).await,
        QuotaCmd::Show(w) => c.quota_of(&w.target()).await.map(|l| {
            println!("{}", header());
            println!("{}", line(&l));
        }),
        QuotaCmd::Report => c.quota_report().await.map(|lines| {
            println!("{}", header());
            for l in &lines {
                println!("{}", line(l));
            }
        }),
    };
    if let Err(e) = done {
        report(&mut failed, e);
    }
    exit(failed)
}

fn header() -> String {
    format!(
        "{:<24} {:>12} {:>12} {:>12} {:>16} {:>16} {:>16}",
        "OWNER", "FILES", "SOFT", "HARD", "BYTES", "SOFT", "HARD"
    )
}

fn line(l: &QuotaLine) -> String {
    let who = match (l.owner, l.quota.as_ref().and_then(|q| q.path.as_deref())) {
        (Owner::Tree(_), Some(p)) => format!("tree {p}"),
        (o, _) => o.to_string(),
    };
    let limits = l.quota.as_ref().map(|q| q.limits).unwrap_or_default();
    let show = |v: Option<u64>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
    format!(
        "{who:<24} {:>12} {:>12} {:>12} {:>16} {:>16} {:>16}",
        l.used.files,
        show(limits.files.soft),
        show(limits.files.hard),
        l.used.bytes,
        show(limits.bytes.soft),
        show(limits.bytes.hard)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts_take_binary_suffixes_and_refuse_others() {
        assert_eq!(parse_bytes("512"), Ok(512));
        assert_eq!(parse_bytes("4k"), Ok(4096));
        assert_eq!(parse_bytes("2G"), Ok(2 << 30));
        assert!(parse_bytes("3X").unwrap_err().contains("unknown size suffix"));
        assert!(parse_bytes("99999999999T").unwrap_err().contains("too large"));
    }
}
