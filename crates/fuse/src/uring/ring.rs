//! The ring queues: one io_uring per CPU, each with `depth` entries the kernel fills with
//! requests. An entry cycles: registered (or committed) → the kernel puts a request in its
//! buffers and completes the command → the mount serves it → the answer is written into
//! the same buffers and committed with `COMMIT_AND_FETCH`, which also waits for the next
//! request. The thread of a queue is pinned to its CPU (the kernel queues a request on the
//! queue of the CPU its caller runs on) and submits the commits it gathered with its next
//! wait; an answer found later by a runtime task submits its commit itself.
//!
//! The only unsafe code of the transport is here: buffers shared with the kernel, and the
//! rule that an entry's buffers belong to whoever holds its [`Slot`] (one at a time).

use super::abi::{self, InHeader, Op};
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::cell::Cell;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

thread_local! {
    /// True on a queue's own thread: its commits go out with its next wait.
    static ON_RING_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// What serves a request: its header, its decoded operation (or the errno of a malformed
/// one), and the slot to answer through.
pub(crate) type Serve<'a> = dyn Fn(InHeader, Result<Op, i32>, Slot) + 'a;

/// A page-aligned buffer the kernel reads and writes.
struct Buf {
    ptr: *mut u8,
    len: usize,
}

// The buffer is plain memory; who may touch it when is the `Slot` rule.
unsafe impl Send for Buf {}
unsafe impl Sync for Buf {}

impl Buf {
    /// `len` bytes of anonymous memory: pages cost memory only once a request touches them.
    fn new(len: usize) -> std::io::Result<Buf> {
        // SAFETY: a fresh private anonymous mapping, unmapped only by `drop`.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        match ptr == libc::MAP_FAILED {
            true => Err(std::io::Error::last_os_error()),
            false => Ok(Buf { ptr: ptr.cast(), len }),
        }
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: the mapping made by `new`, no longer used (its queue is gone).
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// One ring entry: its header and payload buffers and the command it last sent.
struct Ent {
    header: Buf,
    payload: Buf,
    /// The two buffers as the kernel is given them at registration (kept in place).
    iov: Box<[libc::iovec; 2]>,
    last_cmd: AtomicU32,
    /// The kernel ended the entry's last command without a request (registered again once).
    ended: AtomicBool,
    /// The `unique` of the request the entry holds now (its commit id).
    commit_id: AtomicU64,
}

// The iovec pointers only describe the entry's own buffers.
unsafe impl Send for Ent {}
unsafe impl Sync for Ent {}

/// One queue: an io_uring bound to one CPU and its entries.
pub(crate) struct Queue {
    qid: u16,
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    /// Held while an entry is pushed onto the submission queue.
    sq: Mutex<()>,
    ents: Box<[Ent]>,
    /// Requests served through this queue.
    pub served: AtomicU64,
}

/// Why a queue's thread stopped.
#[derive(Debug)]
pub(crate) enum Stopped {
    /// The file system was unmounted (the kernel ended the commands).
    Unmounted,
    /// The kernel refused a command (registration refused, or a ring error).
    Failed(std::io::Error),
}

impl Queue {
    /// A queue `qid` of `depth` entries of `payload` bytes each, on `/dev/fuse` clone `fuse`.
    pub fn new(qid: u16, depth: usize, payload: usize, fuse: RawFd) -> std::io::Result<Queue> {
        let depth_u32 = u32::try_from(depth).map_err(std::io::Error::other)?;
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .setup_cqsize(2 * depth_u32)
            .build(depth_u32.next_power_of_two())?;
        ring.submitter().register_files(&[fuse])?;
        let ents = (0..depth)
            .map(|_| {
                let (header, payload) = (Buf::new(4096)?, Buf::new(payload)?);
                let iov = Box::new([
                    libc::iovec { iov_base: header.ptr.cast(), iov_len: abi::HEADER_SIZE },
                    libc::iovec { iov_base: payload.ptr.cast(), iov_len: payload.len },
                ]);
                Ok(Ent {
                    header,
                    payload,
                    iov,
                    last_cmd: AtomicU32::new(0),
                    ended: AtomicBool::new(false),
                    commit_id: AtomicU64::new(0),
                })
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Queue { qid, ring, sq: Mutex::new(()), ents: ents.into(), served: AtomicU64::new(0) })
    }

    /// The queue's number (the CPU it serves).
    pub fn qid(&self) -> u16 {
        self.qid
    }

    /// The command for entry `idx`: `cmd_op` with `fuse_uring_cmd_req { flags, commit_id,
    /// qid }`, and for a registration the entry's two buffers.
    fn command(&self, idx: usize, cmd_op: u32) -> squeue::Entry128 {
        let ent = &self.ents[idx];
        let mut cmd = [0u8; 80];
        if cmd_op == abi::CMD_COMMIT_AND_FETCH {
            cmd[8..16].copy_from_slice(&ent.commit_id.load(Ordering::Acquire).to_le_bytes());
        }
        cmd[16..18].copy_from_slice(&self.qid.to_le_bytes());
        let mut sqe = opcode::UringCmd80::new(types::Fixed(0), cmd_op).cmd(cmd);
        if cmd_op == abi::CMD_REGISTER {
            sqe = sqe.addr(Some(ent.iov.as_ptr() as u64));
        }
        ent.last_cmd.store(cmd_op, Ordering::Release);
        let sqe = sqe.build().user_data(idx as u64);
        match cmd_op {
            // The kernel reads the number of buffers from the entry's `len` field, which
            // `UringCmd80` does not set: bytes 24..28 of the 128-byte entry.
            abi::CMD_REGISTER => {
                // SAFETY: `Entry128` is `repr(C)`, 128 bytes of plain integers.
                let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
                raw[24..28].copy_from_slice(&2u32.to_le_bytes());
                unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
            }
            _ => sqe,
        }
    }

    /// Queues `sqe`; submits it at once unless this is the queue's thread (which submits
    /// with its next wait).
    fn push(&self, sqe: squeue::Entry128) {
        {
            let _pushing = self.sq.lock().expect("ring submission queue");
            // SAFETY: the lock makes this the only submission queue view in use; the entry
            // points only to buffers that live as long as the queue.
            let mut sq = unsafe { self.ring.submission_shared() };
            // At most `depth` commands are ever outstanding, and the queue holds them all.
            if unsafe { sq.push(&sqe) }.is_err() {
                tracing::error!(qid = self.qid, "io_uring submission queue full: a FUSE request is lost");
            }
            sq.sync();
        }
        if !ON_RING_THREAD.get() {
            if let Err(e) = self.ring.submitter().submit() {
                tracing::error!(qid = self.qid, error = %e, "cannot submit a FUSE answer over io_uring");
            }
        }
    }

    /// The queue's loop: registers every entry and tells `started` whether the kernel took
    /// them (it refuses at once: io_uring off, a buffer too small), then waits for requests,
    /// hands each to `serve` with its entry's [`Slot`], and submits the answers gathered
    /// meanwhile with the next wait. Returns when the file system is unmounted or the
    /// kernel refuses a command.
    pub fn run(self: &Arc<Queue>, serve: &Serve<'_>, started: impl FnOnce(std::io::Result<()>)) -> Stopped {
        ON_RING_THREAD.set(true);
        pin_to_cpu(self.qid as usize);
        for idx in 0..self.ents.len() {
            self.push(self.command(idx, abi::CMD_REGISTER));
        }
        let mut done = Vec::with_capacity(self.ents.len());
        if let Err(e) = self.ring.submitter().submit() {
            started(Err(std::io::Error::new(e.kind(), format!("registering the ring entries: {e}"))));
            return Stopped::Failed(e);
        }
        self.completed(&mut done);
        if let Some(&(_, res)) = done.iter().find(|(_, res)| *res < 0 && *res != -libc::EAGAIN && *res != -libc::EINTR)
        {
            let e = std::io::Error::from_raw_os_error(-res);
            started(Err(std::io::Error::new(e.kind(), format!("the kernel refused the ring entries: {e}"))));
            return Stopped::Failed(e);
        }
        started(Ok(()));
        loop {
            if let Some(stopped) = self.handle(&done, serve) {
                return stopped;
            }
            // An interrupted wait (a signal, a stopped process) still reads what completed.
            if let Err(e) = self.ring.submitter().submit_and_wait(1) {
                if !matches!(e.raw_os_error(), Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)) {
                    return Stopped::Failed(e);
                }
            }
            self.completed(&mut done);
        }
    }

    /// Replaces `done` with the completions waiting (entry, result).
    fn completed(&self, done: &mut Vec<(usize, i32)>) {
        done.clear();
        // SAFETY: only the queue's thread reads the completion queue.
        done.extend(unsafe { self.ring.completion_shared() }.map(|c| (c.user_data() as usize, c.result())));
    }

    /// Handles completions: serves requests, resends interrupted commands, registers again an
    /// entry whose command the kernel ended (a cancelled command); `Some` when the queue must
    /// stop: an entry ended twice in a row (the connection is gone) or a command refused.
    /// Every request of the batch is served first, so none is left unanswered.
    fn handle(self: &Arc<Queue>, done: &[(usize, i32)], serve: &Serve<'_>) -> Option<Stopped> {
        let mut stop = None;
        for &(idx, res) in done {
            let ent = &self.ents[idx];
            match res {
                0 => {
                    ent.ended.store(false, Ordering::Relaxed);
                    self.serve_entry(idx, serve)
                }
                r if r == -libc::EAGAIN || r == -libc::EINTR => {
                    self.push(self.command(idx, ent.last_cmd.load(Ordering::Acquire)))
                }
                r if (r == -libc::ENOTCONN || r == -libc::ECANCELED) && !ent.ended.swap(true, Ordering::Relaxed) => {
                    self.push(self.command(idx, abi::CMD_REGISTER))
                }
                r if r == -libc::ENOTCONN || r == -libc::ENODEV || r == -libc::ECANCELED => {
                    stop.get_or_insert(Stopped::Unmounted);
                }
                r => {
                    stop.get_or_insert(Stopped::Failed(std::io::Error::from_raw_os_error(-r)));
                }
            }
        }
        stop
    }

    /// Entry `idx` holds a request: decode it and hand it on with the entry's slot.
    fn serve_entry(self: &Arc<Queue>, idx: usize, serve: &Serve<'_>) {
        let ent = &self.ents[idx];
        let (h, op) = {
            // SAFETY: the kernel completed the entry's command, so the entry is ours until
            // it is committed; these views end here, before a slot exists to answer with.
            let header = unsafe { std::slice::from_raw_parts(ent.header.ptr, abi::HEADER_SIZE) };
            let h = InHeader::parse(&header[..abi::IN_OUT_SIZE]);
            let ent_in_out = &header[abi::ENT_IN_OUT..];
            let commit_id = u64::from_le_bytes(ent_in_out[8..16].try_into().expect("8 bytes"));
            let payload_len =
                (u32::from_le_bytes(ent_in_out[16..20].try_into().expect("4 bytes")) as usize).min(ent.payload.len);
            ent.commit_id.store(commit_id, Ordering::Release);
            let payload = unsafe { std::slice::from_raw_parts(ent.payload.ptr, payload_len) };
            (h, Op::parse(h.opcode, &header[abi::IN_OUT_SIZE..abi::ENT_IN_OUT], payload))
        };
        self.served.fetch_add(1, Ordering::Relaxed);
        let slot = Slot { queue: self.clone(), idx, unique: h.unique, answered: false };
        serve(h, op, slot);
    }
}

/// Binds the calling thread to `cpu` (the kernel queues the requests of callers running
/// there on this queue); logs when that is not allowed.
fn pin_to_cpu(cpu: usize) {
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            tracing::warn!(cpu, error = %std::io::Error::last_os_error(), "cannot pin a FUSE ring thread to its CPU");
        }
    }
}

