//! The optional admin listener: Prometheus metrics at `/metrics`, liveness at
//! `/live`, readiness at `/ready` (a ring is loaded and at least one server
//! is not DEAD; with `?digest=`, and the ring digest is that) and where a key
//! lives at `/route?key=` (see `locate.rs`). HTTP/1.1 through hyper; only
//! GET, only these four paths.
//!
//! The listener may be reachable from far more places than the data port (a
//! pod IP, for Prometheus), so it must not be able to starve the data path of
//! file descriptors: it holds at most [`MAX_CONNECTIONS`] connections at once,
//! each must send its request headers within [`HEADER_TIMEOUT`], is closed
//! once it has moved no byte for [`IDLE_TIMEOUT`] and after
//! [`CONNECTION_LIFETIME`] whatever it does.
//!
//! A probe must never be refused because other connections sit on every slot
//! (a kubelet restarts a pod whose `/live` fails): at the limit, a new
//! connection takes the slot of the connection that has been quiet longest,
//! which is closed. A probe sends its request as soon as it connects, so it is
//! served before anything idle can push it out.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{ACCEPT, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::backend::health::HealthState;
use crate::control::query::query_value;
use crate::pools::layout::{Layout, SharedLayout};
use crate::pools::topology::SharedTopology;
use crate::ring::digest;
use crate::stats::{Stats, OPENMETRICS_TEXT_TYPE, PROMETHEUS_TEXT_TYPE};

/// Admin connections served at once (the file-descriptor budget counts
/// them, so the number lives there).
pub use crate::control::fd_budget::ADMIN_CONNECTIONS as MAX_CONNECTIONS;
/// Time a connection has to send a request's headers.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(2);
/// Time a connection may move no byte (before its first request, between
/// keep-alive requests, or while its reader takes no response bytes) before it
/// is closed. Probes and scrapers send at once; a scraper that keeps its
/// connection between scrapes simply connects again.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest an admin connection stays open (keep-alive included), so that a
/// client reading its response a byte at a time cannot hold a slot forever.
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);

/// What the admin handlers read.
#[derive(Clone)]
pub struct AdminState {
    pub stats: Arc<Stats>,
    pub topology: SharedTopology,
    /// Every pool and the routes between them, for `memring_ring_info` and
    /// `/ready?digest=`.
    pub layout: SharedLayout,
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
    let slots = Arc::new(Slots::new());
    // One permit per open socket: a connection pushed out closes when its
    // task next runs, so the next one is served only once it has, and no
    // burst of accepts holds more than the limit (plus the one accepted).
    let sockets = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    // Failed accepts in a row, and connections pushed out in a row: each
    // logged when its episode starts and when it ends, not once per event
    // (EMFILE can fail every accept for minutes).
    let mut failing = 0u64;
    let mut evicted = 0u64;
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    if failing == 0 {
                        tracing::warn!("admin listener cannot accept connections: {e}; retrying");
                    }
                    failing += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => return,
        };
        if failing > 0 {
            tracing::info!("admin listener accepting again after {failing} failed accepts");
            failing = 0;
        }
        let (slot, pushed_out) = slots.take();
        if pushed_out {
            if evicted == 0 {
                tracing::warn!(
                    "admin listener at its limit of {MAX_CONNECTIONS} connections; closing the quietest to serve new ones"
                );
            }
            evicted += 1;
        } else if evicted > 0 {
            tracing::info!(
                "admin listener below its limit again after closing {evicted} quiet connections"
            );
            evicted = 0;
        }
        let socket = tokio::select! {
            permit = sockets.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => return,
            },
            () = shutdown.cancelled() => return,
        };
        let state = state.clone();
        tokio::spawn(async move {
            let _socket = socket;
            serve_connection(stream, slot, state).await;
        });
    }
}

async fn serve_connection(stream: TcpStream, slot: Slot, state: AdminState) {
    let service = hyper::service::service_fn(move |request| {
        let state = state.clone();
        async move { Ok::<_, Infallible>(respond(&request, &state)) }
    });
    let io = Tracked {
        stream,
        activity: slot.activity.clone(),
        epoch: slot.epoch,
    };
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(TokioIo::new(io), service);
    let idle = async {
        loop {
            let quiet = slot.quiet_for();
            if quiet >= IDLE_TIMEOUT {
                return;
            }
            tokio::time::sleep(IDLE_TIMEOUT - quiet).await;
        }
    };
    tokio::select! {
        served = tokio::time::timeout(CONNECTION_LIFETIME, connection) => match served {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::debug!("admin connection ended: {e}"),
            Err(_) => tracing::debug!("admin connection closed after {CONNECTION_LIFETIME:?}"),
        },
        () = idle => tracing::debug!("admin connection closed after {IDLE_TIMEOUT:?} quiet"),
        () = slot.close.cancelled() => tracing::debug!("admin connection closed for a new one"),
    }
}

