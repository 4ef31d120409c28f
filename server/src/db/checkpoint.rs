//! SQLite's background checkpoints: the write-ahead log copied into the database file off the
//! commit path, and the database file synced there too.

use std::{
    collections::HashMap,
    fs::File,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, OnceLock, Weak},
};

use sqlx::AnyPool;

/// The task that checkpoints a SQLite write-ahead log off the commit path (`[database]
/// checkpoint_interval`, on by default): commits only append to the log, and the copy into the
/// database file happens here, passively, on a connection of the read pool, while writers go on
/// appending.
///
/// A passive checkpoint alone never lets the log start over under writes that never pause: the
/// log starts again from its beginning only when a write transaction begins on a log that is all
/// in the database file, and by the time a background checkpoint ends, writers have appended
/// more. Left so, the log grew to 850 MiB in a 200,000-job run. So once the log holds more than
/// [`RESET_FRAMES`], the checkpointer finishes on the writer connection ([`super::Db::begin_write`]):
/// this process's writers queue behind it, so nothing is appended meanwhile, and it copies only
/// what was appended since the passive checkpoint just before. The next write transaction then
/// starts the log over (and trims its file to the bound), unless a reader still reads an old
/// snapshot, in which case the next round tries again. Nothing waits for readers: a `TRUNCATE`
/// checkpoint would, holding the write lock meanwhile (p99 33.75 ms at a steady 1,000 req/s in
/// the build that did that, README, Performance).
///
/// SQLite syncs the database file only when a checkpoint completes, which under writes that never
/// pause is only that finishing step, on the writer connection: its sync would flush every page
/// the passive rounds copied while the writers behind it wait (10–12 ms at ten times the
/// requests). So each round syncs the file itself after its passive checkpoint, off the writer,
/// and the finishing step finds little left to flush. It does so through [`DatabaseFile`], a
/// descriptor kept open as long as the checkpointer runs (see there why).
#[derive(Debug)]
pub(super) struct Checkpointer(tokio::task::AbortHandle);

/// Log frames (pages) past which the checkpointer lets the log start over: 4,096 pages is 16 MiB.
const RESET_FRAMES: i64 = 4096;

/// The log file's size is trimmed back to this when the log starts over (`journal_size_limit`):
/// the bound and a little slack, so that a log that only reached it keeps its file.
pub(super) const LOG_FILE_LIMIT: i64 = (RESET_FRAMES + 512) * (4096 + 24);

