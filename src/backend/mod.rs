//! A backend: one memcached server's shared state — address, settings,
//! health, counters — seen by every worker. The connections themselves are
//! per worker (`conn.rs`): each worker owns its own connections to each server,
//! so a request never crosses threads; what they learn about the server
//! (failures, answers, its item size limit) is recorded here for all.

pub mod conn;
pub mod health;
pub mod slot;

use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, Ejection, ServerConfig};
use crate::error::{BackendError, BackendErrorKind};
use crate::stats::{BackendMetrics, Stats};
use health::{Health, HealthEvent, HealthState, Rules, Timing, Transition};

/// Connection settings shared by all backends of one configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendSettings {
    /// Connections to this server per worker.
    pub connections: usize,
    pub connect_timeout: Duration,
    /// How long a server may make no progress on the requests it owes.
    pub request_timeout: Duration,
    /// Consecutive failures after which a server is DEAD.
    pub failure_limit: u32,
    /// Largest value accepted in a reply when set in the config; otherwise
    /// the server's own `item_size_max`.
    pub max_value_bytes: Option<usize>,
    /// Where its host name is looked up.
    pub dns: crate::inputs::resolve::Dns,
    /// Requests one worker may have in flight to this server, over all its
    /// connections to it (`max_server_inflight`; 0: no limit). Past it a
    /// request is refused at once ([`BackendErrorKind::Busy`]).
    pub max_inflight: usize,
}

impl BackendSettings {
    pub fn from_config(config: &Config) -> BackendSettings {
        BackendSettings {
            connections: config.connections_per_server,
            connect_timeout: config.connect_timeout,
            request_timeout: config.request_timeout,
            failure_limit: config.failure_limit,
            max_value_bytes: (!config.max_value_from_servers)
                .then_some(config.limits.max_value_bytes),
            dns: config.discovery.dns,
            max_inflight: config.max_server_inflight,
        }
    }

    /// The part of `max_inflight` each of a worker's connections to the
    /// server takes (a client always uses the same one): an equal share,
    /// rounded up, so the worker's total is at least the setting.
    pub(crate) fn max_inflight_per_connection(&self) -> usize {
        match self.max_inflight {
            0 => usize::MAX,
            limit => limit.div_ceil(self.connections.max(1)),
        }
    }
}

/// How the health of the servers of `config` is timed (`ejection`,
/// `auto_eject`, `retry_timeout_ms`).
pub fn timing_for(config: &Config) -> Timing {
    match config.ejection {
        Ejection::Memring => Timing::Probe,
        Ejection::Twemproxy { retry } => Timing::Twemproxy {
            eject: config.auto_eject,
            retry,
        },
    }
}

/// Health state labels for metrics, ACTIVE first.
pub const STATE_LABELS: [&str; 3] = ["ACTIVE", "SUSPECT", "DEAD"];

static NEXT_BACKEND_ID: AtomicU64 = AtomicU64::new(1);

/// State shared by every worker's connections to one server.
pub(crate) struct Shared {
    /// Unique for the process's lifetime: how workers find their connections.
    pub(crate) id: u64,
    pub(crate) name: Arc<str>,
    pub(crate) addr: String,
    /// Its host name's addresses, looked up at every connect.
    pub(crate) target: crate::inputs::resolve::Target,
    pub(crate) settings: BackendSettings,
    /// When a DEAD server is tried again (the `ejection` setting).
    timing: Timing,
    health: Mutex<Health>,
    state: AtomicU8,
    /// Woken when this server becomes DEAD or stops being DEAD.
    health_changed: Arc<Notify>,
    pub(crate) metrics: BackendMetrics,
    /// Woken when any connection hears from the server, so that connections
    /// backing off after failures reconnect at once; with twemproxy timing
    /// also when the server is put back into the ring and when a request
    /// fails on a connection that is backing off (nutcracker connects anew
    /// for each such request, and each failed connect counts).
    pub(crate) heard_from: Notify,
    /// Cancelled when no topology holds this backend any more: connections
    /// finish what they owe, then close.
    pub(crate) retired: CancellationToken,
    /// The server's `item_size_max` (0 until a connection learned it).
    pub(crate) item_size_max: AtomicUsize,
    /// `tls = true`: connections speak TLS (`None` in it: memring started
    /// without `[backend_tls]`, so they cannot).
    pub(crate) tls: Option<Option<Arc<crate::tls::Connector>>>,
    /// The last TLS failure logged, so that a failing server is logged once
    /// per kind of failure, not once per reconnect.
    tls_failure: Mutex<Option<String>>,
}

/// What every backend of a pool reports to.
#[derive(Debug, Clone)]
pub struct PoolHooks {
    /// Woken when any server becomes DEAD or comes back (for ejection).
    pub health_changed: Arc<Notify>,
    pub stats: Arc<Stats>,
    /// How servers with `tls = true` are connected to (`[backend_tls]`).
    pub tls: Option<Arc<crate::tls::Connector>>,
    /// The pool the backends belong to, as their figures are labelled.
    pub pool: Arc<str>,
}

