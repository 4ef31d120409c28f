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
/// database file (`[database] checkpoint_interval`), so no commit waits for that copy; a log
/// that grows past a bound is truncated.
async fn sqlite_log_is_checkpointed_in_the_background(db: TestDb) {
    let settings = server::config::DatabaseSettings { url: db.url.clone(), checkpoint_interval: std::time::Duration::from_millis(50), ..Default::default() };
    let pool = server::db::Db::connect(&settings).await.expect("connect");
    if pool.backend == server::db::Backend::Sqlite {
        let (auto,): (i64,) = sqlx::query_as("PRAGMA wal_autocheckpoint").fetch_one(&pool.pool).await.expect("pragma");
        assert_eq!(auto, 0, "commits leave checkpoints to the background task");
        sqlx::query("CREATE TABLE bulk (b BLOB)").execute(&pool.pool).await.expect("create");
        // 2 MiB: half of what SQLite's own automatic checkpoint (1,000 pages) would wait for.
        sqlx::query("INSERT INTO bulk (b) VALUES (zeroblob(2097152))").execute(&pool.pool).await.expect("insert");
        let file = std::path::PathBuf::from(db.url.trim_start_matches("sqlite://"));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0) < 2 << 20 {
            assert!(std::time::Instant::now() < deadline, "the log was not copied into the database file");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        // A log past 32 MiB is copied whole and truncated, so it cannot grow without end.
        sqlx::query("INSERT INTO bulk (b) VALUES (zeroblob(41943040))").execute(&pool.pool).await.expect("insert");
        let log = std::path::PathBuf::from(format!("{}-wal", file.display()));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0) > 1 << 20 {
            assert!(std::time::Instant::now() < deadline, "the log was not truncated");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
    pool.close().await;
}
both_backends!(sqlite_background_checkpoints, sqlite_log_is_checkpointed_in_the_background);
