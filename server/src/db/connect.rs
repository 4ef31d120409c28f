//! How [`Db::connect`](super::Db::connect) and [`Db::migrate`](super::Db::migrate) open and
//! prepare a database: pool options and SQLite pragmas, SQLite URLs and their folder, the
//! migration lock file, and migration errors put in words.

use std::path::Path;

use sqlx::{
    any::AnyPoolOptions,
    migrate::{MigrateError, Migrator},
};

use super::{Backend, DbError, checkpoint};
use crate::config::DatabaseSettings;

pub(super) fn describe_migration_error(migrator: &Migrator, err: MigrateError) -> DbError {
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
pub(super) async fn migration_turn(db: &Path) -> Result<std::fs::File, DbError> {
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
pub(super) fn sqlite_file_of(url: &str) -> Option<&str> {
    let (path, _) = sqlite_parts(url);
    (!path.is_empty() && path != ":memory:").then_some(path)
}

/// A pooled PostgreSQL connection idle longer than this is pinged before it is used again.
const PING_AFTER_IDLE: std::time::Duration = std::time::Duration::from_secs(1);

/// How [`Db::connect`] opens a pool of at most `max` connections on `backend`.
pub(super) fn pool_options(settings: &DatabaseSettings, backend: Backend, max: u32, background_checkpoints: bool) -> AnyPoolOptions {
    let busy_ms = settings.busy_timeout.as_millis();
    let synchronous: &'static str = settings.sqlite_synchronous.into();
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
    } else if sqlite_file_of(&settings.url).is_some() {
        // SQLite undoes a whole transaction by itself when a statement or the COMMIT runs out
        // of room (SQLITE_FULL) or memory. sqlx still counts it open, its ROLLBACK then fails
        // ("no transaction is active"), and every later BEGIN on that connection failed:
        // one full disk stopped all writes until a restart, however much room came back. A
        // connection that comes back still counting a transaction, once the rollback queued for
        // it has run (the ping follows it on the connection's thread), is closed instead of
        // pooled, and the pool opens a new one. A committed transaction costs nothing here. Not
        // for an in-memory database, which lives only as long as its connection.
        options.after_release(|conn, _meta| {
            Box::pin(async move {
                if !sqlx::Connection::is_in_transaction(conn) {
                    return Ok(true);
                }
                sqlx::Connection::ping(conn).await?;
                Ok(!sqlx::Connection::is_in_transaction(conn))
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
                    sqlx::query(&format!("PRAGMA synchronous = {synchronous}")).execute(&mut *conn).await?;
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

/// Adds `mode=rwc` so a missing file is created, and creates its folder. Both are made for this
/// user alone (the folder 0700, the file 0600; SQLite gives its `-wal` and `-shm` files the
/// database file's mode): the file holds every chat, and the sessions of the owners' consoles.
pub(super) fn prepare_sqlite_url(url: &str) -> Result<String, DbError> {
    let (path, query) = sqlite_parts(url);
    let mut params: Vec<String> = query.split('&').filter(|p| !p.is_empty()).map(str::to_string).collect();
    if !params.iter().any(|p| p.starts_with("mode=")) {
        params.push("mode=rwc".into());
    }
    if let Some(file) = sqlite_file_of(url).filter(|_| params.iter().any(|p| p == "mode=rwc")) {
        let file = Path::new(file);
        if let Some(parent) = file.parent().filter(|p| !p.as_os_str().is_empty()) {
            private_dir(parent).map_err(|source| DbError::CreateDir { path: parent.display().to_string(), source })?;
        }
        private_file(file).map_err(|source| DbError::CreateDir { path: file.display().to_string(), source })?;
    }
    Ok(format!("sqlite://{path}?{}", params.join("&")))
}

/// Creates `dir` and the folders above it that are missing, for this user alone.
fn private_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

/// Creates `file` empty (SQLite reads an empty file as a new database) for this user alone,
/// unless it exists; an existing file other users can read is warned about.
fn private_file(file: &Path) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    match options.open(file) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            #[cfg(unix)]
            if let Ok(meta) = std::fs::metadata(file)
                && std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o077 != 0
            {
                tracing::warn!(file = %file.display(), "other users of this machine may read the database file (its chats and console sessions); chmod 600 it");
            }
            Ok(())
        }
        Err(e) => Err(e),
    }
}
