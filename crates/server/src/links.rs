//! Hard links.
//!
//! A file's inode is embedded in its directory entry while it has one name. `link` moves
//! it into a *shared inode object* (`I<ino>`) on the server that holds the entry, and
//! every name of the file becomes a link entry ([`Inode::link`]) naming that server, its
//! *inode home*. The home changes only when its server is drained (`migrate/inodes.rs`):
//! the inode goes to an heir, the drained server forwards requests about it there and
//! names the heir to link transactions ([`Links::home_now`]), and every link entry is then
//! rewritten to name the heir. Renames move link entries like any other, and the data
//! records stay where the pieces say.
//!
//! Requests about a link entry are served where the inode is: the entry's server forwards
//! them to the home as `OnInode` (one extra hop, only for hard-linked files). `link`,
//! `unlink` of a link, and a rename over a link change the entries and the link count in
//! one transaction (the two-phase commit of `txn.rs` when two servers take part), so the
//! count always equals the number of link entries. At zero the shared object and its data
//! go; at one it stays shared.

use crate::engine::call::Call;
use crate::engine::errors::{eio, err, split_entry, OpError, OpResult};
use crate::engine::host::Via;
use crate::engine::links::{inode_lock, Slot, Target};
use crate::engine::locks::Scope;
use crate::engine::perm;
use crate::engine::Engine;
use crate::peers::Peers;
use plusfs_proto::{Errno, Ino, Inode, Reply, Request, ServerId, SubOp};
use std::sync::Arc;
use std::time::Duration;

/// How long a forwarded exactly-once request is resent while its slot fails over.
const FORWARD_FAILOVER: Duration = Duration::from_secs(20);
/// The pause between such resends.
const FORWARD_RESEND_PAUSE: Duration = Duration::from_millis(100);

/// The outcome of [`Osd::find`].
#[allow(clippy::large_enum_variant)] // short-lived, returned once per request
pub(crate) enum Found {
    Here(Target),
    /// A link to a shared inode on another server: forward the request there.
    Elsewhere {
        home: ServerId,
        ino: Ino,
    },
}

/// Shared inodes (hard links): finding the inode an entry request acts on, and
/// forwarding requests to a shared inode's home.
pub(crate) struct Links {
    engine: Arc<Engine>,
    peers: Arc<Peers>,
}

impl Links {
    pub(crate) fn new(engine: Arc<Engine>, peers: Arc<Peers>) -> Links {
        Links { engine, peers }
    }
}

impl Links {
    /// Finds the inode that an entry request for `p` (addressed as `via`) acts on: the
    /// embedded inode, a shared one held here, or the home to forward to. With `lock` the
    /// entry's (or the shared inode's) busy lock is held by the returned target.
    /// `c` must have search permission on the whole path of the entry's directory
    /// (checked here; a forwarded request was checked by the entry's server).
    pub(crate) async fn find(self: &Arc<Self>, p: &str, via: Via, lock: bool, c: &Call) -> OpResult<Found> {
        if let Via::Inode(ino) = via {
            return self.shared_or_moved(p, ino, lock).await;
        }
        let (dir, name) = split_entry(p)?;
        let guard = match lock {
            true => {
                self.engine.locks().lock(&[(dir.to_string(), Scope::Name(name.to_string()))], None, true).await.ok()
            }
            false => None,
        };
        let host = self.engine.host(dir, via)?;
        perm::check_search(c, &host.obj, dir)?;
        let e = self.engine.entry(&host.obj, p, name)?;
        match e.link_home {
            None => Ok(Found::Here(Target {
                inode: e,
                slot: Slot::Entry { dir: host.obj.ino, name: name.into() },
                _guard: guard,
            })),
            Some(home) if home == self.engine.id() => {
                drop(guard);
                self.shared_or_moved(p, e.ino, lock).await
            }
            Some(home) => Ok(Found::Elsewhere { home, ino: e.ino }),
        }
    }

    /// Shared inode `ino` held here, or the heir this (drained) server moved it to.
    async fn shared_or_moved(self: &Arc<Self>, p: &str, ino: Ino, lock: bool) -> OpResult<Found> {
        match self.shared_target(p, ino, lock).await {
            Err(e) if e.errno() == Errno::ENOENT => match self.engine.moved_inode(ino)? {
                Some(heir) => Ok(Found::Elsewhere { home: heir, ino }),
                None => Err(e),
            },
            r => r.map(Found::Here),
        }
    }

