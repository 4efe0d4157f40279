//! File commands: mkdir, touch, stat, ls, rm, rmdir, mv, ln -s, readlink, chmod, chown,
//! chgrp.
//! Messages and exit codes follow coreutils: `plusfs: cannot remove '/x': No such file or
//! directory`, exit status 1 if any operand failed.

use clap::Args;
use plusfs_client::{Client, FsError};
use plusfs_proto::{Attr, DistReport, Errno, FileKind, Semantics, Threshold, Timespec};
use std::process::ExitCode;

#[derive(Args)]
pub struct PathsArgs {
    #[arg(required = true)]
    paths: Vec<String>,
}

#[derive(Args)]
pub struct StatArgs {
    /// Follow symbolic links.
    #[arg(short = 'L', long)]
    dereference: bool,
    #[arg(required = true)]
    paths: Vec<String>,
}

#[derive(Args)]
pub struct MkdirArgs {
    /// Make parent directories as needed; no error if existing.
    #[arg(short, long)]
    parents: bool,
    /// Permission bits, octal.
    #[arg(short, long, default_value = "755", value_parser = parse_mode)]
    mode: u32,
    /// Huge-directory threshold of the new directories: entries above which they are
    /// spread over several servers, 0 (from creation), `never`, or `cluster` (default).
    #[arg(long, value_parser = Threshold::parse)]
    threshold: Option<Threshold>,
    /// Storing servers when distributed (0: the cluster's setting).
    #[arg(long, default_value_t = 0)]
    width: u32,
    #[arg(required = true)]
    paths: Vec<String>,
}

#[derive(Args)]
pub struct HugedirArgs {
    /// New threshold: a number of entries, 0 (distribute now), `never` or `cluster`.
    #[arg(long, value_parser = Threshold::parse)]
    threshold: Option<Threshold>,
    /// New number of storing servers (only before the directory is distributed).
    #[arg(long)]
    width: Option<u32>,
    #[arg(required = true)]
    paths: Vec<String>,
}

#[derive(Args)]
pub struct LsArgs {
    /// Long listing.
    #[arg(short = 'l')]
    long: bool,
    /// Show `.` and `..` too.
    #[arg(short = 'a')]
    all: bool,
    #[arg(default_value = "/")]
    paths: Vec<String>,
}

#[derive(Args)]
pub struct RmArgs {
    /// Remove directories and their contents.
    #[arg(short, long)]
    recursive: bool,
    /// Ignore missing operands.
    #[arg(short, long)]
    force: bool,
    #[arg(required = true)]
    paths: Vec<String>,
}

#[derive(Args)]
pub struct MvArgs {
    src: String,
    dst: String,
}

#[derive(Args)]
pub struct LnArgs {
    /// Make a symbolic link (default: a hard link to the file TARGET).
    #[arg(short, long)]
    symbolic: bool,
    target: String,
    link: String,
}

#[derive(Args)]
pub struct ChmodArgs {
    #[arg(value_parser = parse_mode)]
    mode: u32,
    #[arg(required = true)]
    paths: Vec<String>,
}

#[derive(Args)]
pub struct ChownArgs {
    /// `OWNER`, `OWNER:GROUP` or `:GROUP`: numbers, or names of this machine's
    /// `/etc/passwd` and `/etc/group`.
    owner: String,
    #[arg(required = true)]
    paths: Vec<String>,
}

#[derive(Args)]
pub struct ChgrpArgs {
    /// A group number or a name of this machine's `/etc/group`.
    group: String,
    #[arg(required = true)]
    paths: Vec<String>,
}

/// The id `name` stands for: a number, or the third field of its line in `table`
/// (`/etc/passwd` or `/etc/group`).
fn parse_id(name: &str, table: &str) -> Result<u32, String> {
    if let Ok(n) = name.parse() {
        return Ok(n);
    }
    let text = std::fs::read_to_string(table).map_err(|e| format!("cannot read {table}: {e}"))?;
    text.lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.first() == Some(&name))
        .and_then(|f| f.get(2).and_then(|id| id.parse().ok()))
        .ok_or_else(|| format!("'{name}' is not a number and not in {table}"))
}

