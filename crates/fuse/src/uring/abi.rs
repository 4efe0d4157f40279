//! The FUSE kernel ABI as the io_uring transport sees it (`fuse_kernel.h`, protocol 7.40
//! as negotiated by `fuser`): a request arrives as its `fuse_in_header`, its operation's
//! fixed arguments (`op_in`) and a payload holding the rest (names, written data); a reply
//! is a `fuse_out_header` and a payload holding the operation's out arguments. Decoding
//! copies what it keeps, so the ring entry's buffers can be reused for the reply.

use plusfs_proto::{Attr, FileKind, SetAttr, TimeSet, Timespec};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

/// Size of the `in_out` area of a ring entry's header (`fuse_in_header`/`fuse_out_header`).
pub const IN_OUT_SIZE: usize = 128;
/// Size of the `op_in` area (an operation's fixed arguments).
pub const OP_IN_SIZE: usize = 128;
/// Offset of `fuse_uring_ent_in_out` in the header (`flags`, `commit_id`, `payload_sz`).
pub const ENT_IN_OUT: usize = IN_OUT_SIZE + OP_IN_SIZE;
/// Size of a ring entry's header (`struct fuse_uring_req_header`).
pub const HEADER_SIZE: usize = ENT_IN_OUT + 32;

/// `FUSE_IO_URING_CMD_REGISTER`: hand an entry to the kernel, which fills it with a request.
pub const CMD_REGISTER: u32 = 1;
/// `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`: answer the entry's request and wait for the next.
pub const CMD_COMMIT_AND_FETCH: u32 = 2;

const FATTR_MODE: u32 = 1 << 0;
const FATTR_UID: u32 = 1 << 1;
const FATTR_GID: u32 = 1 << 2;
const FATTR_SIZE: u32 = 1 << 3;
const FATTR_ATIME: u32 = 1 << 4;
const FATTR_MTIME: u32 = 1 << 5;
const FATTR_FH: u32 = 1 << 6;
const FATTR_ATIME_NOW: u32 = 1 << 7;
const FATTR_MTIME_NOW: u32 = 1 << 8;
const FUSE_WRITE_KILL_SUIDGID: u32 = 1 << 2;
const RENAME_NOREPLACE: u32 = 1 << 0;
const RENAME_EXCHANGE: u32 = 1 << 1;

/// `FOPEN_DIRECT_IO`: reads and writes bypass the page cache.
pub const FOPEN_DIRECT_IO: u32 = 1 << 0;
/// `FOPEN_KEEP_CACHE`: keep the file's cached pages at open.
pub const FOPEN_KEEP_CACHE: u32 = 1 << 1;
/// `FOPEN_NOFLUSH`: no FLUSH at close.
pub const FOPEN_NOFLUSH: u32 = 1 << 5;

/// Reads a little-endian `u32` at `at`.
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// Reads a little-endian `u64` at `at`.
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// The `fuse_in_header` of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InHeader {
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

impl InHeader {
    /// Decodes the header at the start of `in_out`.
    pub fn parse(in_out: &[u8]) -> InHeader {
        InHeader {
            opcode: u32_at(in_out, 4),
            unique: u64_at(in_out, 8),
            nodeid: u64_at(in_out, 16),
            uid: u32_at(in_out, 24),
            gid: u32_at(in_out, 28),
            pid: u32_at(in_out, 32),
        }
    }
}

/// How a rename treats an existing target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenameHow {
    Replace,
    NoReplace,
    Exchange,
}

