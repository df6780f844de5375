//! One worker per core: a thread running a current-thread tokio runtime that
//! owns its client sessions and its own connections to every server.
//!
//! A request is parsed, routed, written to a server and answered on one
//! thread: sessions queue their requests directly on the worker's connection
//! to that server, so what all of them queue in one turn of the event loop
//! goes out in one write, and no request crosses threads. What workers share
//! (the topology, server health, counters) is immutable behind the `ArcSwap`
//! or atomic. What the worker's sessions share is in `session/shard.rs`; what its
//! tasks are built from (clock, wake-ups, buffers, budget) is in `runtime/`.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit};
use tokio_util::sync::CancellationToken;

use crate::hotkeys::{HotShared, HotWorker};
use crate::listener::ClientStream;
use crate::pools::layout::SharedLayout;
use crate::pools::topology::SharedTopology;
use crate::session::shard::{keep_connected, SessionSettings, WorkerCtx};
use crate::session::{run_session, run_tls_session, run_unix_session};
use crate::stats::Stats;

/// An accepted client's socket, registered with the worker's runtime.
enum Stream {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

/// An accepted client for a worker.
pub(crate) struct Accepted {
    pub(crate) stream: ClientStream,
    pub(crate) id: u64,
    pub(crate) permit: OwnedSemaphorePermit,
    /// Accepted on `tls_listen`: the TLS config in force when it was.
    pub(crate) tls: Option<tokio_rustls::TlsAcceptor>,
    /// The pool of the listener it came in on, when that is a pool's own.
    pub(crate) pool: Option<SharedTopology>,
}

/// A running worker thread.
pub(crate) struct Worker {
    pub(crate) clients: mpsc::UnboundedSender<Accepted>,
    /// Resolves when the thread has drained and is about to exit.
    pub(crate) done: oneshot::Receiver<()>,
}

/// What a worker is started with.
pub(crate) struct WorkerSetup {
    pub(crate) index: usize,
    pub(crate) layout: SharedLayout,
    pub(crate) stats: Arc<Stats>,
    pub(crate) shutdown: CancellationToken,
    pub(crate) settings: SessionSettings,
    pub(crate) budget: usize,
    pub(crate) grace: Duration,
    /// Woken after every topology publish.
    pub(crate) published: Arc<tokio::sync::Notify>,
    pub(crate) hot: Arc<HotShared>,
}

/// Starts a worker thread.
///
/// # Errors
/// The thread or its runtime cannot be created.
pub(crate) fn spawn(setup: WorkerSetup) -> std::io::Result<Worker> {
    let (clients, receiver) = mpsc::unbounded_channel();
    let (done_sender, done) = oneshot::channel();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name(format!("memring-worker-{}", setup.index))
        .spawn(move || {
            let local = tokio::task::LocalSet::new();
            local.block_on(&runtime, serve(setup, receiver));
            let _ = done_sender.send(());
        })?;
    Ok(Worker { clients, done })
}

/// How many of each kind of spare (and of parked buffers) a worker keeps
/// when it trims its memory after many clients went idle (see `trim`):
/// enough for the next few clients to start without allocating.
const SHED_TO: usize = 32;

/// How long a client on `tls_listen` has to complete its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A TLS client's handshake, ended early by a timeout or shutdown. A client
/// that speaks plain text here gets rustls's alert and a close.
async fn handshake(
    acceptor: &tokio_rustls::TlsAcceptor,
    stream: tokio::net::TcpStream,
    ctx: &WorkerCtx,
) -> std::io::Result<tokio_rustls::server::TlsStream<tokio::net::TcpStream>> {
    let _ = stream.set_nodelay(true);
    tokio::select! {
        done = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)) => match done {
            Ok(result) => result.map_err(|e| std::io::Error::new(e.kind(), format!("TLS handshake failed: {e}"))),
            Err(_) => Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "no TLS handshake in time")),
        },
        () = ctx.shutdown.cancelled() => Err(std::io::Error::other("shutdown during the TLS handshake")),
    }
}

async fn serve(setup: WorkerSetup, mut clients: mpsc::UnboundedReceiver<Accepted>) {
    let ctx = Rc::new(WorkerCtx::new(
        setup.layout,
        setup.stats,
        setup.shutdown,
        setup.settings,
        setup.budget,
        Rc::new(HotWorker::new(setup.hot, setup.index)),
    ));
    let sessions = tokio_util::task::TaskTracker::new();
    tokio::task::spawn_local(keep_connected(ctx.clone(), setup.published.clone()));
    tokio::task::spawn_local(crate::hotkeys::run_windows(
        ctx.hot.clone(),
        ctx.drain.clone(),
    ));
    // After a burst of clients went idle together: what this worker keeps
    // for later requests goes too, but for a few of each.
    tokio::task::spawn_local(crate::runtime::trim::run(ctx.drain.clone(), || {
        crate::session::shed_spares(SHED_TO);
        crate::runtime::recycled::shed_shelf(SHED_TO);
    }));
    // The acceptor closes the channel at shutdown.
    while let Some(Accepted {
        stream,
        id,
        permit,
        tls,
        pool,
    }) = clients.recv().await
    {
        let stream = match stream {
            ClientStream::Tcp(stream) => tokio::net::TcpStream::from_std(stream).map(Stream::Tcp),
            ClientStream::Unix(stream) => {
                tokio::net::UnixStream::from_std(stream).map(Stream::Unix)
            }
        };
        let stream = match stream {
            Ok(stream) => stream,
            Err(e) => {
                tracing::debug!("client {id}: cannot register the socket: {e}");
                continue;
            }
        };
        let ctx = ctx.clone();
        ctx.stats.client_connected();
        sessions.spawn_local(async move {
            let ended = match (tls, stream) {
                (None, Stream::Tcp(stream)) => run_session(stream, id, ctx.clone(), pool).await,
                // A Unix socket's door has no TLS.
                (_, Stream::Unix(stream)) => run_unix_session(stream, id, ctx.clone(), pool).await,
                // Boxed: a TLS stream and its session's state take about
                // twice a plain session's, and every plain session's task
                // would otherwise be as large as a TLS one's (issue 48).
                (Some(acceptor), Stream::Tcp(stream)) => {
                    Box::pin(async {
                        match handshake(&acceptor, stream, &ctx).await {
                            Ok(stream) => run_tls_session(stream, id, ctx.clone()).await,
                            Err(e) => Err(e),
                        }
                    })
                    .await
                }
            };
            if let Err(e) = ended {
                tracing::debug!("client session {id} ended: {e}");
            }
            ctx.stats.client_disconnected();
            drop(permit);
        });
    }
    let deadline = tokio::time::Instant::now() + setup.grace;
    sessions.close();
    if tokio::time::timeout_at(deadline, sessions.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            worker = setup.index,
            open = sessions.len(),
            "drain time over; closing remaining sessions"
        );
    }
    // Copies checked after they landed may still take one back.
    ctx.checks.close();
    let _ = tokio::time::timeout_at(deadline, ctx.checks.wait()).await;
    // Requests the sessions routed may still be queued on connections
    // (`noreply` writes are never waited for); let them reach their servers.
    ctx.drain.cancel();
    ctx.conn_tasks.close();
    if tokio::time::timeout_at(deadline, ctx.conn_tasks.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            worker = setup.index,
            "drain time over; closing server connections with requests queued"
        );
    }
}
