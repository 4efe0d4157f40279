//! `plusfs mount` and `plusfs umount`.

use anyhow::{bail, Context, Result};
use clap::Args;
use plusfs_client::{Client, ClientOptions};
use plusfs_fuse::{MountSettings, UringMode};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct MountArgs {
    /// Directory to mount the cluster on.
    mountpoint: PathBuf,
    /// Stay in the foreground (otherwise return once the mount is ready).
    #[arg(short, long)]
    foreground: bool,
    /// Print the counters of the mount at MOUNTPOINT (FUSE requests per operation and the
    /// server requests they sent) instead of mounting.
    #[arg(long)]
    stats: bool,
    /// Write back the delegated work of the mount at MOUNTPOINT and return once it is on
    /// the servers (what `sync` does for a local file system; the kernel does not pass
    /// `sync(2)` to FUSE file systems) instead of mounting.
    #[arg(long)]
    sync: bool,
    /// Mount options: `allow_other`, `ttl=SECONDS` (attribute and name cache, default 1),
    /// `noreaddirplus` (list directories without attributes; `ls -l` then looks up each
    /// entry), `noparallel_dirops` (one directory operation per directory at a time),
    /// `writeback_cache` (the kernel caches writes; see docs/semantics.md),
    /// `nodefault_permissions` (only the servers check permissions, as they always do; the
    /// kernel then skips its checks and the attribute reads before them, but FIFOs and
    /// device nodes open without a check),
    /// `nodeleg` (no directory delegations: every change goes to the servers at once),
    /// `max_background=N` (requests in flight, default 64), `workers=N` (threads serving
    /// requests, default 2), `readers=N` (threads reading `/dev/fuse`, each on a clone of
    /// the device, default 2), `readahead=KIB` (the kernel's read-ahead, default 8192; 0
    /// keeps the kernel's 128 KiB), `metrics=HOST:PORT` (serve Prometheus histograms of
    /// the FUSE operations there), `uring` (take the kernel's requests over io_uring queues,
    /// one per CPU, or fail; by default they are used when the kernel offers them: as root,
    /// `echo Y > /sys/module/fuse/parameters/enable_uring`), `nouring` (only `/dev/fuse`),
    /// `uring_depth=N` (requests each queue holds, default 32), `noxattr` (no extended
    /// attributes: `EOPNOTSUPP`; the kernel then skips its `security.capability` request
    /// before each write), `noacl` (no POSIX ACLs: the kernel checks mode bits only and
    /// applies the umask itself), `deleg_ttl=SECONDS` (how long the kernel keeps the names and
    /// file attributes of a directory the mount holds a delegation of, default 60; they
    /// are invalidated when the delegation ends; 0 keeps `ttl`).
    #[arg(short = 'o', value_delimiter = ',')]
    options: Vec<String>,
}

#[derive(Args)]
pub struct UmountArgs {
    mountpoint: PathBuf,
}

