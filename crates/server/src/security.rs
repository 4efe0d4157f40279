//! Who a server lets in (mutual TLS, `plusfs_tls`) and what each peer may claim.
//!
//! A connection without a valid certificate of the cluster CA (none, another CA's, expired,
//! revoked, garbage instead of a handshake) is closed before any request is read. Every
//! request of an admitted connection then runs with the credential its identity allows
//! ([`admit`]): servers and admins as claimed; users within their uid and gid ranges, root
//! squashed or refused; admin and server-only requests refused to users.

use parking_lot::Mutex;
use plusfs_placement::ClusterMap;
use plusfs_proto::{
    Capability, Cred, CxRole, DirObject, Errno, Inode, Privilege, Receipt, Replace, Request, SubOp, WireError,
};
use plusfs_tls::{CapKey, Identity, Refused, ServerTls, TlsFiles, NOBODY};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;
use tokio::net::TcpStream;

/// The TLS end of a server and where it learns of revocations.
pub struct Security {
    tls: Arc<ServerTls>,
    /// Open connections per bounded certificate (serial), and the most allowed.
    open: OpenCounts,
    max_open: u32,
    /// How long a client connection may stay idle.
    idle: std::time::Duration,
    /// Checks the capabilities and receipts clients present.
    caps: CapKey,
    /// The cluster map file, re-read for its revocation list when it changes.
    map_path: Option<PathBuf>,
    seen: Mutex<Option<SystemTime>>,
}

/// How often a server looks for a newer revocation list in its map file.
const REVOCATION_CHECK: std::time::Duration = std::time::Duration::from_secs(2);

/// The TLS stream of an admitted connection.
pub type Stream = plusfs_tls::tokio_rustls::server::TlsStream<TcpStream>;

impl Security {
    /// The TLS end `map` asks for (none for an insecure cluster), presenting the map's
    /// server identity; `map_path` is re-read for revocations.
    pub fn from_map(map: &ClusterMap, map_path: Option<&Path>) -> Result<Option<Security>, plusfs_tls::CertError> {
        let Some(ca) = map.tls.ca.clone() else { return Ok(None) };
        let identity = map.tls.server_identity.clone().ok_or_else(|| plusfs_tls::CertError::Bad {
            path: ca.clone(),
            reason: "the map's [tls] names no server_identity".into(),
        })?;
        let caps = CapKey::from_identity(&identity)?;
        let tls = Arc::new(ServerTls::load(&TlsFiles { ca, identity }, &map.tls.revoked)?);
        let seen = map_path.and_then(modified);
        Ok(Some(Security {
            tls,
            open: Arc::default(),
            max_open: map.tls.conns_per_identity(),
            idle: map.tls.idle_limit(),
            caps,
            map_path: map_path.map(Path::to_path_buf),
            seen: Mutex::new(seen),
        }))
    }

    /// The TLS server end (shared with the replica group's Raft listener).
    pub fn server_tls(&self) -> Arc<ServerTls> {
        self.tls.clone()
    }

    /// Counts a new connection of `identity` (certificate `serial`) while the returned
    /// slot lives; `None` when a bounded identity already holds as many as the map allows
    /// (admins and servers are not counted).
    pub fn open_slot(&self, identity: &Identity, serial: &str) -> Option<Slot> {
        if identity.is_admin() {
            return Some(Slot(None));
        }
        let mut open = self.open.lock();
        let n = open.entry(serial.to_string()).or_default();
        if *n >= self.max_open {
            return None;
        }
        *n += 1;
        Some(Slot(Some((self.open.clone(), serial.to_string()))))
    }

    /// How long a client connection may stay idle before it is closed.
    pub fn idle_limit(&self) -> std::time::Duration {
        self.idle
    }

    /// The key capabilities are checked with.
    pub fn caps(&self) -> &CapKey {
        &self.caps
    }

    /// Runs the handshake of a new connection: its peer's identity and certificate serial
    /// number, or why it is refused.
    pub async fn accept(&self, stream: TcpStream) -> Result<(Stream, Identity, String), Refused> {
        self.reload_revocations();
        self.tls.accept(stream).await
    }

