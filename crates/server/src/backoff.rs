//! The pauses between attempts of a call that must get through (a decision to deliver, a
//! shard to hand over, a parent's permissions to ask for) or an operation that lost to
//! another (a transaction retried): one type, so every retry loop of the server doubles
//! its pause the same way, optionally at random. When to give up is the loop's own
//! business (a number of attempts, a deadline checked before each pause). The pauses of
//! each kind of loop come from the map's `[retry]` settings.

use plusfs_placement::{BackoffSetting, ClusterMap};
use rand::Rng;
use std::time::Duration;

/// Pauses doubling from a first one up to a longest one.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    next: Duration,
    max: Duration,
    jitter: bool,
}

impl Backoff {
    /// Pauses of `first`, twice that, ... up to `max`.
    pub(crate) fn new(first: Duration, max: Duration) -> Backoff {
        Backoff { next: first, max, jitter: false }
    }

    /// Pauses as `setting` says.
    pub(crate) fn from_setting(setting: BackoffSetting) -> Backoff {
        Backoff::new(Duration::from_millis(setting.first_ms), Duration::from_millis(setting.max_ms))
    }

    /// For deliveries that must get through (decisions, urges, hand-overs):
    /// `[retry] delivery`.
    pub(crate) fn delivery(map: &ClusterMap) -> Backoff {
        Backoff::from_setting(map.retry.delivery)
    }

    /// For a cross-server operation that lost to another, tried again: `[retry] conflict`,
    /// jittered.
    pub(crate) fn conflict(map: &ClusterMap) -> Backoff {
        Backoff::from_setting(map.retry.conflict).jittered()
    }

    /// For asking an unreachable parent's home for its permissions: `[retry] parent`.
    pub(crate) fn parent(map: &ClusterMap) -> Backoff {
        Backoff::from_setting(map.retry.parent)
    }

    /// Each pause a random one between 1 ms and the doubling one (attempts of two
    /// conflicting operations then spread apart).
    pub(crate) fn jittered(mut self) -> Backoff {
        self.jitter = true;
        self
    }

    /// The next pause (doubling the one after it).
    pub(crate) fn next_pause(&mut self) -> Duration {
        let pause = match self.jitter {
            true => {
                let ms = self.next.as_millis().max(1) as u64;
                Duration::from_millis(rand::thread_rng().gen_range(1..=ms))
            }
            false => self.next,
        };
        self.next = (self.next * 2).min(self.max);
        pause
    }

    /// Waits before the next attempt.
    pub(crate) async fn wait(&mut self) {
        tokio::time::sleep(self.next_pause()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_up_to_the_longest() {
        let mut b = Backoff::new(Duration::from_millis(50), Duration::from_millis(300));
        let pauses: Vec<u64> = (0..5).map(|_| b.next_pause().as_millis() as u64).collect();
        assert_eq!(pauses, [50, 100, 200, 300, 300]);
        let mut j = Backoff::new(Duration::from_millis(8), Duration::from_millis(64)).jittered();
        for bound in [8, 16, 32, 64, 64] {
            let p = j.next_pause().as_millis() as u64;
            assert!((1..=bound).contains(&p), "{p} within 1..={bound}");
        }
    }

    #[test]
    fn each_kind_pauses_as_the_map_says() {
        let mut map = ClusterMap::with_servers(vec![plusfs_placement::ServerEntry::new(0, "127.0.0.1:1".into(), 1.0)]);
        map.retry.delivery = BackoffSetting { first_ms: 7, max_ms: 20 };
        let pauses: Vec<u64> = (0..3)
            .map({
                let mut b = Backoff::delivery(&map);
                move |_| b.next_pause().as_millis() as u64
            })
            .collect();
        assert_eq!(pauses, [7, 14, 20]);
        assert_eq!(Backoff::parent(&map).next_pause(), Duration::from_millis(50), "the default");
        assert!(Backoff::conflict(&map).next_pause() <= Duration::from_millis(4));
    }

    #[tokio::test]
    async fn a_wait_lasts_the_pause() {
        let mut b = Backoff::new(Duration::from_millis(30), Duration::from_millis(100));
        let t = tokio::time::Instant::now();
        b.wait().await;
        b.wait().await;
        assert!(t.elapsed() >= Duration::from_millis(90), "30 then 60 ms: {:?}", t.elapsed());
    }
}