/// The right to answer the request an entry holds: the entry's payload buffer to write the
/// answer into, and the commit. Dropped unanswered (a panic), it answers `EIO`.
pub(crate) struct Slot {
    queue: Arc<Queue>,
    idx: usize,
    unique: u64,
    answered: bool,
}

impl Slot {
    /// The entry's payload buffer, where the answer's out arguments go.
    pub fn payload(&mut self) -> &mut [u8] {
        let ent = &self.queue.ents[self.idx];
        // SAFETY: the slot is the one holder of the entry until it commits.
        unsafe { std::slice::from_raw_parts_mut(ent.payload.ptr, ent.payload.len) }
    }

    /// Answers with `error` (0 or a positive errno) and the first `len` payload bytes.
    pub fn send(mut self, error: i32, len: usize) {
        self.commit(error, len);
    }

    fn commit(&mut self, error: i32, len: usize) {
        self.answered = true;
        let ent = &self.queue.ents[self.idx];
        let len = if error == 0 { len.min(ent.payload.len) } else { 0 };
        // SAFETY: as in `payload`.
        let header = unsafe { std::slice::from_raw_parts_mut(ent.header.ptr, abi::HEADER_SIZE) };
        header[0..4].copy_from_slice(&(16 + len as u32).to_le_bytes());
        header[4..8].copy_from_slice(&(-error).to_le_bytes());
        header[8..16].copy_from_slice(&self.unique.to_le_bytes());
        let at = abi::ENT_IN_OUT + 16;
        header[at..at + 4].copy_from_slice(&(len as u32).to_le_bytes());
        let sqe = self.queue.command(self.idx, abi::CMD_COMMIT_AND_FETCH);
        self.queue.push(sqe);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if !self.answered {
            self.commit(libc::EIO, 0);
        }
    }
}
