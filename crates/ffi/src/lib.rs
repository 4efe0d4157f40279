//! `libplusfs`: the C library. Every function is an `extern "C"` wrapper that checks its
//! pointers, runs the async client through the handle's [`BlockingClient`] inside a panic
//! boundary, and returns a negated errno on failure, so no panic and no Rust error crosses
//! into C. A handle used in a forked child (MPI launchers, `fork` + work) transparently
//! gets a fresh runtime and fresh connections there, keeping its descriptors (see
//! [`BlockingClient`]).

#![allow(non_camel_case_types)]

use libc::{c_char, c_int, c_void, mode_t};
use plusfs_client::{AclKind, BlockingClient, ClientOptions, FsError, OpenFlags};
use plusfs_placement::ClusterMap;
use plusfs_proto::{Attr, Errno, Semantics};
use std::ffi::CStr;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A connection to one cluster; create with `plusfs_connect`, free with
/// `plusfs_disconnect`. A handle may be used from several threads, and in a forked child
/// (which gets fresh connections and keeps the descriptors).
pub struct plusfs_t {
    bridge: BlockingClient,
}

/// What a batch does when one of its entries fails (decided by each server on its own).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum plusfs_semantics_t {
    /// Every entry is attempted.
    PLUSFS_PERFORM_ALL = 0,
    /// A server stops at its first failed entry.
    PLUSFS_STOP_ON_FAILURE = 1,
}

/// Called by `plusfs_readdir` once per entry; `kind` is a `DT_*` value. Return non-zero to
/// stop the listing.
pub type plusfs_dirent_cb = Option<extern "C" fn(arg: *mut c_void, name: *const c_char, ino: u64, kind: u8) -> c_int>;

fn neg(e: Errno) -> c_int {
    -e.raw()
}

/// Runs `f`, turning a panic into -EIO.
fn guard<F: FnOnce() -> c_int>(f: F) -> c_int {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(-libc::EIO)
}

/// [`guard`] for calls returning a byte count.
fn guard_size<F: FnOnce() -> isize>(f: F) -> isize {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(-(libc::EIO as isize))
}

fn to_semantics(s: plusfs_semantics_t) -> Semantics {
    match s {
        plusfs_semantics_t::PLUSFS_PERFORM_ALL => Semantics::PerformAll,
        plusfs_semantics_t::PLUSFS_STOP_ON_FAILURE => Semantics::StopOnFailure,
    }
}

/// A C string argument as UTF-8, or the errno to return.
///
/// # Safety
/// `p` is NULL or a valid NUL-terminated string.
unsafe fn text<'a>(p: *const c_char) -> Result<&'a str, c_int> {
    if p.is_null() {
        return Err(-libc::EFAULT);
    }
    CStr::from_ptr(p).to_str().map_err(|_| -libc::EINVAL)
}

/// The handle behind a pointer.
///
/// # Safety
/// `fs` is NULL or a pointer returned by `plusfs_connect` and not yet disconnected.
unsafe fn handle<'a>(fs: *mut plusfs_t) -> Result<&'a plusfs_t, c_int> {
    fs.as_ref().ok_or(-libc::EFAULT)
}

/// Runs `f` on the handle inside [`guard`] (EFAULT for a null handle).
///
/// # Safety
/// `fs` is null or valid.
unsafe fn on_handle(fs: *mut plusfs_t, f: impl FnOnce(&plusfs_t) -> c_int) -> c_int {
    guard(|| match handle(fs) {
        Ok(fs) => f(fs),
        Err(e) => e,
    })
}

/// `count` names from a C array.
///
/// # Safety
/// `paths` points to `count` valid C strings.
unsafe fn names(paths: *const *const c_char, count: c_int) -> Result<Vec<String>, c_int> {
    if count < 0 {
        return Err(-libc::EINVAL);
    }
    if count > 0 && paths.is_null() {
        return Err(-libc::EFAULT);
    }
    (0..count as usize).map(|i| text(*paths.add(i)).map(str::to_string)).collect()
}

