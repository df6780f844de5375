//! Start-up and the accept loop: the workers, a bounded number of client
//! sessions handed out round robin, and shutdown that stops accepting, lets
//! every worker's sessions write the replies they owe and its connections
//! deliver what is queued within a grace period, then returns.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpSocket};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::control::admin::AdminState;
use crate::control::client_slots::ClientSlots;
use crate::control::fd_budget::FdBudget;
use crate::control::pool_set::Pools;
use crate::control::publisher::{FdAccount, Publisher};
use crate::listener::ClientStream;
use crate::pools::topology::SharedTopology;
use crate::session::shard::SessionSettings;
use crate::stats::Stats;
use crate::worker::{self, Accepted, Worker, WorkerSetup};

/// A running proxy.
pub struct Running {
    /// Where clients connect (useful with port 0); `0.0.0.0:0` when
    /// `listen` is a Unix socket (see `local_path`).
    pub local_addr: SocketAddr,
    /// The socket's path, when `listen` is a Unix socket.
    pub local_path: Option<std::path::PathBuf>,
    /// Where the admin listener is, when configured.
    pub admin_addr: Option<SocketAddr>,
    /// Where TLS clients connect (`tls_listen`), when configured.
    pub tls_addr: Option<SocketAddr>,
    /// The TLS listener's certificate, reloaded when its files change.
    pub tls_acceptor: Option<Arc<crate::tls::Acceptor>>,
    /// The default pool's routing table.
    pub topology: SharedTopology,
    /// Where reloads publish the default pool.
    pub publisher: Arc<Publisher>,
    /// Every pool, and the routes between them.
    pub pools: Arc<Pools>,
    /// The pools with a TCP listener of their own, and where it is.
    pub pool_addrs: Vec<(String, SocketAddr)>,
    /// The pools with a Unix-socket listener of their own, and its path.
    pub pool_paths: Vec<(String, std::path::PathBuf)>,
    pub stats: Arc<Stats>,
    task: JoinHandle<()>,
}

impl Running {
    /// Waits until the proxy has shut down and drained.
    pub async fn wait(self) {
        let _ = self.task.await;
    }
}

/// Binds `config.listen`, starts the workers and serves until `shutdown` is
/// cancelled. Must be called inside a tokio runtime (it runs the acceptor,
/// reloads, ejections and the admin listener; the workers run their own).
///
/// # Errors
/// `listen`, `tls_listen` or `admin_listen` cannot be bound (the error names
/// which), a TLS file is unusable, or a worker cannot be started.
pub async fn start(config: &Config, shutdown: CancellationToken) -> io::Result<Running> {
    start_within(config, None, shutdown).await
}

