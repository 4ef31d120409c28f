//! The SQL both backends share: placeholders and multi-row `VALUES`, flag and state columns,
//! text as the backends store it, and timestamps in the stored unit.

use super::Backend;

/// A value as stored in its place (a session id, a device cookie's token) or named by (a
/// repair's diff): its SHA-256, in hex.
pub fn sha256_hex(text: &str) -> String {
    use sha2::{Digest as _, Sha256};
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// The backend a connection talks to, for SQL that differs between them.
pub(crate) fn backend_of(conn: &sqlx::AnyConnection) -> Backend {
    if conn.backend_name() == "PostgreSQL" { Backend::Postgres } else { Backend::Sqlite }
}

/// A transaction on `conn` that will write: on SQLite `BEGIN IMMEDIATE`, which takes the write
/// lock up front (waiting for it in the busy handler), as [`super::Db::begin_write`] does; a
/// deferred transaction that reads first fails with "database is locked" when another writer
/// commits before its first write. A plain `BEGIN` on PostgreSQL. For a caller holding a
/// connection of its own rather than the [`super::Db`].
pub async fn begin_write_on(conn: &mut sqlx::AnyConnection) -> Result<sqlx::Transaction<'_, sqlx::Any>, super::DbError> {
    use sqlx::Connection as _;
    Ok(match backend_of(conn) {
        Backend::Sqlite => conn.begin_with("BEGIN IMMEDIATE").await?,
        Backend::Postgres => conn.begin().await?,
    })
}

/// Makes the transaction on `conn` wait, until it ends, for any other that took the same `key`:
/// on PostgreSQL an advisory transaction lock; SQLite's write transactions already run one at a
/// time. For a read-then-write that two processes must not interleave.
pub(crate) async fn lock_until_commit(conn: &mut sqlx::AnyConnection, key: &str) -> Result<(), super::DbError> {
    if backend_of(conn) == Backend::Postgres {
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))").bind(key).execute(&mut *conn).await?;
    }
    Ok(())
}

/// The filters of a list that are set, each a condition (`"chat_id ="`) with its value: only
/// these enter its query, so that each can use its index (a condition such as
/// `($1 = '' OR chat_id = $1)` can use none). Texts are bound before numbers, each in its order.
pub(crate) struct SetFilters<'a> {
    texts: Vec<(&'static str, &'a str)>,
    numbers: Vec<(&'static str, i64)>,
}

