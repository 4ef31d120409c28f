//! Host lists for `web_fetch` (`allowed_hosts`, `denied_hosts`, the connectors' hosts), matched
//! the way a URL names a host rather than as strings: names are compared lowercase without a
//! trailing dot (`example.com.` is `example.com`), a port in an entry limits it to that port, and
//! addresses are compared as addresses (`::ffff:10.0.0.5` is `10.0.0.5`). An entry may also be a
//! network in CIDR form (`10.20.0.0/16`).

use std::net::IpAddr;

/// One entry of a host list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostEntry {
    Name { name: String, port: Option<u16> },
    Net { addr: IpAddr, prefix: u8, port: Option<u16> },
}

/// An address in the form comparisons use: IPv4-mapped IPv6 becomes IPv4.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// A host name as compared: lowercase, without the trailing dot of a fully qualified name.
pub fn normal_name(name: &str) -> String {
    name.trim().trim_end_matches('.').to_ascii_lowercase()
}

fn in_net(ip: IpAddr, net: IpAddr, prefix: u8) -> bool {
    match (canonical(ip), canonical(net)) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let p = u32::from(prefix.min(32));
            let mask = if p == 0 { 0 } else { u32::MAX << (32 - p) };
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let p = u32::from(prefix.min(128));
            let mask = if p == 0 { 0 } else { u128::MAX << (128 - p) };
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

impl HostEntry {
    /// Reads `host`, `host:port`, an address (`10.0.0.5`, `::1`, `[::1]:8080`) or a network
    /// (`10.0.0.0/8`). Names go through the URL parser, so an internationalised name matches
    /// the form a URL carries.
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        if let Some((net, prefix)) = text.split_once('/') {
            let addr: IpAddr = net.trim_start_matches('[').trim_end_matches(']').parse().ok()?;
            let max = if addr.is_ipv4() { 32 } else { 128 };
            let prefix: u8 = prefix.parse().ok().filter(|p| *p <= max)?;
            return Some(Self::Net { addr: canonical(addr), prefix, port: None });
        }
        if let Ok(addr) = text.parse::<IpAddr>() {
            return Some(Self::Net { addr: canonical(addr), prefix: if addr.is_ipv4() { 32 } else { 128 }, port: None });
        }
        let url = url::Url::parse(&format!("http://{text}/")).ok()?;
        let port = url.port();
        Some(match url.host()? {
            url::Host::Domain(d) => Self::Name { name: normal_name(d), port },
            url::Host::Ipv4(v4) => Self::Net { addr: IpAddr::V4(v4), prefix: 32, port },
            url::Host::Ipv6(v6) => Self::Net { addr: canonical(IpAddr::V6(v6)), prefix: 128, port },
        })
    }

    fn port_matches(&self, port: u16) -> bool {
        match self {
            Self::Name { port: p, .. } | Self::Net { port: p, .. } => p.is_none_or(|p| p == port),
        }
    }
}

/// The host a URL names, in comparable form, with its port (or the scheme's default).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Name(String),
    Addr(IpAddr),
}

pub fn target(url: &url::Url) -> Option<(Target, u16)> {
    let port = url.port_or_known_default()?;
    let host = match url.host()? {
        url::Host::Domain(d) => Target::Name(normal_name(d)),
        url::Host::Ipv4(v4) => Target::Addr(IpAddr::V4(v4)),
        url::Host::Ipv6(v6) => Target::Addr(canonical(IpAddr::V6(v6))),
    };
    Some((host, port))
}

/// A parsed host list. Entries that are not hosts, addresses or networks are dropped.
#[derive(Debug, Clone, Default)]
pub struct HostRules {
    entries: Vec<HostEntry>,
}

impl HostRules {
    pub fn new<S: AsRef<str>>(list: &[S]) -> Self {
        Self { entries: list.iter().filter_map(|s| HostEntry::parse(s.as_ref())).collect() }
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entry for this host and port, if any. With `subdomains`, a name entry also covers
    /// every name below it (`example.com` covers `www.example.com`).
    pub fn find(&self, host: &Target, port: u16, subdomains: bool) -> Option<&HostEntry> {
        self.entries.iter().find(|e| {
            e.port_matches(port)
                && match (e, host) {
                    (HostEntry::Name { name, .. }, Target::Name(h)) => h == name || (subdomains && h.strip_suffix(name.as_str()).is_some_and(|rest| rest.ends_with('.'))),
                    (HostEntry::Net { addr, prefix, .. }, Target::Addr(ip)) => in_net(*ip, *addr, *prefix),
                    _ => false,
                }
        })
    }

    /// Whether `ip` is one of the listed addresses or inside a listed network (any port).
    pub fn has_addr(&self, ip: IpAddr) -> bool {
        self.entries.iter().any(|e| matches!(e, HostEntry::Net { addr, prefix, .. } if in_net(ip, *addr, *prefix)))
    }

    /// The listed names, without their ports.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().filter_map(|e| if let HostEntry::Name { name, .. } = e { Some(name.as_str()) } else { None })
    }

    /// Names listed without a port (every port of them is covered).
    pub fn any_port_names(&self) -> Vec<String> {
        self.entries.iter().filter_map(|e| if let HostEntry::Name { name, port: None } = e { Some(name.clone()) } else { None }).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(url: &str) -> (Target, u16) {
        target(&url::Url::parse(url).expect("url")).expect("host")
    }

    #[test]
    fn names_match_without_case_trailing_dot_and_with_subdomains_when_asked() {
        let rules = HostRules::new(&["Evil.Example", "intranet:8080", "10.20.0.0/16", "[::1]:9000"]);
        for url in ["http://evil.example/", "http://EVIL.example./x", "https://evil.example:8443/"] {
            let (host, port) = at(url);
            assert!(rules.find(&host, port, false).is_some(), "{url}");
        }
        let (sub, port) = at("http://a.b.evil.example/");
        assert!(rules.find(&sub, port, true).is_some() && rules.find(&sub, port, false).is_none());
        let (not_sub, port) = at("http://notevil.example/");
        assert!(rules.find(&not_sub, port, true).is_none());
        let (intranet, _) = at("http://intranet:8080/");
        assert!(rules.find(&intranet, 8080, false).is_some());
        assert!(rules.find(&intranet, 22, false).is_none(), "a port in the entry limits it to that port");
        for url in ["http://10.20.3.4/", "http://[::ffff:10.20.3.4]/", "http://169083652/"] {
            let (host, port) = at(url);
            assert!(rules.find(&host, port, false).is_some(), "{url}");
        }
        let (v6, _) = at("http://[::1]:9000/");
        assert!(rules.find(&v6, 9000, false).is_some() && rules.find(&v6, 9001, false).is_none());
        assert_eq!(rules.any_port_names(), vec!["evil.example".to_string()]);
    }
}
