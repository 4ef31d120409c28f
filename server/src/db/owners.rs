//! Owners, their WhatsApp numbers and the one-time setup marker.

use sqlx::{AnyConnection, Row};

use super::{DbError, now_ms};

#[derive(Debug, Clone)]
pub struct OwnerRow {
    pub id: i64,
    pub login: String,
    pub display_name: String,
    pub password_hash: String,
    pub session_epoch: i64,
    pub created_at: i64,
}

const OWNER_COLUMNS: &str = "id, login, display_name, password_hash, session_epoch, created_at";

fn owner_from_row(row: &sqlx::any::AnyRow) -> Result<OwnerRow, sqlx::Error> {
    Ok(OwnerRow {
        id: row.try_get(0)?,
        login: row.try_get(1)?,
        display_name: row.try_get(2)?,
        password_hash: row.try_get(3)?,
        session_epoch: row.try_get(4)?,
        created_at: row.try_get(5)?,
    })
}

/// True once the first owner has been created. Stays true for good.
pub async fn setup_completed(conn: &mut AnyConnection) -> Result<bool, DbError> {
    let row = sqlx::query("SELECT COUNT(*) FROM setup_state").fetch_one(&mut *conn).await?;
    Ok(row.try_get::<i64, _>(0)? > 0)
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
    let row = sqlx::query(
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
    let Some(row) = row else { return Err(InsertOwnerError::LoginTaken) };
    let id: i64 = row.try_get(0).map_err(DbError::from)?;
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
    let row = sqlx::query(&format!("SELECT {OWNER_COLUMNS} FROM owners WHERE login = $1"))
        .bind(login)
        .fetch_optional(&mut *conn)
        .await?;
    Ok(row.as_ref().map(owner_from_row).transpose()?)
}

pub async fn find_by_id(conn: &mut AnyConnection, id: i64) -> Result<Option<OwnerRow>, DbError> {
    let row = sqlx::query(&format!("SELECT {OWNER_COLUMNS} FROM owners WHERE id = $1"))
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?;
    Ok(row.as_ref().map(owner_from_row).transpose()?)
}

pub async fn list(conn: &mut AnyConnection) -> Result<Vec<OwnerRow>, DbError> {
    let rows = sqlx::query(&format!("SELECT {OWNER_COLUMNS} FROM owners ORDER BY id")).fetch_all(&mut *conn).await?;
    Ok(rows.iter().map(owner_from_row).collect::<Result<_, _>>()?)
}

pub async fn count(conn: &mut AnyConnection) -> Result<i64, DbError> {
    let row = sqlx::query("SELECT COUNT(*) FROM owners").fetch_one(&mut *conn).await?;
    Ok(row.try_get(0)?)
}

pub async fn phones_of(conn: &mut AnyConnection, owner_id: i64) -> Result<Vec<String>, DbError> {
    let rows = sqlx::query("SELECT phone FROM owner_phones WHERE owner_id = $1 ORDER BY phone")
        .bind(owner_id)
        .fetch_all(&mut *conn)
        .await?;
    Ok(rows.iter().map(|r| r.try_get::<String, _>(0)).collect::<Result<_, _>>()?)
}

/// Every owner's WhatsApp number (E.164), for notices that go to all of them.
pub async fn all_phones(conn: &mut AnyConnection) -> Result<Vec<String>, DbError> {
    let rows = sqlx::query("SELECT phone FROM owner_phones ORDER BY phone").fetch_all(&mut *conn).await?;
    Ok(rows.iter().map(|r| r.try_get::<String, _>(0)).collect::<Result<_, _>>()?)
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
    let row = sqlx::query("SELECT owner_id FROM owner_phones WHERE phone = $1").bind(format!("+{digits}")).fetch_optional(&mut *conn).await?;
    Ok(row.map(|r| r.try_get(0)).transpose()?)
}
