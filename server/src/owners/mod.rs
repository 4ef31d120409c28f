//! Owner accounts: creation (first-run setup and CLI), password checks with throttling, and
//! WhatsApp numbers. Passwords are hashed with argon2id and never stored or logged in clear.

pub mod notices;
mod password;
pub mod storage_notice;

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
    /// First-run setup asked from another machine without the setup token ([`setup_allowed`]).
    #[error("setup is answered only on this machine, or with GATEHOUSE_SETUP_TOKEN")]
    SetupNotLocal,
    #[error("login name {0:?} is taken")]
    LoginTaken(String),
    #[error("no owner with login name {0:?}")]
    NotFound(String),
    #[error("password hashing failed: {0}")]
    Hash(String),
    #[error(transparent)]
    Db(#[from] DbError),
}

crate::db::from_sqlx_as_db!(OwnerError);

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

/// The shortest `GATEHOUSE_SETUP_TOKEN` that opens setup from another machine. Setup answers
/// anyone who reaches the webhook's address, as often as they ask: a short token could be
/// guessed online. Twenty random hex characters are 80 bits, out of reach (`openssl rand -hex 16`
/// makes 32).
pub const MIN_SETUP_TOKEN_CHARS: usize = 20;

/// Why the configured setup token opens nothing, for `serve` and `check-config` to say; `None`
/// when it is unset or long enough.
pub fn setup_token_problem(configured: Option<&SecretString>) -> Option<String> {
    let chars = configured?.expose_secret().chars().count();
    (chars < MIN_SETUP_TOKEN_CHARS).then(|| {
        format!(
            "GATEHOUSE_SETUP_TOKEN has {chars} characters, fewer than {MIN_SETUP_TOKEN_CHARS}: it could be guessed, so setup from another machine refuses it (make one with `openssl rand -hex 16`)"
        )
    })
}

/// Whether a first-run setup request may create the first owner: one from this machine itself
/// (`local`), or one carrying the setup token the operator configured (compared in constant
/// time), if that is long enough ([`MIN_SETUP_TOKEN_CHARS`]). Without a usable token, only this
/// machine's requests.
pub fn setup_allowed(local: bool, token: &str, configured: Option<&SecretString>) -> bool {
    use subtle::ConstantTimeEq;
    let usable = configured.filter(|_| setup_token_problem(configured).is_none());
    local || usable.is_some_and(|want| !token.is_empty() && bool::from(token.as_bytes().ct_eq(want.expose_secret().as_bytes())))
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
    /// Signed in; `device` is the token the browser keeps as its device cookie from now on.
    Ok { owner: OwnerRow, device: String },
    Rejected,
    Throttled { retry_after: Duration },
}

/// Throttling rule. Within `window`:
///
/// - an address with `max_failures` failed logins (for any names) is locked until the oldest
///   leaves the window;
/// - once a login name has `max_failures` failures (from anywhere), an address that failed for
///   that name is locked until its own last failure for it leaves the window, while an address
///   that never failed for it is only slowed: it may try once the progressive delay since the
///   name's latest failure has passed (see [`progressive_delay`]).
///
/// So a guesser spread over many addresses gets one try per delay, and the owner, whose address
/// has not failed, is never locked out for longer than that delay, however long the guessing
/// goes on. A browser the owner signed in from within `device_lifetime` (its device cookie) is
/// not held back even that long: its logins for that owner count its own failures only, up to
/// `max_failures` within the window, after which it is throttled like any other.
#[derive(Debug, Clone, Copy)]
pub struct Throttle {
    pub max_failures: u32,
    pub window: Duration,
    pub device_lifetime: Duration,
}

/// The trusted devices kept per owner, the last used: a client that keeps no cookie (a script,
/// a private window) makes a new one at every login.
pub const TRUSTED_DEVICES_KEPT: i64 = 20;

/// A device cookie's token: 256 random bits.
fn new_device_token() -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(rand::random::<[u8; 32]>())
}

/// How a device token is stored: a copy of the database makes no one a trusted device.
fn device_digest(token: &str) -> String {
    db::sha256_hex(token)
}

/// The wait between tries on a login name over its limit, from an address that has not failed
/// for it: a sixteenth of the window (at least a second), doubled for each failure past the
/// limit, at most the window.
pub fn progressive_delay(throttle: Throttle, failures: i64) -> Duration {
    let base = (throttle.window / 16).max(Duration::from_secs(1));
    let excess = u32::try_from(failures.saturating_sub(i64::from(throttle.max_failures))).unwrap_or(u32::MAX).min(16);
    base.saturating_mul(1 << excess).min(throttle.window.max(base))
}

/// Serialises "count failures, then reserve an attempt" so parallel requests cannot all slip
/// under the limit. (Across processes the slack is at most one attempt per process.)
static RESERVE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());


/// When the next attempt may be made under `throttle`, or `None` to go ahead now.
fn next_attempt(c: &audit::FailureCounts, throttle: Throttle, now: i64) -> Option<i64> {
    let (max, window) = (i64::from(throttle.max_failures), db::duration_ms(throttle.window));
    let mut until = None;
    if c.by_ip >= max {
        until = c.oldest_ip_at.map(|t| t + window);
    }
    if c.by_login >= max {
        let login_until = if c.by_pair > 0 {
            c.newest_pair_at.map(|t| t + window)
        } else {
            c.newest_login_at.map(|t| t + db::duration_ms(progressive_delay(throttle, c.by_login)))
        };
        until = until.max(login_until);
    }
    until.filter(|t| *t > now)
}