    /// True when certificate `serial` was revoked (connections made before are closed at
    /// their next request).
    pub fn is_revoked(&self, serial: &str) -> bool {
        self.tls.is_revoked(serial)
    }

    /// Re-reads the map's revocation list every [`REVOCATION_CHECK`] while the server runs.
    pub fn watch(self: &Arc<Self>) {
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(REVOCATION_CHECK).await;
                match me.upgrade() {
                    Some(s) => s.reload_revocations(),
                    None => return,
                }
            }
        });
    }

    /// Takes the revocation list of the map file if it changed since last seen.
    fn reload_revocations(&self) {
        let Some(path) = &self.map_path else { return };
        let now = modified(path);
        let mut seen = self.seen.lock();
        if now.is_none() || now == *seen {
            return;
        }
        match ClusterMap::load(path) {
            Ok(map) => {
                self.tls.set_revoked(&map.tls.revoked);
                *seen = now;
                tracing::info!(revoked = map.tls.revoked.len(), "revocation list reloaded");
            }
            Err(e) => tracing::warn!(cause = %e, "cannot re-read the cluster map for revocations"),
        }
    }
}

/// One counted connection of a bounded identity (see [`Security::open_slot`]).
pub struct Slot(Option<(OpenCounts, String)>);

/// Open connections per bounded certificate serial number.
type OpenCounts = Arc<Mutex<std::collections::HashMap<String, u32>>>;

impl Drop for Slot {
    fn drop(&mut self) {
        let Some((open, serial)) = self.0.take() else { return };
        let mut open = open.lock();
        if let Some(n) = open.get_mut(&serial) {
            *n -= 1;
            if *n == 0 {
                open.remove(&serial);
            }
        }
    }
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// Who sent a request: the identity and certificate serial number of its connection, and
/// the key its capabilities must be signed with.
pub struct Claimant<'a> {
    pub identity: &'a Identity,
    pub serial: &'a str,
    pub caps: &'a CapKey,
}

/// The credential request `req`, claiming `cred`, runs with for `who`; or the refusal
/// (`EPERM` for admin and server requests and for root, `EACCES` for other ids outside the
/// identity's ranges and for a missing, forged, expired, foreign or too narrow
/// capability). Requests that let a client decide what servers apply (client-driven Cx)
/// are admin requests (`Request::privilege`); data records by number need a capability
/// ([`check_caps`]); the credentials a delegation flush names are admitted as the
/// request's own.
pub fn admit(who: &Claimant, cred: Cred, req: &mut Request) -> Result<Cred, WireError> {
    let identity = who.identity;
    let op = req.name();
    match req.privilege() {
        Privilege::Server if !identity.is_server() => {
            return Err(WireError::new(
                Errno::EPERM,
                format!("{op}: only the cluster's servers may send it ({identity})"),
            ));
        }
        Privilege::Admin if !identity.is_admin() => {
            return Err(WireError::new(Errno::EPERM, format!("{op}: needs an admin identity ({identity})")));
        }
        _ => {}
    }
    if !identity.is_admin() {
        check_caps(who, req.inner_mut(), plusfs_tls::now_secs())
            .map_err(|why| WireError::new(Errno::EACCES, format!("{op}: {why} ({identity})")))?;
        rebuild_cx(req.inner_mut()).map_err(|why| WireError::new(Errno::EPERM, format!("{op}: {why} ({identity})")))?;
    }
    let refused = |r: plusfs_tls::Refusal| {
        let errno = match r {
            plusfs_tls::Refusal::Root { .. } => Errno::EPERM,
            _ => Errno::EACCES,
        };
        WireError::new(errno, format!("{op}: {r}"))
    };
    // The credentials a delegation flush replays its operations as are claims too. A
    // flush's or a recall poll's own credential only names the holder's session (the
    // client sends uid 0, which may be outside a bounded identity's ranges): it runs as
    // nobody of that session.
    match req.inner_mut() {
        Request::DelegFlush { creds, .. } => {
            for c in creds.iter_mut() {
                *c = identity.admit(std::mem::replace(c, Cred::new(0, 0, Vec::new()))).map_err(refused)?;
            }
        }
        Request::DelegWait { .. } => {}
        _ => return identity.admit(cred).map_err(refused),
    }
    match identity.is_admin() {
        true => Ok(cred),
        false => Ok(Cred { session: cred.session, ..Cred::new(NOBODY, NOBODY, Vec::new()) }),
    }
}

