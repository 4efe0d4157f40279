//! Serving a request that came over io_uring: the decoded [`Op`] calls the mount core
//! through the [`Runner`] (as the `/dev/fuse` adapter does) and the answer is encoded into
//! the entry's payload buffer.

use super::abi::{self, InHeader, Op, RenameHow};
use super::ring::Slot;
use crate::core::{stats_attr, Entry, Errno, FsStats, MountCore, RenameMode, XattrReply, STATS_INO};
use crate::runner::Runner;
use plusfs_proto::Attr;
use std::sync::Arc;
use std::time::Duration;

/// Answers `r` with no out arguments.
fn empty(slot: Slot, r: Result<(), Errno>) {
    match r {
        Ok(()) => slot.send(0, 0),
        Err(e) => slot.send(e.raw(), 0),
    }
}

/// Answers with `fuse_entry_out`; a missing name is kept by the kernel as a negative
/// entry (inode 0) for its entry TTL.
fn entry(mut slot: Slot, r: Result<Entry, Errno>) {
    match r {
        Ok(Entry { attr: Some(a), ttls }) => {
            abi::put_entry(slot.payload(), a.ino, &a, ttls.entry, ttls.attr);
            slot.send(0, abi::ENTRY_OUT_SIZE)
        }
        Ok(Entry { attr: None, ttls }) => {
            abi::put_entry(slot.payload(), 0, &stats_attr(), ttls.entry, Duration::ZERO);
            slot.send(0, abi::ENTRY_OUT_SIZE)
        }
        Err(e) => slot.send(e.raw(), 0),
    }
}

/// Answers with `fuse_attr_out`.
fn attr(mut slot: Slot, r: Result<(Attr, Duration), Errno>) {
    match r {
        Ok((a, ttl)) => {
            abi::put_attr_out(slot.payload(), &a, ttl);
            slot.send(0, abi::ATTR_OUT_SIZE)
        }
        Err(e) => slot.send(e.raw(), 0),
    }
}

/// Answers with raw bytes (read, readlink, xattr values).
fn data(mut slot: Slot, r: Result<Vec<u8>, Errno>) {
    match r {
        Ok(d) => {
            let n = d.len().min(slot.payload().len());
            slot.payload()[..n].copy_from_slice(&d[..n]);
            slot.send(0, n)
        }
        Err(e) => slot.send(e.raw(), 0),
    }
}

fn xattr(mut slot: Slot, r: Result<XattrReply, Errno>) {
    match r {
        Ok(XattrReply::Size(n)) => {
            abi::put_size(slot.payload(), n);
            slot.send(0, 8)
        }
        Ok(XattrReply::Data(v)) => data(slot, Ok(v)),
        Err(e) => slot.send(e.raw(), 0),
    }
}

fn opened(mut slot: Slot, r: Result<(u64, u32), Errno>) {
    match r {
        Ok((fh, flags)) => {
            abi::put_open(slot.payload(), fh, flags);
            slot.send(0, abi::OPEN_OUT_SIZE)
        }
        Err(e) => slot.send(e.raw(), 0),
    }
}

fn statfs(mut slot: Slot, r: Result<FsStats, Errno>) {
    match r {
        Ok(s) => {
            abi::put_statfs(slot.payload(), &s);
            slot.send(0, abi::STATFS_OUT_SIZE)
        }
        Err(e) => slot.send(e.raw(), 0),
    }
}

/// Serves one decoded request (`Err`: the errno of a malformed one).
pub(crate) fn serve(r: &Runner, h: InHeader, op: Result<Op, i32>, slot: Slot) {
    match op {
        Ok(Op::Unsupported { opcode }) => {
            tracing::debug!(opcode, "FUSE operation not implemented");
            slot.send(libc::ENOSYS, 0)
        }
        Ok(op @ (Op::Getxattr { .. } | Op::Listxattr { .. } | Op::Setxattr { .. } | Op::Removexattr { .. }))
            if !r.xattrs() =>
        {
            r.core.count_local(op.name(), false);
            slot.send(libc::ENOSYS, 0)
        }
        Ok(op) => run(r, h, op, slot),
        Err(errno) => {
            tracing::warn!(opcode = h.opcode, errno, "malformed FUSE request");
            slot.send(errno, 0)
        }
    }
}

