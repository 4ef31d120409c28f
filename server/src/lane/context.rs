//! The tool context store (seed 000 §11): every summarised result of a chat is kept as a
//! context (the tool, its arguments without managed or secret fields, the summary, a bounded
//! redacted preview, the result's links and its entities in result order), so that a follow-up
//! ("what about Saturday?", "open the second one") has a referent. A chat reads only its own
//! contexts; contexts expire after `lane.context_ttl`, are bounded per chat by
//! `lane.contexts_per_chat`, and are swept by the [`SweepContexts`] job, which storing a context
//! queues and which runs every `lane.context_sweep_every` for as long as contexts remain.
//! Results of tools tagged with one of `lane.private_data_tags` are never kept.
//!
//! It also keeps the lane's clarifying questions ([`super::clarify`]), one per asking message,
//! open for `lane.clarification_ttl` to the person asked; the same job sweeps them.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::{
    clarify::{Clarification, Turn},
    detector::RecentContext,
    job::ToolCallJob,
};
use crate::{
    approvals,
    channel::Inbound,
    config::Settings,
    db::{
        self, Db, DbError,
        clarifications::{self, ClarificationRow},
        contexts::{self as store, ContextRow},
    },
    domain::ChatKind,
    jobs::{Handler, JobContext, JobError, JobKind, JobOutput, JobQueue},
    redact,
    tools::{ToolDef, canonical::canonical_json},
};

/// Most characters of one entity.
const ENTITY_MAX_CHARS: usize = 200;

/// The chat's contexts as the detector and the planner read them.
#[derive(Debug, Clone, Default)]
pub struct Recent {
    /// Newest first; none expired.
    pub contexts: Vec<RecentContext>,
    /// The chat had a context that has expired since: a follow-up of it is not answered from it.
    pub expired: bool,
}

pub struct ContextStore {
    db: Db,
    queue: JobQueue,
    settings: Arc<Settings>,
}

impl std::fmt::Debug for ContextStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContextStore").finish_non_exhaustive()
    }
}


impl ContextStore {
    pub fn new(db: Db, queue: JobQueue, settings: Arc<Settings>) -> Self {
        Self { db, queue, settings }
    }

    /// Keeps the summarised result of `job`'s call for its chat: the new context's id, or `None`
    /// when nothing new was stored. Calls asked for in the console (no chat) and private-data tools keep nothing;
    /// the result is kept as the summarizer reads it (without the tool's managed and secret
    /// fields, the chat id and the sender's number), and `pii_fields` (the audit's) are replaced.
    pub async fn keep(&self, job: &ToolCallJob, correlation_id: &str, tool: &ToolDef, output: &Value, summary: &str, pii_fields: &[String]) -> Result<Option<i64>, DbError> {
        let lane = &self.settings.lane;
        if !approvals::is_chat(&job.reply_to.channel) || super::adapter::is_private(&tool.spec, lane) {
            return Ok(None);
        }
        let mut args = job.args.clone();
        if let Value::Object(map) = &mut args {
            map.retain(|k, _| !tool.spec.managed_fields.contains(k) && !tool.spec.secret_fields.contains_key(k));
        }
        redact::redact_args_keeping_links(&mut args);
        let args = canonical_json(&args);
        let mut shown = super::summarizer::clean_with(output, &tool.spec.hidden_fields(), &[job.reply_to.chat_id.clone(), job.sender.clone()]);
        redact::redact_named(&mut shown, pii_fields, redact::PII_REDACTED);
        let preview: String = canonical_json(&shown).chars().take(lane.context_preview_chars as usize).collect();
        let found = Found::of(&shown, &lane.context_entity_fields, lane.context_max_entities as usize, lane.max_sources as usize);
        let source_key = {
            let mut h = Sha256::new();
            for part in [job.reply_to.channel.as_str(), job.reply_to.chat_id.as_str(), tool.spec.name.as_str(), args.as_str(), correlation_id] {
                h.update(part.as_bytes());
                h.update([0]);
            }
            hex::encode(h.finalize())
        };
        let now = db::now_ms();
        let row = ContextRow {
            id: 0,
            channel: job.reply_to.channel.clone(),
            chat_id: job.reply_to.chat_id.clone(),
            requester: Some(job.sender.clone()),
            tool: tool.spec.name.clone(),
            args,
            summary: summary.chars().take(lane.summary_max_chars as usize).collect(),
            preview,
            sources: serde_json::to_string(&found.sources).unwrap_or_else(|_| "[]".into()),
            citations: serde_json::to_string(&found.citations).unwrap_or_else(|_| "[]".into()),
            entities: serde_json::to_string(&found.entities).unwrap_or_else(|_| "[]".into()),
            source_key,
            trace_id: job.trace_id,
            created_at: now,
            expires_at: now.saturating_add(db::duration_ms(lane.context_ttl)),
        };
        let mut tx = self.db.begin_write().await?;
        let stored = store::insert(&mut tx, &row, i64::from(lane.contexts_per_chat)).await?;
        self.queue_sweep(&mut tx, now).await?;
        self.queue.commit(tx).await?;
        Ok(stored)
    }

