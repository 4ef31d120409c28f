//! Retry backoff: exponential with jitter, capped.

use std::time::Duration;

/// Delay before attempt `attempt + 1`, given that `attempt` (1-based) just failed:
/// `base * 2^(attempt-1)`, capped at `max`, with up to ±20% jitter so that a burst of failures
/// does not retry in lockstep.
pub fn backoff(attempt: i64, base: Duration, max: Duration) -> Duration {
    let exp = u32::try_from(attempt.saturating_sub(1).clamp(0, 30)).unwrap_or(30);
    let raw = base.saturating_mul(2u32.saturating_pow(exp)).min(max);
    let jitter = rand::random_range(0.8..1.2);
    raw.mul_f64(jitter).min(max)
}

/// How long a run waits, without using an attempt, for something an operator fixes (room on
/// the disk, a working access token): a minute, or `max` when shorter. Not the backoff, which
/// would stay at its first step since the attempt does not grow: a waiting reply would ask the
/// Graph API every second.
pub fn deployment_wait(max: Duration) -> Duration {
    max.min(Duration::from_secs(60))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_for_the_deployment_is_a_minute_at_most() {
        assert_eq!(deployment_wait(Duration::from_secs(3600)), Duration::from_secs(60));
        assert_eq!(deployment_wait(Duration::from_millis(100)), Duration::from_millis(100));
    }

    #[test]
    fn grows_and_caps() {
        let base = Duration::from_secs(1);
        let max = Duration::from_secs(60);
        for _ in 0..100 {
            let first = backoff(1, base, max);
            assert!(first >= Duration::from_millis(800) && first <= Duration::from_millis(1200), "{first:?}");
            let third = backoff(3, base, max);
            assert!(third >= Duration::from_millis(3200) && third <= Duration::from_millis(4800), "{third:?}");
            assert!(backoff(30, base, max) <= max);
        }
    }
}