/// Like [`start`], with memring's file descriptors kept within `fds`: the
/// client limit is what the budget leaves beside the ring, and a reload whose
/// ring would not fit next to the clients connected is refused.
///
/// # Errors
/// As [`start`].
pub async fn start_within(
    config: &Config,
    fds: Option<FdBudget>,
    shutdown: CancellationToken,
) -> io::Result<Running> {
    // With `[discovery] srv` or `a`, the servers are what DNS lists now.
    let discovered = crate::control::discovery::first(config).await?;
    // With `[discovery] etcd_endpoints`, etcd's members join the file's.
    let (discovered, members) = crate::control::etcd::first(&discovered).await?;
    let config = &discovered;
    let listener =
        listen_on(&config.listen).map_err(|e| bind_error("listen", &config.listen, e))?;
    let local_addr = match &listener {
        DoorListener::Tcp(listener) => listener.local_addr()?,
        DoorListener::Unix { .. } => SocketAddr::from(([0, 0, 0, 0], 0)),
    };
    let local_path = config.listen.unix_path().map(std::path::Path::to_path_buf);
    let connector = backend_connector(config)?;
    let tls_listener = tls_listener(config, &shutdown)?;
    let tls_addr = match &tls_listener {
        Some((listener, _)) => Some(listener.local_addr()?),
        None => None,
    };
    let tls_acceptor = tls_listener.as_ref().map(|(_, acceptor)| acceptor.clone());
    let stats = Arc::new(Stats::new());
    let admin = match config.admin_listen {
        Some(addr) => Some(
            crate::control::admin::bind(addr)
                .await
                .map_err(|e| bind_error("admin_listen", &addr, e))?,
        ),
        None => None,
    };
    let max_clients = config.max_client_connections;
    let clients = ClientSlots::new(fds.map_or(max_clients, |budget| {
        budget.client_limit(max_clients, budget.config_backend_fds(config))
    }));
    let account = fds.map(|budget| FdAccount {
        budget,
        clients: clients.clone(),
        max_clients,
    });
    // Read before any pool starts, so that each takes up its window first.
    let state = config.state_file.as_ref().map(|path| {
        let loaded = crate::pools::window_state::load(path);
        let file = crate::pools::window_state::StateFile::new(path.clone(), stats.clone());
        (file, loaded)
    });
    let pools = Pools::start(
        config,
        stats.clone(),
        account,
        connector,
        shutdown.clone(),
        state,
    );
    let publisher = pools.default_publisher();
    if let Some(members) = members {
        tokio::spawn(crate::control::etcd::run(
            publisher.clone(),
            pools.layout(),
            members,
            shutdown.clone(),
        ));
    }
    let topology = publisher.shared();
    let mut doors = vec![Door {
        listener,
        tls: None,
        pool: None,
    }];
    if let Some((listener, acceptor)) = tls_listener {
        doors.push(Door {
            listener: DoorListener::Tcp(listener),
            tls: Some(acceptor),
            pool: None,
        });
    }
    let PoolDoors {
        doors: pool_doors,
        addrs: pool_addrs,
        paths: pool_paths,
    } = pool_doors(&pools)?;
    doors.extend(pool_doors);
    let admin_addr = match admin {
        Some(listener) => {
            let state = AdminState {
                stats: stats.clone(),
                topology: topology.clone(),
                layout: pools.layout(),
            };
            Some(serve_admin(listener, state, &shutdown)?)
        }
        None => None,
    };
    let workers = spawn_workers(config, &pools, &stats, &shutdown)?;
    log_listening(
        config,
        (local_addr, local_path.as_deref()),
        tls_addr,
        &pool_addrs,
        &pool_paths,
    );
    let task = tokio::spawn(accept_loop(doors, workers, clients, shutdown));
    Ok(Running {
        local_addr,
        local_path,
        admin_addr,
        tls_addr,
        tls_acceptor,
        topology,
        publisher,
        pools,
        pool_addrs,
        pool_paths,
        stats,
        task,
    })
}

/// The TLS connector for memring's own connections to memcached, with
/// `backend_tls` set.
fn backend_connector(config: &Config) -> io::Result<Option<Arc<crate::tls::Connector>>> {
    let Some(files) = &config.backend_tls else {
        return Ok(None);
    };
    let connector = crate::tls::Connector::new(files)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("backend_tls: {e}")))?;
    Ok(Some(Arc::new(connector)))
}

/// Serves `/metrics`, `/live` and `/ready` on the admin listener until
/// shutdown; where it listens.
fn serve_admin(
    listener: TcpListener,
    state: AdminState,
    shutdown: &CancellationToken,
) -> io::Result<SocketAddr> {
    let addr = listener.local_addr()?;
    tracing::info!(%addr, "admin listener: /metrics /live /ready");
    tokio::spawn(crate::control::admin::serve(
        listener,
        state,
        shutdown.clone(),
    ));
    Ok(addr)
}

