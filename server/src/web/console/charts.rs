//! The dashboard's charts: the last day of messages, tool calls (by decision and by outcome),
//! replies (delivered, failed with their codes) and job waits by hour; two weeks of model cost by
//! day; and, as they are now, the job queue by state, approvals waiting by age and MCP servers
//! by health. Each links to the list behind it.

use std::collections::BTreeMap;

use app::dto::{Chart, ChartBar, ChartSeries};
use sqlx::AnyConnection;

use crate::db::{
    self, DbError,
    stats::{FAILED_PREFIX, Group, Measure},
};

const HOUR_MS: i64 = 3_600_000;
const DAY_MS: i64 = 86_400_000;

/// Every chart of the dashboard at `now_ms`.
pub async fn all(conn: &mut AnyConnection, now_ms: i64) -> Result<Vec<Chart>, DbError> {
    let hours = Buckets { last: now_ms / HOUR_MS, count: 24, len_ms: HOUR_MS };
    let days = Buckets { last: now_ms / DAY_MS, count: 14, len_ms: DAY_MS };
    let messages = db::stats::grouped(conn, Measure::MessagesByRoute, hours.since_ms(), HOUR_MS).await?;
    let tool_calls = db::stats::grouped(conn, Measure::ToolCallsByDecision, hours.since_ms(), HOUR_MS).await?;
    let cost = db::stats::grouped(conn, Measure::ModelCostByPurpose, days.since_ms(), DAY_MS).await?;
    let outcomes = db::stats::grouped(conn, Measure::ToolCallsByOutcome, hours.since_ms(), HOUR_MS).await?;
    let replies = db::stats::grouped(conn, Measure::RepliesByDelivery, hours.since_ms(), HOUR_MS).await?;
    let waits = db::stats::grouped(conn, Measure::JobWaitMs, hours.since_ms(), HOUR_MS).await?;
    let no_wait = wait_empty(&waits);
    let jobs = db::jobs::counts_by_state(conn).await?;
    let approvals = db::stats::approvals_waiting_by_age(conn, now_ms).await?;
    let mcp = db::stats::mcp_servers_by_health(conn).await?;
    Ok(vec![
        stacked(
            "messages",
            "Messages per hour by route (last 24 hours, UTC)",
            Some("/traces?since_minutes=1440".into()),
            "count",
            &hours,
            messages,
            |route| Some(format!("/traces?route={route}&since_minutes=1440")),
            "No messages in the last 24 hours. Send one from the simulator on the Conversations page, or connect WhatsApp.",
        ),
        stacked(
            "tool_calls",
            "Tool calls per hour by decision (last 24 hours, UTC)",
            Some("/tools".into()),
            "count",
            &hours,
            tool_calls,
            |_| Some("/tools".into()),
            "No tool calls in the last 24 hours. Try a tool on the Tools page, or ask the bot something a tool answers.",
        ),
        stacked(
            "tool_outcomes",
            "Tool calls per hour by outcome (last 24 hours, UTC)",
            Some("/tools".into()),
            "count",
            &hours,
            outcomes,
            |_| Some("/tools".into()),
            "No tool calls in the last 24 hours: each call's outcome (OK, or the code it was refused or failed with) shows here.",
        ),
        stacked(
            "replies",
            "Replies per hour by delivery, failures by code (last 24 hours, UTC)",
            Some("/conversations".into()),
            "count",
            &hours,
            replies,
            |series| {
                Some(match series.strip_prefix(FAILED_PREFIX) {
                    Some(code) => format!("/traces?outcome=failed&error_code={code}&since_minutes=1440"),
                    None => "/conversations".into(),
                })
            },
            "No replies went out in the last 24 hours.",
        ),
        stacked(
            "job_wait",
            "Job wait per hour: average from due to started (last 24 hours, UTC)",
            Some("/jobs?since_minutes=1440".into()),
            "ms",
            &hours,
            waits,
            |_| Some("/jobs?since_minutes=1440".into()),
            no_wait,
        ),
        stacked(
            "model_cost",
            "Model cost per day by purpose (last 14 days, UTC)",
            None,
            "usd_micro",
            &days,
            cost,
            |_| None,
            "No priced model calls in the last 14 days. Calls are priced from [[models.prices]] in config/gatehouse.toml.",
        ),
        one_bar_each(
            "jobs",
            "Jobs by state",
            "/jobs",
            jobs.iter().map(|(state, n)| (state.as_str().to_string(), *n, Some(format!("/jobs?state={}", state.as_str())))),
            "The job queue is empty: jobs appear when messages, tool calls or notices are queued.",
        ),
        one_bar_each(
            "approvals_waiting",
            "Approvals waiting by age",
            "/approvals",
            APPROVAL_AGES.iter().enumerate().map(|(i, label)| {
                let n = approvals.iter().find(|(bucket, _)| *bucket == i as i64).map_or(0, |(_, n)| *n);
                ((*label).to_string(), n, Some("/approvals".to_string()))
            }),
            "No tool call is waiting for an owner.",
        ),
        one_bar_each(
            "mcp_health",
            "MCP servers by health",
            "/mcp",
            mcp.into_iter().map(|(health, n)| (health, n, Some("/mcp".to_string()))),
            "No MCP server is configured (config/mcp.toml).",
        ),
    ])
}

