//! Calls to other servers of the cluster: the one router every protocol sends its
//! server-to-server requests through. A request addressed to this server itself is served
//! directly, without a message, by the [`LocalPeer`] the server registers at start (the
//! protocols that serve peer requests sit above this module, so they are reached through
//! that trait, never by name).

use crate::engine::errors::err;
use crate::engine::Engine;
use plusfs_proto::{Cred, Errno, Request, Response, ServerId};
use plusfs_rpc::Pool;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock, Weak};

/// A future answering one request.
pub(crate) type Answer<'a> = Pin<Box<dyn Future<Output = Response> + Send + 'a>>;

/// Serves the peer requests a server sends itself (`TxPrepare`, `Stat`, `DirPerms`, ...).
pub(crate) trait LocalPeer: Send + Sync {
    /// Serves `req` made by `c` on this server, without a message.
    fn serve_peer<'a>(self: Arc<Self>, req: Request, c: &'a Cred) -> Answer<'a>;
}

/// This server's connections to the others, and the way back to itself.
pub(crate) struct Peers {
    engine: Arc<Engine>,
    /// Connections to the other servers.
    pub(crate) pool: Pool,
    local: OnceLock<Weak<dyn LocalPeer>>,
}

impl Peers {
    /// Calls through `pool`; requests to this server wait for [`Peers::serve_locally_with`].
    pub(crate) fn new(engine: Arc<Engine>, pool: Pool) -> Peers {
        Peers { engine, pool, local: OnceLock::new() }
    }

    /// Registers what serves this server's requests to itself (once, at start).
    pub(crate) fn serve_locally_with(&self, local: Weak<dyn LocalPeer>) {
        let _ = self.local.set(local);
    }

    /// Sends `req` to `server` as `c` (served here directly when `server` is this one).
    pub(crate) async fn call(&self, server: ServerId, req: Request, c: &Cred) -> Response {
        if server == self.engine.id() {
            let Some(local) = self.local.get().and_then(Weak::upgrade) else {
                return Err(err(Errno::EIO, "this server is shutting down").into());
            };
            return local.serve_peer(req, c).await;
        }
        match self.pool.call_as(server, c, &req).await {
            Ok(r) => r,
            Err(e) => Err(err(e.errno(), format!("server {server}: {e}")).into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::testkit::{root, Kit};
    use plusfs_proto::{Reply, Request};

    #[tokio::test]
    async fn a_request_to_this_server_is_served_without_a_message() {
        let kit = Kit::new().await;
        let sent = kit.osd.peers.pool.counters().snapshot().msgs_out;
        let r = kit.osd.peers.call(0, Request::DirPerms { path: "/".into() }, &root()).await.unwrap();
        assert!(matches!(r, Reply::DirPerms { mode: 0o755, .. }), "{r:?}");
        assert_eq!(kit.osd.peers.pool.counters().snapshot().msgs_out, sent);
    }
}
