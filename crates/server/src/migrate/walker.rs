//! Each server's walker: while a migration runs, it asks the new home of every directory
//! object this server still holds (served, or handed over but unconfirmed) to take it,
//! `batch` objects per request at most `objects_per_sec` a second, and tells the map
//! service; once every server has, it moves the file-data chunks of its files
//! (`data.rs`) and tells the map service it is done. It runs again from the store after a restart: what it walks is
//! exactly what is still here.

use super::Migration;
use crate::engine::errors::{eio, err, OpResult};
use plusfs_placement::ClusterMap;
use plusfs_proto::{Errno, Reply, Request, ServerId};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

impl Migration {
    /// Starts the walker unless it runs.
    pub(crate) fn start_walker(self: &Arc<Self>) {
        if self.walker_running.swap(true, Ordering::AcqRel) {
            return;
        }
        let osd = self.clone();
        tokio::spawn(async move {
            osd.walk().await;
            osd.walker_running.store(false, Ordering::Release);
            // A map adopted while the walker was finishing may need it again.
            if osd.engine.map().migration.as_ref().is_some_and(|m| !m.done.contains(&osd.engine.id())) {
                osd.start_walker();
            }
        });
    }

    async fn walk(self: &Arc<Self>) {
        // Passes in a row that left objects here: each waits longer (a directory whose
        // hand-over keeps failing must not turn the walker into a busy loop).
        let mut fruitless = 0u32;
        loop {
            let map = self.engine.map();
            let Some(m) = map.migration.clone() else { return };
            if m.done.contains(&self.engine.id()) {
                return;
            }
            self.migration.start(m.from_epoch);
            let moved_before = self.migration.objects_out.load(Ordering::Relaxed);
            let dirs = !m.dirs_done.contains(&self.engine.id());
            let pass = if dirs {
                self.walk_once(&map).await
            } else if m.dirs_settled(&map) {
                // Objects that reached this server since (a transaction in doubt until now)
                // go first; then the file data.
                match self.walk_once(&map).await {
                    Ok(true) => self.move_data_once(&map).await.map(|left| left == 0),
                    other => other.map(|_| false),
                }
            } else {
                // Chunks move once every directory is at its new home.
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            };
            // Progress (objects handed over, or a newer map to plan with) starts the count
            // again.
            let progressed = self.migration.objects_out.load(Ordering::Relaxed) != moved_before
                || self.engine.map().epoch != map.epoch;
            if matches!(pass, Ok(true)) || progressed {
                fruitless = 0;
            }
            match pass {
                Ok(true) => match self.report_done(m.from_epoch, !dirs).await {
                    Ok(()) => {
                        let stage = if dirs { "directory objects" } else { "file data" };
                        tracing::info!(from_epoch = m.from_epoch, stage, "this server's part of the migration is done");
                    }
                    Err(e) => {
                        tracing::warn!(cause = %e.message(), "cannot report the migration stage done; retrying");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                },
                Ok(false) if fruitless == 0 && progressed => {}
                Ok(false) => {
                    fruitless += 1;
                    if fruitless == 100 {
                        tracing::warn!(
                            from_epoch = m.from_epoch,
                            "100 migration passes in a row left objects here; still trying"
                        );
                    }
                    let pause = Duration::from_millis(10) * (1 << fruitless.min(7));
                    tokio::time::sleep(pause.min(Duration::from_secs(1))).await;
                    continue;
                }
                Err(e) => {
                    tracing::warn!(cause = %e.message(), "migration pass failed; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }

    /// Hurries every transaction holding locks now and waits (30 s at most) until they
    /// have all ended; answers whether they did.
    pub(super) async fn settle_older_transactions(&self) -> bool {
        let older = self.engine.locks().transactions();
        for t in &older {
            self.engine.locks().hurry(*t);
        }
        let started = Instant::now();
        while self.engine.locks().any_held(&older) {
            if started.elapsed() > Duration::from_secs(30) {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    }

    /// Hands the directory objects of `paths` that are not homed here to their homes, in
    /// the background: objects a transaction planned with an older map brought here
    /// (a directory rename's imports).
    pub(crate) fn hand_over_strays(self: &Arc<Self>, paths: Vec<String>) {
        let map = self.engine.map();
        let mut by_home: BTreeMap<ServerId, Vec<String>> = BTreeMap::new();
        for p in paths.into_iter().filter(|p| map.home_of_dir(p) != self.engine.id()) {
            by_home.entry(map.home_of_dir(&p)).or_default().push(p);
        }
        for (home, paths) in by_home {
            tracing::info!(home, objects = paths.len(), "handing over objects an older map placed here");
            let osd = self.clone();
            tokio::spawn(async move {
                let mut pause = Duration::from_millis(20);
                for _ in 0..60 {
                    let req = Request::MigrateIn { paths: paths.clone(), from: osd.engine.id() };
                    if let Ok(Ok(Reply::Done)) = osd.peers.pool.call(home, &req).await {
                        if osd.migrate_done(&paths).await.is_ok() {
                            return;
                        }
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
                tracing::warn!(home, "objects an older map placed here are still here; the next migration moves them");
            });
        }
    }

    /// What this server still holds that `map` homes elsewhere, by new home.
    fn to_hand_over(&self, map: &ClusterMap) -> OpResult<BTreeMap<ServerId, Vec<String>>> {
        let mut by_home: BTreeMap<ServerId, Vec<String>> = BTreeMap::new();
        for (p, _) in self.engine.store().dirs_within("/").map_err(eio)? {
            let home = map.home_of_dir(&p);
            if home != self.engine.id() {
                by_home.entry(home).or_default().push(p);
            }
        }
        for p in self.outbox_paths()? {
            by_home.entry(map.home_of_dir(&p)).or_default().push(p);
        }
        for v in by_home.values_mut() {
            v.sort();
            v.dedup();
        }
        Ok(by_home)
    }

    /// One pass over what is here; answers whether nothing was left to move.
    async fn walk_once(self: &Arc<Self>, map: &ClusterMap) -> OpResult<bool> {
        let mut by_home = self.to_hand_over(map)?;
        if by_home.is_empty() {
            // Operations that began before this server knew the map may still create
            // objects here when they commit (a Cx participant's object, a prepared
            // transaction's): they are hurried and waited for, then everything is looked at
            // once more. Later operations were placed with this map.
            if !self.settle_older_transactions().await {
                return Ok(false); // one is in doubt (its coordinator is away): later
            }
            by_home = self.to_hand_over(map)?;
        }
        let mut left: u64 = by_home.values().map(|v| v.len() as u64).sum();
        self.migration.objects_left.store(left, Ordering::Relaxed);
        if left == 0 {
            // A drained server's shards of distributed directories go last (their homes
            // are settled by now), then its shared inodes.
            if !self.move_shards_once(map).await? {
                return Ok(false);
            }
            return self.move_inodes_once(map).await;
        }
        let pace = &map.rebalance;
        for (home, paths) in by_home {
            for chunk in paths.chunks(pace.batch as usize) {
                if self.engine.map().epoch != map.epoch {
                    return Ok(false); // plan again with the newer map
                }
                let started = Instant::now();
                let req = Request::MigrateIn { paths: chunk.to_vec(), from: self.engine.id() };
                match self.peers.pool.call(home, &req).await {
                    Ok(Ok(Reply::Done)) => {
                        self.migrate_done(chunk).await?;
                    }
                    Ok(Ok(other)) => return Err(err(Errno::EIO, format!("server {home} answered {other:?}"))),
                    Ok(Err(e)) => tracing::debug!(home, cause = %e.message, "hand-over refused for now"),
                    Err(e) => return Err(err(e.errno(), format!("cannot reach server {home}: {e}"))),
                }
                left = left.saturating_sub(chunk.len() as u64);
                self.migration.objects_left.store(left, Ordering::Relaxed);
                let due = Duration::from_secs_f64(chunk.len() as f64 / pace.objects_per_sec as f64);
                if let Some(rest) = due.checked_sub(started.elapsed()) {
                    tokio::time::sleep(rest).await;
                }
            }
        }
        Ok(false)
    }
}