/// The admin connections held now, each with when it last moved a byte.
struct Slots {
    epoch: Instant,
    next: AtomicU64,
    held: Mutex<Vec<Held>>,
}

struct Held {
    id: u64,
    activity: Arc<AtomicU64>,
    close: CancellationToken,
}

/// One connection's place in [`Slots`]; given back on drop.
struct Slot {
    id: u64,
    epoch: Instant,
    activity: Arc<AtomicU64>,
    close: CancellationToken,
    slots: Arc<Slots>,
}

impl Slots {
    fn new() -> Self {
        Self {
            epoch: Instant::now(),
            next: AtomicU64::new(0),
            held: Mutex::new(Vec::with_capacity(MAX_CONNECTIONS)),
        }
    }

    /// A slot for a new connection, and whether the quietest connection held
    /// had to be closed for it.
    fn take(self: &Arc<Self>) -> (Slot, bool) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let activity = Arc::new(AtomicU64::new(millis_since(self.epoch)));
        let close = CancellationToken::new();
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let mut pushed_out = false;
        if held.len() >= MAX_CONNECTIONS {
            let quietest = held
                .iter()
                .enumerate()
                .min_by_key(|(_, h)| h.activity.load(Ordering::Relaxed))
                .map(|(i, _)| i);
            if let Some(i) = quietest {
                held.swap_remove(i).close.cancel();
                pushed_out = true;
            }
        }
        held.push(Held {
            id,
            activity: activity.clone(),
            close: close.clone(),
        });
        let slot = Slot {
            id,
            epoch: self.epoch,
            activity,
            close,
            slots: self.clone(),
        };
        (slot, pushed_out)
    }
}

impl Slot {
    fn quiet_for(&self) -> Duration {
        let last = self.activity.load(Ordering::Relaxed);
        Duration::from_millis(millis_since(self.epoch).saturating_sub(last))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut held = self.slots.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = held.iter().position(|h| h.id == self.id) {
            held.swap_remove(i);
        }
    }
}

fn millis_since(epoch: Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// A connection that notes when it last moved a byte either way.
struct Tracked {
    stream: TcpStream,
    activity: Arc<AtomicU64>,
    epoch: Instant,
}

impl Tracked {
    fn moved(&self) {
        self.activity
            .store(millis_since(self.epoch), Ordering::Relaxed);
    }
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.moved();
        }
        polled
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.moved();
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

fn respond(request: &Request<Incoming>, state: &AdminState) -> Response<Full<Bytes>> {
    if request.method() != Method::GET {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET\n");
    }
    match request.uri().path() {
        "/metrics" => {
            let accept = request
                .headers()
                .get_all(ACCEPT)
                .iter()
                .filter_map(|v| v.to_str().ok());
            let layout = state.layout.load();
            let (body, content_type) = if wants_openmetrics(accept) {
                let mut body = state.stats.openmetrics_text();
                // The registry's text ends with `# EOF`, which must stay last.
                let end = body.rfind("# EOF\n").unwrap_or(body.len());
                body.truncate(end);
                body.push_str(&ring_info(&layout, true));
                body.push_str("# EOF\n");
                (body, OPENMETRICS_TEXT_TYPE)
            } else {
                let mut body = state.stats.prometheus_text();
                body.push_str(&ring_info(&layout, false));
                (body, PROMETHEUS_TEXT_TYPE)
            };
            let mut response = Response::new(Full::new(Bytes::from(body)));
            response.headers_mut().insert(
                CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(content_type),
            );
            response
        }
        "/live" => text(StatusCode::OK, "live\n"),
        "/route" => {
            let layout = state.layout.load();
            let (status, body) = crate::control::locate::answer(&layout, request.uri().query());
            let mut response = owned_text(
                StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST),
                body,
            );
            response.headers_mut().insert(
                CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("application/json"),
            );
            response
        }
        "/ready" => {
            let expected = query_value(request.uri().query(), "digest");
            if let Some(expected) = expected {
                let running = state.layout.load().ring_digest();
                match digest::parse_hex(&expected) {
                    None => {
                        return owned_text(
                            StatusCode::BAD_REQUEST,
                            format!("bad digest {expected:?}: want 16 hex digits\n"),
                        )
                    }
                    Some(wanted) if wanted != running => {
                        return owned_text(
                            StatusCode::SERVICE_UNAVAILABLE,
                            format!(
                                "not ready: ring digest is {}, not {}\n",
                                digest::hex(running),
                                digest::hex(wanted)
                            ),
                        )
                    }
                    Some(_) => {}
                }
            }
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
            "not found: try /metrics, /live, /ready or /route?key=\n",
        ),
    }
}

