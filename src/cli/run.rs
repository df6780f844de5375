//! `memring --config FILE`: run the proxy in the foreground until SIGINT or
//! SIGTERM, following edits to the file.

use std::path::Path;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use memring::config::Config;
use memring::control::fd_budget::FdBudget;
use memring::control::reload::Reloader;

pub(crate) fn run(path: &Path) -> anyhow::Result<()> {
    let config = Config::load(path)?.with_default_state_file(path);
    for warning in config.warnings() {
        tracing::warn!("{}: {warning}", path.display());
    }
    // Every client and backend connection is a file descriptor; the default
    // soft limit (often 1024) is far below max_client_connections.
    let nofile = match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => Some(limit),
        Err(e) => {
            tracing::warn!("cannot raise the open file limit: {e}");
            rlimit::getrlimit(rlimit::Resource::NOFILE)
                .ok()
                .map(|(soft, _)| soft)
        }
    };
    let fds = nofile.map(|nofile| FdBudget::of(&config, nofile));
    if let Some(budget) = fds {
        let backends = budget.config_backend_fds(&config);
        let reserved = budget.fixed + backends;
        let clients = budget.client_limit(config.max_client_connections, backends);
        if clients < config.max_client_connections {
            tracing::warn!(
                "open file limit {} is below max_client_connections {} + {reserved} for backends ({backends}), the admin listener and memring itself; serving at most {clients} clients at once (raise the limit: ulimit -n, LimitNOFILE=, or lower max_client_connections)",
                budget.nofile,
                config.max_client_connections,
            );
        } else {
            tracing::debug!(
                "open file limit {}: room for {clients} clients and {reserved} other descriptors",
                budget.nofile
            );
        }
    }
    // The control plane (accept, reloads, health, /metrics) is light: one
    // thread of its own, so it never competes with the workers for cores.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    runtime.block_on(async {
        let stop = shutdown_signal().context("cannot watch SIGTERM and SIGINT")?;
        // Taking over SIGHUP now (tokio keeps it for the process lifetime)
        // means an early SIGHUP is ignored rather than fatal; the reload task
        // listens for it once it runs.
        let _early_hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .context("cannot watch SIGHUP")?;
        let shutdown = CancellationToken::new();
        let running = memring::server::start_within(&config, fds, shutdown.clone())
            .await
            .context("cannot start")?;
        tracing::info!(
            version = memring::VERSION,
            commit = env!("MEMRING_GIT_COMMIT"),
            config = %path.display(),
            "memring started"
        );
        let reloader = Reloader::new(path.to_path_buf(), config.clone(), running.pools.clone());
        memring::control::reload::spawn(reloader, shutdown.clone());
        stop.await;
        tracing::info!("shutdown requested");
        shutdown.cancel();
        running.wait().await;
        tracing::info!("stopped");
        Ok(())
    })
}

/// SIGINT or SIGTERM, as one future. The handlers are installed when this is
/// called, not when it is first polled, so call it before announcing readiness:
/// a SIGTERM that arrives early must still mean a clean shutdown.
fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
    })
}
