//! A backend: one memcached server, reached through a few persistent pipelined
//! connections ("lanes"), each driven by its own task (`conn.rs`).
//!
//! A client session always uses the same lane of a server, so commands one
//! client sends to one server reach it in the order sent, however many
//! connections the server has. Dropping the `Backend` closes the lanes'
//! channels; their tasks finish what is queued, then close.

pub mod conn;
pub mod health;

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Notify};

use crate::config::{Config, ServerConfig};
use crate::error::{BackendError, BackendErrorKind};
use crate::protocol::encode::Outbound;
use crate::protocol::ReplyKind;
use crate::stats::{BackendMetrics, Stats};
pub use conn::{Call, CallResult};
use health::{Health, HealthEvent, HealthState};

/// Requests queued per lane before senders wait (backpressure to clients).
pub const LANE_QUEUE_DEPTH: usize = 1024;

/// Connection settings shared by all backends of one configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendSettings {
    pub connections: usize,
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
    /// Consecutive failures after which a server is DEAD.
    pub failure_limit: u32,
}

impl BackendSettings {
    pub fn from_config(config: &Config) -> BackendSettings {
        BackendSettings {
            connections: config.connections_per_server,
            connect_timeout: config.connect_timeout,
            request_timeout: config.request_timeout,
            failure_limit: config.failure_limit,
        }
    }
}

/// State shared by a backend's lanes.
pub(crate) struct Shared {
    pub(crate) name: Arc<str>,
    pub(crate) addr: String,
    pub(crate) settings: BackendSettings,
    health: Mutex<Health>,
    state: AtomicU8,
    /// Woken when this server becomes DEAD or stops being DEAD.
    health_changed: Arc<Notify>,
    pub(crate) metrics: BackendMetrics,
    /// Woken when any lane hears from the server, so that lanes backing off
    /// after failures reconnect at once instead of failing requests until
    /// their own retry time.
    pub(crate) heard_from: Notify,
}

/// What every backend of a pool reports to.
#[derive(Debug, Clone)]
pub struct PoolHooks {
    /// Woken when any server becomes DEAD or comes back (for ejection).
    pub health_changed: Arc<Notify>,
    pub stats: Arc<Stats>,
    /// Every connection task, so that shutdown can wait for them to finish
    /// what was queued (including `noreply` writes nobody waits for).
    pub connections: tokio_util::task::TaskTracker,
}

impl Shared {
    /// The error for a failed request, counted once here.
    pub(crate) fn error(&self, kind: BackendErrorKind) -> BackendError {
        self.metrics.error(kind);
        BackendError {
            server: self.name.clone(),
            kind,
        }
    }

    /// Feeds the health state machine and logs a transition once.
    pub(crate) fn report(&self, event: HealthEvent) {
        if matches!(event, HealthEvent::Answered | HealthEvent::Probed) {
            self.heard_from.notify_waiters();
        }
        // Only connects and failures come here, never each request, so this
        // lock is off the request path.
        let mut health = self.health.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(transition) = health.on(event, self.settings.failure_limit) {
            self.state.store(transition.to.to_u8(), Ordering::Relaxed);
            self.metrics.set_state(transition.to);
            if transition.from == HealthState::Dead || transition.to == HealthState::Dead {
                self.health_changed.notify_one();
            }
            match event {
                HealthEvent::Failed(kind) => tracing::warn!(
                    server = %self.name, addr = %self.addr,
                    "server {} -> {}: {kind}", transition.from.as_str(), transition.to.as_str()
                ),
                HealthEvent::Answered | HealthEvent::Probed => tracing::info!(
                    server = %self.name, addr = %self.addr,
                    "server {} -> {}", transition.from.as_str(), transition.to.as_str()
                ),
            }
        }
    }
}

