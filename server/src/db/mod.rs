//! Database access. All SQL lives in this module tree. Timestamps are unix milliseconds and
//! JSON is TEXT, so the same statements run on SQLite and PostgreSQL through sqlx's `Any`
//! driver; only the migrations differ per backend.

pub mod approvals;
pub mod audit;
pub mod budget;
pub mod catalog_reloads;
mod checkpoint;
pub mod clarifications;
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
pub mod retention;
pub mod sessions;
pub mod simulator;
pub mod stats;
pub mod storage;
pub mod tool_answers;
pub mod tool_audit;
pub mod tool_sessions;
pub mod tool_results;
pub mod traces;
pub mod whatsapp;

mod connect;
mod sql;

use std::sync::Arc;

use sqlx::{AnyPool, migrate::Migrator};

use crate::config::DatabaseSettings;
use checkpoint::Checkpointer;
use connect::{describe_migration_error, migration_turn, pool_options, prepare_sqlite_url, sqlite_file_of};
pub use sql::{begin_write_on, clean_text, duration_ms, now_ms, sha256_hex};
pub(crate) use sql::{IntBool, SetFilters, anonymous_on_sqlite, backend_of, lease_end, lease_now, lock_until_commit, parse_stored, placeholders, rows_with_ids, stored_name, value_rows, value_rows_from};

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
    #[error("cannot create the SQLite file or its folder {path}: {source}")]
    CreateDir { path: String, source: std::io::Error },
    #[error("cannot connect to the database: {0}")]
    Connect(#[source] sqlx::Error),
    #[error("migration {version} ({description}) failed: {reason}. Hint: fix the cause, then run `gatehouse migrate`")]
    Migration { version: i64, description: String, reason: String },
    #[error(transparent)]
    Sql(#[from] sqlx::Error),
}

impl DbError {
    /// The database could not be reached (see [`is_unavailable`]); the statement did not run.
    pub fn is_unavailable(&self) -> bool {
        match self {
            DbError::Connect(_) => true,
            DbError::Sql(e) => is_unavailable(e),
            _ => false,
        }
    }
}

/// Whether an error of any type is a [`DbError`] or a `sqlx::Error` that says the database could
/// not be reached (for layers that take any displayable error, such as the console's).
pub fn is_unavailable_error(e: &dyn std::any::Any) -> bool {
    e.downcast_ref::<DbError>().is_some_and(DbError::is_unavailable) || e.downcast_ref::<sqlx::Error>().is_some_and(is_unavailable)
}

/// Whether `e` says the database could not be reached, rather than that a statement failed:
/// no connection to be had (the pool timed out or closed, the socket failed) or, on
/// PostgreSQL, a connection lost or refused (SQLSTATE class 08, or 57P01-57P03: the server
/// shutting down or starting).
pub fn is_unavailable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) => true,
        sqlx::Error::Database(d) => d.code().is_some_and(|c| c.starts_with("08") || matches!(c.as_ref(), "57P01" | "57P02" | "57P03")),
        _ => false,
    }
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
    /// Whether writes fail for want of room, as this process last saw.
    storage: Arc<storage::StorageWatch>,
    /// The folder holding the SQLite file, whose file system's free space the console shows.
    sqlite_folder: Option<std::path::PathBuf>,
}

