//! Where the server listens, its database, owner login and logs.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use serde::{Deserialize, Serialize};

use super::duration_str;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSettings {
    /// Address to listen on.
    pub addr: SocketAddr,
    /// The URL owners use to reach the console. Empty: derived from the bound address.
    pub public_url: String,
    /// When false and the port is taken, the next two ports are tried.
    pub strict_port: bool,
    /// Folder holding the compiled console assets (`pkg/gatehouse.js`, `pkg/gatehouse.wasm`).
    pub site_root: PathBuf,
    /// How long graceful shutdown waits for open requests.
    #[serde(with = "duration_str")]
    pub shutdown_grace: Duration,
    /// Refuse to start (exit code 1) without a key for the configured model provider, instead
    /// of running in degraded mode. `GATEHOUSE_STRICT=true` sets it too.
    pub strict: bool,
    /// Reverse proxies whose `client_ip_header` is believed (addresses or networks). Empty: no
    /// proxy is trusted and the client address is the connection's peer.
    pub trusted_proxies: Vec<super::net::IpNet>,
    /// The header a trusted proxy puts the client's address in (`x-forwarded-for`,
    /// `x-real-ip`, ...). Empty: none.
    #[serde(deserialize_with = "super::net::header_name::deserialize")]
    pub client_ip_header: String,
    /// Serve `/metrics` on this address only (not on `addr`), e.g. a private interface the
    /// Prometheus server reaches. None: on `addr`, beside the console, where without a token
    /// it answers only this machine.
    pub metrics_addr: Option<SocketAddr>,
}

impl ServerSettings {
    /// The console's URL as links sent to owners give it: `public_url`, or else the configured
    /// address (`http://127.0.0.1:3000` by default, which only this machine opens).
    pub fn console_url(&self) -> String {
        self.console_url_at(self.addr)
    }

    /// [`Self::console_url`] for a server bound at `addr` (the next port, when the configured
    /// one was taken): `public_url`, or else `http://{addr}`.
    pub fn console_url_at(&self, addr: SocketAddr) -> String {
        let url = self.public_url.trim_end_matches('/');
        if url.is_empty() { format!("http://{addr}") } else { url.to_string() }
    }

    /// Whether the console listens at `other`: the port of `addr` on an address that overlaps
    /// (the same one, or either listening on all interfaces). Port 0 is whatever is free. A
    /// fallback port is not counted: it is taken only when `addr`'s is, and then the metrics'
    /// bind says so at start.
    pub fn may_listen_at(&self, other: SocketAddr) -> bool {
        let overlaps = self.addr.ip() == other.ip() || self.addr.ip().is_unspecified() || other.ip().is_unspecified();
        overlaps && other.port() != 0 && other.port() == self.addr.port()
    }

    /// Whether the console is published at this machine's own address: `public_url` unset, or
    /// naming `localhost` or a loopback address. A console published under another host is
    /// behind a proxy, and no request to it counts as made on this machine.
    pub fn published_here(&self) -> bool {
        let loopback = |host: Option<url::Host<&str>>| match host {
            Some(url::Host::Domain(name)) => name.eq_ignore_ascii_case("localhost"),
            Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
            Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
            None => false,
        };
        self.public_url.is_empty() || url::Url::parse(&self.public_url).is_ok_and(|u| loopback(u.host()))
    }

    /// What this configuration leaves open, or shut, that its owner should hear of at start
    /// (each a working setup, so not a config problem): an https console behind a proxy that
    /// is not trusted, where every client has the proxy's address and failed logins from anyone
    /// throttle everyone; and `/metrics` on the console's address, which without a token
    /// answers only this machine (`web::ops::console_metrics`), while no request counts as this
    /// machine's (the console is published under another host).
    pub fn exposure_warnings(&self, metrics_token_set: bool) -> Vec<String> {
        let mut out = Vec::new();
        if self.metrics_addr.is_none() && !metrics_token_set && !self.published_here() {
            out.push(format!(
                "/metrics on {} answers no one: server.public_url names another host, so no request counts as this machine's; for a scraper set GATEHOUSE_METRICS_TOKEN, or server.metrics_addr to a private address",
                self.addr
            ));
        }
        if self.public_url.starts_with("https://") && self.trusted_proxies.is_empty() {
            out.push(
                "server.public_url is https, so a TLS proxy is in front, but server.trusted_proxies is empty: every client has the proxy's address, and failed logins from anyone throttle every owner's; set server.trusted_proxies and server.client_ip_header"
                    .into(),
            );
        }
        out
    }

