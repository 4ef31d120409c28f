//! The client's address: the connection's peer, or the address a trusted proxy gives for it,
//! and whether the request came from this machine itself.

use std::net::{IpAddr, SocketAddr};

use app::auth::{ClientIp, LocalPeer};
use axum::{
    extract::{ConnectInfo, Request, State},
    http::HeaderMap,
    middleware::Next,
    response::Response,
};

use crate::{
    config::net::{IpNet, canonical},
    web::state::AppState,
};

/// Puts the client's address into request extensions for the login throttle and the audit: the
/// connection's peer, or, when the peer is one of `server.trusted_proxies`, the address that
/// proxy gives in `server.client_ip_header` (see [`client_addr`]).
pub async fn client_ip(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let server = &state.config.settings.server;
    let peer = req.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip());
    let ip = client_addr(peer, req.headers(), &server.trusted_proxies, &server.client_ip_header);
    let local = is_local(peer, req.headers(), server);
    req.extensions_mut().insert(ClientIp(ip));
    req.extensions_mut().insert(LocalPeer(local));
    next.run(req).await
}

/// Whether a request from `peer` came from this machine itself: a loopback peer that is not a
/// trusted proxy, with none of the headers a proxy adds (`Forwarded`, `X-Forwarded-For`,
/// `X-Real-IP`, or the configured client address header), to a console whose own address
/// (`server.public_url`) is this machine's. A proxy on this machine is a loopback peer for the
/// whole internet, and one left at its defaults adds no header: a console published under
/// another host is never local, whatever the request says.
pub fn is_local(peer: Option<IpAddr>, headers: &HeaderMap, server: &crate::config::ServerSettings) -> bool {
    let forwarded = ["forwarded", "x-forwarded-for", "x-real-ip", server.client_ip_header.as_str()].iter().any(|h| !h.is_empty() && headers.contains_key(*h));
    let published_here = server.published_here();
    let proxy = |ip: IpAddr| server.trusted_proxies.iter().any(|p| p.contains(ip));
    published_here && !forwarded && peer.map(canonical).is_some_and(|ip| ip.is_loopback() && !proxy(ip))
}

/// The client address of a request from `peer`. A proxy header is read only when `peer` is a
/// trusted proxy; in a comma-separated list (X-Forwarded-For) the rightmost address that is not
/// a trusted proxy is the client, since anything left of it came from the client itself. A
/// header that is absent or unreadable leaves the peer.
pub fn client_addr(peer: Option<IpAddr>, headers: &HeaderMap, proxies: &[IpNet], header: &str) -> String {
    let Some(peer) = peer.map(canonical) else { return "unknown".into() };
    let trusted = |ip: IpAddr| proxies.iter().any(|p| p.contains(ip));
    if header.is_empty() || !trusted(peer) {
        return peer.to_string();
    }
    let listed: Vec<&str> = headers.get_all(header).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).map(str::trim).collect();
    let mut client = None;
    for entry in listed.iter().rev() {
        let Some(ip) = parse_forwarded(entry) else { break };
        client = Some(ip);
        if !trusted(ip) {
            break;
        }
    }
    client.unwrap_or(peer).to_string()
}

/// An address as proxies write it: `1.2.3.4`, `1.2.3.4:5678`, `::1` or `[::1]:5678`.
fn parse_forwarded(entry: &str) -> Option<IpAddr> {
    let ip = entry.parse::<IpAddr>().ok().or_else(|| entry.parse::<SocketAddr>().ok().map(|s| s.ip()))?;
    Some(canonical(ip))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|n| n.parse().expect("net")).collect()
    }

    fn headers(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append("x-forwarded-for", v.parse().expect("value"));
        }
        h
    }

    #[test]
    fn the_header_counts_only_from_a_trusted_proxy() {
        let peer = Some("10.0.0.2".parse().expect("ip"));
        let forwarded = headers(&["203.0.113.9"]);
        assert_eq!(client_addr(peer, &forwarded, &[], "x-forwarded-for"), "10.0.0.2", "no proxy trusted by default");
        assert_eq!(client_addr(peer, &forwarded, &nets(&["10.0.0.0/24"]), ""), "10.0.0.2", "no header configured");
        assert_eq!(client_addr(peer, &forwarded, &nets(&["10.9.0.1"]), "x-forwarded-for"), "10.0.0.2", "another proxy is trusted");
        assert_eq!(client_addr(peer, &forwarded, &nets(&["10.0.0.0/24"]), "x-forwarded-for"), "203.0.113.9");
        assert_eq!(client_addr(Some("::ffff:10.0.0.2".parse().expect("ip")), &forwarded, &nets(&["10.0.0.2"]), "x-forwarded-for"), "203.0.113.9");
    }

    #[test]
    fn the_rightmost_untrusted_address_is_the_client() {
        let peer = Some("10.0.0.2".parse().expect("ip"));
        let proxies = nets(&["10.0.0.0/24"]);
        // A client can prepend anything; only what the proxies appended counts.
        assert_eq!(client_addr(peer, &headers(&["1.1.1.1, 203.0.113.9, 10.0.0.3"]), &proxies, "x-forwarded-for"), "203.0.113.9");
        assert_eq!(client_addr(peer, &headers(&["1.1.1.1", "203.0.113.9:4711"]), &proxies, "x-forwarded-for"), "203.0.113.9");
        assert_eq!(client_addr(peer, &headers(&["[2001:db8::5]:443"]), &proxies, "x-forwarded-for"), "2001:db8::5");
        assert_eq!(client_addr(peer, &headers(&["not an address"]), &proxies, "x-forwarded-for"), "10.0.0.2", "unreadable: the peer");
        assert_eq!(client_addr(peer, &HeaderMap::new(), &proxies, "x-forwarded-for"), "10.0.0.2", "absent: the peer");
        assert_eq!(client_addr(None, &HeaderMap::new(), &proxies, "x-forwarded-for"), "unknown");
    }
}
