//! Permission checks: the protocol crate's pure functions (`plusfs_proto::perm`), which a
//! client holding a directory delegation applies too.

pub(crate) use plusfs_proto::perm::*;
