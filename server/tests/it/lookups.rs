//! The lookups that run on every message, or on console pages, over tables that are kept for
//! ever (traces, messages, the WhatsApp ledger, findings) or for a month (finished jobs) use an index,
//! so that they cost the same after a year as on the first day. Each query is the one its
//! function runs, planned by the database itself:
//! - SQLite (`EXPLAIN QUERY PLAN`, with no statistics, as the server runs): it must name one
//!   of its indexes, and neither scan the table nor sort what it reads from it (a sort of the
//!   few rows a subquery's limit left is fine);
//! - PostgreSQL (`EXPLAIN` of the generic plan with sequential scans priced out, so that any
//!   usable index is taken): it must not scan the table.

use server::db::{
    self, Backend,
    jobs::{JobFilter, JobState},
    traces::TraceFilter,
};

use crate::{both_backends, support::TestDb};

struct Lookup {
    what: &'static str,
    sql: String,
    table: &'static str,
    /// The indexes SQLite may use, one of which it must.
    indexes: &'static [&'static str],
}

fn lookups() -> Vec<Lookup> {
    let traces = |what, filter: TraceFilter, indexes| Lookup { what, sql: db::traces::list_sql(&filter), table: "traces", indexes };
    let jobs = |what, state| Lookup { what, sql: db::jobs::list_sql(&JobFilter { state: Some(state), ..JobFilter::default() }), table: "jobs", indexes: &["jobs_finished"] };
    vec![
        // Running traces are the messages being handled: few, whichever index finds them.
        Lookup {
            what: "a message's running trace (every message handled)",
            sql: db::traces::RUNNING_OF_MESSAGE.into(),
            table: "traces",
            indexes: &["traces_message", "traces_outcome"],
        },
        Lookup { what: "a WhatsApp chat's page", sql: db::simulator::WHATSAPP_CHAT_MESSAGES.into(), table: "traces", indexes: &["traces_message"] },
        Lookup { what: "the Conversations page", sql: db::simulator::CHATS.into(), table: "whatsapp_inbound", indexes: &["chats_last"] },
        traces("the Traces page, failed only", TraceFilter { outcome: "failed".into(), ..TraceFilter::default() }, &["traces_outcome"]),
        traces("the Traces page, one chat", TraceFilter { chat_id: "15550001111".into(), ..TraceFilter::default() }, &["traces_chat"]),
        traces(
            "the Traces page, one chat's failures, a page on",
            TraceFilter { chat_id: "15550001111".into(), outcome: "failed".into(), before_id: 1000, ..TraceFilter::default() },
            &["traces_chat", "traces_outcome"],
        ),
        jobs("the Jobs page, completed", JobState::Completed),
        jobs("the Jobs page, discarded", JobState::Discarded),
        Lookup {
            what: "the Jobs page, one chat's completed jobs",
            sql: db::jobs::list_sql(&JobFilter { state: Some(JobState::Completed), chat_id: Some("15550001111".into()), ..JobFilter::default() }),
            table: "jobs",
            indexes: &["jobs_chat"],
        },
        Lookup { what: "one tool's recent calls (the tool's page)", sql: db::tool_audit::recent_sql(true), table: "tool_audit", indexes: &["tool_audit_tool_at"] },
        Lookup { what: "a job's ledger rows", sql: db::whatsapp::outbound_for_job_sql(), table: "whatsapp_outbound", indexes: &["whatsapp_outbound_job"] },
        Lookup { what: "a repair's findings (the Repairs page)", sql: db::evals::findings_of_cases_sql(3), table: "findings", indexes: &["findings_case"] },
        Lookup { what: "a batch of finished jobs to remove", sql: db::retention::finished_due_sql(), table: "jobs", indexes: &["jobs_state_updated"] },
    ]
}

/// The number of the highest `$n` in `sql`.
fn parameters(sql: &str) -> usize {
    let mut most = 0;
    for (i, _) in sql.match_indices('$') {
        let digits: String = sql[i + 1..].chars().take_while(char::is_ascii_digit).collect();
        most = most.max(digits.parse().unwrap_or(0));
    }
    most
}

/// The plan's lines: on SQLite each with its node's id and its parent's; on PostgreSQL 0 and 0.
async fn plan(conn: &mut sqlx::AnyConnection, backend: Backend, n: usize, sql: &str) -> Vec<(i64, i64, String)> {
    use sqlx::Row;
    let rows = match backend {
        Backend::Sqlite => sqlx::raw_sql(&format!("EXPLAIN QUERY PLAN {sql}")).fetch_all(&mut *conn).await,
        Backend::Postgres => {
            let name = format!("lookup_{n}");
            sqlx::raw_sql(&format!("PREPARE {name} AS {sql}")).execute(&mut *conn).await.unwrap_or_else(|e| panic!("prepare {sql}: {e}"));
            let nulls = vec!["NULL"; parameters(sql)].join(", ");
            sqlx::raw_sql(&format!("EXPLAIN EXECUTE {name}({nulls})")).fetch_all(&mut *conn).await
        }
    };
    let rows = rows.unwrap_or_else(|e| panic!("plan of {sql}: {e}"));
    let line = |r: &sqlx::any::AnyRow| match backend {
        Backend::Sqlite => (r.try_get("id").expect("id"), r.try_get("parent").expect("parent"), r.try_get("detail").expect("detail")),
        Backend::Postgres => (0, 0, r.try_get("QUERY PLAN").expect("plan text")),
    };
    rows.iter().map(line).collect()
}

async fn lookups_use_their_indexes(db: TestDb) {
    let pool = db.connect().await;
    pool.migrate().await.expect("migrate");
    let mut conn = pool.pool.acquire().await.expect("connection");
    if pool.backend == Backend::Postgres {
        sqlx::raw_sql("SET enable_seqscan = off; SET plan_cache_mode = force_generic_plan").execute(&mut *conn).await.expect("planner settings");
    }
    let mut wrong = Vec::new();
    for (n, lookup) in lookups().iter().enumerate() {
        let plan = plan(&mut conn, pool.backend, n, &lookup.sql).await;
        let lines: Vec<&str> = plan.iter().map(|(_, _, line)| line.as_str()).collect();
        let reads_table = |line: &str| line.split(' ').nth(1) == Some(lookup.table);
        let fault = match pool.backend {
            Backend::Sqlite => {
                // A sort in the same query as a read of the table sorts what that read found.
                let sorted_read = plan.iter().filter(|(_, _, line)| line.starts_with("USE TEMP B-TREE")).any(|(_, parent, _)| {
                    plan.iter().any(|(_, p, line)| p == parent && (line.starts_with("SEARCH ") || line.starts_with("SCAN ")) && reads_table(line))
                });
                if lines.iter().any(|line| line.starts_with("SCAN ") && reads_table(line)) {
                    Some("scans the table")
                } else if !lookup.indexes.iter().any(|index| lines.iter().any(|line| line.split(' ').collect::<Vec<_>>().windows(2).any(|w| w == ["INDEX", index]))) {
                    Some("uses none of its indexes")
                } else if sorted_read {
                    Some("sorts what it reads")
                } else {
                    None
                }
            }
            Backend::Postgres => lines.iter().any(|line| line.contains(&format!("Seq Scan on {}", lookup.table))).then_some("scans the table"),
        };
        if let Some(fault) = fault {
            wrong.push(format!("{} {fault} (indexes {:?}):\n  {}\n  {}", lookup.what, lookup.indexes, lookup.sql, lines.join("\n  ")));
        }
    }
    drop(conn);
    pool.close().await;
    assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
}
both_backends!(lookups_that_grow_use_indexes, lookups_use_their_indexes);
