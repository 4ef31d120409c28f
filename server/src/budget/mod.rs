//! The model spend budget (`[budget]`): spend per UTC day and UTC month, read from `llm_calls`;
//! owners warned at each configured share, once per period across every process (the
//! `budget_warnings` row is the claim); and, at 100% with `at_limit = "degraded"`, customers
//! answered with the limit reply instead of a model call.
//!
//! Each process keeps the periods' spend in memory: it adds the cost of every call it records
//! and re-reads the database every `budget.refresh`, which brings in other processes' calls.
//! A read notes the newest call id it held, so a call of this process counts once, in the read
//! or on top of it (on PostgreSQL, whose ids can commit out of order, a call can go uncounted
//! until the next read; never counted twice).

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::Instant,
};

use serde::Serialize;

use crate::{
    config::{AtLimit, Settings},
    db::{self, Db, DbError, llm_calls::LlmCallRow, owner_notifications::Notification},
    domain::Role,
    jobs::JobQueue,
    llm::CallObserver,
    owners::notices,
};

/// The two budget periods, in UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, strum::IntoStaticStr)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum Period {
    Day,
    Month,
}

impl Period {
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// How an owner reads it in a warning (`budget.period_day`, `budget.period_month`).
    fn spoken(self, b: &crate::config::BudgetSettings) -> &str {
        match self {
            Self::Day => b.period_day.trim(),
            Self::Month => b.period_month.trim(),
        }
    }
}

/// One period with a budget: its key (`day:2026-12-01`, `month:2026-12`), what was spent and
/// the budget, in micro-dollars.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PeriodSpend {
    pub period: Period,
    pub key: String,
    pub starts_at: i64,
    pub spent_micro_usd: i64,
    pub budget_micro_usd: i64,
    /// Shares already warned about, ascending.
    pub warned: Vec<u32>,
}

impl PeriodSpend {
    /// Whole percent of the budget spent (rounded down).
    pub fn percent(&self) -> u32 {
        if self.budget_micro_usd <= 0 {
            return 0;
        }
        u32::try_from(i128::from(self.spent_micro_usd.max(0)) * 100 / i128::from(self.budget_micro_usd)).unwrap_or(u32::MAX)
    }

    pub fn exhausted(&self) -> bool {
        self.budget_micro_usd > 0 && self.spent_micro_usd >= self.budget_micro_usd
    }
}

/// US dollars from micro-dollars, as owners read them: two decimals.
pub fn usd(micro: i64) -> String {
    format!("{:.2}", micro as f64 / 1_000_000.0)
}

/// The periods that hold `now_ms`: (key, start in ms) of the UTC day and the UTC month.
pub fn periods_at(now_ms: i64) -> [(Period, String, i64); 2] {
    let at = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(now_ms) * 1_000_000).unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    let date = at.date();
    let month_start = date.replace_day(1).unwrap_or(date);
    let ms = |d: time::Date| d.midnight().assume_utc().unix_timestamp() * 1000;
    [
        (Period::Day, format!("day:{:04}-{:02}-{:02}", date.year(), u8::from(date.month()), date.day()), ms(date)),
        (Period::Month, format!("month:{:04}-{:02}", date.year(), u8::from(date.month())), ms(month_start)),
    ]
}

/// Micro-dollars from a configured amount in dollars.
fn micro(usd: f64) -> i64 {
    (usd * 1_000_000.0).round() as i64
}

/// A call this process recorded and counted before a read held it.
#[derive(Debug, Clone, Copy)]
struct Local {
    id: i64,
    at: i64,
    cost: i64,
}

/// A period as last read, with the newest call id that read held.
#[derive(Debug, Clone)]
struct Read {
    spend: PeriodSpend,
    through_id: i64,
}

/// The spend as last read, and the calls recorded here since. A call counts once: in the read
/// when its id is at most the read's newest, else from `local`. (Adding each call to a running
/// total instead counted a call twice when a read that already held it finished before the
/// call was added.)
#[derive(Debug, Default)]
struct Cache {
    read_at: Option<Instant>,
    periods: Vec<Read>,
    local: Vec<Local>,
}

impl Cache {
    /// The periods with their spend: as read, plus this process's calls the read did not hold.
    fn spend(&self) -> Vec<PeriodSpend> {
        self.periods
            .iter()
            .map(|read| {
                let mut period = read.spend.clone();
                let since: i64 = self.local.iter().filter(|c| c.id > read.through_id && c.at >= period.starts_at).map(|c| c.cost).sum();
                period.spent_micro_usd = period.spent_micro_usd.saturating_add(since);
                period
            })
            .collect()
    }

    /// Counts a call this process recorded, unless the last read already held it.
    fn add(&mut self, call: Local) {
        if self.periods.iter().any(|read| call.id > read.through_id) || self.periods.is_empty() {
            self.local.push(call);
        }
    }

