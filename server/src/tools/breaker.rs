//! A circuit breaker per tool: 3 failures within 2 minutes open it; after a cooldown (5 s,
//! doubling per trip up to 60 s) one trial call is let through (half-open); its success closes
//! the breaker, its failure opens it again.

use std::{
    collections::{HashMap, VecDeque},
    sync::Mutex,
    time::{Duration, Instant},
};

const FAILURES_TO_OPEN: usize = 3;
const FAILURE_WINDOW: Duration = Duration::from_secs(120);
const FIRST_COOLDOWN: Duration = Duration::from_secs(5);
const MAX_COOLDOWN: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BreakerState {
    Closed,
    Open,
    HalfOpen,
}

#[derive(Debug)]
struct Breaker {
    failures: VecDeque<Instant>,
    opened_at: Option<Instant>,
    cooldown: Duration,
    trial_in_flight: bool,
}

impl Default for Breaker {
    fn default() -> Self {
        Self { failures: VecDeque::new(), opened_at: None, cooldown: FIRST_COOLDOWN, trial_in_flight: false }
    }
}

impl Breaker {
    fn state(&self, now: Instant) -> BreakerState {
        match self.opened_at {
            None => BreakerState::Closed,
            Some(at) if now.duration_since(at) >= self.cooldown => BreakerState::HalfOpen,
            Some(_) => BreakerState::Open,
        }
    }
}

/// All tools' breakers. The clock is passed in so tests can move time.
#[derive(Debug, Default)]
pub struct Breakers {
    inner: Mutex<HashMap<String, Breaker>>,
}

/// A call [`Breakers::try_acquire`] let through, to be settled by how it ended. One dropped
/// unsettled (its future dropped when a job's budget ended or its lease was lost, or ended in a
/// way that says nothing about the provider) gives a half-open trial slot back: kept, the tool
/// would be refused until the process restarts.
#[must_use = "settle the call, or drop it to give its trial slot back"]
#[derive(Debug)]
pub struct Trial<'a> {
    breakers: &'a Breakers,
    tool: &'a str,
    /// It holds the half-open breaker's one trial slot (a call let through a closed breaker
    /// holds none, and gives none back).
    holds_slot: bool,
    settled: bool,
}

impl Trial<'_> {
    /// The provider answered: the breaker closes.
    pub fn succeeded(mut self) {
        self.settled = true;
        self.breakers.record_success(self.tool);
    }

    /// The provider failed: counted, and a failed trial opens the breaker again.
    pub fn failed(mut self, now: Instant) {
        self.settled = true;
        self.breakers.record_failure(self.tool, now);
    }
}

impl Drop for Trial<'_> {
    fn drop(&mut self) {
        if self.holds_slot && !self.settled {
            self.breakers.release(self.tool);
        }
    }
}

impl Breakers {
    /// May a call go ahead? In half-open state only one trial call at a time; the [`Trial`]
    /// says how the call ended.
    pub fn try_acquire<'a>(&'a self, tool: &'a str, now: Instant) -> Result<Trial<'a>, Duration> {
        let trial = |holds_slot| Trial { breakers: self, tool, holds_slot, settled: false };
        let Ok(mut map) = self.inner.lock() else { return Ok(trial(false)) };
        let b = map.entry(tool.to_string()).or_default();
        match b.state(now) {
            BreakerState::Closed => Ok(trial(false)),
            BreakerState::HalfOpen if !b.trial_in_flight => {
                b.trial_in_flight = true;
                Ok(trial(true))
            }
            BreakerState::HalfOpen => Err(Duration::from_secs(1)),
            BreakerState::Open => Err(b.cooldown.saturating_sub(now.duration_since(b.opened_at.unwrap_or(now)))),
        }
    }

    pub fn record_success(&self, tool: &str) {
        if let Ok(mut map) = self.inner.lock()
            && let Some(b) = map.get_mut(tool)
        {
            *b = Breaker::default();
        }
    }

