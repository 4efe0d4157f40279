//! Who a server lets in (mutual TLS, `plusfs_tls`) and what each peer may claim.
//!
//! A connection without a valid certificate of the cluster CA (none, another CA's, expired,
//! revoked, garbage instead of a handshake) is closed before any request is read. Every
//! request of an admitted connection then runs with the credential its identity allows
//! ([`admit`]): servers and admins as claimed; users within their uid and gid ranges, root
//! squashed or refused; admin and server-only requests refused to users.

use plusfs_placement::ClusterMap;
use plusfs_proto::{Cred, Errno, Privilege, Request, WireError};
use plusfs_tls::{Identity, Refused, ServerTls, TlsFiles, NOBODY};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;
use tokio::net::TcpStream;

/// The TLS end of a server and where it learns of revocations.
pub struct Security {
    tls: Arc<ServerTls>,
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
        let tls = Arc::new(ServerTls::load(&TlsFiles { ca, identity }, &map.tls.revoked)?);
        let seen = map_path.and_then(modified);
        Ok(Some(Security { tls, map_path: map_path.map(Path::to_path_buf), seen: Mutex::new(seen) }))
    }

    /// The TLS server end (shared with the replica group's Raft listener).
    pub fn server_tls(&self) -> Arc<ServerTls> {
        self.tls.clone()
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
        let mut seen = self.seen.lock().expect("map time");
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

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// The credential request `req`, claiming `cred`, runs with for a peer of `identity`; or
/// the refusal (`EPERM` for admin and server requests and for root, `EACCES` for other ids
/// outside the identity's ranges). Requests that let a client decide what servers apply
/// (client-driven Cx, data records by number) are admin requests (`Request::privilege`),
/// so a user's requests are all checked in full by the servers; the credentials a
/// delegation flush names are admitted as the request's own.
pub fn admit(identity: &Identity, cred: Cred, req: &mut Request) -> Result<Cred, WireError> {
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
