//! The FUSE mount: the kernel speaks inode numbers, plusfs speaks paths.
//!
//! [`core::MountCore`] holds everything a mount does (the inode table, write gathering,
//! files unlinked while open, directory listings) with plain arguments and errno results,
//! so tests drive it without `/dev/fuse`. [`PlusFs`] is the `fuser` adapter: each kernel
//! callback calls the core and answers with the result.

mod adapter;
mod callers;
pub mod core;
mod notify;
mod runner;
pub mod uring;

pub use adapter::{file_attr, PlusFs};
pub use core::WRITE_BUFFER;

use fuser::{Config, MountOption, SessionACL};
use plusfs_client::Client;
use std::path::Path;
use std::time::Duration;

/// Mount settings.
#[derive(Debug, Clone)]
pub struct MountSettings {
    /// How long the kernel may cache attributes and names (default 1 s: safe for several
    /// clients, changes of another client are seen within it).
    pub ttl: Duration,
    /// Let other users than the mounting one use the mount (`-o allow_other`).
    pub allow_other: bool,
    /// Answer directory listings with attributes (`readdirplus`, one batch stat per page
    /// and storing server), so `ls -l` needs no lookup per entry (default on;
    /// `-o noreaddirplus` turns it off).
    pub readdirplus: bool,
    /// Let the kernel run lookups and creates in one directory in parallel
    /// (`FUSE_PARALLEL_DIROPS`; default on, `-o noparallel_dirops` turns it off).
    pub parallel_dirops: bool,
    /// Let the kernel cache writes and send them in the background
    /// (`FUSE_WRITEBACK_CACHE`, `-o writeback_cache`; default off, see
    /// `docs/semantics.md`).
    pub writeback_cache: bool,
    /// Requests the kernel may have in flight at once (`max_background`, default 64).
    pub max_background: u16,
    /// Threads of the runtime the mount's operations run on (default 2).
    pub workers: usize,
    /// Threads reading requests from `/dev/fuse`, each on its own clone of the device
    /// (default 2: while one replies, the other already waits for the next request; a
    /// request that must wait is handed to the runtime after its first poll).
    pub readers: usize,
    /// Let the kernel check permission bits too (default on; `-o nodefault_permissions`
    /// leaves every check to the servers, which check each call with the caller's
    /// credentials anyway: the kernel then does not re-read a directory's attributes
    /// before each check, but it never asks the mount about opening FIFOs and device
    /// nodes, so their permission bits go unchecked).
    pub default_permissions: bool,
    /// Ask the servers for directory delegations and batch the changes of delegated
    /// directories (default on; `-o nodeleg` turns it off; `docs/semantics.md`).
    pub delegations: bool,
    /// The kernel's read-ahead for the mount, in KiB (default 8192; `-o readahead=KIB`,
    /// 0 keeps the kernel's 128 KiB). FUSE offers a file system at most the block
    /// layer's default; the mount raises it through sysfs once it is up (needs root).
    pub readahead_kib: u32,
    /// Serve Prometheus metrics (FUSE-operation latency histograms) on this `host:port`
    /// (`-o metrics=ADDR`).
    pub metrics: Option<String>,
    /// Whether requests come over io_uring queues (default: when the kernel offers it).
    pub uring: UringMode,
    /// Entries per io_uring queue, one queue per CPU (`-o uring_depth=N`, default 32):
    /// requests the kernel may hand over at once per CPU.
    pub uring_depth: usize,
    /// Point standard error at `/dev/null` once the mount is up (set by `plusfs mount` in
    /// the background, whose parent reads the mount's start-up errors from a pipe and exits
    /// once it is up).
    pub quiet_when_up: bool,
    /// How long the kernel may keep the names and file attributes of a directory this
    /// mount holds a delegation of (default 60 s; `-o deleg_ttl=SECONDS`, 0 keeps `ttl`,
    /// and with `ttl` 0 nothing is kept): nobody else can change them before the delegation
    /// ends, and when it ends the mount invalidates what the kernel kept
    /// (`core/kernel_cache.rs`).
    pub deleg_ttl: Duration,
    /// Serve extended attributes (default on; `-o noxattr` answers them `ENOSYS`, so the
    /// kernel stops asking: programs get `EOPNOTSUPP`, and writes lose the kernel's
    /// `security.capability` probe, one FUSE request per `write(2)`).
    pub xattrs: bool,
    /// POSIX ACLs (default on with `xattrs`; `-o noacl` turns them off): the kernel checks
    /// them (it reads `system.posix_acl_access` as the servers keep it) and leaves the
    /// umask to the servers, which replace it by a parent's default ACL.
    pub acl: bool,
}