/// A handle to one memcached server.
pub struct Backend {
    shared: Arc<Shared>,
    lanes: Box<[mpsc::Sender<Call>]>,
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
    /// Starts the connection tasks for `server`. Must be called inside a tokio
    /// runtime.
    pub fn start(
        server: &ServerConfig,
        settings: BackendSettings,
        hooks: &PoolHooks,
    ) -> Arc<Backend> {
        let shared = Arc::new(Shared {
            name: server.name.as_str().into(),
            addr: server.addr.clone(),
            settings,
            health: Mutex::new(Health::default()),
            state: AtomicU8::new(HealthState::Active.to_u8()),
            health_changed: hooks.health_changed.clone(),
            heard_from: Notify::new(),
            metrics: hooks.stats.backend(&server.name),
        });
        let lanes = (0..settings.connections.max(1))
            .map(|_| {
                let (sender, receiver) = mpsc::channel(LANE_QUEUE_DEPTH);
                hooks.connections.spawn(conn::run(shared.clone(), receiver));
                sender
            })
            .collect();
        Arc::new(Backend { shared, lanes })
    }

    /// The server's ring identity.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The server's ring identity as a shared string (cheap to clone per request).
    pub fn shared_name(&self) -> Arc<str> {
        self.shared.name.clone()
    }

    /// The address connected to.
    pub fn addr(&self) -> &str {
        &self.shared.addr
    }

    /// The settings this backend was started with.
    pub fn settings(&self) -> BackendSettings {
        self.shared.settings
    }

    /// This server's metric handles.
    pub fn metrics(&self) -> &BackendMetrics {
        &self.shared.metrics
    }

    /// Current health.
    pub fn state(&self) -> HealthState {
        HealthState::from_u8(self.shared.state.load(Ordering::Relaxed))
    }

    /// Number of connections.
    pub fn lane_count(&self) -> usize {
        self.lanes.len()
    }

    /// Queues a request whose reply is awaited later with [`Awaited::reply`].
    ///
    /// # Errors
    /// As [`Backend::send`].
    pub async fn start_call(
        &self,
        lane: usize,
        request: Outbound,
        kind: ReplyKind,
    ) -> Result<Awaited, BackendError> {
        let receiver = self.send(lane, request, kind, true).await?;
        Ok(Awaited {
            receiver: receiver.expect("a reply was asked for"),
            server: self.shared.name.clone(),
        })
    }

    /// Queues a request on lane `lane % lanes` and returns where its reply will
    /// arrive (`None` when `want_reply` is false: the reply is dropped).
    ///
    /// # Errors
    /// The server is DEAD (failed at once rather than after a timeout; its
    /// connections keep probing it), or the lane's task has ended.
    pub async fn send(
        &self,
        lane: usize,
        request: Outbound,
        kind: ReplyKind,
        want_reply: bool,
    ) -> Result<Option<oneshot::Receiver<CallResult>>, BackendError> {
        self.shared.metrics.requests.inc();
        if self.state() == HealthState::Dead {
            return Err(self.shared.error(BackendErrorKind::Dead));
        }
        let (reply, receiver) = if want_reply {
            let (sender, receiver) = oneshot::channel();
            (Some(sender), Some(receiver))
        } else {
            (None, None)
        };
        let call = Call {
            request,
            kind,
            reply,
        };
        self.lanes[lane % self.lanes.len()]
            .send(call)
            .await
            .map_err(|_| self.shared.error(BackendErrorKind::Gone))?;
        Ok(receiver)
    }
}

/// A queued request's reply, to be awaited.
pub struct Awaited {
    receiver: oneshot::Receiver<CallResult>,
    server: Arc<str>,
}

impl Awaited {
    /// The reply, or why there is none (a connection task that went away
    /// without answering counts as the backend being gone).
    pub async fn reply(self) -> CallResult {
        self.receiver.await.unwrap_or_else(|_| {
            Err(BackendError {
                server: self.server,
                kind: BackendErrorKind::Gone,
            })
        })
    }
}