/// Writes per-entry results and returns how many were performed.
///
/// # Safety
/// `out` points to `results.len()` writable ints.
unsafe fn write_results(results: &[c_int], out: *mut c_int) -> c_int {
    if !out.is_null() {
        std::ptr::copy_nonoverlapping(results.as_ptr(), out, results.len());
    }
    results.iter().filter(|&&r| r != -libc::ECANCELED).count() as c_int
}

fn fill_stat(a: &Attr, st: &mut libc::stat) {
    let kind = a.kind.mode_bits();
    // SAFETY: `stat` is plain old data; all-zero is a valid value.
    *st = unsafe { std::mem::zeroed() };
    st.st_ino = a.ino;
    st.st_mode = kind | a.mode;
    st.st_nlink = a.nlink as _;
    st.st_uid = a.uid;
    st.st_gid = a.gid;
    st.st_size = a.size as _;
    st.st_blksize = 4096;
    st.st_blocks = a.size.div_ceil(512) as _;
    st.st_atime = a.atime.sec;
    st.st_atime_nsec = a.atime.nsec as _;
    st.st_mtime = a.mtime.sec;
    st.st_mtime_nsec = a.mtime.nsec as _;
    st.st_ctime = a.ctime.sec;
    st.st_ctime_nsec = a.ctime.nsec as _;
}

/// The shared body of the directory batch calls: checks the arguments, runs `call`, writes
/// one result per entry (`ok` turns a success into its value, failures become negated
/// errnos) and returns how many entries were performed.
///
/// # Safety
/// Pointers are valid for `count` elements.
unsafe fn dir_batch<T>(
    fs: *mut plusfs_t,
    dirname: *const c_char,
    paths: *const *const c_char,
    count: c_int,
    returnvalues: *mut c_int,
    call: impl FnOnce(&plusfs_t, &str, &[String]) -> Result<Vec<Result<T, Errno>>, FsError>,
    mut ok: impl FnMut(usize, T) -> c_int,
) -> c_int {
    guard(|| {
        let run = || -> Result<c_int, c_int> {
            let (fs, dir, names) = (handle(fs)?, text(dirname)?, names(paths, count)?);
            let out = call(fs, dir, &names).map_err(|e| neg(e.errno))?;
            let rv: Vec<c_int> =
                out.into_iter().enumerate().map(|(i, r)| r.map(|v| ok(i, v)).unwrap_or_else(neg)).collect();
            Ok(write_results(&rv, returnvalues))
        };
        run().unwrap_or_else(|e| e)
    })
}

/// Connects to the cluster described by the cluster map file `cluster_file`. Returns NULL
/// and sets `errno` on failure.
///
/// # Safety
/// `cluster_file` is a valid C string.
#[no_mangle]
pub unsafe extern "C" fn plusfs_connect(cluster_file: *const c_char) -> *mut plusfs_t {
    let result = catch_unwind(AssertUnwindSafe(|| -> Result<*mut plusfs_t, c_int> {
        let path = text(cluster_file)?;
        let map = ClusterMap::load(std::path::Path::new(path)).map_err(|_| -libc::ENOENT)?;
        let bridge = BlockingClient::new(map, ClientOptions::default()).map_err(|_| -libc::ENOMEM)?;
        Ok(Box::into_raw(Box::new(plusfs_t { bridge })))
    }));
    match result {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => {
            *libc::__errno_location() = -e;
            std::ptr::null_mut()
        }
        Err(_) => {
            *libc::__errno_location() = libc::EIO;
            std::ptr::null_mut()
        }
    }
}

/// Closes the connections and frees the handle.
///
/// # Safety
/// `fs` comes from `plusfs_connect` and is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn plusfs_disconnect(fs: *mut plusfs_t) -> c_int {
    guard(|| {
        if fs.is_null() {
            return -libc::EFAULT;
        }
        drop(Box::from_raw(fs));
        0
    })
}

