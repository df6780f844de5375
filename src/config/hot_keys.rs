//! The `hot_key_*` settings: detection, coalescing and the near cache.

use std::ops::Range;
use std::time::Duration;

use super::diagnose::NumberSetting;
use super::raw::RawConfig;
use super::{
    DEFAULT_HOT_KEY_CACHE_BYTES, DEFAULT_HOT_KEY_SHARE, DEFAULT_HOT_KEY_TOP,
    DEFAULT_HOT_KEY_WINDOW_MS,
};
use crate::error::ConfigError;

/// The `hot_key_*` settings, read at start.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HotKeySettings {
    /// Keys are counted at all (`hot_key_detect`); without it there is no
    /// coalescing or near cache either.
    pub detect: bool,
    /// Length of one counting window (`hot_key_window_ms`).
    pub window: Duration,
    /// Log a key that takes more than this share of its server's requests
    /// (`hot_key_share`, 0 < share <= 1).
    pub share: f64,
    /// Keys listed by `stats hotkeys` and exported to Prometheus.
    pub top: usize,
    /// Prometheus labels and log lines name keys (otherwise a hash of them).
    pub metrics_names: bool,
    /// Concurrent `get`s of a hot key on one worker share one server request.
    pub coalesce: bool,
    /// Serve hot keys' values from memring's memory for at most this long;
    /// `None`: no near cache.
    pub cache_ttl: Option<Duration>,
    /// Bytes (keys and values) the near cache may hold.
    pub cache_bytes: u64,
}

// `share` is validated to be a number in (0, 1], never NaN.
impl Eq for HotKeySettings {}

impl Default for HotKeySettings {
    fn default() -> Self {
        HotKeySettings {
            detect: true,
            window: Duration::from_millis(DEFAULT_HOT_KEY_WINDOW_MS),
            share: DEFAULT_HOT_KEY_SHARE,
            top: DEFAULT_HOT_KEY_TOP as usize,
            metrics_names: false,
            coalesce: true,
            cache_ttl: None,
            cache_bytes: DEFAULT_HOT_KEY_CACHE_BYTES,
        }
    }
}

/// The `hot_key_*` settings, validated.
pub(super) fn hot_key_settings(
    raw: &RawConfig,
    at: &dyn Fn(Range<usize>, String) -> ConfigError,
    number: &NumberSetting<'_>,
) -> Result<HotKeySettings, ConfigError> {
    let window_ms = number(
        &raw.hot_key_window_ms,
        "hot_key_window_ms",
        DEFAULT_HOT_KEY_WINDOW_MS,
        100..=3_600_000,
    )?;
    let share = match &raw.hot_key_share {
        None => DEFAULT_HOT_KEY_SHARE,
        Some(v) if *v.get_ref() > 0.0 && *v.get_ref() <= 1.0 => *v.get_ref(),
        Some(v) => {
            return Err(at(
                v.span(),
                format!(
                    "hot_key_share = {} must be a share above 0 and at most 1",
                    v.get_ref()
                ),
            ))
        }
    };
    let top = number(
        &raw.hot_key_top,
        "hot_key_top",
        DEFAULT_HOT_KEY_TOP,
        1..=1000,
    )?;
    let cache_ms = number(&raw.hot_key_cache_ms, "hot_key_cache_ms", 0, 0..=3_600_000)?;
    let cache_bytes = number(
        &raw.hot_key_cache_bytes,
        "hot_key_cache_bytes",
        DEFAULT_HOT_KEY_CACHE_BYTES,
        1024..=1 << 40,
    )?;
    let detect = raw.hot_key_detect.as_ref().map_or(true, |v| *v.get_ref());
    if let (Some(flag), true) = (&raw.hot_key_detect, !detect && cache_ms > 0) {
        return Err(at(
            flag.span(),
            "hot_key_detect = false leaves nothing for hot_key_cache_ms to cache".into(),
        ));
    }
    Ok(HotKeySettings {
        detect,
        window: Duration::from_millis(window_ms),
        share,
        top: top as usize,
        metrics_names: raw.hot_key_metrics.unwrap_or(false),
        coalesce: detect && raw.hot_key_coalesce.unwrap_or(true),
        cache_ttl: (cache_ms > 0).then(|| Duration::from_millis(cache_ms)),
        cache_bytes,
    })
}
