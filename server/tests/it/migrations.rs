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
