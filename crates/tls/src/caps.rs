//! The key servers sign capabilities and receipts with (see `plusfs_proto::caps`).
//!
//! Every server of a cluster presents the same server identity, so each derives the same
//! HMAC-SHA256 key from that identity's private key: capabilities one server issues are
//! checked by any other without a round trip, and nobody without the server key can make
//! one. Replacing the server identity invalidates every capability in flight (clients ask
//! for new ones).

use crate::authority::CertError;
use plusfs_proto::{Capability, Receipt};
use ring::hmac;
use std::path::Path;

/// Why a capability or receipt is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CapError {
    #[error("its signature is not the cluster's")]
    Forged,
    #[error("it expired {0} s ago")]
    Expired(u64),
}

/// The cluster's capability key.
pub struct CapKey(hmac::Key);

impl CapKey {
    /// The key of the server identity in directory `dir` (its `key.pem`).
    pub fn from_identity(dir: &Path) -> Result<CapKey, CertError> {
        let path = dir.join("key.pem");
        let pem = std::fs::read(&path).map_err(|e| CertError::Bad { path: path.clone(), reason: e.to_string() })?;
        Ok(CapKey::from_secret(&pem))
    }

    /// The key derived from secret bytes (the server's private key).
    pub fn from_secret(secret: &[u8]) -> CapKey {
        let derive = hmac::Key::new(hmac::HMAC_SHA256, secret);
        let tag = hmac::sign(&derive, b"plusfs capability key v1");
        CapKey(hmac::Key::new(hmac::HMAC_SHA256, tag.as_ref()))
    }

    /// Signs `cap` (sets its `mac`).
    pub fn sign_cap(&self, cap: &mut Capability) {
        cap.mac = hmac::sign(&self.0, &cap.signed()).as_ref().to_vec();
    }

    /// Signs `receipt` (sets its `mac`).
    pub fn sign_receipt(&self, receipt: &mut Receipt) {
        receipt.mac = hmac::sign(&self.0, &receipt.signed()).as_ref().to_vec();
    }

    /// Checks `cap`'s signature and expiry at `now` (seconds since the Unix epoch).
    pub fn check_cap(&self, cap: &Capability, now: u64) -> Result<(), CapError> {
        self.check(&cap.signed(), &cap.mac, cap.expires, now)
    }

    /// Checks `receipt`'s signature and expiry at `now`.
    pub fn check_receipt(&self, receipt: &Receipt, now: u64) -> Result<(), CapError> {
        self.check(&receipt.signed(), &receipt.mac, receipt.expires, now)
    }

    fn check(&self, signed: &[u8], mac: &[u8], expires: u64, now: u64) -> Result<(), CapError> {
        hmac::verify(&self.0, signed, mac).map_err(|_| CapError::Forged)?;
        match now > expires {
            true => Err(CapError::Expired(now - expires)),
            false => Ok(()),
        }
    }
}

/// Seconds since the Unix epoch now.
pub fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cap() -> Capability {
        Capability { ino: 3, write: false, offset: 0, len: u64::MAX, expires: 100, holder: "01".into(), mac: vec![] }
    }

    #[test]
    fn signed_capabilities_check_until_they_expire() {
        let key = CapKey::from_secret(b"server key");
        let mut c = cap();
        key.sign_cap(&mut c);
        assert_eq!(key.check_cap(&c, 100), Ok(()));
        assert_eq!(key.check_cap(&c, 103), Err(CapError::Expired(3)));
    }

    #[test]
    fn changed_or_foreign_capabilities_are_forged() {
        let key = CapKey::from_secret(b"server key");
        let mut c = cap();
        key.sign_cap(&mut c);
        let mut wider = c.clone();
        wider.write = true;
        assert_eq!(key.check_cap(&wider, 1), Err(CapError::Forged));
        let mut longer = c.clone();
        longer.expires = 1 << 40;
        assert_eq!(key.check_cap(&longer, 1), Err(CapError::Forged));
        let other = CapKey::from_secret(b"another cluster");
        assert_eq!(other.check_cap(&c, 1), Err(CapError::Forged));
        let mut r = Receipt {
            server: 1,
            record: 2,
            owner: 3,
            file_off: 0,
            len: 4,
            expires: 9,
            holder: "01".into(),
            mac: vec![],
        };
        key.sign_receipt(&mut r);
        assert_eq!(key.check_receipt(&r, 9), Ok(()));
        r.owner = 4;
        assert_eq!(key.check_receipt(&r, 9), Err(CapError::Forged));
    }
}