    /// The sweep, unless one is queued already (its dedupe key).
    async fn queue_sweep(&self, tx: &mut sqlx::AnyConnection, now: i64) -> Result<(), DbError> {
        let mut sweep = self.queue.job(&SweepContexts {});
        sweep.dedupe_key = Some(SweepContexts::DEDUPE_KEY.into());
        sweep.correlation_id = SweepContexts::DEDUPE_KEY.into();
        sweep.scheduled_at = Some(now.saturating_add(db::duration_ms(self.settings.lane.context_sweep_every)));
        self.queue.enqueue_in(tx, &sweep).await?;
        Ok(())
    }

    /// Keeps `asked`, a question `inbound` put to its sender, open for `lane.clarification_ttl`
    /// (replacing what an earlier run of the message asked). Its id; none when questions are not
    /// kept.
    pub async fn ask(&self, inbound: &Inbound, asked: &Clarification, trace_id: Option<i64>) -> Result<Option<i64>, DbError> {
        let ttl = self.settings.lane.clarification_ttl;
        if ttl.is_zero() {
            return Ok(None);
        }
        let now = db::now_ms();
        let row = ClarificationRow {
            id: 0,
            channel: inbound.channel.clone(),
            chat_id: inbound.chat_id.clone(),
            requester: inbound.sender.clone(),
            turns: serde_json::to_string(&asked.turns).unwrap_or_else(|_| "[]".into()),
            tools: serde_json::to_string(&asked.tools).unwrap_or_else(|_| "[]".into()),
            asked_by: inbound.message_id.clone(),
            answered_by: None,
            trace_id,
            created_at: now,
            expires_at: now.saturating_add(db::duration_ms(ttl)),
        };
        let mut tx = self.db.begin_write().await?;
        let id = clarifications::ask(&mut tx, &row).await?;
        self.queue_sweep(&mut tx, now).await?;
        self.queue.commit(tx).await?;
        Ok(Some(id))
    }

    /// The open question `inbound` answers, taken for it: its sender's newest in its chat,
    /// asked by another message within `lane.clarification_ttl`. A message handled again takes
    /// the one it took the first time, and withdraws the one its earlier run asked (which may
    /// never have been sent); a question another message took is not taken twice.
    pub async fn answered(&self, inbound: &Inbound) -> Result<Option<Clarification>, DbError> {
        if self.settings.lane.clarification_ttl.is_zero() {
            return Ok(None);
        }
        let now = db::now_ms();
        let (channel, chat, sender, message) = (&inbound.channel, &inbound.chat_id, &inbound.sender, &inbound.message_id);
        let mut conn = self.db.pool.acquire().await?;
        if !clarifications::any_for(&mut conn, channel, chat, sender, message, now).await? {
            return Ok(None);
        }
        drop(conn);
        let mut tx = self.db.begin_write().await?;
        clarifications::withdraw(&mut tx, channel, message).await?;
        let row = clarifications::answered_by(&mut tx, channel, chat, sender, message, now).await?;
        let taken = match &row {
            Some(row) => clarifications::take(&mut tx, row.id, message).await?,
            None => false,
        };
        tx.commit().await.map_err(DbError::from)?;
        Ok(row.filter(|_| taken).as_ref().map(clarification_of))
    }

