//! MCP servers and their tools: the discovery cache, quarantine and health.

use sqlx::AnyConnection;

use super::{DbError, IntBool, now_ms};

/// The quarantine state of a discovered tool, as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, strum::IntoStaticStr, strum::EnumString, strum::Display)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum ToolState {
    /// New or changed: not offered, not callable, until an owner decides.
    Pending,
    Approved,
    Rejected,
}

super::stored_name!(ToolState, "MCP tool state");

/// Health of a server as last seen.
pub mod health {
    pub const CONNECTED: &str = "connected";
    /// Connected, but discovery or calls fail.
    pub const DEGRADED: &str = "degraded";
    pub const DOWN: &str = "down";
    /// An OAuth server without a usable token: it waits for an owner to log in.
    pub const NEEDS_LOGIN: &str = "needs_login";
    /// Recorded connected or degraded, but no process has seen it lately: every process that
    /// was connected stopped, or died, without anyone recording its end. Never stored; shown by
    /// readers without a live session of their own (`gatehouse mcp list`).
    pub const UNKNOWN: &str = "unknown";
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, sqlx::FromRow)]
pub struct ServerRow {
    pub id: String,
    #[sqlx(try_from = "IntBool<Option<i64>>")]
    pub enabled_override: Option<bool>,
    pub health: String,
    pub last_error: Option<String>,
    pub last_seen_at: Option<i64>,
    pub tool_count: i64,
    pub discovered_at: Option<i64>,
    pub updated_at: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, sqlx::FromRow)]
pub struct ToolRow {
    pub server_id: String,
    pub name: String,
    pub catalog_name: String,
    /// JSON text of the bounded definition.
    pub definition: String,
    pub definition_hash: String,
    #[sqlx(try_from = "String")]
    pub state: ToolState,
    pub approved_hash: Option<String>,
    pub previous_definition: Option<String>,
    #[sqlx(try_from = "IntBool")]
    pub present: bool,
    pub first_seen_at: i64,
    pub updated_at: i64,
    pub decided_at: Option<i64>,
    pub decided_by: Option<i64>,
}

impl ToolRow {
    /// Offered and callable: approved, its current definition the approved one, still listed.
    pub fn usable(&self) -> bool {
        self.present && self.state == ToolState::Approved && self.approved_hash.as_deref() == Some(self.definition_hash.as_str())
    }
}

const SERVER_COLUMNS: &str = "id, enabled_override, health, last_error, last_seen_at, tool_count, discovered_at, updated_at";
const TOOL_COLUMNS: &str = "server_id, name, catalog_name, definition, definition_hash, state, approved_hash, previous_definition, present, first_seen_at, updated_at, decided_at, decided_by";

/// Makes sure a row exists for each configured server (health `down` until it connects).
pub async fn ensure_server(conn: &mut AnyConnection, id: &str) -> Result<(), DbError> {
    sqlx::query("INSERT INTO mcp_servers (id, health, tool_count, updated_at) VALUES ($1, $2, 0, $3) ON CONFLICT (id) DO NOTHING")
        .bind(id)
        .bind(health::DOWN)
        .bind(now_ms())
        .execute(&mut *conn)
        .await?;
    Ok(())
}

pub async fn servers(conn: &mut AnyConnection) -> Result<Vec<ServerRow>, DbError> {
    Ok(sqlx::query_as(&format!("SELECT {SERVER_COLUMNS} FROM mcp_servers ORDER BY id")).fetch_all(&mut *conn).await?)
}

pub async fn server(conn: &mut AnyConnection, id: &str) -> Result<Option<ServerRow>, DbError> {
    Ok(sqlx::query_as(&format!("SELECT {SERVER_COLUMNS} FROM mcp_servers WHERE id = $1")).bind(id).fetch_optional(&mut *conn).await?)
}

/// A connected server answered (its ping): seen now. The health stays what it is; a server an
/// owner disabled, or recorded down meanwhile, is not made seen again.
pub async fn touch_seen(conn: &mut AnyConnection, id: &str, now: i64) -> Result<(), DbError> {
    sqlx::query("UPDATE mcp_servers SET last_seen_at = $1 WHERE id = $2 AND health IN ('connected', 'degraded')").bind(now).bind(id).execute(&mut *conn).await?;
    Ok(())
}

