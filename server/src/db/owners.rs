//! Owners, their WhatsApp numbers and the one-time setup marker.

use sqlx::AnyConnection;

use super::{DbError, now_ms};

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct OwnerRow {
    pub id: i64,
    pub login: String,
    pub display_name: String,
    pub password_hash: String,
    pub session_epoch: i64,
    pub created_at: i64,
}

const OWNER_COLUMNS: &str = "id, login, display_name, password_hash, session_epoch, created_at";

/// True once the first owner has been created. Stays true for good.
pub async fn setup_completed(conn: &mut AnyConnection) -> Result<bool, DbError> {
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM setup_state").fetch_one(&mut *conn).await?;
    Ok(n > 0)
}

/// Claims the setup marker. Returns false when another request already did, in which case the
/// caller's transaction must be rolled back.
pub async fn claim_setup(conn: &mut AnyConnection, owner_id: i64) -> Result<bool, DbError> {
    let done = sqlx::query("INSERT INTO setup_state (id, completed_at, owner_id) VALUES (1, $1, $2) ON CONFLICT (id) DO NOTHING")
        .bind(now_ms())
        .bind(owner_id)
        .execute(&mut *conn)
        .await?;
    Ok(done.rows_affected() == 1)
}

#[derive(Debug, thiserror::Error)]
pub enum InsertOwnerError {
    #[error("login name is taken")]
    LoginTaken,
    #[error("WhatsApp number {0} already belongs to an owner")]
    PhoneTaken(String),
    #[error(transparent)]
    Db(#[from] DbError),
}

fn is_unique_violation(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.is_unique_violation())
}

/// Inserts an owner and its numbers. Run inside a transaction.
pub async fn insert_owner(
    conn: &mut AnyConnection,
    login: &str,
    display_name: &str,
    password_hash: &str,
    phones: &[String],
) -> Result<i64, InsertOwnerError> {
    let now = now_ms();
    let id: Option<i64> = sqlx::query_scalar(
        "INSERT INTO owners (login, display_name, password_hash, session_epoch, created_at, updated_at) \
         VALUES ($1, $2, $3, 0, $4, $4) ON CONFLICT (login) DO NOTHING RETURNING id",
    )
    .bind(login)
    .bind(display_name)
    .bind(password_hash)
    .bind(now)
    .fetch_optional(&mut *conn)
    .await
    .map_err(DbError::from)?;
    let Some(id) = id else { return Err(InsertOwnerError::LoginTaken) };
    add_phones(conn, id, phones).await?;
    Ok(id)
}

async fn add_phones(conn: &mut AnyConnection, owner_id: i64, phones: &[String]) -> Result<(), InsertOwnerError> {
    for phone in phones {
        let res = sqlx::query("INSERT INTO owner_phones (phone, owner_id, created_at) VALUES ($1, $2, $3)")
            .bind(phone)
            .bind(owner_id)
            .bind(now_ms())
            .execute(&mut *conn)
            .await;
        match res {
            Ok(_) => {}
            Err(e) if is_unique_violation(&e) => return Err(InsertOwnerError::PhoneTaken(phone.clone())),
            Err(e) => return Err(InsertOwnerError::Db(e.into())),
        }
    }
    Ok(())
}

/// Replaces an owner's numbers. Run inside a transaction.
pub async fn replace_phones(conn: &mut AnyConnection, owner_id: i64, phones: &[String]) -> Result<(), InsertOwnerError> {
    sqlx::query("DELETE FROM owner_phones WHERE owner_id = $1")
        .bind(owner_id)
        .execute(&mut *conn)
        .await
        .map_err(DbError::from)?;
    add_phones(conn, owner_id, phones).await?;
    sqlx::query("UPDATE owners SET updated_at = $1 WHERE id = $2")
        .bind(now_ms())
        .bind(owner_id)
        .execute(&mut *conn)
        .await
        .map_err(DbError::from)?;
    Ok(())
}

pub async fn find_by_login(conn: &mut AnyConnection, login: &str) -> Result<Option<OwnerRow>, DbError> {
    Ok(sqlx::query_as(&format!("SELECT {OWNER_COLUMNS} FROM owners WHERE login = $1")).bind(login).fetch_optional(&mut *conn).await?)
}

pub async fn find_by_id(conn: &mut AnyConnection, id: i64) -> Result<Option<OwnerRow>, DbError> {
    Ok(sqlx::query_as(&format!("SELECT {OWNER_COLUMNS} FROM owners WHERE id = $1")).bind(id).fetch_optional(&mut *conn).await?)
}

