//! Encryption of OAuth secrets at rest: XChaCha20-Poly1305 with a key from the environment
//! ([`TOKEN_KEY_VAR`]), a random 24-byte nonce per value, the server id as associated data (a
//! sealed value copied to another server's row does not open). Stored as hex of nonce and
//! ciphertext.

use chacha20poly1305::{
    Key, XChaCha20Poly1305, XNonce,
    aead::{Aead, KeyInit, Payload},
};

use crate::tools::mcp::config::TOKEN_KEY_VAR;

/// The key that seals and opens tokens. Its `Debug` shows nothing.
#[derive(Clone)]
pub struct Sealer(XChaCha20Poly1305);

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sealer([REDACTED])")
    }
}

/// Why a value could not be sealed or opened; the message names no secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    #[error("MCP_TOKEN_KEY_MISSING: set {TOKEN_KEY_VAR} (64 hex digits) to use OAuth MCP servers")]
    Missing,
    #[error("MCP_TOKEN_KEY_INVALID: {TOKEN_KEY_VAR} must be 64 hex digits (32 bytes), for example from `openssl rand -hex 32`")]
    Invalid,
    /// Wrong key (it changed since the value was sealed), or the value was altered.
    #[error("MCP_TOKEN_UNREADABLE: the stored login cannot be opened with this process's {TOKEN_KEY_VAR} (not the key it was sealed with?); give this process that key, or log in again")]
    Unreadable,
}

impl SealError {
    /// Every key problem's stable code (each message's prefix).
    pub const CODES: [&str; 3] = ["MCP_TOKEN_KEY_MISSING", "MCP_TOKEN_KEY_INVALID", "MCP_TOKEN_UNREADABLE"];

    pub fn code(&self) -> &'static str {
        match self {
            Self::Missing => Self::CODES[0],
            Self::Invalid => Self::CODES[1],
            Self::Unreadable => Self::CODES[2],
        }
    }

    /// Whether an error's text is this process's token key failing, wherever it surfaced (the
    /// token source, or a session whose token request it failed): only this process is stuck.
    pub fn is_in(error: &str) -> bool {
        Self::CODES.iter().any(|code| error.contains(code))
    }
}

impl Sealer {
    /// From the key's hex text (the environment variable's value).
    pub fn from_hex(hex_key: Option<&str>) -> Result<Self, SealError> {
        let text = hex_key.ok_or(SealError::Missing)?;
        let bytes = hex::decode(text.trim()).map_err(|_| SealError::Invalid)?;
        if bytes.len() != 32 {
            return Err(SealError::Invalid);
        }
        Ok(Self(XChaCha20Poly1305::new(Key::from_slice(&bytes))))
    }

    pub fn seal(&self, server: &str, plain: &str) -> String {
        let nonce_bytes: [u8; 24] = rand::random();
        let nonce = XNonce::from_slice(&nonce_bytes);
        // Encryption with a valid key and nonce cannot fail for inputs this size.
        let sealed = self.0.encrypt(nonce, Payload { msg: plain.as_bytes(), aad: server.as_bytes() }).unwrap_or_default();
        let mut out = hex::encode(nonce_bytes);
        out.push_str(&hex::encode(sealed));
        out
    }

    pub fn open(&self, server: &str, sealed: &str) -> Result<String, SealError> {
        let bytes = hex::decode(sealed).map_err(|_| SealError::Unreadable)?;
        if bytes.len() < 24 + 16 {
            return Err(SealError::Unreadable);
        }
        let (nonce, body) = bytes.split_at(24);
        let plain = self.0.decrypt(XNonce::from_slice(nonce), Payload { msg: body, aad: server.as_bytes() }).map_err(|_| SealError::Unreadable)?;
        String::from_utf8(plain).map_err(|_| SealError::Unreadable)
    }
}

#[cfg(test)]
mod tests {
    use super::{SealError, Sealer};

    const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    #[test]
    fn sealed_values_open_only_with_the_key_and_the_server() {
        let sealer = Sealer::from_hex(Some(KEY)).expect("key");
        let sealed = sealer.seal("crm", "access-token-value");
        assert!(!sealed.contains("access-token-value") && !sealed.contains(&hex::encode("access-token-value")));
        assert_ne!(sealed, sealer.seal("crm", "access-token-value"), "a fresh nonce each time");
        assert_eq!(sealer.open("crm", &sealed).as_deref(), Ok("access-token-value"));
        assert_eq!(sealer.open("docs", &sealed), Err(SealError::Unreadable), "bound to its server");
        let other = Sealer::from_hex(Some(&KEY.replace("00", "ff"))).expect("key");
        assert_eq!(other.open("crm", &sealed), Err(SealError::Unreadable));
        assert_eq!(Sealer::from_hex(None).err(), Some(SealError::Missing));
        assert_eq!(Sealer::from_hex(Some("abc")).err(), Some(SealError::Invalid));
        assert!(!format!("{sealer:?}").contains(KEY));
    }
}
