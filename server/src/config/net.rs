//! Addresses in settings: an IP address or a network in CIDR form, as written in config.

use std::{fmt, net::IpAddr, str::FromStr};

use serde::{Deserialize, Deserializer, Serialize, Serializer, de::Error};

/// An IP address (`10.0.0.7`, `::1`) or a network (`10.0.0.0/8`, `fd00::/8`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpNet {
    addr: IpAddr,
    prefix: u8,
}

/// IPv4-mapped IPv6 (`::ffff:10.0.0.1`, how a dual-stack socket reports an IPv4 peer) as IPv4.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

impl IpNet {
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (canonical(ip), self.addr) {
            (IpAddr::V4(a), IpAddr::V4(n)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.prefix)).unwrap_or(0);
                u32::from(a) & mask == u32::from(n) & mask
            }
            (IpAddr::V6(a), IpAddr::V6(n)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.prefix)).unwrap_or(0);
                u128::from(a) & mask == u128::from(n) & mask
            }
            _ => false,
        }
    }
}

impl FromStr for IpNet {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let bad = || format!("{text:?} is not an IP address or network, such as \"10.0.0.7\" or \"10.0.0.0/8\"");
        let (addr, prefix) = match text.trim().split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (text.trim(), None),
        };
        let addr = canonical(addr.parse::<IpAddr>().map_err(|_| bad())?);
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p.parse::<u8>().ok().filter(|p| *p <= max).ok_or_else(bad)?,
            None => max,
        };
        Ok(Self { addr, prefix })
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let max = if self.addr.is_ipv4() { 32 } else { 128 };
        if self.prefix == max { write!(f, "{}", self.addr) } else { write!(f, "{}/{}", self.addr, self.prefix) }
    }
}

impl Serialize for IpNet {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for IpNet {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(D::Error::custom)
    }
}

/// A request header name, or empty for none; checked when the config loads.
pub(crate) mod header_name {
    use serde::{Deserialize, Deserializer, de::Error};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        let text = String::deserialize(d)?.trim().to_ascii_lowercase();
        if !text.is_empty() && http::HeaderName::from_bytes(text.as_bytes()).is_err() {
            return Err(D::Error::custom(format!("{text:?} is not an HTTP header name, such as \"x-forwarded-for\"")));
        }
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_networks() {
        let net: IpNet = "10.0.0.0/8".parse().expect("net");
        assert!(net.contains("10.200.1.1".parse().expect("ip")) && net.contains("::ffff:10.0.0.1".parse().expect("ip")));
        assert!(!net.contains("11.0.0.1".parse().expect("ip")));
        let one: IpNet = "::ffff:192.168.1.5".parse().expect("mapped");
        assert_eq!(one.to_string(), "192.168.1.5");
        assert!("fd00::/8".parse::<IpNet>().expect("v6").contains("fd12::1".parse().expect("ip")));
        assert!("0.0.0.0/0".parse::<IpNet>().expect("all").contains("8.8.8.8".parse().expect("ip")));
        for bad in ["proxy.local", "10.0.0.0/33", "10.0.0.1/x", ""] {
            assert!(bad.parse::<IpNet>().is_err(), "{bad}");
        }
    }
}
