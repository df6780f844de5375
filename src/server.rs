//! The accept loop: a bounded number of client sessions, and shutdown that stops
//! accepting, lets sessions write the replies they owe within a grace period,
//! then returns.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admin::AdminState;
use crate::config::Config;
use crate::session::{run_session, SessionContext};
use crate::stats::Stats;
use crate::topology::{Published, Publisher, SharedTopology};

/// A running proxy.
pub struct Running {
    /// Where clients connect (useful with port 0).
    pub local_addr: SocketAddr,
    /// Where the admin listener is, when configured.
    pub admin_addr: Option<SocketAddr>,
    /// The routing table sessions read.
    pub topology: SharedTopology,
    /// Where reloads publish.
    pub publisher: Arc<Publisher>,
    pub stats: Arc<Stats>,
    task: JoinHandle<()>,
}

impl Running {
    /// Waits until the proxy has shut down and drained.
    pub async fn wait(self) {
        let _ = self.task.await;
    }
}

/// Binds `config.listen` and starts serving until `shutdown` is cancelled.
/// Must be called inside a tokio runtime.
///
/// # Errors
/// The listen address cannot be bound.
pub async fn start(config: &Config, shutdown: CancellationToken) -> io::Result<Running> {
    let listener = listen(config.listen)?;
    let local_addr = listener.local_addr()?;
    let stats = Arc::new(Stats::new());
    let admin = match config.admin_listen {
        Some(addr) => Some(crate::admin::bind(addr).await?),
        None => None,
    };
    let publisher = Publisher::new(config.clone(), stats.clone());
    let topology = publisher.shared();
    let admin_addr = match admin {
        Some(listener) => {
            let addr = listener.local_addr()?;
            tracing::info!(%addr, "admin listener: /metrics /live /ready");
            let state = AdminState {
                stats: stats.clone(),
                topology: topology.clone(),
            };
            tokio::spawn(crate::admin::serve(listener, state, shutdown.clone()));
            Some(addr)
        }
        None => None,
    };
    tokio::spawn(eject_on_health_changes(publisher.clone(), shutdown.clone()));
    let context = Arc::new(SessionContext {
        topology: topology.clone(),
        max_pending: config.max_pending_per_client,
        idle_timeout: config.client_idle_timeout,
        shutdown: shutdown.clone(),
        stats: stats.clone(),
    });
    tracing::info!(%local_addr, servers = config.servers.len(), "listening");
    let task = tokio::spawn(accept_loop(
        listener,
        context,
        config.max_client_connections,
        config.shutdown_grace,
        publisher.clone(),
    ));
    Ok(Running {
        local_addr,
        admin_addr,
        topology,
        publisher,
        stats,
        task,
    })
}

/// Leaves DEAD servers out of the ring (when `auto_eject` is on) and puts them
/// back when they recover, each as one published topology change.
async fn eject_on_health_changes(publisher: Arc<Publisher>, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            () = publisher.health_changed() => {}
            () = shutdown.cancelled() => return,
        }
        if let Some(Published { version, change }) = publisher.apply_health() {
            tracing::warn!("ring v{version}: {change}");
        }
    }
}

/// Pending connections the kernel may queue before memring accepts them
/// (capped by `net.core.somaxconn`). mio's default of 128 overflowed under
/// bursts of new clients, and each dropped SYN costs that client a second.
const LISTEN_BACKLOG: u32 = 4096;

/// Binds the client listener; SO_REUSEADDR so that a restart does not wait for
/// the old sockets' TIME_WAIT.
fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

async fn accept_loop(
    listener: TcpListener,
    context: Arc<SessionContext>,
    max_connections: usize,
    grace: std::time::Duration,
    publisher: Arc<Publisher>,
) {
    let limit = Arc::new(Semaphore::new(max_connections));
    let sessions = TaskTracker::new();
    let next_id = AtomicU64::new(0);
    let shutdown = context.shutdown.clone();
    let mut accept_failing = false;
    loop {
        // Take a slot before accepting: past the limit, new connections wait in
        // the listen backlog while existing ones keep working.
        let permit = tokio::select! {
            permit = limit.clone().acquire_owned() => permit.expect("semaphore is never closed"),
            () = shutdown.cancelled() => break,
        };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shutdown.cancelled() => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => {
                if accept_failing {
                    accept_failing = false;
                    tracing::info!("accepting connections again");
                }
                stream
            }
            Err(e) => {
                // Out of file descriptors and the like: back off briefly rather
                // than spin, and say so once per episode, not per attempt.
                if !accept_failing {
                    accept_failing = true;
                    tracing::warn!("accept failed, retrying every 50 ms: {e}");
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let id = next_id.fetch_add(1, Ordering::Relaxed);
        let context = context.clone();
        context.stats.client_connected();
        sessions.spawn(async move {
            if let Err(e) = run_session(stream, id, context.clone()).await {
                tracing::debug!("client session {id} ended: {e}");
            }
            context.stats.client_disconnected();
            drop(permit);
        });
    }
    drop(listener);
    sessions.close();
    tracing::info!(
        open = sessions.len(),
        "shutting down: draining client sessions"
    );
    let deadline = tokio::time::Instant::now() + grace;
    if tokio::time::timeout_at(deadline, sessions.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            open = sessions.len(),
            "drain time over; closing remaining sessions"
        );
    }
    // Requests the sessions routed may still be queued on backend connections
    // (noreply writes are never waited for); let them reach their servers.
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    if !publisher.drain_backends(left).await {
        tracing::warn!("drain time over; closing backend connections with requests queued");
    }
}
