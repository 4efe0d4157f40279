//! The caller's credentials every request carries (NFS `AUTH_SYS` style), and the
//! envelope of a request frame, [`Call`](crate::Call), holds one with the request.
//!
//! Servers check permissions against the credential (`docs/semantics.md`). On a cluster
//! with TLS, the connection's identity bounds which uids and gids a request may claim
//! (`plusfs_tls::Identity::admit`); on an insecure one servers believe the claim, as NFS
//! `AUTH_SYS` does. `verifier` says whether the call goes through an open descriptor.
//! Server-to-server requests carry either the original caller's credential (where the
//! receiver checks something on the caller's behalf: prepares of two-phase commits,
//! forwarded file requests) or [`Cred::server`], which peers trust.

use serde::{Deserialize, Serialize};

/// Read permission (the `r` bit), as `access(2)`'s `R_OK`.
pub const MAY_READ: u32 = 4;
/// Write permission (the `w` bit), as `W_OK`.
pub const MAY_WRITE: u32 = 2;
/// Execute, or search for a directory (the `x` bit), as `X_OK`.
pub const MAY_EXEC: u32 = 1;

/// The `verifier` of a request made through an open file descriptor.
pub const VERIFIER_HANDLE: &[u8] = b"fd";

/// Who makes a request: user, primary group, supplementary groups.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Cred {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (`getgroups(2)`), in any order.
    pub groups: Vec<u32>,
    /// How the caller acts: empty for a call on a path, [`VERIFIER_HANDLE`] for reads,
    /// writes and truncations through a descriptor the caller opened (see
    /// [`Cred::through_handle`]). Who may claim which uid is the connection's identity's
    /// business (mutual TLS), not this field's.
    pub verifier: Vec<u8>,
    /// The client instance that sends the request (a random number it picks at start; 0
    /// for servers and tools): a directory delegation belongs to one session, and only
    /// other sessions' requests recall it.
    pub session: u64,
    /// The caller's file mode creation mask, for the creates it makes: applied by the
    /// server unless the parent directory has a default ACL (which replaces it). 0 for
    /// library callers, whose modes are taken as given.
    pub umask: u32,
}

impl Cred {
    /// A credential of `uid`, `gid` and supplementary `groups`, with no verifier.
    pub fn new(uid: u32, gid: u32, groups: Vec<u32>) -> Cred {
        Cred { uid, gid, groups, verifier: Vec::new(), session: 0, umask: 0 }
    }

    /// The credential servers use among themselves (uid 0; peers are trusted).
    pub fn server() -> Cred {
        Cred::new(0, 0, Vec::new())
    }

    /// True when this caller has every permission of `want` (`MAY_*` bits) on an object
    /// of `mode` owned by `uid`:`gid`: the owner's bits for its owner, the group's for
    /// members, the others' for everyone else. Root passes (`CAP_DAC_OVERRIDE`).
    pub fn may(&self, mode: u32, uid: u32, gid: u32, want: u32) -> bool {
        if self.is_root() {
            return true;
        }
        let bits = if self.uid == uid {
            mode >> 6
        } else if self.in_group(gid) {
            mode >> 3
        } else {
            mode
        };
        bits & want & 7 == want & 7
    }

    /// The same caller acting through a descriptor it opened: servers let a file's owner
    /// read, write and truncate it through one whatever its mode bits say (the rights were
    /// checked at `open`, and an owner may change the mode anyway). This is how a file
    /// created `0444` stays writable through the descriptor that created it when the
    /// mount sends the write as its caller (NFS servers do the same, knfsd's owner
    /// override).
    pub fn through_handle(mut self) -> Cred {
        self.verifier = VERIFIER_HANDLE.to_vec();
        self
    }

    /// True when `uid` owns the object and this call goes through an open descriptor
    /// ([`Cred::through_handle`]): the owner's access needs no mode bits.
    pub fn owner_through_handle(&self, uid: u32) -> bool {
        self.uid == uid && self.verifier == VERIFIER_HANDLE
    }

    /// True for uid 0, which bypasses permission checks as Linux's `CAP_DAC_OVERRIDE`,
    /// `CAP_FOWNER` and `CAP_CHOWN` do.
    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    /// True when `gid` is the caller's group or one of its supplementary groups.
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }

    /// The index of `c`'s user and groups in `creds` (a flush's list of callers), added
    /// if missing (without verifier or session).
    pub fn index_in(creds: &mut Vec<Cred>, c: &Cred) -> u32 {
        match creds.iter().position(|x| x.uid == c.uid && x.gid == c.gid && x.groups == c.groups) {
            Some(i) => i as u32,
            None => {
                creds.push(Cred::new(c.uid, c.gid, c.groups.clone()));
                (creds.len() - 1) as u32
            }
        }
    }

    /// The credential of this process: effective uid and gid, supplementary groups.
    pub fn of_process() -> Cred {
        // SAFETY: geteuid/getegid have no preconditions and cannot fail; getgroups writes
        // at most `n` groups into a buffer of that size.
        #[allow(unsafe_code)]
        unsafe {
            let (uid, gid) = (libc::geteuid(), libc::getegid());
            let n = libc::getgroups(0, std::ptr::null_mut());
            let mut groups = vec![0 as libc::gid_t; n.max(0) as usize];
            let got = libc::getgroups(n.max(0), groups.as_mut_ptr());
            groups.truncate(got.max(0) as usize);
            Cred::new(uid, gid, groups)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_and_root() {
        let c = Cred::new(5, 10, vec![20, 30]);
        assert!(c.in_group(10) && c.in_group(30) && !c.in_group(40));
        assert!(!c.is_root() && Cred::server().is_root());
    }

    #[test]
    fn credentials_are_listed_once() {
        let mut creds = Vec::new();
        let a = Cred::new(5, 5, vec![]);
        assert_eq!(Cred::index_in(&mut creds, &a), 0);
        assert_eq!(Cred::index_in(&mut creds, &Cred::new(6, 6, vec![])), 1);
        assert_eq!(Cred::index_in(&mut creds, &a), 0);
    }
}