/// Runs `op` on the core and answers through `slot`.
fn run(r: &Runner, h: InHeader, op: Op, slot: Slot) {
    let (ino, name) = (h.nodeid, op.name());
    let who = r.caller(h.uid, h.gid, h.pid);
    match op {
        Op::Lookup { name: n } => {
            let (core, looked_up) = (r.core.clone(), n.clone());
            // A missing name is counted as a failed lookup, then answered as a negative entry.
            r.spawn(
                name,
                move |c| async move { c.lookup(&who, ino, &looked_up).await },
                move |x| entry(slot, core.lookup_answer(ino, &n, x)),
            )
        }
        Op::Getattr => r.spawn(
            name,
            move |c| async move {
                let x = c.getattr(&who, ino).await;
                c.attr_answer(ino, x)
            },
            move |x| attr(slot, x),
        ),
        Op::Setattr { set, fh } => r.spawn(
            name,
            move |c| async move {
                let x = c.setattr(&who, ino, set, fh).await;
                c.attr_answer(ino, x)
            },
            move |x| attr(slot, x),
        ),
        Op::Readlink => r.spawn(
            name,
            move |c| async move { c.readlink(&who, ino).await.map(String::into_bytes) },
            move |x| data(slot, x),
        ),
        Op::Symlink { name: n, target } => r.spawn(
            name,
            move |c| async move {
                let x = c.symlink(&who, ino, &n, std::path::Path::new(&target)).await;
                c.entry_answer(ino, &n, x)
            },
            move |x| entry(slot, x),
        ),
        Op::Mknod { name: n, mode, rdev, umask } => r.spawn(
            name,
            move |c| async move {
                let x = c.mknod(&who, ino, &n, mode, umask, rdev).await;
                c.entry_answer(ino, &n, x)
            },
            move |x| entry(slot, x),
        ),
        Op::Mkdir { name: n, mode, umask } => r.spawn(
            name,
            move |c| async move {
                let x = c.mkdir(&who, ino, &n, mode, umask).await;
                c.entry_answer(ino, &n, x)
            },
            move |x| entry(slot, x),
        ),
        Op::Unlink { name: n } => {
            r.spawn(name, move |c| async move { c.unlink(&who, ino, &n).await }, move |x| empty(slot, x))
        }
        Op::Rmdir { name: n } => {
            r.spawn(name, move |c| async move { c.rmdir(&who, ino, &n).await }, move |x| empty(slot, x))
        }
        Op::Rename { name: n, newdir, newname, how } => {
            let mode = match how {
                RenameHow::Replace => RenameMode::Replace,
                RenameHow::NoReplace => RenameMode::NoReplace,
                RenameHow::Exchange => RenameMode::Exchange,
            };
            let call = move |c: Arc<MountCore>| async move { c.rename(&who, ino, &n, newdir, &newname, mode).await };
            r.spawn(name, call, move |x| empty(slot, x))
        }
        Op::Link { oldnode, newname } => r.spawn(
            name,
            move |c| async move {
                let x = c.link(&who, oldnode, ino, &newname).await;
                c.entry_answer(ino, &newname, x)
            },
            move |x| entry(slot, x),
        ),
        op => run_files(r, h, op, slot, who),
    }
}

/// The flags of an open file's answer: the control file bypasses the page cache, a file
/// opened read-only needs no FLUSH at close.
fn open_flags(ino: u64, flags: i32, keep_cache: bool) -> u32 {
    let base = if ino == STATS_INO {
        abi::FOPEN_DIRECT_IO
    } else if flags & libc::O_ACCMODE == libc::O_RDONLY {
        abi::FOPEN_NOFLUSH
    } else {
        0
    };
    base | if keep_cache { abi::FOPEN_KEEP_CACHE } else { 0 }
}

