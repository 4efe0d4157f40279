//! Mutual TLS for plusfs: the cluster's certificate authority, the identities it issues
//! (which uids and gids a client may act as, admin or not), and the rustls configurations
//! of both ends of a connection.

pub mod authority;
pub mod caps;
pub mod config;
pub mod identity;

pub use authority::{Authority, CertError, Issued, Validity, SERVER_NAME};
pub use caps::{now_secs, CapError, CapKey};
pub use config::{
    identity_of, peer_not_after, serial_of_file, CertIdentityError, ClientTls, Refused, ServerTls, TlsFiles,
    HANDSHAKE_TIMEOUT,
};
pub use identity::{Identity, Ranges, Refusal, Role, RootClaim, NOBODY};
pub use tokio_rustls;
