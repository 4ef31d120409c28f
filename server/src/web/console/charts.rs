//! The dashboard's charts: the last day of messages and tool calls by hour, two weeks of model
//! cost by day, and the job queue by state, each linked to the list behind it.

use std::collections::BTreeMap;

use app::dto::{Chart, ChartBar, ChartSeries};
use sqlx::AnyConnection;

use crate::db::{
    self, DbError,
    stats::{Group, Measure},
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
    let jobs = db::jobs::counts_by_state(conn).await?;
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
            "model_cost",
            "Model cost per day by purpose (last 14 days, UTC)",
            None,
            "usd_micro",
            &days,
            cost,
            |_| None,
            "No priced model calls in the last 14 days. Calls are priced from [[models.prices]] in config/gatehouse.toml.",
        ),
        Chart {
            id: "jobs".into(),
            title: "Jobs by state".into(),
            link: Some("/jobs".into()),
            unit: "count".into(),
            series: jobs.iter().map(|(state, _)| ChartSeries { name: state.as_str().into(), link: Some(format!("/jobs?state={}", state.as_str())) }).collect(),
            bars: jobs
                .iter()
                .enumerate()
                .map(|(i, (state, n))| ChartBar { label: state.as_str().into(), values: (0..jobs.len()).map(|j| if i == j { *n } else { 0 }).collect() })
                .collect(),
            empty: "The job queue is empty: jobs appear when messages, tool calls or notices are queued.".into(),
        },
    ])
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
        empty: empty.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