/// The operations on open files, directories and attributes (`run` continued).
fn run_files(r: &Runner, h: InHeader, op: Op, slot: Slot, who: crate::core::Caller) {
    let (ino, name) = (h.nodeid, op.name());
    match op {
        Op::Open { flags } => r.spawn(
            name,
            move |c| async move { c.open(&who, ino, flags).await.map(|o| (o.fh, open_flags(ino, flags, o.keep_cache))) },
            move |x| opened(slot, x),
        ),
        Op::Read { fh, offset, size } => {
            r.spawn(name, move |c| async move { c.read(ino, fh, offset, size).await }, move |x| data(slot, x))
        }
        Op::Write { fh, offset, data: bytes, flags, kill_suidgid } => {
            let call = move |c: Arc<MountCore>| async move {
                if kill_suidgid {
                    c.kill_suidgid(ino, fh).await?;
                }
                c.write(ino, fh, offset, &bytes, flags).await
            };
            r.spawn(name, call, move |x| match x {
                Ok(n) => {
                    let mut slot = slot;
                    abi::put_size(slot.payload(), n);
                    slot.send(0, 8)
                }
                Err(e) => slot.send(e.raw(), 0),
            })
        }
        Op::Statfs => r.spawn(name, |c| async move { c.statfs().await }, move |x| statfs(slot, x)),
        Op::Release { fh } => r.spawn(name, move |c| async move { c.release(ino, fh).await }, move |x| empty(slot, x)),
        Op::Fsync { fh } => r.spawn(name, move |c| async move { c.fsync(ino, fh).await }, move |x| empty(slot, x)),
        Op::Setxattr { name: n, value, flags } => r.spawn(
            name,
            move |c| async move { c.setxattr(&who, ino, &n, &value, flags).await },
            move |x| empty(slot, x),
        ),
        Op::Getxattr { name: n, size } => r.spawn(
            name,
            move |c| async move { c.getxattr(&who, ino, &n, size).await },
            move |x| xattr(slot, x),
        ),
        Op::Listxattr { size } => {
            r.spawn(name, move |c| async move { c.listxattr(&who, ino, size).await }, move |x| xattr(slot, x))
        }
        Op::Removexattr { name: n } => {
            r.spawn(name, move |c| async move { c.removexattr(&who, ino, &n).await }, move |x| empty(slot, x))
        }
        Op::Flush => r.spawn(name, move |c| async move { c.flush(ino).await }, move |x| empty(slot, x)),
        Op::Opendir => r.spawn(
            name,
            move |c| async move { c.opendir(&who, ino).await.map(|fh| (fh, 0)) },
            move |x| opened(slot, x),
        ),
        Op::Readdir { fh, offset, size, plus: false } => r.spawn(
            name,
            move |c| async move { c.readdir_items(ino, fh, offset).await },
            move |x| match x {
                Ok(items) => listing(slot, size, items.iter().map(|i| i.as_dir_item())),
                Err(e) => slot.send(e.raw(), 0),
            },
        ),
        Op::Readdir { fh, offset, size, plus: true } => {
            let core = r.core.clone();
            r.spawn(
                name,
                move |c| async move { c.readdirplus_items(ino, fh, offset).await },
                move |x| match x {
                    Ok(items) => listing_plus(slot, size, &items, &core, ino),
                    Err(e) => slot.send(e.raw(), 0),
                },
            )
        }
        Op::Releasedir { fh } => {
            r.core.releasedir(fh);
            r.core.count_local("releasedir", true);
            slot.send(0, 0)
        }
        Op::Fsyncdir => r.spawn(name, |c| async move { c.sync().await }, move |x| empty(slot, x)),
        Op::Access { mask } => {
            r.spawn(name, move |c| async move { c.access(&who, ino, mask).await }, move |x| empty(slot, x))
        }
        Op::Create { name: n, mode, umask, flags } => r.spawn(
            name,
            move |c| async move {
                let (a, fh) = c.create(&who, ino, &n, mode, umask, flags).await?;
                let ttl = c.plus_ttl(ino, &n, &a);
                Ok((a, fh, ttl))
            },
            move |x| match x {
                Ok((a, fh, ttl)) => {
                    let mut slot = slot;
                    abi::put_entry(slot.payload(), a.ino, &a, ttl, ttl);
                    abi::put_open(&mut slot.payload()[abi::ENTRY_OUT_SIZE..], fh, 0);
                    slot.send(0, abi::ENTRY_OUT_SIZE + abi::OPEN_OUT_SIZE)
                }
                Err(e) => slot.send(e.raw(), 0),
            },
        ),
        other => {
            tracing::error!(op = other.name(), "FUSE operation reached the wrong table");
            slot.send(libc::ENOSYS, 0)
        }
    }
}

/// Answers a `readdir` with as many entries as fit in `size` bytes.
fn listing<'a>(mut slot: Slot, size: u32, items: impl Iterator<Item = crate::core::DirItem<'a>>) {
    let limit = (size as usize).min(slot.payload().len());
    let mut at = 0;
    for i in items {
        let n = abi::dirent_size(i.name);
        if at + n > limit {
            break;
        }
        abi::put_dirent(&mut slot.payload()[at..at + n], i.ino, i.offset, i.kind, i.name);
        at += n;
    }
    slot.send(0, at)
}

/// Answers a `readdirplus` of directory `dir` with as many entries as fit in `size` bytes,
/// telling `core` of each before the answer goes (the kernel holds a lookup on each entry it
/// receives and may use it at once, from another queue).
fn listing_plus(mut slot: Slot, size: u32, items: &[crate::core::PlusItem], core: &MountCore, dir: u64) {
    let limit = (size as usize).min(slot.payload().len());
    let mut at = 0;
    for item in items {
        let i = item.as_dir_plus();
        let n = abi::ENTRY_OUT_SIZE + abi::dirent_size(i.name);
        if at + n > limit {
            break;
        }
        let ttl = core.plus_ttl(dir, i.name, i.attr);
        let buf = &mut slot.payload()[at..at + n];
        abi::put_entry(buf, i.ino, i.attr, ttl, ttl);
        abi::put_dirent(&mut buf[abi::ENTRY_OUT_SIZE..], i.ino, i.offset, i.attr.kind, i.name);
        core.handed_out(item);
        at += n;
    }
    slot.send(0, at);
}
