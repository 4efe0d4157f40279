//! Plain types of the client's interface: options, open-file handles, open flags.

use plusfs_proto::{Attr, Cred, Ino, ServerId};

/// Client settings; `Default` gives the values stated on each field.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Pipelined connections per server (default 1).
    pub conns_per_server: usize,
    /// Resends of an idempotent request after a broken connection (default 3).
    pub retries: u32,
    /// The caller's user, which servers check permissions against and record as the
    /// owner of created entries (default: the effective uid of this process).
    pub uid: u32,
    /// The caller's group (default: the effective gid of this process).
    pub gid: u32,
    /// The caller's supplementary groups (default: this process's `getgroups(2)`).
    pub groups: Vec<u32>,
    /// Entries fetched per readdir request (default 1024).
    pub readdir_page: u32,
    /// Most entries in one batch request; larger batches are cut (default 4096).
    pub max_batch: usize,
    /// Longest path one call may be given, in bytes (default `PATH_MAX`, 4096). A FUSE
    /// mount, whose kernel already limits what applications give, raises it to
    /// [`plusfs_proto::path::MAX_TREE_PATH_LEN`].
    pub path_max: usize,
    /// Ask for directory delegations and answer changes of delegated directories locally,
    /// writing them back in batches (default false; the mount turns it on unless
    /// `-o nodeleg`). See `docs/semantics.md`, "Delegations".
    pub delegations: bool,
    /// Records (of at most 1 MiB) a large read or write has in flight at once between
    /// this client and the data servers (default 16).
    pub io_window: usize,
    /// Large reads and writes go straight to the data servers (default true).
    ///
    /// A client presenting a user identity (mutual TLS) uses only requests its servers
    /// check in full: no direct I/O (data records are named by number), no client-driven
    /// Cx (its mkdir and rmdir go to the parent's server, which runs them), no
    /// delegations (their write-back carries what the holder did). Only trusted identities
    /// (admin, server) may send those.
    pub direct_io: bool,
    /// The cluster map file this client's map came from: read again when no server the
    /// client knows answers (default none).
    pub map_file: Option<std::path::PathBuf>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        let Cred { uid, gid, groups, .. } = Cred::of_process();
        ClientOptions {
            conns_per_server: 1,
            retries: 3,
            uid,
            gid,
            groups,
            readdir_page: 1024,
            max_batch: 4096,
            path_max: plusfs_proto::path::MAX_PATH_LEN,
            delegations: false,
            io_window: 16,
            direct_io: true,
            map_file: None,
        }
    }
}

/// An open file: the handle `open`/`create` return and `close` takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileHandle {
    pub path: String,
    pub ino: Ino,
    pub server: ServerId,
    pub attr: Attr,
    /// Opened with `O_APPEND`.
    pub append: bool,
}

/// `openv` flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpenFlags {
    /// `O_CREAT`.
    pub create: bool,
    /// `O_EXCL` (with `create`).
    pub exclusive: bool,
    /// `O_TRUNC`: a regular file is cut to size 0 when opened.
    pub truncate: bool,
    /// `O_APPEND`: every write through the descriptor goes to the end of the file.
    pub append: bool,
    /// What the caller will do with the file, checked when it is opened:
    /// `plusfs_proto::MAY_READ | MAY_WRITE` (from `O_RDONLY`/`O_WRONLY`/`O_RDWR`; 0 checks
    /// nothing at open, reads and writes are still checked).
    pub access: u32,
}

/// What client-direct I/O moved since a client started (shared by its clones).
#[derive(Debug, Default)]
pub struct DirectStats {
    /// Bytes stored on the data servers by `DataPut`s.
    pub written: std::sync::atomic::AtomicU64,
    /// Bytes fetched from the data servers by `DataGet`s.
    pub read: std::sync::atomic::AtomicU64,
    /// Capabilities the files' servers issued to this client.
    pub capabilities: std::sync::atomic::AtomicU64,
}