/// Whether a mount takes the kernel's requests over io_uring (`uring` module).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UringMode {
    /// Over `/dev/fuse` only (`-o nouring`).
    Off,
    /// Over io_uring when the kernel offers it, else `/dev/fuse` (the default).
    Auto,
    /// Over io_uring, or the mount fails (`-o uring`).
    Required,
}

impl Default for MountSettings {
    fn default() -> Self {
        MountSettings {
            ttl: Duration::from_secs(1),
            allow_other: false,
            readdirplus: true,
            parallel_dirops: true,
            writeback_cache: false,
            max_background: 64,
            workers: 2,
            readers: 2,
            default_permissions: true,
            delegations: true,
            readahead_kib: 8192,
            metrics: None,
            uring: UringMode::Auto,
            uring_depth: 32,
            quiet_when_up: false,
            deleg_ttl: Duration::from_secs(60),
            xattrs: true,
            acl: true,
        }
    }
}

/// The fuser configuration of a plusfs mount.
pub fn config(settings: &MountSettings) -> Config {
    let mut c = Config::default();
    c.mount_options = vec![MountOption::FSName("plusfs".into()), MountOption::Subtype("plusfs".into())];
    if settings.default_permissions {
        c.mount_options.push(MountOption::DefaultPermissions);
    }
    // Each reader on its own clone of the device (opened again): where that cannot be
    // opened, one reader.
    let readers = match settings.readers > 1 && !can_open_fuse_device() {
        true => {
            tracing::warn!("/dev/fuse cannot be opened again: one reader thread");
            1
        }
        false => settings.readers.max(1),
    };
    c.n_threads = Some(readers);
    c.clone_fd = readers > 1;
    if settings.allow_other {
        c.acl = SessionACL::All;
    }
    c
}

/// Whether this process may open `/dev/fuse` (a reader's clone of the device opens it).
fn can_open_fuse_device() -> bool {
    std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse").is_ok()
}

/// Mounts `client`'s cluster at `mountpoint` and serves until it is unmounted.
pub fn mount(client: Client, mountpoint: &Path, settings: &MountSettings) -> std::io::Result<()> {
    let fs = PlusFs::new(client, settings)?;
    if settings.readahead_kib > 0 {
        set_readahead_when_up(mountpoint, settings.readahead_kib)?;
    }
    let (runner, agreed) = (fs.runner(), fs.uring_agreed());
    let core = runner.core.clone();
    let mut session = fuser::Session::new(fs, mountpoint, &config(settings))?;
    // `Session::new` has answered the kernel's INIT: the transport is decided.
    let agreed = agreed.load(std::sync::atomic::Ordering::SeqCst);
    let over_uring = match (settings.uring, agreed) {
        (UringMode::Off, _) => {
            tracing::info!("FUSE requests over /dev/fuse (io_uring not asked for)");
            None
        }
        (UringMode::Required, false) => {
            unmount_refused(&mut session);
            return Err(std::io::Error::other(
                "-o uring: the kernel does not offer FUSE over io_uring \
                 (as root: echo Y > /sys/module/fuse/parameters/enable_uring, then mount again)",
            ));
        }
        (UringMode::Auto, false) => {
            tracing::info!(
                "FUSE requests over /dev/fuse (the kernel does not offer io_uring: \
                 /sys/module/fuse/parameters/enable_uring)"
            );
            None
        }
        (_, true) => match start_uring(&session, runner, settings) {
            Ok(t) => t,
            Err(e) => {
                unmount_refused(&mut session);
                return Err(e);
            }
        },
    };
    if settings.quiet_when_up {
        quiet_stderr();
    }
    match notify::Notifier::new(std::os::fd::AsFd::as_fd(&session)) {
        Ok(n) => core.start_invalidations(Box::new(n)),
        Err(e) => tracing::warn!(error = %e, "no invalidations: the kernel keeps names for the usual TTL"),
    }
    // The control file names the transport from now on: the mount is up.
    match over_uring {
        Some(t) => core.set_transport(Box::new(move || t.describe())),
        None => core.set_transport(Box::new(|| "transport /dev/fuse\n".to_string())),
    }
    session.run()
}

