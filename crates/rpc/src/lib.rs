//! The plusfs request/reply transport, shared by clients and by servers' calls to their
//! peers.
//!
//! A [`Pool`] sends a [`Request`](plusfs_proto::Request) to a server id and returns its
//! reply, resending idempotent requests after a transport failure. How a request travels
//! is a [`Transport`]: [`TcpTransport`] keeps pipelined [`Connection`]s to every server of
//! a cluster map; an in-process test cluster plugs in its own (with faults on every link).

mod conn;
mod counters;
mod epoch;
mod pool;
mod secure;
mod tcp;
mod transport;

pub use conn::{transport_timeout, CallError, Connection};
pub use counters::{counting, Counters, CountersSnapshot};
pub use epoch::EpochWatch;
pub use pool::Pool;
pub use secure::{client_tls, identity_dir, set_process_identity, ClientTlsError};
pub use tcp::TcpTransport;
pub use transport::Transport;
