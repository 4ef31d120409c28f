//! Each `tool.call` job's final answer, kept by job so that a retried job sends it again
//! instead of running its call a second time.

use sqlx::AnyConnection;

use super::{DbError, clean_text, now_ms};

/// A call's final answer as the person is told it.
#[derive(Debug, Clone, PartialEq)]
pub struct KeptAnswer {
    pub text: String,
    /// `None` when the call succeeded; else its code.
    pub failure: Option<String>,
    /// Whether the summarizer model wrote it.
    pub used_model: bool,
    /// Whether the lane took it for the reply to the message that asked (it waited for it),
    /// rather than leaving it to its own job to send.
    pub in_reply: bool,
}

/// The answer kept for job `job_id`, if one is.
pub async fn get(conn: &mut AnyConnection, job_id: i64) -> Result<Option<KeptAnswer>, DbError> {
    let row: Option<(String, Option<String>, i64, i64)> =
        sqlx::query_as("SELECT answer, failure, used_model, in_reply FROM tool_answers WHERE job_id = $1").bind(job_id).fetch_optional(conn).await?;
    Ok(row.map(|(text, failure, used_model, in_reply)| KeptAnswer { text, failure, used_model: used_model != 0, in_reply: in_reply != 0 }))
}

/// Keeps the answer once; a second one for the same job changes nothing.
pub async fn keep(conn: &mut AnyConnection, job_id: i64, answer: &KeptAnswer) -> Result<(), DbError> {
    sqlx::query("INSERT INTO tool_answers (job_id, answer, failure, used_model, in_reply, at) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (job_id) DO NOTHING")
        .bind(job_id)
        .bind(clean_text(&answer.text))
        .bind(answer.failure.as_deref())
        .bind(i64::from(answer.used_model))
        .bind(i64::from(answer.in_reply))
        .bind(now_ms())
        .execute(conn)
        .await?;
    Ok(())
}
