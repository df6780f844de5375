//! What happens to a DEAD server: when it is tried again (`ejection`,
//! `retry_timeout_ms`) and whether its keys go to a gutter pool
//! (`failover`, `failover_ttl_s`).

use std::ops::Range;
use std::time::Duration;

use super::diagnose::NumberSetting;
use super::raw::RawConfig;
use super::{DEFAULT_FAILOVER_TTL_S, DEFAULT_RETRY_TIMEOUT_MS};
use crate::error::ConfigError;

/// A gutter pool for a pool's DEAD servers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failover {
    /// The gutter pool's name.
    pub pool: String,
    /// Longest exptime a write to the gutter keeps.
    pub ttl: Duration,
}

/// What happens to a DEAD server (`ejection`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ejection {
    /// memring's own (`ejection = "memring"`, the default): a DEAD server is
    /// probed, and once it answers it is flushed and rejoins with a hand-off
    /// window.
    Memring,
    /// nutcracker 0.5's (`ejection = "twemproxy"`): failures count only with
    /// `auto_eject`; a DEAD server stays out of the ring for `retry`
    /// (`retry_timeout_ms`), then is put back untried and unflushed, so that
    /// memring and a nutcracker beside it place every key alike.
    Twemproxy { retry: Duration },
}

impl Ejection {
    /// The value of `ejection` in the file.
    pub fn name(self) -> &'static str {
        match self {
            Ejection::Memring => "memring",
            Ejection::Twemproxy { .. } => "twemproxy",
        }
    }
}

/// `ejection` and `retry_timeout_ms`.
pub(super) fn ejection(
    raw: &RawConfig,
    at: &dyn Fn(Range<usize>, String) -> ConfigError,
    number: &NumberSetting<'_>,
) -> Result<Ejection, ConfigError> {
    let twemproxy = match &raw.ejection {
        None => false,
        Some(name) => match name.get_ref().as_str() {
            "memring" => false,
            "twemproxy" => true,
            other => {
                return Err(at(
                    name.span(),
                    format!(
                    "ejection = \"{other}\" is not an ejection timing (one of: memring, twemproxy)"
                ),
                ))
            }
        },
    };
    match (&raw.retry_timeout_ms, twemproxy) {
        (Some(retry), false) => Err(at(
            retry.span(),
            "retry_timeout_ms applies to ejection = \"twemproxy\"; memring's own ejection restores a server as soon as it answers".into(),
        )),
        (_, false) => Ok(Ejection::Memring),
        (_, true) => Ok(Ejection::Twemproxy {
            retry: Duration::from_millis(number(
                &raw.retry_timeout_ms,
                "retry_timeout_ms",
                DEFAULT_RETRY_TIMEOUT_MS,
                0..=86_400_000,
            )?),
        }),
    }
}

/// `failover` and `failover_ttl_s`, checked against the pool's own
/// settings (the gutter pool's name is checked once all pools are known).
pub(super) fn failover(
    raw: &RawConfig,
    at: &dyn Fn(Range<usize>, String) -> ConfigError,
    number: &NumberSetting<'_>,
    replicas: u64,
) -> Result<Option<Failover>, ConfigError> {
    let Some(pool) = &raw.failover else {
        if let Some(ttl) = &raw.failover_ttl_s {
            return Err(at(
                ttl.span(),
                "failover_ttl_s applies with failover = \"<gutter pool>\"".into(),
            ));
        }
        return Ok(None);
    };
    let clash = if raw.auto_eject == Some(true) {
        Some("auto_eject = true moves a DEAD server's keys to the other servers; failover sends them to the gutter pool: keep one")
    } else if replicas > 1 {
        Some("with replicas, a DEAD server's keys are read from and written to their other replicas: failover applies to replicas = 1")
    } else if raw
        .ejection
        .as_ref()
        .is_some_and(|e| e.get_ref() == "twemproxy")
    {
        Some("failover needs memring's ejection timing: a returning server must be flushed before its keys leave the gutter")
    } else {
        None
    };
    if let Some(clash) = clash {
        return Err(at(
            pool.span(),
            format!("failover = \"{}\": {clash}", pool.get_ref()),
        ));
    }
    let ttl = number(
        &raw.failover_ttl_s,
        "failover_ttl_s",
        DEFAULT_FAILOVER_TTL_S,
        1..=86_400,
    )?;
    Ok(Some(Failover {
        pool: pool.get_ref().clone(),
        ttl: Duration::from_secs(ttl),
    }))
}