fn settings(options: &[String]) -> Result<MountSettings> {
    let mut s = MountSettings::default();
    for o in options {
        match o.split_once('=') {
            None if o == "allow_other" => s.allow_other = true,
            None if o == "noreaddirplus" => s.readdirplus = false,
            None if o == "noparallel_dirops" => s.parallel_dirops = false,
            None if o == "writeback_cache" => s.writeback_cache = true,
            None if o == "default_permissions" => s.default_permissions = true,
            None if o == "nodefault_permissions" => s.default_permissions = false,
            None if o == "nodeleg" => s.delegations = false,
            None if o == "deleg" => s.delegations = true,
            None if o == "uring" => s.uring = UringMode::Required,
            None if o == "nouring" => s.uring = UringMode::Off,
            None if o == "noxattr" => s.xattrs = false,
            None if o == "xattr" => s.xattrs = true,
            None if o == "noacl" => s.acl = false,
            None if o == "acl" => s.acl = true,
            Some(("uring_depth", v)) => {
                s.uring_depth =
                    v.parse().ok().filter(|n| (1..=1024).contains(n)).context("uring_depth must be 1 to 1024")?
            }
            Some(("max_background", v)) => {
                s.max_background = v.parse().ok().filter(|n| *n > 0).context("max_background must be 1 to 65535")?
            }
            Some(("readahead", v)) => {
                s.readahead_kib =
                    v.parse().ok().filter(|n| *n <= 1 << 20).context("readahead must be 0 to 1048576 KiB")?
            }
            Some(("workers", v)) => {
                s.workers = v.parse().ok().filter(|n| (1..=64).contains(n)).context("workers must be 1 to 64")?
            }
            Some(("readers", v)) => {
                s.readers = v.parse().ok().filter(|n| (1..=16).contains(n)).context("readers must be 1 to 16")?
            }
            // Where a mount in the background logs (read by `mount` itself, below).
            Some(("log", v)) if !v.is_empty() => {}
            Some(("metrics", v)) => {
                v.parse::<std::net::SocketAddr>().with_context(|| format!("metrics={v}: expected HOST:PORT"))?;
                s.metrics = Some(v.to_string());
            }
            Some(("deleg_ttl", v)) => {
                let secs: f64 = v.parse().with_context(|| format!("deleg_ttl '{v}' is not a number of seconds"))?;
                if !(0.0..=86400.0).contains(&secs) {
                    bail!("deleg_ttl must be between 0 and 86400 seconds");
                }
                s.deleg_ttl = Duration::from_secs_f64(secs);
            }
            Some(("ttl", v)) => {
                let secs: f64 = v.parse().with_context(|| format!("ttl '{v}' is not a number of seconds"))?;
                if !(0.0..=3600.0).contains(&secs) {
                    bail!("ttl must be between 0 and 3600 seconds");
                }
                s.ttl = Duration::from_secs_f64(secs);
            }
            _ => bail!(
                "unknown mount option '{o}' (known: allow_other, ttl=SECONDS, noreaddirplus, noparallel_dirops, \
                 writeback_cache, nodefault_permissions, nodeleg, max_background=N, workers=N, readers=N, \
                 readahead=KIB, metrics=HOST:PORT, log=FILE, uring, nouring, uring_depth=N, noxattr, noacl, deleg_ttl=SECONDS)"
            ),
        }
    }
    Ok(s)
}

/// True when `mountpoint` is a plusfs mount now.
fn mounted(mountpoint: &Path) -> bool {
    let target = mountpoint.canonicalize().unwrap_or_else(|_| mountpoint.to_path_buf());
    std::fs::read_to_string("/proc/mounts")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(1) == Some(target.to_string_lossy().as_ref()) && l.contains("plusfs"))
}

/// `plusfs mount --stats MOUNTPOINT`: prints the mount's control file.
fn print_stats(mountpoint: &Path) -> Result<ExitCode> {
    if !mounted(mountpoint) {
        bail!("{} is not a plusfs mount", mountpoint.display());
    }
    let file = mountpoint.join(plusfs_fuse::core::STATS_FILE);
    let text = std::fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))?;
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}

/// `plusfs mount --sync MOUNTPOINT`: `fsync` of the mount's root directory, which writes
/// back every delegated directory's queued work.
fn sync_mount(mountpoint: &Path) -> Result<ExitCode> {
    if !mounted(mountpoint) {
        bail!("{} is not a plusfs mount", mountpoint.display());
    }
    let dir = std::fs::File::open(mountpoint).with_context(|| format!("cannot open {}", mountpoint.display()))?;
    dir.sync_all().with_context(|| format!("cannot sync {}", mountpoint.display()))?;
    Ok(ExitCode::SUCCESS)
}

/// Set for a mount process started in the background without a log (`quiet_when_up`).
const QUIET_WHEN_UP: &str = "PLUSFS_MOUNT_QUIET_WHEN_UP";

