//! Errors of server operations: the errno and message a client gets, and path checks.

use plusfs_proto::path::{self, check_name, check_wire_path};
use plusfs_proto::{Errno, WireError};
use plusfs_store::StoreError;

pub(crate) type OpResult<T> = Result<T, WireError>;

pub(crate) fn eio(e: StoreError) -> WireError {
    if let StoreError::NoSpace(_) = e {
        tracing::warn!(cause = %e, "store write refused: disk full");
        return WireError::new(Errno::ENOSPC, format!("{e}"));
    }
    tracing::error!(cause = %e, "store failure");
    WireError::new(Errno::EIO, format!("store failure: {e}"))
}

pub(crate) fn err(errno: Errno, what: impl Into<String>) -> WireError {
    WireError::new(errno, what)
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
