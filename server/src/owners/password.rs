//! argon2id hashing on the blocking pool, with a constant-work path for unknown logins.

use std::sync::LazyLock;

use argon2::{Argon2, PasswordHash, PasswordHasher, PasswordVerifier};
use secrecy::{ExposeSecret, SecretString};

/// argon2id needs about 19 MiB and a core's worth of work per call; at most this many run at
/// once, so a burst of logins queues instead of exhausting memory.
static HASHING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(4);

/// Verified against when the login does not exist, so both paths cost the same.
static DUMMY_HASH: LazyLock<Option<String>> =
    LazyLock::new(|| Argon2::default().hash_password(b"gatehouse-dummy-password").ok().map(|h| h.to_string()));

pub async fn hash_password(password: SecretString) -> Result<String, String> {
    let _permit = HASHING.acquire().await.map_err(|e| e.to_string())?;
    tokio::task::spawn_blocking(move || {
        Argon2::default().hash_password(password.expose_secret().as_bytes()).map(|h| h.to_string()).map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| e.to_string())?
}

/// True only when `hash` is present and matches.
pub async fn verify_password(password: SecretString, hash: Option<String>) -> bool {
    let Ok(_permit) = HASHING.acquire().await else { return false };
    tokio::task::spawn_blocking(move || {
        let known = hash.is_some();
        let Some(candidate) = hash.or_else(|| DUMMY_HASH.clone()) else { return false };
        let Ok(parsed) = PasswordHash::new(&candidate) else { return false };
        let ok = Argon2::default().verify_password(password.expose_secret().as_bytes(), &parsed).is_ok();
        ok && known
    })
    .await
    .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn hash_round_trip() {
        let hash = hash_password(SecretString::from("correct horse battery")).await.expect("hash");
        assert!(hash.starts_with("$argon2id$"));
        assert!(verify_password(SecretString::from("correct horse battery"), Some(hash.clone())).await);
        assert!(!verify_password(SecretString::from("wrong horse battery"), Some(hash)).await);
        assert!(!verify_password(SecretString::from("gatehouse-dummy-password"), None).await);
    }
}
