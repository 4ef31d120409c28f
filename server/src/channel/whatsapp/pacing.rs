//! Pacing outbound messages: a token bucket per recipient (WhatsApp's pair rate limit, error
//! 131056) and one for the whole business number (its throughput, error 130429). Sends reserve a
//! slot and wait for it, so concurrent sends to one chat queue up instead of tripping the limit.
//! The buckets live in this process: several worker processes each pace on their own.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// May go negative: slots already promised to waiting senders.
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn full(capacity: f64, now: Instant) -> Self {
        Self { tokens: capacity, at: now }
    }

    fn refilled(self, capacity: f64, per_second: f64, now: Instant) -> Self {
        let gained = now.saturating_duration_since(self.at).as_secs_f64() * per_second;
        Self { tokens: (self.tokens + gained).min(capacity), at: now }
    }

    /// How long until the next slot after taking one.
    fn wait_after_take(self, per_second: f64) -> Duration {
        let after = self.tokens - 1.0;
        if after >= 0.0 { Duration::ZERO } else { Duration::from_secs_f64(-after / per_second) }
    }
}

/// Limits for a [`Pacer`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PacingLimits {
    pub pair_burst: u32,
    pub pair_interval: Duration,
    pub global_per_second: u32,
}

#[derive(Debug)]
pub struct Pacer {
    limits: PacingLimits,
    inner: Mutex<State>,
}

#[derive(Debug)]
struct State {
    pairs: HashMap<String, Bucket>,
    global: Bucket,
}

/// Recipient buckets kept before idle (full) ones are dropped.
const MAX_TRACKED: usize = 10_000;

impl Pacer {
    pub fn new(limits: PacingLimits) -> Self {
        let global = Bucket::full(f64::from(limits.global_per_second.max(1)), Instant::now());
        Self { limits, inner: Mutex::new(State { pairs: HashMap::new(), global }) }
    }

    fn pair_rate(&self) -> f64 {
        1.0 / self.limits.pair_interval.as_secs_f64().max(0.001)
    }

    /// Reserves a slot for one message to `recipient` and says how long to wait before sending.
    /// When that would exceed `max_wait`, nothing is reserved and `Err` carries the wait needed.
    pub fn reserve(&self, recipient: &str, max_wait: Duration) -> Result<Duration, Duration> {
        let now = Instant::now();
        let pair_cap = f64::from(self.limits.pair_burst.max(1));
        let global_cap = f64::from(self.limits.global_per_second.max(1));
        let pair_rate = self.pair_rate();
        let mut state = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let pair = state.pairs.get(recipient).copied().unwrap_or_else(|| Bucket::full(pair_cap, now)).refilled(pair_cap, pair_rate, now);
        let global = state.global.refilled(global_cap, global_cap, now);
        let wait = pair.wait_after_take(pair_rate).max(global.wait_after_take(global_cap));
        if wait > max_wait {
            return Err(wait);
        }
        if state.pairs.len() >= MAX_TRACKED {
            state.pairs.retain(|_, b| b.refilled(pair_cap, pair_rate, now).tokens < pair_cap);
        }
        state.pairs.insert(recipient.to_string(), Bucket { tokens: pair.tokens - 1.0, at: now });
        state.global = Bucket { tokens: global.tokens - 1.0, at: now };
        Ok(wait)
    }

    /// Meta said the pair limit was hit: empty the recipient's bucket so that later sends wait.
    pub fn penalize(&self, recipient: &str) {
        let mut state = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        state.pairs.insert(recipient.to_string(), Bucket { tokens: 0.0, at: Instant::now() });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_one_per_interval_per_recipient() {
        let pacer = Pacer::new(PacingLimits { pair_burst: 2, pair_interval: Duration::from_secs(6), global_per_second: 1000 });
        let max = Duration::from_secs(60);
        assert_eq!(pacer.reserve("a", max), Ok(Duration::ZERO));
        assert_eq!(pacer.reserve("a", max), Ok(Duration::ZERO));
        let third = pacer.reserve("a", max).expect("within max");
        assert!(third > Duration::from_millis(5900) && third <= Duration::from_secs(6), "{third:?}");
        let fourth = pacer.reserve("a", max).expect("within max");
        assert!(fourth > Duration::from_millis(11_900), "queued behind the third: {fourth:?}");
        assert_eq!(pacer.reserve("b", max), Ok(Duration::ZERO), "other recipients are not held up");
        assert!(pacer.reserve("a", Duration::from_secs(1)).is_err(), "too long a wait reserves nothing");
    }

    #[test]
    fn the_global_rate_holds_across_recipients() {
        let pacer = Pacer::new(PacingLimits { pair_burst: 10, pair_interval: Duration::from_secs(1), global_per_second: 2 });
        let max = Duration::from_secs(10);
        let waits: Vec<Duration> = ["a", "b", "c", "d"].iter().map(|r| pacer.reserve(r, max).expect("reserve")).collect();
        assert_eq!(&waits[..2], &[Duration::ZERO, Duration::ZERO]);
        assert!(waits[2] > Duration::from_millis(400) && waits[3] > Duration::from_millis(900), "{waits:?}");
    }
}
