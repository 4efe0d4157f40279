//! File commands: mkdir, touch, stat, ls, rm, rmdir, mv, ln -s, readlink, chmod.
//! Messages and exit codes follow coreutils: `plusfs: cannot remove '/x': No such file or
//! directory`, exit status 1 if any operand failed.

use clap::Args;
use plusfs_client::{Client, FsError};
use plusfs_proto::{Attr, Errno, FileKind, Timespec};
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
    /// Make a symbolic link (the only kind plusfs links today).
    #[arg(short, long, required = true)]
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

fn parse_mode(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s, 8).ok().filter(|m| *m <= 0o7777).ok_or_else(|| format!("invalid mode '{s}'"))
}

/// Prints `plusfs: <error>` and remembers the failure.
fn report(failed: &mut bool, e: FsError) {
    eprintln!("plusfs: {e}");
    *failed = true;
}

fn exit(failed: bool) -> ExitCode {
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

pub async fn mkdir(c: &Client, a: MkdirArgs) -> ExitCode {
    let mut failed = false;
    for p in &a.paths {
        let r = if a.parents { c.mkdir_all(p, a.mode).await } else { c.mkdir(p, a.mode).await };
        if let Err(e) = r {
            report(&mut failed, e);
        }
    }
    exit(failed)
}

pub async fn touch(c: &Client, a: PathsArgs) -> ExitCode {
    let mut failed = false;
    for p in &a.paths {
        let r = match c.create(p, 0o644, false).await {
            Ok(fh) => c.close(&fh).await,
            Err(e) if e.errno == Errno::EISDIR => Ok(()),
            Err(e) => Err(FsError { op: "touch", ..e }),
        };
        if let Err(e) = r {
            report(&mut failed, e);
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
    }
}

/// `drwxr-xr-x` style mode string.
pub fn mode_string(kind: FileKind, mode: u32) -> String {
    let t = match kind {
        FileKind::File => '-',
        FileKind::Dir => 'd',
        FileKind::Symlink => 'l',
        FileKind::Fifo => 'p',
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
    for p in &a.paths {
        let r = if a.dereference { c.stat(p).await } else { c.lstat(p).await };
        match r {
            Ok(at) => print_stat(c, p, &at),
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
                for e in entries {
                    let full = plusfs_proto::path::join(&plusfs_proto::path::normalize(p).unwrap_or_default(), &e.name);
                    if a.long {
                        match c.lstat(&full).await {
                            Ok(at) => {
                                let target =
                                    if at.kind == FileKind::Symlink { c.readlink(&full).await.ok() } else { None };
                                print_entry(&a, &e.name, &at, target)
                            }
                            // Removed between readdir and stat: skip it, like ls does.
                            Err(err) if err.errno == Errno::ENOENT => {}
                            Err(err) => report(&mut failed, err),
                        }
                    } else {
                        println!("{}", e.name);
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
    for p in &a.paths {
        let r = match c.lstat(p).await {
            Ok(at) if at.kind == FileKind::Dir && !a.recursive => Err(FsError::new("remove", p.clone(), Errno::EISDIR)),
            Ok(at) if at.kind == FileKind::Dir => remove_tree(c, p).await,
            Ok(_) => c.unlink(p).await,
            Err(e) if a.force && e.errno == Errno::ENOENT => Ok(()),
            Err(e) => Err(FsError { op: "remove", ..e }),
        };
        if let Err(e) = r {
            report(&mut failed, e);
        }
    }
    exit(failed)
}

async fn remove_tree(c: &Client, p: &str) -> Result<(), FsError> {
    let base = plusfs_proto::path::normalize(p).map_err(|e| FsError::new("remove", p, e.errno))?;
    for e in c.readdir(&base).await? {
        let child = plusfs_proto::path::join(&base, &e.name);
        if e.kind == FileKind::Dir {
            Box::pin(remove_tree(c, &child)).await?;
        } else {
            c.unlink(&child).await?;
        }
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
    debug_assert!(a.symbolic);
    match c.symlink(&a.target, &a.link).await {
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