impl<'a> SetFilters<'a> {
    /// The filters whose value is `Some`.
    pub(crate) fn new(
        texts: impl IntoIterator<Item = (&'static str, Option<&'a str>)>,
        numbers: impl IntoIterator<Item = (&'static str, Option<i64>)>,
    ) -> Self {
        Self {
            texts: texts.into_iter().filter_map(|(condition, v)| Some((condition, v?))).collect(),
            numbers: numbers.into_iter().filter_map(|(condition, v)| Some((condition, v?))).collect(),
        }
    }

    /// ` AND <condition> $1 AND <condition> $2 ...`, and the number of the placeholder after
    /// them.
    pub(crate) fn conditions(&self) -> (String, usize) {
        let all = self.texts.iter().map(|(c, _)| c).chain(self.numbers.iter().map(|(c, _)| c));
        let sql = all.enumerate().map(|(i, condition)| format!(" AND {condition} ${}", i + 1)).collect();
        (sql, self.texts.len() + self.numbers.len() + 1)
    }

    /// `query` with the filters' values bound, in the order of [`Self::conditions`].
    pub(crate) fn bind<'q, O>(self, mut query: sqlx::query::QueryAs<'q, sqlx::Any, O, sqlx::any::AnyArguments<'q>>) -> sqlx::query::QueryAs<'q, sqlx::Any, O, sqlx::any::AnyArguments<'q>>
    where
        'a: 'q,
    {
        for (_, v) in self.texts {
            query = query.bind(v);
        }
        for (_, v) in self.numbers {
            query = query.bind(v);
        }
        query
    }
}

/// `$first, $first+1, ...` for `n` values.
pub(crate) fn placeholders(first: usize, n: usize) -> String {
    (first..first + n).map(|i| format!("${i}")).collect::<Vec<_>>().join(", ")
}

/// The `VALUES` rows of a multi-row insert whose placeholders are all given here, bound in order:
/// `($1, .., $columns), ($columns+1, ..), ...` on PostgreSQL, `(?, .., ?), ...` on SQLite.
///
/// SQLite gets anonymous placeholders because sqlx-sqlite asks SQLite the name of every numbered
/// one (`$n` or `?n`) when it binds, and SQLite finds a name by a linear search of the
/// statement's names: binding n numbered parameters costs n², which was half of a 256-job
/// enqueue's CPU time. An anonymous `?` has no name, so there is nothing to search. Never mix
/// the result with other placeholders in one statement (use [`value_rows_from`] there).
pub(crate) fn value_rows(backend: Backend, rows: usize, columns: usize) -> String {
    match backend {
        Backend::Postgres => value_rows_from(1, rows, columns),
        Backend::Sqlite => {
            let row = format!("({})", vec!["?"; columns].join(", "));
            vec![row; rows].join(", ")
        }
    }
}

/// [`value_rows`] whose first placeholder is `$first` (the ones before it bind other values).
pub(crate) fn value_rows_from(first: usize, rows: usize, columns: usize) -> String {
    (0..rows).map(|r| format!("({})", placeholders(first + r * columns, columns))).collect::<Vec<_>>().join(", ")
}

/// `sql` for `backend`: on SQLite its `$1, $2, ...` become anonymous `?` (see [`value_rows`] for
/// why), provided each number appears once and in order, so that binding by number binds in the
/// order of the text. Any other statement is returned as it is.
pub(crate) fn anonymous_on_sqlite(backend: Backend, sql: String) -> String {
    if backend != Backend::Sqlite {
        return sql;
    }
    let mut out = String::with_capacity(sql.len());
    let mut next = 1usize;
    let mut rest = sql.as_str();
    while let Some(at) = rest.find('$') {
        let digits = rest[at + 1..].bytes().take_while(u8::is_ascii_digit).count();
        out.push_str(&rest[..at]);
        if digits == 0 {
            out.push('$');
        } else {
            if rest[at + 1..at + 1 + digits].parse::<usize>().ok() != Some(next) {
                return sql;
            }
            next += 1;
            out.push('?');
        }
        rest = &rest[at + 1 + digits..];
    }
    out.push_str(rest);
    out
}

/// A flag column, stored as INTEGER 0/1 on both backends: sqlx's `Any` driver decodes `bool`
/// only from a native boolean. Read one with `#[sqlx(try_from = "IntBool")]`, a nullable one
/// with `#[sqlx(try_from = "IntBool<Option<i64>>")]`.
pub(crate) struct IntBool<T = i64>(T);

impl<T: sqlx::Type<sqlx::Any>> sqlx::Type<sqlx::Any> for IntBool<T> {
    fn type_info() -> sqlx::any::AnyTypeInfo {
        T::type_info()
    }

    fn compatible(ty: &sqlx::any::AnyTypeInfo) -> bool {
        T::compatible(ty)
    }
}

impl<'r, T: sqlx::Decode<'r, sqlx::Any>> sqlx::Decode<'r, sqlx::Any> for IntBool<T> {
    fn decode(value: sqlx::any::AnyValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
        T::decode(value).map(Self)
    }
}

impl From<IntBool> for bool {
    fn from(v: IntBool) -> Self {
        v.0 != 0
    }
}

impl From<IntBool<Option<i64>>> for Option<bool> {
    fn from(v: IntBool<Option<i64>>) -> Self {
        v.0.map(|v| v != 0)
    }
}

/// Reads a stored state name back into its enum (for `#[sqlx(try_from = "String")]`);
/// the error names `what` and the text found.
pub(crate) fn parse_stored<T: std::str::FromStr>(text: String, what: &str) -> Result<T, String> {
    text.parse().map_err(|_| format!("unknown {what} {text:?}"))
}

/// A state stored by name (an enum deriving strum's `IntoStaticStr` and `EnumString`): `as_str`
/// gives the name to bind, and `TryFrom<String>` reads it back for a row's
/// `#[sqlx(try_from = "String")]` field, an unknown name being an error that names `what`.
macro_rules! stored_name {
    ($state:ty, $what:literal) => {
        impl $state {
            pub fn as_str(self) -> &'static str {
                self.into()
            }
        }

        impl TryFrom<String> for $state {
            type Error = String;
            fn try_from(s: String) -> Result<Self, String> {
                $crate::db::parse_stored(s, $what)
            }
        }
    };
}
pub(crate) use stored_name;

