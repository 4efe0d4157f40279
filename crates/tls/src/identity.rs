//! Identities: what a certificate lets its holder do.
//!
//! Every certificate the cluster CA issues names one identity in a subject alternative
//! name of the form `plusfs:identity?role=user&uids=1000-1999&gids=1000-1999&root=squash`
//! (a URI, so no private OID is needed). Servers hold `role=server`: they may claim any
//! credential (they forward their clients' credentials to each other). An `admin` may too,
//! and may run admin operations. A `user` may claim only uids and gids in its ranges; a
//! claim of root is squashed to nobody (`root=squash`) or refused (`root=refuse`). A
//! `node` is what a site gives a client machine whose mount acts for all its users: the
//! same bounds, and root may also be let through as root (`root=allow`, for machines
//! whose root the site trusts with the files of every uid); never admin requests.

use plusfs_proto::Cred;
use std::fmt;
use thiserror::Error;

/// The uid and gid of nobody, what a squashed root becomes.
pub const NOBODY: u32 = 65534;

/// The URI prefix of an identity in a certificate.
pub const URI_PREFIX: &str = "plusfs:identity?";

/// Inclusive ranges of ids, e.g. `1000-1999,3000`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ranges(pub Vec<(u32, u32)>);

impl Ranges {
    /// True when `id` lies in one of the ranges.
    pub fn contains(&self, id: u32) -> bool {
        self.0.iter().any(|&(lo, hi)| lo <= id && id <= hi)
    }

    /// Parses `1000-1999,3000` (empty: no ids).
    pub fn parse(s: &str) -> Result<Ranges, IdentityError> {
        let bad = || IdentityError::Ranges(s.to_string());
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (lo, hi) = match part.split_once('-') {
                Some((lo, hi)) => (lo.trim().parse().map_err(|_| bad())?, hi.trim().parse().map_err(|_| bad())?),
                None => {
                    let id = part.parse().map_err(|_| bad())?;
                    (id, id)
                }
            };
            if lo > hi {
                return Err(bad());
            }
            out.push((lo, hi));
        }
        Ok(Ranges(out))
    }
}

impl fmt::Display for Ranges {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> =
            self.0.iter().map(|&(lo, hi)| if lo == hi { lo.to_string() } else { format!("{lo}-{hi}") }).collect();
        f.write_str(&parts.join(","))
    }
}

/// What a user or node identity's claim of uid 0 becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootClaim {
    /// Acts as nobody.
    Squash,
    /// Refused with `EPERM`.
    Refuse,
    /// Acts as root (node identities only).
    Allow,
}

impl RootClaim {
    fn word(self) -> &'static str {
        match self {
            RootClaim::Squash => "squash",
            RootClaim::Refuse => "refuse",
            RootClaim::Allow => "allow",
        }
    }
}

/// What a certificate's holder may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// A server of the cluster: any credential, peer-only requests.
    Server,
    /// An operator: any credential, admin requests.
    Admin,
    /// A client bounded to `uids` and `gids` (root squashed or refused).
    User { uids: Ranges, gids: Ranges, root: RootClaim },
    /// A client machine acting for its users: bounded to `uids` and `gids`, root
    /// squashed, refused or allowed.
    Node { uids: Ranges, gids: Ranges, root: RootClaim },
}

/// Why a request's credential is refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Refusal {
    #[error("identity '{name}' may not act as uid {uid} (allowed: {allowed})")]
    Uid { name: String, uid: u32, allowed: String },
    #[error("identity '{name}' may not act as gid {gid} (allowed: {allowed})")]
    Gid { name: String, gid: u32, allowed: String },
    #[error("identity '{name}' may not act as root")]
    Root { name: String },
}

/// A certificate's identity: its name (the subject's common name) and role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub name: String,
    pub role: Role,
}