/// Why a request of a client that is no admin is refused before it is served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CapRefusal {
    #[error("it needs a capability from the file's server")]
    NoCapability,
    #[error("capability refused: {0}")]
    BadCapability(plusfs_tls::CapError),
    #[error("capability refused: it was issued to certificate {0}")]
    OthersCapability(String),
    #[error("a write capability does not read")]
    WriteCapabilityReads,
    #[error("the capability does not let it store bytes {off}..+{len} of inode {ino}")]
    NotCovered { ino: u64, off: u64, len: u64 },
    #[error("receipt of record {record} refused: {why}")]
    BadReceipt { record: u64, why: plusfs_tls::CapError },
    #[error("receipt of record {record} refused: it was made for certificate {holder}")]
    OthersReceipt { record: u64, holder: String },
    #[error("record {0} has no receipt of its own")]
    NoReceipt(u64),
    #[error("record {record} of server {server} has no receipt for inode {ino}")]
    NoReceiptFor { record: u64, server: u32, ino: u64 },
    #[error("a probe reply of {asked} bytes for {sent} sent needs an admin identity")]
    ProbeTooLarge { asked: u64, sent: usize },
    #[error("a Cx side holds one sub-operation")]
    CxSideNotOne,
    #[error("{role} side {op} is not one of a mkdir or rmdir")]
    CxSideNotMkdirRmdir { role: String, op: String },
}

/// Reply bytes of a `Probe` any identity may ask for, whatever it sent.
const PROBE_FREE: usize = 64 << 10;

/// Checks what a client that is no admin presents for client-direct I/O at `now`: a
/// `Layout` is answered with a capability for this connection's certificate; `DataGet`
/// needs a read capability, `DataPut` a write capability for the record's owner and bytes;
/// `DataDrop` and `CommitWrite` name only records with receipts made for this certificate.
/// Data servers then check each record's owner against the capability's inode.
pub fn check_caps(who: &Claimant, req: &mut Request, now: u64) -> Result<(), CapRefusal> {
    match req {
        Request::Layout { holder, .. } => *holder = who.serial.to_string(),
        Request::DataGet { cap, .. } => {
            let cap = held_cap(who, cap.as_ref(), now)?;
            if cap.write {
                return Err(CapRefusal::WriteCapabilityReads);
            }
        }
        Request::DataPut { owner, data, file_off, cap } => {
            let cap = held_cap(who, cap.as_ref(), now)?;
            if !cap.write || cap.ino != *owner || !cap.covers(*file_off, data.len() as u64) {
                return Err(CapRefusal::NotCovered { ino: *owner, off: *file_off, len: data.len() as u64 });
            }
        }
        Request::DataDrop { records, receipts } => {
            held_receipts(who, receipts, now)?;
            if let Some(r) = records.iter().find(|r| !receipts.iter().any(|x| x.record == **r)) {
                return Err(CapRefusal::NoReceipt(*r));
            }
        }
        // The wire probe answers with as many bytes as asked: more than it sent only for
        // admins (a user could otherwise make a server send 4 MiB per 40 bytes).
        Request::Probe { data, reply_len } if *reply_len as usize > data.len().max(PROBE_FREE) => {
            return Err(CapRefusal::ProbeTooLarge { asked: *reply_len as u64, sent: data.len() });
        }
        Request::CommitWrite { ino, pieces, receipts, .. } => {
            held_receipts(who, receipts, now)?;
            if let Some(q) = pieces.iter().find(|q| !receipts.iter().any(|r| r.vouches(q, *ino))) {
                return Err(CapRefusal::NoReceiptFor { record: q.record, server: q.server, ino: *ino });
            }
        }
        _ => {}
    }
    Ok(())
}

