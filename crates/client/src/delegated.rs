//! The client calls answered under a directory delegation (`deleg`): each returns `None`
//! when the call must go to the servers instead.

use crate::deleg::{DelegWork, EndWatcher, Found, Held, Local, NewEntry, Target};
use crate::error::FsError;
use crate::fs::Client;
use plusfs_proto::{Attr, DirEntry, DistState, Errno, FileKind, SetAttr};

/// What a kernel may keep beyond its usual TTL of an entry covered by a delegation held
/// here ([`Client::kernel_cacheable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelCacheable {
    /// The entry's attributes too (not only its name): a file or symlink known here and
    /// not hard-linked (a hard-linked inode may change through another directory, and a
    /// subdirectory's attributes change with its own entries).
    pub attr: bool,
}

/// What a local operation needs of the caller's call.
type Answer<T> = Option<Result<T, FsError>>;

/// Which delegation a call may be answered under.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Need {
    /// Any delegation held.
    Held,
    /// Any delegation held, or a new read delegation if this client reads the directory
    /// often.
    Look,
    /// A write delegation held.
    Write,
    /// A write delegation held, or a new one if this client changes the directory often
    /// (replacing its read delegation, if it holds one).
    Change,
}

impl Client {
    /// What a delegation covering entry `name` of `dir` (or, with `None`, the whole
    /// directory) is of: the home object, or for a distributed directory the shard of the
    /// storing server Eq. 2 gives for `name` (a whole distributed directory: none).
    fn deleg_target(&self, dir: &str, name: Option<&str>) -> Option<Target> {
        match self.dist.get(dir) {
            None => Some(Target { server: self.home(dir), shard: None, slot: None }),
            Some(info) if info.state == DistState::Distributed && !info.set.is_empty() => name.and_then(|n| {
                let index = plusfs_proto::hugedir::slot_of(n, info.set.len());
                let server = info.set[index];
                // A server that took a drained server's slots holds several: a delegation
                // of its shard knows one slot's names only, so none is used there.
                (info.set.iter().filter(|&&s| s == server).count() == 1).then_some(Target {
                    server,
                    shard: Some(info.incarnation),
                    slot: Some((index, info.set.len())),
                })
            }),
            Some(_) => None,
        }
    }

    /// Runs `f` on the delegation that `need` asks for, covering entry `name` of `dir` (or
    /// the whole directory); `None` if there is none or `f` cannot answer. A queue grown
    /// full is written back before returning.
    async fn under<T>(
        &self,
        dir: &str,
        name: Option<&str>,
        need: Need,
        f: impl FnOnce(&mut Held) -> Option<T>,
    ) -> Option<T> {
        let d = self.delegs.as_ref()?;
        let t = self.deleg_target(dir, name)?;
        let slot = match need {
            Need::Change => d.for_change(dir, &self.caller, t).await?,
            Need::Look => d.for_read(dir, &self.caller, t).await?,
            _ => d.held(dir, t)?,
        };
        let mut h = slot.lock().await;
        if h.gone || h.releasing() || !d.leased(&h) || (h.read && matches!(need, Need::Write | Need::Change)) {
            return None;
        }
        let out = f(&mut h)?;
        d.settle(&mut h).await;
        Some(out)
    }

    /// Fetches the stored entries of those of `names` (all in the delegation covering
    /// entry `name` of `dir`) that a delegation held, granted with name digests, knows
    /// only by digest, so calls on them are answered here. Whether any were fetched.
    async fn learn(&self, dir: &str, name: &str, names: &[String]) -> bool {
        let Some(d) = self.delegs.as_ref() else { return false };
        let Some(slot) = self.deleg_target(dir, Some(name)).and_then(|t| d.held(dir, t)) else { return false };
        let mut h = slot.lock().await;
        if h.gone || h.releasing() || !d.leased(&h) || h.digests.is_none() {
            return false;
        }
        let batch = match names {
            [one] => d.unlearnt(dir, one),
            _ => None,
        };
        let names = batch.as_deref().unwrap_or(names);
        let ask: Vec<String> = names.iter().filter(|n| h.places(n) && h.asks(n)).take(4096).cloned().collect();
        if ask.is_empty() {
            return false;
        }
        match d.learn_entries(&mut h, ask, &self.caller).await {
            Ok(()) => {
                d.settle(&mut h).await;
                true
            }
            Err(e) => {
                tracing::debug!(dir, error = %e, "cannot fetch delegated entries");
                false
            }
        }
    }

