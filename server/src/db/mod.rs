//! Database access. All SQL lives in this module tree. Timestamps are unix milliseconds and
//! JSON is TEXT, so the same statements run on SQLite and PostgreSQL through sqlx's `Any`
//! driver; only the migrations differ per backend.

pub mod approvals;
pub mod audit;
pub mod budget;
mod checkpoint;
pub mod contexts;
pub mod conversation;
pub mod evals;
pub mod events;
pub mod jobs;
pub mod llm_calls;
pub mod owner_notifications;
pub mod mcp;
pub mod mcp_elicitations;
pub mod mcp_oauth;
pub mod owners;
pub mod sessions;
pub mod simulator;
pub mod stats;
pub mod tool_audit;
pub mod tool_sessions;
pub mod tool_results;
pub mod traces;
pub mod whatsapp;

use std::{path::Path, sync::Arc};

use sqlx::{
    AnyPool,
    any::AnyPoolOptions,
    migrate::{MigrateError, Migrator},
};

use crate::config::DatabaseSettings;
use checkpoint::Checkpointer;

static SQLITE_MIGRATIONS: Migrator = sqlx::migrate!("../migrations/sqlite");
static POSTGRES_MIGRATIONS: Migrator = sqlx::migrate!("../migrations/postgres");

/// Which database a pool talks to.
pub use crate::config::DatabaseKind as Backend;

fn migrator(backend: Backend) -> &'static Migrator {
    match backend {
        Backend::Sqlite => &SQLITE_MIGRATIONS,
        Backend::Postgres => &POSTGRES_MIGRATIONS,
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("unsupported database URL; use sqlite://... or postgres://...")]
    UnsupportedUrl,
    #[error("cannot create the folder for the SQLite file {path}: {source}")]
    CreateDir { path: String, source: std::io::Error },
    #[error("cannot connect to the database: {0}")]
    Connect(#[source] sqlx::Error),
    #[error("migration {version} ({description}) failed: {reason}. Hint: fix the cause, then run `gatehouse migrate`")]
    Migration { version: i64, description: String, reason: String },
    #[error(transparent)]
    Sql(#[from] sqlx::Error),
}

/// `impl From<sqlx::Error>` for an error enum whose `Db` variant holds a [`DbError`]: `?` on a
/// transaction's begin and commit then converts as it does on the `db::` functions.
macro_rules! from_sqlx_as_db {
    ($error:ty) => {
        impl From<sqlx::Error> for $error {
            fn from(e: sqlx::Error) -> Self {
                Self::Db($crate::db::DbError::Sql(e))
            }
        }
    };
}
pub(crate) use from_sqlx_as_db;

/// A pool on one of the two backends.
#[derive(Debug, Clone)]
pub struct Db {
    pub pool: AnyPool,
    /// Where write transactions begin ([`Db::begin_write`]). On a SQLite file, a pool of its own
    /// with one connection: writers of this process queue for it in order, instead of in SQLite's
    /// busy handler, which sleeps 1, 2, 5, 10 ms ... between tries for the file's write lock
    /// while the writer ahead of it holds it. Elsewhere the same pool as `pool`.
    writer: AnyPool,
    pub backend: Backend,
    /// Kept for PostgreSQL `LISTEN`, which needs its own connection. May hold a password.
    url: secrecy::SecretString,
    /// SQLite's background checkpoints, stopped when the last clone of this `Db` is dropped.
    _checkpointer: Option<Arc<Checkpointer>>,
}

/// One applied migration, for the Dashboard and `/readyz`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AppliedMigration {
    pub version: i64,
    pub description: String,
}