    /// The chat's live contexts, newest first, and whether one has expired. In a group, only
    /// the ones `sender`'s own messages made: a result holds more than the summary the group
    /// read (names, places, links), and a member's follow-up must not reach another's.
    pub async fn recent(&self, channel: &str, chat_id: &str, chat_kind: ChatKind, sender: &str) -> Result<Recent, DbError> {
        let now = db::now_ms();
        let mut conn = self.db.pool.acquire().await?;
        let requester = (chat_kind == ChatKind::Group).then_some(sender);
        let rows = store::recent(&mut conn, channel, chat_id, requester, now, i64::from(self.settings.lane.contexts_per_chat)).await?;
        let expired = store::has_expired(&mut conn, channel, chat_id, requester, now).await?;
        let contexts = rows
            .into_iter()
            .map(|r| RecentContext {
                id: Some(r.id.to_string()),
                tool: r.tool,
                args: serde_json::from_str(&r.args).unwrap_or(Value::Null),
                summary: r.summary,
                entities: serde_json::from_str(&r.entities).unwrap_or_default(),
                age_secs: u64::try_from(now.saturating_sub(r.created_at) / 1000).unwrap_or(0),
            })
            .collect();
        Ok(Recent { contexts, expired })
    }
}

/// A stored question as the lane reads it (a row that cannot be read has no turns or tools).
pub fn clarification_of(row: &ClarificationRow) -> Clarification {
    Clarification {
        id: Some(row.id.to_string()),
        turns: serde_json::from_str::<Vec<Turn>>(&row.turns).unwrap_or_default(),
        tools: serde_json::from_str(&row.tools).unwrap_or_default(),
    }
}

/// What a result names, in result order.
#[derive(Debug, Default, PartialEq)]
pub struct Found {
    pub entities: Vec<String>,
    pub sources: Vec<String>,
    /// Each listed item with both a title (or name) and a link.
    pub citations: Vec<Citation>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Citation {
    pub title: String,
    pub url: String,
}

/// Fields that hold an item's title, and its link, for citations.
const TITLE_FIELDS: [&str; 2] = ["title", "name"];
const LINK_FIELDS: [&str; 2] = ["url", "link"];

impl Found {
    /// The values of `fields` (any depth, case-insensitive) as entities and every http(s) link
    /// as a source, in the order the result lists them, without repeats.
    pub fn of(output: &Value, fields: &[String], max_entities: usize, max_sources: usize) -> Self {
        let mut found = Self::default();
        found.walk(output, None, fields, max_entities, max_sources);
        found
    }