    /// `lstat` of `name` in `dir`.
    pub(crate) async fn deleg_lookup(&self, shown: &str, dir: &str, name: &str) -> Answer<Attr> {
        let look = || self.under(dir, Some(name), Need::Look, |h| h.lookup(name, &self.caller));
        let r = match look().await {
            Some(r) => r,
            None if self.learn(dir, name, &[name.to_string()]).await => look().await?,
            None => return None,
        };
        Some(r.map_err(|e| FsError::new("stat", shown, e)))
    }

    /// The batch-stat results of `names` in `dir` known here (`None` for each one to ask
    /// the server about); `None` without a delegation on `dir`.
    #[allow(clippy::type_complexity)]
    pub(crate) async fn deleg_statv(
        &self,
        shown: &str,
        dir: &str,
        names: &[String],
    ) -> Answer<Vec<Option<Result<Attr, Errno>>>> {
        if let Some(info) = self.dist.get(dir).filter(|i| i.state == DistState::Distributed && !i.set.is_empty()) {
            return self.deleg_statv_shards(shown, dir, names, info.set.len()).await;
        }
        let r = self.under(dir, None, Need::Look, |h| Some(h.stat_entries(names, &self.caller))).await?;
        Some(r.map_err(|e| FsError::new("stat", shown, e)))
    }

    /// [`Client::deleg_statv`] of a directory distributed over `width` servers: each
    /// shard delegated here answers its names (those it knows by digest only fetched in
    /// one request per shard first); `None` when no shard is.
    #[allow(clippy::type_complexity)]
    async fn deleg_statv_shards(
        &self,
        shown: &str,
        dir: &str,
        names: &[String],
        width: usize,
    ) -> Answer<Vec<Option<Result<Attr, Errno>>>> {
        let mut groups: Vec<Vec<usize>> = vec![Vec::new(); width];
        for (i, n) in names.iter().enumerate() {
            groups[plusfs_proto::hugedir::slot_of(n, width)].push(i);
        }
        let answers = futures::future::join_all(groups.into_iter().filter(|g| !g.is_empty()).map(|idx| async move {
            let part: Vec<String> = idx.iter().map(|i| names[*i].clone()).collect();
            self.learn(dir, &part[0], &part).await;
            let r = self.under(dir, Some(&part[0]), Need::Held, |h| Some(h.stat_entries(&part, &self.caller))).await;
            (idx, r)
        }))
        .await;
        let mut out = vec![None; names.len()];
        let mut any = false;
        let mut unlearnt = Vec::new();
        for (idx, r) in answers {
            let Some(r) = r else {
                unlearnt.extend(idx.into_iter().map(|i| names[i].clone()));
                continue;
            };
            any = true;
            for (i, a) in idx.into_iter().zip(r.map_err(|e| FsError::new("stat", shown, e)).ok()?) {
                out[i] = a;
            }
        }
        if let Some(d) = self.delegs.as_ref().filter(|_| !unlearnt.is_empty()) {
            d.note_unlearnt(dir, unlearnt);
        }
        any.then_some(Ok(out))
    }

    /// The listing of delegated directory `dir`.
    pub(crate) async fn deleg_readdir(&self, shown: &str, dir: &str) -> Answer<Vec<DirEntry>> {
        let r = self.under(dir, None, Need::Look, |h| h.listing(&self.caller)).await?;
        Some(r.map_err(|e| FsError::new("open directory", shown, e)))
    }

