//! Secrets come only from these environment variables. They are held as [`SecretString`], whose
//! `Debug` prints `[REDACTED]`, and are reported only as "set" or "unset".

use std::sync::Arc;

use secrecy::SecretString;

pub const ANTHROPIC_API_KEY: &str = "ANTHROPIC_API_KEY";
pub const OPENAI_API_KEY: &str = "OPENAI_API_KEY";
pub const WHATSAPP_ACCESS_TOKEN: &str = "WHATSAPP_ACCESS_TOKEN";
pub const WHATSAPP_APP_SECRET: &str = "WHATSAPP_APP_SECRET";
pub const WHATSAPP_VERIFY_TOKEN: &str = "WHATSAPP_VERIFY_TOKEN";
/// When set, `/metrics` answers only requests with `Authorization: Bearer <token>`, from
/// anywhere; unset, on the console's address it answers only this machine.
pub const GATEHOUSE_METRICS_TOKEN: &str = "GATEHOUSE_METRICS_TOKEN";
/// When set, first-run setup also answers requests from other machines that carry it
/// (`/setup?token=...`); without it, only this machine's own.
pub const GATEHOUSE_SETUP_TOKEN: &str = "GATEHOUSE_SETUP_TOKEN";

/// Every secret variable Gatehouse reads, in display order.
pub const ALL: [&str; 7] =
    [ANTHROPIC_API_KEY, OPENAI_API_KEY, WHATSAPP_ACCESS_TOKEN, WHATSAPP_APP_SECRET, WHATSAPP_VERIFY_TOKEN, GATEHOUSE_METRICS_TOKEN, GATEHOUSE_SETUP_TOKEN];

/// Where secret values are read from: the process environment in production, a map in tests.
/// Built once at start and handed to every part that needs a secret by name (tool secret
/// fields, connector headers, MCP server environments), so no code reads the environment itself.
#[derive(Clone)]
pub struct SecretSource(Arc<Lookup>);

/// Reads a secret's value by its name.
type Lookup = dyn Fn(&str) -> Option<String> + Send + Sync;

impl SecretSource {
    /// The process environment.
    pub fn from_env() -> Self {
        Self(Arc::new(|name: &str| std::env::var(name).ok()))
    }

    pub fn from_fn(lookup: impl Fn(&str) -> Option<String> + Send + Sync + 'static) -> Self {
        Self(Arc::new(lookup))
    }

    /// A source that knows no secret.
    pub fn empty() -> Self {
        Self::from_fn(|_| None)
    }

    /// The value of `name`, without surrounding whitespace (a value pasted from a file often
    /// ends with a newline, and no token or key has whitespace at its ends); an empty or blank
    /// value counts as unset.
    pub fn get(&self, name: &str) -> Option<String> {
        (self.0)(name).map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
    }

    pub fn is_set(&self, name: &str) -> bool {
        self.get(name).is_some()
    }
}

impl Default for SecretSource {
    fn default() -> Self {
        Self::empty()
    }
}

impl std::fmt::Debug for SecretSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretSource([REDACTED])")
    }
}

#[derive(Debug, Clone, Default)]
pub struct Secrets {
    pub anthropic_api_key: Option<SecretString>,
    pub openai_api_key: Option<SecretString>,
    pub whatsapp_access_token: Option<SecretString>,
    pub whatsapp_app_secret: Option<SecretString>,
    pub whatsapp_verify_token: Option<SecretString>,
    pub metrics_token: Option<SecretString>,
    pub setup_token: Option<SecretString>,
    /// Every other secret, by variable name.
    pub source: SecretSource,
}

