//! `plusfs cert`: the cluster CA and the identities it issues.

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use plusfs_placement::ClusterMap;
use plusfs_tls::{Authority, Identity, Ranges, Role, RootClaim, Validity};
use std::path::{Path, PathBuf};

#[derive(Subcommand)]
pub enum CertCmd {
    /// Make a new cluster CA in DIR (`ca.pem`, `ca.key`); `cluster up` makes one itself.
    Init {
        #[arg(long)]
        out: PathBuf,
    },
    /// Issue an identity: a directory of cert.pem, key.pem and ca.pem. A client presents
    /// it (PLUSFS_IDENTITY=DIR); its requests may act only as uids and gids in its ranges,
    /// root as nobody with --root-squash (refused otherwise); --node is for a client
    /// machine whose mount acts for all its users (the same bounds; --root-allow lets its
    /// root act as root); --admin may act as anyone and run admin commands; --server is
    /// for `plusfs server`.
    Issue {
        /// Name of the identity (the certificate's common name, shown in logs).
        #[arg(long)]
        name: String,
        /// Uids its requests may claim, e.g. 1000-1999,3000.
        #[arg(long, default_value = "")]
        uids: String,
        /// Gids its requests may claim.
        #[arg(long, default_value = "")]
        gids: String,
        /// A claim of root acts as nobody (65534) instead of being refused.
        #[arg(long, conflicts_with_all = ["admin", "server", "root_allow"])]
        root_squash: bool,
        /// A client machine: a mount presenting it acts for every uid and gid in the
        /// ranges (one per machine; see docs/operations.md).
        #[arg(long, conflicts_with_all = ["admin", "server"])]
        node: bool,
        /// A node's root acts as root (the site trusts the machine's root).
        #[arg(long, requires = "node")]
        root_allow: bool,
        /// An operator: any uid, admin commands.
        #[arg(long, conflicts_with = "server")]
        admin: bool,
        /// A server of the cluster.
        #[arg(long)]
        server: bool,
        /// Days the certificate is valid.
        #[arg(long, default_value_t = 365)]
        days: u32,
        /// The CA directory (default: the one of the cluster map's `[tls] ca`).
        #[arg(long)]
        ca: Option<PathBuf>,
        /// Directory to write the identity to.
        #[arg(long)]
        out: PathBuf,
    },
    /// Revoke a certificate: its serial number goes into the cluster map's revocation
    /// list; servers refuse it from their next connection on.
    Revoke {
        /// The certificate (PEM) to revoke.
        #[arg(long)]
        cert: PathBuf,
    },
    /// Show the identity and serial number of a certificate.
    Show {
        #[arg(long)]
        cert: PathBuf,
    },
}

pub fn run(c: CertCmd, cluster: Option<PathBuf>) -> Result<()> {
    match c {
        CertCmd::Init { out } => {
            Authority::create(&out)?;
            println!("made a cluster CA in {}", out.display());
        }
        CertCmd::Issue { name, uids, gids, root_squash, node, root_allow, admin, server, days, ca, out } => {
            let role = match (admin, server) {
                (true, _) => Role::Admin,
                (_, true) => Role::Server,
                _ => {
                    let root = match (root_squash, root_allow) {
                        (true, _) => RootClaim::Squash,
                        (_, true) => RootClaim::Allow,
                        _ => RootClaim::Refuse,
                    };
                    let (uids, gids) = (Ranges::parse(&uids)?, Ranges::parse(&gids)?);
                    if uids.0.is_empty() {
                        bail!("a user or node identity needs --uids (or --admin)");
                    }
                    match node {
                        true => Role::Node { uids, gids, root },
                        false => Role::User { uids, gids, root },
                    }
                }
            };
            let ca = match ca {
                Some(dir) => dir,
                None => ca_dir(cluster.as_deref())?,
            };
            let authority = Authority::load(&ca).with_context(|| format!("cannot load the CA in {}", ca.display()))?;
            let identity = Identity { name, role };
            let issued = authority.issue(&identity, Validity::days(days), &out)?;
            println!("issued {identity}, serial {}, valid {days} days, in {}", issued.serial, out.display());
        }
        CertCmd::Revoke { cert } => revoke(&cert, cluster.as_deref())?,
        CertCmd::Show { cert } => {
            let (identity, serial) = plusfs_tls::serial_of_file(&cert)?;
            println!("{identity}, serial {serial}");
        }
    }
    Ok(())
}

/// The CA directory of the cluster map at `cluster`.
fn ca_dir(cluster: Option<&Path>) -> Result<PathBuf> {
    let map = ClusterMap::load(cluster.context("no CA: pass --ca DIR, or --cluster FILE of a cluster with TLS")?)?;
    let ca = map.tls.ca.context("the cluster is insecure (no [tls] ca in its map): pass --ca DIR")?;
    Ok(ca.parent().map(Path::to_path_buf).unwrap_or_default())
}

/// Adds the serial number of `cert` to the revocation list of the map at `cluster`.
fn revoke(cert: &Path, cluster: Option<&Path>) -> Result<()> {
    let path = cluster.context("no cluster map: pass --cluster FILE or set PLUSFS_CLUSTER")?;
    let (identity, serial) = plusfs_tls::serial_of_file(cert)?;
    let mut map = ClusterMap::load(path)?;
    if map.tls.is_insecure() {
        bail!("the cluster is insecure (no [tls] in {}): nothing to revoke", path.display());
    }
    if map.tls.revoked.contains(&serial) {
        println!("{identity}, serial {serial}, was already revoked");
        return Ok(());
    }
    map.tls.revoked.push(serial.clone());
    plusfs_netns::write_durably(path, map.to_toml().as_bytes())?;
    println!("revoked {identity}, serial {serial}; servers refuse it from their next connection on");
    Ok(())
}
