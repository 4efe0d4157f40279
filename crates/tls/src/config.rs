//! rustls configurations for both ends of a plusfs connection, and what a server learns
//! of its peer: the identity in its certificate.
//!
//! Both ends present a certificate of the cluster CA (mutual TLS, TLS 1.3 or 1.2). A
//! server refuses a handshake without one, with one of another CA or outside its
//! validity, and — once the handshake is done, before any request is read — one whose
//! serial number the cluster map lists as revoked, or that names no identity.

use crate::authority::{hex, CertError, SERVER_NAME};
use crate::identity::{Identity, URI_PREFIX};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncWrite};

/// How long a server waits for a connection's handshake (garbage or silence ends it).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a server refused a connection.
#[derive(Debug, Error)]
pub enum Refused {
    #[error("TLS handshake failed: {0}")]
    Handshake(std::io::Error),
    #[error("no TLS handshake within {} s", HANDSHAKE_TIMEOUT.as_secs())]
    Timeout,
    #[error("certificate {serial} of '{name}' is revoked")]
    Revoked { name: String, serial: String },
    #[error("the peer's certificate names no plusfs identity: {0}")]
    NoIdentity(CertIdentityError),
}

/// Why a peer's certificate names no plusfs identity.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CertIdentityError {
    /// The peer presented none.
    #[error("no certificate")]
    NoCertificate,
    /// Its bytes are not an X.509 certificate.
    #[error("not a certificate: {0}")]
    Unparsable(String),
    /// Its subject has no common name.
    #[error("the certificate has no common name")]
    NoCommonName,
    /// It has no subject alternative name with a plusfs identity URI.
    #[error("the certificate has no identity")]
    NoUri,
    /// Its identity URI is malformed.
    #[error("bad identity: {0}")]
    BadUri(#[from] crate::identity::IdentityError),
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn bad(path: &Path, reason: impl ToString) -> CertError {
    CertError::Bad { path: path.to_path_buf(), reason: reason.to_string() }
}

/// The certificate chain and key of the identity in directory `dir`.
fn load_identity(dir: &Path) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), CertError> {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let chain = CertificateDer::pem_file_iter(&cert)
        .map_err(|e| bad(&cert, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(&cert, e))?;
    if chain.is_empty() {
        return Err(bad(&cert, "no certificate in the file"));
    }
    let key = PrivateKeyDer::from_pem_file(&key).map_err(|e| bad(&key, e))?;
    Ok((chain, key))
}

/// The trust roots: the cluster CA certificate at `ca`.
fn load_roots(ca: &Path) -> Result<Arc<rustls::RootCertStore>, CertError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).map_err(|e| bad(ca, e))? {
        roots.add(cert.map_err(|e| bad(ca, e))?).map_err(|e| bad(ca, e))?;
    }
    if roots.is_empty() {
        return Err(bad(ca, "no CA certificate in the file"));
    }
    Ok(Arc::new(roots))
}

/// Where a process finds its TLS material: the cluster CA and its own identity.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TlsFiles {
    pub ca: PathBuf,
    pub identity: PathBuf,
}

/// The client end: connects to servers of the cluster CA, presenting an identity.
#[derive(Clone)]
pub struct ClientTls {
    connector: tokio_rustls::TlsConnector,
    identity: PathBuf,
}

impl ClientTls {
    /// Loads the CA and the identity of `files`.
    pub fn load(files: &TlsFiles) -> Result<ClientTls, CertError> {
        let roots = load_roots(&files.ca)?;
        let (chain, key) = load_identity(&files.identity)?;
        let config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(&files.ca, e))?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(|e| bad(&files.identity, e))?;
        Ok(ClientTls {
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
            identity: files.identity.clone(),
        })
    }

    /// The identity directory this end presents.
    pub fn identity_dir(&self) -> &Path {
        &self.identity
    }

    /// Runs the handshake over `stream`.
    pub async fn connect<S>(&self, stream: S) -> std::io::Result<tokio_rustls::client::TlsStream<S>>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let name = ServerName::try_from(SERVER_NAME).expect("a valid DNS name");
        self.connector.connect(name, stream).await
    }
}

/// The server end: accepts peers of the cluster CA and tells who they are.
pub struct ServerTls {
    acceptor: tokio_rustls::TlsAcceptor,
    revoked: RwLock<HashSet<String>>,
}

impl ServerTls {
    /// Loads the CA and the (server) identity of `files`; `revoked` lists serial numbers
    /// (hex) to refuse.
    pub fn load(files: &TlsFiles, revoked: &[String]) -> Result<ServerTls, CertError> {
        let roots = load_roots(&files.ca)?;
        let (chain, key) = load_identity(&files.identity)?;
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider())
            .build()
            .map_err(|e| bad(&files.ca, e))?;
        let config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(&files.ca, e))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .map_err(|e| bad(&files.identity, e))?;
        let tls =
            ServerTls { acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)), revoked: Default::default() };
        tls.set_revoked(revoked);
        Ok(tls)
    }

    /// Replaces the list of revoked serial numbers (from a newer cluster map).
    pub fn set_revoked(&self, revoked: &[String]) {
        *self.revoked.write().expect("revoked list") = revoked.iter().map(|s| s.to_ascii_lowercase()).collect();
    }

    /// Runs the handshake over `stream` and checks the peer's certificate: its identity
    /// and serial number, or why the connection is refused.
    pub async fn accept<S>(&self, stream: S) -> Result<(tokio_rustls::server::TlsStream<S>, Identity, String), Refused>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, self.acceptor.accept(stream)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(Refused::Handshake(e)),
            Err(_) => return Err(Refused::Timeout),
        };
        let der = tls.get_ref().1.peer_certificates().and_then(|c| c.first()).cloned();
        let der = der.ok_or(Refused::NoIdentity(CertIdentityError::NoCertificate))?;
        let (identity, serial) = identity_of(&der).map_err(Refused::NoIdentity)?;
        if self.is_revoked(&serial) {
            return Err(Refused::Revoked { name: identity.name, serial });
        }
        Ok((tls, identity, serial))
    }

    /// True when certificate `serial` (hex) is on the revocation list.
    pub fn is_revoked(&self, serial: &str) -> bool {
        self.revoked.read().expect("revoked list").contains(serial)
    }
}

