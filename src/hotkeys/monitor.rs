//! The tasks that run the windows: each worker's timer that ends its window,
//! and the one monitor task that, every window, refreshes the hot-key gauges,
//! logs keys that start or stop being hot, and takes the settings a reload
//! publishes. It reads what the workers published, never their state.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::top::{Episode, Episodes};
use super::{key_hash, HotShared, HotWorker};
use crate::stats::HotKeySample;

/// A key's share is logged only on a server that sees at least this many
/// requests per second, so one request to an idle server is not "hot".
const LOG_MIN_SERVER_RATE: f64 = 50.0;

/// Ends a window every `hot_key_window_ms` until `stop`.
pub(crate) async fn run_windows(hot: Rc<HotWorker>, stop: CancellationToken) {
    let period = hot.shared.started.window;
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => hot.roll(),
            () = stop.cancelled() => return,
        }
    }
}

/// Every window: refreshes the hot-key gauges and logs keys that start or
/// stop taking more than `hot_key_share` of their server's requests.
/// Also takes the hot-key settings of every config a reload publishes.
pub(crate) async fn monitor(
    shared: Arc<HotShared>,
    layout: crate::pools::layout::SharedLayout,
    published: Arc<Notify>,
    shutdown: CancellationToken,
) {
    let period = shared.started.window;
    // Half a window after the workers' ends, so each has published.
    let first = tokio::time::Instant::now() + period + period / 2;
    let mut ticks = tokio::time::interval_at(first, period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut episodes = Episodes::default();
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            () = published.notified() => {
                // Reloads publish; so do ejections, which change nothing here.
                if shared.apply(&layout.load().default_topology().config.hot_keys) {
                    tracing::info!("hot-key settings applied");
                }
                continue;
            }
            () = shutdown.cancelled() => return,
        }
        // A reload published while this task was busy.
        shared.apply(&layout.load().default_topology().config.hot_keys);
        let settings = shared.live.load().settings;
        let merged = shared.merged(Instant::now());
        let samples: Vec<HotKeySample> = merged
            .iter()
            .take(settings.top)
            .map(|k| HotKeySample {
                server: k.server.to_string(),
                key: shared.key_label(&k.key, k.hash),
                rate: k.rate,
                share: k.share,
            })
            .collect();
        shared.stats.hot_keys(&samples);
        for episode in episodes.update(&merged, settings.share, LOG_MIN_SERVER_RATE) {
            match episode {
                Episode::Started(k) => tracing::warn!(
                    key = %shared.key_label(&k.key, k.hash),
                    server = %k.server,
                    share = format_args!("{:.3}", k.share),
                    rate = format_args!("{:.0}", k.rate),
                    "hot key: takes more than {:.0}% of its server's requests",
                    settings.share * 100.0
                ),
                Episode::Ended { server, key } => tracing::info!(
                    key = %shared.key_label(&key, key_hash(&key)),
                    %server,
                    "hot key no longer hot"
                ),
            }
        }
    }
}
