//! `plusfs bench --target engine`: the same inserts, gets and deletes a server would make,
//! done in-process directly on the store engine, batch for batch. No network, no protocol:
//! the upper limit for a server on this machine.

use crate::bench::{client_files, BenchArgs, Outcome, Phase};
use anyhow::{Context, Result};
use plusfs_proto::{DirObject, FileKind, Inode};
use plusfs_store::{Batch, DirStore, RocksStore, StoreRead};
use std::path::Path;
use std::sync::{Arc, Barrier};
use std::time::Instant;

pub fn run(a: &BenchArgs, dir: Option<&Path>) -> Result<Vec<Outcome>> {
    let scratch = match dir {
        Some(d) => tempfile::Builder::new().prefix("plusfs-engine").tempdir_in(d),
        None => tempfile::Builder::new().prefix("plusfs-engine").tempdir(),
    }
    .context("cannot create the engine's scratch directory")?;
    let store = Arc::new(RocksStore::open(scratch.path(), false)?);
    let label = match dir {
        Some(d) => format!("engine:{}", d.display()),
        None => "engine".to_string(),
    };
    if a.phases.iter().any(|p| p.moves_data() || *p == Phase::Open) {
        anyhow::bail!("the write, read, open and probe phases run on the plusfs and local targets only");
    }
    // Stat and unlink need files: when this run does not create them, do so untimed.
    let needs_files = a.phases.iter().position(|p| *p != Phase::Create);
    let creates_first = a.phases.iter().position(|p| *p == Phase::Create);
    if needs_files.is_some() && creates_first.is_none_or(|c| Some(c) > needs_files) {
        for ci in 0..a.clients {
            let (dir_path, names) = client_files(a, &a.dir, ci);
            let dir_ino = if a.unique { 1000 + ci as u64 } else { 1000 };
            engine_client(store.as_ref(), Phase::Create, &dir_path, dir_ino, &names, a.batch, ci as u64)?;
        }
    }
    let mut out = Vec::new();
    for &phase in &a.phases {
        let barrier = Arc::new(Barrier::new(a.clients + 1));
        let threads: Vec<_> = (0..a.clients)
            .map(|ci| {
                let (dir_path, names) = client_files(a, &a.dir, ci);
                // Shared: one directory object for all clients; unique: one each.
                let dir_ino = if a.unique { 1000 + ci as u64 } else { 1000 };
                let (store, barrier, batch) = (store.clone(), barrier.clone(), a.batch);
                std::thread::spawn(move || {
                    barrier.wait();
                    engine_client(store.as_ref(), phase, &dir_path, dir_ino, &names, batch, ci as u64)
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        let mut errors = 0;
        for t in threads {
            errors += t.join().map_err(|_| anyhow::anyhow!("engine client panicked"))??;
        }
        let seconds = start.elapsed().as_secs_f64();
        out.push(Outcome::timed(label.clone(), phase, a, errors, seconds));
    }
    Ok(out)
}

/// One client's loop; returns the number of failed operations.
fn engine_client(
    store: &RocksStore,
    phase: Phase,
    dir_path: &str,
    dir_ino: u64,
    names: &[String],
    batch: usize,
    client: u64,
) -> Result<u64> {
    let mut errors = 0;
    let mut next_ino = (client + 2) << 40;
    if phase == Phase::Readdir {
        // The scan a server makes to list the directory, page by page.
        let mut after: Option<String> = None;
        loop {
            let page = store.list_entries(dir_ino, after.as_deref(), 4096)?;
            let Some((last, _)) = page.last() else { break };
            after = Some(last.clone());
        }
        return Ok(errors);
    }
    for chunk in names.chunks(batch.max(1)) {
        match phase {
            Phase::Readdir | Phase::Write | Phase::Read | Phase::Open | Phase::ProbeWrite | Phase::ProbeRead => {
                unreachable!("listed above or refused")
            }
            Phase::Stat => {
                // The same batched lookup a server makes for a statv request.
                let names: Vec<&str> = chunk.iter().map(String::as_str).collect();
                errors += store.get_entries(dir_ino, &names)?.iter().filter(|e| e.is_none()).count() as u64;
            }
            Phase::Create | Phase::Unlink => {
                let mut b = Batch::new();
                // A server checks the names are free (create) or present (unlink) first,
                // with one batched lookup.
                let names: Vec<&str> = chunk.iter().map(String::as_str).collect();
                let current = store.get_entries(dir_ino, &names)?;
                for (name, cur) in chunk.iter().zip(current) {
                    let exists = cur.is_some();
                    match (phase, exists) {
                        (Phase::Create, false) => {
                            next_ino += 1;
                            b.put_entry(dir_ino, name, &Inode::new(next_ino, FileKind::File, 0o644, 0, 0));
                        }
                        (Phase::Unlink, true) => b.del_entry(dir_ino, name),
                        _ => errors += 1,
                    }
                }
                b.put_dir(dir_path, &DirObject::new(dir_ino, 0o755, 0, 0));
                store.submit(b).blocking_recv().map_err(|_| anyhow::anyhow!("store closed"))??;
            }
        }
    }
    Ok(errors)
}