/// A Cx side a client that is no admin sends: only one side of a mkdir (the parent's
/// entry of a new directory, or its object) or of an rmdir (the entry, or the object of a
/// directory that is not distributed), rebuilt from what the client may decide — the
/// name, the leased inode number, the mode's permission and sticky bits. The owner, group and
/// ancestry are the server's (from the credential and the parent), no extended
/// attributes or distribution policy come along, and the participant checks the inode
/// number against the sender's lease.
pub fn rebuild_cx(req: &mut Request) -> Result<(), CapRefusal> {
    let Request::CxExec { role, ops, leased, .. } = req else { return Ok(()) };
    *leased = true;
    let [op] = ops.as_mut_slice() else { return Err(CapRefusal::CxSideNotOne) };
    match (role, op) {
        (CxRole::Participant, SubOp::CreateDir { object, .. }) => {
            // mkdir(2) keeps the permission and sticky bits; set-gid comes from the parent.
            *object = DirObject::new(object.ino, object.mode & 0o1777, object.uid, object.gid);
        }
        (CxRole::Participant, SubOp::RemoveDir { shards, .. }) if shards.is_empty() => {}
        (CxRole::Coordinator, SubOp::InsertEntry { inode, replace: Replace::Never, .. }) => {
            *inode = Inode { uid: inode.uid, ..Inode::subdir(inode.ino) };
        }
        (CxRole::Coordinator, SubOp::RemoveEntry { .. }) => {}
        (role, op) => return Err(CapRefusal::CxSideNotMkdirRmdir { role: format!("{role:?}"), op: subop_name(op) }),
    }
    Ok(())
}

fn subop_name(op: &SubOp) -> String {
    format!("{op:?}").split([' ', '{', '(']).next().unwrap_or_default().to_string()
}

/// The capability a request presents, if it is the cluster's, current and this
/// connection's.
fn held_cap<'c>(who: &Claimant, cap: Option<&'c Capability>, now: u64) -> Result<&'c Capability, CapRefusal> {
    let cap = cap.ok_or(CapRefusal::NoCapability)?;
    who.caps.check_cap(cap, now).map_err(CapRefusal::BadCapability)?;
    if cap.holder != who.serial {
        return Err(CapRefusal::OthersCapability(cap.holder.clone()));
    }
    Ok(cap)
}