impl Checkpointer {
    /// `file`: the database file's path as the URL gives it, for syncing it.
    pub(super) fn spawn(pool: AnyPool, writer: AnyPool, every: std::time::Duration, file: Option<&str>) -> Self {
        let file = file.map(PathBuf::from);
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut database = None;
            // The frames in the database file at the last sync, and whether the last one failed.
            let mut synced: Option<i64> = None;
            let mut failing = false;
            // Whether the last round failed: a failure is logged when a streak begins (a full
            // disk fails every round, ten a second), and the end of a streak is logged too.
            let mut rounds_failing = false;
            loop {
                tick.tick().await;
                if pool.is_closed() {
                    return;
                }
                let copied = match Self::round(&pool, &writer).await {
                    Ok(copied) => {
                        if std::mem::take(&mut rounds_failing) {
                            tracing::info!("checkpointing the SQLite write-ahead log works again");
                        }
                        Some(copied)
                    }
                    Err(e) => {
                        if !pool.is_closed() && !std::mem::replace(&mut rounds_failing, true) {
                            tracing::warn!(error = %e, "checkpointing the SQLite write-ahead log failed; trying again every round, logged again only once it works");
                        }
                        None
                    }
                };
                // Opened at the first round, once SQLite has made the file.
                if database.is_none() {
                    database = file.as_deref().and_then(DatabaseFile::of);
                }
                // Only when the round copied something since the last sync (an idle database is
                // not synced every round).
                let Some(database) = database.clone().filter(|_| copied.is_some_and(|c| c > 0 && Some(c) != synced)) else {
                    continue;
                };
                // A sync task that panicked or was cancelled counts as a failed sync, not a done one.
                let outcome = tokio::task::spawn_blocking(move || database.sync()).await.unwrap_or_else(|e| Err(std::io::Error::other(e)));
                match outcome {
                    Ok(()) => {
                        synced = copied;
                        failing = false;
                    }
                    Err(e) => {
                        if !failing {
                            tracing::warn!(error = %e, "syncing the SQLite database file failed; SQLite still syncs it when a checkpoint completes");
                        }
                        failing = true;
                    }
                }
            }
        });
        Self(task.abort_handle())
    }

    /// One passive checkpoint, finished on the writer connection when the log is past the bound.
    /// Returns how many of the log's frames are in the database file after it.
    async fn round(pool: &AnyPool, writer: &AnyPool) -> Result<i64, sqlx::Error> {
        const PASSIVE: &str = "PRAGMA wal_checkpoint(PASSIVE)";
        // (busy, frames in the log, frames in the database file)
        let (_, frames, copied) = sqlx::query_as::<_, (i64, i64, i64)>(PASSIVE).fetch_one(pool).await?;
        if frames > RESET_FRAMES {
            let mut conn = writer.acquire().await?;
            let (_, _, copied) = sqlx::query_as::<_, (i64, i64, i64)>(PASSIVE).fetch_one(&mut *conn).await?;
            return Ok(copied);
        }
        Ok(copied)
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A read-only descriptor of a database file, shared by every checkpointer of that file in this
/// process, and closed only when the last of them stops.
///
/// Closing any descriptor of a file releases every POSIX (fcntl) lock the process holds on it,
/// SQLite's included, since those locks belong to the process and the file, not to the
/// descriptor: a build that opened the file for each sync and closed it again let another
/// process's writes go unseen (`approvals::approvals_kill_nine::sqlite` failed every time). A
/// checkpointer stops when the last handle of its [`super::Db`] is dropped, after that `Db`'s
/// pools, so this descriptor closes only once nothing of this process reads or writes the file
/// through SQLite any more.
#[derive(Debug, Clone)]
struct DatabaseFile(Arc<File>);

impl DatabaseFile {
    /// The file at `path`, opened unless another checkpointer of this process has it open;
    /// `None` if it cannot be opened.
    fn of(path: &Path) -> Option<Self> {
        static OPEN: OnceLock<Mutex<HashMap<PathBuf, Weak<File>>>> = OnceLock::new();
        let key = std::fs::canonicalize(path).ok()?;
        let mut open = OPEN.get_or_init(Mutex::default).lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        open.retain(|_, file| file.strong_count() > 0);
        if let Some(file) = open.get(&key).and_then(Weak::upgrade) {
            return Some(Self(file));
        }
        let file = Arc::new(File::open(&key).ok()?);
        open.insert(key, Arc::downgrade(&file));
        Some(Self(file))
    }

    /// Flushes the file's data to the disk (`fdatasync`).
    fn sync(&self) -> std::io::Result<()> {
        self.0.sync_data()
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{config::DatabaseSettings, db::Db};

    /// Descriptors of this process open on `path` for reading only (SQLite opens it read-write).
    fn read_only_descriptors_of(path: &Path) -> usize {
        let path = std::fs::canonicalize(path).expect("the file exists");
        let Ok(fds) = std::fs::read_dir("/proc/self/fd") else { return 0 };
        fds.flatten()
            .filter(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target == path))
            .filter(|fd| {
                let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.file_name().to_string_lossy())).unwrap_or_default();
                let flags = info.lines().find_map(|l| l.strip_prefix("flags:")).and_then(|f| u32::from_str_radix(f.trim(), 8).ok());
                flags.is_some_and(|f| f & 0o3 == 0)
            })
            .count()
    }

    async fn until(what: &str, check: impl Fn() -> bool) {
        for _ in 0..200 {
            if check() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{what} within 2 s");
    }

    /// The checkpointer syncs the database file through a descriptor of its own, one per file
    /// however many `Db`s of this process use it, kept open while any of them runs and closed
    /// after the last is dropped.
    #[tokio::test]
    async fn checkpointers_of_a_file_share_one_descriptor_closed_after_the_last() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("synced.db");
        let settings = DatabaseSettings {
            url: format!("sqlite://{}", file.display()),
            checkpoint_interval: Duration::from_millis(10),
            ..Default::default()
        };
        let first = Db::connect(&settings).await.expect("connect");
        sqlx::query("CREATE TABLE written (n INTEGER NOT NULL)").execute(&first.pool).await.expect("table");
        until("the checkpointer opens the file", || read_only_descriptors_of(&file) == 1).await;

        let second = Db::connect(&settings).await.expect("connect again");
        sqlx::query("INSERT INTO written (n) VALUES (1)").execute(&second.pool).await.expect("write");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(read_only_descriptors_of(&file), 1, "the second checkpointer shares the descriptor");

        drop(first);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(read_only_descriptors_of(&file), 1, "kept while a checkpointer of the file runs");
        let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM written").fetch_one(&second.pool).await.expect("read");
        assert_eq!(n, 1);

        drop(second);
        until("the descriptor closes after the last checkpointer", || read_only_descriptors_of(&file) == 0).await;
    }

    #[test]
    fn a_file_that_cannot_be_opened_is_not_synced() {
        let dir = tempfile::tempdir().expect("temp dir");
        assert!(DatabaseFile::of(&dir.path().join("missing.db")).is_none());
        let path = dir.path().join("present.db");
        std::fs::write(&path, b"x").expect("write");
        let a = DatabaseFile::of(&path).expect("opens");
        let b = DatabaseFile::of(&path).expect("shared");
        assert!(Arc::ptr_eq(&a.0, &b.0));
        a.sync().expect("fdatasync");
    }
}
