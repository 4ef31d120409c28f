//! Room to write. A full disk must lose nothing: the webhook answers 503 so Meta delivers the
//! post again, jobs stay where they are and are retried, and the owner is told on every console
//! page. This module says which errors mean "no room" and remembers what this process last saw.

use std::{
    path::{Path, PathBuf},
    sync::atomic::{AtomicI64, Ordering},
};

use super::DbError;

/// The stable code of a write refused for want of room.
pub const STORAGE_FULL: &str = "STORAGE_FULL";
/// The stable code of any other database failure of our own.
pub const DATABASE_ERROR: &str = "DATABASE_ERROR";

/// SQLite's `SQLITE_FULL` (a full disk, or the file at `max_page_count`) and PostgreSQL's
/// `disk_full` SQLSTATE. sqlx gives SQLite's extended result code, whose low byte is the primary
/// code; `SQLITE_FULL` has no extended forms, so it is always 13.
fn is_full_code(code: &str) -> bool {
    code == "13" || code == "53100"
}

/// Whether `e` says the database could not write for want of room: the database's own report
/// or an I/O error of a full disk (`ENOSPC`).
pub fn is_full(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(d) => d.code().is_some_and(|c| is_full_code(&c)),
        sqlx::Error::Io(io) => io.kind() == std::io::ErrorKind::StorageFull,
        _ => false,
    }
}

impl DbError {
    /// Whether this failure is a full disk (see [`is_full`]).
    pub fn is_storage_full(&self) -> bool {
        match self {
            Self::Sql(e) | Self::Connect(e) => is_full(e),
            Self::CreateDir { source, .. } => source.kind() == std::io::ErrorKind::StorageFull,
            Self::UnsupportedUrl | Self::Migration { .. } => false,
        }
    }

    /// `STORAGE_FULL` or `DATABASE_ERROR`.
    pub fn code(&self) -> &'static str {
        if self.is_storage_full() { STORAGE_FULL } else { DATABASE_ERROR }
    }
}

/// What this process last saw of its database's room to write: set by a write refused for want
/// of room, cleared by the next write that commits. Shared by every clone of a [`super::Db`].
#[derive(Debug, Default)]
pub struct StorageWatch {
    /// When writes began to fail for want of room (unix ms); 0 while they do not.
    full_since_ms: AtomicI64,
    /// When the last one failed (unix ms).
    last_full_ms: AtomicI64,
}

/// Writes fail for want of room: since when, and when the last one did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full {
    pub since_ms: i64,
    pub last_ms: i64,
}

impl StorageWatch {
    /// Notes how a write went. Other failures say nothing about room and change nothing.
    pub fn observe<T>(&self, result: &Result<T, DbError>) {
        match result {
            Ok(_) => self.wrote(),
            Err(e) => self.failed(e),
        }
    }

    /// A write committed: there is room again.
    pub fn wrote(&self) {
        if self.full_since_ms.swap(0, Ordering::Relaxed) != 0 {
            tracing::info!("the database writes again: there is room on its disk");
        }
    }

    /// A write failed; remembered when it failed for want of room.
    pub fn failed(&self, e: &DbError) {
        if !e.is_storage_full() {
            return;
        }
        let now = super::now_ms();
        self.last_full_ms.store(now, Ordering::Relaxed);
        if self.full_since_ms.compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
            tracing::error!(code = STORAGE_FULL, error = %e, "the database's disk is full: nothing new is stored until there is room (WhatsApp delivers refused posts again)");
        }
    }

    /// When a write last failed for want of room (unix ms), however long ago; `None` if none has
    /// since this process started. Unlike [`Self::full`], a later write that needed no room does
    /// not clear it.
    pub fn last_full_ms(&self) -> Option<i64> {
        let last = self.last_full_ms.load(Ordering::Relaxed);
        (last != 0).then_some(last)
    }

    /// `Some` while writes fail for want of room.
    pub fn full(&self) -> Option<Full> {
        let since_ms = self.full_since_ms.load(Ordering::Relaxed);
        (since_ms != 0).then(|| Full { since_ms, last_ms: self.last_full_ms.load(Ordering::Relaxed).max(since_ms) })
    }
}