/// Opens files `paths[0..count)` of `dirname` in one batch; `flags` may hold `O_CREAT` and
/// `O_EXCL`. `returnvalues[i]` receives a descriptor or a negated errno.
///
/// # Safety
/// Pointers are valid for `count` elements.
#[no_mangle]
pub unsafe extern "C" fn plusfs_openv(
    fs: *mut plusfs_t,
    dirname: *const c_char,
    paths: *const *const c_char,
    flags: c_int,
    mode: mode_t,
    semantics: plusfs_semantics_t,
    returnvalues: *mut c_int,
    count: c_int,
) -> c_int {
    let flags = open_flags(flags);
    let sem = to_semantics(semantics);
    dir_batch(
        fs,
        dirname,
        paths,
        count,
        returnvalues,
        |fs, dir, names| fs.bridge.run(|c| c.openv(dir, names, flags, mode, sem)),
        |_, fd| fd,
    )
}

/// Closes descriptors in one batch per server; unknown descriptors get -EBADF.
///
/// # Safety
/// Pointers are valid for `count` elements.
#[no_mangle]
pub unsafe extern "C" fn plusfs_closev(
    fs: *mut plusfs_t,
    fds: *const c_int,
    semantics: plusfs_semantics_t,
    returnvalues: *mut c_int,
    count: c_int,
) -> c_int {
    guard(|| {
        let run = || -> Result<c_int, c_int> {
            let fs = handle(fs)?;
            if count < 0 || (count > 0 && fds.is_null()) {
                return Err(-libc::EINVAL);
            }
            let fds = std::slice::from_raw_parts(fds, count as usize);
            let out = fs.bridge.run(|c| c.closev(fds, to_semantics(semantics)));
            let rv: Vec<c_int> = out.into_iter().map(|r| r.map(|_| 0).unwrap_or_else(neg)).collect();
            Ok(write_results(&rv, returnvalues))
        };
        run().unwrap_or_else(|e| e)
    })
}

/// `lstat` of `paths[0..count)` of `dirname` in one batch; successful entries fill
/// `returnstats[i]`.
///
/// # Safety
/// Pointers are valid for `count` elements.
#[no_mangle]
pub unsafe extern "C" fn plusfs_statv(
    fs: *mut plusfs_t,
    dirname: *const c_char,
    paths: *const *const c_char,
    semantics: plusfs_semantics_t,
    returnvalues: *mut c_int,
    returnstats: *mut libc::stat,
    count: c_int,
) -> c_int {
    let sem = to_semantics(semantics);
    dir_batch(
        fs,
        dirname,
        paths,
        count,
        returnvalues,
        |fs, dir, names| fs.bridge.run(|c| c.statv(dir, names, sem)),
        |i, a| {
            if !returnstats.is_null() {
                fill_stat(&a, &mut *returnstats.add(i));
            }
            0
        },
    )
}

/// Removes `paths[0..count)` of `dirname` in one batch.
///
/// # Safety
/// Pointers are valid for `count` elements.
#[no_mangle]
pub unsafe extern "C" fn plusfs_unlinkv(
    fs: *mut plusfs_t,
    dirname: *const c_char,
    paths: *const *const c_char,
    semantics: plusfs_semantics_t,
    returnvalues: *mut c_int,
    count: c_int,
) -> c_int {
    let sem = to_semantics(semantics);
    dir_batch(
        fs,
        dirname,
        paths,
        count,
        returnvalues,
        |fs, dir, names| fs.bridge.run(|c| c.unlinkv(dir, names, sem)),
        |_, ()| 0,
    )
}

