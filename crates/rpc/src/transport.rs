//! The seam between calls and how they travel.

use crate::conn::CallError;
use futures::future::BoxFuture;
use plusfs_proto::{Cred, Request, Response, ServerId};

/// How a request reaches a server and its reply comes back: one attempt, no retry.
pub trait Transport: Send + Sync + 'static {
    /// Sends `req`, made by `cred`, to `server` and waits for the reply.
    fn send<'a>(
        &'a self,
        server: ServerId,
        cred: &'a Cred,
        req: &'a Request,
    ) -> BoxFuture<'a, Result<Response, CallError>>;

    /// Whether `server` is a replicated slot (whose leader may change under a request).
    fn replicated(&self, _server: ServerId) -> bool {
        false
    }

    /// A newer cluster map: connections to servers it adds become possible, the ones to
    /// servers it no longer lists are closed.
    fn learn_map(&self, _map: &plusfs_placement::ClusterMap) {}
}