/// Starts the io_uring queues of `session` (whose INIT agreed to them). A failure fails the
/// mount, whether io_uring was required or not.
fn start_uring<FS: fuser::Filesystem>(
    session: &fuser::Session<FS>,
    runner: std::sync::Arc<runner::Runner>,
    settings: &MountSettings,
) -> std::io::Result<Option<uring::Transport>> {
    use std::os::fd::AsFd;
    // The payload buffer holds the largest write (1 MiB) or read and its header.
    let payload = (1 << 20) + 4096;
    match uring::start(session.as_fd(), runner, settings.uring_depth, payload) {
        Ok(t) => {
            tracing::info!(queues = t.queue_count(), depth = settings.uring_depth, "FUSE requests over io_uring");
            Ok(Some(t))
        }
        // Queues that registered part of their entries stay with the kernel (there is no
        // way to take them back), which may then send requests nobody serves: the mount
        // fails rather than going on over /dev/fuse.
        Err(e) => Err(std::io::Error::new(
            e.kind(),
            format!("FUSE over io_uring did not start ({e}); mount with -o nouring to use /dev/fuse"),
        )),
    }
}

/// Unmounts a mount that is given up before it served (its process then exits; the
/// kernel would otherwise keep a dead mount point, "transport endpoint is not connected").
fn unmount_refused<FS: fuser::Filesystem>(session: &mut fuser::Session<FS>) {
    if let Err(e) = session.unmount() {
        tracing::warn!(error = %e, "cannot unmount the refused mount");
    }
}

/// Points standard error at `/dev/null` (its reader went away once the mount was up).
fn quiet_stderr() {
    match std::fs::OpenOptions::new().write(true).open("/dev/null") {
        // SAFETY: dup2 onto descriptor 2 of a descriptor this function owns.
        Ok(null) => unsafe {
            libc::dup2(std::os::fd::AsRawFd::as_raw_fd(&null), 2);
        },
        Err(e) => tracing::warn!(error = %e, "cannot open /dev/null for standard error"),
    }
}

/// Once the mount at `mountpoint` is up (its device differs from the directory's before),
/// sets the kernel's read-ahead of its backing device to `kib` KiB; logs a warning when
/// that is not allowed (not root) or the mount does not come up within 20 s.
fn set_readahead_when_up(mountpoint: &Path, kib: u32) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let before = std::fs::metadata(mountpoint)?.dev();
    let mountpoint = mountpoint.to_path_buf();
    std::thread::spawn(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::time::Instant::now() < deadline {
            match std::fs::metadata(&mountpoint).map(|m| m.dev()) {
                Ok(dev) if dev != before => {
                    let sysfs = format!("/sys/class/bdi/{}:{}/read_ahead_kb", libc::major(dev), libc::minor(dev));
                    match std::fs::write(&sysfs, kib.to_string()) {
                        Ok(()) => tracing::info!(kib, "read-ahead set"),
                        Err(e) => {
                            tracing::warn!(path = sysfs, error = %e, "cannot raise the read-ahead (reads stay 128 KiB)")
                        }
                    }
                    return;
                }
                _ => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        tracing::warn!("the mount did not come up within 20 s: read-ahead left as it was");
    });
    Ok(())
}
