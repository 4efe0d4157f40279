//! The bridge from a store to its group: a leader's [`RocksStore`](plusfs_store::RocksStore)
//! hands each batch to [`StoreReplicator`], which appends it to the group's log in the
//! order it came and answers once the batch is committed and applied here. Batches are
//! pipelined, and all those waiting when an entry is made go into that entry, so they
//! share its log write and fsync on every member.

use crate::{Command, Raft};
use openraft::error::ClientWriteError;
use plusfs_store::{Replicator, StoreError};
use tokio::sync::{mpsc, oneshot};

type Pending = (Vec<u8>, oneshot::Sender<Result<(), StoreError>>);

/// Most store batches put into one log entry.
const MAX_PER_ENTRY: usize = 512;

fn answer_all(dones: Vec<oneshot::Sender<Result<(), StoreError>>>, r: impl Fn() -> Result<(), StoreError>) {
    for d in dones {
        let _ = d.send(r());
    }
}

/// Feeds a store's batches into a group's log, in order.
pub struct StoreReplicator {
    tx: mpsc::UnboundedSender<Pending>,
}

impl StoreReplicator {
    /// Starts the task that appends batches to `raft`'s log.
    pub fn new(raft: Raft) -> StoreReplicator {
        let (tx, mut rx) = mpsc::unbounded_channel::<Pending>();
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                // Every batch waiting now goes into one entry (group commit), in order.
                let mut batches = vec![first.0.into()];
                let mut dones = vec![first.1];
                while batches.len() < MAX_PER_ENTRY {
                    match rx.try_recv() {
                        Ok((b, d)) => {
                            batches.push(b.into());
                            dones.push(d);
                        }
                        Err(_) => break,
                    }
                }
                // Awaited one by one: entries enter the log in commit order.
                let answer = match raft.client_write_ff(Command { batches }).await {
                    Ok(answer) => answer,
                    Err(e) => {
                        answer_all(dones, || Err(StoreError::Replica(e.to_string())));
                        continue;
                    }
                };
                tokio::spawn(async move {
                    let r = match answer.await {
                        Ok(Ok(_)) => Ok(()),
                        Ok(Err(ClientWriteError::ForwardToLeader(f))) => {
                            Err(format!("not the leader (leader: {:?})", f.leader_id))
                        }
                        Ok(Err(e)) => Err(e.to_string()),
                        Err(_) => Err("the replica stopped".to_string()),
                    };
                    answer_all(dones, || r.clone().map_err(StoreError::Replica));
                });
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