    /// The attributes of delegated directory `dir` itself (for a distributed one, when
    /// every shard is delegated here: see `Delegations::dist_dir_attr`).
    pub(crate) async fn deleg_dir_attr(&self, dir: &str) -> Option<Attr> {
        let d = self.delegs.as_ref()?;
        match self.dist.get(dir) {
            Some(info) if info.state == DistState::Distributed && !info.set.is_empty() => {
                let a = d.dist_dir_attr(dir, info.incarnation).await?;
                // The caller may reach the directory: any shard's copy checks as the home.
                let width = info.set.len();
                let held = info.set.iter().enumerate().find_map(|(i, &server)| {
                    d.held(dir, Target { server, shard: Some(info.incarnation), slot: Some((i, width)) })
                })?;
                plusfs_proto::perm::check_search_above(&self.caller, &held.lock().await.obj, dir).ok()?;
                Some(a)
            }
            _ => self.under(dir, None, Need::Held, |h| h.dir_attr(&self.caller)).await,
        }
    }

    /// Records the attributes the servers gave for delegated directory `dir` itself.
    pub(crate) async fn deleg_learn_dir(&self, dir: &str, a: &Attr) {
        if let (Some(d), Some(info)) = (&self.delegs, self.dist.get(dir)) {
            if info.state == DistState::Distributed {
                d.learn_dist_attr(dir, a).await;
                return;
            }
        }
        self.under(dir, None, Need::Held, |h| {
            h.learn_dir(a);
            Some(())
        })
        .await;
    }

