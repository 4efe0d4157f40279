//! The metrics endpoint of a server process: `GET /metrics` on the address its map entry
//! names, answered from the front's registry after bringing its status in.

use crate::front::Front;
use plusfs_proto::{Cred, Reply, Request};
use std::sync::Arc;

/// Brings `front`'s status, connection counters and replica-group view into its registry.
async fn refresh(front: &Front) {
    let exporter = front.exporter();
    exporter.take_net(front.net());
    if let Ok(Reply::Status(s)) = front.handle(Cred::server(), Request::Status).await {
        exporter.take_status(&s);
    }
    if let Ok(Reply::Group(g)) = front.handle(Cred::server(), Request::GroupStatus).await {
        exporter.take_group(&g);
    }
}

/// Starts the metrics endpoint of this process if the map gives it an address. A port
/// that cannot be had costs the metrics, not the server: it serves on, with a warning.
pub async fn start(addr: Option<&str>, front: &Arc<Front>) -> Option<tokio::task::JoinHandle<()>> {
    let addr = addr?;
    match spawn(addr, front.clone()).await {
        Ok(task) => Some(task),
        Err(e) => {
            tracing::warn!(addr, cause = %e, "no metrics endpoint: cannot listen there");
            None
        }
    }
}

/// Serves `front`'s metrics on `addr` in the background.
pub async fn spawn(addr: &str, front: Arc<Front>) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(addr, "metrics endpoint ready");
    let registry = front.exporter().registry.clone();
    front.exporter().enable();
    let refresh: plusfs_metrics::Refresh = Arc::new(move || {
        let front = front.clone();
        Box::pin(async move { refresh(&front).await })
    });
    Ok(tokio::spawn(plusfs_metrics::serve(listener, registry, refresh)))
}