/// Creates subdirectories `paths[0..count)` of `dirname` in one batch.
///
/// # Safety
/// Pointers are valid for `count` elements.
#[no_mangle]
pub unsafe extern "C" fn plusfs_mkdirv(
    fs: *mut plusfs_t,
    dirname: *const c_char,
    paths: *const *const c_char,
    mode: mode_t,
    semantics: plusfs_semantics_t,
    returnvalues: *mut c_int,
    count: c_int,
) -> c_int {
    let sem = to_semantics(semantics);
    dir_batch(
        fs,
        dirname,
        paths,
        count,
        returnvalues,
        |fs, dir, names| fs.bridge.run(|c| c.mkdirv(dir, names, mode, sem)),
        |_, _| 0,
    )
}

/// Runs a single-path call that yields an int.
///
/// # Safety
/// `fs` and `path` are valid.
unsafe fn one<F>(fs: *mut plusfs_t, path: *const c_char, f: F) -> c_int
where
    F: FnOnce(&plusfs_t, &str) -> Result<c_int, Errno>,
{
    guard(|| match (handle(fs), text(path)) {
        (Ok(fs), Ok(p)) => f(fs, p).unwrap_or_else(neg),
        (Err(e), _) | (_, Err(e)) => e,
    })
}

/// The `open(2)` flags plusfs honours.
fn open_flags(flags: c_int) -> OpenFlags {
    OpenFlags {
        create: flags & libc::O_CREAT != 0,
        exclusive: flags & libc::O_EXCL != 0,
        truncate: flags & libc::O_TRUNC != 0,
        append: flags & libc::O_APPEND != 0,
        access: match flags & libc::O_ACCMODE {
            libc::O_RDONLY => plusfs_proto::MAY_READ,
            libc::O_WRONLY => plusfs_proto::MAY_WRITE,
            _ => plusfs_proto::MAY_READ | plusfs_proto::MAY_WRITE,
        },
    }
}

/// The handle of a read or write call, or its negated errno: EFAULT for a null handle,
/// EINVAL for a negative offset or a null buffer with a non-zero count.
///
/// # Safety
/// `fs` is null or valid.
unsafe fn io_call<'a>(fs: *mut plusfs_t, buf_null: bool, count: usize, offset: i64) -> Result<&'a plusfs_t, isize> {
    let fs = handle(fs).map_err(|e| e as isize)?;
    if offset < 0 || (buf_null && count > 0) {
        return Err(-(libc::EINVAL as isize));
    }
    Ok(fs)
}

/// `pread(2)`: reads up to `count` bytes at `offset` of descriptor `fd` into `buf`;
/// returns the bytes read (0 at the end of the file) or a negated errno (`-EINVAL` for a
/// negative offset).
///
/// # Safety
/// `fs` is valid; `buf` has room for `count` bytes.
#[no_mangle]
pub unsafe extern "C" fn plusfs_pread(
    fs: *mut plusfs_t,
    fd: c_int,
    buf: *mut c_void,
    count: usize,
    offset: i64,
) -> isize {
    guard_size(|| {
        let fs = match io_call(fs, buf.is_null(), count, offset) {
            Ok(fs) => fs,
            Err(e) => return e,
        };
        match fs.bridge.run(|c| c.pread_fd(fd, offset as u64, count)) {
            Ok(data) => {
                std::ptr::copy_nonoverlapping(data.as_ptr(), buf as *mut u8, data.len());
                data.len() as isize
            }
            Err(e) => -(e.errno.raw() as isize),
        }
    })
}

/// `pwrite(2)`: writes `count` bytes of `buf` at `offset` of descriptor `fd` (at the end
/// for `O_APPEND`); returns `count` or a negated errno.
///
/// # Safety
/// `fs` is valid; `buf` holds `count` bytes.
#[no_mangle]
pub unsafe extern "C" fn plusfs_pwrite(
    fs: *mut plusfs_t,
    fd: c_int,
    buf: *const c_void,
    count: usize,
    offset: i64,
) -> isize {
    guard_size(|| {
        let fs = match io_call(fs, buf.is_null(), count, offset) {
            Ok(fs) => fs,
            Err(e) => return e,
        };
        let data = if count == 0 { &[][..] } else { std::slice::from_raw_parts(buf as *const u8, count) };
        match fs.bridge.run(|c| c.pwrite_fd(fd, offset as u64, data)) {
            Ok(_) => count as isize,
            Err(e) => -(e.errno.raw() as isize),
        }
    })
}