/// A malformed identity.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum IdentityError {
    #[error("bad id ranges '{0}' (expected e.g. 1000-1999,3000)")]
    Ranges(String),
    #[error("bad identity '{0}'")]
    Uri(String),
}

impl Identity {
    /// True for identities that may run admin operations.
    pub fn is_admin(&self) -> bool {
        matches!(self.role, Role::Admin | Role::Server)
    }

    /// True for the cluster's servers.
    pub fn is_server(&self) -> bool {
        self.role == Role::Server
    }

    /// The credential a request claiming `cred` runs with: unchanged for servers and
    /// admins; for a user, root squashed (or refused), and the uid and primary gid
    /// checked against its ranges. Supplementary groups outside the ranges are dropped
    /// (that can only take permissions away).
    pub fn admit(&self, mut cred: Cred) -> Result<Cred, Refusal> {
        let (uids, gids, root) = match &self.role {
            Role::User { uids, gids, root } | Role::Node { uids, gids, root } => (uids, gids, root),
            Role::Server | Role::Admin => return Ok(cred),
        };
        // Squashing is idempotent: a claim of what root becomes (a client that admitted
        // its caller itself) is what admitting root gives.
        let squashed = cred.uid == NOBODY && cred.gid == NOBODY && *root == RootClaim::Squash;
        if cred.uid == 0 || squashed {
            match root {
                RootClaim::Allow => return Ok(cred),
                RootClaim::Refuse => return Err(Refusal::Root { name: self.name.clone() }),
                RootClaim::Squash => {
                    cred.uid = NOBODY;
                    cred.gid = NOBODY;
                    cred.groups.clear();
                    return Ok(cred);
                }
            }
        }
        if !uids.contains(cred.uid) {
            return Err(Refusal::Uid { name: self.name.clone(), uid: cred.uid, allowed: uids.to_string() });
        }
        if !gids.contains(cred.gid) {
            return Err(Refusal::Gid { name: self.name.clone(), gid: cred.gid, allowed: gids.to_string() });
        }
        cred.groups.retain(|g| gids.contains(*g));
        Ok(cred)
    }

    /// The URI that carries this identity's role in a certificate.
    pub fn to_uri(&self) -> String {
        match &self.role {
            Role::Server => format!("{URI_PREFIX}role=server"),
            Role::Admin => format!("{URI_PREFIX}role=admin"),
            Role::User { uids, gids, root } => {
                format!("{URI_PREFIX}role=user&uids={uids}&gids={gids}&root={}", root.word())
            }
            Role::Node { uids, gids, root } => {
                format!("{URI_PREFIX}role=node&uids={uids}&gids={gids}&root={}", root.word())
            }
        }
    }

