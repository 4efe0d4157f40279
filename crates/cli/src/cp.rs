//! `plusfs cp`: batch migration of trees (BFOm, seed 002 §3.4) between local file systems
//! and plusfs clusters, in any direction.
//!
//! 1. Metadata first: the source tree is walked and every entry's attributes read (local:
//!    `lstat`, and the physical offset of each file's first extent with FIEMAP, or its
//!    inode number where FIEMAP is missing; plusfs: `readdir` + one `statv` per directory
//!    and server). Directories are made at the destination.
//! 2. Data in batches of up to `--batch-mib` (64 MiB) and 1000 files, grouped by
//!    directory: a reader task reads the next batch (plusfs: `batch_read`; local: the files
//!    in on-disk order) while the writer stores the current one (plusfs: `batch_write`,
//!    which also sets mode, owner and times; local: all data first, then modes, owners and
//!    times).
//! 3. Then symbolic links, hard links (made as links of the first copy), and directory
//!    modes and times, deepest first.
//!
//! Files whose destination already has the same size and modification time are skipped, so
//! an interrupted copy is finished by running it again. `--verify` reads both trees back
//! and compares checksums.

use anyhow::{bail, Context, Result};
use clap::Args;
use plusfs_client::{Client, ClientOptions, NewFile};
use plusfs_placement::ClusterMap;
use plusfs_proto::{FileKind, Semantics, Timespec};
use std::collections::HashMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

#[derive(Args)]
pub struct CpArgs {
    /// Copy directories recursively (required for directories, as with cp).
    #[arg(short = 'r', short_alias = 'R', long)]
    recursive: bool,
    /// Read both trees back after the copy and compare every file's checksum.
    #[arg(long)]
    verify: bool,
    /// Most file bytes per batch.
    #[arg(long, default_value_t = 64)]
    batch_mib: u64,
    /// Copy every file even if the destination looks finished (same size and time).
    #[arg(long)]
    no_skip: bool,
    /// No progress line.
    #[arg(short, long)]
    quiet: bool,
    /// Treat the destination as the copy itself, even if it is an existing directory
    /// (as GNU cp -T); re-running an interrupted copy this way finishes it.
    #[arg(short = 'T', long)]
    no_target_directory: bool,
    /// Sources, then the destination. Cluster paths are `plusfs:/path` (the cluster of
    /// --cluster), `plusfs@MAP:/path` (another cluster's map file), or paths inside a
    /// `plusfs mount` of the --cluster cluster.
    #[arg(required = true, num_args = 2..)]
    paths: Vec<String>,
}

/// One side of a copy.
// Only a few live at once (one per copied path): not worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
enum Place {
    Local(PathBuf),
    Cluster(Client, String),
}

/// `rel` below local directory `base`, or `base` itself for the root entry (`rel` empty:
/// the source or destination is the file being copied).
fn local_at(base: &Path, rel: &str) -> PathBuf {
    if rel.is_empty() {
        base.to_path_buf()
    } else {
        base.join(rel)
    }
}

/// `rel` below cluster directory `base`, or `base` itself for the root entry.
fn cluster_at(base: &str, rel: &str) -> String {
    if rel.is_empty() {
        base.to_string()
    } else {
        plusfs_proto::path::join(base, rel)
    }
}

impl Place {
    fn join(&self, rel: &str) -> Place {
        match self {
            Place::Local(p) if rel.is_empty() => Place::Local(p.clone()),
            Place::Local(p) => Place::Local(p.join(rel)),
            Place::Cluster(c, p) if rel.is_empty() => Place::Cluster(c.clone(), p.clone()),
            Place::Cluster(c, p) => Place::Cluster(c.clone(), plusfs_proto::path::join(p, rel)),
        }
    }

    fn show(&self) -> String {
        match self {
            Place::Local(p) => p.display().to_string(),
            Place::Cluster(_, p) => format!("plusfs:{p}"),
        }
    }
}