/// The backend a connection talks to, for SQL that differs between them.
pub(crate) fn backend_of(conn: &sqlx::AnyConnection) -> Backend {
    if conn.backend_name() == "PostgreSQL" { Backend::Postgres } else { Backend::Sqlite }
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

/// A duration in the unit of stored timestamps (milliseconds), saturating.
pub fn duration_ms(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Db {
    /// Connects, creating the SQLite file (and its folder) when missing.
    pub async fn connect(settings: &DatabaseSettings) -> Result<Self, DbError> {
        sqlx::any::install_default_drivers();
        let backend = Backend::from_url(&settings.url).ok_or(DbError::UnsupportedUrl)?;
        let mut url = settings.url.clone();
        if backend == Backend::Sqlite {
            url = prepare_sqlite_url(&url)?;
        }
        let background_checkpoints = backend == Backend::Sqlite && !settings.checkpoint_interval.is_zero();
        let options = |max: u32| pool_options(settings, backend, max, background_checkpoints);
        let pool = options(settings.max_connections).connect(&url).await.map_err(DbError::Connect)?;
        // An in-memory database is one per connection: it keeps its single pool.
        let writer = if backend == Backend::Sqlite && sqlite_file_of(&settings.url).is_some() {
            options(1).connect(&url).await.map_err(DbError::Connect)?
        } else {
            pool.clone()
        };
        let checkpointer = background_checkpoints.then(|| Arc::new(Checkpointer::spawn(pool.clone(), writer.clone(), settings.checkpoint_interval, sqlite_file_of(&settings.url))));
        Ok(Self { pool, writer, backend, url: secrecy::SecretString::from(settings.url.clone()), _checkpointer: checkpointer })
    }

    /// Applies pending migrations. A failure names the migration and the reason.
    pub async fn migrate(&self) -> Result<Vec<AppliedMigration>, DbError> {
        let migrator = migrator(self.backend);
        // PostgreSQL: the migrator holds an advisory lock. SQLite has none, so two processes
        // starting on a new file would both apply the first migration and one would fail;
        // they take turns on a lock file beside the database instead.
        let _turn = match self.sqlite_file() {
            Some(path) => Some(migration_turn(&path).await?),
            None => None,
        };
        let before = self.applied_versions().await.unwrap_or_default();
        migrator.run(&self.pool).await.map_err(|e| describe_migration_error(migrator, e))?;
        let after = self.applied_migrations().await?;
        Ok(after.into_iter().filter(|m| !before.contains(&m.version)).collect())
    }

    /// The SQLite database file, if this is one on disk.
    fn sqlite_file(&self) -> Option<std::path::PathBuf> {
        use secrecy::ExposeSecret;
        if self.backend != Backend::Sqlite {
            return None;
        }
        sqlite_file_of(self.url.expose_secret()).map(std::path::PathBuf::from)
    }

    /// Migrations recorded as applied, oldest first.
    pub async fn applied_migrations(&self) -> Result<Vec<AppliedMigration>, DbError> {
        let rows: Vec<(i64, String)> =
            sqlx::query_as("SELECT version, description FROM _sqlx_migrations WHERE success = TRUE ORDER BY version")
                .fetch_all(&self.pool)
                .await?;
        Ok(rows.into_iter().map(|(version, description)| AppliedMigration { version, description }).collect())
    }

    async fn applied_versions(&self) -> Result<Vec<i64>, DbError> {
        Ok(self.applied_migrations().await?.into_iter().map(|m| m.version).collect())
    }

    /// Versions shipped in this binary that the database has not applied.
    pub async fn pending_migrations(&self) -> Result<Vec<i64>, DbError> {
        let applied = self.applied_versions().await?;
        Ok(migrator(self.backend)
            .iter()
            .filter(|m| m.migration_type.is_up_migration() && !applied.contains(&m.version))
            .map(|m| m.version)
            .collect())
    }

    /// Number of migrations shipped in this binary.
    pub fn known_migrations(&self) -> usize {
        migrator(self.backend).iter().filter(|m| m.migration_type.is_up_migration()).count()
    }

    /// Starts a transaction that will write. On SQLite it takes the write lock up front
    /// (`BEGIN IMMEDIATE`): a deferred transaction that reads first and writes later cannot wait
    /// for the lock and fails with "database is locked" when another writer got in between.
    ///
    /// The `BEGIN` runs in a task of its own, so it always finishes. A caller dropped while it is
    /// in flight (a worker told to stop, an aborted task, a client hanging up) would otherwise
    /// hand the connection back to the pool inside an open transaction: on SQLite holding the
    /// write lock for good, so that every later writer fails with "database is locked". Now the
    /// finished transaction nobody awaits any more is dropped, which rolls it back.
    pub async fn begin_write(&self) -> Result<sqlx::Transaction<'static, sqlx::Any>, sqlx::Error> {
        let (pool, backend) = (self.writer.clone(), self.backend);
        tokio::spawn(async move {
            match backend {
                Backend::Sqlite => pool.begin_with("BEGIN IMMEDIATE").await,
                Backend::Postgres => pool.begin().await,
            }
        })
        .await
        .map_err(|e| sqlx::Error::Io(std::io::Error::other(format!("beginning a transaction failed: {e}"))))?
    }

    /// A round trip to the database.
    pub async fn ping(&self) -> Result<(), DbError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    /// The connection URL, for PostgreSQL only (LISTEN needs a dedicated connection).
    pub fn postgres_url(&self) -> Option<String> {
        use secrecy::ExposeSecret;
        (self.backend == Backend::Postgres).then(|| self.url.expose_secret().to_string())
    }

    pub async fn close(&self) {
        self.writer.close().await;
        self.pool.close().await;
    }
}

fn describe_migration_error(migrator: &Migrator, err: MigrateError) -> DbError {
    let describe = |version: i64| {
        migrator
            .iter()
            .find(|m| m.version == version)
            .map(|m| m.description.to_string())
            .unwrap_or_else(|| "not in this build".into())
    };
    match err {
        MigrateError::ExecuteMigration(e, version) => {
            DbError::Migration { version, description: describe(version), reason: e.to_string() }
        }
        MigrateError::VersionMismatch(version) => DbError::Migration {
            version,
            description: describe(version),
            reason: "it was applied from a different file than this build ships (checksum mismatch)".into(),
        },
        MigrateError::Dirty(version) => DbError::Migration {
            version,
            description: describe(version),
            reason: "an earlier attempt failed half-way and left the database dirty".into(),
        },
        MigrateError::VersionMissing(version) => DbError::Migration {
            version,
            description: "unknown".into(),
            reason: "the database has a migration this build does not know; is it a newer Gatehouse?".into(),
        },
        other => DbError::Migration { version: 0, description: "migrator".into(), reason: other.to_string() },
    }
}

/// Waits for this process's turn to migrate the SQLite database at `db`: an exclusive lock on
/// `<db>.migrate-lock`, held until the returned file is dropped (the OS drops it with a process
/// that dies).
async fn migration_turn(db: &Path) -> Result<std::fs::File, DbError> {
    let mut name = db.as_os_str().to_owned();
    name.push(".migrate-lock");
    let path = std::path::PathBuf::from(name);
    let failed = |e: std::io::Error| DbError::Migration { version: 0, description: "migration lock".into(), reason: format!("cannot lock {}: {e}", path.display()) };
    let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&path).map_err(failed)?;
    tokio::task::spawn_blocking(move || file.lock().map(|()| file))
        .await
        .map_err(|e| failed(std::io::Error::other(e)))?
        .map_err(failed)
}

