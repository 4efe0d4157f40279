//! Quotas: whose usage is counted (users, groups, directory trees), what is counted (files
//! and bytes), the limits an administrator sets, and the requests that set, report and
//! enforce them.
//!
//! Every server counts the usage of what it stores (see the store's `usage` module). A
//! limit is enforced with allowances: a server may take an owner's usage here up to its
//! *ceiling*; past it, it asks the owner's *quota master* (a server chosen by hashing the
//! owner) for more, and the master grants from what the limit leaves after the ceilings
//! of every server, taking unused allowance back from the others when it runs short.

use crate::ids::{Ino, ServerId};
use serde::{Deserialize, Serialize};

/// Whose usage a counter holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Owner {
    Uid(u32),
    Gid(u32),
    /// The quota tree whose root directory has this inode number.
    Tree(Ino),
}

impl Owner {
    /// The kind byte and id of the owner's counter key.
    pub fn key_parts(self) -> (u8, u64) {
        match self {
            Owner::Uid(u) => (b'u', u64::from(u)),
            Owner::Gid(g) => (b'g', u64::from(g)),
            Owner::Tree(t) => (b't', t),
        }
    }

    /// The owner of a counter key's kind byte and id.
    pub fn from_key_parts(kind: u8, id: u64) -> Option<Owner> {
        match kind {
            b'u' => u32::try_from(id).ok().map(Owner::Uid),
            b'g' => u32::try_from(id).ok().map(Owner::Gid),
            b't' => Some(Owner::Tree(id)),
            _ => None,
        }
    }

    /// The server that keeps the owner's allowances among `servers` (rendezvous hashing,
    /// so a change of the server set moves few owners).
    pub fn master(self, servers: &[ServerId]) -> Option<ServerId> {
        let (kind, id) = self.key_parts();
        servers.iter().copied().max_by_key(|s| {
            let mut h = 0xcbf2_9ce4_8422_2325u64;
            for b in [kind].into_iter().chain(id.to_be_bytes()).chain(s.to_be_bytes()) {
                h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
            }
            h
        })
    }
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Owner::Uid(u) => write!(f, "uid {u}"),
            Owner::Gid(g) => write!(f, "gid {g}"),
            Owner::Tree(t) => write!(f, "tree {t}"),
        }
    }
}

/// Files and bytes counted for one owner (signed: a server's share of a tree may be
/// negative while its entries move, and a delta is one too).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    pub files: i64,
    pub bytes: i64,
}

impl Usage {
    /// The stored form: files, then bytes, each 8 bytes big-endian.
    pub fn encode(self) -> [u8; 16] {
        let mut v = [0u8; 16];
        v[..8].copy_from_slice(&self.files.to_be_bytes());
        v[8..].copy_from_slice(&self.bytes.to_be_bytes());
        v
    }

    /// The usage stored as `v`, if it is 16 bytes.
    pub fn decode(v: &[u8]) -> Option<Usage> {
        let v: &[u8; 16] = v.try_into().ok()?;
        let files = i64::from_be_bytes(v[..8].try_into().expect("8 bytes"));
        let bytes = i64::from_be_bytes(v[8..].try_into().expect("8 bytes"));
        Some(Usage { files, bytes })
    }

    /// Adds `files` and `bytes`.
    pub fn add(&mut self, files: i64, bytes: i64) {
        self.files += files;
        self.bytes += bytes;
    }

    /// The sum of two usages.
    pub fn plus(self, o: Usage) -> Usage {
        Usage { files: self.files + o.files, bytes: self.bytes + o.bytes }
    }

    /// True when nothing is counted.
    pub fn is_zero(self) -> bool {
        self == Usage::default()
    }
}

/// One dimension's limits (files or bytes); `None`: no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Limit {
    /// Never exceeded.
    pub hard: Option<u64>,
    /// May be exceeded for the grace period; then it acts as a hard limit until usage is
    /// back under it.
    pub soft: Option<u64>,
}

impl Limit {
    /// The limit in force: the soft limit once its grace has run out, else the hard one.
    pub fn in_force(self, grace_over: bool) -> Option<u64> {
        match (self.soft, grace_over) {
            (Some(s), true) => Some(self.hard.map_or(s, |h| h.min(s))),
            _ => self.hard,
        }
    }
}

/// The limits of one quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Limits {
    pub files: Limit,
    pub bytes: Limit,
    /// How long usage may stay above a soft limit, in seconds.
    pub grace_secs: u64,
}

/// A quota as every server keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaDef {
    pub owner: Owner,
    pub limits: Limits,
    /// A tree quota's root, as it was named when the quota was set (renames move the tree
    /// with its root's inode; the path shown then is the one it was set on).
    pub path: Option<String>,
}

/// What a quota is set on, as an administrator names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum QuotaTarget {
    Uid(u32),
    Gid(u32),
    /// The directory tree at this path.
    Tree(String),
}

/// A counter that disagrees with a recount of what a server stores.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageMismatch {
    pub owner: Owner,
    /// What the counter says.
    pub counted: Usage,
    /// What the store holds.
    pub actual: Usage,
}

/// The quota requests (`Request::Quota`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum QuotaOp {
    /// Sets (or with `None` lifts) the quota of `target` on every server (admins). A tree
    /// quota is sent to the home of its root.
    Set { target: QuotaTarget, limits: Option<Limits> },
    /// This server's counters and the quotas it keeps.
    Usage,
    /// Recounts this server's usage (fsck); with `repair`, sets wrong counters right
    /// (admins).
    Check { repair: bool },
    /// To the master of `owner` (servers): `from` uses `used` under its ceiling `ceiling`
    /// and needs `want` more (nothing: it went past its ceiling by a transaction's commit,
    /// and the master learns every server's share again); `limits` as `from` keeps them.
    /// Answered with its new ceiling, or `EDQUOT`.
    Grant { owner: Owner, from: ServerId, used: Usage, ceiling: Usage, want: Usage, limits: Limits },
    /// From the master of `owner` (servers): give back unused allowance; answered with
    /// the usage here, which is now the ceiling.
    Shrink { owner: Owner },
}

/// Answers to [`QuotaOp`]s.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum QuotaReply {
    Done,
    /// `Usage`: the counters here (non-zero ones) and the quotas kept.
    Usage {
        counted: Vec<(Owner, Usage)>,
        quotas: Vec<QuotaDef>,
    },
    /// `Check`: the counters found wrong.
    Mismatches(Vec<UsageMismatch>),
    /// `Grant`: the asker's new ceiling.
    Ceiling(Usage),
    /// `Shrink`: the usage (and ceiling) of the server asked.
    Used(Usage),
}
