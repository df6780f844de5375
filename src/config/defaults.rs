//! Every default and limit of the config file in one place: what a setting
//! is when the file does not set it, and the bounds no value may pass.
//! Re-exported from `config`, so their paths stay `config::DEFAULT_...`.

/// Largest weight a server may have (160 000 points for one server).
pub const MAX_WEIGHT: u32 = 1000;

/// Largest configurable value size: memcached's own maximum item size.
pub const MAX_VALUE_BYTES_LIMIT: u64 = 1024 * 1024 * 1024;

/// `failover_ttl_s` when unset.
pub const DEFAULT_FAILOVER_TTL_S: u64 = 10;

/// Host names and discovery records are looked up again this often unless
/// `[discovery] interval_ms` says otherwise: a pod that restarts with a new
/// address is found within five seconds, at one question per name per five
/// seconds.
pub const DEFAULT_DISCOVERY_INTERVAL_MS: u64 = 5000;
/// The DNS port, when `resolver` names an address only.
pub const DNS_PORT: u16 = 53;
/// How long an etcd member whose key vanished without LEAVING stays.
pub const DEFAULT_MEMBER_GRACE_MS: u64 = 10_000;
/// How long a sidecar waits for every live sidecar to stage a membership
/// change before it switches reads anyway (docs/etcd.md).
pub const DEFAULT_FLEET_SWITCH_MS: u64 = 30_000;

pub const DEFAULT_HOT_KEY_WINDOW_MS: u64 = 1000;
pub const DEFAULT_HOT_KEY_SHARE: f64 = 0.2;
pub const DEFAULT_HOT_KEY_TOP: u64 = 20;
pub const DEFAULT_HOT_KEY_CACHE_BYTES: u64 = 64 * 1024 * 1024;

pub const DEFAULT_CONNECTIONS_PER_SERVER: u64 = 1;
/// Room a client's reply buffer has beyond one largest value.
pub const CLIENT_BUFFER_HEADROOM_BYTES: usize = 4 * 1024 * 1024;
pub const DEFAULT_MAX_BUFFER_BYTES: u64 = 256 * 1024 * 1024;
pub const DEFAULT_CLIENT_WRITE_TIMEOUT_MS: u64 = 30_000;
/// Five minutes: long enough for the hot part of a moved share to be read
/// once and copied, short enough that leaving servers are let go soon.
pub const DEFAULT_HANDOFF_MS: u64 = 300_000;
/// Worker threads when `workers` is not set (0 asks for one per CPU).
pub const DEFAULT_WORKERS: u64 = 1;
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 500;
pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 1000;
pub const DEFAULT_MAX_CLIENT_CONNECTIONS: u64 = 16_384;
pub const DEFAULT_MAX_PENDING_PER_CLIENT: u64 = 256;
/// Requests one worker may have in flight to one server before it answers
/// `SERVER_ERROR server busy` (see docs/failures.md for the measurement).
pub const DEFAULT_MAX_SERVER_INFLIGHT: u64 = 4096;
pub const DEFAULT_SHUTDOWN_GRACE_MS: u64 = 5000;
pub const DEFAULT_FAILURE_LIMIT: u64 = 3;
/// nutcracker's `server_failure_limit` default, the default of
/// `failure_limit` with `ejection = "twemproxy"`.
pub const TWEMPROXY_FAILURE_LIMIT: u64 = 2;
/// nutcracker's `server_retry_timeout` default.
pub const DEFAULT_RETRY_TIMEOUT_MS: u64 = 30_000;

/// `[request_log] max_lines_per_s` when unset: lines one worker writes a
/// second at most, so that a burst of slow or failed requests cannot make
/// the log the bottleneck.
pub const DEFAULT_REQUEST_LOG_LINES_PER_S: u64 = 100;
