//! What owners are told about MCP servers (a server needs a login, a form waits): kept for the
//! console and, with [`OwnerNotices`], sent to every owner number on WhatsApp, in the words of
//! `[mcp]` in gatehouse.toml with a link to the console's MCP servers page.

use std::sync::RwLock;

use crate::{
    config::McpSettings,
    db::{self, DbError, owner_notifications::Notification},
    jobs::JobQueue,
    owners::notices,
};

/// How Gatehouse reaches the owners on WhatsApp, and with which words.
#[derive(Clone)]
pub struct OwnerNotices {
    pub queue: JobQueue,
    /// The console's address, for the links.
    pub public_url: String,
    pub settings: McpSettings,
}

/// One notice: its template (a key of `[mcp]`), what fills it, where its link points.
pub(crate) struct Notice<'a> {
    pub hook: &'static str,
    pub server: &'a str,
    pub reason_code: &'static str,
    pub correlation_id: String,
    pub template: fn(&McpSettings) -> &String,
    /// `{name}` placeholders and their values (`{server}` and `{link}` are always filled).
    pub values: &'a [(&'static str, String)],
    /// The part of the MCP servers page the link opens (`#server-crm`).
    pub anchor: String,
}

/// The owner notices of this process. Without [`OwnerNotices`] (a manager built by hand, as in
/// tests) a notice is only kept for the console, in the default words with a relative link.
#[derive(Default)]
pub(crate) struct Notices(RwLock<Option<OwnerNotices>>);

impl Notices {
    pub(crate) fn set(&self, notices: OwnerNotices) {
        if let Ok(mut n) = self.0.write() {
            *n = Some(notices);
        }
    }

    /// Stores `notice` and enqueues its deliveries in `tx`, then commits.
    pub(crate) async fn raise(&self, mut tx: sqlx::Transaction<'static, sqlx::Any>, notice: &Notice<'_>) -> Result<(), DbError> {
        let configured = self.0.read().ok().and_then(|n| n.clone());
        let defaults = McpSettings::default();
        let (settings, base) = configured.as_ref().map_or((&defaults, ""), |n| (&n.settings, n.public_url.as_str()));
        let link = format!("{}/mcp{}", base.trim_end_matches('/'), notice.anchor);
        let mut message = (notice.template)(settings).replace("{link}", &link).replace("{server}", notice.server);
        for (name, value) in notice.values {
            message = message.replace(name, value);
        }
        let stored = Notification {
            at: db::now_ms(),
            hook: notice.hook.into(),
            tool: notice.server.to_string(),
            reason_code: notice.reason_code.into(),
            message,
            correlation_id: notice.correlation_id.clone(),
        };
        match configured {
            Some(n) => {
                notices::raise(&mut tx, &n.queue, &stored, n.settings.notices_on_whatsapp).await?;
                n.queue.commit(tx).await
            }
            None => {
                db::owner_notifications::insert(&mut tx, &stored).await?;
                Ok(tx.commit().await?)
            }
        }
    }
}