/// `ftruncate(2)`.
///
/// # Safety
/// `fs` is valid.
#[no_mangle]
pub unsafe extern "C" fn plusfs_ftruncate(fs: *mut plusfs_t, fd: c_int, size: i64) -> c_int {
    on_handle(fs, |fs| {
        if size < 0 {
            return -libc::EINVAL;
        }
        fs.bridge.run(|c| c.ftruncate_fd(fd, size as u64)).map(|_| 0).unwrap_or_else(|e| -e.errno.raw())
    })
}

/// `fsync(2)`.
///
/// # Safety
/// `fs` is valid.
#[no_mangle]
pub unsafe extern "C" fn plusfs_fsync(fs: *mut plusfs_t, fd: c_int) -> c_int {
    on_handle(fs, |fs| fs.bridge.run(|c| c.fsync_fd(fd)).map(|_| 0).unwrap_or_else(|e| -e.errno.raw()))
}

/// `open(2)`: returns a descriptor (flags: `O_CREAT`, `O_EXCL`, `O_TRUNC`, `O_APPEND`).
///
/// # Safety
/// `fs` and `path` are valid.
#[no_mangle]
pub unsafe extern "C" fn plusfs_open(fs: *mut plusfs_t, path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    one(fs, path, |fs, p| fs.bridge.run(|c| c.open_fd(p, open_flags(flags), mode)).map_err(|e| e.errno))
}

/// `close(2)`.
///
/// # Safety
/// `fs` is valid.
#[no_mangle]
pub unsafe extern "C" fn plusfs_close(fs: *mut plusfs_t, fd: c_int) -> c_int {
    guard(|| match handle(fs) {
        Ok(fs) => fs.bridge.run(|c| c.close_fd(fd)).map(|_| 0).unwrap_or_else(|e| neg(e.errno)),
        Err(e) => e,
    })
}

/// `stat(2)` (follows symbolic links).
///
/// # Safety
/// `fs`, `path` and `st` are valid.
#[no_mangle]
pub unsafe extern "C" fn plusfs_stat(fs: *mut plusfs_t, path: *const c_char, st: *mut libc::stat) -> c_int {
    stat_call(fs, path, st, true)
}

/// `stat` (`follow`) or `lstat` into `st`.
///
/// # Safety
/// `fs` and `path` are valid; `st` is null or valid.
unsafe fn stat_call(fs: *mut plusfs_t, path: *const c_char, st: *mut libc::stat, follow: bool) -> c_int {
    if st.is_null() {
        return -libc::EFAULT;
    }
    one(fs, path, |fs, p| {
        let r = if follow { fs.bridge.run(|c| c.stat(p)) } else { fs.bridge.run(|c| c.lstat(p)) };
        fill_stat(&r.map_err(|e| e.errno)?, &mut *st);
        Ok(0)
    })
}

/// `lstat(2)`.
///
/// # Safety
/// `fs`, `path` and `st` are valid.
#[no_mangle]
pub unsafe extern "C" fn plusfs_lstat(fs: *mut plusfs_t, path: *const c_char, st: *mut libc::stat) -> c_int {
    stat_call(fs, path, st, false)
}

/// `mkdir(2)`.
///
/// # Safety
/// `fs` and `path` are valid.
#[no_mangle]
pub unsafe extern "C" fn plusfs_mkdir(fs: *mut plusfs_t, path: *const c_char, mode: mode_t) -> c_int {
    one(fs, path, |fs, p| fs.bridge.run(|c| c.mkdir(p, mode)).map(|_| 0).map_err(|e| e.errno))
}