/// `OWNER[:GROUP]` or `:GROUP` as (uid, gid).
fn parse_owner(spec: &str) -> Result<(Option<u32>, Option<u32>), String> {
    let (user, group) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    let uid = (!user.is_empty()).then(|| parse_id(user, "/etc/passwd")).transpose()?;
    let gid = group.filter(|g| !g.is_empty()).map(|g| parse_id(g, "/etc/group")).transpose()?;
    if uid.is_none() && gid.is_none() {
        return Err(format!("invalid owner '{spec}' (expected OWNER, OWNER:GROUP or :GROUP)"));
    }
    Ok((uid, gid))
}

pub fn parse_mode(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s, 8).ok().filter(|m| *m <= 0o7777).ok_or_else(|| format!("invalid mode '{s}'"))
}

/// Prints `plusfs: <error>` and remembers the failure.
pub(crate) fn report(failed: &mut bool, e: FsError) {
    eprintln!("plusfs: {e}");
    *failed = true;
}

pub(crate) fn exit(failed: bool) -> ExitCode {
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

pub async fn mkdir(c: &Client, a: MkdirArgs) -> ExitCode {
    let mut failed = false;
    let threshold = a.threshold.unwrap_or(Threshold::Cluster);
    for p in &a.paths {
        let r = if a.parents {
            match c.mkdir_all(p, a.mode).await {
                Ok(_) if a.threshold.is_some() || a.width != 0 => {
                    c.set_policy(p, a.threshold, Some(a.width).filter(|w| *w != 0)).await.map(drop)
                }
                r => r.map(drop),
            }
        } else {
            c.mkdir_with(p, a.mode, threshold, a.width).await.map(drop)
        };
        if let Err(e) = r {
            report(&mut failed, e);
        }
    }
    exit(failed)
}

/// `plusfs hugedir`: shows (and with options changes) the distribution of directories.
pub async fn hugedir(c: &Client, a: HugedirArgs) -> ExitCode {
    let mut failed = false;
    for p in &a.paths {
        let r = if a.threshold.is_some() || a.width.is_some() {
            c.set_policy(p, a.threshold, a.width).await
        } else {
            c.distribution(p).await
        };
        match r {
            Ok(d) => print_distribution(&d),
            Err(e) => report(&mut failed, e),
        }
    }
    exit(failed)
}

/// Prints a directory's distribution, one line per storing server.
pub fn print_distribution(d: &DistReport) {
    println!("{}: {} (threshold {}, effective {})", d.path, d.state, d.threshold, d.effective);
    if !d.set.is_empty() {
        println!("  storing set: {:?}", d.set);
    }
    let total: u64 = d.entries.iter().map(|e| e.1).sum();
    for (s, n) in &d.entries {
        println!("  server {s}: {n} entries");
    }
    if d.entries.len() > 1 {
        let mean = total as f64 / d.entries.len() as f64;
        let worst = d.entries.iter().map(|e| (e.1 as f64 - mean).abs()).fold(0.0, f64::max);
        println!(
            "  total {total}; largest deviation from the mean {:.2} %",
            if mean > 0.0 { 100.0 * worst / mean } else { 0.0 }
        );
    }
}

/// Operands grouped by parent directory, in first-seen order: (directory, [(operand
/// index, name)]). Operands that are `/` or do not normalise go to `single`.
struct Groups {
    dirs: Vec<(String, Vec<(usize, String)>)>,
    single: Vec<usize>,
}

fn group_by_parent(paths: &[String]) -> Groups {
    let mut g = Groups { dirs: Vec::new(), single: Vec::new() };
    for (i, raw) in paths.iter().enumerate() {
        let last = plusfs_proto::path::raw_last_component(raw);
        match plusfs_proto::path::normalize(raw) {
            Ok(p) if p != "/" && last != "." && last != ".." => {
                let (dir, name) = plusfs_proto::path::split(&p).expect("not root");
                match g.dirs.iter_mut().find(|(d, _)| d == dir) {
                    Some((_, v)) => v.push((i, name.to_string())),
                    None => g.dirs.push((dir.to_string(), vec![(i, name.to_string())])),
                }
            }
            _ => g.single.push(i),
        }
    }
    g
}

/// Runs one batch per parent directory; returns one result per operand, in order.
async fn per_operand<T: Clone, F, Fut>(paths: &[String], op: &'static str, batch: F) -> Vec<Result<T, FsError>>
where
    F: Fn(String, Vec<String>) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<Result<T, Errno>>, FsError>>,
{
    let groups = group_by_parent(paths);
    let mut out: Vec<Option<Result<T, FsError>>> = vec![None; paths.len()];
    for (dir, items) in groups.dirs {
        let names: Vec<String> = items.iter().map(|(_, n)| n.clone()).collect();
        match batch(dir, names).await {
            Ok(results) => {
                for ((i, _), r) in items.iter().zip(results) {
                    out[*i] = Some(r.map_err(|e| FsError::new(op, paths[*i].clone(), e)));
                }
            }
            Err(e) => {
                for (i, _) in &items {
                    out[*i] = Some(Err(FsError { op, path: paths[*i].clone(), ..e.clone() }));
                }
            }
        }
    }
    for i in groups.single {
        let errno = match plusfs_proto::path::normalize(&paths[i]) {
            Ok(p) if p == "/" => Errno::EISDIR,
            Ok(_) => Errno::EINVAL,
            Err(e) => e.errno,
        };
        out[i] = Some(Err(FsError::new(op, paths[i].clone(), errno)));
    }
    out.into_iter().map(|r| r.expect("every operand has a result")).collect()
}

pub async fn touch(c: &Client, a: PathsArgs) -> ExitCode {
    let mut failed = false;
    let flags = plusfs_client::OpenFlags { create: true, ..Default::default() };
    let results = per_operand(&a.paths, "touch", |dir, names| async move {
        c.openv(&dir, &names, flags, 0o644, Semantics::PerformAll).await
    })
    .await;
    let mut fds = Vec::new();
    for r in results {
        match r {
            Ok(fd) => fds.push(fd),
            Err(e) if e.errno == Errno::EISDIR => {}
            Err(e) => report(&mut failed, e),
        }
    }
    for (fd, r) in fds.iter().zip(c.closev(&fds, Semantics::PerformAll).await) {
        if let Err(e) = r {
            report(&mut failed, FsError::new("close", format!("descriptor {fd}"), e));
        }
    }
    exit(failed)
}

fn kind_name(k: FileKind) -> &'static str {
    match k {
        FileKind::File => "regular file",
        FileKind::Dir => "directory",
        FileKind::Symlink => "symbolic link",
        FileKind::Fifo => "fifo",
        FileKind::BlockDev => "block special file",
        FileKind::CharDev => "character special file",
        FileKind::Socket => "socket",
    }
}

/// `drwxr-xr-x` style mode string.
pub fn mode_string(kind: FileKind, mode: u32) -> String {
    let t = match kind {
        FileKind::File => '-',
        FileKind::Dir => 'd',
        FileKind::Symlink => 'l',
        FileKind::Fifo => 'p',
        FileKind::BlockDev => 'b',
        FileKind::CharDev => 'c',
        FileKind::Socket => 's',
    };
    let mut s = String::from(t);
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

fn time(t: Timespec) -> String {
    let st = std::time::UNIX_EPOCH + std::time::Duration::new(t.sec.max(0) as u64, t.nsec);
    humantime::format_rfc3339_nanos(st).to_string()
}

pub async fn stat(c: &Client, a: StatArgs) -> ExitCode {
    let mut failed = false;
    let results: Vec<Result<Attr, FsError>> =
        if a.dereference {
            let mut v = Vec::new();
            for p in &a.paths {
                v.push(c.stat(p).await);
            }
            v
        } else {
            let mut v = per_operand(&a.paths, "stat", |dir, names| async move {
                c.statv(&dir, &names, Semantics::PerformAll).await
            })
            .await;
            for (i, p) in a.paths.iter().enumerate() {
                if plusfs_proto::path::normalize(p).is_ok_and(|n| n == "/") {
                    v[i] = c.lstat(p).await;
                }
            }
            v
        };
    for (p, r) in a.paths.iter().zip(results) {
        match r {
            Ok(at) => {
                print_stat(c, p, &at);
                if at.kind == FileKind::Dir {
                    match c.distribution(p).await {
                        Ok(d) => print_distribution(&d),
                        Err(e) => report(&mut failed, e),
                    }
                }
            }
            Err(e) => report(&mut failed, e),
        }
    }
    exit(failed)
}

fn print_stat(c: &Client, p: &str, a: &Attr) {
    println!("  File: {p}");
    println!("  Size: {:<12} Type: {}", a.size, kind_name(a.kind));
    println!(" Inode: {:<12} Links: {}", a.ino, a.nlink);
    println!("Access: ({:04o}/{})  Uid: {}  Gid: {}", a.mode, mode_string(a.kind, a.mode), a.uid, a.gid);
    println!("Access: {}", time(a.atime));
    println!("Modify: {}", time(a.mtime));
    println!("Change: {}", time(a.ctime));
    if a.kind == FileKind::Dir {
        let norm = plusfs_proto::path::normalize(p).unwrap_or_else(|_| p.to_string());
        println!("Object: server {} (incarnation {})", c.home(&norm), a.incarnation);
    }
}

pub async fn ls(c: &Client, a: LsArgs) -> ExitCode {
    let mut failed = false;
    let many = a.paths.len() > 1;
    for p in &a.paths {
        let attr = match c.lstat(p).await {
            Ok(at) => at,
            Err(e) => {
                report(&mut failed, FsError { op: "access", ..e });
                continue;
            }
        };
        if attr.kind != FileKind::Dir {
            print_entry(&a, p, &attr, None);
            continue;
        }
        if many {
            println!("{p}:");
        }
        match c.readdir(p).await {
            Ok(entries) => {
                if a.all {
                    print_entry(&a, ".", &attr, None);
                    let parent = plusfs_proto::path::normalize(&format!("{p}/..")).unwrap_or_else(|_| "/".into());
                    match c.lstat(&parent).await {
                        Ok(pa) => print_entry(&a, "..", &pa, None),
                        Err(e) => report(&mut failed, e),
                    }
                }
                if !a.long {
                    entries.iter().for_each(|e| println!("{}", e.name));
                    continue;
                }
                // ls -l: one statv per directory instead of one stat per entry.
                let dir = plusfs_proto::path::normalize(p).unwrap_or_default();
                let names: Vec<String> = entries.into_iter().map(|e| e.name).collect();
                let attrs = match c.statv(&dir, &names, Semantics::PerformAll).await {
                    Ok(v) => v,
                    Err(e) => {
                        report(&mut failed, e);
                        continue;
                    }
                };
                for (name, r) in names.iter().zip(attrs) {
                    let full = plusfs_proto::path::join(&dir, name);
                    match r {
                        Ok(at) => {
                            let target = if at.kind == FileKind::Symlink { c.readlink(&full).await.ok() } else { None };
                            print_entry(&a, name, &at, target)
                        }
                        // Removed between readdir and stat: skip it, like ls does.
                        Err(Errno::ENOENT) => {}
                        Err(e) => report(&mut failed, FsError::new("stat", full, e)),
                    }
                }
            }
            Err(e) => report(&mut failed, FsError { op: "open directory", ..e }),
        }
    }
    exit(failed)
}

fn print_entry(a: &LsArgs, name: &str, at: &Attr, target: Option<String>) {
    if !a.long {
        println!("{name}");
        return;
    }
    let link = target.map(|t| format!(" -> {t}")).unwrap_or_default();
    let mtime = time(at.mtime);
    println!(
        "{} {:>3} {:>5} {:>5} {:>10} {} {}{}",
        mode_string(at.kind, at.mode),
        at.nlink,
        at.uid,
        at.gid,
        at.size,
        &mtime[..19.min(mtime.len())],
        name,
        link
    );
}

pub async fn rm(c: &Client, a: RmArgs) -> ExitCode {
    let mut failed = false;
    let kinds =
        per_operand(&a.paths, "remove", |dir, names| async move { c.statv(&dir, &names, Semantics::PerformAll).await })
            .await;
    let mut files = Vec::new();
    for (p, k) in a.paths.iter().zip(kinds) {
        let r = match k {
            Ok(at) if at.kind == FileKind::Dir && !a.recursive => Err(FsError::new("remove", p.clone(), Errno::EISDIR)),
            Ok(at) if at.kind == FileKind::Dir => remove_tree(c, p).await,
            Ok(_) => {
                files.push(p.clone());
                Ok(())
            }
            Err(e) if a.force && e.errno == Errno::ENOENT => Ok(()),
            Err(e) => Err(e),
        };
        if let Err(e) = r {
            report(&mut failed, e);
        }
    }
    let removed =
        per_operand(&files, "remove", |dir, names| async move { c.unlinkv(&dir, &names, Semantics::PerformAll).await })
            .await;
    for r in removed {
        match r {
            Err(e) if a.force && e.errno == Errno::ENOENT => {}
            Err(e) => report(&mut failed, e),
            Ok(()) => {}
        }
    }
    exit(failed)
}

/// Removes a tree: per directory one listing, one `unlinkv` for its files, then its
/// subdirectories, then the directory itself.
async fn remove_tree(c: &Client, p: &str) -> Result<(), FsError> {
    let base = plusfs_proto::path::normalize(p).map_err(|e| FsError::new("remove", p, e.errno))?;
    let entries = c.readdir(&base).await?;
    let files: Vec<String> = entries.iter().filter(|e| e.kind != FileKind::Dir).map(|e| e.name.clone()).collect();
    for (name, r) in files.iter().zip(c.unlinkv(&base, &files, Semantics::PerformAll).await?) {
        r.map_err(|e| FsError::new("remove", plusfs_proto::path::join(&base, name), e))?;
    }
    for e in entries.iter().filter(|e| e.kind == FileKind::Dir) {
        Box::pin(remove_tree(c, &plusfs_proto::path::join(&base, &e.name))).await?;
    }
    c.rmdir(&base).await
}

pub async fn rmdir(c: &Client, a: PathsArgs) -> ExitCode {
    let mut failed = false;
    for p in &a.paths {
        if let Err(e) = c.rmdir(p).await {
            report(&mut failed, e);
        }
    }
    exit(failed)
}

pub async fn mv(c: &Client, a: MvArgs) -> ExitCode {
    match c.rename(&a.src, &a.dst).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("plusfs: cannot move '{}' to '{}': {}", a.src, a.dst, e.errno);
            ExitCode::FAILURE
        }
    }
}

