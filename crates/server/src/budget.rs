//! Memory budgets of a server's connections: how many bytes of requests and replies each
//! client may hold in the server at once.
//!
//! Every request takes a share of its sender's budget (its own bytes, taken before its body
//! is read, and the most its reply may hold) until its reply is written. All connections
//! of one certificate share one budget of [`IDENTITY_BUDGET_KIB`]; bounded identities (users,
//! nodes) and peers of an insecure cluster also draw on the process's budget of
//! [`SERVER_BUDGET_KIB`] for what they hold past [`GUARANTEED_KIB`], so many identities
//! together cannot exhaust the server either, and none waits for room for its first
//! small requests.
//! A connection whose next request does not fit is not read until earlier replies are
//! written: a client that sends without reading stops itself. Admins draw only on their own
//! budget (they can act while users fill the server's); the cluster's own servers are not
//! budgeted (their requests may wait on one another in cycles).

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Bytes of requests and replies one certificate (or one connection of an insecure
/// cluster) may hold in a server process at once, in KiB.
pub const IDENTITY_BUDGET_KIB: u32 = 64 << 10;
/// Bytes of requests and replies all bounded identities together may hold, in KiB.
pub const SERVER_BUDGET_KIB: u32 = 256 << 10;
/// What each identity may hold without drawing on the server's budget, in KiB: a user
/// with a few small requests in flight is served even while others fill the server's.
pub const GUARANTEED_KIB: u32 = 1 << 10;
/// The least share a request takes (so many tiny requests are bounded too).
pub const MIN_SHARE_KIB: u32 = 16;

/// The budgets of one server process.
pub struct Budgets {
    server: Arc<Semaphore>,
    identities: Mutex<HashMap<String, Weak<Semaphore>>>,
}

impl Default for Budgets {
    fn default() -> Self {
        Budgets { server: Arc::new(Semaphore::new(SERVER_BUDGET_KIB as usize)), identities: Mutex::default() }
    }
}

/// Whose budget a connection draws on.
pub enum Holder<'a> {
    /// A certificate: its serial, and whether it also draws on the server's budget.
    Cert { serial: &'a str, bounded: bool },
    /// A peer of an insecure cluster: a budget of its own connection.
    Plain,
}

impl Budgets {
    /// The meter of a new connection of `holder`.
    pub fn meter(&self, holder: Holder<'_>) -> Meter {
        match holder {
            Holder::Plain => Meter { own: fresh(), server: Some(self.server.clone()) },
            Holder::Cert { serial, bounded } => {
                let mut ids = self.identities.lock();
                ids.retain(|_, w| w.strong_count() > 0);
                let own = match ids.get(serial).and_then(Weak::upgrade) {
                    Some(s) => s,
                    None => {
                        let s = fresh();
                        ids.insert(serial.to_string(), Arc::downgrade(&s));
                        s
                    }
                };
                Meter { own, server: bounded.then(|| self.server.clone()) }
            }
        }
    }

    /// KiB of the server's budget taken now.
    #[cfg(test)]
    fn server_taken_kib(&self) -> u64 {
        u64::from(SERVER_BUDGET_KIB) - self.server.available_permits() as u64
    }
}

fn fresh() -> Arc<Semaphore> {
    Arc::new(Semaphore::new(IDENTITY_BUDGET_KIB as usize))
}

/// The budgets one connection draws on.
pub struct Meter {
    own: Arc<Semaphore>,
    server: Option<Arc<Semaphore>>,
}

/// A request's share of its budgets, given back when dropped (once its reply is written).
pub struct Share {
    own: OwnedSemaphorePermit,
    server: Option<OwnedSemaphorePermit>,
}

impl Meter {
    /// Waits until `kib` fit in this connection's budgets and takes them; `waited` is
    /// called when they do not fit at once.
    pub async fn take(&self, kib: u32, waited: impl FnOnce()) -> Share {
        let kib = kib.clamp(MIN_SHARE_KIB, IDENTITY_BUDGET_KIB);
        let mut waited = Some(waited);
        let mut wait = || {
            if let Some(w) = waited.take() {
                w()
            }
        };
        let own = match self.own.clone().try_acquire_many_owned(kib) {
            Ok(p) => p,
            Err(_) => {
                wait();
                self.own.clone().acquire_many_owned(kib).await.expect("budgets are never closed")
            }
        };
        // Own budget first, then the server's: nobody holds the server's while waiting
        // for an identity's, so the two cannot wait on each other.
        let over = self.over_guarantee(kib);
        let server = match &self.server {
            Some(s) if over > 0 => Some(match s.clone().try_acquire_many_owned(over) {
                Ok(p) => p,
                Err(_) => {
                    wait();
                    s.clone().acquire_many_owned(over).await.expect("budgets are never closed")
                }
            }),
            _ => None,
        };
        Share { own, server }
    }

    /// Of `kib` just taken from the identity's budget, the part past its guarantee.
    fn over_guarantee(&self, kib: u32) -> u32 {
        let used = IDENTITY_BUDGET_KIB - self.own.available_permits() as u32;
        used.saturating_sub(GUARANTEED_KIB).min(kib)
    }

    /// Grows `share` to `kib` (when a request turns out to need more than its bytes).
    pub async fn grow(&self, share: &mut Share, kib: u32, waited: impl FnOnce()) {
        let kib = kib.clamp(MIN_SHARE_KIB, IDENTITY_BUDGET_KIB);
        let have = share.own.num_permits() as u32;
        if kib > have {
            let more = self.take(kib - have, waited).await;
            share.own.merge(more.own);
            match (share.server.as_mut(), more.server) {
                (Some(s), Some(m)) => s.merge(m),
                (None, m) => share.server = m,
                (Some(_), None) => {}
            }
        }
    }
}

/// The share of a budget, in KiB, for `bytes` (rounded up).
pub fn kib(bytes: u64) -> u32 {
    bytes.div_ceil(1024).min(u64::from(u32::MAX)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Meter {
        /// `take` if it need not wait.
        fn try_take(&self, kib: u32) -> Option<Share> {
            let own = self.own.clone().try_acquire_many_owned(kib).ok()?;
            let over = self.over_guarantee(kib);
            let server = match &self.server {
                Some(s) if over > 0 => Some(s.clone().try_acquire_many_owned(over).ok()?),
                _ => None,
            };
            Some(Share { own, server })
        }
    }

    #[tokio::test]
    async fn connections_of_one_certificate_share_its_budget() {
        let b = Budgets::default();
        let m1 = b.meter(Holder::Cert { serial: "01", bounded: true });
        let m2 = b.meter(Holder::Cert { serial: "01", bounded: true });
        let other = b.meter(Holder::Cert { serial: "02", bounded: true });
        let big = m1.take(IDENTITY_BUDGET_KIB, || {}).await;
        assert!(m2.try_take(MIN_SHARE_KIB).is_none(), "the certificate's budget is spent");
        assert!(other.try_take(MIN_SHARE_KIB).is_some(), "another certificate is not held up");
        assert_eq!(b.server_taken_kib(), u64::from(IDENTITY_BUDGET_KIB - GUARANTEED_KIB));
        drop(big);
        assert!(m2.try_take(MIN_SHARE_KIB).is_some());
    }

    #[tokio::test]
    async fn bounded_identities_together_stop_at_the_server_budget_but_admins_do_not() {
        let b = Budgets::default();
        let n = SERVER_BUDGET_KIB / (IDENTITY_BUDGET_KIB - GUARANTEED_KIB);
        let held: Vec<Share> = futures::future::join_all((0..n).map(|i| {
            let m = b.meter(Holder::Cert { serial: &format!("u{i}"), bounded: true });
            async move { m.take(IDENTITY_BUDGET_KIB, || {}).await }
        }))
        .await;
        let rest = (u64::from(SERVER_BUDGET_KIB) - b.server_taken_kib()) as u32;
        let filler = b.meter(Holder::Cert { serial: "filler", bounded: true });
        let _filled = filler.try_take(GUARANTEED_KIB + rest).expect("the rest of the server's budget");
        assert_eq!(b.server_taken_kib(), u64::from(SERVER_BUDGET_KIB));
        let late = b.meter(Holder::Cert { serial: "late", bounded: true });
        let small = late.try_take(MIN_SHARE_KIB).expect("small requests fit in the guarantee");
        assert!(late.try_take(GUARANTEED_KIB).is_none(), "past its guarantee, the server's budget is spent");
        drop(small);
        let admin = b.meter(Holder::Cert { serial: "admin", bounded: false });
        assert!(admin.try_take(IDENTITY_BUDGET_KIB).is_some(), "an admin still gets room");
        drop(held);
        assert!(late.try_take(MIN_SHARE_KIB).is_some());
    }

    #[tokio::test]
    async fn a_share_grows_to_what_its_reply_may_hold() {
        let b = Budgets::default();
        let m = b.meter(Holder::Plain);
        let mut s = m.take(1, || {}).await;
        assert_eq!(s.own.num_permits() as u32, MIN_SHARE_KIB);
        assert!(s.server.is_none(), "within the guarantee");
        m.grow(&mut s, 4096, || {}).await;
        assert_eq!(s.own.num_permits(), 4096);
        let past = 4096 - GUARANTEED_KIB as usize;
        assert_eq!(s.server.as_ref().map(|p| p.num_permits()), Some(past));
        assert_eq!(b.server_taken_kib(), past as u64);
    }
}