pub fn mount(a: MountArgs, cluster: Option<PathBuf>) -> Result<ExitCode> {
    if a.stats {
        return print_stats(&a.mountpoint);
    }
    if a.sync {
        return sync_mount(&a.mountpoint);
    }
    let mut s = settings(&a.options)?;
    s.quiet_when_up = a.foreground && std::env::var_os(QUIET_WHEN_UP).is_some();
    if !a.mountpoint.is_dir() {
        bail!("mount point {} is not a directory", a.mountpoint.display());
    }
    if !Path::new("/dev/fuse").exists() {
        bail!("/dev/fuse is missing: this machine cannot mount FUSE file systems");
    }
    let map = crate::load_map(cluster.as_ref())?;
    if !a.foreground {
        // Serve from a child in its own session; return when the mount is up.
        let exe = std::env::current_exe()?;
        let mut cmd = Command::new(exe);
        if let Some(c) = &cluster {
            cmd.arg("--cluster").arg(c);
        }
        cmd.arg("mount").arg("-f").arg(&a.mountpoint);
        // Without a log, the child's start-up errors come to this process through a pipe;
        // the child points its standard error elsewhere once it is up.
        if !a.options.iter().any(|o| o.starts_with("log=")) {
            cmd.env(QUIET_WHEN_UP, "1");
        }
        if !a.options.is_empty() {
            cmd.arg("-o").arg(a.options.join(","));
        }
        use std::os::unix::process::CommandExt;
        // Its log goes to `-o log=FILE` (appended), else nowhere: run `-f` in a terminal
        // to see it.
        let log_path = a.options.iter().find_map(|o| o.strip_prefix("log="));
        let log = match log_path {
            Some(path) => Stdio::from(private_append(Path::new(path))?),
            // Kept until the mount is up, to report why it failed.
            None => Stdio::piped(),
        };
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(log).process_group(0);
        let mut child = cmd.spawn().context("cannot start the mount process")?;
        let early_errors = child.stderr.take().map(|mut err| {
            std::thread::spawn(move || {
                let mut text = String::new();
                let _ = std::io::Read::read_to_string(&mut err, &mut text);
                text
            })
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        // Up: mounted, and its transport decided (the control file names it).
        while !mounted(&a.mountpoint) || !transport_decided(&a.mountpoint, deadline) {
            if let Some(status) = child.try_wait()? {
                let why = match (early_errors, log_path) {
                    (Some(reader), _) => reader.join().unwrap_or_default(),
                    (None, Some(path)) => last_lines(Path::new(path), 5),
                    (None, None) => String::new(),
                };
                bail!("the mount process exited ({status}): {}", why.trim());
            }
            if Instant::now() > deadline {
                bail!("{} was not mounted within 20 s", a.mountpoint.display());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        println!("plusfs mounted on {} (process {})", a.mountpoint.display(), child.id());
        return Ok(ExitCode::SUCCESS);
    }
    let client = {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let _g = rt.enter();
        let opts =
            ClientOptions { retries: 5, delegations: s.delegations, map_file: cluster.clone(), ..Default::default() };
        Client::new(map, opts)
    };
    plusfs_fuse::mount(client, &a.mountpoint, &s)
        .with_context(|| format!("cannot mount on {}", a.mountpoint.display()))?;
    Ok(ExitCode::SUCCESS)
}

/// Whether the mount at `mountpoint` has decided how the kernel's requests reach it
/// (`/dev/fuse` or io_uring): its control file no longer says `transport starting`. The
/// read goes through the mount, so it is given up at `deadline` (a hung mount).
fn transport_decided(mountpoint: &Path, deadline: Instant) -> bool {
    let file = mountpoint.join(plusfs_fuse::core::STATS_FILE);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || drop(tx.send(std::fs::read_to_string(file))));
    match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        Ok(Ok(t)) => t.lines().any(|l| l.starts_with("transport") && l != "transport starting"),
        _ => false,
    }
}

/// The last `n` lines of the file at `path` (empty when it cannot be read).
fn last_lines(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// `path` opened for appending, made (mode 0600) if missing: a mount's log names its
/// users' paths.
fn private_append(path: &Path) -> Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot open the mount's log {}", path.display()))
}

pub fn umount(a: UmountArgs) -> Result<ExitCode> {
    let status = Command::new("fusermount3").arg("-u").arg(&a.mountpoint).status();
    match status {
        Ok(s) if s.success() => Ok(ExitCode::SUCCESS),
        _ => {
            let s = Command::new("umount").arg(&a.mountpoint).status().context("cannot run umount")?;
            if s.success() {
                Ok(ExitCode::SUCCESS)
            } else {
                bail!("cannot unmount {}", a.mountpoint.display())
            }
        }
    }
}