pub async fn ln(c: &Client, a: LnArgs) -> ExitCode {
    let made = match a.symbolic {
        true => c.symlink(&a.target, &a.link).await,
        false => c.link(&a.target, &a.link).await,
    };
    match made {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("plusfs: {e}");
            ExitCode::FAILURE
        }
    }
}

pub async fn readlink(c: &Client, a: PathsArgs) -> ExitCode {
    let mut failed = false;
    for p in &a.paths {
        match c.readlink(p).await {
            Ok(t) => println!("{t}"),
            Err(e) => report(&mut failed, e),
        }
    }
    exit(failed)
}

pub async fn chmod(c: &Client, a: ChmodArgs) -> ExitCode {
    let mut failed = false;
    for p in &a.paths {
        if let Err(e) = c.chmod(p, a.mode).await {
            report(&mut failed, FsError { op: "change permissions of", ..e });
        }
    }
    exit(failed)
}

/// `plusfs chown`: the servers allow root to give files away and an owner to change the
/// group to one of its groups (`EPERM` otherwise); set-id bits of a file are cleared.
pub async fn chown(c: &Client, a: ChownArgs) -> ExitCode {
    match parse_owner(&a.owner) {
        Ok((uid, gid)) => set_owner(c, &a.paths, uid, gid).await,
        Err(e) => {
            eprintln!("plusfs: chown: {e}");
            ExitCode::from(2)
        }
    }
}

