//! Results too large to pass inline: stored whole (up to [`HARD_RESULT_LIMIT`]), the caller
//! given a bounded summary and a reference to fetch the rest.

use serde_json::Value;

use super::{CallContext, Checkpoint, HARD_RESULT_LIMIT, ToolFailure, fail};
use crate::{db, tools::catalog::ToolSpec};

/// Characters of a stored result's summary (at most the tool's inline limit).
const SUMMARY_CHARS: usize = 2_000;

impl Checkpoint {
    /// A result over the tool's inline limit is stored whole (cut at [`HARD_RESULT_LIMIT`], and
    /// said so); the caller gets a bounded summary and a reference to fetch the rest.
    ///
    /// The stored text and the summary are the result without its secrets (fields whose names
    /// look secret, and the tool's secret and managed fields): the summarizer, which removes
    /// those from a result it is given, reads this one as text.
    pub(super) async fn bound_size(&self, spec: &ToolSpec, mut output: Value, ctx: &CallContext) -> Result<Value, ToolFailure> {
        let correlation_id = ctx.correlation_id.as_str();
        let inline_limit = usize::try_from(spec.max_result_bytes).unwrap_or(usize::MAX);
        if output.to_string().len() <= inline_limit {
            return Ok(output);
        }
        spec.redact_result(&mut output);
        let text = output.to_string();
        let size = text.len();
        let truncated = size > HARD_RESULT_LIMIT;
        let mut cut = HARD_RESULT_LIMIT.min(size);
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        let body = &text[..cut];
        let id = format!("res_{}", uuid::Uuid::new_v4().simple());
        let stored = async {
            let mut conn = self.db.pool.acquire().await?;
            db::tool_results::insert(
                &mut conn,
                &db::tool_results::StoredResult { id: &id, tool: &spec.name, correlation_id, size_bytes: size as i64, truncated, body, chat_id: ctx.chat_id.as_deref() },
            )
            .await
        }
        .await;
        // The database's failure (its code: STORAGE_FULL, DATABASE_ERROR), not the provider's,
        // and one another attempt may clear: a job that asked waits for room without using an
        // attempt. The call happened (the caller marks it so).
        if let Err(e) = stored {
            tracing::error!(code = e.code(), error = %e, tool = %spec.name, "storing a large tool result failed");
            return Err(ToolFailure { retryable: true, ..fail(e.code(), "the result was too large to pass on and could not be stored") });
        }
        let summary: String = text.chars().take(SUMMARY_CHARS.min(inline_limit)).collect();
        Ok(serde_json::json!({
            "summary": summary,
            "result_ref": id,
            "size_bytes": size,
            "truncated": truncated,
            "note": if truncated { format!("The result was {size} bytes; only the first {HARD_RESULT_LIMIT} were kept.") } else { format!("The whole result ({size} bytes) is stored under result_ref.") },
        }))
    }

    /// The stored text of a large result, by its reference.
    pub async fn fetch_result(&self, id: &str) -> Result<Option<String>, db::DbError> {
        let mut conn = self.db.pool.acquire().await?;
        db::tool_results::get(&mut conn, id).await
    }
}
