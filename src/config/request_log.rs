//! `[request_log]`: which finished requests get a log line of their own
//! (a sampled share, the slow ones, the ones answered with an error), how
//! their keys are shown, and how many lines a second a worker may write.

use std::ops::Range;

use toml::Spanned;

use super::raw::RawRequestLog;
use super::DEFAULT_REQUEST_LOG_LINES_PER_S;
use crate::error::ConfigError;

/// The `[request_log]` table, validated; without it nothing is logged.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RequestLogSettings {
    /// Share of all requests logged (`sample`, 0 ..= 1; 0: none).
    pub sample: f64,
    /// Every request that took longer than this many milliseconds
    /// (`slow_ms`; 0: none for being slow).
    pub slow_ms: u64,
    /// Every request answered with an error line (`errors`), a timeout's
    /// `SERVER_ERROR` among them.
    pub errors: bool,
    /// Keys are printed as sent (`keys = "plain"`) rather than as their
    /// stable hash (`keys = "hash"`, as `/metrics` shows hot keys).
    pub plain_keys: bool,
    /// Lines one worker writes a second at most (`max_lines_per_s`); the
    /// rest are counted as dropped.
    pub max_lines_per_s: u64,
}

// `sample` is validated to be a number in 0 ..= 1, never NaN.
impl Eq for RequestLogSettings {}

impl Default for RequestLogSettings {
    fn default() -> Self {
        RequestLogSettings {
            sample: 0.0,
            slow_ms: 0,
            errors: false,
            plain_keys: false,
            max_lines_per_s: DEFAULT_REQUEST_LOG_LINES_PER_S,
        }
    }
}

impl RequestLogSettings {
    /// Some request may be logged: the one thing the request path asks.
    pub fn any(&self) -> bool {
        self.sample > 0.0 || self.slow_ms > 0 || self.errors
    }
}

impl std::fmt::Display for RequestLogSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "sample {} slow_ms {} errors {} keys {} max_lines_per_s {}",
            self.sample,
            self.slow_ms,
            self.errors,
            if self.plain_keys { "plain" } else { "hash" },
            self.max_lines_per_s
        )
    }
}

/// The `[request_log]` table, validated.
pub(super) fn request_log_settings(
    raw: Option<&Spanned<RawRequestLog>>,
    at: &dyn Fn(Range<usize>, String) -> ConfigError,
) -> Result<RequestLogSettings, ConfigError> {
    let mut settings = RequestLogSettings::default();
    let Some(raw) = raw else {
        return Ok(settings);
    };
    let raw = raw.get_ref();
    if let Some(sample) = &raw.sample {
        let value = *sample.get_ref();
        if !(0.0..=1.0).contains(&value) {
            return Err(at(
                sample.span(),
                format!(
                    "[request_log] sample = {value} must be a share from 0 (none) to 1 (every request)"
                ),
            ));
        }
        settings.sample = value;
    }
    if let Some(slow_ms) = &raw.slow_ms {
        settings.slow_ms = *slow_ms.get_ref();
    }
    if let Some(errors) = &raw.errors {
        settings.errors = *errors.get_ref();
    }
    if let Some(keys) = &raw.keys {
        settings.plain_keys = match keys.get_ref().as_str() {
            "hash" => false,
            "plain" => true,
            other => {
                return Err(at(
                    keys.span(),
                    format!("[request_log] keys = {other:?}: expected \"hash\" or \"plain\""),
                ))
            }
        };
    }
    if let Some(lines) = &raw.max_lines_per_s {
        let value = *lines.get_ref();
        if !(1..=1_000_000).contains(&value) {
            return Err(at(
                lines.span(),
                format!("[request_log] max_lines_per_s = {value} must be from 1 to 1000000"),
            ));
        }
        settings.max_lines_per_s = value;
    }
    Ok(settings)
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    fn parse(table: &str) -> Result<super::RequestLogSettings, String> {
        let text = format!(
            "listen = \"127.0.0.1:1\"\n[request_log]\n{table}\n[[servers]]\naddr = \"127.0.0.1:2\"\n"
        );
        Config::parse(&text, "t.toml")
            .map(|c| c.request_log)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn without_the_table_nothing_is_logged() {
        let config = Config::parse(
            "listen = \"127.0.0.1:1\"\n[[servers]]\naddr = \"127.0.0.1:2\"\n",
            "t.toml",
        )
        .unwrap();
        assert!(!config.request_log.any());
        assert!(!parse("sample = 0.0").unwrap().any());
    }

    #[test]
    fn every_key_is_read() {
        let settings = parse(
            "sample = 0.001\nslow_ms = 50\nerrors = true\nkeys = \"plain\"\nmax_lines_per_s = 7",
        )
        .unwrap();
        assert_eq!(settings.sample, 0.001);
        assert_eq!(settings.slow_ms, 50);
        assert!(settings.errors && settings.plain_keys && settings.any());
        assert_eq!(settings.max_lines_per_s, 7);
        assert!(!parse("keys = \"hash\"").unwrap().plain_keys);
    }

    #[test]
    fn bad_values_are_refused_at_their_line_with_what_is_allowed() {
        for (table, says) in [
            ("sample = 1.5", "sample = 1.5 must be a share from 0"),
            ("sample = -0.1", "must be a share from 0"),
            ("sample = nan", "must be a share from 0"),
            ("keys = \"md5\"", "expected \"hash\" or \"plain\""),
            ("max_lines_per_s = 0", "max_lines_per_s = 0 must be from 1"),
            ("rate = 3", "unknown key `rate`"),
        ] {
            let error = parse(table).unwrap_err();
            assert!(error.contains(says), "{table}: {error}");
            assert!(error.contains("t.toml:3:"), "{table}: {error}");
        }
    }
}
