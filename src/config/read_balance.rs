//! `read_balance` and `read_balance_epsilon`: how a key's reads are spread
//! over its live replicas (docs/zones.md, "Read balancing").

use std::ops::Range;

use super::raw::RawConfig;
use crate::error::ConfigError;

/// `read_balance_epsilon` when not set.
pub(super) const DEFAULT_READ_BALANCE_EPSILON: f64 = 0.25;
/// The largest `read_balance_epsilon` accepted.
pub(super) const MAX_READ_BALANCE_EPSILON: f64 = 10.0;

/// Which replica of a key a read goes to first (`read_balance`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReadBalanceMode {
    /// The local zone's replica, then the others in ring order (without
    /// zones: ring order); only hot keys are spread.
    #[default]
    Local,
    /// The first replica in that order whose load (requests in flight on
    /// this worker) stays within the bound; see [`ReadBalance`].
    LeastLoaded,
}

impl ReadBalanceMode {
    /// The values of `read_balance`, in the order of the docs.
    pub const ALL: [ReadBalanceMode; 2] = [ReadBalanceMode::Local, ReadBalanceMode::LeastLoaded];

    /// The value of `read_balance` in the file.
    pub fn name(self) -> &'static str {
        match self {
            ReadBalanceMode::Local => "local",
            ReadBalanceMode::LeastLoaded => "least_loaded",
        }
    }
}

/// `read_balance` and `read_balance_epsilon`, validated.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReadBalance {
    pub mode: ReadBalanceMode,
    /// How far above the average load of a key's live replicas one of them
    /// may go (a share: 0.25 = 25 %), 0 to [`MAX_READ_BALANCE_EPSILON`].
    pub epsilon: f64,
}

// `epsilon` is validated to be a number in [0, 10], never NaN.
impl Eq for ReadBalance {}

impl Default for ReadBalance {
    fn default() -> Self {
        ReadBalance {
            mode: ReadBalanceMode::default(),
            epsilon: DEFAULT_READ_BALANCE_EPSILON,
        }
    }
}

/// `read_balance` and `read_balance_epsilon`, validated.
pub(super) fn read_balance(
    raw: &RawConfig,
    at: &dyn Fn(Range<usize>, String) -> ConfigError,
) -> Result<ReadBalance, ConfigError> {
    let mode = match &raw.read_balance {
        None => ReadBalanceMode::default(),
        Some(name) => ReadBalanceMode::ALL
            .into_iter()
            .find(|m| m.name() == name.get_ref())
            .ok_or_else(|| {
                at(
                    name.span(),
                    format!(
                        "read_balance = \"{}\" is not a choice (one of: local, least_loaded)",
                        name.get_ref()
                    ),
                )
            })?,
    };
    let epsilon = match &raw.read_balance_epsilon {
        None => DEFAULT_READ_BALANCE_EPSILON,
        Some(v) if (0.0..=MAX_READ_BALANCE_EPSILON).contains(v.get_ref()) => *v.get_ref(),
        Some(v) => {
            return Err(at(
                v.span(),
                format!(
                "read_balance_epsilon = {} must be a share from 0 to {MAX_READ_BALANCE_EPSILON}",
                v.get_ref()
            ),
            ))
        }
    };
    Ok(ReadBalance { mode, epsilon })
}
