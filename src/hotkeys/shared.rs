//! What every worker shares: the settings (as at start, and as the last
//! reload left them), the write versions' stripes (`versions.rs`), the near
//! cache (`near_cache.rs`), and the windows the workers published with their
//! merge for `stats hotkeys`. Atomics, an `ArcSwap`, and one lock that only
//! a window's end and a report take.

use std::collections::VecDeque;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use arc_swap::ArcSwap;
use bytes::{Bytes, BytesMut};

use super::near_cache::{near_cache, NearCache};
use super::top::{self, HotKey, WorkerWindow};
use super::versions::{Stripe, STRIPES};
use super::COUNTERS_PER_SERVER;
use crate::config::HotKeySettings;
use crate::protocol::encode::printable_key;
use crate::stats::Stats;

/// A worker's last [`REPORTED_WINDOWS`] complete windows, oldest first,
/// each with when it ended.
type Published = VecDeque<(Instant, Arc<WorkerWindow>)>;

/// How many of each worker's windows `stats hotkeys`, the gauges and the log
/// merge. One window's sample could not rank keys a tenth apart: under a
/// sampled load (one request in 8 counted) the key taking 19.7 % of the gets
/// was named first in 3 of 5 runs, behind neighbours taking 17.5 %. Four
/// windows count four times the requests, halving the noise, while a key
/// that cools off leaves the list within four windows.
const REPORTED_WINDOWS: usize = 4;

/// What every worker shares: settings, write versions, the near cache and
/// the windows the workers published.
pub(crate) struct HotShared {
    /// As at start: `detect` and `window` are read there only.
    pub(super) started: HotKeySettings,
    /// The settings a reload may change, and the near cache they make.
    pub(super) live: ArcSwap<Live>,
    pub(super) stats: Arc<Stats>,
    pub(super) stripes: Box<[Stripe]>,
    /// `flush_all`s planned and not complete: they write every key.
    pub(super) flushing: AtomicU32,
    /// Each worker's last complete windows.
    windows: Mutex<Vec<Published>>,
}

/// The current hot-key settings and the near cache they ask for.
pub(super) struct Live {
    pub(super) settings: HotKeySettings,
    pub(super) cache: Option<NearCache>,
}

impl std::fmt::Debug for HotShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HotShared")
            .field("settings", &self.live.load().settings)
            .finish_non_exhaustive()
    }
}

impl HotShared {
    /// The shared state of `workers` workers.
    pub(crate) fn new(
        settings: HotKeySettings,
        workers: usize,
        stats: Arc<Stats>,
    ) -> Arc<HotShared> {
        let cache = near_cache(&settings, &stats);
        Arc::new(HotShared {
            started: settings,
            live: ArcSwap::from_pointee(Live { settings, cache }),
            stats,
            stripes: (0..STRIPES).map(|_| Stripe::default()).collect(),
            flushing: AtomicU32::new(0),
            windows: Mutex::new(vec![VecDeque::new(); workers.max(1)]),
        })
    }

    /// Takes the settings a reload may change (all but `hot_key_detect` and
    /// `hot_key_window_ms`); a new near-cache life or size starts an empty
    /// cache. Returns whether anything changed.
    pub(crate) fn apply(&self, settings: &HotKeySettings) -> bool {
        let current = self.live.load();
        if current.settings == *settings {
            return false;
        }
        let same_cache = (current.settings.cache_ttl, current.settings.cache_bytes)
            == (settings.cache_ttl, settings.cache_bytes);
        let cache = if same_cache {
            current.cache.clone()
        } else {
            near_cache(settings, &self.stats)
        };
        self.live.store(Arc::new(Live {
            settings: *settings,
            cache,
        }));
        true
    }

    /// The hottest keys of the workers' last windows, over every worker
    /// (untruncated). A worker whose last window ended more than two window
    /// lengths ago is left out: it stopped publishing and has nothing
    /// current to say.
    pub(crate) fn merged(&self, now: Instant) -> Vec<HotKey> {
        top::merge(&self.fresh(now))
    }

    /// The last windows of each worker whose last one ended within the last
    /// two window lengths, oldest first.
    fn fresh(&self, now: Instant) -> Vec<Vec<Arc<WorkerWindow>>> {
        let windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        windows
            .iter()
            .filter(|history| {
                history.back().is_some_and(|(ended, _)| {
                    now.saturating_duration_since(*ended) < 2 * self.started.window
                })
            })
            .map(|history| history.iter().map(|(_, window)| window.clone()).collect())
            .collect()
    }

    /// The `stats hotkeys` reply.
    pub(crate) fn report(&self) -> Bytes {
        let fresh = self.fresh(Instant::now());
        let mut merged = top::merge(&fresh);
        merged.truncate(self.live.load().settings.top);
        let sampled_one_in = fresh
            .iter()
            .flatten()
            .map(|w| w.sampled_one_in)
            .max()
            .unwrap_or(1);
        let names = self.live.load().settings.metrics_names;
        let mut out = BytesMut::with_capacity(160 + merged.len() * 160);
        top::render(
            &mut out,
            &merged,
            self.started.window.as_millis(),
            COUNTERS_PER_SERVER,
            sampled_one_in,
            names,
        );
        out.freeze()
    }

    pub(super) fn publish(&self, worker: usize, ended: Instant, window: WorkerWindow) {
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(history) = windows.get_mut(worker) {
            if history.len() == REPORTED_WINDOWS {
                history.pop_front();
            }
            history.push_back((ended, Arc::new(window)));
        }
    }

    /// How metrics and logs name a key: with `hot_key_metrics = true` as
    /// `stats hotkeys` prints it ([`printable_key`]: one token, never a control
    /// byte or a newline to split a log line, distinct keys distinct),
    /// otherwise its xxh3 hash (key names may be personal data; the hash
    /// hides them from a casual reader, not from one who can guess keys).
    pub(crate) fn key_label(&self, key: &[u8], hash: u64) -> String {
        if self.live.load().settings.metrics_names {
            printable_key(key).into_owned()
        } else {
            top::hashed_label(hash)
        }
    }
}