    /// Creates (or opens) `name` in `dir`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn deleg_create(
        &self,
        shown: &str,
        dir: &str,
        name: &str,
        kind: FileKind,
        mode: u32,
        exclusive: bool,
        (rdev, access, target): (u32, u32, Option<&str>),
    ) -> Answer<Attr> {
        if !crate::deleg::delegable(kind) {
            return None;
        }
        let asked = (self.opts.uid, self.opts.gid);
        let new = NewEntry { kind, exclusive, access, target, rdev, asked };
        let r = self.under(dir, Some(name), Need::Change, |h| h.create(name, mode, new, &self.caller)).await?;
        Some(r.map_err(|e| FsError::new("create", shown, e)))
    }

    /// Opens existing `name` in `dir` for `access`.
    pub(crate) async fn deleg_open(&self, shown: &str, dir: &str, name: &str, access: u32) -> Answer<Attr> {
        let r = self.under(dir, Some(name), Need::Look, |h| h.open(name, access, &self.caller)).await?;
        Some(r.map_err(|e| FsError::new("open", shown, e)))
    }

    /// Removes `name` from `dir`.
    pub(crate) async fn deleg_unlink(&self, shown: &str, dir: &str, name: &str) -> Answer<()> {
        let unlink = || self.under(dir, Some(name), Need::Change, |h| h.unlink(name, &self.caller));
        let r = match unlink().await {
            Some(r) => r,
            None if self.learn(dir, name, &[name.to_string()]).await => unlink().await?,
            None => return None,
        };
        Some(r.map_err(|e| FsError::new("remove", shown, e)))
    }

    /// Renames `from` to `to` within `dir`.
    pub(crate) async fn deleg_rename(&self, shown: &str, dir: &str, from: &str, to: &str) -> Answer<()> {
        if self.deleg_target(dir, Some(from)) != self.deleg_target(dir, Some(to)) {
            return None; // names on two storing servers of a distributed directory
        }
        let r = self.under(dir, Some(from), Need::Change, |h| h.rename(from, to, &self.caller)).await?;
        Some(r.map_err(|e| FsError::new("move", shown, e)))
    }

    /// Changes attributes of `name` in `dir`.
    pub(crate) async fn deleg_setattr(&self, shown: &str, dir: &str, name: &str, set: &SetAttr) -> Answer<Attr> {
        let d = self.delegs.as_ref()?;
        let small = d.small_file_bytes();
        let r = self.under(dir, Some(name), Need::Write, |h| h.setattr(name, set, &self.caller, small)).await?;
        Some(r.map_err(|e| FsError::new("change attributes of", shown, e)))
    }

    /// Changes attributes of delegated directory `dir` itself.
    pub(crate) async fn deleg_dir_setattr(&self, shown: &str, dir: &str, set: &SetAttr) -> Answer<Attr> {
        let r = self.under(dir, None, Need::Write, |h| h.set_dir_attr(set, &self.caller)).await?;
        Some(r.map_err(|e| FsError::new("change attributes of", shown, e)))
    }

    /// Writes into a small file whose contents are known here.
    pub(crate) async fn deleg_write(&self, dir: &str, name: &str, offset: u64, data: &[u8]) -> Option<Attr> {
        let small = self.delegs.as_ref()?.small_file_bytes();
        self.under(dir, Some(name), Need::Write, |h| h.write(name, offset, data, small, &self.caller)).await
    }

    /// Reads a file whose contents are known here.
    pub(crate) async fn deleg_read(&self, dir: &str, name: &str, offset: u64, len: usize) -> Option<Vec<u8>> {
        self.under(dir, Some(name), Need::Held, |h| h.read(name, offset, len, &self.caller)).await
    }

    /// The target of a symlink known here.
    pub(crate) async fn deleg_readlink(&self, dir: &str, name: &str) -> Option<String> {
        self.under(dir, Some(name), Need::Held, |h| h.readlink(name, &self.caller)).await
    }

    /// Writes back every delegated directory's queued work, as `sync(2)` asks of a file
    /// system; EIO if a server refused work since the last sync (a revoked delegation).
    pub async fn sync(&self) -> Result<(), FsError> {
        match &self.delegs {
            Some(d) => d.sync(false).await,
            None => Ok(()),
        }
    }

    /// Whether a kernel may keep `answer`, what this client's caller found of entry `name`
    /// of `dir` (`None`: missing), beyond its usual TTL: a delegation covering it is held
    /// here and leased, so nobody else can change it before the delegation ends, and its
    /// end is told to the watcher set with [`Self::on_delegation_end`]. `None`: not
    /// covered now (also when the delegation is busy this moment), or the answer is not
    /// what the delegation knows (it was found before the delegation was granted). A
    /// caller must record what it lets the kernel keep *before* asking, so an end told
    /// meanwhile finds it.
    pub fn kernel_cacheable(&self, dir: &str, name: &str, answer: Option<&Attr>) -> Option<KernelCacheable> {
        let d = self.delegs.as_ref()?;
        let slot = d.held(dir, self.deleg_target(dir, Some(name))?)?;
        let h = slot.try_lock().ok()?;
        if h.gone || h.releasing() || !d.leased(&h) || !h.places(name) {
            return None;
        }
        let attr = match (h.find(name), answer) {
            (Found::Absent, None) => false,
            (Found::Here(Local::Known { attr, link, .. }), Some(a)) if attr.ino == a.ino => {
                !link && attr.kind != FileKind::Dir && attr.ctime == a.ctime
            }
            _ => return None,
        };
        d.kernel_caches(&h);
        Some(KernelCacheable { attr })
    }

    /// Sets `watcher` to be told the directory of each delegation that ends (returned,
    /// revoked, or its lease lapsed) after [`Self::kernel_cacheable`] said yes under it
    /// (nothing waits for the watcher). Once per client (and its clones); false when
    /// delegations are off or a watcher was set already.
    pub fn on_delegation_end(&self, watcher: EndWatcher) -> bool {
        self.delegs.as_ref().is_some_and(|d| d.watch_ends(watcher))
    }

    /// Writes back and returns every delegation (at unmount).
    pub async fn return_delegations(&self) -> Result<(), FsError> {
        match &self.delegs {
            Some(d) => d.sync(true).await,
            None => Ok(()),
        }
    }

    /// EIO if a server refused work of this client's delegations since the last check.
    pub(crate) fn deleg_lost(&self) -> Result<(), FsError> {
        self.delegs.as_ref().map_or(Ok(()), |d| d.take_lost())
    }

    /// Delegations this client holds.
    pub fn delegations_held(&self) -> usize {
        self.delegs.as_ref().map_or(0, |d| d.count())
    }

    /// Operations done under this client's delegations and not yet written back.
    pub fn delegated_pending(&self) -> usize {
        self.delegs.as_ref().map_or(0, |d| d.pending())
    }

    /// Operations done under this client's delegations that the servers have applied.
    pub fn delegated_written(&self) -> u64 {
        self.delegs.as_ref().map_or(0, |d| d.written())
    }

    /// The work this client's delegations did (write-back scans, grants).
    pub fn delegation_work(&self) -> DelegWork {
        self.delegs.as_ref().map_or_else(Default::default, |d| d.work())
    }
}