    /// Combinations of the proxy keys that cannot work, as (key, message).
    pub fn proxy_problems(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if self.client_ip_header.is_empty() && !self.trusted_proxies.is_empty() {
            out.push(("server.client_ip_header", "must be set when server.trusted_proxies is: it names the header the proxies fill".into()));
        }
        if !self.client_ip_header.is_empty() && self.trusted_proxies.is_empty() {
            out.push(("server.trusted_proxies", format!("is empty, so server.client_ip_header ({}) is never read", self.client_ip_header)));
        }
        out
    }
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 3000)),
            public_url: String::new(),
            strict_port: false,
            site_root: PathBuf::from("target/site"),
            shutdown_grace: Duration::from_secs(10),
            strict: false,
            trusted_proxies: Vec::new(),
            client_ip_header: String::new(),
            metrics_addr: None,
        }
    }
}

/// The database a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, strum::IntoStaticStr)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum DatabaseKind {
    Sqlite,
    Postgres,
}

impl DatabaseKind {
    /// `sqlite:...` or `postgres://` / `postgresql://`; anything else is unsupported.
    pub fn from_url(url: &str) -> Option<Self> {
        if url.starts_with("sqlite:") {
            Some(Self::Sqlite)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Some(Self::Postgres)
        } else {
            None
        }
    }

    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

impl DatabaseSettings {
    /// Whether `free_bytes` left on the database's disk is below `low_space_mib` (never when
    /// that is 0: the warning is off).
    pub fn is_low_on_space(&self, free_bytes: u64) -> bool {
        self.low_space_mib > 0 && free_bytes < self.low_space_mib.saturating_mul(1 << 20)
    }