/// Text as every backend stores it: PostgreSQL refuses NUL in TEXT, so it is removed
/// (a tool name, a model reply or an error message with one is stored without it, not lost).
pub fn clean_text(text: &str) -> String {
    if text.contains('\0') { text.replace('\0', "") } else { text.to_string() }
}

pub fn now_ms() -> i64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(now.as_millis()).unwrap_or(i64::MAX)
}

/// PostgreSQL's own clock in the unit of stored timestamps, as SQL: when the statement began
/// (stable within it, so a comparison with it can bound an index scan).
const POSTGRES_CLOCK_MS: &str = "(EXTRACT(EPOCH FROM statement_timestamp()) * 1000)::BIGINT";

/// "Now" for a lease, as SQL: the clock every holder of a lease is judged by. Processes on
/// several machines share one PostgreSQL database, and their clocks differ: a lease one sets by
/// its clock and another checks by its own would run out early for a clock ahead, and a healthy
/// run would be taken from its holder and run twice. So on PostgreSQL leases are set and checked
/// by the server's clock. SQLite's processes share one machine and its clock: `now`, the
/// caller's parameter.
pub(crate) fn lease_now(backend: Backend, now: &str) -> String {
    match backend {
        Backend::Postgres => POSTGRES_CLOCK_MS.to_string(),
        Backend::Sqlite => now.to_string(),
    }
}

/// The end of a lease the caller reckoned from `now` to `until` (parameters), as SQL: its length
/// from [`lease_now`].
pub(crate) fn lease_end(backend: Backend, now: &str, until: &str) -> String {
    match backend {
        Backend::Postgres => format!("({POSTGRES_CLOCK_MS} + ({until} - {now}))"),
        Backend::Sqlite => until.to_string(),
    }
}

/// A duration in the unit of stored timestamps (milliseconds), saturating.
pub fn duration_ms(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The rows of `select` whose `id` column is one of `ids`, in id order (none for no ids).
pub(crate) async fn rows_with_ids<T>(conn: &mut sqlx::AnyConnection, select: &str, id: &str, ids: &[i64]) -> Result<Vec<T>, super::DbError>
where
    T: for<'r> sqlx::FromRow<'r, sqlx::any::AnyRow> + Send + Unpin,
{
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let sql = format!("{select} WHERE {id} IN ({}) ORDER BY {id}", placeholders(1, ids.len()));
    let mut q = sqlx::query_as(&sql);
    for id in ids {
        q = q.bind(*id);
    }
    Ok(q.fetch_all(conn).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_rows_number_placeholders_on_postgres_and_leave_them_anonymous_on_sqlite() {
        assert_eq!(value_rows(Backend::Postgres, 2, 3), "($1, $2, $3), ($4, $5, $6)");
        // Anonymous on SQLite: sqlx-sqlite looks up the name of every numbered one, which costs
        // SQLite a linear search each (quadratic in a statement's parameters).
        assert_eq!(value_rows(Backend::Sqlite, 2, 3), "(?, ?, ?), (?, ?, ?)");
        assert_eq!(value_rows_from(3, 2, 2), "($3, $4), ($5, $6)");
    }

    #[test]
    fn numbered_placeholders_in_order_become_anonymous_on_sqlite_only() {
        let sql = || "SELECT $1, '$.kind', $2 WHERE id IN ($3, $4)".to_string();
        assert_eq!(anonymous_on_sqlite(Backend::Sqlite, sql()), "SELECT ?, '$.kind', ? WHERE id IN (?, ?)");
        assert_eq!(anonymous_on_sqlite(Backend::Postgres, sql()), sql());
        // A number used twice or out of order would bind the wrong values: left as it is.
        for kept in ["SELECT $1, $1", "SELECT $2, $1", "SELECT $1, $3"] {
            assert_eq!(anonymous_on_sqlite(Backend::Sqlite, kept.to_string()), kept);
        }
    }
}
