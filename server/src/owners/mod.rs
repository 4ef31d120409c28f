//! Owner accounts: creation (first-run setup and CLI), password checks with throttling, and
//! WhatsApp numbers. Passwords are hashed with argon2id and never stored or logged in clear.

pub mod notices;
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
    if setup_completed(db).await? {
        return Err(OwnerError::SetupClosed);
    }
    let hash = hash_password(owner.password.clone()).await.map_err(OwnerError::Hash)?;
    let mut tx = db.begin_write().await?;
    let inserted = q::insert_owner(&mut tx, owner.login.as_str(), &owner.display_name, &hash, &phone_strings(&owner.phones)).await;
    let claimed = match inserted {
        Ok(id) => q::claim_setup(&mut tx, id).await.map(|won| won.then_some(id)).map_err(OwnerError::from),
        Err(e) => Err(e.into()),
    };
    let id = match claimed {
        Ok(Some(id)) => id,
        // Lost the race (the marker was taken), or a racing winner holds the same login or
        // number: either way the answer is that setup is closed.
        other => {
            tx.rollback().await?;
            if setup_completed(db).await? {
                return Err(OwnerError::SetupClosed);
            }
            return Err(other.err().unwrap_or(OwnerError::SetupClosed));
        }
    };
    audit::record(&mut tx, AuditEntry { owner_id: Some(id), login: Some(owner.login.as_str()), ip: Some(ip), event: event::SETUP_COMPLETED, detail: None }).await?;
    let row = q::find_by_id(&mut tx, id).await?.ok_or_else(|| OwnerError::NotFound(owner.login.as_str().into()))?;
    tx.commit().await?;
    Ok(row)
}

pub async fn setup_completed(db: &Db) -> Result<bool, OwnerError> {
    let mut conn = db.pool.acquire().await?;
    Ok(q::setup_completed(&mut conn).await?)
}

/// Adds another owner from the CLI. Also closes setup if it was still open.
pub async fn add_owner(db: &Db, owner: ValidOwner) -> Result<OwnerRow, OwnerError> {
    let hash = hash_password(owner.password.clone()).await.map_err(OwnerError::Hash)?;
    let mut tx = db.begin_write().await?;
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
    let mut tx = db.begin_write().await?;
    let owner = q::find_by_login(&mut tx, login.as_str()).await?.ok_or_else(|| OwnerError::NotFound(login.as_str().into()))?;
    q::set_password(&mut tx, owner.id, &hash).await?;
    audit::record(&mut tx, AuditEntry { owner_id: Some(owner.id), login: Some(login.as_str()), ip: Some("cli"), event: event::PASSWORD_RESET, detail: None }).await?;
    tx.commit().await?;
    Ok(())
}

pub async fn update_phones(db: &Db, owner_id: i64, phones: &str, ip: &str) -> Result<Vec<String>, OwnerError> {
    let phones = phone_strings(&PhoneNumber::parse_list(phones).map_err(OwnerError::Invalid)?);
    let mut tx = db.begin_write().await?;
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

/// Serialises "count failures, then reserve an attempt" so parallel requests cannot all slip
/// under the limit. (Across processes the slack is at most one attempt per process.)
static RESERVE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Checks a password. Each attempt is first recorded as a failure (never with the password),
/// then turned into a success if the password matches; past the limit, for the login name or
/// the address, the password is not checked at all.
pub async fn login(db: &Db, login: &str, password: SecretString, ip: &str, throttle: Throttle) -> Result<Login, OwnerError> {
    // Audit rows hold a valid login name or a fixed marker, never arbitrary input (which could
    // be a password typed into the wrong field).
    let name = LoginName::parse(login).ok();
    let audit_login = name.as_ref().map_or("<invalid>", LoginName::as_str);
    let window_ms = i64::try_from(throttle.window.as_millis()).unwrap_or(i64::MAX);
    let max = i64::from(throttle.max_failures);
    let attempt_id = {
        let _serial = RESERVE.lock().await;
        let now = db::now_ms();
        let mut conn = db.pool.acquire().await?;
        let counts = audit::recent_failures(&mut conn, audit_login, ip, now - window_ms).await?;
        if counts.by_login >= max || counts.by_ip >= max {
            let oldest = [(counts.by_login >= max).then_some(counts.oldest_login_at).flatten(), (counts.by_ip >= max).then_some(counts.oldest_ip_at).flatten()]
                .into_iter()
                .flatten()
                .max()
                .unwrap_or(now);
            let wait_ms = u64::try_from(oldest + window_ms - now).unwrap_or(0).max(1000);
            return Ok(Login::Throttled { retry_after: Duration::from_millis(wait_ms) });
        }
        audit::record_returning_id(&mut conn, AuditEntry { login: Some(audit_login), ip: Some(ip), event: event::LOGIN_FAILED, ..Default::default() }).await?
    };
    let owner = match &name {
        Some(name) => {
            let mut conn = db.pool.acquire().await?;
            q::find_by_login(&mut conn, name.as_str()).await?
        }
        None => None,
    };
    let ok = verify_password(password, owner.as_ref().map(|o| o.password_hash.clone())).await;
    match owner {
        Some(owner) if ok => {
            let mut conn = db.pool.acquire().await?;
            audit::mark_success(&mut conn, attempt_id, owner.id, event::LOGIN_OK).await?;
            Ok(Login::Ok(owner))
        }
        _ => Ok(Login::Rejected),
    }
}
