//! Which network addresses a fetch may reach. Everything that is not plainly public is refused:
//! loopback, private, link-local (and so cloud metadata at 169.254.169.254), CGNAT, multicast,
//! unspecified, reserved and documentation ranges, in IPv4, IPv6 and IPv4-mapped/compatible,
//! SIIT-translated, NAT64 (well-known and local-use) and Teredo forms. Decimal, octal and hex IPv4 spellings are normalised by the URL parser before
//! this check sees them.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why an address is refused, or `None` when it is public.
pub fn forbidden(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => forbidden_v4(v4),
        IpAddr::V6(v6) => forbidden_v6(v6),
    }
}

fn in_v4(ip: Ipv4Addr, net: [u8; 4], prefix: u32) -> bool {
    let mask = if prefix == 0 { 0 } else { u32::MAX << (32 - prefix) };
    (u32::from(ip) & mask) == (u32::from(Ipv4Addr::from(net)) & mask)
}

fn forbidden_v4(ip: Ipv4Addr) -> Option<&'static str> {
    const RANGES: [([u8; 4], u32, &str); 16] = [
        ([0, 0, 0, 0], 8, "unspecified"),
        ([10, 0, 0, 0], 8, "private"),
        ([100, 64, 0, 0], 10, "carrier-grade NAT"),
        ([127, 0, 0, 0], 8, "loopback"),
        ([169, 254, 0, 0], 16, "link-local (cloud metadata)"),
        ([172, 16, 0, 0], 12, "private"),
        ([192, 0, 0, 0], 24, "IETF protocol assignments"),
        ([192, 0, 2, 0], 24, "documentation"),
        ([192, 88, 99, 0], 24, "6to4 relay"),
        ([192, 168, 0, 0], 16, "private"),
        ([198, 18, 0, 0], 15, "benchmarking"),
        ([198, 51, 100, 0], 24, "documentation"),
        ([203, 0, 113, 0], 24, "documentation"),
        ([224, 0, 0, 0], 4, "multicast"),
        ([240, 0, 0, 0], 4, "reserved"),
        ([255, 255, 255, 255], 32, "broadcast"),
    ];
    RANGES.iter().find(|(net, prefix, _)| in_v4(ip, *net, *prefix)).map(|(_, _, why)| *why)
}

fn forbidden_v6(ip: Ipv6Addr) -> Option<&'static str> {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return forbidden_v4(v4);
    }
    let seg = ip.segments();
    if ip.is_unspecified() {
        return Some("unspecified");
    }
    if ip.is_loopback() {
        return Some("loopback");
    }
    // IPv4-compatible (deprecated) ::a.b.c.d and NAT64 64:ff9b::a.b.c.d carry an IPv4 address.
    let embedded = Ipv4Addr::new((seg[6] >> 8) as u8, seg[6] as u8, (seg[7] >> 8) as u8, seg[7] as u8);
    if seg[..6] == [0, 0, 0, 0, 0, 0] {
        return forbidden_v4(embedded).or(Some("IPv4-compatible (deprecated)"));
    }
    if seg[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return forbidden_v4(embedded);
    }
    // SIIT's IPv4-translated ::ffff:0:a.b.c.d reaches an IPv4 host through a translator.
    if seg[..6] == [0, 0, 0, 0, 0xffff, 0] {
        return Some("IPv4-translated (SIIT)");
    }
    // RFC 8215 local-use NAT64 64:ff9b:1::/48: the operator's own translator, which places the
    // IPv4 address where its prefix length says; none of it is a public destination.
    if seg[..3] == [0x64, 0xff9b, 1] {
        return Some("local-use NAT64");
    }
    // Teredo 2001::/32 tunnels to an (obscured) IPv4 address; 100::/64 discards.
    if seg[..2] == [0x2001, 0] {
        return Some("Teredo tunnel");
    }
    if seg[..4] == [0x100, 0, 0, 0] {
        return Some("discard-only");
    }
    let first = seg[0];
    if first & 0xffc0 == 0xfe80 {
        return Some("link-local");
    }
    if first & 0xffc0 == 0xfec0 {
        return Some("site-local");
    }
    if first & 0xfe00 == 0xfc00 {
        return Some("unique local (includes cloud metadata fd00:ec2::254)");
    }
    if first & 0xff00 == 0xff00 {
        return Some("multicast");
    }
    if first == 0x2001 && seg[1] == 0x0db8 {
        return Some("documentation");
    }
    // 6to4 2002::/16 embeds an IPv4 address in the next 32 bits.
    if first == 0x2002 {
        let v4 = Ipv4Addr::new((seg[1] >> 8) as u8, seg[1] as u8, (seg[2] >> 8) as u8, seg[2] as u8);
        return forbidden_v4(v4);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host_ip(url: &str) -> IpAddr {
        match url::Url::parse(url).expect("url").host().expect("host") {
            url::Host::Ipv4(v4) => IpAddr::V4(v4),
            url::Host::Ipv6(v6) => IpAddr::V6(v6),
            url::Host::Domain(d) => panic!("{url} parsed as domain {d}"),
        }
    }

    #[test]
    fn refuses_every_non_public_range() {
        for ip in [
            "0.0.0.0", "10.1.2.3", "100.64.0.1", "100.100.100.200", "127.0.0.1", "127.255.255.254", "169.254.169.254", "172.16.0.1",
            "172.31.255.255", "192.168.1.1", "192.0.0.8", "198.18.0.1", "224.0.0.1", "239.255.255.250", "240.0.0.1", "255.255.255.255",
            "::", "::1", "fe80::1", "fc00::1", "fd00:ec2::254", "ff02::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1", "::ffff:169.254.169.254",
            "::127.0.0.1", "64:ff9b::10.0.0.1", "2002:7f00:1::", "2001:db8::1", "fec0::1",
            // Local-use NAT64 (any embedding), SIIT-translated (even of a public address), Teredo, discard.
            "64:ff9b:1::a00:1", "64:ff9b:1:a00:1::", "64:ff9b:1:ffff::808:808", "::ffff:0:7f00:1", "::ffff:0:a9fe:a9fe", "::ffff:0:808:808",
            "2001::1", "2001:0:4136:e378:8000:63bf:3fff:fdd2", "100::1",
        ] {
            let parsed: IpAddr = ip.parse().expect("ip");
            assert!(forbidden(parsed).is_some(), "{ip} must be refused");
        }
    }

    #[test]
    fn allows_public_addresses() {
        for ip in ["1.1.1.1", "8.8.8.8", "93.184.216.34", "172.32.0.1", "100.128.0.1", "2606:4700:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808"] {
            let parsed: IpAddr = ip.parse().expect("ip");
            assert!(forbidden(parsed).is_none(), "{ip} is public: {:?}", forbidden(parsed));
        }
    }

    #[test]
    fn other_spellings_of_loopback_and_metadata_are_caught() {
        for url in [
            "http://2130706433/",
            "http://0177.0.0.1/",
            "http://0x7f.0.0.1/",
            "http://0x7f000001/",
            "http://127.1/",
            "http://0/",
            "http://[::ffff:7f00:1]/",
            "http://[0:0:0:0:0:ffff:127.0.0.1]/",
            "http://2852039166/",
            "http://0xa9.0xfe.0xa9.0xfe/",
            "http://[::ffff:a9fe:a9fe]/",
        ] {
            assert!(forbidden(host_ip(url)).is_some(), "{url} must be refused");
        }
    }
}