    /// Why everything stored would be lost on restart, when it would: an in-memory SQLite
    /// database, or SQLite's temporary database (an empty file name, deleted when closed).
    pub fn storage_warning(&self) -> Option<&'static str> {
        let url = &self.url;
        if DatabaseKind::from_url(url) != Some(DatabaseKind::Sqlite) {
            return None;
        }
        let path = url.trim_start_matches("sqlite:").trim_start_matches("//");
        let path = path.split('?').next().unwrap_or_default();
        if path == ":memory:" || url.contains("mode=memory") {
            return Some("the database is in memory: everything is lost when Gatehouse stops");
        }
        path.is_empty().then_some("the database is SQLite's temporary database: everything is lost when Gatehouse stops")
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseSettings {
    /// `sqlite://path/to/file.db` or `postgres://user@host:port/db`.
    pub url: String,
    pub max_connections: u32,
    #[serde(with = "duration_str")]
    pub busy_timeout: Duration,
    #[serde(with = "duration_str")]
    pub acquire_timeout: Duration,
    /// SQLite only: how often a background task copies the write-ahead log into the database
    /// file (a passive checkpoint), so that no commit waits for that copy; past 16 MiB it lets
    /// the log start over (`db::Checkpointer`). Zero leaves checkpoints to SQLite, run by
    /// whichever commit fills the log.
    #[serde(with = "duration_str")]
    pub checkpoint_interval: Duration,
    /// SQLite only: below this many MiB free on the disk holding the file, every console page
    /// warns the owner, before a full disk stops new messages from being stored. 0: no warning.
    pub low_space_mib: u64,
    /// What owners are told on WhatsApp, at most once a UTC day, while less than
    /// `low_space_mib` is free; `{free}` and `{threshold}` are filled in. Empty: console only.
    pub low_space_notice: String,
    /// SQLite only: whether a commit waits for the disk.
    pub sqlite_synchronous: SqliteSynchronous,
}

/// SQLite's `synchronous` setting in write-ahead-log mode: what a commit survives.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq, strum::IntoStaticStr)]
#[serde(rename_all = "lowercase")]
pub enum SqliteSynchronous {
    /// A commit survives Gatehouse stopping or crashing, not the machine losing power or its
    /// kernel crashing: the last commits before such a stop can be lost (messages already
    /// answered 200, which WhatsApp then never sends again). No commit waits for the disk.
    #[default]
    #[strum(serialize = "NORMAL")]
    Normal,
    /// A commit survives a power loss too: each waits for the log to reach the disk (one fsync
    /// per commit, which the webhook's group commit shares among the posts it holds).
    #[strum(serialize = "FULL")]
    Full,
}

impl Default for DatabaseSettings {
    fn default() -> Self {
        Self {
            url: "sqlite://data/gatehouse.db".into(),
            max_connections: 8,
            busy_timeout: Duration::from_secs(5),
            acquire_timeout: Duration::from_secs(10),
            checkpoint_interval: Duration::from_millis(100),
            low_space_mib: 1024,
            low_space_notice: String::new(),
            sqlite_synchronous: SqliteSynchronous::Normal,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AuthSettings {
    /// A session unused for this long ends; live updates of an open page are not use.
    #[serde(with = "duration_str")]
    pub session_idle_timeout: Duration,
    /// A session ends this long after login, however active.
    #[serde(with = "duration_str")]
    pub session_absolute_timeout: Duration,
    /// Failed logins per account or per IP address before further attempts get 429.
    pub login_max_failures: u32,
    #[serde(with = "duration_str")]
    pub login_failure_window: Duration,
    /// A browser an owner signed in from stays trusted this long after its last login: its
    /// logins are throttled by its own failures only (device cookies).
    #[serde(with = "duration_str")]
    pub trusted_device_lifetime: Duration,
    /// At least 12.
    pub min_password_length: u32,
}

impl AuthSettings {
    pub fn min_password(&self) -> usize {
        usize::try_from(self.min_password_length).unwrap_or(12).max(12)
    }
}

impl Default for AuthSettings {
    fn default() -> Self {
        Self {
            session_idle_timeout: Duration::from_secs(12 * 3600),
            session_absolute_timeout: Duration::from_secs(7 * 24 * 3600),
            login_max_failures: 5,
            login_failure_window: Duration::from_secs(15 * 60),
            trusted_device_lifetime: Duration::from_secs(90 * 24 * 3600),
            min_password_length: 12,
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LogSettings {
    pub format: LogFormat,
    /// A tracing filter such as `info` or `server=debug,info`. `RUST_LOG` wins when set.
    pub filter: String,
}

impl Default for LogSettings {
    fn default() -> Self {
        Self { format: LogFormat::Text, filter: "info,rmcp=warn".into() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_configuration_leaves_open_is_warned_about() {
        let local = ServerSettings::default();
        assert!(local.exposure_warnings(false).is_empty(), "this machine only");
        let public = ServerSettings { addr: "0.0.0.0:3000".parse().expect("addr"), ..ServerSettings::default() };
        assert!(public.exposure_warnings(false).is_empty(), "/metrics answers only this machine without a token");
        let elsewhere = ServerSettings { public_url: "http://bot.example".into(), ..public.clone() };
        let warned = elsewhere.exposure_warnings(false);
        assert!(warned.len() == 1 && warned[0].contains("answers no one") && warned[0].contains("GATEHOUSE_METRICS_TOKEN"), "{warned:?}");
        assert!(elsewhere.exposure_warnings(true).is_empty(), "a token opens it to a scraper");
        let apart = ServerSettings { metrics_addr: Some("10.0.0.2:9100".parse().expect("addr")), ..elsewhere };
        assert!(apart.exposure_warnings(false).is_empty(), "metrics on an address of their own");
        let proxied = ServerSettings { public_url: "https://bot.example".into(), ..ServerSettings::default() };
        assert!(proxied.exposure_warnings(true).iter().any(|w| w.contains("server.trusted_proxies")));
        let trusted = ServerSettings { trusted_proxies: vec!["127.0.0.1".parse().expect("net")], client_ip_header: "x-forwarded-for".into(), ..proxied };
        assert!(trusted.exposure_warnings(true).is_empty());
    }

    /// `/metrics` may not be given an address the console could take: `serve` binds the console
    /// first, and the metrics' bind would then stop the start. `check-config` says so instead.
    #[test]
    fn metrics_cannot_share_the_consoles_port() {
        let at = |s: &str| s.parse::<SocketAddr>().expect("addr");
        let local = ServerSettings::default();
        assert!(local.may_listen_at(at("127.0.0.1:3000")) && local.may_listen_at(at("0.0.0.0:3000")), "the port, on an overlapping address");
        assert!(!local.may_listen_at(at("127.0.0.1:3001")) && !local.may_listen_at(at("10.0.0.2:3000")) && !local.may_listen_at(at("127.0.0.1:0")), "a fallback port, another address, any free port");
        let everywhere = ServerSettings { addr: at("0.0.0.0:9100"), public_url: "https://bot.example".into(), ..ServerSettings::default() };
        assert!(everywhere.may_listen_at(at("10.0.0.2:9100")));
        let err = crate::config::tests::problems_at("[server]\nmetrics_addr = \"127.0.0.1:3000\"\n", &["server.metrics_addr"]);
        assert!(err.to_string().contains("cannot share a port"), "{err}");
    }
}
