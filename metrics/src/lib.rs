//! The HTTP listener every client-side component (the controller manager,
//! the scheduler, the node agent) serves: `/metrics`, its Prometheus
//! registry as text, and `/healthz`, which answers `ok` until the
//! component starts stopping.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use skiff_shutdown::Shutdown;

struct Served {
    registry: prometheus::Registry,
    shutdown: Shutdown,
}

/// Serves `registry` at `/metrics`, and `/healthz`, on `addr` until
/// `shutdown`; the address actually bound (for port 0).
pub async fn serve(
    addr: SocketAddr,
    registry: prometheus::Registry,
    shutdown: Shutdown,
) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let served = Arc::new(Served { registry, shutdown: shutdown.clone() });
    let app = axum::Router::new().route("/metrics", get(render)).route("/healthz", get(healthz)).with_state(served);
    let stopped = shutdown.cancelled_owned();
    shutdown.spawn(async move {
        if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(stopped).await {
            tracing::error!(error = %e, "metrics listener failed");
        }
    });
    Ok(bound)
}

/// `registry` in Prometheus' text format, as `/metrics` serves it.
pub fn text(registry: &prometheus::Registry) -> String {
    let mut out = Vec::new();
    if let Err(e) = prometheus::Encoder::encode(&prometheus::TextEncoder::new(), &registry.gather(), &mut out) {
        out.extend_from_slice(format!("# error encoding metrics: {e}\n").as_bytes());
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn render(State(served): State<Arc<Served>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text(&served.registry))
}

async fn healthz(State(served): State<Arc<Served>>) -> impl IntoResponse {
    if served.shutdown.token().is_cancelled() {
        (StatusCode::SERVICE_UNAVAILABLE, "stopping\n")
    } else {
        (StatusCode::OK, "ok\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn metrics_and_healthz_answer_until_shutdown() {
        let registry = prometheus::Registry::new();
        let gauge = prometheus::IntGauge::new("widgets_waiting", "Widgets waiting.").unwrap();
        registry.register(Box::new(gauge.clone())).unwrap();
        gauge.set(7);
        let shutdown = Shutdown::new();
        let addr = serve("127.0.0.1:0".parse().unwrap(), registry, shutdown.clone()).await.unwrap();
        let body = get_body(addr, "/metrics").await;
        assert!(body.contains("widgets_waiting 7"), "{body}");
        assert!(get_body(addr, "/healthz").await.ends_with("ok\n"));
        shutdown.stop().await;
        assert!(tokio::net::TcpStream::connect(addr).await.is_err(), "the listener is closed");
    }

    /// One plain HTTP/1.1 GET; the body with its headers.
    async fn get_body(addr: SocketAddr, path: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }
}