/// The identity and serial number (hex) a certificate (DER) carries.
pub fn identity_of(der: &[u8]) -> Result<(Identity, String), CertIdentityError> {
    let unparsable = |e: &dyn std::fmt::Display| CertIdentityError::Unparsable(e.to_string());
    let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|e| unparsable(&e))?;
    let name = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .ok_or(CertIdentityError::NoCommonName)?
        .to_string();
    let san = cert.subject_alternative_name().map_err(|e| unparsable(&e))?.ok_or(CertIdentityError::NoUri)?;
    let uri = san
        .value
        .general_names
        .iter()
        .find_map(|g| match g {
            x509_parser::extensions::GeneralName::URI(u) if u.starts_with(URI_PREFIX) => Some(*u),
            _ => None,
        })
        .ok_or(CertIdentityError::NoUri)?;
    let identity = Identity::from_uri(&name, uri)?;
    Ok((identity, hex(cert.raw_serial())))
}

/// When the certificate a TLS peer presented stops being valid (seconds since the Unix
/// epoch).
pub fn peer_not_after<S>(tls: &tokio_rustls::server::TlsStream<S>) -> Option<u64> {
    let der = tls.get_ref().1.peer_certificates()?.first()?.clone();
    let (_, cert) = x509_parser::parse_x509_certificate(&der).ok()?;
    u64::try_from(cert.validity().not_after.timestamp()).ok()
}

/// The serial number (hex) of the certificate in PEM file `path`, for revocation.
pub fn serial_of_file(path: &Path) -> Result<(Identity, String), CertError> {
    let der = CertificateDer::from_pem_file(path).map_err(|e| bad(path, e))?;
    identity_of(&der).map_err(|e| bad(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authority::{Authority, Validity};
    use crate::identity::{Ranges, Role, RootClaim};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn files(dir: &Path, ca: &Path) -> TlsFiles {
        TlsFiles { ca: ca.join("ca.pem"), identity: dir.to_path_buf() }
    }

    fn user() -> Identity {
        let role = Role::User {
            uids: Ranges::parse("1000").unwrap(),
            gids: Ranges::parse("1000").unwrap(),
            root: RootClaim::Squash,
        };
        Identity { name: "alice".into(), role }
    }

    /// One handshake between a client of `client` and the server of `server`.
    async fn handshake(client: &TlsFiles, server: &ServerTls) -> Result<Identity, String> {
        let (a, b) = tokio::io::duplex(1 << 16);
        let client = ClientTls::load(client).map_err(|e| e.to_string())?;
        let c = tokio::spawn(async move {
            let mut s = client.connect(a).await?;
            s.write_all(b"ping").await?;
            s.flush().await?;
            let mut buf = [0u8; 4];
            s.read_exact(&mut buf).await.map(|_| buf)
        });
        let (mut s, id, _) = server.accept(b).await.map_err(|e| e.to_string())?;
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).await.map_err(|e| e.to_string())?;
        s.write_all(b"pong").await.map_err(|e| e.to_string())?;
        s.flush().await.map_err(|e| e.to_string())?;
        assert_eq!(&c.await.unwrap().map_err(|e| e.to_string())?, b"pong");
        Ok(id)
    }

    #[tokio::test]
    async fn only_current_certificates_of_the_cluster_ca_get_through() {
        let t = tempfile::tempdir().unwrap();
        let ca = Authority::create(&t.path().join("ca")).unwrap();
        assert!(matches!(Authority::create(&t.path().join("ca")), Err(CertError::Exists(_))));
        let other = Authority::create(&t.path().join("other")).unwrap();
        let server_id = Identity { name: "server".into(), role: Role::Server };
        ca.issue(&server_id, Validity::days(1), &t.path().join("server")).unwrap();
        let alice = ca.issue(&user(), Validity::days(1), &t.path().join("alice")).unwrap();
        other.issue(&user(), Validity::days(1), &t.path().join("stranger")).unwrap();
        let old = Validity {
            not_before: time::OffsetDateTime::now_utc() - time::Duration::days(3),
            not_after: time::OffsetDateTime::now_utc() - time::Duration::days(1),
        };
        ca.issue(&user(), old, &t.path().join("expired")).unwrap();
        let ca_dir = t.path().join("ca");
        let server = ServerTls::load(&files(&t.path().join("server"), &ca_dir), &[]).unwrap();

        assert_eq!(handshake(&files(&t.path().join("alice"), &ca_dir), &server).await.unwrap(), user());
        // Another CA's certificate: the server refuses it.
        let stranger = handshake(&files(&t.path().join("stranger"), &ca_dir), &server).await.unwrap_err();
        assert!(stranger.contains("handshake"), "{stranger}");
        let expired = handshake(&files(&t.path().join("expired"), &ca_dir), &server).await.unwrap_err();
        assert!(expired.contains("handshake"), "{expired}");
        // Revoked after it was issued.
        server.set_revoked(std::slice::from_ref(&alice.serial));
        let revoked = handshake(&files(&t.path().join("alice"), &ca_dir), &server).await.unwrap_err();
        assert!(revoked.contains("revoked"), "{revoked}");
        assert_eq!(serial_of_file(&t.path().join("alice/cert.pem")).unwrap().1, alice.serial);
    }
}
