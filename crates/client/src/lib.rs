//! The plusfs client library.
//!
//! [`Client`] is the async core: it holds the cluster map, one [`Pool`] of pipelined
//! connections per server, and message counters, and offers POSIX-like calls whose errors
//! are [`FsError`]s carrying an errno and the path. Every call is routed with the placement
//! function, so any directory is reached in one hop (seed 000 §2.3); entries of a
//! distributed (huge) directory go straight to their storing server once the client has
//! learnt the directory's distribution (`dist.rs`, seed 001 §IV.C).
//! [`BlockingClient`] wraps it for synchronous callers.

mod acl;
mod batch;
mod bfo;
mod blocking;
mod cx;
mod deleg;
mod delegated;
mod direct;
mod dirhints;
mod dist;
mod epochs;
mod error;
mod fds;
mod file;
mod fs;
pub mod fsck;
mod opids;
mod quota;
mod routing;
mod types;

pub use acl::AclKind;
pub use batch::Outcome;
pub use bfo::{NewFile, DEFAULT_READ_BUFFER};
pub use blocking::BlockingClient;
pub use deleg::{DelegWork, EndWatcher};
pub use delegated::KernelCacheable;
pub use direct::{COMMIT_BYTES, DIRECT_READ_MIN};
pub use error::FsError;
pub use fds::FdTable;
pub use file::IO_CHUNK;
pub use fs::Client;
pub use plusfs_proto::acl::Acl;
pub use plusfs_rpc::{counting, CallError, Connection, Counters, CountersSnapshot, Pool, Transport};
pub use quota::QuotaLine;
pub use routing::DistCache;
pub use types::{ClientOptions, FileHandle, OpenFlags};
