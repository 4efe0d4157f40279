//! Huge directories on the client side (seed 001 §IV.C, seed 000 §2.5 and §3.1).
//!
//! A client does not know a directory is distributed until a server says so: the home of
//! a distributed directory answers requests about its entries with a redirect carrying the
//! distribution ([`DistInfo`]). The client caches it by path with the incarnation, and from
//! then on sends requests about entries straight to the storing server Eq. 2 gives, wrapped
//! in `Request::Shard` with the cached incarnation. When the cache is out of date the
//! storing server says so: the directory was renamed or removed (it holds no shard at that
//! path: "missing directory"), or removed and re-created (another incarnation: ESTALE). The
//! client then drops the entry and retries through Eq. 1.

use crate::error::FsError;
use crate::fs::Client;
use crate::routing::Reroute;
use futures::future::join_all;
use plusfs_proto::{DirEntry, Dirents, DistInfo, DistState, Errno, Reply, Request, ServerId, WireError};

/// How often one call follows redirects or stale-cache answers before giving up (EAGAIN).
const MAX_REROUTES: u32 = 12;

/// How many times a request whose directory's object was in transit is sent again.
const MISSING_DIR_RETRIES: u32 = 5;

impl Client {
    /// Where requests about entry `name` of `dir` go: (server, shard incarnation).
    pub fn locate(&self, dir: &str, name: &str) -> (ServerId, Option<u64>) {
        match self.dist.get(dir) {
            Some(info) if info.state == DistState::Distributed && !info.set.is_empty() => {
                (info.server_of(name), Some(info.incarnation))
            }
            _ => (self.home(dir), None),
        }
    }

    /// Wraps `req` for a shard when `shard` is set.
    pub(crate) fn addressed(req: Request, shard: Option<u64>) -> Request {
        match shard {
            Some(incarnation) => Request::Shard { incarnation, op: Box::new(req) },
            None => req,
        }
    }

    /// Decides what a server error about entries of `dir` means for routing.
    pub(crate) fn reroute(&self, dir: &str, shard: Option<u64>, e: WireError) -> Reroute {
        if let Some(info) = &e.redirect {
            // Also a refusal (EBUSY) because another directory the operation needs is
            // being distributed: wait for that too.
            if info.state == DistState::Distributing && (info.path == dir || e.errno == Errno::EBUSY) {
                return Reroute::Wait;
            }
            if info.path == dir {
                self.dist.insert((**info).clone());
                return Reroute::Retry;
            }
        }
        if shard.is_some() && (e.errno == Errno::ESTALE || e.missing_dir.as_deref() == Some(dir)) {
            self.dist.remove(dir);
            return Reroute::Retry;
        }
        Reroute::Fail(e)
    }

    /// Sends a request about entry `name` of `dir`, following redirects; returns the reply
    /// and the server that gave it.
    pub(crate) async fn entry_rpc(
        &self,
        op: &'static str,
        shown: &str,
        dir: &str,
        name: &str,
        req: Request,
    ) -> Result<(Reply, ServerId), FsError> {
        let mut attempt = 0;
        loop {
            match self.entry_call(dir, name, &req).await {
                Ok(Ok(r)) => return Ok(r),
                // A directory's object the request needs (its own, or a rename's
                // destination's) was not where the request looked, yet the directory
                // exists: it was moving to a new home (a drain or a growth). The request
                // changed nothing: send it again rather than answer ENOENT.
                Ok(Err(e)) if attempt < MISSING_DIR_RETRIES && self.in_transit(&e).await => {
                    attempt += 1;
                    tracing::debug!(dir, attempt, cause = %e.message, "a directory in transit: sending again");
                    tokio::time::sleep(std::time::Duration::from_millis(20 * attempt as u64)).await;
                }
                Ok(Err(e)) => return Err(self.server_error(op, shown, e).await),
                Err(e) => return Err(FsError { op, path: shown.to_string(), ..e }),
            }
        }
    }

    /// Whether error `e` names a missing directory object whose directory exists (its
    /// entry says so): then the object was in transit.
    async fn in_transit(&self, e: &WireError) -> bool {
        match &e.missing_dir {
            Some(d) => self.dir_exists(d).await,
            None => false,
        }
    }

    /// Whether directory `dir` exists (its entry in its parent says so).
    async fn dir_exists(&self, dir: &str) -> bool {
        let Some((parent, name)) = plusfs_proto::path::split(dir) else { return true };
        let req = Request::Stat { path: dir.to_string() };
        match self.entry_call(parent, name, &req).await {
            Ok(Ok((Reply::IsDir { .. }, _))) => true,
            Ok(Ok((Reply::Attr(a), _))) => a.kind == plusfs_proto::FileKind::Dir,
            _ => false,
        }
    }

