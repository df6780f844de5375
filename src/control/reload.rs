//! Live reconfiguration: watch the config file's directory (and SIGHUP), debounce
//! bursts of events into one reload, validate the new file completely, and
//! publish the new topology with one arc-swap store.
//!
//! The directory is watched rather than the file because files are replaced in
//! several ways: written in place, written to a temporary file and renamed over
//! the original, or (Kubernetes ConfigMaps) swapped through a `..data` symlink.
//! When the config is a symlink, the directory of the file it resolves to is
//! watched too. Only events that name the config file, a link on its way, or
//! the file it resolves to lead to a re-read: a log file written in the same
//! directory must not make memring re-read (and log) in a loop.
//!
//! Each outcome is logged once: the same unreadable or invalid file is not
//! reported again until the file changes to something else.

pub use super::settings::{restart_only_changes, setting_changes, SettingChange};
use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::control::fd_budget::FdShortage;
use crate::control::newcomers::flush_newcomers;
use crate::control::pool_set::{Applied, Pools};
use crate::control::publisher::Published;
use crate::error::ConfigError;
use crate::pools::topology::Change;

/// Quiet time after the last event before reloading: an editor's save is
/// several events, and a half-written file must not be read.
const DEBOUNCE: Duration = Duration::from_millis(80);
/// Longest a steady stream of events can postpone a reload.
const MAX_DEBOUNCE: Duration = Duration::from_millis(400);

/// What one reload did.
#[derive(Debug, Clone, PartialEq)]
// One per reload, moved once: its size does not matter.
#[allow(clippy::large_enum_variant)]
pub enum Outcome {
    /// The file is what was seen last time (same text, or the same error):
    /// it has been dealt with and logged already.
    Unchanged,
    /// A new topology was published.
    Applied {
        version: u64,
        change: Change,
        /// Every setting that changed, with its old and new value.
        settings: Vec<SettingChange>,
        /// The client limit, when the new ring changed it: (before, after).
        client_limit: Option<(usize, usize)>,
        /// A line for each other pool added, removed or changed.
        pools: Vec<String>,
    },
    /// The file is valid but its ring does not fit in the open file limit
    /// next to the clients connected; the old config stays.
    Refused(FdShortage),
}

/// What the file held at the last reload.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Text(String),
    /// It could not be read, for this reason.
    ReadError(String),
}

/// Re-reads one config file and publishes what it says.
pub struct Reloader {
    path: PathBuf,
    pools: Arc<Pools>,
    /// The config the running topology was built from.
    current: Config,
    /// The config the process was started with (for restart-only settings).
    started: Config,
    /// What the file held at the last reload, applied or rejected.
    last_seen: Option<Seen>,
}

impl Reloader {
    pub fn new(path: PathBuf, started: Config, pools: Arc<Pools>) -> Reloader {
        Reloader {
            path,
            pools,
            current: started.clone(),
            started,
            last_seen: None,
        }
    }

