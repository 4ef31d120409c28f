//! Tells the owners when a message to a person is undelivered for good: Meta refused the send
//! for good, or reported it `failed` after accepting it (the number cannot receive it, the
//! person's 24-hour window closed with no template to send instead, ...). The person may be
//! waiting for an answer that will not come. The notice is in the console and goes to every
//! owner number, at most once per chat per `whatsapp.undelivered_notice_every` together with
//! the unhandled-message notice (`unhandled`), and on WhatsApp once per cause in that period
//! ([`tell_once`]). A failed message to an owner raises none (its notice would meet the same
//! trouble).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::{
    config::Settings,
    db::{self, Db, DbError, owner_notifications::Notification, whatsapp as store},
    jobs::{Handler, JobContext, JobError, JobKind, JobOutput, JobQueue},
    owners::notices,
};

/// The notice's stable code, in the console's list of owner notices.
pub const REPLY_UNDELIVERED: &str = "REPLY_UNDELIVERED";
/// Its kind among a chat's once-per-period notes, shared with the unhandled-message notice.
const NOTE_KIND: &str = "reply_undelivered";
/// The chat a cause's once-per-period claim is made for: every chat.
const ANY_CHAT: &str = "*";

/// Looks at the message Meta reported failed, and tells the owners if it is due.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UndeliveredNotice {
    /// The message Meta reported failed; empty for a send it refused (see `key`).
    pub wamid: String,
    /// The ledger key of a part whose send Meta refused (it has no wamid).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The trace the failure was added to, for the notice's link.
    pub trace_id: Option<i64>,
}

impl JobKind for UndeliveredNotice {
    const KIND: &'static str = "whatsapp.undelivered";
}

impl UndeliveredNotice {
    /// Its job: one per failed message (a status delivered twice changes the ledger once, and
    /// the key holds for a job not yet finished).
    pub fn job(&self, queue: &JobQueue) -> crate::db::jobs::NewJob {
        let mut job = queue.job(self);
        job.dedupe_key = Some(format!("{}:{}", Self::KIND, self.key.as_deref().unwrap_or(&self.wamid)));
        job
    }
}

pub struct Undelivered {
    db: Db,
    queue: JobQueue,
    settings: Arc<Settings>,
}

impl Undelivered {
    pub fn new(db: Db, queue: JobQueue, settings: Arc<Settings>) -> Self {
        Self { db, queue, settings }
    }

    async fn tell(&self, args: &UndeliveredNotice, correlation_id: &str) -> Result<&'static str, DbError> {
        let whatsapp = &self.settings.whatsapp;
        if whatsapp.undelivered_notice.trim().is_empty() {
            return Ok("whatsapp.undelivered_notice is empty: no notice");
        }
        let mut conn = self.db.pool.acquire().await?;
        let row = match &args.key {
            Some(key) => store::outbound_by_key(&mut conn, key).await?,
            None => store::outbound_by_wamid(&mut conn, &args.wamid).await?,
        };
        let Some(row) = row else { return Ok("no such message in the ledger") };
        let code = row.error_code.clone().unwrap_or_else(|| "WHATSAPP_FAILED".into());
        // Outside the window, the configured template goes in its place (a job of its own).
        if code == "131047" && row.kind != "template" && !whatsapp.window_template.trim().is_empty() {
            return Ok("the window template goes in its place: no notice");
        }
        if !row.is_group && db::owners::owner_by_phone(&mut conn, &row.recipient).await?.is_some() {
            return Ok("a message to an owner: no notice");
        }
        // The notice carries the correlation id of the work whose message failed, so logs and
        // traces lead from one to the other.
        let correlation_id = match row.job_id {
            Some(id) => db::jobs::get(&mut conn, id).await?.map_or_else(|| correlation_id.to_string(), |job| job.correlation_id),
            None => correlation_id.to_string(),
        };
        drop(conn);
        let console = self.settings.server.console_url();
        // Its trace, or (a message no trace began, an owner's decision told) its chat.
        let link = args.trace_id.map_or_else(|| format!("{console}/conversations/{}/{}", crate::channel::WHATSAPP, row.recipient), |id| format!("{console}/traces/{id}"));
        let notice = ChatNotice { chat_id: &row.recipient, is_group: row.is_group, text: &whatsapp.undelivered_notice, code: &super::trace_code(&code), link: &link, reason_code: REPLY_UNDELIVERED };
        tell_once(&self.db, &self.queue, &self.settings, &notice, correlation_id).await
    }
}

/// A notice that one chat's person may be waiting for an answer.
pub(super) struct ChatNotice<'a> {
    pub chat_id: &'a str,
    pub is_group: bool,
    /// The configured text, with `{chat}`, `{code}` and `{link}`.
    pub text: &'a str,
    pub code: &'a str,
    pub link: &'a str,
    pub reason_code: &'static str,
}

/// Tells the owners, unless this chat's owners heard of it (this notice or the other that says
/// a person may be waiting) within `whatsapp.undelivered_notice_every`. The notice is kept for
/// the console; on WhatsApp only the first of its cause (the notice's code and the error) in
/// that period goes out, so a failure that meets every chat (the Cloud API down for an hour)
/// is one message to each owner, not one per chat, and the console lists them all. Says which
/// it did.
pub(super) async fn tell_once(db: &Db, queue: &JobQueue, settings: &Settings, n: &ChatNotice<'_>, correlation_id: String) -> Result<&'static str, DbError> {
    let now = db::now_ms();
    let every = i64::try_from(settings.whatsapp.undelivered_notice_every.as_millis()).unwrap_or(i64::MAX);
    let since = now.saturating_sub(every);
    let mut tx = db.begin_write().await?;
    if !store::claim_notice(&mut tx, n.chat_id, NOTE_KIND, since, now).await? {
        return Ok("this chat's owners were told within undelivered_notice_every: no notice");
    }
    let on_whatsapp = store::claim_notice(&mut tx, ANY_CHAT, &format!("{}:{}", n.reason_code, n.code), since, now).await?;
    let chat = if n.is_group { format!("the group {}", n.chat_id) } else { format!("+{}", n.chat_id) };
    let message = n.text.replace("{chat}", &chat).replace("{code}", n.code).replace("{link}", n.link);
    let notice = Notification { at: now, hook: "whatsapp".into(), tool: String::new(), reason_code: n.reason_code.into(), message, correlation_id };
    notices::raise(&mut tx, queue, &notice, on_whatsapp).await?;
    queue.commit(tx).await?;
    Ok(if on_whatsapp { "the owners were told" } else { "the owners were told in the console (told of this cause on WhatsApp within undelivered_notice_every)" })
}

#[async_trait::async_trait]
impl Handler<UndeliveredNotice> for Undelivered {
    async fn run(&self, args: UndeliveredNotice, ctx: &JobContext) -> Result<JobOutput, JobError> {
        let said = self.tell(&args, &ctx.job.correlation_id).await?;
        Ok(JobOutput { preview: Some(said.into()), snooze: None })
    }
}