/// A SQLite URL's path and query (`sqlite://data/g.db?mode=rwc` -> `data/g.db`, `mode=rwc`).
fn sqlite_parts(url: &str) -> (&str, &str) {
    let rest = url.trim_start_matches("sqlite://").trim_start_matches("sqlite:");
    rest.split_once('?').unwrap_or((rest, ""))
}

/// The file a SQLite URL names; none for an in-memory database.
fn sqlite_file_of(url: &str) -> Option<&str> {
    let (path, _) = sqlite_parts(url);
    (!path.is_empty() && path != ":memory:").then_some(path)
}

/// A pooled PostgreSQL connection idle longer than this is pinged before it is used again.
const PING_AFTER_IDLE: std::time::Duration = std::time::Duration::from_secs(1);

/// How [`Db::connect`] opens a pool of at most `max` connections on `backend`.
fn pool_options(settings: &DatabaseSettings, backend: Backend, max: u32, background_checkpoints: bool) -> AnyPoolOptions {
    let busy_ms = settings.busy_timeout.as_millis();
    // sqlx pings a connection as it goes back to the pool; a ping before each use as well was
    // one more round trip in every PostgreSQL transaction (an idle job's enqueue and its claim
    // each paid one). Only a connection idle long enough to have been dropped on the way (a
    // server restart, a proxy's idle timeout) is pinged before use; a failed ping discards it
    // and the pool takes another. A SQLite file cannot drop.
    let options = AnyPoolOptions::new().max_connections(max).acquire_timeout(settings.acquire_timeout).test_before_acquire(false);
    let options = if backend == Backend::Postgres {
        options.before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for > PING_AFTER_IDLE {
                    sqlx::Connection::ping(conn).await?;
                }
                Ok(true)
            })
        })
    } else {
        options
    };
    options
        .after_connect(move |conn, _meta| {
            Box::pin(async move {
                if backend == Backend::Sqlite {
                    // WAL lets readers run beside the one writer; the busy timeout makes a
                    // writer of another process (or an autocommit write on the shared pool)
                    // wait for the lock instead of failing at once.
                    sqlx::query("PRAGMA journal_mode = WAL").execute(&mut *conn).await?;
                    sqlx::query(&format!("PRAGMA busy_timeout = {busy_ms}")).execute(&mut *conn).await?;
                    sqlx::query("PRAGMA foreign_keys = ON").execute(&mut *conn).await?;
                    sqlx::query("PRAGMA synchronous = NORMAL").execute(&mut *conn).await?;
                    // A statement that may have to undo itself inside a transaction (a claim, a
                    // multi-row completion) keeps a statement journal, which past 64 KiB went to
                    // a temporary file created and deleted each time on the writer's thread.
                    sqlx::query("PRAGMA temp_store = MEMORY").execute(&mut *conn).await?;
                    if background_checkpoints {
                        // The checkpointer task does it instead of the committing connection.
                        sqlx::query("PRAGMA wal_autocheckpoint = 0").execute(&mut *conn).await?;
                        sqlx::query(&format!("PRAGMA journal_size_limit = {}", checkpoint::LOG_FILE_LIMIT)).execute(&mut *conn).await?;
                    }
                }
                Ok(())
            })
        })
}

