//! The optional admin listener: Prometheus metrics at `/metrics`, liveness at
//! `/live` and readiness at `/ready` (a ring is loaded and at least one server
//! is not DEAD). HTTP/1.1 through hyper; only GET, only these three paths.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::CONTENT_TYPE;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::backend::health::HealthState;
use crate::stats::Stats;
use crate::topology::SharedTopology;

/// The content type of the Prometheus text exposition format.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What the admin handlers read.
#[derive(Clone)]
pub struct AdminState {
    pub stats: Arc<Stats>,
    pub topology: SharedTopology,
}

/// Binds the admin listener; serving starts with [`serve`].
///
/// # Errors
/// The address cannot be bound.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves admin requests until `shutdown`.
pub async fn serve(listener: TcpListener, state: AdminState, shutdown: CancellationToken) {
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!("admin accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => return,
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(respond(&request, &state)) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service);
            if let Err(e) = connection.await {
                tracing::debug!("admin connection ended: {e}");
            }
        });
    }
}

fn respond(request: &Request<Incoming>, state: &AdminState) -> Response<Full<Bytes>> {
    if request.method() != Method::GET {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET\n");
    }
    match request.uri().path() {
        "/metrics" => {
            let mut response = Response::new(Full::new(Bytes::from(state.stats.prometheus_text())));
            response.headers_mut().insert(
                CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(PROMETHEUS_TEXT),
            );
            response
        }
        "/live" => text(StatusCode::OK, "live\n"),
        "/ready" => {
            if is_ready(state) {
                text(StatusCode::OK, "ready\n")
            } else {
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "not ready: every server is DEAD\n",
                )
            }
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: try /metrics, /live or /ready\n",
        ),
    }
}

/// Ready when a ring is loaded and at least one server is not DEAD (a SUSPECT
/// server is still tried, and must be, to become ACTIVE again).
pub fn is_ready(state: &AdminState) -> bool {
    let topology = state.topology.load();
    topology.ring.point_count() > 0
        && topology
            .backends
            .iter()
            .any(|b| b.state() != HealthState::Dead)
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *response.status_mut() = status;
    response
}

/// A one-shot `GET /ready` for container health checks (`memring healthcheck`),
/// so the image needs no curl. Returns whether the answer was 200.
///
/// # Errors
/// The admin listener cannot be reached.
pub fn probe_ready(addr: SocketAddr, timeout: std::time::Duration) -> std::io::Result<bool> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.write_all(b"GET /ready HTTP/1.1\r\nHost: memring\r\nConnection: close\r\n\r\n")?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    Ok(response.starts_with(b"HTTP/1.1 200"))
}