/// `plusfs chgrp`: as `chown :GROUP`.
pub async fn chgrp(c: &Client, a: ChgrpArgs) -> ExitCode {
    match parse_id(&a.group, "/etc/group") {
        Ok(gid) => set_owner(c, &a.paths, None, Some(gid)).await,
        Err(e) => {
            eprintln!("plusfs: chgrp: {e}");
            ExitCode::from(2)
        }
    }
}

async fn set_owner(c: &Client, paths: &[String], uid: Option<u32>, gid: Option<u32>) -> ExitCode {
    let mut failed = false;
    for p in paths {
        if let Err(e) = c.chown(p, uid, gid).await {
            report(&mut failed, FsError { op: "change the owner of", ..e });
        }
    }
    exit(failed)
}

#[cfg(test)]
mod owner_tests {
    use super::parse_owner;

    #[test]
    fn owners_parse() {
        assert_eq!(parse_owner("1000"), Ok((Some(1000), None)));
        assert_eq!(parse_owner("1000:50"), Ok((Some(1000), Some(50))));
        assert_eq!(parse_owner(":50"), Ok((None, Some(50))));
        assert_eq!(parse_owner("root:root"), Ok((Some(0), Some(0))));
        assert!(parse_owner(":").is_err());
        assert!(parse_owner("no-such-user-here").is_err());
    }
}