/// Adds `mode=rwc` so a missing file is created, and creates its folder.
fn prepare_sqlite_url(url: &str) -> Result<String, DbError> {
    let (path, query) = sqlite_parts(url);
    if let Some(file) = sqlite_file_of(url)
        && let Some(parent) = Path::new(file).parent().filter(|p| !p.as_os_str().is_empty())
    {
        std::fs::create_dir_all(parent)
            .map_err(|source| DbError::CreateDir { path: parent.display().to_string(), source })?;
    }
    let mut params: Vec<String> = query.split('&').filter(|p| !p.is_empty()).map(str::to_string).collect();
    if !params.iter().any(|p| p.starts_with("mode=")) {
        params.push("mode=rwc".into());
    }
    Ok(format!("sqlite://{path}?{}", params.join("&")))
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

    /// Eight write transactions of one process, each holding the write lock for 20 ms, with a
    /// busy timeout of 1 ms: they queue for the writer connection and all commit. On separate
    /// connections, each `BEGIN IMMEDIATE` would wait in SQLite's busy handler and fail with
    /// "database is locked" after that millisecond.
    #[tokio::test]
    async fn write_transactions_of_one_process_queue_for_a_sqlite_file_instead_of_its_busy_handler() {
        let dir = tempfile::tempdir().expect("temp dir");
        let settings = DatabaseSettings {
            url: format!("sqlite://{}", dir.path().join("writers.db").display()),
            busy_timeout: std::time::Duration::from_millis(1),
            ..Default::default()
        };
        let db = Db::connect(&settings).await.expect("connect");
        sqlx::query("CREATE TABLE written (n INTEGER NOT NULL)").execute(&db.pool).await.expect("table");
        let writers: Vec<_> = (0..8_i64)
            .map(|n| {
                let db = db.clone();
                tokio::spawn(async move {
                    let mut tx = db.begin_write().await?;
                    sqlx::query("INSERT INTO written (n) VALUES ($1)").bind(n).execute(&mut *tx).await?;
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    tx.commit().await
                })
            })
            .collect();
        for writer in writers {
            writer.await.expect("writer task").expect("each write transaction commits");
        }
        let (count,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM written").fetch_one(&db.pool).await.expect("count");
        assert_eq!(count, 8);
        db.close().await;
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