    fn walk(&mut self, value: &Value, key: Option<&str>, fields: &[String], max_entities: usize, max_sources: usize) {
        match value {
            Value::Object(map) => {
                let text = |names: &[&str]| names.iter().find_map(|n| map.get(*n).and_then(Value::as_str)).map(str::trim).filter(|t| !t.is_empty());
                if let (Some(title), Some(url)) = (text(&TITLE_FIELDS), text(&LINK_FIELDS))
                    && (url.starts_with("https://") || url.starts_with("http://"))
                    && self.citations.len() < max_entities
                    && !self.citations.iter().any(|c| c.url == url && c.title == title)
                {
                    self.citations.push(Citation { title: title.chars().take(ENTITY_MAX_CHARS).collect(), url: url.to_string() });
                }
                for (k, v) in map {
                    self.walk(v, Some(k), fields, max_entities, max_sources);
                }
            }
            Value::Array(items) => {
                for v in items {
                    self.walk(v, key, fields, max_entities, max_sources);
                }
            }
            Value::String(_) | Value::Number(_) => {
                let text = match value {
                    Value::String(s) => s.trim().to_string(),
                    other => other.to_string(),
                };
                if text.is_empty() {
                    return;
                }
                if (text.starts_with("https://") || text.starts_with("http://")) && self.sources.len() < max_sources && !self.sources.contains(&text) {
                    self.sources.push(text.clone());
                }
                let wanted = key.is_some_and(|k| fields.iter().any(|f| f.eq_ignore_ascii_case(k)));
                if wanted && self.entities.len() < max_entities {
                    let text: String = text.chars().take(ENTITY_MAX_CHARS).collect();
                    if !self.entities.contains(&text) {
                        self.entities.push(text);
                    }
                }
            }
            _ => {}
        }
    }
}

/// Deletes expired contexts, and runs again after `lane.context_sweep_every` while any context
/// remains. At most one is queued per database (its dedupe key); storing a context queues it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SweepContexts {}

impl JobKind for SweepContexts {
    const KIND: &'static str = "lane.context_sweep";
}

impl SweepContexts {
    pub const DEDUPE_KEY: &'static str = "lane:context_sweep";
}

pub struct SweepHandler {
    db: Db,
    settings: Arc<Settings>,
}

impl SweepHandler {
    pub fn new(db: Db, settings: Arc<Settings>) -> Self {
        Self { db, settings }
    }
}

#[async_trait::async_trait]
impl Handler<SweepContexts> for SweepHandler {
    async fn run(&self, _args: SweepContexts, _ctx: &JobContext) -> Result<JobOutput, JobError> {
        let lane = &self.settings.lane;
        let mut tx = self.db.begin_write().await.map_err(DbError::from)?;
        // An expired context is kept one more ttl, so a late follow-up is told it expired.
        let swept = store::sweep(&mut tx, db::now_ms(), db::duration_ms(lane.context_ttl)).await?;
        // Questions likewise: an eval case made from an answer's trace takes its question.
        clarifications::sweep(&mut tx, db::now_ms().saturating_sub(db::duration_ms(lane.context_ttl))).await?;
        // Large results expire with the contexts that name them.
        db::tool_results::delete_before(&mut tx, db::now_ms().saturating_sub(db::duration_ms(lane.context_ttl).saturating_mul(2))).await?;
        let left = store::count(&mut tx).await? + db::tool_results::count(&mut tx).await? + clarifications::count(&mut tx).await?;
        tx.commit().await.map_err(DbError::from)?;
        let preview = Some(format!("swept {swept} expired tool context(s); {left} left"));
        Ok(JobOutput { preview, snooze: (left > 0).then_some(lane.context_sweep_every) })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn entities_and_sources_in_result_order() {
        let fields: Vec<String> = ["title", "url", "city"].map(String::from).to_vec();
        let output = json!({ "status": 200, "data": { "results": [
            { "title": "Opening hours", "url": "https://shop.example/hours", "snippet": "9 to 5" },
            { "title": "Directions", "url": "https://shop.example/map" },
            { "title": "Opening hours", "url": "https://shop.example/hours" },
        ], "city": "Lisbon" } });
        let found = Found::of(&output, &fields, 10, 3);
        assert_eq!(found.sources, vec!["https://shop.example/hours", "https://shop.example/map"]);
        assert_eq!(found.entities, vec!["Lisbon", "Opening hours", "https://shop.example/hours", "Directions", "https://shop.example/map"]);
        assert_eq!(
            found.citations,
            vec![
                Citation { title: "Opening hours".into(), url: "https://shop.example/hours".into() },
                Citation { title: "Directions".into(), url: "https://shop.example/map".into() },
            ],
            "every listed item with a title and a link, in order, once"
        );
        let few = Found::of(&output, &fields, 2, 1);
        assert_eq!((few.entities.len(), few.sources.len()), (2, 1), "bounded");
    }
}