    /// Takes a finished read in, unless a read that held more calls was taken in while it ran
    /// (reads can finish out of order).
    fn take(&mut self, read: Vec<Read>) {
        let stale = read.iter().any(|new| self.periods.iter().any(|old| old.spend.key == new.spend.key && old.through_id > new.through_id));
        if stale {
            return;
        }
        let held = read.iter().map(|r| r.through_id).min().unwrap_or(0);
        self.local.retain(|c| c.id > held);
        self.periods = read;
        self.read_at = Some(Instant::now());
    }
}

/// The budget of this deployment. Cheap to ask: the spend is cached (see the module docs).
pub struct Budget {
    settings: Arc<Settings>,
    db: Db,
    queue: JobQueue,
    cache: Mutex<Cache>,
}

impl std::fmt::Debug for Budget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Budget").field("daily_usd", &self.settings.budget.daily_usd).field("monthly_usd", &self.settings.budget.monthly_usd).finish_non_exhaustive()
    }
}

impl Budget {
    pub fn new(settings: Arc<Settings>, db: Db, queue: JobQueue) -> Self {
        Self { settings, db, queue, cache: Mutex::new(Cache::default()) }
    }

    pub fn enabled(&self) -> bool {
        self.settings.budget.enabled()
    }

    /// The periods that have a budget, with their spend (re-read when older than
    /// `budget.refresh` or when a period has ended).
    pub async fn status(&self) -> Result<Vec<PeriodSpend>, DbError> {
        if !self.enabled() {
            return Ok(Vec::new());
        }
        let now = db::now_ms();
        let current = periods_at(now);
        {
            let cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
            let fresh = cache.read_at.is_some_and(|at| at.elapsed() < self.settings.budget.refresh);
            let same = cache.periods.iter().all(|p| current.iter().any(|(_, key, _)| *key == p.spend.key));
            if fresh && same {
                return Ok(cache.spend());
            }
        }
        let b = &self.settings.budget;
        let mut conn = self.db.pool.acquire().await?;
        let mut periods = Vec::new();
        for (period, key, starts_at) in current {
            let budget = match period {
                Period::Day => micro(b.daily_usd),
                Period::Month => micro(b.monthly_usd),
            };
            if budget <= 0 {
                continue;
            }
            let spent = db::budget::spent_since(&mut conn, starts_at).await?;
            let warned = db::budget::warned(&mut conn, &key).await?;
            let spend = PeriodSpend { period, key, starts_at, spent_micro_usd: spent.micro_usd, budget_micro_usd: budget, warned };
            periods.push(Read { spend, through_id: spent.through_id });
        }
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        cache.take(periods);
        Ok(cache.spend())
    }

    /// The exhausted period that keeps `actor` from a model call, if the budget says so: only
    /// customers, only with `at_limit = "degraded"`.
    pub async fn limit_for(&self, actor: Role) -> Result<Option<PeriodSpend>, DbError> {
        if actor == Role::Owner || self.settings.budget.at_limit != AtLimit::Degraded || !self.enabled() {
            return Ok(None);
        }
        Ok(self.status().await?.into_iter().find(PeriodSpend::exhausted))
    }

    /// What a customer is told while the limit applies.
    pub fn limit_reply(&self) -> &str {
        &self.settings.budget.limit_reply
    }

    /// Counts a recorded call and warns the owners of every share it crossed.
    async fn add(&self, id: i64, row: &LlmCallRow, cost_micro_usd: i64) -> Result<(), DbError> {
        let correlation_id = &row.correlation_id;
        self.cache.lock().unwrap_or_else(PoisonError::into_inner).add(Local { id, at: row.at, cost: cost_micro_usd });
        for period in self.status().await? {
            self.warn(&period, correlation_id).await?;
        }
        Ok(())
    }

