//! Which TLS identity this process presents to a cluster, and the client end made of it.
//!
//! A server presents the cluster's server identity ([`set_process_identity`]); any other
//! process the directory `PLUSFS_IDENTITY` names, else the map's default `[tls] identity`.
//! Loaded ends are shared by every pool of the process.

use plusfs_placement::TlsSettings;
use plusfs_tls::{ClientTls, TlsFiles};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

static PROCESS_IDENTITY: OnceLock<PathBuf> = OnceLock::new();

/// Makes this process present the identity in `dir` to every cluster (servers call it with
/// their server identity before they connect anywhere). Only the first call counts.
pub fn set_process_identity(dir: PathBuf) {
    let _ = PROCESS_IDENTITY.set(dir);
}

/// The identity directory this process presents to a cluster with `tls` settings.
pub fn identity_dir(tls: &TlsSettings) -> Option<PathBuf> {
    PROCESS_IDENTITY
        .get()
        .cloned()
        .or_else(|| std::env::var_os("PLUSFS_IDENTITY").filter(|v| !v.is_empty()).map(PathBuf::from))
        .or_else(|| tls.identity.clone())
}

/// Why a process has no client end for a cluster that requires TLS.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClientTlsError {
    /// No identity directory is set.
    #[error("the cluster requires TLS: set PLUSFS_IDENTITY to an identity directory (plusfs cert issue)")]
    NoIdentity,
    /// The CA certificate or the identity could not be loaded.
    #[error("cannot load the TLS identity: {0}")]
    Load(String),
}

/// The client end for a cluster with `tls` settings: `None` for an insecure cluster, an
/// error (shown by every call) if the CA or identity cannot be loaded.
pub fn client_tls(tls: &TlsSettings) -> Result<Option<Arc<ClientTls>>, ClientTlsError> {
    let Some(ca) = tls.ca.clone() else { return Ok(None) };
    let identity = identity_dir(tls).ok_or(ClientTlsError::NoIdentity)?;
    static LOADED: OnceLock<Mutex<HashMap<TlsFiles, Arc<ClientTls>>>> = OnceLock::new();
    let files = TlsFiles { ca, identity };
    let mut loaded = LOADED.get_or_init(Default::default).lock().expect("loaded TLS ends");
    if let Some(end) = loaded.get(&files) {
        return Ok(Some(end.clone()));
    }
    let end = Arc::new(ClientTls::load(&files).map_err(|e| ClientTlsError::Load(e.to_string()))?);
    loaded.insert(files, end.clone());
    Ok(Some(end))
}