    /// Reads, validates and applies the file once. Must run inside a tokio
    /// runtime (new servers get connection tasks).
    ///
    /// # Errors
    /// The file is unreadable or invalid; nothing changed. The same error
    /// twice in a row is returned once, then [`Outcome::Unchanged`].
    pub fn reload(&mut self) -> Result<Outcome, ConfigError> {
        let shown = self.path.display().to_string();
        let Some(config) = self.parse_new_text(&shown)? else {
            return Ok(Outcome::Unchanged);
        };
        let config = self.with_discovered_servers(config, &shown)?;
        if config == self.current {
            return Ok(Outcome::Unchanged);
        }
        let mut settings = setting_changes(&self.current, &config);
        // A restart-only setting keeps the value the process started with, so
        // it is reported against that, also after several reloads.
        settings.retain(|s| !s.restart_only);
        settings.extend(
            setting_changes(&self.started, &config)
                .into_iter()
                .filter(|s| s.restart_only),
        );
        if let Some(publisher) = self.pools.publisher(&config.default_pool) {
            flush_newcomers(&publisher.shared().load(), &config);
        }
        // A shadow that is to serve keys it lacks writes of may hold older
        // values than its primary, or keys the primary deleted: it is
        // flushed first, and the reload refused if it cannot be.
        let promoted: Vec<_> = self
            .pools
            .promotions(&config)
            .into_iter()
            .filter(|p| !p.complete())
            .collect();
        let lost_when_flushed: Vec<u64> = promoted.iter().map(|p| p.lost_writes()).collect();
        // (pool, why it is flushed)
        let flushes: Vec<(String, String)> = promoted
            .iter()
            .zip(&lost_when_flushed)
            .map(|(promotion, &lost)| {
                let why = format!(
                    "serves keys of pool {} from now on and lacks writes as its shadow ({})",
                    promotion.primary,
                    promotion_losses(promotion, lost),
                );
                (promotion.shadow.to_string(), why)
            })
            .collect();
        // Keys that change pool (a route added or removed, `default_pool`
        // changed) may find older values of theirs in the pool they go to,
        // left from when it served them before: they are deleted from it
        // first (its other keys keep their values), unless it is the
        // complete shadow of the pool they leave, or flushed above.
        let entering = self.pools_entering(&config, &flushes);
        self.clear_before_moves(&shown, &config, &flushes, &entering)?;
        // Unchanged servers keep their backends and open connections.
        let limit_before = self.pools.default_publisher().client_limit();
        let Applied {
            default: Published { version, change },
            others,
        } = match self.pools.apply(&config) {
            Ok(applied) => applied,
            Err(shortage) => {
                // Tried again on the next event even with the same text: the
                // clients that were in the way may have left.
                self.last_seen = None;
                return Ok(Outcome::Refused(shortage));
            }
        };
        for (promotion, lost) in promoted.iter().zip(lost_when_flushed) {
            // A copy shed between the flush and the swap: flushed again.
            if promotion.lost_writes() != lost {
                let flushed = self.pools.flush_for(&promotion.shadow, &config);
                tracing::warn!(
                    "pool {}: lost more writes of pool {} while it was switched: flushed again ({flushed:?})",
                    promotion.shadow,
                    promotion.primary,
                );
            }
        }
        let client_limit = limit_before
            .zip(self.pools.default_publisher().client_limit())
            .filter(|(before, after)| before != after);
        self.current = config;
        Ok(Outcome::Applied {
            version,
            change,
            settings,
            client_limit,
            pools: others,
        })
    }

    /// The file's config, parsed, or `None` when it holds what the last
    /// reload saw (good or bad).
    fn parse_new_text(&mut self, shown: &str) -> Result<Option<Config>, ConfigError> {
        // A regular file within the cap, or an error at once: a FIFO in its
        // place must not stop this and every later reload.
        let read = crate::inputs::regular_file::read_to_string(
            &self.path,
            crate::inputs::regular_file::MAX_CONFIG_FILE_BYTES,
        );
        let text = match read {
            Ok(text) => text,
            Err(source) => {
                let seen = Seen::ReadError(source.to_string());
                if self.last_seen.as_ref() == Some(&seen) {
                    return Ok(None);
                }
                self.last_seen = Some(seen);
                return Err(ConfigError::Read {
                    path: shown.to_string(),
                    source,
                });
            }
        };
        // The same text (good or bad) has been dealt with already.
        let seen = Seen::Text(text);
        if self.last_seen.as_ref() == Some(&seen) {
            return Ok(None);
        }
        let Seen::Text(text) = self.last_seen.insert(seen) else {
            unreachable!("just stored a text")
        };
        let mut config = Config::parse_and_resolve(text, shown)?.with_zone_from_env(shown)?;
        // Started with the default state file (the binary), the file's
        // silence means that default again.
        if self.started.state_file.is_some() {
            config = config.with_default_state_file(&self.path);
        }
        Ok(Some(config))
    }

    /// `config` with the servers DNS discovers (the records in force keep
    /// the list in force; other records are asked now) and etcd's members
    /// beside the file's.
    fn with_discovered_servers(
        &self,
        mut config: Config,
        shown: &str,
    ) -> Result<Config, ConfigError> {
        if let Some(source) = &config.discovery.source {
            // The file lists no servers: DNS does. The same records keep the
            // list in force; other records are asked now.
            let running = self
                .pools
                .publisher(crate::config::DEFAULT_POOL)
                .map(|p| p.shared().load().config.clone());
            let found = match running {
                Some(running)
                    if running.discovery.source == config.discovery.source
                        && running.discovery.dns == config.discovery.dns
                        && !running.servers.is_empty() =>
                {
                    running.servers.clone()
                }
                _ => crate::control::discovery::servers_blocking(
                    source,
                    config.discovery.dns,
                    config.discovery.tls,
                )
                .map_err(|e| ConfigError::Discovery {
                    path: shown.to_string(),
                    message: format!("{source}: {e}"),
                })?,
            };
            config = config.with_servers(found);
        }
        if config.discovery.etcd.is_some() {
            // etcd's members stay beside the file's servers.
            if let Some(publisher) = self.pools.publisher(crate::config::DEFAULT_POOL) {
                let mut servers = config.servers.clone();
                for member in publisher.store_servers() {
                    if !servers.iter().any(|s| s.name == member.name) {
                        servers.push(member);
                    }
                }
                config = config.with_servers(servers);
            }
        }
        Ok(config)
    }