/// The ACL of `path` in the short text form (`user::rw-,user:1001:r-x,group::r--,
/// mask::r-x,other::---`, numeric ids), written to `buf` (`len` bytes, NUL included):
/// the access ACL (its mode bits as an ACL when it has none), or with `default_acl` the
/// directory's default ACL (the empty string when it has none). Returns the text's length,
/// or a negated errno (`-ERANGE` when `buf` is too small).
///
/// # Safety
/// `fs` and `path` are valid; `buf` is valid for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn plusfs_getfacl(
    fs: *mut plusfs_t,
    path: *const c_char,
    default_acl: c_int,
    buf: *mut c_char,
    len: usize,
) -> c_int {
    if buf.is_null() {
        return -libc::EFAULT;
    }
    one(fs, path, |fs, p| {
        let kind = if default_acl != 0 { AclKind::Default } else { AclKind::Access };
        let acl = fs.bridge.run(|c| c.shown_acl(p, kind)).map_err(|e| e.errno)?;
        let text = acl.map(|a| a.to_text()).unwrap_or_default();
        if text.len() + 1 > len {
            return Err(Errno(libc::ERANGE));
        }
        std::ptr::copy_nonoverlapping(text.as_ptr(), buf as *mut u8, text.len());
        *buf.add(text.len()) = 0;
        Ok(text.len() as c_int)
    })
}

/// Sets the access ACL of `path` (or with `default_acl` its default ACL) from `text` in
/// the form `plusfs_getfacl` gives; a NULL or empty `text` removes it. Returns 0 or a
/// negated errno (`-EINVAL` for a text that is no valid ACL).
///
/// # Safety
/// `fs` and `path` are valid; `text` is NULL or a valid string.
#[no_mangle]
pub unsafe extern "C" fn plusfs_setfacl(
    fs: *mut plusfs_t,
    path: *const c_char,
    default_acl: c_int,
    text_acl: *const c_char,
) -> c_int {
    let acl = match text_acl.is_null() {
        true => None,
        false => match text(text_acl) {
            Ok("") => None,
            Ok(t) => match plusfs_client::Acl::from_text(t) {
                Ok(a) => Some(a),
                Err(_) => return -libc::EINVAL,
            },
            Err(e) => return e,
        },
    };
    one(fs, path, |fs, p| {
        let kind = if default_acl != 0 { AclKind::Default } else { AclKind::Access };
        fs.bridge.run(|c| c.set_acl(p, kind, acl.as_ref())).map(|_| 0).map_err(|e| e.errno)
    })
}

/// `plusfs_set_hugedir` threshold: never distribute the directory.
pub const PLUSFS_HUGEDIR_NEVER: i64 = -1;
/// `plusfs_set_hugedir` threshold: use the cluster's setting.
pub const PLUSFS_HUGEDIR_CLUSTER: i64 = -2;
/// `plusfs_set_hugedir` threshold: leave the threshold unchanged.
pub const PLUSFS_HUGEDIR_KEEP: i64 = -3;

fn threshold_of(t: i64) -> Result<Option<plusfs_proto::Threshold>, Errno> {
    use plusfs_proto::Threshold;
    match t {
        PLUSFS_HUGEDIR_NEVER => Ok(Some(Threshold::Never)),
        PLUSFS_HUGEDIR_CLUSTER => Ok(Some(Threshold::Cluster)),
        PLUSFS_HUGEDIR_KEEP => Ok(None),
        n if n >= 0 => Ok(Some(Threshold::Entries(n as u64))),
        _ => Err(Errno::EINVAL),
    }
}

/// `mkdir(2)` with a huge-directory policy: the directory is spread over `width` servers
/// (0: the cluster's setting) once it holds more than `threshold` entries (0: from
/// creation; or `PLUSFS_HUGEDIR_NEVER` / `PLUSFS_HUGEDIR_CLUSTER`).
///
/// # Safety
/// `fs` and `path` are valid.
#[no_mangle]
pub unsafe extern "C" fn plusfs_mkdir_hugedir(
    fs: *mut plusfs_t,
    path: *const c_char,
    mode: mode_t,
    threshold: i64,
    width: u32,
) -> c_int {
    one(fs, path, |fs, p| {
        let t = threshold_of(threshold)?.unwrap_or(plusfs_proto::Threshold::Cluster);
        fs.bridge.run(|c| c.mkdir_with(p, mode, t, width)).map(|_| 0).map_err(|e| e.errno)
    })
}