impl Secrets {
    /// Reads every secret from the process environment. An empty value counts as unset.
    /// Surrounding whitespace is dropped: a value pasted or written by `echo` into an env file
    /// often ends with a newline, which would silently break every webhook signature check
    /// (or every API call), and no token or key has whitespace at its ends.
    pub fn from_env() -> Self {
        Self::from_source(SecretSource::from_env())
    }

    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String> + Send + Sync + 'static) -> Self {
        Self::from_source(SecretSource::from_fn(lookup))
    }

    pub fn from_source(source: SecretSource) -> Self {
        let get = |name: &str| source.get(name).map(SecretString::from);
        Self {
            anthropic_api_key: get(ANTHROPIC_API_KEY),
            openai_api_key: get(OPENAI_API_KEY),
            whatsapp_access_token: get(WHATSAPP_ACCESS_TOKEN),
            whatsapp_app_secret: get(WHATSAPP_APP_SECRET),
            whatsapp_verify_token: get(WHATSAPP_VERIFY_TOKEN),
            metrics_token: get(GATEHOUSE_METRICS_TOKEN),
            setup_token: get(GATEHOUSE_SETUP_TOKEN),
            source: source.clone(),
        }
    }

    pub fn by_name(&self, name: &str) -> Option<&SecretString> {
        match name {
            ANTHROPIC_API_KEY => self.anthropic_api_key.as_ref(),
            OPENAI_API_KEY => self.openai_api_key.as_ref(),
            WHATSAPP_ACCESS_TOKEN => self.whatsapp_access_token.as_ref(),
            WHATSAPP_APP_SECRET => self.whatsapp_app_secret.as_ref(),
            WHATSAPP_VERIFY_TOKEN => self.whatsapp_verify_token.as_ref(),
            GATEHOUSE_METRICS_TOKEN => self.metrics_token.as_ref(),
            GATEHOUSE_SETUP_TOKEN => self.setup_token.as_ref(),
            _ => None,
        }
    }

    /// `(variable, is_set)` for every secret, for `check-config` and the Settings page.
    pub fn presence(&self) -> Vec<(&'static str, bool)> {
        ALL.iter().map(|name| (*name, self.by_name(name).is_some())).collect()
    }
}

/// Whether `name` can name an environment variable: letters, digits and `_`, not starting
/// with a digit.
pub fn is_env_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') && !name.as_bytes()[0].is_ascii_digit()
}

/// What is wrong with `var`, where a config file names the environment variable that holds a
/// secret: not a variable's name (said without repeating it, since a value pasted there is
/// most likely the secret itself), or not set. `None` when it names a set variable.
pub fn secret_var_problem(var: &str, is_set: bool) -> Option<String> {
    if !is_env_name(var) {
        return Some("is not an environment variable name (letters, digits and _): write the variable's name here and put the secret itself in the environment".into());
    }
    (!is_set).then(|| {
        if is_conventional_env_name(var) {
            format!("needs the environment variable {var}, which is not set")
        } else {
            // Lower case may be a token pasted where the name belongs (`ghp_...`): not repeated.
            "needs an environment variable that is not set (its name, not in capitals, is not repeated here: check that it is the variable's name, not the secret)".into()
        }
    })
}

/// Whether `name` is written as environment variables conventionally are (capitals, digits and
/// `_`): one that is not may be a token pasted in its place, and is not repeated in messages
/// or shown in the console.
pub fn is_conventional_env_name(name: &str) -> bool {
    is_env_name(name) && name.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_pasted_where_its_variable_belongs_is_never_repeated() {
        let pasted = "sk_live_51Habc-def.ghi";
        let said = secret_var_problem(pasted, false).expect("refused");
        assert!(!said.contains(pasted) && said.contains("not an environment variable name"), "{said}");
        assert_eq!(secret_var_problem("SHOP_API_KEY", true), None);
        assert!(secret_var_problem("SHOP_API_KEY", false).is_some_and(|s| s.contains("SHOP_API_KEY, which is not set")));
        assert!(!is_env_name("9LIVES") && is_env_name("_X1"));
        let token = "ghp_16C7e42F292c6912E7710c838347Ae178B4a";
        let said = secret_var_problem(token, false).expect("not set");
        assert!(!said.contains(token) && said.contains("not repeated"), "{said}");
    }

    #[test]
    fn debug_output_never_shows_a_secret() {
        let secrets = Secrets::from_lookup(|name| (name == ANTHROPIC_API_KEY || name == WHATSAPP_APP_SECRET).then(|| "sk-very-secret-value".to_string()));
        let shown = format!("{secrets:?} {:#?}", secrets);
        assert!(!shown.contains("sk-very-secret-value"), "{shown}");
        assert_eq!(secrets.presence().iter().filter(|(_, set)| *set).count(), 2);
        assert!(Secrets::from_lookup(|_| Some("  ".into())).presence().iter().all(|(_, set)| !set), "blank counts as unset");
    }

    #[test]
    fn surrounding_whitespace_is_not_part_of_a_secret() {
        use secrecy::ExposeSecret;
        let secrets = Secrets::from_lookup(|name| Some(format!(" \t{name}-value\r\n")));
        for name in ALL {
            assert_eq!(secrets.by_name(name).map(|s| s.expose_secret().to_string()), Some(format!("{name}-value")), "{name}");
        }
    }
}
