//! The console's compiled assets under `/pkg`: scripts/build writes them under content-hashed
//! names (`gatehouse.<hash>.js`, `gatehouse.<hash>.wasm`, with `pkg/hash.txt` naming the hash)
//! and beside each a brotli (`.br`) and a gzip (`.gz`) copy. They are served compressed as the
//! browser accepts, and a hashed name is cached for a year as immutable: a new build has new
//! names, so a repeat visit fetches no wasm at all while the build is the same.

use std::path::{Path, PathBuf};

use axum::{
    Router,
    extract::Request,
    http::{HeaderValue, header},
    middleware::{Next, from_fn},
    response::Response,
};
use tower_http::services::ServeDir;

/// The assets' base name, before the hash.
const BASE: &str = "gatehouse";
/// Hex digits of the content hash scripts/build puts in the names.
const HASH_LEN: usize = 16;

/// The name Leptos links the assets by: `gatehouse.<hash>` when the build hashed them,
/// else `gatehouse` (a folder built without hashing, or none: the console then works as plain
/// server-rendered forms).
pub fn output_name(pkg_dir: &Path) -> String {
    match std::fs::read_to_string(pkg_dir.join("hash.txt")) {
        Ok(text) if is_hash(text.trim()) => format!("{BASE}.{}", text.trim()),
        _ => BASE.to_string(),
    }
}

fn is_hash(text: &str) -> bool {
    text.len() == HASH_LEN && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Whether a request path names a content-hashed asset (`…/gatehouse.<hash>.js|wasm`).
fn is_hashed(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or_default();
    let Some(stem) = name.strip_suffix(".js").or_else(|| name.strip_suffix(".wasm")) else {
        return false;
    };
    stem.strip_prefix(BASE).and_then(|s| s.strip_prefix('.')).is_some_and(is_hash)
}

/// `/pkg`, precompressed, with its caching headers.
pub fn pkg_routes<S: Clone + Send + Sync + 'static>(pkg_dir: PathBuf) -> Router<S> {
    Router::new().nest_service("/pkg", ServeDir::new(pkg_dir).precompressed_br().precompressed_gzip()).layer(from_fn(cache_control))
}

/// A year and immutable for hashed names; revalidate everything else on each use.
async fn cache_control(req: Request, next: Next) -> Response {
    let hashed = is_hashed(req.uri().path());
    let mut res = next.run(req).await;
    if res.status().is_success() || res.status() == axum::http::StatusCode::NOT_MODIFIED {
        let value = if hashed { "public, max-age=31536000, immutable" } else { "no-cache" };
        res.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static(value));
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashed_names_are_recognised() {
        assert!(is_hashed("/pkg/gatehouse.0123456789abcdef.wasm"));
        assert!(is_hashed("/gatehouse.0123456789abcdef.js"));
        assert!(!is_hashed("/pkg/gatehouse.wasm"));
        assert!(!is_hashed("/pkg/gatehouse.0123.wasm"));
        assert!(!is_hashed("/pkg/other.0123456789abcdef.wasm"));
        assert!(!is_hashed("/pkg/gatehouse.0123456789abcdef.css"));
    }

    #[test]
    fn the_output_name_follows_hash_txt() {
        let dir = tempfile::tempdir().expect("dir");
        assert_eq!(output_name(dir.path()), "gatehouse");
        std::fs::write(dir.path().join("hash.txt"), "0123456789abcdef\n").expect("write");
        assert_eq!(output_name(dir.path()), "gatehouse.0123456789abcdef");
        std::fs::write(dir.path().join("hash.txt"), "../../etc\n").expect("write");
        assert_eq!(output_name(dir.path()), "gatehouse", "only a hash is taken");
    }
}