/// Changes the huge-directory policy of an existing directory (`PLUSFS_HUGEDIR_KEEP` and
/// `width` 0 leave a setting as it is); it is distributed at once if it already holds more
/// entries than the new threshold. Returns 0, or a negated errno.
///
/// # Safety
/// `fs` and `path` are valid.
#[no_mangle]
pub unsafe extern "C" fn plusfs_set_hugedir(
    fs: *mut plusfs_t,
    path: *const c_char,
    threshold: i64,
    width: u32,
) -> c_int {
    one(fs, path, |fs, p| {
        let t = threshold_of(threshold)?;
        let w = (width != 0).then_some(width);
        fs.bridge.run(|c| c.set_policy(p, t, w)).map(|_| 0).map_err(|e| e.errno)
    })
}

/// `unlink(2)`.
///
/// # Safety
/// `fs` and `path` are valid.
#[no_mangle]
pub unsafe extern "C" fn plusfs_unlink(fs: *mut plusfs_t, path: *const c_char) -> c_int {
    one(fs, path, |fs, p| fs.bridge.run(|c| c.unlink(p)).map(|_| 0).map_err(|e| e.errno))
}

/// `rmdir(2)`.
///
/// # Safety
/// `fs` and `path` are valid.
#[no_mangle]
pub unsafe extern "C" fn plusfs_rmdir(fs: *mut plusfs_t, path: *const c_char) -> c_int {
    one(fs, path, |fs, p| fs.bridge.run(|c| c.rmdir(p)).map(|_| 0).map_err(|e| e.errno))
}

/// `rename(2)`.
///
/// # Safety
/// `fs`, `oldpath` and `newpath` are valid.
#[no_mangle]
pub unsafe extern "C" fn plusfs_rename(fs: *mut plusfs_t, oldpath: *const c_char, newpath: *const c_char) -> c_int {
    one(fs, oldpath, |fs, old| {
        let new = text(newpath).map_err(|e| Errno(-e))?;
        fs.bridge.run(|c| c.rename(old, new)).map(|_| 0).map_err(|e| e.errno)
    })
}

/// `link(2)`: a new name `newpath` for the file `oldpath` (not a directory).
///
/// # Safety
/// `fs`, `oldpath` and `newpath` are valid.
#[no_mangle]
pub unsafe extern "C" fn plusfs_link(fs: *mut plusfs_t, oldpath: *const c_char, newpath: *const c_char) -> c_int {
    one(fs, oldpath, |fs, old| {
        let new = text(newpath).map_err(|e| Errno(-e))?;
        fs.bridge.run(|c| c.link(old, new)).map(|_| 0).map_err(|e| e.errno)
    })
}

/// Lists directory `path` (without `.` and `..`), calling `cb` for each entry in name
/// order. Returns the number of entries passed to `cb`.
///
/// # Safety
/// `fs` and `path` are valid; `cb` is safe to call with `arg`.
#[no_mangle]
pub unsafe extern "C" fn plusfs_readdir(
    fs: *mut plusfs_t,
    path: *const c_char,
    cb: plusfs_dirent_cb,
    arg: *mut c_void,
) -> c_int {
    let Some(cb) = cb else { return -libc::EFAULT };
    one(fs, path, |fs, p| {
        let entries = fs.bridge.run(|c| c.readdir(p)).map_err(|e| e.errno)?;
        let mut n = 0;
        for e in entries {
            let name = std::ffi::CString::new(e.name).map_err(|_| Errno::EINVAL)?;
            let kind = e.kind.dirent_type();
            n += 1;
            if cb(arg, name.as_ptr(), e.ino, kind) != 0 {
                break;
            }
        }
        Ok(n)
    })
}

