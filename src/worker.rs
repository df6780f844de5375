//! One worker per core: a thread running a current-thread tokio runtime that
//! owns its client sessions and its own connections to every server.
//!
//! A request is parsed, routed, written to a server and answered on one
//! thread: sessions queue their requests directly on the worker's connection
//! to that server, so what all of them queue in one turn of the event loop
//! goes out in one write, and no request crosses threads. What workers share
//! (the topology, server health, counters) is immutable behind the `ArcSwap`
//! or atomic.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backend::conn::{self, Conn};
use crate::backend::Backend;
use crate::hotkeys::{HotShared, HotWorker};
use crate::session::run_session;
use crate::stats::Stats;
use crate::topology::SharedTopology;

/// Settings every session of a worker reads.
#[derive(Debug, Clone, Copy)]
pub struct SessionSettings {
    /// Requests of one client parsed and not yet answered.
    pub max_pending: usize,
    /// Close a client idle (or stuck halfway through a request) this long.
    pub idle_timeout: Option<Duration>,
    /// Close a client owed replies that reads none for this long.
    pub write_timeout: Duration,
    /// Reply bytes one client may be owed; `None` follows `max_value_bytes`.
    pub client_buffer_bytes: Option<usize>,
}

/// What a worker's sessions share. Lives on the worker thread only.
pub(crate) struct WorkerCtx {
    pub(crate) topology: SharedTopology,
    pub(crate) stats: Arc<Stats>,
    pub(crate) shutdown: CancellationToken,
    pub(crate) settings: SessionSettings,
    /// This worker's connections, by (backend id, lane).
    conns: RefCell<HashMap<(u64, usize), Rc<Conn>>>,
    /// Cancelled once the worker's sessions are done: connections finish
    /// what they owe, then close.
    drain: CancellationToken,
    conn_tasks: TaskTracker,
    /// Reply bytes this worker's clients are owed or have reserved.
    pub(crate) owed: Cell<usize>,
    /// This worker's share of `max_buffer_bytes`.
    pub(crate) budget: usize,
    /// This worker's hot-key counts, requests in flight and windows.
    pub(crate) hot: Rc<HotWorker>,
}

impl WorkerCtx {
    /// The worker's connection `lane` to `backend`, opened on first use.
    pub(crate) fn conn(&self, backend: &Backend, lane: usize) -> Rc<Conn> {
        let shared = backend.shared();
        let key = (shared.id, lane % shared.settings.connections.max(1));
        if let Some(conn) = self.conns.borrow().get(&key) {
            if !conn.is_closed() {
                return conn.clone();
            }
        }
        let conn = Conn::new(shared.clone());
        let mut conns = self.conns.borrow_mut();
        // Connections of retired servers end by themselves; forget them here.
        conns.retain(|_, c| !c.is_closed());
        conns.insert(key, conn.clone());
        self.conn_tasks
            .spawn_local(conn::run(conn.clone(), self.drain.clone()));
        conn
    }
}

/// Opens this worker's connections to every server of the published
/// topology, at start and after every change, so that a server's failure or
/// return is noticed (and its health known) before traffic needs it, and the
/// first requests do not wait for a connect.
async fn keep_connected(ctx: Rc<WorkerCtx>, published: Arc<tokio::sync::Notify>) {
    loop {
        let changed = published.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let topology = ctx.topology.load_full();
        for backend in topology.backends.iter() {
            for lane in 0..backend.settings().connections.max(1) {
                ctx.conn(backend, lane);
            }
        }
        drop(topology);
        tokio::select! {
            () = changed => {}
            () = ctx.drain.cancelled() => return,
        }
    }
}

/// An accepted client for a worker.
pub(crate) struct Accepted {
    pub(crate) stream: std::net::TcpStream,
    pub(crate) id: u64,
    pub(crate) permit: OwnedSemaphorePermit,
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
    pub(crate) topology: SharedTopology,
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

async fn serve(setup: WorkerSetup, mut clients: mpsc::UnboundedReceiver<Accepted>) {
    let ctx = Rc::new(WorkerCtx {
        topology: setup.topology,
        stats: setup.stats,
        shutdown: setup.shutdown,
        settings: setup.settings,
        conns: RefCell::new(HashMap::new()),
        drain: CancellationToken::new(),
        conn_tasks: TaskTracker::new(),
        owed: Cell::new(0),
        budget: setup.budget,
        hot: Rc::new(HotWorker::new(setup.hot, setup.index)),
    });
    let sessions = TaskTracker::new();
    tokio::task::spawn_local(keep_connected(ctx.clone(), setup.published.clone()));
    tokio::task::spawn_local(crate::hotkeys::run_windows(
        ctx.hot.clone(),
        ctx.drain.clone(),
    ));
    // The acceptor closes the channel at shutdown.
    while let Some(Accepted { stream, id, permit }) = clients.recv().await {
        let stream = match tokio::net::TcpStream::from_std(stream) {
            Ok(stream) => stream,
            Err(e) => {
                tracing::debug!("client {id}: cannot register the socket: {e}");
                continue;
            }
        };
        let ctx = ctx.clone();
        ctx.stats.client_connected();
        sessions.spawn_local(async move {
            if let Err(e) = run_session(stream, id, ctx.clone()).await {
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
