//! Binding (with port fallback) and serving until SIGINT or SIGTERM.

use std::{io, net::SocketAddr, time::Duration};

use tokio::net::TcpListener;

/// Binds `addr`; when the port is taken and `strict` is false, tries the next two ports.
pub async fn bind_with_fallback(addr: SocketAddr, strict: bool) -> io::Result<TcpListener> {
    let attempts: u16 = if strict || addr.port() == 0 { 1 } else { 3 };
    let mut last_err = None;
    for offset in 0..attempts {
        let mut candidate = addr;
        candidate.set_port(addr.port().saturating_add(offset));
        match TcpListener::bind(candidate).await {
            Ok(listener) => {
                if offset > 0 {
                    tracing::warn!(wanted = %addr, using = %candidate, "port was taken; using the next free one");
                }
                return Ok(listener);
            }
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                tracing::warn!(addr = %candidate, "port in use");
                last_err = Some(e);
            }
            Err(e) => return Err(e),
        }
    }
    Err(last_err.unwrap_or_else(|| io::Error::new(io::ErrorKind::AddrInUse, "no port available")))
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut sig) => {
                sig.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
    tracing::info!("shutdown signal received; finishing open requests");
}

static SHUTDOWN: std::sync::OnceLock<tokio::sync::watch::Receiver<bool>> = std::sync::OnceLock::new();

/// A watch that turns true on SIGINT or SIGTERM, for everything that must stop together.
pub fn shutdown_watch() -> tokio::sync::watch::Receiver<bool> {
    SHUTDOWN
        .get_or_init(|| {
            let (tx, rx) = tokio::sync::watch::channel(false);
            tokio::spawn(async move {
                shutdown_signal().await;
                let _ = tx.send(true);
            });
            rx
        })
        .clone()
}

/// The process's shutdown watch, if serving has started (long-lived responses end on it).
pub fn shutdown_requested() -> Option<tokio::sync::watch::Receiver<bool>> {
    SHUTDOWN.get().cloned()
}

/// Serves `router` on `listener` until `shutdown` turns true, then waits up to `grace` for
/// open requests.
pub async fn serve(listener: TcpListener, router: axum::Router, grace: Duration, mut shutdown: tokio::sync::watch::Receiver<bool>) -> io::Result<()> {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let server = axum::serve(listener, router.into_make_service_with_connect_info::<SocketAddr>())
        .with_graceful_shutdown(async move {
            let _ = shutdown.wait_for(|stop| *stop).await;
            let _ = tx.send(());
        });
    let mut server = std::pin::pin!(server.into_future());
    tokio::select! {
        res = &mut server => res,
        () = async {
            let _ = rx.await;
            tokio::time::sleep(grace).await;
        } => {
            tracing::warn!(grace_s = grace.as_secs(), "open requests did not finish in time; stopping");
            Ok(())
        }
    }
}