/// A decoded request: the operation and its arguments, owned.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    Lookup {
        name: OsString,
    },
    Getattr,
    Setattr {
        set: SetAttr,
        fh: Option<u64>,
    },
    Readlink,
    Symlink {
        name: OsString,
        target: OsString,
    },
    Mknod {
        name: OsString,
        mode: u32,
        rdev: u32,
        umask: u32,
    },
    Mkdir {
        name: OsString,
        mode: u32,
        umask: u32,
    },
    Unlink {
        name: OsString,
    },
    Rmdir {
        name: OsString,
    },
    Rename {
        name: OsString,
        newdir: u64,
        newname: OsString,
        how: RenameHow,
    },
    Link {
        oldnode: u64,
        newname: OsString,
    },
    Open {
        flags: i32,
    },
    Read {
        fh: u64,
        offset: u64,
        size: u32,
    },
    Write {
        fh: u64,
        offset: u64,
        data: Vec<u8>,
        flags: i32,
        kill_suidgid: bool,
    },
    Statfs,
    Release {
        fh: u64,
    },
    Fsync {
        fh: u64,
    },
    Setxattr {
        name: OsString,
        value: Vec<u8>,
        flags: i32,
    },
    Getxattr {
        name: OsString,
        size: u32,
    },
    Listxattr {
        size: u32,
    },
    Removexattr {
        name: OsString,
    },
    Flush,
    Opendir,
    Readdir {
        fh: u64,
        offset: u64,
        size: u32,
        plus: bool,
    },
    Releasedir {
        fh: u64,
    },
    Fsyncdir,
    Access {
        mask: i32,
    },
    Create {
        name: OsString,
        mode: u32,
        umask: u32,
        flags: i32,
    },
    /// An operation plusfs does not implement (the kernel then uses its fallback).
    Unsupported {
        opcode: u32,
    },
}

/// Splits `payload` at its first NUL: the name before it and what follows.
fn cstr(payload: &[u8]) -> Result<(OsString, &[u8]), i32> {
    let end = payload.iter().position(|b| *b == 0).ok_or(libc::EINVAL)?;
    Ok((OsStr::from_bytes(&payload[..end]).to_owned(), &payload[end + 1..]))
}

/// The time a `setattr` sets: now, or the given seconds and nanoseconds.
fn time_set(now: bool, sec: u64, nsec: u32) -> TimeSet {
    match now {
        true => TimeSet::Now,
        false => TimeSet::At(Timespec { sec: sec as i64, nsec }),
    }
}

fn setattr(op: &[u8]) -> (SetAttr, Option<u64>) {
    let valid = u32_at(op, 0);
    let has = |bit| valid & bit != 0;
    let set = SetAttr {
        mode: has(FATTR_MODE).then(|| u32_at(op, 68) & 0o7777),
        uid: has(FATTR_UID).then(|| u32_at(op, 76)),
        gid: has(FATTR_GID).then(|| u32_at(op, 80)),
        size: has(FATTR_SIZE).then(|| u64_at(op, 16)),
        atime: has(FATTR_ATIME).then(|| time_set(has(FATTR_ATIME_NOW), u64_at(op, 32), u32_at(op, 56))),
        mtime: has(FATTR_MTIME).then(|| time_set(has(FATTR_MTIME_NOW), u64_at(op, 40), u32_at(op, 60))),
    };
    (set, has(FATTR_FH).then(|| u64_at(op, 8)))
}