impl Shared {
    /// The error for a failed request, counted once here. Allocates nothing.
    pub(crate) fn error(&self, kind: BackendErrorKind) -> BackendError {
        if kind == BackendErrorKind::Busy {
            // memring's refusal, not the server's failure: a rejection.
            self.metrics.rejected_busy.inc();
        } else {
            self.metrics.error(kind.index());
        }
        if let (Timing::Twemproxy { .. }, true) = (self.timing, connection_failure(kind)) {
            self.heard_from.notify_waiters();
        }
        BackendError {
            server: self.name.clone(),
            kind,
        }
    }

    /// The largest value a reply from this server may carry.
    pub(crate) fn max_reply_value(&self) -> usize {
        self.settings.max_value_bytes.unwrap_or_else(|| {
            match self.item_size_max.load(Ordering::Relaxed) {
                0 => crate::config::MAX_VALUE_BYTES_LIMIT as usize,
                learned => learned,
            }
        })
    }

    fn rules(&self) -> Rules {
        Rules {
            failure_limit: self.settings.failure_limit,
            timing: self.timing,
        }
    }

    /// Feeds the health state machine and logs a transition once.
    pub(crate) fn report(&self, event: HealthEvent) {
        if matches!(event, HealthEvent::Answered | HealthEvent::Probed) {
            self.heard_from.notify_waiters();
        }
        // Connections report once per connect, answer or failure, never per
        // request, so this lock is off the request path.
        let mut health = self.health.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(transition) = health.on(event, self.rules(), Instant::now()) {
            self.publish(transition);
            let (from, to) = (transition.from.as_str(), transition.to.as_str());
            match (event, health.retry_at) {
                (HealthEvent::Failed(kind), Some(_)) => tracing::warn!(
                    server = %self.name, addr = %self.addr,
                    "server {from} -> {to}: {kind}; ejected until retry_timeout_ms has passed"
                ),
                (HealthEvent::Failed(kind), None) => tracing::warn!(
                    server = %self.name, addr = %self.addr, "server {from} -> {to}: {kind}"
                ),
                (HealthEvent::Answered | HealthEvent::Probed, _) => tracing::info!(
                    server = %self.name, addr = %self.addr, "server {from} -> {to}"
                ),
            }
        }
    }

    /// With twemproxy timing, when this DEAD server is due back in the ring.
    fn retry_at(&self) -> Option<Instant> {
        self.health
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retry_at
    }

    /// Puts this server back into the ring if its retry is due at `now`
    /// (twemproxy timing); true if it was.
    fn tick(&self, now: Instant) -> bool {
        let mut health = self.health.lock().unwrap_or_else(|e| e.into_inner());
        let Some(transition) = health.tick(now) else {
            return false;
        };
        self.publish(transition);
        tracing::info!(
            server = %self.name, addr = %self.addr,
            "server {} -> {}: retry_timeout_ms has passed, back in the ring untried",
            transition.from.as_str(), transition.to.as_str()
        );
        // As nutcracker connects for the first request after the retry.
        self.heard_from.notify_waiters();
        true
    }

    /// Makes a transition visible: the state workers read, the metric, and
    /// the pool's wake-up when DEAD was crossed.
    fn publish(&self, transition: Transition) {
        self.state.store(transition.to.to_u8(), Ordering::Relaxed);
        self.metrics.set_state(transition.to.as_str());
        if transition.from == HealthState::Dead || transition.to == HealthState::Dead {
            self.health_changed.notify_one();
        }
    }

    pub(crate) fn state(&self) -> HealthState {
        HealthState::from_u8(self.state.load(Ordering::Relaxed))
    }

    /// Logs a failed TLS handshake in rustls's words, once until the words
    /// change or a handshake succeeds (`None`).
    pub(crate) fn note_tls(&self, failure: Option<&str>) {
        let mut last = self.tls_failure.lock().unwrap_or_else(|e| e.into_inner());
        if last.as_deref() == failure {
            return;
        }
        match failure {
            Some(words) => tracing::warn!(server = %self.name, addr = %self.addr, "{words}"),
            None => {
                tracing::info!(server = %self.name, addr = %self.addr, "TLS handshake succeeded")
            }
        }
        *last = failure.map(str::to_string);
    }
}

/// A byte stream both ways, as [`Backend::connect_own`] gives it: a plain
/// socket, or TLS over one. Writes to it must be flushed.
pub(crate) trait Duplex:
    tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send
{
}

impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Duplex for T {}

/// A handle to one memcached server, held by topologies. When the last
/// topology holding it is gone, every worker's connections to it finish what
/// they owe and close.
pub struct Backend {
    shared: Arc<Shared>,
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.shared.retired.cancel();
    }
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend")
            .field("name", &self.shared.name)
            .field("addr", &self.shared.addr)
            .finish()
    }
}

