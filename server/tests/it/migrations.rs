use crate::{both_backends, support::TestDb};

async fn apply_then_noop(db: TestDb) {
    let pool = db.connect().await;
    let first = pool.migrate().await.expect("first run");
    assert_eq!(first.len(), pool.known_migrations(), "a fresh database gets every migration");
    assert!(first.iter().any(|m| m.version == 1 && m.description == "foundation"));
    let second = pool.migrate().await.expect("second run");
    assert!(second.is_empty(), "second run applies nothing: {second:?}");
    assert!(pool.pending_migrations().await.expect("pending").is_empty());
    assert_eq!(pool.applied_migrations().await.expect("applied").len(), pool.known_migrations());
    pool.close().await;
}
both_backends!(migrations_apply_once, apply_then_noop);

async fn sqlite_file_is_created_with_pragmas(db: TestDb) {
    let pool = db.connect().await;
    if pool.backend == server::db::Backend::Sqlite {
        let path = db.url.trim_start_matches("sqlite://");
        assert!(std::path::Path::new(path).exists(), "file and folder created");
        let (mode,): (String,) = sqlx::query_as("PRAGMA journal_mode").fetch_one(&pool.pool).await.expect("pragma");
        assert_eq!(mode.to_lowercase(), "wal");
        let (fk,): (i64,) = sqlx::query_as("PRAGMA foreign_keys").fetch_one(&pool.pool).await.expect("pragma");
        assert_eq!(fk, 1);
        let (busy,): (i64,) = sqlx::query_as("PRAGMA busy_timeout").fetch_one(&pool.pool).await.expect("pragma");
        assert_eq!(busy, 5000);
        let (temp,): (i64,) = sqlx::query_as("PRAGMA temp_store").fetch_one(&pool.pool).await.expect("pragma");
        assert_eq!(temp, 2, "temporary files (statement journals) are kept in memory");
    }
    pool.close().await;
}
both_backends!(sqlite_pragmas, sqlite_file_is_created_with_pragmas);

/// A write transaction whose caller is dropped partway through `begin_write` (a worker told to
/// stop, an aborted task) must not come back from the pool still open: on SQLite it would hold
/// the write lock for good and every later writer would fail with "database is locked". The
/// caller is dropped after 1, 2, ... polls, so every await inside the begin gets its turn.
async fn a_dropped_begin_leaves_no_transaction_open(db: TestDb) {
    let settings = server::config::DatabaseSettings {
        url: db.url.clone(),
        max_connections: 2,
        busy_timeout: std::time::Duration::from_millis(1000),
        ..Default::default()
    };
    let pool = server::db::Db::connect(&settings).await.expect("connect");
    pool.migrate().await.expect("migrate");
    for polls in 1..=8 {
        let mut begin = Box::pin(pool.begin_write());
        for _ in 0..polls {
            let step = std::future::poll_fn(|cx| std::task::Poll::Ready(begin.as_mut().poll(cx))).await;
            if step.is_ready() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(3)).await;
        }
        drop(begin);
    }
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    for i in 0..6 {
        let mut tx = pool.begin_write().await.unwrap_or_else(|e| panic!("write {i}: {e}"));
        sqlx::query("INSERT INTO owner_audit (at, event) VALUES ($1, 'probe')")
            .bind(i64::from(i))
            .execute(&mut *tx)
            .await
            .unwrap_or_else(|e| panic!("write {i}: {e}"));
        tx.commit().await.unwrap_or_else(|e| panic!("write {i}: {e}"));
    }
    pool.close().await;
}
both_backends!(db_dropped_begin, a_dropped_begin_leaves_no_transaction_open);

