//! The bridge from a store to its group: a leader's [`RocksStore`](plusfs_store::RocksStore)
//! hands each batch to [`StoreReplicator`], which appends it to the group's log in the
//! order it came and answers once the batch is committed and applied here. Batches are
//! pipelined: many may be in the log at once, so a quorum's fsyncs are shared.

use crate::{Command, Raft};
use openraft::error::ClientWriteError;
use plusfs_store::{Replicator, StoreError};
use tokio::sync::{mpsc, oneshot};

type Pending = (Vec<u8>, oneshot::Sender<Result<(), StoreError>>);

/// Feeds a store's batches into a group's log, in order.
pub struct StoreReplicator {
    tx: mpsc::UnboundedSender<Pending>,
}

impl StoreReplicator {
    /// Starts the task that appends batches to `raft`'s log.
    pub fn new(raft: Raft) -> StoreReplicator {
        let (tx, mut rx) = mpsc::unbounded_channel::<Pending>();
        tokio::spawn(async move {
            while let Some((batch, done)) = rx.recv().await {
                // Awaited one by one: entries enter the log in commit order.
                match raft.client_write_ff(Command { batch }).await {
                    Ok(answer) => {
                        tokio::spawn(async move {
                            let r = match answer.await {
                                Ok(Ok(_)) => Ok(()),
                                Ok(Err(ClientWriteError::ForwardToLeader(f))) => {
                                    Err(StoreError::Replica(format!("not the leader (leader: {:?})", f.leader_id)))
                                }
                                Ok(Err(e)) => Err(StoreError::Replica(e.to_string())),
                                Err(_) => Err(StoreError::Replica("the replica stopped".into())),
                            };
                            let _ = done.send(r);
                        });
                    }
                    Err(e) => {
                        let _ = done.send(Err(StoreError::Replica(e.to_string())));
                    }
                }
            }
        });
        StoreReplicator { tx }
    }
}

impl Replicator for StoreReplicator {
    fn replicate(&self, batch: Vec<u8>, done: oneshot::Sender<Result<(), StoreError>>) {
        if let Err(mpsc::error::SendError((_, done))) = self.tx.send((batch, done)) {
            let _ = done.send(Err(StoreError::Closed));
        }
    }
}
