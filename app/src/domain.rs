//! Values that cannot hold bad data once parsed. Shared by the console and the engine.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A WhatsApp number in E.164 form: `+`, a non-zero digit, then 6 to 14 more digits.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct PhoneNumber(String);

impl PhoneNumber {
    /// Spaces, dashes, dots and brackets people write are left out, and so is a national trunk
    /// `(0)` written after the country code (`+44 (0)7700 900123`): it is never dialled from
    /// abroad, and WhatsApp sends the number without it.
    pub fn parse(input: &str) -> Result<Self, String> {
        let compact: String = input.replace("(0)", "").chars().filter(|c| !matches!(c, ' ' | '-' | '(' | ')' | '.')).collect();
        let digits = compact.strip_prefix('+').ok_or_else(|| format!("{input:?} must start with + and the country code (E.164 form, such as +15550001111)"))?;
        let valid = (7..=15).contains(&digits.len())
            && digits.chars().all(|c| c.is_ascii_digit())
            && !digits.starts_with('0');
        if valid { Ok(Self(compact)) } else { Err(format!("{input:?} is not a phone number in E.164 form, such as +15550001111")) }
    }

    /// Parses a list separated by commas, semicolons or new lines; blank entries are skipped
    /// and duplicates removed.
    pub fn parse_list(input: &str) -> Result<Vec<Self>, String> {
        let mut out: Vec<Self> = Vec::new();
        for part in input.split([',', ';', '\n']).map(str::trim).filter(|p| !p.is_empty()) {
            let phone = Self::parse(part)?;
            if !out.contains(&phone) {
                out.push(phone);
            }
        }
        Ok(out)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PhoneNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for PhoneNumber {
    type Error = String;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse(&value)
    }
}

impl From<PhoneNumber> for String {
    fn from(value: PhoneNumber) -> Self {
        value.0
    }
}

/// An owner's login name: 2 to 32 characters of lower-case letters, digits, `.`, `_` or `-`,
/// starting with a letter or digit.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LoginName(String);

impl LoginName {
    pub fn parse(input: &str) -> Result<Self, String> {
        let name = input.trim().to_lowercase();
        let ok = (2..=32).contains(&name.len())
            && name.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
            && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-'));
        if ok { Ok(Self(name)) } else { Err("Login name: 2 to 32 letters, digits, '.', '_' or '-'.".into()) }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A display name: 1 to 80 characters after trimming, no control characters.
pub fn parse_display_name(input: &str) -> Result<String, String> {
    let name = input.trim();
    if name.is_empty() || name.chars().count() > 80 || name.chars().any(char::is_control) {
        return Err("Display name: 1 to 80 characters.".into());
    }
    Ok(name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phone_numbers() {
        assert_eq!(PhoneNumber::parse("+1 555 000 1111").map(String::from), Ok("+15550001111".to_string()));
        assert!(PhoneNumber::parse("15550001111").is_err());
        assert!(PhoneNumber::parse("+0123456789").is_err());
        assert!(PhoneNumber::parse("+12").is_err());
        assert!(PhoneNumber::parse("+1555abc1111").is_err());
        assert_eq!(PhoneNumber::parse("+44 (0)7700 900123").map(String::from), Ok("+447700900123".to_string()), "the trunk (0) is not part of the number");
        assert_eq!(PhoneNumber::parse("+44 (0) 20 7946 0958").map(String::from), Ok("+442079460958".to_string()));
        let list = PhoneNumber::parse_list("+15550001111, +447700900123\n+15550001111").expect("list");
        assert_eq!(list.len(), 2);
    }

    #[test]
    fn login_names() {
        assert_eq!(LoginName::parse(" Alice ").map(|l| l.as_str().to_string()), Ok("alice".into()));
        assert!(LoginName::parse("a").is_err());
        assert!(LoginName::parse("-bad").is_err());
        assert!(LoginName::parse("has space").is_err());
    }
}