    /// The call ended without telling anything about the provider (it was refused before
    /// reaching it): a half-open trial slot is given back, nothing else changes.
    pub fn release(&self, tool: &str) {
        if let Ok(mut map) = self.inner.lock()
            && let Some(b) = map.get_mut(tool)
        {
            b.trial_in_flight = false;
        }
    }

    pub fn record_failure(&self, tool: &str, now: Instant) {
        let Ok(mut map) = self.inner.lock() else { return };
        let b = map.entry(tool.to_string()).or_default();
        if b.trial_in_flight || b.state(now) == BreakerState::HalfOpen {
            // The trial failed: open again for twice as long.
            b.trial_in_flight = false;
            b.cooldown = (b.cooldown * 2).min(MAX_COOLDOWN);
            b.opened_at = Some(now);
            return;
        }
        b.failures.push_back(now);
        while b.failures.front().is_some_and(|t| now.duration_since(*t) > FAILURE_WINDOW) {
            b.failures.pop_front();
        }
        if b.failures.len() >= FAILURES_TO_OPEN && b.opened_at.is_none() {
            b.opened_at = Some(now);
            b.failures.clear();
        }
    }

    pub fn state(&self, tool: &str, now: Instant) -> BreakerState {
        self.inner.lock().ok().and_then(|m| m.get(tool).map(|b| b.state(now))).unwrap_or(BreakerState::Closed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_half_opens_and_closes() {
        let breakers = Breakers::default();
        let t0 = Instant::now();
        for i in 0..2 {
            breakers.record_failure("t", t0 + Duration::from_secs(i));
        }
        assert_eq!(breakers.state("t", t0 + Duration::from_secs(2)), BreakerState::Closed, "two failures keep it closed");
        breakers.record_failure("t", t0 + Duration::from_secs(3));
        assert_eq!(breakers.state("t", t0 + Duration::from_secs(3)), BreakerState::Open);
        assert!(breakers.try_acquire("t", t0 + Duration::from_secs(4)).is_err(), "open refuses");
        let later = t0 + Duration::from_secs(3) + FIRST_COOLDOWN;
        assert_eq!(breakers.state("t", later), BreakerState::HalfOpen);
        let trial = breakers.try_acquire("t", later).expect("one trial");
        assert!(breakers.try_acquire("t", later).is_err(), "only one trial at a time");
        trial.failed(later);
        assert_eq!(breakers.state("t", later + FIRST_COOLDOWN), BreakerState::Open, "cooldown doubled after a failed trial");
        let again = later + FIRST_COOLDOWN * 2;
        // A call let through while it was closed, dropped after it went half-open, does not
        // free the one trial's slot.
        let earlier = breakers.try_acquire("other", t0).expect("closed");
        for i in 0..3 {
            breakers.record_failure("other", t0 + Duration::from_secs(i));
        }
        let other_trial = breakers.try_acquire("other", again).expect("its trial");
        drop(earlier);
        assert!(breakers.try_acquire("other", again).is_err(), "still one trial at a time");
        other_trial.succeeded();
        // A trial dropped before it ended (its job's budget, a lost lease) gives its slot back:
        // the next call is the trial, instead of the tool refused until a restart.
        drop(breakers.try_acquire("t", again).expect("a trial"));
        breakers.try_acquire("t", again).expect("the slot came back").succeeded();
        assert_eq!(breakers.state("t", again), BreakerState::Closed, "one success closes it");
    }

    #[test]
    fn failures_outside_the_window_do_not_count() {
        let breakers = Breakers::default();
        let t0 = Instant::now();
        breakers.record_failure("t", t0);
        breakers.record_failure("t", t0 + Duration::from_secs(1));
        breakers.record_failure("t", t0 + FAILURE_WINDOW + Duration::from_secs(2));
        assert_eq!(breakers.state("t", t0 + FAILURE_WINDOW + Duration::from_secs(2)), BreakerState::Closed);
    }
}