pub async fn list(conn: &mut AnyConnection) -> Result<Vec<OwnerRow>, DbError> {
    Ok(sqlx::query_as(&format!("SELECT {OWNER_COLUMNS} FROM owners ORDER BY id")).fetch_all(&mut *conn).await?)
}

pub async fn count(conn: &mut AnyConnection) -> Result<i64, DbError> {
    Ok(sqlx::query_scalar("SELECT COUNT(*) FROM owners").fetch_one(&mut *conn).await?)
}

pub async fn phones_of(conn: &mut AnyConnection, owner_id: i64) -> Result<Vec<String>, DbError> {
    Ok(sqlx::query_scalar("SELECT phone FROM owner_phones WHERE owner_id = $1 ORDER BY phone").bind(owner_id).fetch_all(&mut *conn).await?)
}

/// Every owner's WhatsApp number (E.164), for notices that go to all of them.
pub async fn all_phones(conn: &mut AnyConnection) -> Result<Vec<String>, DbError> {
    Ok(sqlx::query_scalar("SELECT phone FROM owner_phones ORDER BY phone").fetch_all(&mut *conn).await?)
}

/// The failed logins from the device stored under `digest` since its last login and
/// `failures_since_ms`, if it is trusted for the owner whose login name is `login`: signed in
/// since `since_ms`, under the owner's current session epoch.
pub async fn trusted_device_failures(conn: &mut AnyConnection, digest: &str, login: &str, since_ms: i64, failures_since_ms: i64) -> Result<Option<i64>, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT (SELECT COUNT(*) FROM owner_audit a WHERE a.device = d.digest AND a.event = $4 \
                 AND a.at > CASE WHEN d.last_used_at > $5 THEN d.last_used_at ELSE $5 END) \
         FROM owner_devices d JOIN owners o ON o.id = d.owner_id \
         WHERE d.digest = $1 AND o.login = $2 AND d.session_epoch = o.session_epoch AND d.last_used_at > $3",
    )
    .bind(digest)
    .bind(login)
    .bind(since_ms)
    .bind(super::audit::event::LOGIN_FAILED)
    .bind(failures_since_ms)
    .fetch_optional(&mut *conn)
    .await?)
}

/// Trusts the device stored under `digest` for `owner` as of `now`, and forgets the owner's
/// devices unused since `stale_before`, and all but the `keep` last used.
pub async fn remember_device(conn: &mut AnyConnection, digest: &str, owner: &OwnerRow, now: i64, stale_before: i64, keep: i64) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO owner_devices (digest, owner_id, session_epoch, created_at, last_used_at) VALUES ($1, $2, $3, $4, $4) \
         ON CONFLICT (digest) DO UPDATE SET last_used_at = excluded.last_used_at",
    )
    .bind(digest)
    .bind(owner.id)
    .bind(owner.session_epoch)
    .bind(now)
    .execute(&mut *conn)
    .await?;
    sqlx::query(
        "DELETE FROM owner_devices WHERE owner_id = $1 AND (last_used_at <= $2 OR digest NOT IN \
         (SELECT digest FROM owner_devices WHERE owner_id = $1 ORDER BY last_used_at DESC, digest LIMIT $3))",
    )
    .bind(owner.id)
    .bind(stale_before)
    .bind(keep)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Sets a new password hash and voids every session of the owner.
pub async fn set_password(conn: &mut AnyConnection, owner_id: i64, password_hash: &str) -> Result<bool, DbError> {
    let done = sqlx::query(
        "UPDATE owners SET password_hash = $1, session_epoch = session_epoch + 1, updated_at = $2 WHERE id = $3",
    )
    .bind(password_hash)
    .bind(now_ms())
    .bind(owner_id)
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// The owner a WhatsApp number belongs to. WhatsApp gives numbers as digits (`15550001111`);
/// owners' numbers are stored in E.164 (`+15550001111`).
pub async fn owner_by_phone(conn: &mut AnyConnection, phone: &str) -> Result<Option<i64>, DbError> {
    let digits: String = phone.chars().filter(char::is_ascii_digit).collect();
    if digits.is_empty() {
        return Ok(None);
    }
    let sql = "SELECT owner_id FROM owner_phones WHERE phone = $1";
    Ok(sqlx::query_scalar(sql).bind(format!("+{digits}")).fetch_optional(&mut *conn).await?)
}