/// What the walk found: a path relative to the source root and its attributes.
#[derive(Debug, Clone)]
struct Entry {
    rel: String,
    kind: FileKind,
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: Timespec,
    size: u64,
    /// Identity for hard links (set when the file has more than one link).
    link_key: Option<(u64, u64)>,
    target: Option<String>,
    /// Where its data starts on disk (FIEMAP) or its inode number: the read order.
    order: u64,
}

fn ts(sec: i64, nsec: i64) -> Timespec {
    Timespec { sec, nsec: nsec as u32 }
}

/// Parses one command-line path.
fn place(raw: &str, default: Option<&Client>, mounts: &[PathBuf]) -> Result<Place> {
    let need = || default.cloned().context("a plusfs: path needs --cluster FILE or PLUSFS_CLUSTER");
    if let Some(p) = raw.strip_prefix("plusfs:") {
        return Ok(Place::Cluster(need()?, norm(p)?));
    }
    if let Some(rest) = raw.strip_prefix("plusfs@") {
        let (map, p) = rest.rsplit_once(':').context("expected plusfs@MAP:/path")?;
        let client = Client::new(ClusterMap::load(Path::new(map))?, ClientOptions::default());
        return Ok(Place::Cluster(client, norm(p)?));
    }
    let abs = std::path::absolute(raw).with_context(|| format!("bad path '{raw}'"))?;
    for m in mounts {
        if let Ok(rest) = abs.strip_prefix(m) {
            return Ok(Place::Cluster(need()?, norm(&format!("/{}", rest.display()))?));
        }
    }
    Ok(Place::Local(abs))
}

fn norm(p: &str) -> Result<String> {
    plusfs_proto::path::normalize(p).map_err(|e| anyhow::anyhow!("bad cluster path '{p}': {}", e.reason))
}

/// Mount points of plusfs mounts on this machine.
fn plusfs_mounts() -> Vec<PathBuf> {
    std::fs::read_to_string("/proc/mounts")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.len() > 2 && f[0] == "plusfs" && f[2].starts_with("fuse")).then(|| PathBuf::from(f[1]))
        })
        .collect()
}