/// Checks a password. Each attempt is first recorded as a failure (never with the password),
/// then turned into a success if the password matches; an attempt the [`Throttle`] holds back
/// is not checked at all. `device` is the browser's device cookie, if it sent one.
pub async fn login(db: &Db, login: &str, password: SecretString, ip: &str, device: Option<&str>, throttle: Throttle) -> Result<Login, OwnerError> {
    // Audit rows hold a valid login name or a fixed marker, never arbitrary input (which could
    // be a password typed into the wrong field).
    let name = LoginName::parse(login).ok();
    let audit_login = name.as_ref().map_or("<invalid>", LoginName::as_str);
    // The browser's token and its digest, when it is a trusted device of this login's owner.
    let (attempt_id, trusted) = {
        let _serial = RESERVE.lock().await;
        let now = db::now_ms();
        let since = now - db::duration_ms(throttle.window);
        let mut conn = db.pool.acquire().await?;
        let mut trusted = None;
        if let (Some(name), Some(token)) = (&name, device) {
            // Its failures since its last login count, within the window.
            let digest = device_digest(token);
            let device_since = now - db::duration_ms(throttle.device_lifetime);
            let failures = q::trusted_device_failures(&mut conn, &digest, name.as_str(), device_since, since).await?;
            if failures.is_some_and(|n| n < i64::from(throttle.max_failures)) {
                trusted = Some((token, digest));
            }
        }
        if trusted.is_none() {
            let counts = audit::recent_failures(&mut conn, audit_login, ip, since).await?;
            if let Some(until) = next_attempt(&counts, throttle, now) {
                let wait_ms = u64::try_from(until - now).unwrap_or(0).max(1000);
                return Ok(Login::Throttled { retry_after: Duration::from_millis(wait_ms) });
            }
        }
        let device = trusted.as_ref().map(|(_, digest)| digest.as_str());
        let id = audit::record_returning_id(&mut conn, AuditEntry { login: Some(audit_login), ip: Some(ip), event: event::LOGIN_FAILED, ..Default::default() }, device).await?;
        (id, trusted)
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
            // A trusted device keeps its token; any other browser gets a new one, so a cookie
            // that was not trusted (another owner's, a stale one, one made up) never becomes so.
            let (device, digest) = match trusted {
                Some((token, digest)) => (token.to_string(), digest),
                None => {
                    let token = new_device_token();
                    let digest = device_digest(&token);
                    (token, digest)
                }
            };
            let now = db::now_ms();
            let mut tx = db.begin_write().await?;
            audit::mark_success(&mut tx, attempt_id, owner.id, event::LOGIN_OK).await?;
            q::remember_device(&mut tx, &digest, &owner, now, now - db::duration_ms(throttle.device_lifetime), TRUSTED_DEVICES_KEPT).await?;
            tx.commit().await?;
            Ok(Login::Ok { owner, device })
        }
        _ => Ok(Login::Rejected),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setup_is_answered_locally_or_with_the_configured_token() {
        let token = SecretString::from("s3tup-t0ken-for-tests-0");
        assert!(setup_allowed(true, "", None), "this machine needs no token");
        assert!(!setup_allowed(false, "", None), "elsewhere, none configured: refused");
        assert!(!setup_allowed(false, "anything", None), "no token configured: none is right");
        assert!(!setup_allowed(false, "", Some(&token)), "no token given");
        assert!(!setup_allowed(false, "s3tup-t0ken-for-tests-o", Some(&token)), "a wrong token");
        assert!(setup_allowed(false, "s3tup-t0ken-for-tests-0", Some(&token)));
        let short = SecretString::from("s3tup-t0ken-for-test".chars().take(MIN_SETUP_TOKEN_CHARS - 1).collect::<String>());
        assert!(!setup_allowed(false, short.expose_secret(), Some(&short)), "a token too short to be safe opens nothing");
        assert!(setup_token_problem(Some(&short)).is_some_and(|p| p.contains("fewer than 20")));
        assert!(setup_allowed(true, "", Some(&short)), "this machine still needs none");
        assert_eq!((setup_token_problem(Some(&token)), setup_token_problem(None)), (None, None));
    }

    const T: Throttle = Throttle { max_failures: 5, window: Duration::from_secs(900), device_lifetime: Duration::from_secs(86_400) };

    fn counts(by_login: i64, by_ip: i64, by_pair: i64) -> audit::FailureCounts {
        audit::FailureCounts { by_login, by_ip, by_pair, oldest_ip_at: Some(1_000), newest_login_at: Some(2_000), newest_pair_at: Some(1_500) }
    }

    #[test]
    fn a_name_over_its_limit_slows_clean_addresses_and_locks_failed_ones() {
        let now = 2_000;
        assert_eq!(next_attempt(&counts(4, 4, 4), T, now), None, "under every limit");
        assert_eq!(next_attempt(&counts(3, 5, 3), T, now), Some(1_000 + 900_000), "the address is locked");
        assert_eq!(next_attempt(&counts(5, 1, 1), T, now), Some(1_500 + 900_000), "an address that failed for the name is locked");
        let clean = next_attempt(&counts(5, 0, 0), T, now).expect("slowed");
        assert_eq!(clean, 2_000 + 56_250, "a clean address waits the first delay only");
        assert_eq!(next_attempt(&counts(5, 0, 0), T, 2_000 + 56_250), None, "and may try once it has passed");
    }

    #[test]
    fn the_delay_grows_with_each_failure_up_to_the_window() {
        let delays: Vec<u64> = (5..12).map(|n| progressive_delay(T, n).as_secs()).collect();
        assert_eq!(delays, vec![56, 112, 225, 450, 900, 900, 900]);
        let tiny = Throttle { max_failures: 1, window: Duration::from_secs(2), device_lifetime: Duration::from_secs(86_400) };
        assert_eq!(progressive_delay(tiny, 1), Duration::from_secs(1));
        assert_eq!(progressive_delay(tiny, 40), Duration::from_secs(2));
    }
}