/// SQLite commits only append to the write-ahead log; a background task copies it into the
/// database file (`[database] checkpoint_interval`), so no commit waits for that copy. A log past
/// its bound (16 MiB) starts over at a later write and its file is trimmed, without waiting for
/// a reader of an old snapshot: writes go on committing (with a busy timeout of 1 ms) while
/// one holds the log, and it starts over once that reader is done.
async fn sqlite_log_is_checkpointed_in_the_background(db: TestDb) {
    let settings = server::config::DatabaseSettings {
        url: db.url.clone(),
        checkpoint_interval: std::time::Duration::from_millis(20),
        busy_timeout: std::time::Duration::from_millis(1),
        ..Default::default()
    };
    let pool = server::db::Db::connect(&settings).await.expect("connect");
    if pool.backend == server::db::Backend::Sqlite {
        let (auto,): (i64,) = sqlx::query_as("PRAGMA wal_autocheckpoint").fetch_one(&pool.pool).await.expect("pragma");
        assert_eq!(auto, 0, "commits leave checkpoints to the background task");
        let write = |sql: &'static str| {
            let pool = pool.clone();
            async move {
                let mut tx = pool.begin_write().await?;
                sqlx::query(sql).execute(&mut *tx).await?;
                tx.commit().await
            }
        };
        write("CREATE TABLE bulk (b BLOB)").await.expect("create");
        // 2 MiB: half of what SQLite's own automatic checkpoint (1,000 pages) would wait for.
        write("INSERT INTO bulk (b) VALUES (zeroblob(2097152))").await.expect("insert");
        let file = std::path::PathBuf::from(db.url.trim_start_matches("sqlite://"));
        let size = |path: &std::path::Path| std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while size(&file) < 2 << 20 {
            assert!(std::time::Instant::now() < deadline, "the log was not copied into the database file");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }

        // A reader keeps the snapshot from before 24 MiB more are written.
        let mut reader = pool.pool.begin().await.expect("reader");
        sqlx::query("SELECT COUNT(*) FROM bulk").fetch_one(&mut *reader).await.expect("read");
        write("INSERT INTO bulk (b) VALUES (zeroblob(25165824))").await.expect("insert");
        let log = std::path::PathBuf::from(format!("{}-wal", file.display()));
        for i in 0..40 {
            write("INSERT INTO bulk (b) VALUES (zeroblob(100))").await.unwrap_or_else(|e| panic!("write {i} beside the checkpointer: {e}"));
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert!(size(&log) > 24 << 20, "the log cannot start over while a reader uses it");
        reader.rollback().await.expect("reader done");

        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while size(&log) > 20 << 20 {
            assert!(std::time::Instant::now() < deadline, "the log did not start over: {} bytes", size(&log));
            write("INSERT INTO bulk (b) VALUES (zeroblob(100))").await.expect("write");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
    pool.close().await;
}
both_backends!(sqlite_background_checkpoints, sqlite_log_is_checkpointed_in_the_background);

/// A pooled PostgreSQL connection that the server dropped while it sat idle (a restart, a
/// proxy's idle timeout) is found out before it is handed out: the next use succeeds. Pooled
/// connections in use moments ago are handed out without a ping (`db::PING_AFTER_IDLE`).
#[tokio::test]
async fn postgres_connection_dropped_while_idle_is_not_handed_out() {
    let Some(db) = TestDb::postgres().await else { return };
    let settings = server::config::DatabaseSettings { url: db.url.clone(), max_connections: 1, ..Default::default() };
    let pool = server::db::Db::connect(&settings).await.expect("connect");
    let (pid,): (i32,) = sqlx::query_as("SELECT pg_backend_pid()").fetch_one(&pool.pool).await.expect("pid");
    // Back in the pool (sqlx pings it on the way) before its backend goes away.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while pool.pool.num_idle() < 1 {
        assert!(std::time::Instant::now() < deadline, "the connection never went back to the pool");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let other = db.connect().await;
    let (ended,): (bool,) = sqlx::query_as("SELECT pg_terminate_backend($1)").bind(pid).fetch_one(&other.pool).await.expect("terminate");
    assert!(ended, "the pooled connection's backend was terminated");
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let (next,): (i32,) = sqlx::query_as("SELECT pg_backend_pid()").fetch_one(&pool.pool).await.expect("the next use gets a live connection");
    assert_ne!(next, pid);
    pool.close().await;
    other.close().await;
}
