//! Errors of server operations, and path checks.
//!
//! [`OpError`] is what the protocols return and tell apart: a conflict to try again, a plan
//! made with another map, an object moving home, a directory being distributed, a
//! delegation held by another client, a store failure, or an errno a POSIX caller gets as
//! it is. `From<OpError> for WireError` is the one place where each becomes the errno and
//! message a client or a peer receives; a peer's wire error becomes an [`OpError`] again
//! (`From<WireError>`), so a refusal keeps its meaning across servers as far as the wire
//! carries it (a redirect, a `Distributing` state, a replaced link).

use plusfs_proto::path::{self, check_name, check_wire_path};
use plusfs_proto::{DistInfo, DistState, Errno, Ino, ServerId, WireError};
use plusfs_store::StoreError;

/// What the protocols' operations return.
pub(crate) type OpResult<T> = Result<T, OpError>;

/// Why a server operation did not happen (see the module's documentation).
#[derive(Debug, Clone)]
pub(crate) enum OpError {
    /// It met another operation's lock or transaction: trying again may succeed (EBUSY).
    Conflict(String),
    /// It was planned with a map whose epoch is not this server's: plan again (EBUSY).
    StaleEpoch(String),
    /// What it names is moving to or from another home: plan again once it has (EBUSY).
    Moved(String),
    /// The directory is being distributed: wait for its end, then try again (EBUSY with
    /// the `Distributing` distribution, which clients and coordinators wait out).
    Distributing(Box<DistInfo>),
    /// Another client holds a delegation that is being recalled (EBUSY).
    Delegated(String),
    /// The entries of a distributed (or distributing) directory are elsewhere: the client
    /// or coordinator goes to the storing server `info` names (EREMCHG, seed 001 §IV.C).
    Redirect(Box<DistInfo>),
    /// The directory object at this path does not exist on its home (ENOENT; the client
    /// tells ENOENT from ENOTDIR by the ancestors).
    MissingDir(String),
    /// A rename would replace a hard link without dropping its link: the shared inode and
    /// its home, so the coordinator tries again with both (EBUSY).
    ReplacedLink { ino: Ino, home: ServerId, message: String },
    /// The store refused or failed a write: ENOSPC when its disk is full, else EIO.
    Store { full: bool, message: String },
    /// An error a POSIX caller gets as it is, with the wire's extras (a missing
    /// directory, a redirect to a distributed directory's storing server, a replaced link).
    Posix(WireError),
}

impl OpError {
    /// The errno the caller gets.
    pub(crate) fn errno(&self) -> Errno {
        match self {
            OpError::Conflict(_)
            | OpError::StaleEpoch(_)
            | OpError::Moved(_)
            | OpError::Distributing(_)
            | OpError::Delegated(_)
            | OpError::ReplacedLink { .. } => Errno::EBUSY,
            OpError::Redirect(_) => Errno::EREMCHG,
            OpError::MissingDir(_) => Errno::ENOENT,
            OpError::Store { full: true, .. } => Errno::ENOSPC,
            OpError::Store { full: false, .. } => Errno::EIO,
            OpError::Posix(w) => w.errno,
        }
    }

    /// The message the caller gets.
    pub(crate) fn message(&self) -> String {
        match self {
            OpError::Conflict(m) | OpError::StaleEpoch(m) | OpError::Moved(m) | OpError::Delegated(m) => m.clone(),
            OpError::Distributing(info) => format!("'{}' is being distributed", info.path),
            OpError::Store { message, .. } | OpError::ReplacedLink { message, .. } => message.clone(),
            OpError::Redirect(_) | OpError::MissingDir(_) => WireError::from(self.clone()).message,
            OpError::Posix(w) => w.message.clone(),
        }
    }

    /// True when the same operation, planned again after a pause, may succeed: a lost
    /// race, a stale plan, an object that moved, or (from a peer, whose refusals arrive as
    /// EBUSY) any of these.
    pub(crate) fn is_retryable(&self) -> bool {
        match self {
            OpError::Conflict(_) | OpError::StaleEpoch(_) | OpError::Moved(_) | OpError::Delegated(_) => true,
            OpError::Posix(w) => w.errno == Errno::EBUSY && w.redirect.is_none() && w.replaced_link.is_none(),
            OpError::Distributing(_)
            | OpError::Store { .. }
            | OpError::Redirect(_)
            | OpError::MissingDir(_)
            | OpError::ReplacedLink { .. } => false,
        }
    }

    /// The path of the directory object found missing, if that is the error.
    pub(crate) fn missing_dir(&self) -> Option<&str> {
        match self {
            OpError::MissingDir(path) => Some(path),
            OpError::Posix(w) => w.missing_dir.as_deref(),
            _ => None,
        }
    }

    /// The distribution a redirect or a `Distributing` refusal carries.
    pub(crate) fn dist(&self) -> Option<&DistInfo> {
        match self {
            OpError::Redirect(info) | OpError::Distributing(info) => Some(info),
            OpError::Posix(w) => w.redirect.as_deref(),
            _ => None,
        }
    }
}