/// The folder whose file system holds a SQLite database file.
pub(super) fn folder_of(file: &str) -> PathBuf {
    match Path::new(file).parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Bytes an unprivileged writer may still use on the file system holding `folder`.
pub(super) fn free_bytes(folder: &Path) -> std::io::Result<u64> {
    let st = rustix::fs::statvfs(folder)?;
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{config::DatabaseSettings, db::Db};

    #[test]
    fn full_codes_of_both_backends() {
        assert!(is_full_code("13"), "SQLITE_FULL");
        assert!(is_full_code("53100"), "PostgreSQL disk_full");
        for other in ["5", "19", "2067", "23505", "53200", "53300", "08006"] {
            assert!(!is_full_code(other), "{other}");
        }
        let io = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::StorageFull));
        assert!(is_full(&io));
        assert!(!is_full(&sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::BrokenPipe))));
        assert!(!is_full(&sqlx::Error::RowNotFound));
    }

    /// A real `SQLITE_FULL` through sqlx's `Any` driver: the file held at a few pages by
    /// `max_page_count`, which SQLite refuses to grow past exactly as it refuses on a full disk.
    /// A database file with a table `t (b TEXT UNIQUE)`, whose writer connection (the pool's
    /// only one) may grow the file by two pages at most.
    async fn capped(dir: &tempfile::TempDir) -> Db {
        let settings = DatabaseSettings { url: format!("sqlite://{}", dir.path().join("capped.db").display()), ..DatabaseSettings::default() };
        let db = Db::connect(&settings).await.expect("connect");
        let mut conn = db.writer.acquire().await.expect("conn");
        sqlx::query("CREATE TABLE t (b TEXT UNIQUE)").execute(&mut *conn).await.expect("create");
        let pages: i64 = sqlx::query_scalar("PRAGMA page_count").fetch_one(&mut *conn).await.expect("pages");
        sqlx::query(&format!("PRAGMA max_page_count = {}", pages + 2)).execute(&mut *conn).await.expect("cap");
        db
    }

    #[tokio::test]
    async fn sqlite_full_is_seen_as_full_and_remembered_until_a_write_commits() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = capped(&dir).await;
        let mut conn = db.writer.acquire().await.expect("conn");
        let watch = StorageWatch::default();
        watch.observe(&sqlx::query("INSERT INTO t VALUES ('first')").execute(&mut *conn).await.map_err(DbError::from));
        let dup = sqlx::query("INSERT INTO t VALUES ('a'), ('a')").execute(&mut *conn).await.map_err(DbError::from);
        let dup = dup.expect_err("a unique violation");
        assert!(!dup.is_storage_full() && dup.code() == DATABASE_ERROR, "{dup}");
        watch.failed(&dup);
        assert_eq!(watch.full(), None, "another failure says nothing about room");

        let filled = async {
            for i in 0..100 {
                sqlx::query("INSERT INTO t VALUES (?)").bind(format!("{i}{}", "x".repeat(4000))).execute(&mut *conn).await?;
            }
            Ok::<_, sqlx::Error>(())
        }
        .await
        .map_err(DbError::from);
        let full = filled.as_ref().expect_err("the file cannot grow");
        assert!(full.is_storage_full() && full.code() == STORAGE_FULL, "{full}");
        watch.observe(&filled);
        let seen = watch.full().expect("remembered");
        assert!(seen.since_ms > 0 && seen.last_ms >= seen.since_ms);
        watch.failed(full);
        assert_eq!(watch.full().map(|f| f.since_ms), Some(seen.since_ms), "since the first");

        watch.observe(&Ok::<(), DbError>(()));
        assert_eq!(watch.full(), None, "a committed write clears it");
        assert!(free_bytes(&folder_of(&dir.path().join("capped.db").display().to_string())).expect("statvfs") > 0);
    }

    /// SQLite undoes a transaction by itself when it runs out of room, so sqlx's ROLLBACK of
    /// it fails and sqlx still counts it open: without the pool's check that connection refused
    /// every later `BEGIN` ("non-zero transaction depth"), and one full disk stopped all writes
    /// until a restart. The writer's one connection is capped here; the pool replaces it, and
    /// the new one (uncapped: room again) writes.
    #[tokio::test]
    async fn a_write_transaction_that_ran_out_of_room_leaves_the_writer_usable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = capped(&dir).await;
        let full = async {
            let mut tx = db.begin_write().await?;
            for i in 0..100 {
                sqlx::query("INSERT INTO t VALUES (?)").bind(format!("{i}{}", "x".repeat(4000))).execute(&mut *tx).await?;
            }
            tx.commit().await
        }
        .await
        .map_err(DbError::from);
        assert!(full.as_ref().is_err_and(DbError::is_storage_full), "{full:?}");

        let mut tx = db.begin_write().await.expect("a transaction begins after the full one");
        sqlx::query("INSERT INTO t VALUES ('room again')").execute(&mut *tx).await.expect("insert");
        tx.commit().await.expect("commit");
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM t").fetch_one(&db.pool).await.expect("count");
        assert_eq!(n, 1, "nothing of the full transaction was kept");
    }
}
