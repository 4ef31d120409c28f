//! One `llm_calls` row per model call: who asked (purpose, correlation id), what it cost
//! (tokens, micro-dollars), how it went (outcome code, attempts, latency). Never message text,
//! tool arguments or keys.

use std::sync::Arc;

use tracing::Instrument;

use super::{ChatModel, ChatRequest, ChatResponse, LlmError, Usage};
use crate::{
    config::ModelPrice,
    db::{Db, llm_calls::LlmCallRow, now_ms},
};

/// Cost in micro-dollars. Prices are US dollars per million tokens, which is exactly
/// micro-dollars per token.
pub fn cost_micro_usd(usage: &Usage, price: &ModelPrice) -> i64 {
    let cache_read = price.cache_read.unwrap_or(price.input);
    let cache_write = price.cache_write.unwrap_or(price.input);
    let micro = usage.input_tokens as f64 * price.input
        + usage.output_tokens as f64 * price.output
        + usage.cache_read_tokens as f64 * cache_read
        + usage.cache_write_tokens as f64 * cache_write;
    micro.round() as i64
}

fn tokens(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The row for one finished call. The price is looked up by the requested model first, then by
/// the model the provider says answered.
pub fn call_row(provider: &str, req: &ChatRequest, result: &Result<ChatResponse, LlmError>, prices: &[ModelPrice]) -> LlmCallRow {
    let price_of = |model: &str| prices.iter().find(|p| p.model == model);
    let (usage, outcome, stop_reason, status, attempts, latency, request_id, price) = match result {
        Ok(r) => (
            r.usage,
            "ok".to_string(),
            Some(r.stop_reason.as_str().to_string()),
            Some(200),
            r.attempts,
            r.latency,
            r.request_id.clone(),
            price_of(&req.model).or_else(|| price_of(&r.model)),
        ),
        Err(e) => (e.usage, e.code.as_str().to_string(), None, e.status, e.attempts, e.latency, e.request_id.clone(), price_of(&req.model)),
    };
    LlmCallRow {
        at: now_ms(),
        provider: provider.to_string(),
        model: req.model.clone(),
        purpose: req.purpose.as_str().to_string(),
        correlation_id: req.correlation_id.clone(),
        input_tokens: tokens(usage.input_tokens),
        output_tokens: tokens(usage.output_tokens),
        cache_read_tokens: tokens(usage.cache_read_tokens),
        cache_write_tokens: tokens(usage.cache_write_tokens),
        cost_micro_usd: price.map(|p| cost_micro_usd(&usage, p)),
        latency_ms: i64::try_from(latency.as_millis()).unwrap_or(i64::MAX),
        outcome,
        stop_reason,
        http_status: status.map(i64::from),
        attempts: i64::from(attempts),
        request_id,
    }
}

/// Told of every recorded call after its row is written, with the row's id (the spend budget
/// counts them).
#[async_trait::async_trait]
pub trait CallObserver: Send + Sync {
    async fn recorded(&self, id: i64, row: &LlmCallRow);
}

/// Several observers, each told of every call in turn.
pub struct Observers(pub Vec<Arc<dyn CallObserver>>);

#[async_trait::async_trait]
impl CallObserver for Observers {
    async fn recorded(&self, id: i64, row: &LlmCallRow) {
        for observer in &self.0 {
            observer.recorded(id, row).await;
        }
    }
}

/// A [`ChatModel`] that records every call it passes on. A failed write is logged and does not
/// fail the call: the reply matters more than its bookkeeping.
pub struct Recorded {
    inner: Arc<dyn ChatModel>,
    db: Db,
    prices: Vec<ModelPrice>,
    observer: Option<Arc<dyn CallObserver>>,
}

impl Recorded {
    pub fn new(inner: Arc<dyn ChatModel>, db: Db, prices: Vec<ModelPrice>, observer: Option<Arc<dyn CallObserver>>) -> Self {
        Self { inner, db, prices, observer }
    }
}

#[async_trait::async_trait]
impl ChatModel for Recorded {
    fn provider(&self) -> &'static str {
        self.inner.provider()
    }

    fn supports_strict_tools(&self) -> bool {
        self.inner.supports_strict_tools()
    }

    /// The call and its record run in a task of their own: a caller that stops waiting (a
    /// message's deadline, a job's timeout) drops only its wait, and the call, which the
    /// provider may bill, is still recorded and counted against the budget when it ends.
    async fn chat(&self, req: &ChatRequest) -> Result<ChatResponse, LlmError> {
        let (inner, db, prices, observer, req) = (self.inner.clone(), self.db.clone(), self.prices.clone(), self.observer.clone(), req.clone());
        let call = crate::telemetry::Telemetry::carry(async move {
            let result = inner.chat(&req).await;
            record(inner.provider(), &req, &result, &db, &prices, observer.as_deref()).await;
            result
        });
        tokio::spawn(call.instrument(tracing::Span::current())).await.unwrap_or_else(|e| Err(LlmError::new(super::ErrorCode::ProviderError, format!("the model call stopped unexpectedly: {e}"), true)))
    }
}

/// Writes the `llm_calls` row of a finished call, counts it in the metrics and tells `observer`.
async fn record(provider: &str, req: &ChatRequest, result: &Result<ChatResponse, LlmError>, db: &Db, prices: &[ModelPrice], observer: Option<&dyn CallObserver>) {
    let row = call_row(provider, req, result, prices);
    let labels = [("provider", row.provider.clone()), ("purpose", row.purpose.clone())];
    metrics::counter!("llm_calls_total", "provider" => row.provider.clone(), "purpose" => row.purpose.clone(), "outcome" => row.outcome.clone()).increment(1);
    metrics::histogram!("llm_call_duration_seconds", &labels).record(row.latency_ms as f64 / 1000.0);
    for (kind, n) in [("input", row.input_tokens), ("output", row.output_tokens), ("cache_read", row.cache_read_tokens), ("cache_write", row.cache_write_tokens)] {
        metrics::counter!("llm_tokens_total", "provider" => row.provider.clone(), "purpose" => row.purpose.clone(), "kind" => kind).increment(u64::try_from(n).unwrap_or(0));
    }
    let written = async {
        let mut conn = db.pool.acquire().await?;
        crate::db::llm_calls::insert(&mut conn, &row).await
    }
    .await;
    match written {
        Ok(id) => {
            if let Some(observer) = observer {
                observer.recorded(id, &row).await;
            }
        }
        Err(e) => tracing::warn!(correlation_id = %req.correlation_id, purpose = req.purpose.as_str(), error = %e, "LLM call not recorded"),
    }
}
