//! How a mount runs one kernel request, whichever transport brought it: the call is
//! polled once on the thread that received the request and, when it has to wait, goes on
//! as a task of the mount's runtime. Both the `/dev/fuse` adapter and the io_uring
//! transport answer through here.

use crate::callers::Callers;
use crate::core::{Caller, Errno, MountCore};
use std::future::Future;
use std::sync::Arc;

/// What every transport needs to serve a request: the core, the runtime's handle and who
/// calls.
pub(crate) struct Runner {
    pub core: Arc<MountCore>,
    rt: tokio::runtime::Handle,
    callers: Callers,
    xattrs: bool,
}

impl Runner {
    /// A runner serving `core` on the runtime behind `rt`; `xattrs` false answers every
    /// extended-attribute request `ENOSYS` (`-o noxattr`).
    pub fn new(core: Arc<MountCore>, rt: tokio::runtime::Handle, xattrs: bool) -> Runner {
        Runner { core, rt, callers: Callers::default(), xattrs }
    }

    /// Whether extended attributes are served. When not, the first xattr request of each
    /// kind is answered `ENOSYS` and the kernel asks no more (programs get `EOPNOTSUPP`),
    /// which also ends its `security.capability` probe before each `write(2)`.
    pub fn xattrs(&self) -> bool {
        self.xattrs
    }

    /// Who makes a request of process `pid` running as `uid`:`gid`.
    pub fn caller(&self, uid: u32, gid: u32, pid: u32) -> Caller {
        self.callers.get(uid, gid, pid)
    }

    /// Runs `call`, counted as FUSE operation `op`, and hands its result to `answer` (which
    /// replies to the kernel). Returns at once.
    ///
    /// The call is first polled here, on the thread that read the request: most calls of a
    /// mount are answered from what it knows (its caches, a delegated directory) without
    /// waiting, and are then answered without handing the request to another thread, which
    /// costs a wake-up and a context switch per request on a small machine. A call that has
    /// to wait (for a server, a lock) continues as a task of the mount's runtime, which
    /// polls it again with its own waker.
    pub fn spawn<T, Fut>(
        &self,
        op: &'static str,
        call: impl FnOnce(Arc<MountCore>) -> Fut,
        answer: impl FnOnce(Result<T, Errno>) + Send + 'static,
    ) where
        Fut: Future<Output = Result<T, Errno>> + Send + 'static,
        T: Send + 'static,
    {
        let core = self.core.clone();
        let _in_runtime = self.rt.enter();
        // Boxed at once: a call's future is ~10 KiB, and the wrappers below would
        // otherwise copy it whole each time they take it in.
        let fut = Box::pin(call(core.clone()));
        let mut task = Box::pin(async move { answer(core.counted(op, fut).await) });
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        // A panic stays within this request (its dropped reply answers EIO), as it would in
        // a runtime task; it must not unwind the thread that reads the kernel's requests.
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| task.as_mut().poll(&mut cx))) {
            Ok(std::task::Poll::Pending) => {
                self.rt.spawn(task);
            }
            Ok(std::task::Poll::Ready(())) => {}
            Err(_) => tracing::error!(op, "a mount operation panicked; the request gets EIO"),
        }
    }
}