/// Checks that every receipt is the cluster's, current and this connection's.
fn held_receipts(who: &Claimant, receipts: &[Receipt], now: u64) -> Result<(), CapRefusal> {
    for r in receipts {
        who.caps.check_receipt(r, now).map_err(|why| CapRefusal::BadReceipt { record: r.record, why })?;
        if r.holder != who.serial {
            return Err(CapRefusal::OthersReceipt { record: r.record, holder: r.holder.clone() });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use plusfs_proto::Piece;
    use plusfs_tls::Role;

    fn node() -> Identity {
        let r = plusfs_tls::Ranges::parse("1000-1999").unwrap();
        Identity {
            name: "m1".into(),
            role: Role::Node { uids: r.clone(), gids: r, root: plusfs_tls::RootClaim::Squash },
        }
    }

    fn signed(key: &CapKey, write: bool, holder: &str) -> Capability {
        let mut c = Capability { ino: 5, write, offset: 0, len: 100, expires: 50, holder: holder.into(), mac: vec![] };
        key.sign_cap(&mut c);
        c
    }

    #[test]
    fn a_layout_names_the_connection_as_holder() {
        let (id, key) = (node(), CapKey::from_secret(b"k"));
        let who = Claimant { identity: &id, serial: "aa", caps: &key };
        let mut req = Request::Layout { path: "/f".into(), offset: 0, len: 1, write: true, holder: "bb".into() };
        check_caps(&who, &mut req, 1).unwrap();
        assert!(matches!(req, Request::Layout { holder, .. } if holder == "aa"));
    }

    #[test]
    fn puts_need_a_write_capability_over_their_bytes() {
        let (id, key) = (node(), CapKey::from_secret(b"k"));
        let who = Claimant { identity: &id, serial: "aa", caps: &key };
        let put = |owner, file_off, cap| Request::DataPut { owner, data: vec![0; 10].into(), file_off, cap };
        assert!(check_caps(&who, &mut put(5, 90, Some(signed(&key, true, "aa"))), 1).is_ok());
        assert!(check_caps(&who, &mut put(5, 91, Some(signed(&key, true, "aa"))), 1).is_err(), "past the range");
        assert!(check_caps(&who, &mut put(6, 0, Some(signed(&key, true, "aa"))), 1).is_err(), "another inode");
        assert!(check_caps(&who, &mut put(5, 0, Some(signed(&key, false, "aa"))), 1).is_err(), "read only");
        assert!(check_caps(&who, &mut put(5, 0, Some(signed(&key, true, "bb"))), 1).is_err(), "another holder");
        assert!(check_caps(&who, &mut put(5, 0, Some(signed(&key, true, "aa"))), 51).is_err(), "expired");
        assert!(check_caps(&who, &mut put(5, 0, None), 1).is_err(), "none");
    }

    #[test]
    fn a_users_cx_side_is_rebuilt_or_refused() {
        use plusfs_proto::{DirObject, Inode, OpId, Replace, SubOp};
        let exec = |role, op| Request::CxExec {
            op: OpId { client: 1, process: 1, seq: 1 },
            role,
            peer: 1,
            ops: vec![op],
            leased: false,
        };
        let mut forged = DirObject::new(9, 0o6777, 0, 0);
        forged.xattrs = vec![("trusted.x".into(), vec![1])];
        let mut req = exec(CxRole::Participant, SubOp::CreateDir { path: "/a/b".into(), object: forged });
        rebuild_cx(&mut req).unwrap();
        let Request::CxExec { ops, leased, .. } = &req else { unreachable!() };
        let SubOp::CreateDir { object, .. } = &ops[0] else { unreachable!() };
        assert!(*leased && object.xattrs.is_empty() && object.ino == 9 && object.mode & 0o7777 == 0o777);
        let replacing = SubOp::InsertEntry {
            dir: "/a".into(),
            name: "b".into(),
            inode: Inode::subdir(9),
            replace: Replace::NonDir,
            shard: None,
        };
        assert!(rebuild_cx(&mut exec(CxRole::Coordinator, replacing)).is_err());
        let wrong_role = SubOp::CreateDir { path: "/a/b".into(), object: DirObject::new(9, 0o755, 0, 0) };
        assert!(rebuild_cx(&mut exec(CxRole::Coordinator, wrong_role)).is_err());
        let shards = SubOp::RemoveDir { path: "/a/b".into(), ino: 0, shards: vec![1, 2] };
        assert!(rebuild_cx(&mut exec(CxRole::Participant, shards)).is_err(), "a distributed directory");
    }

    #[test]
    fn commits_and_drops_name_only_receipted_records() {
        let (id, key) = (node(), CapKey::from_secret(b"k"));
        let who = Claimant { identity: &id, serial: "aa", caps: &key };
        let mut r = Receipt {
            server: 1,
            record: 7,
            owner: 5,
            file_off: 0,
            len: 10,
            expires: 50,
            holder: "aa".into(),
            mac: vec![],
        };
        key.sign_receipt(&mut r);
        let piece = Piece { file_off: 0, len: 10, server: 1, record: 7, skip: 0 };
        let commit = |ino, pieces: Vec<Piece>, receipts| Request::CommitWrite {
            path: "/f".into(),
            ino,
            offset: 0,
            len: 10,
            pieces,
            receipts,
        };
        assert!(check_caps(&who, &mut commit(5, vec![piece], vec![r.clone()]), 1).is_ok());
        assert!(check_caps(&who, &mut commit(6, vec![piece], vec![r.clone()]), 1).is_err(), "another file");
        assert!(check_caps(&who, &mut commit(5, vec![Piece { record: 8, ..piece }], vec![r.clone()]), 1).is_err());
        assert!(check_caps(&who, &mut commit(5, vec![piece], vec![]), 1).is_err(), "no receipt");
        let mut drop = Request::DataDrop { records: vec![7], receipts: vec![r.clone()] };
        assert!(check_caps(&who, &mut drop, 1).is_ok());
        let mut drop = Request::DataDrop { records: vec![7, 9], receipts: vec![r] };
        assert!(check_caps(&who, &mut drop, 1).is_err(), "a record without receipt");
    }
}
