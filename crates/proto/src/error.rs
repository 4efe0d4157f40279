//! The error half of every reply: an errno, a message, and what the client needs to
//! recover (a missing directory, a redirect to a distributed directory's servers).

use crate::hugedir::DistInfo;
use crate::ids::{Ino, ServerId};
use crate::Errno;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// A failed request: the errno and a message for humans.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Error)]
#[error("{message}")]
pub struct WireError {
    pub errno: Errno,
    pub message: String,
    /// Set when the error is that the directory object at this path does not exist: the
    /// client then tells ENOENT from ENOTDIR by looking at the ancestors.
    pub missing_dir: Option<String>,
    /// Set when the request concerned entries of a distributed directory and went to the
    /// wrong server: where they are (seed 001 §IV.C). The errno is EREMCHG.
    pub redirect: Option<Box<DistInfo>>,
    /// Set when a rename would replace a hard link without dropping its link: the shared
    /// inode and its home, so the coordinator can retry with both. The errno is EBUSY.
    pub replaced_link: Option<(Ino, ServerId)>,
}

impl WireError {
    pub fn new(errno: Errno, message: impl Into<String>) -> WireError {
        WireError { errno, message: message.into(), missing_dir: None, redirect: None, replaced_link: None }
    }

    /// The directory object at `path` does not exist on its home server.
    pub fn missing_dir(path: &str) -> WireError {
        WireError {
            errno: Errno::ENOENT,
            message: format!("no directory object for '{path}'"),
            missing_dir: Some(path.to_string()),
            redirect: None,
            replaced_link: None,
        }
    }

    /// The entries of a distributed directory are elsewhere: see `info`.
    pub fn redirect(info: DistInfo) -> WireError {
        WireError {
            errno: Errno::EREMCHG,
            message: format!("'{}' is {}; its entries are on servers {:?}", info.path, info.state, info.set),
            missing_dir: None,
            redirect: Some(Box::new(info)),
            replaced_link: None,
        }
    }

    /// `path` is a hard link to shared inode `ino` on `home`, which a rename would replace.
    pub fn replaced_link(path: &str, ino: Ino, home: ServerId) -> WireError {
        WireError {
            replaced_link: Some((ino, home)),
            ..WireError::new(Errno::EBUSY, format!("'{path}' is a hard link to inode {ino} on server {home}"))
        }
    }
}
