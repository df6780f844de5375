//! Live reconfiguration: watch the config file's directory (and SIGHUP), debounce
//! bursts of events into one reload, validate the new file completely, and
//! publish the new topology with one arc-swap store.
//!
//! The directory is watched rather than the file because files are replaced in
//! several ways: written in place, written to a temporary file and renamed over
//! the original, or (Kubernetes ConfigMaps) swapped through a `..data` symlink.
//! Every event in the directory leads to a re-read; an unchanged file is ignored.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::error::ConfigError;
use crate::pool::{Published, Publisher};
use crate::topology::Change;

/// Quiet time after the last event before reloading: an editor's save is
/// several events, and a half-written file must not be read.
const DEBOUNCE: Duration = Duration::from_millis(80);
/// Longest a steady stream of events can postpone a reload.
const MAX_DEBOUNCE: Duration = Duration::from_millis(400);

/// What one reload did.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The file's settings are the ones already running.
    Unchanged,
    /// A new topology was published.
    Applied {
        version: u64,
        change: Change,
        /// Settings that changed in the file but only take effect on restart.
        needs_restart: Vec<&'static str>,
    },
}

/// Re-reads one config file and publishes what it says.
pub struct Reloader {
    path: PathBuf,
    publisher: Arc<Publisher>,
    /// The config the running topology was built from.
    current: Config,
    /// The config the process was started with (for restart-only settings).
    started: Config,
    /// The file's text at the last reload, applied or rejected.
    last_text: Option<String>,
}

impl Reloader {
    pub fn new(path: PathBuf, started: Config, publisher: Arc<Publisher>) -> Reloader {
        Reloader {
            path,
            publisher,
            current: started.clone(),
            started,
            last_text: None,
        }
    }

    /// Reads, validates and applies the file once. Must run inside a tokio
    /// runtime (new servers get connection tasks).
    ///
    /// # Errors
    /// The file is unreadable or invalid; nothing changed.
    pub fn reload(&mut self) -> Result<Outcome, ConfigError> {
        let shown = self.path.display().to_string();
        let text = std::fs::read_to_string(&self.path).map_err(|source| ConfigError::Read {
            path: shown.clone(),
            source,
        })?;
        // Events for other files in the directory re-read this one: the same
        // text (good or bad) has been dealt with already and is not logged again.
        if self.last_text.as_deref() == Some(text.as_str()) {
            return Ok(Outcome::Unchanged);
        }
        self.last_text = Some(text.clone());
        let config = Config::parse(&text, &shown)?;
        if config == self.current {
            return Ok(Outcome::Unchanged);
        }
        let needs_restart = restart_only_changes(&self.started, &config);
        // Unchanged servers keep their backends and open connections.
        let Published { version, change } = self.publisher.apply_config(config.clone());
        self.current = config;
        Ok(Outcome::Applied {
            version,
            change,
            needs_restart,
        })
    }

    /// Reloads and logs the result in one line.
    pub fn reload_and_log(&mut self) {
        let outcome = self.reload();
        match &outcome {
            Ok(Outcome::Applied { .. }) => self.publisher.stats().reload(true),
            Err(_) => self.publisher.stats().reload(false),
            Ok(Outcome::Unchanged) => {}
        }
        match outcome {
            Ok(Outcome::Unchanged) => {
                tracing::debug!(path = %self.path.display(), "config unchanged")
            }
            Ok(Outcome::Applied {
                version,
                change,
                needs_restart,
            }) => {
                tracing::info!("ring v{version}: {change}");
                if !needs_restart.is_empty() {
                    tracing::warn!(
                        "config changes need a restart to take effect: {}",
                        needs_restart.join(", ")
                    );
                }
            }
            Err(error) => {
                tracing::error!("reload rejected, still serving the previous config: {error}")
            }
        }
    }
}