impl Backend {
    /// A backend for `server` with memring's own health timing.
    /// Connections are opened by each worker on first use.
    pub fn new(
        server: &ServerConfig,
        settings: BackendSettings,
        hooks: &PoolHooks,
    ) -> Arc<Backend> {
        Backend::with_timing(server, settings, Timing::Probe, hooks)
    }

    /// A backend for `server` whose health follows `timing`.
    pub fn with_timing(
        server: &ServerConfig,
        settings: BackendSettings,
        timing: Timing,
        hooks: &PoolHooks,
    ) -> Arc<Backend> {
        let shared = Arc::new(Shared {
            id: NEXT_BACKEND_ID.fetch_add(1, Ordering::Relaxed),
            name: server.name.as_str().into(),
            addr: server.addr.clone(),
            target: crate::inputs::resolve::Target::new(&server.addr, settings.dns),
            settings,
            timing,
            health: Mutex::new(Health::default()),
            state: AtomicU8::new(HealthState::Active.to_u8()),
            health_changed: hooks.health_changed.clone(),
            heard_from: Notify::new(),
            metrics: hooks.stats.backend(
                &hooks.pool,
                &server.name,
                &BackendErrorKind::LABELS,
                &STATE_LABELS,
            ),
            retired: CancellationToken::new(),
            item_size_max: AtomicUsize::new(0),
            tls: server.tls.then(|| hooks.tls.clone()),
            tls_failure: Mutex::new(None),
        });
        Arc::new(Backend { shared })
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The server's ring identity.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The address connected to.
    pub fn addr(&self) -> &str {
        &self.shared.addr
    }

    /// Whether connections to this server speak TLS.
    pub fn tls(&self) -> bool {
        self.shared.tls.is_some()
    }

    /// A connection of memring's own to this server, beside the workers'
    /// (the flush before it joins or returns, a hand-off sweep): its host
    /// name looked up where its connections look it up, and with
    /// `tls = true` a TLS session verified as theirs are, since its TLS
    /// port speaks nothing else. No timeout of its own: callers bound the
    /// whole exchange.
    ///
    /// # Errors
    /// No address accepts the connection, or the handshake fails (in
    /// rustls's words).
    pub(crate) async fn connect_own(&self) -> std::io::Result<Box<dyn Duplex>> {
        let shared = &self.shared;
        let stream = crate::inputs::resolve::connect(shared.settings.dns, &shared.addr).await?;
        match &shared.tls {
            None => Ok(Box::new(stream)),
            Some(None) => Err(std::io::Error::other(
                "tls = true, but memring started without [backend_tls]",
            )),
            Some(Some(connector)) => {
                let stream = connector
                    .connect(&shared.addr, stream, shared.settings.connect_timeout)
                    .await
                    .map_err(|(_, words)| std::io::Error::other(words))?;
                Ok(Box::new(stream))
            }
        }
    }

    /// Its address as DNS gave it, and whether its connections are to be
    /// replaced because DNS now gives another.
    pub fn target(&self) -> &crate::inputs::resolve::Target {
        &self.shared.target
    }

    /// The settings this backend was started with.
    pub fn settings(&self) -> BackendSettings {
        self.shared.settings
    }

    /// How this server's health is timed.
    pub fn timing(&self) -> Timing {
        self.shared.timing
    }

    /// With twemproxy timing, when this DEAD server goes back into the ring.
    pub fn retry_at(&self) -> Option<Instant> {
        self.shared.retry_at()
    }

    /// Puts this server back into the ring if its retry is due at `now`;
    /// true if it was (the pool then publishes its return).
    pub fn tick(&self, now: Instant) -> bool {
        self.shared.tick(now)
    }

    /// This server's metric handles.
    pub fn metrics(&self) -> &BackendMetrics {
        &self.shared.metrics
    }

    /// Current health.
    pub fn state(&self) -> HealthState {
        self.shared.state()
    }

    /// The server's `item_size_max`, once a connection has learned it.
    pub fn item_size_max(&self) -> Option<usize> {
        match self.shared.item_size_max.load(Ordering::Relaxed) {
            0 => None,
            n => Some(n),
        }
    }

    /// The error a request to this server gets for `kind` (counted).
    pub fn error(&self, kind: BackendErrorKind) -> BackendError {
        self.shared.error(kind)
    }
}

/// A failure to reach the server or keep a connection to it, which nutcracker
/// counts (each closed server connection): not a protocol error, a removed
/// backend, or the fail-fast answer of a DEAD server.
fn connection_failure(kind: BackendErrorKind) -> bool {
    match kind {
        BackendErrorKind::Connect(_)
        | BackendErrorKind::ConnectTimeout
        | BackendErrorKind::Timeout
        | BackendErrorKind::Closed
        | BackendErrorKind::Io(_)
        | BackendErrorKind::Tls(_)
        // A name without an address: nutcracker's connect fails the same way.
        | BackendErrorKind::Resolve(_) => true,
        BackendErrorKind::Protocol(_)
        | BackendErrorKind::Gone
        | BackendErrorKind::Dead
        | BackendErrorKind::Busy => false,
    }
}