/// Whether an `Accept` header asks for OpenMetrics text. Prometheus lists
/// `application/openmetrics-text` first (with a higher q) when it can read it;
/// anything else, or no header, gets the classic format every scraper reads.
fn wants_openmetrics<'a>(accept: impl Iterator<Item = &'a str>) -> bool {
    let mut openmetrics = 0.0f32;
    let mut classic = 0.0f32;
    for range in accept.flat_map(|v| v.split(',')) {
        let mut parts = range.split(';').map(str::trim);
        let media = parts.next().unwrap_or("").to_ascii_lowercase();
        let q = parts
            .filter_map(|p| p.strip_prefix("q="))
            .find_map(|q| q.parse::<f32>().ok())
            .unwrap_or(1.0);
        match media.as_str() {
            "application/openmetrics-text" => openmetrics = openmetrics.max(q),
            "text/plain" | "text/*" | "*/*" => classic = classic.max(q),
            _ => {}
        }
    }
    openmetrics > 0.0 && openmetrics >= classic
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

/// `memring_ring_info{pool, digest} 1` for every pool: which ring each
/// pool places keys with, comparable across sidecars (see `ring/digest.rs`).
/// An info family in OpenMetrics (`memring_ring`, whose sample is
/// `memring_ring_info`), a gauge in the classic format, which has no info
/// type: the same series either way. Made at each scrape from the layout in
/// force, so a replaced ring leaves no stale series.
fn ring_info(layout: &Layout, openmetrics: bool) -> String {
    const HELP: &str =
        "Digest of what places each pool's keys: equal on every memring that places them alike";
    let mut out = if openmetrics {
        format!("# HELP memring_ring {HELP}\n# TYPE memring_ring info\n")
    } else {
        format!("# HELP memring_ring_info {HELP}\n# TYPE memring_ring_info gauge\n")
    };
    for pool in layout.pools() {
        let digest = digest::hex(pool.topology.load().ring_digest);
        let name = label_value(&pool.name);
        out.push_str(&format!(
            "memring_ring_info{{pool=\"{name}\",digest=\"{digest}\"}} 1\n"
        ));
    }
    out
}

/// A label value escaped as both text formats want it.
fn label_value(text: &str) -> String {
    text.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn owned_text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *response.status_mut() = status;
    response
}

/// A one-shot `GET /ready` for container health checks (`memring healthcheck`),
/// so the image needs no curl. Returns whether the answer was 200, and the
/// first line of the body (`ready`, or why not).
///
/// # Errors
/// The admin listener cannot be reached or sent no HTTP answer.
pub fn probe_ready(
    addr: SocketAddr,
    timeout: std::time::Duration,
) -> std::io::Result<(bool, String)> {
    probe_ready_with(addr, None, timeout)
}

/// [`probe_ready`], also failing unless the running ring digest is
/// `digest` (`/ready?digest=`).
///
/// # Errors
/// The admin listener cannot be reached or sent no HTTP answer.
pub fn probe_ready_with(
    addr: SocketAddr,
    digest: Option<u64>,
    timeout: std::time::Duration,
) -> std::io::Result<(bool, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    let query = digest.map_or(String::new(), |d| format!("?digest={}", digest::hex(d)));
    stream.write_all(
        format!("GET /ready{query} HTTP/1.1\r\nHost: memring\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    let response = String::from_utf8_lossy(&response);
    let Some((head, body)) = response.split_once("\r\n\r\n") else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "no HTTP response",
        ));
    };
    let status = head.lines().next().unwrap_or("");
    let reason = body.lines().next().unwrap_or("").trim();
    let reason = if reason.is_empty() { status } else { reason };
    Ok((status.starts_with("HTTP/1.1 200"), reason.to_string()))
}

#[cfg(test)]
mod tests {
    use super::wants_openmetrics;

    #[test]
    fn openmetrics_only_when_asked_for_and_preferred() {
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert!(wants_openmetrics([prometheus].into_iter()));
        assert!(!wants_openmetrics(std::iter::empty()));
        assert!(!wants_openmetrics(["*/*"].into_iter()));
        assert!(!wants_openmetrics(["text/plain"].into_iter()));
        assert!(!wants_openmetrics(
            ["text/plain, application/openmetrics-text;q=0.3"].into_iter()
        ));
    }
}
