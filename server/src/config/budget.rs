//! `[budget]`: a model spend budget per UTC day and per UTC month. Owners are warned at each
//! `warn_at` share of a budget, once per period, on the console and on WhatsApp; at 100% the
//! configured action applies. Spend is what `llm_calls` records, priced from `[models]`: calls to
//! a model without a price count nothing.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::duration_str;

/// What happens once a period's spend reaches its budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, strum::IntoStaticStr)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum AtLimit {
    /// Owners are warned; everyone is answered as before.
    WarnOnly,
    /// Customers get `limit_reply` and no model call until the period ends; owners are still
    /// answered.
    Degraded,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BudgetSettings {
    /// US dollars per UTC day; 0: no daily budget.
    pub daily_usd: f64,
    /// US dollars per UTC calendar month; 0: no monthly budget.
    pub monthly_usd: f64,
    /// Shares of a budget, in percent (ascending, 1 to 100), at which owners are warned, each
    /// once per period.
    pub warn_at: Vec<u32>,
    pub at_limit: AtLimit,
    /// What a customer is told instead of an answer while `at_limit = "degraded"` applies.
    pub limit_reply: String,
    /// The warning to owners: `{period}` (`period_day` or `period_month`), `{percent}`,
    /// `{spent}` and `{budget}` (US dollars) are filled in.
    pub warning: String,
    /// `{period}` in `warning`, for the daily and the monthly budget.
    pub period_day: String,
    pub period_month: String,
    /// Added to the warning at 100% when `at_limit = "degraded"`.
    pub degraded_notice: String,
    /// How often a process re-reads the period's spend from the database (other processes'
    /// calls included); between reads it adds its own calls.
    #[serde(with = "duration_str")]
    pub refresh: Duration,
}

impl Default for BudgetSettings {
    fn default() -> Self {
        Self {
            daily_usd: 0.0,
            monthly_usd: 0.0,
            warn_at: vec![50, 80, 100],
            at_limit: AtLimit::WarnOnly,
            limit_reply: "Sorry, I can't answer right now. The business has been told and will get back to you.".into(),
            warning: "Gatehouse: model spend {period} is at {percent}% of its budget (${spent} of ${budget}).".into(),
            period_day: "today".into(),
            period_month: "this month".into(),
            degraded_notice: "Customers now get the budget's limit reply until the period ends; owners are still answered.".into(),
            refresh: Duration::from_secs(30),
        }
    }
}

impl BudgetSettings {
    /// Whether any budget is set.
    pub fn enabled(&self) -> bool {
        self.daily_usd > 0.0 || self.monthly_usd > 0.0
    }

    /// Every text, by its key, for `check-config`.
    pub fn texts(&self) -> [(&'static str, &str); 5] {
        super::texts_by_key!(self, "budget": limit_reply, warning, degraded_notice, period_day, period_month)
    }
}
