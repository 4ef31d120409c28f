//! A tower-sessions store on our own `sessions` table, so sessions live in the same database
//! (either backend) and migrate with everything else.

use async_trait::async_trait;
use tower_sessions::{
    SessionStore,
    session::{Id, Record},
    session_store::{Error, Result},
};

use crate::db::{Db, sessions};

#[derive(Debug, Clone)]
pub struct DbSessionStore {
    db: Db,
}

impl DbSessionStore {
    pub fn new(db: Db) -> Self {
        Self { db }
    }

    /// Deletes expired sessions now and then, until the process ends.
    pub fn spawn_cleanup(&self, every: std::time::Duration) {
        let db = self.db.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                if let Ok(mut conn) = db.pool.acquire().await
                    && let Err(e) = sessions::delete_expired(&mut conn).await
                {
                    tracing::warn!(error = %e, "expired session cleanup failed");
                }
            }
        });
    }
}

/// A store failure; one because the database could not be reached starts with the stable code
/// `DATABASE_UNAVAILABLE`, so the console answers it as such (503) and not as a fault (500):
/// tower-sessions carries a backend's failure as text only.
fn backend_err<E: std::fmt::Display + 'static>(e: E) -> Error {
    if crate::db::is_unavailable_error(&e) { Error::Backend(format!("{}: {e}", app::error::code::DATABASE_UNAVAILABLE)) } else { Error::Backend(e.to_string()) }
}

/// The record as stored: without its id (the cookie's value; the row is found by its digest,
/// see `db::sessions`), and its expiry in unix milliseconds.
fn encode(record: &Record) -> Result<(String, i64)> {
    let stored = Record { id: Id(0), data: record.data.clone(), expiry_date: record.expiry_date };
    let data = serde_json::to_string(&stored).map_err(|e| Error::Encode(e.to_string()))?;
    let expires = i64::try_from(record.expiry_date.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX);
    Ok((data, expires))
}

#[async_trait]
impl SessionStore for DbSessionStore {
    async fn create(&self, record: &mut Record) -> Result<()> {
        let mut conn = self.db.pool.acquire().await.map_err(backend_err)?;
        // The stored record holds no id: a new id on a collision changes nothing of it.
        let (data, expires) = encode(record)?;
        loop {
            if sessions::insert_new(&mut conn, &record.id.to_string(), &data, expires).await.map_err(backend_err)? {
                return Ok(());
            }
            record.id = Id::default();
        }
    }

    /// Every request saves its session, to slide the idle expiry. On a full disk that write
    /// fails; the session as stored is still good, so the page is served all the same and the
    /// owner can read what is wrong (the console's banner) instead of a 500.
    async fn save(&self, record: &Record) -> Result<()> {
        let (data, expires) = encode(record)?;
        let mut conn = self.db.pool.acquire().await.map_err(backend_err)?;
        match sessions::update(&mut conn, &record.id.to_string(), &data, expires).await {
            Err(e) if e.is_storage_full() => {
                self.db.storage().failed(&e);
                tracing::debug!(error = %e, "session not saved: no room; it keeps its stored expiry");
                Ok(())
            }
            other => other.map_err(backend_err),
        }
    }

    async fn load(&self, id: &Id) -> Result<Option<Record>> {
        let mut conn = self.db.pool.acquire().await.map_err(backend_err)?;
        let Some(data) = sessions::load(&mut conn, &id.to_string()).await.map_err(backend_err)? else { return Ok(None) };
        let record: Record = serde_json::from_str(&data).map_err(|e| Error::Decode(e.to_string()))?;
        Ok(Some(Record { id: *id, ..record }))
    }

    async fn delete(&self, id: &Id) -> Result<()> {
        let mut conn = self.db.pool.acquire().await.map_err(backend_err)?;
        sessions::delete(&mut conn, &id.to_string()).await.map_err(backend_err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a full disk a session's save (which only slides its idle expiry) is skipped, not a
    /// failed request: the owner keeps the console, where the banner says what is wrong. The
    /// database here has one connection whose file may not grow; the save needs new pages.
    #[tokio::test]
    async fn a_save_that_finds_no_room_keeps_the_session_and_the_request() {
        let (_dir, db) = Db::scratch(|s| s.max_connections = 1).await;
        let store = DbSessionStore::new(db.clone());
        let mut record = Record { id: Id::default(), data: Default::default(), expiry_date: time::OffsetDateTime::now_utc() + time::Duration::hours(1) };
        store.create(&mut record).await.expect("create");
        {
            let mut conn = db.pool.acquire().await.expect("conn");
            let pages: i64 = sqlx::query_scalar("PRAGMA page_count").fetch_one(&mut *conn).await.expect("pages");
            sqlx::query(&format!("PRAGMA max_page_count = {pages}")).execute(&mut *conn).await.expect("cap");
        }
        record.data.insert("big".into(), serde_json::Value::String("x".repeat(64 << 10)));
        store.save(&record).await.expect("a save without room is skipped, not an error");
        assert!(db.storage().full().is_some(), "and the console hears of it");
        let kept = store.load(&record.id).await.expect("load").expect("the session is still there");
        assert!(kept.data.is_empty(), "as it was stored");
    }

    /// Reading the sessions table gives no one a session: a row is stored under the digest of
    /// its id, and its record does not hold the id (the cookie's value). The store still finds
    /// it by the id, and gives the record back with it.
    #[tokio::test]
    async fn a_session_is_stored_without_its_id() {
        let (_dir, db) = Db::scratch(|_| {}).await;
        let store = DbSessionStore::new(db.clone());
        let mut record = Record { id: Id::default(), data: Default::default(), expiry_date: time::OffsetDateTime::now_utc() + time::Duration::hours(1) };
        record.data.insert("owner_id".into(), serde_json::json!(7));
        store.create(&mut record).await.expect("create");
        let cookie = record.id.to_string();
        let rows: Vec<(String, String)> = sqlx::query_as("SELECT id, data FROM sessions").fetch_all(&db.pool).await.expect("rows");
        assert_eq!(rows.len(), 1);
        assert!(!rows[0].0.contains(&cookie) && !rows[0].1.contains(&cookie), "the id is nowhere in the row: {rows:?}");
        let loaded = store.load(&record.id).await.expect("load").expect("found by its id");
        assert_eq!((loaded.id, loaded.data.get("owner_id")), (record.id, Some(&serde_json::json!(7))));
        sqlx::query("INSERT INTO sessions (id, data, expires_at) SELECT $1, data, expires_at FROM sessions").bind(&cookie).execute(&db.pool).await.expect("a row under the plain id");
        store.delete(&record.id).await.expect("delete");
        let left: Vec<String> = sqlx::query_scalar("SELECT id FROM sessions").fetch_all(&db.pool).await.expect("rows");
        assert_eq!(left, std::slice::from_ref(&cookie), "the stored row was found by its digest and deleted");
        sqlx::query("DELETE FROM sessions").execute(&db.pool).await.expect("clear");
        sqlx::query("INSERT INTO sessions (id, data, expires_at) VALUES ($1, $2, $3)").bind(&cookie).bind(&rows[0].1).bind(i64::MAX).execute(&db.pool).await.expect("a row under the plain id");
        assert!(store.load(&record.id).await.expect("load").is_none(), "a row under the plain id is not a session");
    }
}