    /// The identity named `name` whose role a certificate's URI carries.
    pub fn from_uri(name: &str, uri: &str) -> Result<Identity, IdentityError> {
        let bad = || IdentityError::Uri(uri.to_string());
        let query = uri.strip_prefix(URI_PREFIX).ok_or_else(bad)?;
        let field =
            |key: &str| query.split('&').find_map(|kv| kv.split_once('=').filter(|(k, _)| *k == key).map(|(_, v)| v));
        let uids = || Ranges::parse(field("uids").unwrap_or(""));
        let gids = || Ranges::parse(field("gids").unwrap_or(""));
        let root = match field("root") {
            Some("squash") => RootClaim::Squash,
            Some("refuse") | None => RootClaim::Refuse,
            Some("allow") => RootClaim::Allow,
            Some(_) => return Err(bad()),
        };
        let role = match field("role").ok_or_else(bad)? {
            "server" => Role::Server,
            "admin" => Role::Admin,
            "user" if root != RootClaim::Allow => Role::User { uids: uids()?, gids: gids()?, root },
            "node" => Role::Node { uids: uids()?, gids: gids()?, root },
            _ => return Err(bad()),
        };
        Ok(Identity { name: name.to_string(), role })
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.role {
            Role::Server => write!(f, "{} (server)", self.name),
            Role::Admin => write!(f, "{} (admin)", self.name),
            Role::User { uids, gids, root } | Role::Node { uids, gids, root } => {
                let role = if matches!(self.role, Role::Node { .. }) { "node, " } else { "" };
                let root = match root {
                    RootClaim::Squash => "root squashed",
                    RootClaim::Refuse => "root refused",
                    RootClaim::Allow => "root allowed",
                };
                write!(f, "{} ({role}uids {uids}, gids {gids}, {root})", self.name)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(root: RootClaim) -> Identity {
        let role = Role::User {
            uids: Ranges::parse("1000-1999").unwrap(),
            gids: Ranges::parse("1000-1999,50").unwrap(),
            root,
        };
        Identity { name: "alice".into(), role }
    }

    #[test]
    fn uri_round_trip() {
        for id in [
            user(RootClaim::Squash),
            user(RootClaim::Refuse),
            Identity { name: "s".into(), role: Role::Server },
            Identity { name: "a".into(), role: Role::Admin },
            node(RootClaim::Allow),
            node(RootClaim::Squash),
        ] {
            assert_eq!(Identity::from_uri(&id.name, &id.to_uri()).unwrap(), id);
        }
        let uri = "plusfs:identity?role=user&uids=1&gids=1&root=allow";
        assert!(Identity::from_uri("x", uri).is_err(), "only a node may let root through");
        assert!(Identity::from_uri("x", "plusfs:identity?role=god").is_err());
        assert!(Identity::from_uri("x", "https://example").is_err());
        assert!(Ranges::parse("5-3").is_err());
        assert!(Ranges::parse("a").is_err());
    }

    fn node(root: RootClaim) -> Identity {
        let role =
            Role::Node { uids: Ranges::parse("1000-1999").unwrap(), gids: Ranges::parse("1000-1999").unwrap(), root };
        Identity { name: "host1".into(), role }
    }

    #[test]
    fn nodes_act_for_their_ranges_and_maybe_root_never_admin() {
        let n = node(RootClaim::Allow);
        assert!(!n.is_admin() && !n.is_server());
        assert_eq!(n.admit(Cred::server()).unwrap(), Cred::server(), "root allowed");
        assert!(matches!(n.admit(Cred::new(2000, 1500, vec![])), Err(Refusal::Uid { uid: 2000, .. })));
        let squashed = node(RootClaim::Squash).admit(Cred::new(0, 0, vec![])).unwrap();
        assert_eq!(squashed.uid, NOBODY);
        assert!(node(RootClaim::Refuse).admit(Cred::server()).is_err());
    }

    #[test]
    fn users_are_bounded_to_their_ranges() {
        let u = user(RootClaim::Squash);
        let ok = u.admit(Cred::new(1500, 1500, vec![50, 7])).unwrap();
        assert_eq!(ok.groups, vec![50], "groups outside the range are dropped");
        assert!(matches!(u.admit(Cred::new(2000, 1500, vec![])), Err(Refusal::Uid { uid: 2000, .. })));
        assert!(matches!(u.admit(Cred::new(1500, 7, vec![])), Err(Refusal::Gid { gid: 7, .. })));
        let squashed = u.admit(Cred::new(0, 0, vec![0])).unwrap();
        assert_eq!((squashed.uid, squashed.gid, squashed.groups.len()), (NOBODY, NOBODY, 0));
        assert_eq!(u.admit(squashed.clone()).unwrap(), squashed, "squashing twice is squashing once");
        assert!(user(RootClaim::Refuse).admit(squashed).is_err(), "nobody is no uid of a refusing identity");
        assert!(matches!(user(RootClaim::Refuse).admit(Cred::server()), Err(Refusal::Root { .. })));
        let admin = Identity { name: "a".into(), role: Role::Admin };
        assert_eq!(admin.admit(Cred::server()).unwrap(), Cred::server());
    }
}