impl Op {
    /// Decodes request `opcode` from its fixed arguments `op` (the 128-byte `op_in` area)
    /// and its `payload`; `Err(errno)` when the request is malformed.
    pub fn parse(opcode: u32, op: &[u8], payload: &[u8]) -> Result<Op, i32> {
        Ok(match opcode {
            1 => Op::Lookup { name: cstr(payload)?.0 },
            3 => Op::Getattr,
            4 => {
                let (set, fh) = setattr(op);
                Op::Setattr { set, fh }
            }
            5 => Op::Readlink,
            6 => {
                let (name, rest) = cstr(payload)?;
                Op::Symlink { name, target: cstr(rest)?.0 }
            }
            8 => Op::Mknod { name: cstr(payload)?.0, mode: u32_at(op, 0), rdev: u32_at(op, 4), umask: u32_at(op, 8) },
            9 => Op::Mkdir { name: cstr(payload)?.0, mode: u32_at(op, 0), umask: u32_at(op, 4) },
            10 => Op::Unlink { name: cstr(payload)?.0 },
            11 => Op::Rmdir { name: cstr(payload)?.0 },
            12 | 45 => {
                let flags = if opcode == 45 { u32_at(op, 8) } else { 0 };
                let how = match flags {
                    0 => RenameHow::Replace,
                    RENAME_NOREPLACE => RenameHow::NoReplace,
                    RENAME_EXCHANGE => RenameHow::Exchange,
                    _ => return Err(libc::EINVAL),
                };
                let (name, rest) = cstr(payload)?;
                Op::Rename { name, newdir: u64_at(op, 0), newname: cstr(rest)?.0, how }
            }
            13 => Op::Link { oldnode: u64_at(op, 0), newname: cstr(payload)?.0 },
            14 => Op::Open { flags: u32_at(op, 0) as i32 },
            15 => Op::Read { fh: u64_at(op, 0), offset: u64_at(op, 8), size: u32_at(op, 16) },
            16 => {
                let size = (u32_at(op, 16) as usize).min(payload.len());
                Op::Write {
                    fh: u64_at(op, 0),
                    offset: u64_at(op, 8),
                    data: payload[..size].to_vec(),
                    flags: u32_at(op, 32) as i32,
                    kill_suidgid: u32_at(op, 20) & FUSE_WRITE_KILL_SUIDGID != 0,
                }
            }
            17 => Op::Statfs,
            18 => Op::Release { fh: u64_at(op, 0) },
            20 => Op::Fsync { fh: u64_at(op, 0) },
            21 => {
                let (name, rest) = cstr(payload)?;
                let size = (u32_at(op, 0) as usize).min(rest.len());
                Op::Setxattr { name, value: rest[..size].to_vec(), flags: u32_at(op, 4) as i32 }
            }
            22 => Op::Getxattr { name: cstr(payload)?.0, size: u32_at(op, 0) },
            23 => Op::Listxattr { size: u32_at(op, 0) },
            24 => Op::Removexattr { name: cstr(payload)?.0 },
            25 => Op::Flush,
            27 => Op::Opendir,
            28 | 44 => {
                Op::Readdir { fh: u64_at(op, 0), offset: u64_at(op, 8), size: u32_at(op, 16), plus: opcode == 44 }
            }
            29 => Op::Releasedir { fh: u64_at(op, 0) },
            30 => Op::Fsyncdir,
            34 => Op::Access { mask: u32_at(op, 0) as i32 },
            35 => Op::Create {
                name: cstr(payload)?.0,
                flags: u32_at(op, 0) as i32,
                mode: u32_at(op, 4),
                umask: u32_at(op, 8),
            },
            other => Op::Unsupported { opcode: other },
        })
    }

    /// The operation's name in the mount's counters.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Lookup { .. } => "lookup",
            Op::Getattr => "getattr",
            Op::Setattr { .. } => "setattr",
            Op::Readlink => "readlink",
            Op::Symlink { .. } => "symlink",
            Op::Mknod { .. } => "mknod",
            Op::Mkdir { .. } => "mkdir",
            Op::Unlink { .. } => "unlink",
            Op::Rmdir { .. } => "rmdir",
            Op::Rename { .. } => "rename",
            Op::Link { .. } => "link",
            Op::Open { .. } => "open",
            Op::Read { .. } => "read",
            Op::Write { .. } => "write",
            Op::Statfs => "statfs",
            Op::Release { .. } => "release",
            Op::Fsync { .. } => "fsync",
            Op::Setxattr { .. } => "setxattr",
            Op::Getxattr { .. } => "getxattr",
            Op::Listxattr { .. } => "listxattr",
            Op::Removexattr { .. } => "removexattr",
            Op::Flush => "flush",
            Op::Opendir => "opendir",
            Op::Readdir { plus: false, .. } => "readdir",
            Op::Readdir { plus: true, .. } => "readdirplus",
            Op::Releasedir { .. } => "releasedir",
            Op::Fsyncdir => "fsyncdir",
            Op::Access { .. } => "access",
            Op::Create { .. } => "create",
            Op::Unsupported { .. } => "unsupported",
        }
    }
}