/// One worker per `config.worker_count()`, sharing the byte budget and the
/// hot-key detector (whose monitor starts here too).
fn spawn_workers(
    config: &Config,
    pools: &Pools,
    stats: &Arc<Stats>,
    shutdown: &CancellationToken,
) -> io::Result<Vec<Worker>> {
    let count = config.worker_count();
    let settings = SessionSettings {
        max_pending: config.max_pending_per_client,
        idle_timeout: config.client_idle_timeout,
        write_timeout: config.client_write_timeout,
        client_buffer_bytes: config.max_client_buffer_bytes,
        request_log: config.request_log,
    };
    let hot = crate::hotkeys::HotShared::new(config.hot_keys, count, stats.clone());
    tokio::spawn(crate::hotkeys::monitor(
        hot.clone(),
        pools.layout(),
        pools.published(),
        shutdown.clone(),
    ));
    (0..count)
        .map(|index| {
            worker::spawn(WorkerSetup {
                index,
                layout: pools.layout(),
                stats: stats.clone(),
                shutdown: shutdown.clone(),
                settings,
                budget: (config.max_buffer_bytes / count).max(1),
                grace: config.shutdown_grace,
                published: pools.published(),
                hot: hot.clone(),
            })
        })
        .collect()
}

/// The TLS client listener and its acceptor (watched for new certificate
/// files), with `tls_listen` set.
fn tls_listener(
    config: &Config,
    shutdown: &CancellationToken,
) -> io::Result<Option<(TcpListener, Arc<crate::tls::Acceptor>)>> {
    let Some(tls) = &config.tls_listen else {
        return Ok(None);
    };
    let acceptor = crate::tls::Acceptor::new(&tls.files)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("tls_listen: {e}")))?;
    let listener = listen(tls.addr).map_err(|e| bind_error("tls_listen.addr", &tls.addr, e))?;
    crate::tls::watch(acceptor.clone(), shutdown.clone());
    Ok(Some((listener, acceptor)))
}

/// The pools' own listeners, with the addresses and paths they got.
struct PoolDoors {
    doors: Vec<Door>,
    /// (pool, address) of each TCP listener.
    addrs: Vec<(String, SocketAddr)>,
    /// (pool, path) of each Unix-socket listener.
    paths: Vec<(String, std::path::PathBuf)>,
}

fn pool_doors(pools: &Pools) -> io::Result<PoolDoors> {
    let mut out = PoolDoors {
        doors: Vec::new(),
        addrs: Vec::new(),
        paths: Vec::new(),
    };
    for (pool, addr) in pools.listeners() {
        let setting = format!("listen of pool {}", pool.name());
        let listener = listen_on(&addr).map_err(|e| bind_error(&setting, &addr, e))?;
        match (&listener, addr.unix_path()) {
            (DoorListener::Tcp(listener), _) => {
                out.addrs
                    .push((pool.name().to_string(), listener.local_addr()?));
            }
            (DoorListener::Unix { .. }, Some(path)) => {
                out.paths
                    .push((pool.name().to_string(), path.to_path_buf()));
            }
            (DoorListener::Unix { .. }, None) => {}
        }
        out.doors.push(Door {
            listener,
            tls: None,
            pool: Some(pool.shared()),
        });
    }
    Ok(out)
}

/// One log line per listener, once all are bound.
fn log_listening(
    config: &Config,
    (local_addr, local_path): (SocketAddr, Option<&std::path::Path>),
    tls_addr: Option<SocketAddr>,
    pool_addrs: &[(String, SocketAddr)],
    pool_paths: &[(String, std::path::PathBuf)],
) {
    let (servers, workers) = (config.servers.len(), config.worker_count());
    match local_path {
        None => tracing::info!(%local_addr, servers, workers, "listening"),
        Some(path) => {
            tracing::info!(path = %path.display(), servers, workers, "listening on a Unix socket")
        }
    }
    if let Some(addr) = tls_addr {
        tracing::info!(%addr, "listening for TLS clients");
    }
    for (pool, addr) in pool_addrs {
        tracing::info!(%addr, pool = %pool, "listening for the clients of pool {pool}");
    }
    for (pool, path) in pool_paths {
        tracing::info!(path = %path.display(), pool = %pool, "listening for the clients of pool {pool}");
    }
}

/// Pending connections the kernel may queue before memring accepts them
/// (capped by `net.core.somaxconn`). mio's default of 128 overflowed under
/// bursts of new clients, and each dropped SYN costs that client a second.
const LISTEN_BACKLOG: u32 = 4096;