pub async fn run(default: Option<Client>, a: CpArgs) -> Result<ExitCode> {
    let mounts = plusfs_mounts();
    let (dst_raw, srcs) = a.paths.split_last().expect("at least two paths");
    let dst = place(dst_raw, default.as_ref(), &mounts)?;
    let dst_is_dir = !a.no_target_directory && is_dir(&dst).await;
    if srcs.len() > 1 && !dst_is_dir {
        if a.no_target_directory {
            bail!("-T takes one source");
        }
        bail!("target '{}' is not a directory", dst.show());
    }
    let mut failed = 0;
    for raw in srcs {
        let src = place(raw, default.as_ref(), &mounts)?;
        let root = match (&src, dst_is_dir) {
            (_, true) => dst.join(&basename(&src)),
            (_, false) => dst.clone(),
        };
        failed += copy_tree(&src, &root, &a).await?;
    }
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

fn basename(p: &Place) -> String {
    match p {
        Place::Local(p) => p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        Place::Cluster(_, p) => plusfs_proto::path::split(p).map(|s| s.1.to_string()).unwrap_or_default(),
    }
}

async fn is_dir(p: &Place) -> bool {
    match p {
        Place::Local(p) => p.is_dir(),
        Place::Cluster(c, p) => c.stat(p).await.is_ok_and(|a| a.kind == FileKind::Dir),
    }
}

/// Copies one source tree to `dst`; returns the number of entries that failed.
async fn copy_tree(src: &Place, dst: &Place, a: &CpArgs) -> Result<usize> {
    let started = Instant::now();
    let entries = walk(src).await?;
    if entries.first().is_some_and(|e| e.kind == FileKind::Dir) && !a.recursive {
        bail!("'{}' is a directory (use -r)", src.show());
    }
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let mut failed = 0;
    // Directories first, writable by us until the end.
    for e in entries.iter().filter(|e| e.kind == FileKind::Dir) {
        if let Err(err) = make_dir(&dst.join(&e.rel)).await {
            eprintln!("plusfs: cp: {}: {err:#}", dst.join(&e.rel).show());
            failed += 1;
        }
    }
    // Files: the first of each hard-linked set carries the data.
    let mut firsts: HashMap<(u64, u64), String> = HashMap::new();
    let mut links = Vec::new();
    let mut files = Vec::new();
    for e in entries.iter().filter(|e| e.kind == FileKind::File) {
        match e.link_key.map(|k| firsts.get(&k).cloned().ok_or(k)) {
            Some(Ok(first)) => links.push((first, e.rel.clone())),
            Some(Err(k)) => {
                firsts.insert(k, e.rel.clone());
                files.push(e.clone());
            }
            None => files.push(e.clone()),
        }
    }
    let todo = if a.no_skip { files } else { unfinished(dst, files).await };
    let total_files = todo.len();
    let total_bytes: u64 = todo.iter().map(|e| e.size).sum();
    let batches = batches(todo, a.batch_mib << 20);
    let progress = Progress::new(total_files, total_bytes, a.quiet);
    failed += pipeline(src, dst, batches, root, &progress).await;
    progress.finish();
    for e in entries.iter().filter(|e| e.kind == FileKind::Symlink) {
        if let Err(err) = make_symlink(&dst.join(&e.rel), e, root).await {
            eprintln!("plusfs: cp: {}: {err:#}", dst.join(&e.rel).show());
            failed += 1;
        }
    }
    for (first, other) in links {
        if let Err(err) = make_link(&dst.join(&first), &dst.join(&other)).await {
            eprintln!("plusfs: cp: {}: {err:#}", dst.join(&other).show());
            failed += 1;
        }
    }
    // Directory modes and times, deepest first (their entries are done).
    let mut dirs: Vec<&Entry> = entries.iter().filter(|e| e.kind == FileKind::Dir).collect();
    dirs.sort_by_key(|e| std::cmp::Reverse(e.rel.matches('/').count() + usize::from(!e.rel.is_empty())));
    for e in dirs {
        if let Err(err) = set_attrs(&dst.join(&e.rel), e, root).await {
            eprintln!("plusfs: cp: {}: {err:#}", dst.join(&e.rel).show());
            failed += 1;
        }
    }
    let secs = started.elapsed().as_secs_f64();
    if !a.quiet {
        eprintln!(
            "plusfs: cp: {} -> {}: {} entries, {total_files} files copied ({:.1} MiB) in {secs:.2} s ({:.0} files/s, {:.1} MiB/s)",
            src.show(),
            dst.show(),
            entries.len(),
            total_bytes as f64 / 1048576.0,
            total_files as f64 / secs,
            total_bytes as f64 / 1048576.0 / secs
        );
    }
    if a.verify {
        failed += verify(src, dst, &entries).await?;
    }
    Ok(failed)
}

// ----- phase 1: the walk ------------------------------------------------------------------

async fn walk(src: &Place) -> Result<Vec<Entry>> {
    match src {
        Place::Local(p) => {
            let p = p.clone();
            tokio::task::spawn_blocking(move || walk_local(&p)).await?
        }
        Place::Cluster(c, p) => walk_cluster(c, p).await,
    }
}

fn walk_local(root: &Path) -> Result<Vec<Entry>> {
    let mut out = Vec::new();
    let mut stack = vec![String::new()];
    while let Some(rel) = stack.pop() {
        let path = if rel.is_empty() { root.to_path_buf() } else { root.join(&rel) };
        let md = std::fs::symlink_metadata(&path).with_context(|| format!("cannot stat {}", path.display()))?;
        let kind = if md.is_dir() {
            FileKind::Dir
        } else if md.file_type().is_symlink() {
            FileKind::Symlink
        } else if md.is_file() {
            FileKind::File
        } else {
            eprintln!("plusfs: cp: skipping special file {}", path.display());
            continue;
        };
        let target = match kind {
            FileKind::Symlink => Some(std::fs::read_link(&path)?.to_string_lossy().into_owned()),
            _ => None,
        };
        let order = if kind == FileKind::File && md.len() > 0 { fiemap_start(&path).unwrap_or(md.ino()) } else { 0 };
        out.push(Entry {
            rel: rel.clone(),
            kind,
            mode: md.mode() & 0o7777,
            uid: md.uid(),
            gid: md.gid(),
            mtime: ts(md.mtime(), md.mtime_nsec()),
            size: if kind == FileKind::File { md.len() } else { 0 },
            link_key: (kind == FileKind::File && md.nlink() > 1).then_some((md.dev(), md.ino())),
            target,
            order,
        });
        if kind == FileKind::Dir {
            let mut names: Vec<String> = std::fs::read_dir(&path)?
                .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
                .collect::<std::io::Result<_>>()?;
            names.sort_unstable_by(|a, b| b.cmp(a));
            stack.extend(names.into_iter().map(|n| if rel.is_empty() { n } else { format!("{rel}/{n}") }));
        }
    }
    Ok(out)
}

/// Physical offset of the first extent of a file (FIEMAP), where the file system tells.
fn fiemap_start(path: &Path) -> Option<u64> {
    #[repr(C)]
    #[derive(Default)]
    struct Extent {
        logical: u64,
        physical: u64,
        length: u64,
        reserved64: [u64; 2],
        flags: u32,
        reserved: [u32; 3],
    }
    #[repr(C)]
    #[derive(Default)]
    struct Fiemap {
        start: u64,
        length: u64,
        flags: u32,
        mapped_extents: u32,
        extent_count: u32,
        reserved: u32,
        extents: [Extent; 1],
    }
    const FS_IOC_FIEMAP: libc::c_ulong = 0xC020_660B;
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).ok()?;
    let mut m = Fiemap { length: u64::MAX, extent_count: 1, ..Default::default() };
    // SAFETY: FS_IOC_FIEMAP with a properly laid out fiemap holding room for one extent.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), FS_IOC_FIEMAP, &mut m as *mut Fiemap) };
    (r == 0 && m.mapped_extents > 0).then_some(m.extents[0].physical)
}