/// Writes `v` little-endian at `at` of `out`.
fn put_u32(out: &mut [u8], at: usize, v: u32) {
    out[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// Writes `v` little-endian at `at` of `out`.
fn put_u64(out: &mut [u8], at: usize, v: u64) {
    out[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Size of `fuse_attr`.
pub const ATTR_SIZE: usize = 88;
/// Size of `fuse_entry_out`.
pub const ENTRY_OUT_SIZE: usize = 40 + ATTR_SIZE;
/// Size of `fuse_attr_out`.
pub const ATTR_OUT_SIZE: usize = 16 + ATTR_SIZE;
/// Size of `fuse_open_out`.
pub const OPEN_OUT_SIZE: usize = 16;
/// Size of `fuse_kstatfs`.
pub const STATFS_OUT_SIZE: usize = 80;

/// Encodes `a` as a `fuse_attr` into `out` (88 bytes).
pub fn put_attr(out: &mut [u8], a: &Attr) {
    put_u64(out, 0, a.ino);
    put_u64(out, 8, a.size);
    put_u64(out, 16, a.size.div_ceil(512));
    put_u64(out, 24, a.atime.sec as u64);
    put_u64(out, 32, a.mtime.sec as u64);
    put_u64(out, 40, a.ctime.sec as u64);
    put_u32(out, 48, a.atime.nsec);
    put_u32(out, 52, a.mtime.nsec);
    put_u32(out, 56, a.ctime.nsec);
    put_u32(out, 60, a.kind.mode_bits() | (a.mode & 0o7777));
    put_u32(out, 64, a.nlink);
    put_u32(out, 68, a.uid);
    put_u32(out, 72, a.gid);
    put_u32(out, 76, a.rdev);
    put_u32(out, 80, 4096);
    put_u32(out, 84, 0);
}

/// Encodes a `fuse_entry_out` for `a` (inode `ino`, 0 for a cached miss) into `out`.
pub fn put_entry(out: &mut [u8], ino: u64, a: &Attr, entry_ttl: Duration, attr_ttl: Duration) {
    put_u64(out, 0, ino);
    put_u64(out, 8, 0);
    put_u64(out, 16, entry_ttl.as_secs());
    put_u64(out, 24, attr_ttl.as_secs());
    put_u32(out, 32, entry_ttl.subsec_nanos());
    put_u32(out, 36, attr_ttl.subsec_nanos());
    put_attr(&mut out[40..], a);
}

/// Encodes a `fuse_attr_out` for `a` into `out`.
pub fn put_attr_out(out: &mut [u8], a: &Attr, ttl: Duration) {
    put_u64(out, 0, ttl.as_secs());
    put_u32(out, 8, ttl.subsec_nanos());
    put_u32(out, 12, 0);
    put_attr(&mut out[16..], a);
}

/// Encodes a `fuse_open_out` into `out`.
pub fn put_open(out: &mut [u8], fh: u64, open_flags: u32) {
    put_u64(out, 0, fh);
    put_u32(out, 8, open_flags);
    put_u32(out, 12, 0);
}

/// Encodes a `u32` answer followed by padding (`fuse_write_out`, `fuse_getxattr_out`).
pub fn put_size(out: &mut [u8], n: u32) {
    put_u32(out, 0, n);
    put_u32(out, 4, 0);
}

/// Encodes a `fuse_kstatfs` into `out`.
pub fn put_statfs(out: &mut [u8], s: &crate::core::FsStats) {
    out[..STATFS_OUT_SIZE].fill(0);
    put_u64(out, 0, s.blocks);
    put_u64(out, 8, s.bfree);
    put_u64(out, 16, s.bavail);
    put_u64(out, 24, s.files);
    put_u64(out, 32, s.ffree);
    put_u32(out, 40, s.bsize);
    put_u32(out, 44, s.namelen);
    put_u32(out, 48, s.frsize);
}

/// Size of a `fuse_dirent` naming `name` (padded to 8 bytes).
pub fn dirent_size(name: &str) -> usize {
    (24 + name.len()).next_multiple_of(8)
}

/// Encodes a `fuse_dirent` into `out` (which holds `dirent_size(name)` bytes).
pub fn put_dirent(out: &mut [u8], ino: u64, next: u64, kind: FileKind, name: &str) {
    let size = dirent_size(name);
    put_u64(out, 0, ino);
    put_u64(out, 8, next);
    put_u32(out, 16, name.len() as u32);
    put_u32(out, 20, u32::from(kind.dirent_type()));
    out[24..24 + name.len()].copy_from_slice(name.as_bytes());
    out[24 + name.len()..size].fill(0);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setattr_in(valid: u32) -> Vec<u8> {
        let mut op = vec![0u8; OP_IN_SIZE];
        put_u32(&mut op, 0, valid);
        put_u64(&mut op, 8, 7);
        put_u64(&mut op, 16, 4096);
        put_u64(&mut op, 32, 100);
        put_u32(&mut op, 56, 5);
        put_u32(&mut op, 68, 0o104755);
        put_u32(&mut op, 76, 1000);
        op
    }

    #[test]
    fn a_setattr_takes_only_the_fields_marked_valid() {
        let op = setattr_in(FATTR_MODE | FATTR_SIZE | FATTR_ATIME | FATTR_FH);
        let Op::Setattr { set, fh } = Op::parse(4, &op, &[]).unwrap() else { panic!("not a setattr") };
        assert_eq!(set.mode, Some(0o4755));
        assert_eq!(set.size, Some(4096));
        assert_eq!(set.uid, None);
        assert_eq!(set.atime, Some(TimeSet::At(Timespec { sec: 100, nsec: 5 })));
        assert_eq!(set.mtime, None);
        assert_eq!(fh, Some(7));
        let Op::Setattr { set, fh } = Op::parse(4, &setattr_in(FATTR_MTIME | FATTR_MTIME_NOW), &[]).unwrap() else {
            panic!("not a setattr")
        };
        assert_eq!((set.mtime, fh), (Some(TimeSet::Now), None));
    }

    #[test]
    fn names_come_from_the_payload_and_a_missing_nul_is_einval() {
        let op = vec![0u8; OP_IN_SIZE];
        assert_eq!(Op::parse(1, &op, b"a name\0").unwrap(), Op::Lookup { name: "a name".into() });
        assert_eq!(Op::parse(1, &op, b"no end"), Err(libc::EINVAL));
        let sym = Op::parse(6, &op, b"link\0/some/target\0").unwrap();
        assert_eq!(sym, Op::Symlink { name: "link".into(), target: "/some/target".into() });
        let mut rename2 = vec![0u8; OP_IN_SIZE];
        put_u64(&mut rename2, 0, 42);
        put_u32(&mut rename2, 8, RENAME_EXCHANGE);
        let r = Op::parse(45, &rename2, b"a\0b\0").unwrap();
        assert_eq!(r, Op::Rename { name: "a".into(), newdir: 42, newname: "b".into(), how: RenameHow::Exchange });
        put_u32(&mut rename2, 8, 4);
        assert_eq!(Op::parse(45, &rename2, b"a\0b\0"), Err(libc::EINVAL));
    }

    #[test]
    fn writes_and_xattr_values_are_cut_to_their_stated_size() {
        let mut op = vec![0u8; OP_IN_SIZE];
        put_u64(&mut op, 8, 12);
        put_u32(&mut op, 16, 3);
        put_u32(&mut op, 20, FUSE_WRITE_KILL_SUIDGID);
        let Op::Write { offset, data, kill_suidgid, .. } = Op::parse(16, &op, b"abcdef").unwrap() else {
            panic!("not a write")
        };
        assert_eq!((offset, data.as_slice(), kill_suidgid), (12, &b"abc"[..], true));
        let mut x = vec![0u8; OP_IN_SIZE];
        put_u32(&mut x, 0, 2);
        let set = Op::parse(21, &x, b"user.k\0vvv").unwrap();
        assert_eq!(set, Op::Setxattr { name: "user.k".into(), value: b"vv".to_vec(), flags: 0 });
    }

    #[test]
    fn replies_have_the_kernel_layout() {
        let a = Attr {
            ino: 9,
            kind: FileKind::Dir,
            mode: 0o40755,
            size: 1000,
            nlink: 2,
            uid: 1,
            gid: 2,
            ..crate::core::stats_attr()
        };
        let mut e = [0u8; ENTRY_OUT_SIZE];
        put_entry(&mut e, 9, &a, Duration::from_millis(1500), Duration::ZERO);
        assert_eq!(u64_at(&e, 0), 9);
        assert_eq!((u64_at(&e, 16), u32_at(&e, 32)), (1, 500_000_000));
        assert_eq!(u64_at(&e, 40 + 8), 1000);
        assert_eq!(u64_at(&e, 40 + 16), 2, "blocks of 512 bytes");
        assert_eq!(u32_at(&e, 40 + 60), libc::S_IFDIR | 0o755);
        let mut d = vec![0u8; dirent_size("abc")];
        assert_eq!(d.len(), 32);
        put_dirent(&mut d, 5, 6, FileKind::Symlink, "abc");
        assert_eq!(u32_at(&d, 20), libc::DT_LNK as u32);
        assert_eq!(&d[24..27], b"abc");
    }
}
