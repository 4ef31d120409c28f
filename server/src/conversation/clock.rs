//! What the models are told of the date and time: a model knows neither, and "tomorrow",
//! "this Saturday" or "are you open now?" mean the business's day, in its time zone
//! (`conversation.timezone`). The facts go with the system prompt of normal chat, the
//! planner and the summarizer.

use jiff::{Timestamp, tz::TimeZone};
use serde_json::{Value, json};

/// The date, weekday and time (to the minute) at `at` in time zone `zone` (an IANA name, as
/// `check-config` accepts it; an unknown name reads as UTC, and says so).
pub fn facts_at(at: Timestamp, zone: &str) -> Value {
    let (tz, name) = match TimeZone::get(zone) {
        Ok(tz) => (tz, zone),
        Err(_) => (TimeZone::UTC, "UTC"),
    };
    let local = at.to_zoned_datetime(tz);
    json!({
        "date": local.strftime("%Y-%m-%d").to_string(),
        "weekday": local.strftime("%A").to_string(),
        "time": local.strftime("%H:%M").to_string(),
        "timezone": name,
    })
}

/// [`facts_at`] now.
pub fn facts(zone: &str) -> Value {
    facts_at(Timestamp::now(), zone)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_date_and_time_are_the_business_s() {
        let at: Timestamp = "2026-12-05T23:30:00Z".parse().expect("timestamp");
        assert_eq!(facts_at(at, "UTC"), json!({ "date": "2026-12-05", "weekday": "Saturday", "time": "23:30", "timezone": "UTC" }));
        // Already Sunday in Tokyo, still Saturday evening in New York.
        assert_eq!(facts_at(at, "Asia/Tokyo")["weekday"], "Sunday");
        assert_eq!(facts_at(at, "Asia/Tokyo")["date"], "2026-12-06");
        assert_eq!(facts_at(at, "America/New_York")["time"], "18:30");
        assert_eq!(facts_at(at, "Mars/Olympus")["timezone"], "UTC");
    }
}