    /// The pools that take keys of other pools under `config`, each with
    /// the pools it takes them from. A pool flushed first (`flushes`) is
    /// left out; a complete shadow of the pool it takes from is exempt.
    fn pools_entering(&self, config: &Config, flushes: &[(String, String)]) -> Vec<Entering> {
        let complete = self.pools.promotions(config);
        let mut entering: Vec<Entering> = Vec::new();
        for (from, to) in self.pools.moves(config) {
            if flushes.iter().any(|(pool, _)| *pool == to) {
                continue;
            }
            let shadowed = complete
                .iter()
                .any(|p| *p.primary == *from && *p.shadow == to && p.complete());
            let at = match entering.iter().position(|e| e.pool == to) {
                Some(at) => at,
                None => {
                    entering.push(Entering {
                        pool: to,
                        taken: Vec::new(),
                        exempt: Vec::new(),
                    });
                    entering.len() - 1
                }
            };
            let entry = &mut entering[at];
            if shadowed {
                entry.exempt.push(from);
            } else {
                entry.taken.push(from);
            }
        }
        entering
    }

    /// Flushes the pools in `flushes` and deletes, from each pool in
    /// `entering`, the keys it takes from others: so no pool serves a value
    /// older than its new keys' current ones. Refused if either fails.
    fn clear_before_moves(
        &mut self,
        shown: &str,
        config: &Config,
        flushes: &[(String, String)],
        entering: &[Entering],
    ) -> Result<(), ConfigError> {
        for (pool, why) in flushes {
            if let Err(e) = self.pools.flush_for(pool, config) {
                // Tried again on the next event, as for a shortage.
                self.last_seen = None;
                return Err(ConfigError::Refused {
                    path: shown.to_string(),
                    message: format!("pool {pool} {why}, and could not be flushed first: {e}"),
                });
            }
            tracing::warn!("pool {pool}: {why}: flushed first, so it holds no older value");
        }
        for Entering {
            pool,
            taken,
            exempt,
        } in entering.iter().filter(|e| !e.taken.is_empty())
        {
            let from = taken.join(", pool ");
            match self.pools.delete_moved_into(pool, config, exempt) {
                Ok(deleted) => tracing::warn!(
                    "pool {pool}: takes keys of pool {from} from now on, and may hold older values of them from before: deleted {deleted} of them first, so it holds no older value"
                ),
                Err(e) => {
                    self.last_seen = None;
                    return Err(ConfigError::Refused {
                        path: shown.to_string(),
                        message: format!(
                            "pool {pool} takes keys of pool {from} from now on, and may hold older values of them from before; they could not be deleted first (lru_crawler metadump, memcached 1.4.31 and later): {e}"
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    /// Reloads and logs the result in one line (two when a restart is needed).
    pub fn reload_and_log(&mut self) {
        let outcome = self.reload();
        match &outcome {
            Ok(Outcome::Applied { .. }) => self.pools.default_publisher().stats().reload(true),
            Err(_) | Ok(Outcome::Refused(_)) => {
                self.pools.default_publisher().stats().reload(false)
            }
            Ok(Outcome::Unchanged) => {}
        }
        match outcome {
            Ok(Outcome::Unchanged) => {
                tracing::debug!(path = %self.path.display(), "config unchanged")
            }
            Ok(Outcome::Refused(shortage)) => {
                tracing::error!("reload refused: {shortage}; still serving the previous config")
            }
            Ok(Outcome::Applied {
                version,
                change,
                settings,
                client_limit,
                pools,
            }) => {
                for line in pools.iter() {
                    tracing::info!("{line}");
                }
                let (restart, live): (Vec<_>, Vec<_>) =
                    settings.iter().partition(|s| s.restart_only);
                if live.is_empty() {
                    tracing::info!("ring v{version}: {change}");
                } else {
                    tracing::info!("ring v{version}: {change}; {}", join(&live));
                }
                if !restart.is_empty() {
                    tracing::warn!(
                        "restart needed: {} (read only at start; the running value stays until memring restarts)",
                        join(&restart)
                    );
                }
                match client_limit {
                    Some((before, after)) if after < before => tracing::warn!(
                        "client limit {before} -> {after}: new clients wait so that the ring's backend connections fit in the open file limit"
                    ),
                    Some((before, after)) => tracing::info!("client limit {before} -> {after}"),
                    None => {}
                }
                for warning in self.current.warnings() {
                    tracing::warn!("{}: {warning}", self.path.display());
                }
            }
            Err(error) => {
                tracing::error!("reload rejected, still serving the previous config: {error}")
            }
        }
    }
}

fn join(changes: &[&SettingChange]) -> String {
    changes
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Which event paths concern the config file. Shared between the watcher's
/// thread (which reads it per event) and the reload task (which updates it
/// when the config's symlinks change).
#[derive(Debug, Default)]
struct Interest {
    /// Names in the config's directory that matter: the file's own, and the
    /// first link of a relative symlink target (`..data` in Kubernetes).
    names: Vec<OsString>,
    /// The file the config resolves to, when that is elsewhere.
    target: Option<PathBuf>,
}

impl Interest {
    fn of(path: &Path) -> Interest {
        let mut names: Vec<OsString> = path.file_name().map(OsString::from).into_iter().collect();
        if let Ok(link) = std::fs::read_link(path) {
            let first = link.components().find_map(|c| match c {
                Component::Normal(name) => Some(name.to_os_string()),
                _ => None,
            });
            if link.is_relative() {
                names.extend(first);
            }
            if let Some(name) = link.file_name() {
                names.push(name.to_os_string());
            }
        }
        Interest {
            names,
            target: std::fs::canonicalize(path).ok(),
        }
    }

    /// Whether an event about `paths` can have changed the config. An event
    /// that names no path (a rescan) might have.
    fn concerns(&self, paths: &[PathBuf]) -> bool {
        paths.is_empty()
            || paths.iter().any(|p| {
                self.target.as_deref() == Some(p.as_path())
                    || p.file_name()
                        .is_some_and(|name| self.names.iter().any(|n| n == name))
            })
    }
}

/// The directory watcher, and what it watches besides the config's directory.
struct Watch {
    watcher: notify::RecommendedWatcher,
    interest: Arc<Mutex<Interest>>,
    /// The canonical config directory, watched from the start.
    directory: Option<PathBuf>,
    /// The directory of the symlink target, when it is another one.
    target_directory: Option<PathBuf>,
}

impl Watch {
    /// Re-reads the config's symlinks and watches the directory of the file
    /// they lead to. Called before every reload, so that an edit made right
    /// after a symlink swap is seen.
    fn refresh(&mut self, path: &Path) {
        use notify::{RecursiveMode, Watcher};
        let interest = Interest::of(path);
        let wanted = interest
            .target
            .as_deref()
            .and_then(Path::parent)
            .filter(|dir| Some(*dir) != self.directory.as_deref())
            .map(Path::to_path_buf);
        *self.interest.lock().expect("no panic while holding it") = interest;
        if wanted == self.target_directory {
            return;
        }
        if let Some(old) = self.target_directory.take() {
            // Gone already when the old target directory was deleted.
            let _ = self.watcher.unwatch(&old);
        }
        if let Some(dir) = wanted {
            match self.watcher.watch(&dir, RecursiveMode::NonRecursive) {
                Ok(()) => self.target_directory = Some(dir),
                Err(e) => tracing::debug!("cannot watch {}: {e}", dir.display()),
            }
        }
    }
}

/// A pool a reload sends keys to from other pools.
struct Entering {
    pool: String,
    /// The pools it takes keys from, whose keys it may hold older values of.
    taken: Vec<Arc<str>>,
    /// The pools it takes keys from as their complete shadow: it holds
    /// their current values already.
    exempt: Vec<Arc<str>>,
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
    let mut watch = match watch(&reloader.path, events) {
        Ok(watch) => {
            tracing::info!(path = %reloader.path.display(), "watching config for changes");
            Some(watch)
        }
        Err(e) => {
            tracing::error!(
                "cannot watch {} for changes ({e}); reload with SIGHUP",
                reloader.path.display()
            );
            None
        }
    };
    if let Some(watch) = watch.as_mut() {
        watch.refresh(&reloader.path);
    }
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                Some(()) = receiver.recv() => {
                    debounce(&mut receiver).await;
                }
                Some(()) = async {
                    match hangup.as_mut() {
                        Some(signal) => signal.recv().await,
                        None => std::future::pending().await,
                    }
                } => {
                    tracing::info!("SIGHUP: reloading config");
                    // A SIGHUP re-reads even an unchanged or failing file.
                    reloader.last_seen = None;
                }
            }
            if let Some(watch) = watch.as_mut() {
                watch.refresh(&reloader.path);
            }
            // A reload reads files and flushes joining servers with blocking
            // calls: off the control plane's one thread, so accepting clients
            // and serving /metrics go on meanwhile.
            let (done, reloaded) = tokio::sync::oneshot::channel();
            let runtime = tokio::runtime::Handle::current();
            let started = std::thread::Builder::new()
                .name("memring-reload".into())
                .spawn(move || {
                    // Inside the runtime's context: a reload spawns the
                    // hand-off window's tasks.
                    let _context = runtime.enter();
                    reloader.reload_and_log();
                    let _ = done.send(reloader);
                });
            if let Err(e) = started {
                tracing::error!(
                    "cannot start a thread to reload the config ({e}); config reloads stop"
                );
                return;
            }
            reloader = match reloaded.await {
                Ok(reloader) => reloader,
                Err(_) => {
                    tracing::error!("the config reload failed; config reloads stop");
                    return;
                }
            };
        }
    })
}

fn watch(path: &Path, events: mpsc::Sender<()>) -> notify::Result<Watch> {
    use notify::{EventKind, RecursiveMode, Watcher};
    let interest = Arc::new(Mutex::new(Interest::of(path)));
    let shared = interest.clone();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let relevant = match event {
            Ok(event) => {
                !matches!(event.kind, EventKind::Access(_))
                    && shared
                        .lock()
                        .expect("no panic while holding it")
                        .concerns(&event.paths)
            }
            // A watcher error (e.g. an overflowed queue) may hide a change.
            Err(_) => true,
        };
        if relevant {
            // A full channel already holds a pending wake-up.
            let _ = events.try_send(());
        }
    })?;
    let directory = watched_directory(path);
    watcher.watch(&directory, RecursiveMode::NonRecursive)?;
    Ok(Watch {
        watcher,
        interest,
        directory: std::fs::canonicalize(&directory).ok(),
        target_directory: None,
    })
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

/// What a promoted shadow lacks, for the log and the refusal.
fn promotion_losses(promotion: &crate::pools::layout::Promotion, lost: u64) -> String {
    if promotion.fraction < 1.0 {
        format!(
            "{lost} writes lost, and fraction {} leaves keys out",
            promotion.fraction
        )
    } else {
        format!("{lost} writes shed, failed or flushed on the primary only")
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
    fn a_shadow_that_comes_or_changes_is_a_setting_applied_on_reload() {
        let text = "listen = \"127.0.0.1:1\"\n[[servers]]\naddr = \"127.0.0.1:2\"\n[[pools]]\nname = \"next\"\n[[pools.servers]]\naddr = \"127.0.0.1:3\"\n";
        let plain = Config::parse(text, "a").unwrap();
        let with = |fraction: &str| {
            let shadow = format!("[shadow]\npool = \"next\"\nfraction = {fraction}\n[[pools]]");
            Config::parse(&text.replacen("[[pools]]", &shadow, 1), "a").unwrap()
        };
        let lines = |old: &Config, new: &Config| -> Vec<String> {
            setting_changes(old, new)
                .iter()
                .map(ToString::to_string)
                .collect()
        };
        assert_eq!(
            lines(&plain, &with("0.1")),
            ["shadow (none) -> default->next 0.1"]
        );
        assert_eq!(
            lines(&with("0.1"), &with("0.5")),
            ["shadow default->next 0.1 -> default->next 0.5"]
        );
        assert!(restart_only_changes(&plain, &with("1.0")).is_empty());
    }

    #[test]
    fn setting_changes_name_old_and_new_values_in_file_units() {
        let text = "listen = \"127.0.0.1:1\"\n[[servers]]\naddr = \"127.0.0.1:2\"\n";
        let old = Config::parse(text, "a").unwrap();
        let new = Config::parse(
            &format!("request_timeout_ms = 2500\nadmin_listen = \"127.0.0.1:9\"\nauto_eject = true\n{text}"),
            "a",
        )
        .unwrap();
        let shown: Vec<String> = setting_changes(&old, &new)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            shown,
            [
                "admin_listen (off) -> 127.0.0.1:9",
                "request_timeout_ms 1000 -> 2500",
                "auto_eject false -> true"
            ]
        );
        assert!(setting_changes(&old, &old).is_empty());
    }

    #[test]
    fn a_change_of_ejection_timing_is_shown_and_applied_live() {
        let text = "listen = \"127.0.0.1:1\"\n[[servers]]\naddr = \"127.0.0.1:2\"\n";
        let old = Config::parse(text, "a").unwrap();
        let new = Config::parse(
            &format!("ejection = \"twemproxy\"\nretry_timeout_ms = 3000\n{text}"),
            "a",
        )
        .unwrap();
        let changes = setting_changes(&old, &new);
        let shown: Vec<String> = changes.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "failure_limit 3 -> 2",
                "ejection memring -> twemproxy",
                "retry_timeout_ms (memring ejection) -> 3000"
            ]
        );
        assert!(changes.iter().all(|c| !c.restart_only));
    }

    #[test]
    fn every_setting_is_documented_in_the_example_with_its_reload_behaviour() {
        let base = "listen = \"127.0.0.1:1\"\n[[servers]]\naddr = \"127.0.0.1:2\"\n[[servers]]\naddr = \"127.0.0.1:4\"\n";
        let changed = "listen = \"127.0.0.1:3\"\nadmin_listen = \"127.0.0.1:5\"\n\
            connections_per_server = 3\nconnect_timeout_ms = 501\nrequest_timeout_ms = 1001\n\
            max_value_bytes = 2000\nmax_client_connections = 5\nmax_pending_per_client = 7\n\
            shutdown_grace_ms = 1\nauto_eject = true\nfailure_limit = 4\n\
            client_idle_timeout_ms = 9\nreplicas = 2\nread_miss_fallthrough = true\n\
            workers = 3\nmax_client_buffer_bytes = 70000\nmax_buffer_bytes = 2000000\n\
            client_write_timeout_ms = 11\n";
        let old = Config::parse(base, "a").unwrap();
        let new = Config::parse(
            &format!("{changed}{}", &base[base.find('\n').unwrap() + 1..]),
            "a",
        )
        .unwrap();
        let changes = setting_changes(&old, &new);
        assert_eq!(changes.len(), 18, "every setting differs: {changes:?}");
        // config/memring.toml describes each setting in the comment block
        // above it, ending in "Restart." or "Live".
        let example = include_str!("../../config/memring.toml");
        for change in &changes {
            let at = example
                .lines()
                .position(|l| {
                    l.trim_start_matches("# ")
                        .starts_with(&format!("{} = ", change.name))
                })
                .unwrap_or_else(|| panic!("{} is not in config/memring.toml", change.name));
            let block: Vec<&str> = example.lines().take(at).collect();
            let start = block
                .iter()
                .rposition(|l| l.trim().is_empty())
                .map_or(0, |i| i + 1);
            let comment = block[start..].join(" ");
            assert_eq!(
                comment.contains("Restart."),
                change.restart_only,
                "{}: the example says `{comment}`",
                change.name
            );
        }
    }

    #[test]
    fn only_the_config_its_links_and_its_target_concern_the_reloader() {
        let dir = std::env::temp_dir().join(format!("memring-interest-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("..2026_01")).unwrap();
        std::fs::write(dir.join("..2026_01/memring.toml"), "x").unwrap();
        std::os::unix::fs::symlink("..2026_01", dir.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/memring.toml", dir.join("memring.toml")).unwrap();
        let interest = Interest::of(&dir.join("memring.toml"));
        let target = std::fs::canonicalize(dir.join("..2026_01/memring.toml")).unwrap();
        assert!(interest.concerns(&[dir.join("memring.toml")]));
        assert!(interest.concerns(&[dir.join("..data")]));
        assert!(interest.concerns(&[target]));
        assert!(interest.concerns(&[]));
        assert!(!interest.concerns(&[dir.join("memring.log")]));
        assert!(!interest.concerns(&[dir.join("..2026_01")]));
        let _ = std::fs::remove_dir_all(&dir);
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