async fn walk_cluster(c: &Client, root: &str) -> Result<Vec<Entry>> {
    let top = c.lstat(root).await.with_context(|| format!("cannot stat plusfs:{root}"))?;
    let mut out = vec![cluster_entry(String::new(), &top, c, root).await?];
    let mut stack = if top.kind == FileKind::Dir { vec![String::new()] } else { Vec::new() };
    while let Some(rel) = stack.pop() {
        let dir = if rel.is_empty() { root.to_string() } else { plusfs_proto::path::join(root, &rel) };
        let names: Vec<String> = c.readdir(&dir).await?.into_iter().map(|e| e.name).collect();
        let attrs = c.statv(&dir, &names, Semantics::PerformAll).await?;
        for (name, a) in names.iter().zip(attrs) {
            let Ok(a) = a else { continue }; // removed meanwhile
            let child = if rel.is_empty() { name.clone() } else { format!("{rel}/{name}") };
            let e = cluster_entry(child.clone(), &a, c, &plusfs_proto::path::join(&dir, name)).await?;
            if e.kind == FileKind::Dir {
                stack.push(child);
            }
            if matches!(e.kind, FileKind::Dir | FileKind::File | FileKind::Symlink) {
                out.push(e);
            } else {
                eprintln!("plusfs: cp: skipping special file plusfs:{}", plusfs_proto::path::join(&dir, name));
            }
        }
    }
    Ok(out)
}

async fn cluster_entry(rel: String, a: &plusfs_proto::Attr, c: &Client, path: &str) -> Result<Entry> {
    let target = match a.kind {
        FileKind::Symlink => Some(c.readlink(path).await?),
        _ => None,
    };
    Ok(Entry {
        rel,
        kind: a.kind,
        mode: a.mode & 0o7777,
        uid: a.uid,
        gid: a.gid,
        mtime: a.mtime,
        size: if a.kind == FileKind::File { a.size } else { 0 },
        link_key: (a.kind == FileKind::File && a.nlink > 1).then_some((0, a.ino)),
        target,
        order: 0,
    })
}