/// BFOw (seed 002 §3.3): creates or replaces the whole files `paths[0..count)` with
/// `bufs[i]` (`lens[i]` bytes) and `mode`, many files per request and server. Each
/// `returnvalues[i]` is 0 or a negated errno. Returns the number of files written, or a
/// negated errno for bad arguments.
///
/// # Safety
/// `paths`, `bufs`, `lens` and `returnvalues` are valid for `count` elements; each
/// `bufs[i]` for `lens[i]` bytes.
#[no_mangle]
pub unsafe extern "C" fn plusfs_batch_write(
    fs: *mut plusfs_t,
    paths: *const *const c_char,
    bufs: *const *const u8,
    lens: *const usize,
    mode: mode_t,
    returnvalues: *mut c_int,
    count: c_int,
) -> c_int {
    guard(|| {
        let run = || -> Result<c_int, c_int> {
            let fs = handle(fs)?;
            let paths = names(paths, count)?;
            if count > 0 && (bufs.is_null() || lens.is_null()) {
                return Err(-libc::EFAULT);
            }
            let files: Vec<plusfs_client::NewFile> = paths
                .into_iter()
                .enumerate()
                .map(|(i, p)| {
                    let (b, n) = (*bufs.add(i), *lens.add(i));
                    let data = if n == 0 { Vec::new() } else { std::slice::from_raw_parts(b, n).to_vec() };
                    plusfs_client::NewFile { mode: mode & 0o7777, ..plusfs_client::NewFile::new(p, data) }
                })
                .collect();
            let out = fs.bridge.run(|c| c.batch_write(files));
            let rv: Vec<c_int> = out.into_iter().map(|r| r.map(|_| 0).unwrap_or_else(|e| neg(e.errno))).collect();
            write_results(&rv, returnvalues);
            Ok(rv.iter().filter(|&&r| r == 0).count() as c_int)
        };
        run().unwrap_or_else(|e| e)
    })
}

/// BFOr (seed 002 §3.2): reads the whole files `paths[0..count)` into `bufs[i]` (room for
/// `caps[i]` bytes), in few large, offset-ordered reads on the servers. `returnvalues[i]`
/// is the file's size, or a negated errno (`-ERANGE` when it does not fit). Returns the
/// number of files read, or a negated errno for bad arguments.
///
/// # Safety
/// `paths`, `bufs`, `caps` and `returnvalues` are valid for `count` elements; each
/// `bufs[i]` for `caps[i]` bytes.
#[no_mangle]
pub unsafe extern "C" fn plusfs_batch_read(
    fs: *mut plusfs_t,
    paths: *const *const c_char,
    bufs: *const *mut u8,
    caps: *const usize,
    returnvalues: *mut i64,
    count: c_int,
) -> c_int {
    guard(|| {
        let run = || -> Result<c_int, c_int> {
            let fs = handle(fs)?;
            let paths = names(paths, count)?;
            if count > 0 && (bufs.is_null() || caps.is_null() || returnvalues.is_null()) {
                return Err(-libc::EFAULT);
            }
            let out = fs.bridge.run(|c| c.batch_read(&paths, plusfs_client::DEFAULT_READ_BUFFER));
            let mut read = 0;
            for (i, r) in out.into_iter().enumerate() {
                *returnvalues.add(i) = match r {
                    Ok((_, d)) if d.len() > *caps.add(i) => -(libc::ERANGE as i64),
                    Ok((_, d)) => {
                        std::ptr::copy_nonoverlapping(d.as_ptr(), *bufs.add(i), d.len());
                        read += 1;
                        d.len() as i64
                    }
                    Err(e) => neg(e.errno) as i64,
                };
            }
            Ok(read)
        };
        run().unwrap_or_else(|e| e)
    })
}
