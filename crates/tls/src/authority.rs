//! The cluster's certificate authority: made once by `plusfs cluster up` (or `plusfs cert
//! init`), it issues the servers' certificates and the clients' identities.
//!
//! Files: the CA directory holds `ca.pem` and `ca.key` (mode 0600). An issued identity is a
//! directory of `cert.pem`, `key.pem` (mode 0600) and a copy of `ca.pem`, which is all a
//! client or server needs.

use crate::identity::{Identity, Role};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType, SerialNumber,
};
use std::path::{Path, PathBuf};
use thiserror::Error;
use time::{Duration, OffsetDateTime};

/// The DNS name every server certificate carries and every client checks: servers are
/// authenticated by the cluster CA and their role, not by host name.
pub const SERVER_NAME: &str = "plusfs-server";

/// A failure to make, load or use certificates.
#[derive(Debug, Error)]
pub enum CertError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: {reason}")]
    Bad { path: PathBuf, reason: String },
    #[error("cannot make a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("{0} already exists; refusing to overwrite a certificate authority")]
    Exists(PathBuf),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CertError + '_ {
    move |source| CertError::Io { path: path.to_path_buf(), source }
}

/// When a certificate is valid.
#[derive(Debug, Clone, Copy)]
pub struct Validity {
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
}

impl Validity {
    /// From an hour ago (clocks differ a little) for `days` days.
    pub fn days(days: u32) -> Validity {
        let now = OffsetDateTime::now_utc();
        Validity { not_before: now - Duration::hours(1), not_after: now + Duration::days(days.into()) }
    }
}

/// A loaded certificate authority.
pub struct Authority {
    cert_pem: String,
    key: KeyPair,
}

/// What [`Authority::issue`] made.
#[derive(Debug, Clone)]
pub struct Issued {
    /// The directory holding `cert.pem`, `key.pem` and `ca.pem`.
    pub dir: PathBuf,
    /// The certificate's serial number in hex, as revocation lists name it.
    pub serial: String,
}

impl Authority {
    /// Makes a new CA in `dir` (valid for ten years); refuses if one is there.
    pub fn create(dir: &Path) -> Result<Authority, CertError> {
        let (cert_path, key_path) = (dir.join("ca.pem"), dir.join("ca.key"));
        if cert_path.exists() {
            return Err(CertError::Exists(cert_path));
        }
        // Its certificate is public (clients name it in the map); its key is not.
        key_dir(dir, 0o755)?;
        let key = KeyPair::generate()?;
        let mut p = CertificateParams::default();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name = DistinguishedName::new();
        p.distinguished_name.push(DnType::CommonName, "plusfs cluster CA");
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let v = Validity::days(3650);
        (p.not_before, p.not_after) = (v.not_before, v.not_after);
        p.serial_number = Some(random_serial());
        let cert = p.self_signed(&key)?;
        write_file(&key_path, key.serialize_pem().as_bytes(), 0o600)?;
        write_file(&cert_path, cert.pem().as_bytes(), 0o644)?;
        Ok(Authority { cert_pem: cert.pem(), key })
    }

    /// Loads the CA of `dir`.
    pub fn load(dir: &Path) -> Result<Authority, CertError> {
        let (cert_path, key_path) = (dir.join("ca.pem"), dir.join("ca.key"));
        let cert_pem = std::fs::read_to_string(&cert_path).map_err(io(&cert_path))?;
        let key_pem = std::fs::read_to_string(&key_path).map_err(io(&key_path))?;
        let key = KeyPair::from_pem(&key_pem)
            .map_err(|e| CertError::Bad { path: key_path.clone(), reason: e.to_string() })?;
        Ok(Authority { cert_pem, key })
    }

    /// The CA certificate (PEM).
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// Issues a certificate for `identity`, valid over `validity`, into directory `out`.
    pub fn issue(&self, identity: &Identity, validity: Validity, out: &Path) -> Result<Issued, CertError> {
        let issuer = Issuer::from_ca_cert_pem(&self.cert_pem, &self.key)?;
        let key = KeyPair::generate()?;
        let mut p = CertificateParams::default();
        p.distinguished_name = DistinguishedName::new();
        p.distinguished_name.push(DnType::CommonName, identity.name.as_str());
        let uri = identity.to_uri().try_into()?;
        p.subject_alt_names = vec![SanType::URI(uri)];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        if identity.role == Role::Server {
            // Servers also call each other, as clients.
            p.subject_alt_names.push(SanType::DnsName(SERVER_NAME.try_into()?));
            p.extended_key_usages.push(ExtendedKeyUsagePurpose::ServerAuth);
        }
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        (p.not_before, p.not_after) = (validity.not_before, validity.not_after);
        let serial = random_serial();
        let serial_hex = hex(serial.as_ref());
        p.serial_number = Some(serial);
        let cert = p.signed_by(&key, &issuer)?;
        key_dir(out, 0o700)?;
        write_file(&out.join("key.pem"), key.serialize_pem().as_bytes(), 0o600)?;
        write_file(&out.join("cert.pem"), cert.pem().as_bytes(), 0o644)?;
        write_file(&out.join("ca.pem"), self.cert_pem.as_bytes(), 0o644)?;
        Ok(Issued { dir: out.to_path_buf(), serial: serial_hex })
    }
}

/// A random positive 16-byte serial number.
fn random_serial() -> SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    bytes[0] &= 0x7f;
    bytes[0] |= 0x01; // no leading zero byte: the hex form is the same everywhere
    SerialNumber::from_slice(&bytes)
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Makes directory `dir` (mode `mode`) for a private key, or checks that the existing one
/// is safe to write one into: a real directory (not a symbolic link) of this user, which
/// no one else may write to (else another local user could read the key, or have it
/// written over a file of their choice).
fn key_dir(dir: &Path, mode: u32) -> Result<(), CertError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let refuse = |reason: String| CertError::Bad { path: dir.to_path_buf(), reason };
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent).map_err(io(parent))?;
            }
            std::fs::DirBuilder::new().mode(mode).create(dir).map_err(io(dir))
        }
        Err(e) => Err(io(dir)(e)),
        Ok(m) if !m.is_dir() => {
            Err(refuse("refusing to write a key here: not a directory (or a symbolic link)".into()))
        }
        Ok(m) if m.uid() != effective_uid() => {
            Err(refuse(format!("refusing to write a key here: the directory belongs to uid {}", m.uid())))
        }
        Ok(m) if m.mode() & 0o022 != 0 => Err(refuse(format!(
            "refusing to write a key here: others may write to the directory (mode {:o})",
            m.mode() & 0o7777
        ))),
        Ok(_) => Ok(()),
    }
}

/// This process's effective uid.
fn effective_uid() -> u32 {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    #[allow(unsafe_code)]
    unsafe {
        libc::geteuid()
    }
}

/// Writes `bytes` to `path` with `mode` so that a crash leaves the old file or the new
/// one: a fresh temporary file (an unpredictable name, created exclusively, never through
/// a symbolic link), fsync, rename, fsync of the directory.
fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<(), CertError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.{:016x}.tmp", rand::random::<u64>()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .mode(mode)
        .open(&tmp)
        .map_err(io(&tmp))?;
    let written = f.write_all(bytes).and_then(|_| f.sync_all()).and_then(|_| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(path)(e));
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))?;
    Ok(())
}
