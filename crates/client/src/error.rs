//! The error every client call returns.

use plusfs_proto::Errno;
use std::fmt;

/// A failed file-system call: what was attempted, on which path, and the errno.
/// Displays like coreutils: `cannot create '/a/b': No such file or directory`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsError {
    /// Verb of the failed action (`"create"`, `"remove"`, `"stat"` …).
    pub op: &'static str,
    pub path: String,
    pub errno: Errno,
    /// Extra context from the server or the transport, if any.
    pub detail: Option<String>,
}

impl FsError {
    pub fn new(op: &'static str, path: impl Into<String>, errno: Errno) -> FsError {
        FsError { op, path: path.into(), errno, detail: None }
    }

    pub fn with_detail(mut self, detail: impl Into<String>) -> FsError {
        self.detail = Some(detail.into());
        self
    }
}

impl fmt::Display for FsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot {} '{}': {}", self.op, self.path, self.errno)?;
        if let Some(d) = &self.detail {
            write!(f, " ({d})")?;
        }
        Ok(())
    }
}

impl std::error::Error for FsError {}

impl From<FsError> for std::io::Error {
    fn from(e: FsError) -> Self {
        std::io::Error::new(std::io::Error::from_raw_os_error(e.errno.raw()).kind(), e.to_string())
    }
}