/// Settings read once at startup.
fn restart_only_changes(started: &Config, new: &Config) -> Vec<&'static str> {
    let mut changed = Vec::new();
    if started.listen != new.listen {
        changed.push("listen");
    }
    if started.max_client_connections != new.max_client_connections {
        changed.push("max_client_connections");
    }
    if started.max_pending_per_client != new.max_pending_per_client {
        changed.push("max_pending_per_client");
    }
    if started.shutdown_grace != new.shutdown_grace {
        changed.push("shutdown_grace_ms");
    }
    if started.admin_listen != new.admin_listen {
        changed.push("admin_listen");
    }
    if started.client_idle_timeout != new.client_idle_timeout {
        changed.push("client_idle_timeout_ms");
    }
    changed
}

/// Starts watching `reloader`'s file until `shutdown`, and reloads on SIGHUP.
/// If the directory cannot be watched (say, the inotify limit is reached), the
/// error is logged and SIGHUP still reloads.
pub fn spawn(mut reloader: Reloader, shutdown: CancellationToken) -> JoinHandle<()> {
    // Installed before anything else so that SIGHUP never kills the process.
    let mut hangup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(signal) => Some(signal),
        Err(e) => {
            tracing::warn!("cannot watch SIGHUP: {e}");
            None
        }
    };
    let (events, mut receiver) = mpsc::channel::<()>(64);
    let watcher = match watch(&reloader.path, events) {
        Ok(watcher) => {
            tracing::info!(path = %reloader.path.display(), "watching config for changes");
            Some(watcher)
        }
        Err(e) => {
            tracing::error!(
                "cannot watch {} for changes ({e}); reload with SIGHUP",
                reloader.path.display()
            );
            None
        }
    };
    tokio::spawn(async move {
        // The watcher stops when dropped; it lives as long as this task.
        let _watcher = watcher;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                Some(()) = receiver.recv() => {
                    debounce(&mut receiver).await;
                    reloader.reload_and_log();
                }
                Some(()) = async {
                    match hangup.as_mut() {
                        Some(signal) => signal.recv().await,
                        None => std::future::pending().await,
                    }
                } => {
                    tracing::info!("SIGHUP: reloading config");
                    reloader.reload_and_log();
                }
            }
        }
    })
}

fn watch(path: &Path, events: mpsc::Sender<()>) -> notify::Result<notify::RecommendedWatcher> {
    use notify::{EventKind, RecursiveMode, Watcher};
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let relevant = match event {
            Ok(event) => !matches!(event.kind, EventKind::Access(_)),
            // A watcher error (e.g. an overflowed queue) may hide a change.
            Err(_) => true,
        };
        if relevant {
            // A full channel already holds a pending wake-up.
            let _ = events.try_send(());
        }
    })?;
    watcher.watch(&watched_directory(path), RecursiveMode::NonRecursive)?;
    Ok(watcher)
}

/// Waits until events stop for `DEBOUNCE`, or `MAX_DEBOUNCE` has passed.
async fn debounce(receiver: &mut mpsc::Receiver<()>) {
    let give_up = tokio::time::Instant::now() + MAX_DEBOUNCE;
    loop {
        let quiet_until = (tokio::time::Instant::now() + DEBOUNCE).min(give_up);
        match tokio::time::timeout_at(quiet_until, receiver.recv()).await {
            Ok(Some(())) if tokio::time::Instant::now() < give_up => continue,
            _ => return,
        }
    }
}

fn watched_directory(path: &Path) -> PathBuf {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_and_limits_read_at_start_need_a_restart() {
        let text = "listen = \"127.0.0.1:1\"\n[[servers]]\naddr = \"127.0.0.1:2\"\n";
        let started = Config::parse(text, "a").unwrap();
        let moved = Config::parse(&text.replace("127.0.0.1:1", "127.0.0.1:3"), "a").unwrap();
        assert_eq!(restart_only_changes(&started, &moved), vec!["listen"]);
        let more = Config::parse(&format!("max_client_connections = 5\n{text}"), "a").unwrap();
        assert_eq!(
            restart_only_changes(&started, &more),
            vec!["max_client_connections"]
        );
        assert!(restart_only_changes(&started, &started).is_empty());
    }

    #[test]
    fn a_bare_file_name_is_watched_in_the_current_directory() {
        assert_eq!(
            watched_directory(Path::new("memring.toml")),
            PathBuf::from(".")
        );
        assert_eq!(
            watched_directory(Path::new("/etc/memring/m.toml")),
            PathBuf::from("/etc/memring")
        );
    }
}