/// Files whose destination differs in size or modification time (or is missing). A
/// cluster destination is asked with one `statv` per directory (and server).
async fn unfinished(dst: &Place, files: Vec<Entry>) -> Vec<Entry> {
    let same = |e: &Entry, size: u64, mtime: Timespec| e.size == size && e.mtime == mtime;
    match dst {
        Place::Local(base) => files
            .into_iter()
            .filter(|e| {
                !std::fs::symlink_metadata(local_at(base, &e.rel))
                    .is_ok_and(|m| m.is_file() && same(e, m.len(), ts(m.mtime(), m.mtime_nsec())))
            })
            .collect(),
        Place::Cluster(c, base) => {
            let mut by_dir: std::collections::BTreeMap<String, Vec<Entry>> = Default::default();
            for e in files {
                let p = cluster_at(base, &e.rel);
                let dir = plusfs_proto::path::split(&p).map_or("/".to_string(), |s| s.0.to_string());
                by_dir.entry(dir).or_default().push(e);
            }
            let mut out = Vec::new();
            for (dir, entries) in by_dir {
                let names: Vec<String> =
                    entries.iter().map(|e| e.rel.rsplit('/').next().unwrap_or_default().to_string()).collect();
                let attrs = c.statv(&dir, &names, Semantics::PerformAll).await.unwrap_or_default();
                for (i, e) in entries.into_iter().enumerate() {
                    let done = attrs.get(i).is_some_and(|a| {
                        a.as_ref().is_ok_and(|a| a.kind == FileKind::File && same(&e, a.size, a.mtime))
                    });
                    if !done {
                        out.push(e);
                    }
                }
            }
            out
        }
    }
}

/// Cuts files into batches of one directory, at most `bytes` and 1000 files each; within
/// a batch, files are in on-disk order.
fn batches(files: Vec<Entry>, bytes: u64) -> Vec<Vec<Entry>> {
    let mut out: Vec<Vec<Entry>> = Vec::new();
    let mut cur: Vec<Entry> = Vec::new();
    let mut size = 0;
    let parent = |e: &Entry| e.rel.rsplit_once('/').map(|p| p.0.to_string()).unwrap_or_default();
    for e in files {
        let new_dir = cur.last().is_some_and(|l| parent(l) != parent(&e));
        if !cur.is_empty() && (new_dir || cur.len() == 1000 || size + e.size > bytes) {
            out.push(std::mem::take(&mut cur));
            size = 0;
        }
        size += e.size;
        cur.push(e);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    for b in &mut out {
        b.sort_by_key(|e| e.order);
    }
    out
}

// ----- phase 2: data, pipelined ---------------------------------------------------------

/// Reads batch n+1 while batch n is written. Returns the number of files that failed.
async fn pipeline(src: &Place, dst: &Place, batches: Vec<Vec<Entry>>, root: bool, progress: &Progress) -> usize {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(Vec<Entry>, Vec<Result<Vec<u8>, String>>)>(1);
    let src = src.clone();
    let reader = tokio::spawn(async move {
        for batch in batches {
            let data = read_batch(&src, &batch).await;
            if tx.send((batch, data)).await.is_err() {
                break;
            }
        }
    });
    let mut failed = 0;
    while let Some((batch, data)) = rx.recv().await {
        let mut ok = Vec::new();
        for (e, d) in batch.into_iter().zip(data) {
            match d {
                Ok(d) => ok.push((e, d)),
                Err(err) => {
                    eprintln!("plusfs: cp: {err}");
                    failed += 1;
                }
            }
        }
        let bytes: u64 = ok.iter().map(|(_, d)| d.len() as u64).sum();
        let n = ok.len();
        failed += write_batch(dst, ok, root).await;
        progress.add(n, bytes);
    }
    if reader.await.is_err() {
        failed += 1;
    }
    failed
}

async fn read_batch(src: &Place, batch: &[Entry]) -> Vec<Result<Vec<u8>, String>> {
    match src {
        Place::Local(root) => {
            let paths: Vec<PathBuf> = batch.iter().map(|e| local_at(root, &e.rel)).collect();
            tokio::task::spawn_blocking(move || {
                paths.iter().map(|p| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()))).collect()
            })
            .await
            .unwrap_or_else(|e| vec![Err(e.to_string()); batch.len()])
        }
        Place::Cluster(c, root) => {
            let paths: Vec<String> = batch.iter().map(|e| cluster_at(root, &e.rel)).collect();
            c.batch_read(&paths, plusfs_client::DEFAULT_READ_BUFFER)
                .await
                .into_iter()
                .map(|r| r.map(|(_, d)| d).map_err(|e| e.to_string()))
                .collect()
        }
    }
}

