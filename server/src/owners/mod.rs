//! Owner accounts: creation (first-run setup and CLI), password checks with throttling, and
//! WhatsApp numbers. Passwords are hashed with argon2id and never stored or logged in clear.

mod password;

use std::time::Duration;

use app::domain::{LoginName, PhoneNumber, parse_display_name};
use secrecy::{ExposeSecret, SecretString};

pub use password::{hash_password, verify_password};

use crate::db::{
    self, Db, DbError,
    audit::{self, AuditEntry, event},
    owners::{self as q, InsertOwnerError, OwnerRow},
};

#[derive(Debug, thiserror::Error)]
pub enum OwnerError {
    #[error("{0}")]
    Invalid(String),
    #[error("setup is closed: an owner already exists")]
    SetupClosed,
    #[error("login name {0:?} is taken")]
    LoginTaken(String),
    #[error("no owner with login name {0:?}")]
    NotFound(String),
    #[error("password hashing failed: {0}")]
    Hash(String),
    #[error(transparent)]
    Db(#[from] DbError),
}

impl From<sqlx::Error> for OwnerError {
    fn from(e: sqlx::Error) -> Self {
        Self::Db(e.into())
    }
}

impl From<InsertOwnerError> for OwnerError {
    fn from(e: InsertOwnerError) -> Self {
        match e {
            InsertOwnerError::LoginTaken => Self::Invalid("That login name is taken.".into()),
            InsertOwnerError::PhoneTaken(p) => Self::Invalid(format!("{p} already belongs to another owner.")),
            InsertOwnerError::Db(e) => Self::Db(e),
        }
    }
}

/// A validated new owner.
#[derive(Debug)]
pub struct ValidOwner {
    pub display_name: String,
    pub login: LoginName,
    pub password: SecretString,
    pub phones: Vec<PhoneNumber>,
}

impl ValidOwner {
    pub fn parse(display_name: &str, login: &str, password: SecretString, phones: &str, min_password: usize) -> Result<Self, OwnerError> {
        let display_name = parse_display_name(display_name).map_err(OwnerError::Invalid)?;
        let login = LoginName::parse(login).map_err(OwnerError::Invalid)?;
        check_password(&password, min_password)?;
        let phones = PhoneNumber::parse_list(phones).map_err(OwnerError::Invalid)?;
        Ok(Self { display_name, login, password, phones })
    }
}

pub fn check_password(password: &SecretString, min: usize) -> Result<(), OwnerError> {
    if password.expose_secret().chars().count() < min {
        return Err(OwnerError::Invalid(format!("The password must have at least {min} characters.")));
    }
    Ok(())
}

fn phone_strings(phones: &[PhoneNumber]) -> Vec<String> {
    phones.iter().map(|p| p.to_string()).collect()
}

/// Creates the first owner and closes setup, atomically. A racing second request gets
/// [`OwnerError::SetupClosed`] and leaves nothing behind.
pub async fn create_first_owner(db: &Db, owner: ValidOwner, ip: &str) -> Result<OwnerRow, OwnerError> {
    {
        let mut conn = db.pool.acquire().await?;
        if q::setup_completed(&mut conn).await? {
            return Err(OwnerError::SetupClosed);
        }
    }
    let hash = hash_password(owner.password.clone()).await.map_err(OwnerError::Hash)?;
    let mut tx = db.pool.begin().await?;
    let id = match q::insert_owner(&mut tx, owner.login.as_str(), &owner.display_name, &hash, &phone_strings(&owner.phones)).await {
        Ok(id) => id,
        // A concurrent setup inserted the same login first; the marker decides below anyway.
        Err(InsertOwnerError::LoginTaken) => return Err(OwnerError::SetupClosed),
        Err(e) => return Err(e.into()),
    };
    if !q::claim_setup(&mut tx, id).await? {
        tx.rollback().await?;
        return Err(OwnerError::SetupClosed);
    }
    audit::record(&mut tx, AuditEntry { owner_id: Some(id), login: Some(owner.login.as_str()), ip: Some(ip), event: event::SETUP_COMPLETED, detail: None }).await?;
    let row = q::find_by_id(&mut tx, id).await?.ok_or_else(|| OwnerError::NotFound(owner.login.as_str().into()))?;
    match tx.commit().await {
        Ok(()) => Ok(row),
        // PostgreSQL reports the losing racer's conflict at commit or insert time.
        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Err(OwnerError::SetupClosed),
        Err(e) => Err(e.into()),
    }
}

/// Adds another owner from the CLI. Also closes setup if it was still open.
pub async fn add_owner(db: &Db, owner: ValidOwner) -> Result<OwnerRow, OwnerError> {
    let hash = hash_password(owner.password.clone()).await.map_err(OwnerError::Hash)?;
    let mut tx = db.pool.begin().await?;
    let id = match q::insert_owner(&mut tx, owner.login.as_str(), &owner.display_name, &hash, &phone_strings(&owner.phones)).await {
        Err(InsertOwnerError::LoginTaken) => return Err(OwnerError::LoginTaken(owner.login.as_str().into())),
        other => other?,
    };
    q::claim_setup(&mut tx, id).await?;
    audit::record(&mut tx, AuditEntry { owner_id: Some(id), login: Some(owner.login.as_str()), ip: Some("cli"), event: event::OWNER_ADDED, detail: None }).await?;
    let row = q::find_by_id(&mut tx, id).await?.ok_or_else(|| OwnerError::NotFound(owner.login.as_str().into()))?;
    tx.commit().await?;
    Ok(row)
}

/// Sets a new password and ends every session of that owner.
pub async fn reset_password(db: &Db, login: &str, password: SecretString, min_password: usize) -> Result<(), OwnerError> {
    check_password(&password, min_password)?;
    let login = LoginName::parse(login).map_err(OwnerError::Invalid)?;
    let hash = hash_password(password).await.map_err(OwnerError::Hash)?;
    let mut tx = db.pool.begin().await?;
    let owner = q::find_by_login(&mut tx, login.as_str()).await?.ok_or_else(|| OwnerError::NotFound(login.as_str().into()))?;
    q::set_password(&mut tx, owner.id, &hash).await?;
    audit::record(&mut tx, AuditEntry { owner_id: Some(owner.id), login: Some(login.as_str()), ip: Some("cli"), event: event::PASSWORD_RESET, detail: None }).await?;
    tx.commit().await?;
    Ok(())
}

pub async fn update_phones(db: &Db, owner_id: i64, phones: &str, ip: &str) -> Result<Vec<String>, OwnerError> {
    let phones = phone_strings(&PhoneNumber::parse_list(phones).map_err(OwnerError::Invalid)?);
    let mut tx = db.pool.begin().await?;
    q::replace_phones(&mut tx, owner_id, &phones).await?;
    audit::record(&mut tx, AuditEntry { owner_id: Some(owner_id), ip: Some(ip), event: event::PHONES_UPDATED, detail: Some(serde_json::json!({ "count": phones.len() })), ..Default::default() }).await?;
    tx.commit().await?;
    Ok(phones)
}

#[derive(Debug, Clone)]
pub enum Login {
    Ok(OwnerRow),
    Rejected,
    Throttled { retry_after: Duration },
}

/// Throttling rule: `max_failures` failed logins for one login name, or from one address,
/// within `window` lock further attempts out until the oldest failure leaves the window.
#[derive(Debug, Clone, Copy)]
pub struct Throttle {
    pub max_failures: u32,
    pub window: Duration,
}

/// Checks a password. Failures are recorded (never the password) and counted per login name
/// and per address; past the limit the password is not even checked.
pub async fn login(db: &Db, login: &str, password: SecretString, ip: &str, throttle: Throttle) -> Result<Login, OwnerError> {
    let login = login.trim().to_lowercase();
    let now = db::now_ms();
    let window_ms = i64::try_from(throttle.window.as_millis()).unwrap_or(i64::MAX);
    let mut conn = db.pool.acquire().await?;
    let counts = audit::recent_failures(&mut conn, &login, ip, now - window_ms).await?;
    let max = i64::from(throttle.max_failures);
    if counts.by_login >= max || counts.by_ip >= max {
        let oldest = [(counts.by_login >= max).then_some(counts.oldest_login_at).flatten(), (counts.by_ip >= max).then_some(counts.oldest_ip_at).flatten()]
            .into_iter()
            .flatten()
            .max()
            .unwrap_or(now);
        let wait_ms = (oldest + window_ms - now).max(1000);
        audit::record(&mut conn, AuditEntry { login: Some(&login), ip: Some(ip), event: event::LOGIN_THROTTLED, ..Default::default() }).await?;
        return Ok(Login::Throttled { retry_after: Duration::from_millis(u64::try_from(wait_ms).unwrap_or(1000)).max(Duration::from_secs(1)) });
    }
    let owner = q::find_by_login(&mut conn, &login).await?;
    drop(conn);
    let hash = owner.as_ref().map(|o| o.password_hash.clone());
    let ok = verify_password(password, hash).await;
    let mut conn = db.pool.acquire().await?;
    match owner {
        Some(owner) if ok => {
            audit::record(&mut conn, AuditEntry { owner_id: Some(owner.id), login: Some(&login), ip: Some(ip), event: event::LOGIN_OK, ..Default::default() }).await?;
            Ok(Login::Ok(owner))
        }
        _ => {
            audit::record(&mut conn, AuditEntry { login: Some(&login), ip: Some(ip), event: event::LOGIN_FAILED, ..Default::default() }).await?;
            Ok(Login::Rejected)
        }
    }
}