    /// [`Client::entry_rpc`] without turning server errors into [`FsError`]s.
    pub(crate) async fn entry_call(
        &self,
        dir: &str,
        name: &str,
        req: &Request,
    ) -> Result<Result<(Reply, ServerId), WireError>, FsError> {
        let mut waiting = crate::routing::distribution_wait();
        let mut reroutes = 0;
        while reroutes < MAX_REROUTES {
            let (server, shard) = self.locate(dir, name);
            let sent = Self::addressed(req.clone(), shard);
            let e = match self.send(server, &sent).await {
                Ok(Ok(r)) => return Ok(Ok((r, server))),
                Ok(Err(e)) => e,
                Err(e) => return Err(FsError::new("reach", dir, e.errno()).with_detail(e.to_string())),
            };
            match self.reroute(dir, shard, e) {
                Reroute::Retry => reroutes += 1,
                Reroute::Wait if waiting.wait().await => {}
                Reroute::Wait => break,
                Reroute::Fail(e) => return Ok(Err(e)),
            }
        }
        Err(FsError::new("reach", dir, Errno::EAGAIN).with_detail("the directory's distribution kept changing"))
    }

    /// One page of the listing of the directory `dir` (normalised): from its home, or
    /// merged from its storing servers when it is distributed.
    pub(crate) async fn list_page(
        &self,
        shown: &str,
        dir: &str,
        after: Option<String>,
        limit: u32,
    ) -> Result<Dirents, FsError> {
        let mut waiting = crate::routing::distribution_wait();
        let mut reroutes = 0;
        while reroutes < MAX_REROUTES {
            let result = match self.dist.get(dir) {
                Some(info) => self.merged_page(&info, after.clone(), limit).await,
                None => {
                    let req = Request::Readdir { path: dir.to_string(), after: after.clone(), limit };
                    self.raw_call(shown, self.home(dir), &req).await?.map(|r| (r, ()))
                }
            };
            let (error, shard) = match result {
                Ok((r, ())) => return expect_dirents(r, shown),
                Err((e, shard)) => (e, shard),
            };
            match self.reroute(dir, shard, error) {
                Reroute::Retry => reroutes += 1,
                Reroute::Wait if waiting.wait().await => {}
                Reroute::Wait => break,
                Reroute::Fail(e) => return Err(self.server_error("open directory", shown, e).await),
            }
        }
        Err(FsError::new("open directory", shown, Errno::EAGAIN)
            .with_detail("the directory's distribution kept changing"))
    }

    /// A page of a distributed directory: up to `limit` names after `after`, merged in
    /// name order from every storing server. Each server is asked for its share of the
    /// page and a little more (names spread evenly over the servers by their hash); the
    /// merged names are complete up to the last name of every server that has more, and
    /// cut there (each entry lives on exactly one server: none is returned twice).
    async fn merged_page(
        &self,
        info: &DistInfo,
        after: Option<String>,
        limit: u32,
    ) -> Result<(Reply, ()), (WireError, Option<u64>)> {
        let cap = if limit == 0 { 1024 } else { limit as usize };
        let servers = info.servers();
        let share = match servers.len() {
            0 | 1 => cap,
            n => (cap * 5 / 4 / n + 16).min(cap),
        };
        let pages = join_all(servers.into_iter().map(|s| {
            let req = Self::addressed(
                Request::Readdir { path: info.path.clone(), after: after.clone(), limit: share as u32 },
                Some(info.incarnation),
            );
            async move { self.send(s, &req).await }
        }))
        .await;
        let mut entries: Vec<DirEntry> = Vec::new();
        let mut more = false;
        // The smallest last name of the servers with more to list.
        let mut complete_to: Option<String> = None;
        for p in pages {
            match p {
                Ok(Ok(Reply::Dirents(d))) => {
                    if d.more {
                        more = true;
                        if let Some(last) = d.entries.last() {
                            if complete_to.as_ref().is_none_or(|c| last.name < *c) {
                                complete_to = Some(last.name.clone());
                            }
                        }
                    }
                    entries.extend(d.entries);
                }
                Ok(Ok(other)) => {
                    return Err((WireError::new(Errno::EPROTO, format!("unexpected reply {other:?}")), None))
                }
                Ok(Err(e)) => return Err((e, Some(info.incarnation))),
                Err(e) => return Err((WireError::new(e.errno(), e.to_string()), None)),
            }
        }
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        if let Some(c) = complete_to {
            entries.truncate(entries.partition_point(|e| e.name <= c));
        }
        if entries.len() > cap {
            entries.truncate(cap);
            more = true;
        }
        Ok((Reply::Dirents(Dirents { incarnation: info.incarnation, entries, more }), ()))
    }

    /// Sends `req` to `server`; transport failures become an [`FsError`], server errors
    /// are returned as they came.
    pub(crate) async fn raw_call(
        &self,
        shown: &str,
        server: ServerId,
        req: &Request,
    ) -> Result<Result<Reply, (WireError, Option<u64>)>, FsError> {
        match self.send(server, req).await {
            Ok(Ok(r)) => Ok(Ok(r)),
            Ok(Err(e)) => Ok(Err((e, None))),
            Err(e) => Err(FsError::new("reach", shown, e.errno()).with_detail(e.to_string())),
        }
    }

    /// The cached distribution of `dir` (normalised), if this client has learnt one.
    pub fn cached_distribution(&self, dir: &str) -> Option<DistInfo> {
        self.dist.get(dir)
    }
}

fn expect_dirents(r: Reply, shown: &str) -> Result<Dirents, FsError> {
    match r {
        Reply::Dirents(d) => Ok(d),
        other => {
            Err(FsError::new("open directory", shown, Errno::EPROTO).with_detail(format!("unexpected reply {other:?}")))
        }
    }
}