/// The age buckets of [`db::stats::approvals_waiting_by_age`].
const APPROVAL_AGES: [&str; 4] = ["under 5 min", "5-60 min", "1-24 h", "over a day"];

/// A bar per group, each its own series (a count now, not over time).
fn one_bar_each(id: &str, title: &str, link: &str, groups: impl Iterator<Item = (String, i64, Option<String>)>, empty: &str) -> Chart {
    let groups: Vec<(String, i64, Option<String>)> = groups.collect();
    Chart {
        id: id.into(),
        title: title.into(),
        link: Some(link.into()),
        unit: "count".into(),
        series: groups.iter().map(|(name, _, link)| ChartSeries { name: name.clone(), link: link.clone() }).collect(),
        bars: groups
            .iter()
            .enumerate()
            .map(|(i, (name, n, _))| ChartBar { label: name.clone(), values: (0..groups.len()).map(|j| if i == j { *n } else { 0 }).collect() })
            .collect(),
        over_time: false,
        empty: empty.into(),
    }
}

/// The last `count` buckets of `len_ms` up to and including bucket `last`.
struct Buckets {
    last: i64,
    count: i64,
    len_ms: i64,
}

impl Buckets {
    fn first(&self) -> i64 {
        self.last - self.count + 1
    }

    fn since_ms(&self) -> i64 {
        self.first() * self.len_ms
    }

    /// `14h` for an hour, `12-01` for a day (UTC).
    fn label(&self, bucket: i64) -> String {
        let at = time::OffsetDateTime::from_unix_timestamp(bucket * self.len_ms / 1000).unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
        if self.len_ms == HOUR_MS { format!("{:02}h", at.hour()) } else { format!("{:02}-{:02}", u8::from(at.month()), at.day()) }
    }
}

/// A stacked bar a bucket, a series a group name; series by total, largest first.
#[expect(clippy::too_many_arguments, reason = "each chart is one call naming all it shows")]
fn stacked(
    id: &str,
    title: &str,
    link: Option<String>,
    unit: &str,
    buckets: &Buckets,
    groups: Vec<Group>,
    series_link: impl Fn(&str) -> Option<String>,
    empty: &str,
) -> Chart {
    let mut totals: BTreeMap<String, i64> = BTreeMap::new();
    for g in &groups {
        *totals.entry(g.series.clone()).or_default() += g.value;
    }
    let mut names: Vec<(String, i64)> = totals.into_iter().collect();
    names.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let index: BTreeMap<&str, usize> = names.iter().enumerate().map(|(i, (n, _))| (n.as_str(), i)).collect();
    let bars = (buckets.first()..=buckets.last)
        .map(|bucket| {
            let mut values = vec![0; names.len()];
            for g in groups.iter().filter(|g| g.bucket == bucket) {
                values[index[g.series.as_str()]] += g.value;
            }
            ChartBar { label: buckets.label(bucket), values }
        })
        .collect();
    Chart {
        id: id.into(),
        title: title.into(),
        link,
        unit: unit.into(),
        series: names.iter().map(|(name, _)| ChartSeries { name: name.clone(), link: series_link(name) }).collect(),
        bars,
        over_time: true,
        empty: empty.into(),
    }
}

/// What the job wait chart says when every bar is zero: a wait is a measurement, not a count,
/// and a queue that starts its jobs within the millisecond they are due averages 0 ms an hour.
fn wait_empty(waits: &[Group]) -> &'static str {
    if waits.is_empty() { "No job started in the last 24 hours." } else { "Every job of the last 24 hours started within a millisecond of being due." }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Jobs that started at once average 0 ms: the chart says so, not that none started.
    #[test]
    fn waits_of_zero_are_not_no_jobs() {
        assert_eq!(wait_empty(&[]), "No job started in the last 24 hours.");
        let instant = [Group { bucket: 1, series: "average wait".into(), value: 0 }];
        assert!(wait_empty(&instant).contains("within a millisecond"));
    }

    #[test]
    fn groups_become_stacked_bars_in_bucket_order() {
        let hours = Buckets { last: 100, count: 3, len_ms: HOUR_MS };
        let group = |bucket, series: &str, value| Group { bucket, series: series.into(), value };
        let chart = stacked("m", "t", None, "count", &hours, vec![group(98, "chat", 1), group(100, "chat", 2), group(100, "tool_lane", 5), group(99, "degraded", 1)], |s| Some(format!("/traces?route={s}")), "none");
        let names: Vec<&str> = chart.series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["tool_lane", "chat", "degraded"], "largest total first");
        let values: Vec<Vec<i64>> = chart.bars.iter().map(|b| b.values.clone()).collect();
        assert_eq!(values, [vec![0, 1, 0], vec![0, 0, 1], vec![5, 2, 0]]);
        assert_eq!(chart.series[0].link.as_deref(), Some("/traces?route=tool_lane"));
        assert_eq!(hours.label(100), "04h", "hour 100 since the epoch is 04:00 UTC");
    }
}