    /// Link entries that a committed transaction's `ops` put here (a rename's, an
    /// exchange's) and that name a drained home: rewritten in the background to name where
    /// the inode is now. The drained server's relink passes may have looked here before
    /// the entry landed.
    pub(crate) fn relink_landed(self: &Arc<Self>, ops: &[SubOp]) {
        // Only while some server is drained can a link entry name a drained home: every
        // other transaction's commit reads nothing more.
        if !self.engine.map().servers.iter().any(|s| s.weight == 0.0) {
            return;
        }
        for op in ops {
            let (dir, name, shard) = match op {
                SubOp::InsertEntry { dir, name, shard, .. } | SubOp::ExchangeEntry { dir, name, shard } => {
                    (dir, name, shard.is_some())
                }
                _ => continue,
            };
            match self.landed_link(dir, name, shard) {
                Ok(Some(home)) => {
                    let (links, dir, name) = (self.clone(), dir.clone(), name.clone());
                    tokio::spawn(async move {
                        if let Err(e) = links.relink_entry(&dir, &name, shard, home).await {
                            tracing::warn!(dir, name, cause = %e.message(), "cannot relink a link entry yet");
                        }
                    });
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(dir, name, cause = %e.message(), "cannot read a landed entry"),
            }
        }
    }

    /// The drained home entry `name` of `dir` names, if it is a link entry naming one.
    fn landed_link(&self, dir: &str, name: &str, shard: bool) -> OpResult<Option<ServerId>> {
        let store = self.engine.store();
        let obj = if shard { store.get_shard(dir) } else { store.get_dir(dir) }.map_err(eio)?;
        let Some(obj) = obj else { return Ok(None) };
        let home = store.get_entry(obj.ino, name).map_err(eio)?.and_then(|e| e.link_home);
        Ok(home.filter(|h| self.engine.map().server(*h).is_none_or(|s| s.weight == 0.0)))
    }

    /// Rewrites link entry `name` of `dir` that names drained `home` to name where its
    /// inode is now, if it moved.
    async fn relink_entry(self: &Arc<Self>, dir: &str, name: &str, shard: bool, home: ServerId) -> OpResult<()> {
        let store = self.engine.store();
        let obj = if shard { store.get_shard(dir) } else { store.get_dir(dir) }.map_err(eio)?;
        let Some(obj) = obj else { return Ok(()) };
        let Some(e) = store.get_entry(obj.ino, name).map_err(eio)? else { return Ok(()) };
        let now = self.home_now(home, e.ino).await?;
        if now == home {
            return Ok(()); // not moved yet: the drained server's relink passes will see it
        }
        let wanted = [(dir.to_string(), Scope::Name(name.to_string()))];
        let _g = self.engine.locks().lock(&wanted, None, true).await.ok();
        match self.engine.store().get_entry(obj.ino, name).map_err(eio)? {
            Some(mut cur) if cur.ino == e.ino && cur.link_home == Some(home) => {
                cur.link_home = Some(now);
                let mut b = plusfs_store::Batch::new();
                b.put_entry(obj.ino, name, &cur);
                self.engine.apply(b).await
            }
            _ => Ok(()),
        }
    }

    /// Where shared inode `ino`, whose link entries name `home`, is now: `home` itself
    /// unless that server is being drained, which then names the heir it moved it to.
    pub(crate) async fn home_now(self: &Arc<Self>, home: ServerId, ino: Ino) -> OpResult<ServerId> {
        if self.engine.map().server(home).is_some_and(|s| s.weight > 0.0) {
            return Ok(home);
        }
        if home == self.engine.id() {
            return self.engine.inode_home(ino);
        }
        match self.peers.pool.call(home, &Request::InodeHome { ino }).await {
            Ok(Ok(Reply::Home(h))) => Ok(h),
            Ok(Ok(other)) => Err(err(Errno::EIO, format!("inode server {home} answered {other:?}"))),
            Ok(Err(e)) => Err(e.into()),
            Err(e) => Err(err(e.errno(), format!("inode server {home}: {e}"))),
        }
    }

    async fn shared_target(self: &Arc<Self>, p: &str, ino: Ino, lock: bool) -> OpResult<Target> {
        let guard = match lock {
            true => self.engine.locks().lock(&[inode_lock(ino)], None, true).await.ok(),
            false => None,
        };
        let inode = self
            .engine
            .store()
            .get_inode(ino)
            .map_err(eio)?
            .ok_or_else(|| err(Errno::ENOENT, format!("'{p}' does not exist (inode {ino} has no links left)")))?;
        Ok(Target { inode, slot: Slot::Shared, _guard: guard })
    }

    /// Sends entry request `op` of caller `c` to the home of shared inode `ino` (which
    /// checks `c`'s permissions on the inode).
    pub(crate) async fn forward(self: &Arc<Self>, home: ServerId, ino: Ino, op: Request, c: &Call) -> OpResult<Reply> {
        let mut req = Request::OnInode { ino, op: Box::new(op) };
        // Part of an exactly-once request: the inode's slot answers a resend (ours, after
        // a failover of either slot) from its own table, under the same id, so it is
        // resent across a failover of that slot like an idempotent request.
        let mut resend_until = None;
        if let Some((client, seq)) = c.once_id().filter(|_| req.needs_once()) {
            if self.peers.pool.replicated(home) {
                req = Request::Once { client, seq, op: Box::new(req) };
                resend_until = Some(std::time::Instant::now() + FORWARD_FAILOVER);
            }
        }
        loop {
            match self.peers.pool.call_as(home, c, &req).await {
                Ok(r) => return r.map_err(OpError::from),
                Err(e) if e.is_transport() && resend_until.is_some_and(|t| std::time::Instant::now() < t) => {
                    tracing::debug!(home, cause = %e, "resending a forwarded exactly-once request");
                    tokio::time::sleep(FORWARD_RESEND_PAUSE).await;
                }
                Err(e) => return Err(err(e.errno(), format!("inode server {home}: {e}"))),
            }
        }
    }

    /// The current inode behind entry `e` (itself unless it is a link), for reads.
    pub(crate) async fn resolve(self: &Arc<Self>, p: &str, e: Inode) -> OpResult<Inode> {
        let home = match e.link_home {
            None => return Ok(e),
            Some(home) if home == self.engine.id() => match self.shared_or_moved(p, e.ino, false).await? {
                Found::Here(t) => return Ok(t.inode),
                Found::Elsewhere { home, .. } => home,
            },
            Some(home) => home,
        };
        match self.forward(home, e.ino, Request::Stat { path: p.into() }, &Call::server()).await? {
            Reply::Attr(a) => Ok(Inode {
                ino: a.ino,
                kind: a.kind,
                mode: a.mode & 0o7777,
                uid: a.uid,
                gid: a.gid,
                size: a.size,
                nlink: a.nlink,
                atime: a.atime,
                mtime: a.mtime,
                ctime: a.ctime,
                rdev: a.rdev,
                ..Inode::subdir(a.ino)
            }),
            other => Err(err(Errno::EIO, format!("unexpected reply {other:?}"))),
        }
    }
}