/// Records health. `seen` also sets `last_seen_at` (the server answered).
pub async fn set_health(conn: &mut AnyConnection, id: &str, health: &str, last_error: Option<&str>, seen: bool) -> Result<(), DbError> {
    let now = now_ms();
    sqlx::query(
        "UPDATE mcp_servers SET health = $1, last_error = COALESCE($2, last_error), \
         last_seen_at = CASE WHEN $3 = 1 THEN $4 ELSE last_seen_at END, updated_at = $4 WHERE id = $5",
    )
    .bind(health)
    .bind(last_error)
    .bind(i64::from(seen))
    .bind(now)
    .bind(id)
    .execute(&mut *conn)
    .await?;
    super::events::ring();
    Ok(())
}

pub async fn set_enabled_override(conn: &mut AnyConnection, id: &str, enabled: Option<bool>) -> Result<bool, DbError> {
    let done = sqlx::query("UPDATE mcp_servers SET enabled_override = $1, updated_at = $2 WHERE id = $3")
        .bind(enabled.map(i64::from))
        .bind(now_ms())
        .bind(id)
        .execute(&mut *conn)
        .await?;
    Ok(done.rows_affected() > 0)
}

/// Every cached tool of every server (or of one), by server and name.
pub async fn tools(conn: &mut AnyConnection, server_id: Option<&str>) -> Result<Vec<ToolRow>, DbError> {
    let sql = format!("SELECT {TOOL_COLUMNS} FROM mcp_tools WHERE ($1 = '' OR server_id = $1) ORDER BY server_id, name");
    Ok(sqlx::query_as(&sql).bind(server_id.unwrap_or_default()).fetch_all(&mut *conn).await?)
}

/// What decides whether each tool is offered, narrow (no definitions): catalog name, state,
/// current and approved hash, and whether its server still lists it, in a stable order.
pub async fn tool_states(conn: &mut AnyConnection) -> Result<Vec<(String, String, String, Option<String>, i64)>, DbError> {
    let sql = "SELECT catalog_name, state, definition_hash, approved_hash, present FROM mcp_tools ORDER BY catalog_name";
    Ok(sqlx::query_as(sql).fetch_all(&mut *conn).await?)
}

pub async fn tool_by_catalog_name(conn: &mut AnyConnection, catalog_name: &str) -> Result<Option<ToolRow>, DbError> {
    let sql = format!("SELECT {TOOL_COLUMNS} FROM mcp_tools WHERE catalog_name = $1");
    Ok(sqlx::query_as(&sql).bind(catalog_name).fetch_optional(&mut *conn).await?)
}

/// One tool as a discovery found it.
#[derive(Debug, Clone)]
pub struct Found {
    pub name: String,
    pub catalog_name: String,
    pub definition: String,
    pub definition_hash: String,
}

/// What a discovery changed.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Changes {
    pub added: Vec<String>,
    pub changed: Vec<String>,
    pub removed: Vec<String>,
}