impl From<OpError> for WireError {
    fn from(e: OpError) -> WireError {
        let errno = e.errno();
        match e {
            OpError::Posix(w) => w,
            OpError::Distributing(info) => {
                let message = format!("'{}' is being distributed", info.path);
                WireError { redirect: Some(info), ..WireError::new(errno, message) }
            }
            OpError::Redirect(info) => WireError::redirect(*info),
            OpError::MissingDir(path) => WireError::missing_dir(&path),
            OpError::ReplacedLink { ino, home, message } => {
                WireError { replaced_link: Some((ino, home)), ..WireError::new(errno, message) }
            }
            other => WireError::new(errno, other.message()),
        }
    }
}

impl From<WireError> for OpError {
    fn from(w: WireError) -> OpError {
        // Each kind only where the wire error is exactly what that kind becomes (so the
        // round trip loses nothing); anything else stays as it came.
        let kind = match (&w.redirect, &w.missing_dir, w.replaced_link) {
            (Some(info), None, None) if w.errno == Errno::EBUSY && info.state == DistState::Distributing => {
                OpError::Distributing(info.clone())
            }
            (Some(info), None, None) => OpError::Redirect(info.clone()),
            (None, Some(path), None) => OpError::MissingDir(path.clone()),
            (None, None, Some((ino, home))) if w.errno == Errno::EBUSY => {
                OpError::ReplacedLink { ino, home, message: w.message.clone() }
            }
            _ => return OpError::Posix(w),
        };
        if WireError::from(kind.clone()) == w {
            kind
        } else {
            OpError::Posix(w)
        }
    }
}

impl std::fmt::Display for OpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}: {}", self.errno(), self.message())
    }
}

/// The store's error as an operation's: ENOSPC for a full disk (logged as a warning),
/// else EIO (logged as an error; as a warning when the store is closing, as when a
/// replica group member stops with requests waiting for a commit).
pub(crate) fn eio(e: StoreError) -> OpError {
    if let StoreError::NoSpace(_) = e {
        tracing::warn!(cause = %e, "store write refused: disk full");
        return OpError::Store { full: true, message: format!("{e}") };
    }
    if let StoreError::Closed = e {
        tracing::warn!("store write ended by a shutdown: its outcome is unknown");
        return OpError::Store { full: false, message: format!("store failure: {e}") };
    }
    tracing::error!(cause = %e, "store failure");
    OpError::Store { full: false, message: format!("store failure: {e}") }
}

/// An errno a POSIX caller gets, with `what` as its message.
pub(crate) fn err(errno: Errno, what: impl Into<String>) -> OpError {
    OpError::Posix(WireError::new(errno, what))
}

/// Checks a path from the wire and splits it into (parent, name).
pub(crate) fn split_entry(p: &str) -> OpResult<(&str, &str)> {
    check_wire_path(p).map_err(|e| err(e.errno, format!("{}: '{p}'", e.reason)))?;
    let (dir, name) = path::split(p).ok_or_else(|| err(Errno::EINVAL, "'/' has no parent"))?;
    check_name(name).map_err(|e| err(e.errno, format!("{}: '{p}'", e.reason)))?;
    Ok((dir, name))
}

pub(crate) fn check_dir_path(p: &str) -> OpResult<()> {
    check_wire_path(p).map_err(|e| err(e.errno, format!("{}: '{p}'", e.reason)))
}

#[cfg(test)]
mod tests {
    use super::*;

    impl OpError {
        fn to_wire(&self) -> WireError {
            WireError::from(self.clone())
        }
    }

    fn info_of(path: &str) -> DistInfo {
        DistInfo { path: path.into(), ino: 9, incarnation: 1, state: DistState::Distributing, set: vec![0, 1] }
    }

    #[test]
    fn each_kind_maps_to_its_errno_and_a_distributing_refusal_survives_the_wire() {
        for e in [OpError::Conflict("c".into()), OpError::StaleEpoch("s".into()), OpError::Moved("m".into())] {
            assert_eq!(WireError::from(e.clone()).errno, Errno::EBUSY);
            assert!(e.is_retryable());
            let back = OpError::from(e.to_wire());
            assert!(back.is_retryable(), "a peer's EBUSY is retried as well: {back}");
        }
        let full = eio(StoreError::NoSpace("full".into()));
        assert_eq!(full.to_wire().errno, Errno::ENOSPC);
        assert!(!full.is_retryable());
        let info = info_of("/d");
        let wire = OpError::Distributing(Box::new(info)).to_wire();
        assert_eq!(wire.errno, Errno::EBUSY);
        assert!(matches!(OpError::from(wire), OpError::Distributing(i) if i.path == "/d"));
        let redirect = WireError::redirect(DistInfo { state: DistState::Distributed, ..info_of("/r") });
        assert!(matches!(OpError::from(redirect.clone()), OpError::Redirect(_)));
        assert_eq!(OpError::from(redirect.clone()).to_wire(), redirect, "a round trip loses nothing");
        let missing = WireError::missing_dir("/m");
        assert!(matches!(OpError::from(missing.clone()), OpError::MissingDir(p) if p == "/m"));
        let link = WireError::replaced_link("/l", 7, 2);
        assert!(matches!(OpError::from(link.clone()), OpError::ReplacedLink { ino: 7, home: 2, .. }));
        assert_eq!(OpError::from(link.clone()).to_wire(), link);
        let posix = err(Errno::ENOENT, "no '/x'");
        assert_eq!(posix.to_wire().message, "no '/x'");
        assert!(!posix.is_retryable());
    }
}
