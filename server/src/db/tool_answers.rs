//! Each `tool.call` job's final answer, kept by job so that a retried job sends it again
//! instead of running its call a second time; and the mark a write's run leaves before its call
//! is made, so that a run whose answer was never kept does not make it again.

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
    /// A chainable tool's result as a chain's next step is planned from (JSON).
    pub output: Option<String>,
    /// Whether the lane took it for the reply to the message that asked (it waited for it),
    /// rather than leaving it to its own job to send.
    pub in_reply: bool,
}

#[derive(sqlx::FromRow)]
struct Row {
    answer: String,
    failure: Option<String>,
    used_model: i64,
    output: Option<String>,
    in_reply: i64,
}

/// The answer kept for job `job_id`, if one is.
pub async fn get(conn: &mut AnyConnection, job_id: i64) -> Result<Option<KeptAnswer>, DbError> {
    let row: Option<Row> = sqlx::query_as("SELECT answer, failure, used_model, output, in_reply FROM tool_answers WHERE job_id = $1").bind(job_id).fetch_optional(conn).await?;
    Ok(row.map(|r| KeptAnswer { text: r.answer, failure: r.failure, used_model: r.used_model != 0, output: r.output, in_reply: r.in_reply != 0 }))
}

/// Keeps the answer once; a second one for the same job changes nothing.
pub async fn keep(conn: &mut AnyConnection, job_id: i64, answer: &KeptAnswer) -> Result<(), DbError> {
    sqlx::query("INSERT INTO tool_answers (job_id, answer, failure, used_model, output, in_reply, at) VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (job_id) DO NOTHING")
        .bind(job_id)
        .bind(clean_text(&answer.text))
        .bind(answer.failure.as_deref())
        .bind(i64::from(answer.used_model))
        .bind(answer.output.as_deref().map(clean_text))
        .bind(i64::from(answer.in_reply))
        .bind(now_ms())
        .execute(conn)
        .await?;
    Ok(())
}

/// Says who sends job `job_id`'s answer: the lane, in the reply to the message that asked
/// (`in_reply`), or the job itself.
pub async fn mark_in_reply(conn: &mut AnyConnection, job_id: i64, in_reply: bool) -> Result<(), DbError> {
    sqlx::query("UPDATE tool_answers SET in_reply = $1 WHERE job_id = $2").bind(i64::from(in_reply)).bind(job_id).execute(conn).await?;
    Ok(())
}

/// Marks job `job_id`'s call as made, before it is: `false` when an earlier run marked it
/// (and, with no answer kept, its outcome is unknown).
pub async fn start(conn: &mut AnyConnection, job_id: i64) -> Result<bool, DbError> {
    let marked = sqlx::query("INSERT INTO tool_call_starts (job_id, at) VALUES ($1, $2) ON CONFLICT (job_id) DO NOTHING").bind(job_id).bind(now_ms()).execute(conn).await?;
    Ok(marked.rows_affected() == 1)
}

/// Whether job `job_id`'s call is marked as made ([`start`]).
pub async fn started(conn: &mut AnyConnection, job_id: i64) -> Result<bool, DbError> {
    Ok(sqlx::query_scalar::<_, i64>("SELECT job_id FROM tool_call_starts WHERE job_id = $1").bind(job_id).fetch_optional(conn).await?.is_some())
}

/// Removes job `job_id`'s mark: its call surely did not take effect (refused, never sent), and
/// another attempt may make it.
pub async fn unstart(conn: &mut AnyConnection, job_id: i64) -> Result<(), DbError> {
    sqlx::query("DELETE FROM tool_call_starts WHERE job_id = $1").bind(job_id).execute(conn).await?;
    Ok(())
}