/// Writes one batch; returns how many files failed.
async fn write_batch(dst: &Place, files: Vec<(Entry, Vec<u8>)>, root: bool) -> usize {
    match dst {
        Place::Cluster(c, base) => {
            let new: Vec<NewFile> = files
                .into_iter()
                .map(|(e, data)| NewFile {
                    path: cluster_at(base, &e.rel),
                    data,
                    mode: e.mode,
                    owner: root.then_some((e.uid, e.gid)),
                    mtime: Some(e.mtime),
                })
                .collect();
            let results = c.batch_write(new).await;
            results.into_iter().filter_map(Result::err).inspect(|e| eprintln!("plusfs: cp: {e}")).count()
        }
        Place::Local(base) => {
            let base = base.clone();
            tokio::task::spawn_blocking(move || {
                // Data of every file first, then their metadata (seed 002 §3.4).
                let mut failed = 0;
                let mut written = Vec::with_capacity(files.len());
                for (e, d) in &files {
                    let p = local_at(&base, &e.rel);
                    match std::fs::write(&p, d) {
                        Ok(()) => written.push((p, e)),
                        Err(err) => {
                            eprintln!("plusfs: cp: {}: {err}", p.display());
                            failed += 1;
                        }
                    }
                }
                for (p, e) in written {
                    if let Err(err) = local_attrs(&p, e, root, false) {
                        eprintln!("plusfs: cp: {}: {err}", p.display());
                        failed += 1;
                    }
                }
                failed
            })
            .await
            .unwrap_or(1)
        }
    }
}

// ----- phase 3: the rest of the metadata --------------------------------------------------

async fn make_dir(p: &Place) -> Result<()> {
    match p {
        Place::Local(p) => match std::fs::create_dir(p) {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && p.is_dir() => Ok(()),
            r => Ok(r?),
        },
        Place::Cluster(c, p) => match c.mkdir(p, 0o755).await {
            Err(e) if e.errno == plusfs_proto::Errno::EEXIST && is_dir(&Place::Cluster(c.clone(), p.clone())).await => {
                Ok(())
            }
            r => r.map(drop).map_err(Into::into),
        },
    }
}

async fn make_symlink(p: &Place, e: &Entry, root: bool) -> Result<()> {
    let target = e.target.as_deref().unwrap_or_default();
    match p {
        Place::Local(p) => {
            let _ = std::fs::remove_file(p);
            std::os::unix::fs::symlink(target, p)?;
            local_attrs(p, e, root, true)?;
            Ok(())
        }
        Place::Cluster(c, p) => {
            let _ = c.unlink(p).await;
            c.symlink(target, p).await?;
            set_attrs(&Place::Cluster(c.clone(), p.clone()), e, root).await
        }
    }
}

async fn make_link(first: &Place, other: &Place) -> Result<()> {
    match (first, other) {
        (Place::Local(a), Place::Local(b)) => {
            let _ = std::fs::remove_file(b);
            Ok(std::fs::hard_link(a, b)?)
        }
        (Place::Cluster(c, a), Place::Cluster(_, b)) => {
            let _ = c.unlink(b).await;
            c.link(a, b).await.map(drop).map_err(Into::into)
        }
        _ => bail!("a hard link across file systems"),
    }
}

