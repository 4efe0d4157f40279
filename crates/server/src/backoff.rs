//! The pauses between attempts of a call that must get through (a decision to deliver, a
//! shard to hand over, a parent's permissions to ask for) or an operation that lost to
//! another (a transaction retried): one type, so every retry loop of the server doubles
//! its pause the same way, optionally at random, and stops at the same kind of deadline.

use rand::Rng;
use std::time::Duration;
use tokio::time::Instant;

/// Pauses doubling from a first one up to a longest one.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    next: Duration,
    max: Duration,
    jitter: bool,
    deadline: Option<Instant>,
}

impl Backoff {
    /// Pauses of `first`, twice that, ... up to `max`.
    pub(crate) fn new(first: Duration, max: Duration) -> Backoff {
        Backoff { next: first, max, jitter: false, deadline: None }
    }

    /// For deliveries that must get through (decisions, urges, hand-overs): 50 ms
    /// doubling up to 2 s.
    pub(crate) fn delivery() -> Backoff {
        Backoff::new(Duration::from_millis(50), Duration::from_secs(2))
    }

    /// Each pause a random one between 1 ms and the doubling one (attempts of two
    /// conflicting operations then spread apart).
    pub(crate) fn jittered(mut self) -> Backoff {
        self.jitter = true;
        self
    }

    /// No pause ends after `deadline`: [`Backoff::wait`] answers false once it passed.
    pub(crate) fn until(mut self, deadline: Instant) -> Backoff {
        self.deadline = Some(deadline);
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

    /// Waits before the next attempt; false (without waiting) once the deadline passed.
    pub(crate) async fn wait(&mut self) -> bool {
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            return false;
        }
        let pause = self.next_pause();
        let until = Instant::now() + pause;
        tokio::time::sleep_until(self.deadline.map_or(until, |d| until.min(d))).await;
        true
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

    #[tokio::test]
    async fn a_deadline_ends_the_waits() {
        let mut b = Backoff::new(Duration::from_millis(40), Duration::from_millis(100))
            .until(Instant::now() + Duration::from_millis(60));
        assert!(b.wait().await);
        assert!(b.wait().await, "the second wait is cut at the deadline");
        assert!(!b.wait().await);
    }
}