    /// Raises the warnings of `period` that its spend has reached and nobody has given yet.
    async fn warn(&self, period: &PeriodSpend, correlation_id: &str) -> Result<(), DbError> {
        let b = &self.settings.budget;
        let percent = period.percent();
        let due: Vec<u32> = b.warn_at.iter().copied().filter(|&share| share <= percent && !period.warned.contains(&share)).collect();
        // Only the highest share crossed is said; the lower ones are recorded as given, so a
        // jump from 40% to 90% sends one warning, not two.
        let Some(&top) = due.last() else {
            return Ok(());
        };
        let mut tx = self.db.begin_write().await?;
        let now = db::now_ms();
        let mut claimed_top = false;
        for &share in &due {
            let claimed = db::budget::claim_warning(&mut tx, &period.key, share, now, period.spent_micro_usd, period.budget_micro_usd).await?;
            claimed_top |= claimed && share == top;
        }
        if claimed_top {
            let mut message = b
                .warning
                .replace("{period}", period.period.spoken(b))
                .replace("{percent}", &percent.to_string())
                .replace("{spent}", &usd(period.spent_micro_usd))
                .replace("{budget}", &usd(period.budget_micro_usd));
            if period.exhausted() && b.at_limit == AtLimit::Degraded {
                message.push(' ');
                message.push_str(&b.degraded_notice);
            }
            let code = if period.exhausted() { "BUDGET_EXHAUSTED" } else { "BUDGET_WARNING" };
            let notice = Notification { at: now, hook: "budget".into(), tool: String::new(), reason_code: code.into(), message, correlation_id: correlation_id.to_string() };
            notices::raise(&mut tx, &self.queue, &notice, true).await?;
            tracing::warn!(period = %period.key, percent, code, "model spend budget warning raised");
        }
        self.queue.commit(tx).await?;
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(p) = cache.periods.iter_mut().map(|read| &mut read.spend).find(|p| p.key == period.key) {
            for share in due {
                if !p.warned.contains(&share) {
                    p.warned.push(share);
                }
            }
            p.warned.sort_unstable();
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl CallObserver for Budget {
    async fn recorded(&self, id: i64, row: &LlmCallRow) {
        let Some(cost) = row.cost_micro_usd.filter(|&c| c > 0) else {
            return;
        };
        if !self.enabled() {
            return;
        }
        if let Err(e) = self.add(id, row, cost).await {
            tracing::warn!(correlation_id = %row.correlation_id, error = %e, "model spend budget not checked");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periods_are_the_utc_day_and_month() {
        // 2026-12-01T06:30:00Z
        let now = 1_796_106_600_000;
        let [(day, day_key, day_start), (month, month_key, month_start)] = periods_at(now);
        assert_eq!((day, month), (Period::Day, Period::Month));
        assert_eq!(day_key, "day:2026-12-01");
        assert_eq!(month_key, "month:2026-12");
        assert_eq!(day_start, 1_796_083_200_000);
        assert_eq!(month_start, day_start);
        let [(_, next_day, _), (_, same_month, _)] = periods_at(now + 86_400_000);
        assert_eq!((next_day.as_str(), same_month.as_str()), ("day:2026-12-02", "month:2026-12"));
    }

    /// Each call counts once, whichever comes first: the read that holds it or this process
    /// adding it. A read that finished after a newer one is not taken in; a new period starts
    /// from what it read.
    #[test]
    fn a_call_counts_once_whether_a_read_or_the_add_comes_first() {
        let read = |key: &str, spent, through_id| Read {
            spend: PeriodSpend { period: Period::Day, key: key.into(), starts_at: 100, spent_micro_usd: spent, budget_micro_usd: 1_000_000, warned: vec![] },
            through_id,
        };
        let spent = |cache: &Cache| cache.spend().iter().map(|p| p.spent_micro_usd).collect::<Vec<_>>();
        let mut cache = Cache::default();
        cache.take(vec![read("day:2", 500, 5)]);
        // Added before any read holds it: counted from `local`.
        cache.add(Local { id: 6, at: 150, cost: 10 });
        assert_eq!(spent(&cache), [510]);
        // A read that holds call 6 counts it instead.
        cache.take(vec![read("day:2", 510, 6)]);
        assert_eq!(spent(&cache), [510]);
        // The race that counted twice: a read that holds call 7 lands before 7 is added.
        cache.take(vec![read("day:2", 530, 7)]);
        cache.add(Local { id: 7, at: 160, cost: 20 });
        assert_eq!(spent(&cache), [530]);
        // A slower read that began before call 8 finishes after a newer one: left out.
        cache.add(Local { id: 8, at: 170, cost: 1 });
        cache.take(vec![read("day:2", 531, 8)]);
        cache.take(vec![read("day:2", 530, 7)]);
        assert_eq!(spent(&cache), [531]);
        // A call from before a period began is not its spend; a new period starts from its read.
        cache.add(Local { id: 9, at: 50, cost: 4 });
        assert_eq!(spent(&cache), [531]);
        cache.take(vec![read("day:3", 0, 9)]);
        assert_eq!(spent(&cache), [0]);
    }

    #[test]
    fn percent_rounds_down_and_exhaustion_is_at_the_budget() {
        let spend = |spent, budget| PeriodSpend { period: Period::Day, key: String::new(), starts_at: 0, spent_micro_usd: spent, budget_micro_usd: budget, warned: vec![] };
        assert_eq!(spend(499_999, 1_000_000).percent(), 49);
        assert!(!spend(999_999, 1_000_000).exhausted());
        assert!(spend(1_000_000, 1_000_000).exhausted());
        assert_eq!(spend(2_500_000, 1_000_000).percent(), 250);
        assert_eq!(usd(1_234_567), "1.23");
    }
}