async fn set_attrs(p: &Place, e: &Entry, root: bool) -> Result<()> {
    match p {
        Place::Local(p) => Ok(local_attrs(p, e, root, e.kind == FileKind::Symlink)?),
        Place::Cluster(c, p) => {
            let mut set = plusfs_proto::SetAttr {
                mtime: Some(plusfs_proto::TimeSet::At(e.mtime)),
                atime: Some(plusfs_proto::TimeSet::At(e.mtime)),
                ..Default::default()
            };
            if e.kind != FileKind::Symlink {
                set.mode = Some(e.mode);
            }
            if root {
                (set.uid, set.gid) = (Some(e.uid), Some(e.gid));
            }
            c.setattr(p, set).await.map(drop).map_err(Into::into)
        }
    }
}

/// Owner (as root), mode and times of a local path; symlinks themselves, not followed.
fn local_attrs(p: &Path, e: &Entry, root: bool, symlink: bool) -> std::io::Result<()> {
    if root {
        std::os::unix::fs::lchown(p, Some(e.uid), Some(e.gid))?;
    }
    if !symlink {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(e.mode))?;
    }
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).map_err(std::io::Error::other)?;
    let t = libc::timespec { tv_sec: e.mtime.sec, tv_nsec: e.mtime.nsec as i64 };
    let times = [t, t];
    // SAFETY: a valid C string and two timespecs, as utimensat wants.
    if unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

// ----- verify and progress ----------------------------------------------------------------

/// Compares every copied file's checksum; returns the number of differences.
async fn verify(src: &Place, dst: &Place, entries: &[Entry]) -> Result<usize> {
    let files: Vec<Entry> = entries.iter().filter(|e| e.kind == FileKind::File).cloned().collect();
    let mut bad = 0;
    for batch in batches(files, 64 << 20) {
        let (a, b) = tokio::join!(read_batch(src, &batch), read_batch(dst, &batch));
        for ((e, x), y) in batch.iter().zip(a).zip(b) {
            let same =
                matches!((&x, &y), (Ok(x), Ok(y)) if xxhash_rust::xxh3::xxh3_64(x) == xxhash_rust::xxh3::xxh3_64(y));
            if !same {
                eprintln!("plusfs: cp: verify: {} differs", dst.join(&e.rel).show());
                bad += 1;
            }
        }
    }
    eprintln!(
        "plusfs: cp: verify: {} files compared, {bad} differ",
        entries.iter().filter(|e| e.kind == FileKind::File).count()
    );
    Ok(bad)
}

/// A progress line on standard error (files/s and MiB/s), redrawn at most twice a second.
struct Progress {
    total_files: usize,
    total_bytes: u64,
    quiet: bool,
    started: Instant,
    state: std::sync::Mutex<(usize, u64, Instant)>,
}

impl Progress {
    fn new(total_files: usize, total_bytes: u64, quiet: bool) -> Progress {
        let now = Instant::now();
        Progress { total_files, total_bytes, quiet, started: now, state: std::sync::Mutex::new((0, 0, now)) }
    }

    fn add(&self, files: usize, bytes: u64) {
        let mut s = self.state.lock().expect("progress");
        s.0 += files;
        s.1 += bytes;
        if !self.quiet && s.2.elapsed().as_millis() >= 500 {
            s.2 = Instant::now();
            let secs = self.started.elapsed().as_secs_f64().max(1e-6);
            eprint!(
                "\r{}/{} files, {:.1}/{:.1} MiB, {:.0} files/s, {:.1} MiB/s   ",
                s.0,
                self.total_files,
                s.1 as f64 / 1048576.0,
                self.total_bytes as f64 / 1048576.0,
                s.0 as f64 / secs,
                s.1 as f64 / 1048576.0 / secs
            );
        }
    }

    fn finish(&self) {
        if !self.quiet && self.started.elapsed().as_millis() >= 500 {
            eprintln!();
        }
    }
}