/// A bind failure that names the setting holding the address, so that
/// "address in use" says which of memring's two ports to change.
fn bind_error(setting: &str, addr: &dyn std::fmt::Display, error: io::Error) -> io::Error {
    io::Error::new(
        error.kind(),
        format!("cannot listen on {addr}, the address of `{setting}`: {error}"),
    )
}

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

/// Binds a client listener: TCP as [`listen`], or a Unix socket (its file
/// made, a stale one replaced, removed when the listener is dropped).
fn listen_on(at: &crate::config::Listen) -> io::Result<DoorListener> {
    match at {
        crate::config::Listen::Tcp(addr) => listen(*addr).map(DoorListener::Tcp),
        crate::config::Listen::Unix { path, mode } => {
            let (listener, file) = crate::listener::bind_unix(path, *mode)?;
            Ok(DoorListener::Unix {
                listener,
                _file: file,
            })
        }
    }
}

/// A door's socket; a Unix socket's file goes when the door closes.
enum DoorListener {
    Tcp(TcpListener),
    /// The file is held only to be removed when the door closes.
    Unix {
        listener: tokio::net::UnixListener,
        _file: crate::listener::SocketFile,
    },
}

impl DoorListener {
    async fn accept(&self) -> io::Result<ClientStream> {
        match self {
            DoorListener::Tcp(listener) => {
                let (stream, _) = listener.accept().await?;
                stream.into_std().map(ClientStream::Tcp)
            }
            DoorListener::Unix { listener, .. } => {
                let (stream, _) = listener.accept().await?;
                stream.into_std().map(ClientStream::Unix)
            }
        }
    }
}

/// A listener and what its clients get: TLS (`tls_listen`), or one pool
/// for every key (a pool's own `listen`).
struct Door {
    listener: DoorListener,
    tls: Option<Arc<crate::tls::Acceptor>>,
    pool: Option<SharedTopology>,
}

/// Accepts clients on every door and hands them to the workers in turn
/// (round robin, so every worker gets the same number of clients), up to the
/// connection limit (which a reload may lower or raise); at shutdown, once
/// no door accepts any more, lets the workers drain.
async fn accept_loop(
    doors: Vec<Door>,
    workers: Vec<Worker>,
    clients: Arc<ClientSlots>,
    shutdown: CancellationToken,
) {
    let (senders, done): (Vec<_>, Vec<_>) =
        workers.into_iter().map(|w| (w.clients, w.done)).unzip();
    let senders: Arc<[_]> = senders.into();
    let next_id = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut doors_open = tokio::task::JoinSet::new();
    for door in doors {
        doors_open.spawn(accept_from(
            door,
            senders.clone(),
            next_id.clone(),
            clients.clone(),
            shutdown.clone(),
        ));
    }
    while doors_open.join_next().await.is_some() {}
    tracing::info!("shutting down: draining client sessions");
    // Closing the channels tells the workers to drain.
    drop(senders);
    for worker in done {
        let _ = worker.await;
    }
}

/// One door's accept loop, until shutdown.
async fn accept_from(
    door: Door,
    workers: Arc<[tokio::sync::mpsc::UnboundedSender<Accepted>]>,
    next_id: Arc<std::sync::atomic::AtomicU64>,
    clients: Arc<ClientSlots>,
    shutdown: CancellationToken,
) {
    let mut accept_failing = false;
    loop {
        // Take a slot before accepting: past the limit, new connections wait in
        // the listen backlog while existing ones keep working.
        let permit = tokio::select! {
            permit = clients.acquire() => permit,
            () = shutdown.cancelled() => break,
        };
        let accepted = tokio::select! {
            accepted = door.listener.accept() => accepted,
            () = shutdown.cancelled() => break,
        };
        let stream = match accepted {
            Ok(stream) => {
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
        let id = next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let worker = &workers[(id % workers.len() as u64) as usize];
        let _ = worker.send(Accepted {
            stream,
            id,
            permit,
            // The TLS config in force when the client came.
            tls: door.tls.as_ref().map(|acceptor| acceptor.current()),
            pool: door.pool.clone(),
        });
    }
}