/// One applied migration, for the Dashboard and `/readyz`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AppliedMigration {
    pub version: i64,
    pub description: String,
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
        let sqlite_folder = sqlite_file_of(&settings.url).map(storage::folder_of);
        Ok(Self { pool, writer, backend, url: secrecy::SecretString::from(settings.url.clone()), _checkpointer: checkpointer, storage: Arc::default(), sqlite_folder })
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

    /// The connection write transactions use ([`Db::begin_write`]), for a query that begins and
    /// ends its own transaction; on a SQLite file the one writer connection, in its turn.
    pub async fn acquire_write(&self) -> Result<sqlx::pool::PoolConnection<sqlx::Any>, sqlx::Error> {
        self.writer.acquire().await
    }

    /// A round trip to the database.
    pub async fn ping(&self) -> Result<(), DbError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    /// Whether writes fail for want of room, as this process last saw (the webhook's intake and
    /// the job worker report what their writes met).
    pub fn storage(&self) -> &storage::StorageWatch {
        &self.storage
    }

    /// Bytes left on the file system holding the SQLite file; `None` on PostgreSQL (its disk is
    /// the server's) and for an in-memory database.
    pub fn free_bytes(&self) -> Option<u64> {
        let folder = self.sqlite_folder.as_deref()?;
        storage::free_bytes(folder).inspect_err(|e| tracing::debug!(error = %e, folder = %folder.display(), "cannot read the free space")).ok()
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

    /// A migrated SQLite database in a folder of its own, for unit tests: `tweak` sets what a
    /// test needs of the settings (its URL is the folder's file). Keep the folder while the
    /// database is used.
    #[cfg(test)]
    pub(crate) async fn scratch(tweak: impl FnOnce(&mut DatabaseSettings)) -> (tempfile::TempDir, Self) {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut settings = DatabaseSettings { url: format!("sqlite://{}", dir.path().join("scratch.db").display()), ..DatabaseSettings::default() };
        tweak(&mut settings);
        let db = Self::connect(&settings).await.expect("connect");
        db.migrate().await.expect("migrate");
        (dir, db)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// A read-then-write on a connection of its own, while another connection commits a write
    /// between its read and its write: begun with [`begin_write_on`], it holds the write lock
    /// from the start, so the other waits and both commit. (Begun deferred, its write would fail
    /// with "database is locked" at once.)
    #[tokio::test]
    async fn a_write_transaction_on_a_connection_of_its_own_is_not_cut_off_by_another_writer() {
        let dir = tempfile::tempdir().expect("temp dir");
        let settings = DatabaseSettings { url: format!("sqlite://{}", dir.path().join("rw.db").display()), ..Default::default() };
        let db = Db::connect(&settings).await.expect("connect");
        sqlx::query("CREATE TABLE counted (n INTEGER NOT NULL)").execute(&db.pool).await.expect("table");
        let mut conn = db.pool.acquire().await.expect("conn");
        let mut tx = begin_write_on(&mut conn).await.expect("begin");
        let (before,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM counted").fetch_one(&mut *tx).await.expect("read");
        let other = {
            let db = db.clone();
            tokio::spawn(async move { sqlx::query("INSERT INTO counted (n) VALUES (2)").execute(&db.writer).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        sqlx::query("INSERT INTO counted (n) VALUES ($1)").bind(before + 1).execute(&mut *tx).await.expect("the write after the read");
        tx.commit().await.expect("commit");
        other.await.expect("task").expect("the other writer waited and committed");
        let (count,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM counted").fetch_one(&db.pool).await.expect("count");
        assert_eq!(count, 2);
        drop(conn);
        db.close().await;
    }

    #[tokio::test]
    async fn sqlite_commits_wait_for_the_disk_only_when_configured() {
        let dir = tempfile::tempdir().expect("temp dir");
        for (setting, pragma) in [(crate::config::SqliteSynchronous::Normal, 1_i64), (crate::config::SqliteSynchronous::Full, 2)] {
            let settings = DatabaseSettings { url: format!("sqlite://{}", dir.path().join("sync.db").display()), sqlite_synchronous: setting, ..Default::default() };
            let db = Db::connect(&settings).await.expect("connect");
            for pool in [&db.pool, &db.writer] {
                let (value,): (i64,) = sqlx::query_as("PRAGMA synchronous").fetch_one(pool).await.expect("pragma");
                assert_eq!(value, pragma, "{setting:?}");
            }
            db.close().await;
        }
    }

    /// The database file and the folders made for it are this user's alone, and so are the
    /// files SQLite adds beside it: they hold every chat and the owners' console sessions.
    #[cfg(unix)]
    #[tokio::test]
    async fn a_new_sqlite_file_is_readable_by_its_user_alone() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("made").join("here").join("gatehouse.db");
        let db = Db::connect(&DatabaseSettings { url: format!("sqlite://{}", file.display()), ..Default::default() }).await.expect("connect");
        sqlx::query("CREATE TABLE t (n INTEGER)").execute(&db.writer).await.expect("write");
        let mode = |p: &std::path::Path| std::fs::metadata(p).expect("metadata").permissions().mode() & 0o777;
        assert_eq!(mode(&file), 0o600);
        assert_eq!(mode(&file.with_extension("db-wal")), 0o600, "the write-ahead log too");
        assert_eq!((mode(&dir.path().join("made")), mode(&dir.path().join("made").join("here"))), (0o700, 0o700));
        db.close().await;
    }
}