/// Stores a discovery's result, applying quarantine: a new tool, or one whose definition hash
/// changed, is `pending` with its previous definition kept; a definition that returns to the
/// approved hash is approved again. On a trusted server's first discovery its tools are
/// approved without an owner. Run it in a write transaction.
pub async fn apply_discovery(conn: &mut AnyConnection, server_id: &str, trusted: bool, found: &[Found]) -> Result<Changes, DbError> {
    // Two processes discovering the same server at once (both starting) would each find its
    // tools new and insert them, and the second would fail on the primary key, leaving that
    // process without them. The second waits here for the first's transaction instead, and then
    // finds them known.
    super::lock_until_commit(conn, &format!("gatehouse.mcp_discovery:{server_id}")).await?;
    let now = now_ms();
    let first = server(&mut *conn, server_id).await?.is_none_or(|s| s.discovered_at.is_none());
    let known: std::collections::HashMap<String, ToolRow> = tools(&mut *conn, Some(server_id)).await?.into_iter().map(|t| (t.name.clone(), t)).collect();
    let mut changes = Changes::default();
    for f in found {
        match known.get(&f.name) {
            // A catalog name another of its tools holds (a server can list `files.read` once,
            // whose name is `<server>__files_read_<hash>`, and that plain name later): left
            // out, so the rest of the listing, a changed definition above all, is still stored.
            None if tool_by_catalog_name(conn, &f.catalog_name).await?.is_some() => {
                tracing::warn!(mcp.server = server_id, catalog_name = %f.catalog_name, "an MCP tool whose catalog name another tool holds was left out");
            }
            None => {
                let approved = first && trusted;
                sqlx::query(&format!(
                    "INSERT INTO mcp_tools ({TOOL_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, NULL, 1, $8, $8, NULL, NULL)"
                ))
                .bind(server_id)
                .bind(&f.name)
                .bind(&f.catalog_name)
                .bind(&f.definition)
                .bind(&f.definition_hash)
                .bind(if approved { ToolState::Approved } else { ToolState::Pending }.as_str())
                .bind(approved.then_some(f.definition_hash.as_str()))
                .bind(now)
                .execute(&mut *conn)
                .await?;
                changes.added.push(f.name.clone());
            }
            Some(old) if old.definition_hash != f.definition_hash => {
                let back_to_approved = old.approved_hash.as_deref() == Some(f.definition_hash.as_str()) && old.state != ToolState::Rejected;
                // What the owner sees the change against: the definition last approved (or
                // rejected), not the last one seen, so a change made in two steps while the
                // tool waited shows whole. A tool never decided on has nothing to compare with.
                let compared_with = match old.state {
                    ToolState::Approved | ToolState::Rejected => Some(&old.definition),
                    ToolState::Pending => old.previous_definition.as_ref(),
                };
                sqlx::query(
                    "UPDATE mcp_tools SET catalog_name = $1, definition = $2, definition_hash = $3, state = $4, previous_definition = $5, \
                     present = 1, updated_at = $6 WHERE server_id = $7 AND name = $8",
                )
                .bind(&f.catalog_name)
                .bind(&f.definition)
                .bind(&f.definition_hash)
                .bind(if back_to_approved { ToolState::Approved } else { ToolState::Pending }.as_str())
                .bind(compared_with)
                .bind(now)
                .bind(server_id)
                .bind(&f.name)
                .execute(&mut *conn)
                .await?;
                changes.changed.push(f.name.clone());
            }
            Some(old) if !old.present => {
                set_present(conn, server_id, &f.name, true, now).await?;
                changes.added.push(f.name.clone());
            }
            Some(_) => {}
        }
    }
    for old in known.values().filter(|t| t.present && !found.iter().any(|f| f.name == t.name)) {
        set_present(conn, server_id, &old.name, false, now).await?;
        changes.removed.push(old.name.clone());
    }
    sqlx::query("UPDATE mcp_servers SET discovered_at = COALESCE(discovered_at, $1), tool_count = $2, updated_at = $1 WHERE id = $3")
        .bind(now)
        .bind(i64::try_from(found.len()).unwrap_or(i64::MAX))
        .bind(server_id)
        .execute(&mut *conn)
        .await?;
    Ok(changes)
}

/// Marks a cached tool as listed by its server again, or no longer listed.
async fn set_present(conn: &mut AnyConnection, server_id: &str, name: &str, present: bool, now: i64) -> Result<(), DbError> {
    sqlx::query("UPDATE mcp_tools SET present = $1, updated_at = $2 WHERE server_id = $3 AND name = $4")
        .bind(i64::from(present))
        .bind(now)
        .bind(server_id)
        .bind(name)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// An owner's decision on a tool's current definition. `None` when there is no such tool.
/// Approving records the hash approved, so a later change quarantines it again.
/// What a decision on a tool found.
#[derive(Debug, Clone, PartialEq)]
pub enum Decided {
    Done(ToolRow),
    /// The definition is no longer the one the owner reviewed: nothing changed.
    Changed(ToolRow),
    Missing,
}

/// Approves or rejects a tool. With `reviewed_hash`, only while the stored definition is still
/// the one the owner looked at, in one conditional statement: a server that swaps a definition
/// between the owner's look and the click gets nothing approved.
pub async fn decide(conn: &mut AnyConnection, catalog_name: &str, approve: bool, owner_id: Option<i64>, reviewed_hash: Option<&str>) -> Result<Decided, DbError> {
    let now = now_ms();
    let sql = if approve {
        "UPDATE mcp_tools SET state = $1, approved_hash = definition_hash, decided_at = $2, decided_by = $3, updated_at = $2 \
         WHERE catalog_name = $4 AND ($5 = '' OR definition_hash = $5)"
    } else {
        // A rejection also forgets the approved definition: a server that changes the tool
        // and then changes it back must not have it approved again without an owner.
        "UPDATE mcp_tools SET state = $1, approved_hash = NULL, decided_at = $2, decided_by = $3, updated_at = $2 WHERE catalog_name = $4 AND ($5 = '' OR definition_hash = $5)"
    };
    let done = sqlx::query(sql)
        .bind(if approve { ToolState::Approved } else { ToolState::Rejected }.as_str())
        .bind(now)
        .bind(owner_id)
        .bind(catalog_name)
        .bind(reviewed_hash.unwrap_or_default())
        .execute(&mut *conn)
        .await?;
    Ok(match tool_by_catalog_name(conn, catalog_name).await? {
        None => Decided::Missing,
        Some(row) if done.rows_affected() == 0 => Decided::Changed(row),
        Some(row) => Decided::Done(row),
    })
}
