//! The TOML config file: `RawConfig` (what serde reads, with source spans) is
//! validated into `Config` (what memring runs on), and every problem is reported
//! as `file:line:column: what is wrong`. No I/O beyond reading the file and,
//! in [`Config::load`] and [`Config::parse_and_resolve`], looking up server
//! host names to tell two spellings of one memcached apart.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::ops::Range;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use crate::error::ConfigError;
use crate::protocol::{Limits, DEFAULT_MAX_GET_LINE_BYTES, DEFAULT_MAX_LINE_BYTES};
use crate::ring::{Flavour, HashFunction, Member, Node, Ring, Spec};

mod pools;
pub use pools::{PoolConfig, Route, ShadowConfig, DEFAULT_POOL};

/// Largest weight a server may have (160 000 points for one server).
pub const MAX_WEIGHT: u32 = 1000;

/// Largest configurable value size: memcached's own maximum item size.
pub const MAX_VALUE_BYTES_LIMIT: u64 = 1024 * 1024 * 1024;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    listen: Spanned<String>,
    #[serde(default)]
    servers: Vec<Spanned<RawServer>>,
    connections_per_server: Option<Spanned<u64>>,
    connect_timeout_ms: Option<Spanned<u64>>,
    request_timeout_ms: Option<Spanned<u64>>,
    max_value_bytes: Option<Spanned<u64>>,
    max_client_connections: Option<Spanned<u64>>,
    max_pending_per_client: Option<Spanned<u64>>,
    shutdown_grace_ms: Option<Spanned<u64>>,
    auto_eject: Option<bool>,
    failure_limit: Option<Spanned<u64>>,
    ejection: Option<Spanned<String>>,
    retry_timeout_ms: Option<Spanned<u64>>,
    client_idle_timeout_ms: Option<Spanned<u64>>,
    admin_listen: Option<Spanned<String>>,
    replicas: Option<Spanned<u64>>,
    read_miss_fallthrough: Option<bool>,
    workers: Option<Spanned<u64>>,
    max_client_buffer_bytes: Option<Spanned<u64>>,
    max_buffer_bytes: Option<Spanned<u64>>,
    client_write_timeout_ms: Option<Spanned<u64>>,
    handoff_ms: Option<Spanned<u64>>,
    shared_with: Option<Spanned<String>>,
    state_file: Option<Spanned<String>>,
    failover: Option<Spanned<String>>,
    failover_ttl_s: Option<Spanned<u64>>,
    ring: Option<Spanned<String>>,
    hash: Option<Spanned<String>>,
    hash_tag: Option<Spanned<String>>,
    hot_key_detect: Option<Spanned<bool>>,
    hot_key_window_ms: Option<Spanned<u64>>,
    hot_key_share: Option<Spanned<f64>>,
    hot_key_top: Option<Spanned<u64>>,
    hot_key_metrics: Option<bool>,
    hot_key_coalesce: Option<bool>,
    hot_key_cache_ms: Option<Spanned<u64>>,
    hot_key_cache_bytes: Option<Spanned<u64>>,
    tls_listen: Option<Spanned<RawTlsListen>>,
    backend_tls: Option<Spanned<RawBackendTls>>,
    discovery: Option<Spanned<RawDiscovery>>,
    #[serde(default)]
    pools: Vec<Spanned<pools::RawPool>>,
    #[serde(default)]
    routes: Vec<Spanned<pools::RawRoute>>,
    default_pool: Option<Spanned<String>>,
    /// `[shadow]`: the top-level pool's shadow (see `pools.rs`).
    shadow: Option<Spanned<pools::RawShadow>>,
}

/// `[discovery]`: where host names are looked up, how often, and whether the
/// default pool's servers come from DNS.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDiscovery {
    srv: Option<Spanned<String>>,
    a: Option<Spanned<String>>,
    interval_ms: Option<Spanned<u64>>,
    resolver: Option<Spanned<String>>,
    tls: Option<Spanned<bool>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    addr: Spanned<String>,
    weight: Option<Spanned<i64>>,
    name: Option<Spanned<String>>,
    tls: Option<Spanned<bool>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTlsListen {
    addr: Spanned<String>,
    cert_file: Spanned<String>,
    key_file: Spanned<String>,
    client_ca_file: Option<Spanned<String>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBackendTls {
    ca_file: Option<Spanned<String>>,
    cert_file: Option<Spanned<String>>,
    key_file: Option<Spanned<String>>,
    server_name: Option<Spanned<String>>,
}

/// `[tls_listen]`: a second client listener that speaks TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsListen {
    pub addr: SocketAddr,
    pub files: crate::tls::ListenFiles,
}

/// One memcached server of the pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// `host:port` to connect to.
    pub addr: String,
    /// Ring identity: the configured `name`, or `addr` when there is none. Keys
    /// stay put when a named server changes address.
    pub name: String,
    /// Relative share of the keyspace (points = 160 × weight).
    pub weight: u32,
    /// Connect with TLS, as `[backend_tls]` says.
    pub tls: bool,
}

impl ServerConfig {
    /// How the ring sees this server.
    pub fn member(&self) -> Member {
        Member {
            identity: self.name.clone(),
            weight: self.weight,
        }
    }

    /// How the ring sees this server, with the address that the twemproxy
    /// and libmemcached flavours name points after.
    pub fn node(&self) -> Node {
        Node {
            member: self.member(),
            addr: self.addr.clone(),
        }
    }
}

/// A validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub listen: SocketAddr,
    pub servers: Vec<ServerConfig>,
    /// Persistent, pipelined connections per server.
    pub connections_per_server: usize,
    pub connect_timeout: Duration,
    /// A request not answered within this time fails with `SERVER_ERROR` and its
    /// backend connection is discarded.
    pub request_timeout: Duration,
    pub limits: Limits,
    /// Client connections served at once; more wait in the listen backlog.
    pub max_client_connections: usize,
    /// Requests of one client awaiting their reply before memring stops reading
    /// from that client.
    pub max_pending_per_client: usize,
    /// How long shutdown waits for in-flight requests.
    pub shutdown_grace: Duration,
    /// Leave DEAD servers out of the ring (their keys move to the others)
    /// instead of failing their keys fast.
    pub auto_eject: bool,
    /// Consecutive failures (connect, timeout, broken connection) after which
    /// a server is DEAD.
    pub failure_limit: u32,
    /// When a DEAD server is tried again (`ejection`, `retry_timeout_ms`).
    pub ejection: Ejection,
    /// Close clients idle this long; `None` keeps them forever.
    pub client_idle_timeout: Option<Duration>,
    /// Where to serve `/metrics`, `/live` and `/ready`; off when `None`.
    pub admin_listen: Option<SocketAddr>,
    /// Copies of each key (owner plus the next distinct servers clockwise).
    pub replicas: usize,
    /// With replicas, a read that misses asks the next replica too.
    pub read_miss_fallthrough: bool,
    /// `max_value_bytes` was not set: it follows the servers' `item_size_max`.
    pub max_value_from_servers: bool,
    /// Worker threads, each with its own clients and server connections;
    /// 0 = one per CPU this process may use.
    pub workers: usize,
    /// Reply bytes one client may be owed before memring stops reading its
    /// requests; `None` = `max_value_bytes` + 4 MiB.
    pub max_client_buffer_bytes: Option<usize>,
    /// Reply bytes all clients together may be owed before memring stops
    /// reading requests (backpressure instead of growth).
    pub max_buffer_bytes: usize,
    /// Close a client that is owed replies and reads none of them for this long.
    pub client_write_timeout: Duration,
    /// How long a membership change keeps the previous ring for hand-off
    /// reads (see `plan/handoff/`); zero turns hand-off off.
    pub handoff: Duration,
    /// Who else reads or writes the servers (`shared_with`): whether a
    /// moved key is read through and copied in a hand-off window.
    pub shared_with: SharedWith,
    /// `state_file`: where the hand-off windows in force are kept across a
    /// restart (see `window_state.rs`). `None` here is "not set": the
    /// binary then uses [`Config::default_state_file`]; a config parsed
    /// without a file (tests) keeps none.
    pub state_file: Option<std::path::PathBuf>,
    /// `failover`: the pool that takes a DEAD server's keys, with the
    /// exptime of every write there capped (`failover_ttl_s`).
    pub failover: Option<Failover>,
    /// Ring flavour, key hash and hash tag (`ring`, `hash`, `hash_tag`).
    pub ring: Spec,
    /// Hot-key detection, coalescing and near cache (`hot_key_*`).
    pub hot_keys: HotKeySettings,
    /// `[discovery]`: the DNS server and interval of host-name lookups, and
    /// the records the default pool comes from (then `servers` is what DNS
    /// said last, filled in by `discovery.rs`).
    pub discovery: Discovery,
    /// What loading noticed about the servers but did not refuse: two
    /// spellings of one memcached, host names that do not resolve (yet).
    /// Part of [`Config::warnings`].
    pub server_warnings: Vec<String>,
    /// `[tls_listen]`, read at start.
    pub tls_listen: Option<TlsListen>,
    /// `[backend_tls]`, read at start; required by servers with `tls = true`.
    pub backend_tls: Option<crate::tls::BackendFiles>,
    /// The `[[pools]]` beside the top-level one, each with its own settings
    /// (see `pools.rs`); empty in a pool's own config.
    pub pools: Vec<PoolConfig>,
    /// `[[routes]]` on the main `listen`, first match wins.
    pub routes: Vec<Route>,
    /// Where keys matching no route go (`default_pool`).
    pub default_pool: String,
}

/// The `[discovery]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discovery {
    /// Where the default pool's servers come from; `None`: `[[servers]]`.
    pub source: Option<Source>,
    /// How often host names and the discovery records are looked up again.
    pub interval: Duration,
    /// Where questions go (`resolver`, or the system's resolver).
    pub dns: crate::resolve::Dns,
    /// The discovered servers speak TLS, as `[backend_tls]` says.
    pub tls: bool,
}

impl Default for Discovery {
    fn default() -> Self {
        Discovery {
            source: None,
            interval: Duration::from_millis(DEFAULT_DISCOVERY_INTERVAL_MS),
            dns: crate::resolve::Dns::default(),
            tls: false,
        }
    }
}

/// The DNS records that list the default pool's servers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// `srv = "_memcache._tcp.cache"`: each target `name:port` is a server,
    /// placed on the ring by that name, weighted by the record's weight.
    Srv(String),
    /// `a = "cache:11211"`: each A/AAAA address of the name, with the port,
    /// is a server, placed on the ring by `ip:port`.
    A { host: String, port: u16 },
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Srv(name) => write!(f, "srv {name}"),
            Source::A { host, port } => write!(f, "a {host}:{port}"),
        }
    }
}

/// A gutter pool for a pool's DEAD servers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failover {
    /// The gutter pool's name.
    pub pool: String,
    /// Longest exptime a write to the gutter keeps.
    pub ttl: Duration,
}

/// `failover_ttl_s` when unset.
pub const DEFAULT_FAILOVER_TTL_S: u64 = 10;

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

/// Who besides memring sidecars of this version uses the servers
/// (`shared_with`), and so what a hand-off window may do with a moved key
/// (docs/handoff.md, "Shared servers"). memcached has no item other clients
/// cannot see: a hand-off copy's lease is a value to anything that is not
/// this memring, and a copy made without one can land after a write it
/// should have lost to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SharedWith {
    /// Only memring sidecars that know leases (the default): moved keys are
    /// read through from their previous owner and copied through a lease.
    #[default]
    Memring,
    /// Also clients that only read (direct readers, batch jobs, older
    /// sidecars during an upgrade): read through, never copied, so nothing
    /// but the clients' own values is ever written.
    Readers,
    /// Also clients that write (nutcracker, direct clients): a write that
    /// reaches only the new owner would not stop a read-through from the
    /// previous owner, so moved keys are misses, as for nutcracker.
    Writers,
}

impl SharedWith {
    /// The values of `shared_with`, in the order of the docs.
    pub const ALL: [SharedWith; 3] = [
        SharedWith::Memring,
        SharedWith::Readers,
        SharedWith::Writers,
    ];

    /// The value of `shared_with` in the file.
    pub fn name(self) -> &'static str {
        match self {
            SharedWith::Memring => "memring",
            SharedWith::Readers => "readers",
            SharedWith::Writers => "writers",
        }
    }

    /// A read of a moved key that misses on its new owner asks the
    /// previous owner.
    pub fn reads_through(self) -> bool {
        self != SharedWith::Writers
    }

    /// A moved key's value found on its previous owner is copied to the
    /// new one (through a lease).
    pub fn copies(self) -> bool {
        self == SharedWith::Memring
    }
}

/// Host names and discovery records are looked up again this often unless
/// `[discovery] interval_ms` says otherwise: a pod that restarts with a new
/// address is found within five seconds, at one question per name per five
/// seconds.
pub const DEFAULT_DISCOVERY_INTERVAL_MS: u64 = 5000;
/// The DNS port, when `resolver` names an address only.
pub const DNS_PORT: u16 = 53;

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
pub const DEFAULT_SHUTDOWN_GRACE_MS: u64 = 5000;
pub const DEFAULT_FAILURE_LIMIT: u64 = 3;
/// nutcracker's `server_failure_limit` default, the default of
/// `failure_limit` with `ejection = "twemproxy"`.
pub const TWEMPROXY_FAILURE_LIMIT: u64 = 2;
/// nutcracker's `server_retry_timeout` default.
pub const DEFAULT_RETRY_TIMEOUT_MS: u64 = 30_000;

impl Config {
    /// Reads and validates a config file.
    ///
    /// # Errors
    /// The file cannot be read, is not valid TOML, or fails validation.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let shown = path.display().to_string();
        let text =
            crate::regular_file::read_to_string(path, crate::regular_file::MAX_CONFIG_FILE_BYTES)
                .map_err(|source| ConfigError::Read {
                path: shown.clone(),
                source,
            })?;
        Config::parse_and_resolve(&text, &shown)
    }

    /// Validates config text; `path` is only used in error messages. Host
    /// names are compared as written (case aside), never looked up.
    ///
    /// # Errors
    /// The text is not valid TOML or fails validation.
    pub fn parse(text: &str, path: &str) -> Result<Config, ConfigError> {
        Config::parse_with(text, path, None)
    }

    /// [`Config::parse`], and looks up each server's host name (blocking, with
    /// the system resolver, as connecting will) so that a name and an IP
    /// address of the same memcached count as one server. A name that does
    /// not resolve is a warning: DNS may know it by the time memring connects.
    ///
    /// # Errors
    /// The text is not valid TOML or fails validation.
    pub fn parse_and_resolve(text: &str, path: &str) -> Result<Config, ConfigError> {
        // The DNS server to ask is part of the text: read it first.
        // (A file that fails without lookups fails below with the error the
        // lookups lead to first.)
        let dns =
            Config::parse(text, path).map_or_else(|_| Default::default(), |c| c.discovery.dns);
        let system = |host: &str, port: u16| -> std::io::Result<Vec<SocketAddr>> {
            Ok((host, port).to_socket_addrs()?.collect())
        };
        let named = |host: &str, port: u16| -> std::io::Result<Vec<SocketAddr>> {
            crate::resolve::block_on(|| async { dns.addresses(host, port).await })
                .map_err(|e| std::io::Error::other(e.detail))
        };
        match dns.server {
            None => Config::parse_with(text, path, Some(&system)),
            Some(_) => Config::parse_with(text, path, Some(&named)),
        }
    }

    /// This config with `servers` as its server list (what discovery found).
    /// Discovery fills in the top-level pool, `default`: when it is one of
    /// several, its entry in `pools` gets the same list.
    pub fn with_servers(&self, servers: Vec<ServerConfig>) -> Config {
        let mut config = Config {
            servers: servers.clone(),
            ..self.clone()
        };
        if let Some(pool) = config.pools.iter_mut().find(|p| p.name == DEFAULT_POOL) {
            pool.config = std::sync::Arc::new(pool.config.with_servers(servers));
            if config.default_pool != DEFAULT_POOL {
                // The top-level fields are another pool's.
                config.servers = self.servers.clone();
            }
        }
        config
    }

    fn parse_with(
        text: &str,
        path: &str,
        lookup: Option<Lookup<'_>>,
    ) -> Result<Config, ConfigError> {
        let at = |span: Range<usize>, message: String| {
            let (line, column) = line_column(text, span.start);
            ConfigError::Invalid {
                path: path.to_string(),
                line,
                column,
                message,
            }
        };
        let raw: RawConfig = toml::from_str(text).map_err(|e| {
            let span = e.span().unwrap_or(0..0);
            let message = e.message().trim_end().replace('\n', " ");
            at(span.clone(), explain_toml_error(&message, text, span.start))
        })?;
        pools::build(&raw, text, path, lookup)
    }

    /// One pool's config from `raw` (the top level, or a `[[pools]]` entry
    /// laid over it by `pools.rs`).
    fn build_pool(
        raw: &RawConfig,
        text: &str,
        path: &str,
        lookup: Option<Lookup<'_>>,
    ) -> Result<Config, ConfigError> {
        let at = |span: Range<usize>, message: String| {
            let (line, column) = line_column(text, span.start);
            ConfigError::Invalid {
                path: path.to_string(),
                line,
                column,
                message,
            }
        };

        let listen = raw.listen.get_ref().parse::<SocketAddr>().map_err(|_| {
            at(
                raw.listen.span(),
                format!(
                    "listen: `{}` is not an IP:port address",
                    raw.listen.get_ref()
                ),
            )
        })?;

        let admin_listen = match &raw.admin_listen {
            None => None,
            Some(addr) => Some(addr.get_ref().parse::<SocketAddr>().map_err(|_| {
                at(
                    addr.span(),
                    format!(
                        "admin_listen: `{}` is not an IP:port address",
                        addr.get_ref()
                    ),
                )
            })?),
        };
        if let (Some(admin), Some(admin_raw)) = (admin_listen, &raw.admin_listen) {
            if binds_overlap(listen, admin) {
                return Err(at(
                    admin_raw.span(),
                    format!(
                        "admin_listen = \"{}\" takes the port of listen = \"{}\" (line {}): the admin listener needs an address of its own",
                        admin_raw.get_ref(),
                        raw.listen.get_ref(),
                        line_column(text, raw.listen.span().start).0
                    ),
                ));
            }
        }

        let discovery = discovery_settings(raw.discovery.as_ref(), &at)?;
        match (&discovery.source, raw.servers.first()) {
            (None, None) => {
                return Err(at(
                    0..0,
                    "no [[servers]]: at least one server is needed (or [discovery] with srv or a)"
                        .into(),
                ))
            }
            (Some(source), Some(first)) => {
                return Err(at(
                    first.span(),
                    format!(
                        "[[servers]] and [discovery] {source} both list the default pool's servers: keep one of them"
                    ),
                ))
            }
            _ => {}
        }
        let mut servers = Vec::with_capacity(raw.servers.len());
        let mut seen_addr: HashMap<String, usize> = HashMap::new();
        let mut seen_name: HashMap<String, usize> = HashMap::new();
        let mut server_warnings = Vec::new();
        // Per server: where its addr is written and every endpoint it reaches.
        let mut reaches: Vec<(Range<usize>, Vec<Endpoint>)> = Vec::new();
        for entry in &raw.servers {
            let server = entry.get_ref();
            let addr = server.addr.get_ref().trim().to_string();
            if let Some(byte) = refused_char(server.addr.get_ref()) {
                return Err(at(
                    server.addr.span(),
                    format!(
                        "server addr {:?} contains {byte}, which no address may contain",
                        server.addr.get_ref()
                    ),
                ));
            }
            if let Err(problem) = check_server_addr(&addr) {
                let message = match twemproxy_server(&addr) {
                    Some(lines) => format!(
                        "server addr `{addr}` is twemproxy's `host:port:weight [name]` form; in memring write {lines}"
                    ),
                    None => format!("server addr `{addr}`: {problem}"),
                };
                return Err(at(server.addr.span(), message));
            }
            let weight = match &server.weight {
                None => 1,
                Some(w) => match u32::try_from(*w.get_ref()) {
                    Ok(w) if (1..=MAX_WEIGHT).contains(&w) => w,
                    _ => {
                        return Err(at(
                            w.span(),
                            format!(
                            "server `{addr}`: weight {} must be an integer from 1 to {MAX_WEIGHT}",
                            w.get_ref()
                        ),
                        ))
                    }
                },
            };
            let name = match &server.name {
                None => addr.clone(),
                Some(n) => {
                    if let Some(byte) = refused_char(n.get_ref()) {
                        return Err(at(
                            n.span(),
                            format!(
                                "server name {:?} contains {byte}, which no name may contain",
                                n.get_ref()
                            ),
                        ));
                    }
                    if n.get_ref().trim().is_empty() || n.get_ref().contains(char::is_whitespace) {
                        return Err(at(
                            n.span(),
                            "server name must be non-empty and contain no whitespace".into(),
                        ));
                    }
                    n.get_ref().clone()
                }
            };
            let line_of = |start: usize| line_column(text, start).0;
            if let Some(first) = seen_addr.insert(addr.clone(), entry.span().start) {
                return Err(at(
                    server.addr.span(),
                    format!(
                        "duplicate server `{addr}` (first at line {})",
                        line_of(first)
                    ),
                ));
            }
            if let Some(first) = seen_name.insert(name.clone(), entry.span().start) {
                let span = server
                    .name
                    .as_ref()
                    .map_or(server.addr.span(), |n| n.span());
                return Err(at(
                    span,
                    format!(
                        "duplicate server name `{name}` (first at line {})",
                        line_of(first)
                    ),
                ));
            }
            let mut endpoints: Vec<Endpoint> = endpoint_of(&addr).into_iter().collect();
            if let (Some(lookup), Some(Endpoint::Name(host, port))) = (lookup, endpoints.first()) {
                match lookup(host, *port) {
                    Ok(found) => endpoints.extend(
                        found
                            .into_iter()
                            .map(|socket| Endpoint::Ip(canonical(socket))),
                    ),
                    Err(e) => server_warnings.push(format!(
                        "server `{addr}` (line {}): `{host}` does not resolve ({e}); it counts as failing until it does",
                        line_of(server.addr.span().start)
                    )),
                }
            }
            reaches.push((server.addr.span(), endpoints));
            let tls = server.tls.as_ref().is_some_and(|t| *t.get_ref());
            servers.push(ServerConfig {
                addr,
                name,
                weight,
                tls,
            });
        }

        let number = |field: &Option<Spanned<u64>>,
                      name: &str,
                      default: u64,
                      range: std::ops::RangeInclusive<u64>|
         -> Result<u64, ConfigError> {
            match field {
                None => Ok(default),
                Some(v) if range.contains(v.get_ref()) => Ok(*v.get_ref()),
                Some(v) => Err(at(
                    v.span(),
                    format!(
                        "{name} = {} is out of range {}..={}",
                        v.get_ref(),
                        range.start(),
                        range.end()
                    ),
                )),
            }
        };
        let connections_per_server = number(
            &raw.connections_per_server,
            "connections_per_server",
            DEFAULT_CONNECTIONS_PER_SERVER,
            1..=64,
        )?;
        let connect_timeout_ms = number(
            &raw.connect_timeout_ms,
            "connect_timeout_ms",
            DEFAULT_CONNECT_TIMEOUT_MS,
            1..=60_000,
        )?;
        let request_timeout_ms = number(
            &raw.request_timeout_ms,
            "request_timeout_ms",
            DEFAULT_REQUEST_TIMEOUT_MS,
            1..=600_000,
        )?;
        let max_value_bytes = number(
            &raw.max_value_bytes,
            "max_value_bytes",
            crate::protocol::DEFAULT_MAX_VALUE_BYTES as u64,
            1..=MAX_VALUE_BYTES_LIMIT,
        )?;
        let max_client_connections = number(
            &raw.max_client_connections,
            "max_client_connections",
            DEFAULT_MAX_CLIENT_CONNECTIONS,
            1..=1_000_000,
        )?;
        let max_pending_per_client = number(
            &raw.max_pending_per_client,
            "max_pending_per_client",
            DEFAULT_MAX_PENDING_PER_CLIENT,
            1..=65_536,
        )?;
        let shutdown_grace_ms = number(
            &raw.shutdown_grace_ms,
            "shutdown_grace_ms",
            DEFAULT_SHUTDOWN_GRACE_MS,
            0..=600_000,
        )?;

        let ejection = ejection(raw, &at, &number)?;
        let failure_limit = number(
            &raw.failure_limit,
            "failure_limit",
            match ejection {
                Ejection::Memring => DEFAULT_FAILURE_LIMIT,
                Ejection::Twemproxy { .. } => TWEMPROXY_FAILURE_LIMIT,
            },
            1..=1000,
        )?;
        let replicas = number(&raw.replicas, "replicas", 1, 1..=16)?;
        for (first, second, endpoint) in aliases(&reaches) {
            let (first_span, second_span) = (reaches[first].0.clone(), reaches[second].0.clone());
            let (first_addr, second_addr) = (&servers[first].addr, &servers[second].addr);
            let first_line = line_column(text, first_span.start).0;
            if replicas > 1 {
                return Err(at(
                    second_span,
                    format!(
                        "server `{second_addr}` is the same memcached as `{first_addr}` (line {first_line}; both reach {endpoint}): with replicas = {replicas} both copies of a key could be stored on it; list each memcached once"
                    ),
                ));
            }
            server_warnings.push(format!(
                "servers `{first_addr}` (line {first_line}) and `{second_addr}` (line {}) are the same memcached ({endpoint}): it gets the keys of both",
                line_column(text, second_span.start).0
            ));
        }
        let client_idle_timeout_ms = number(
            &raw.client_idle_timeout_ms,
            "client_idle_timeout_ms",
            0,
            0..=86_400_000,
        )?;
        // One worker unless asked: measured with memtier against twemproxy
        // (bench/harness, 4 workloads), one worker served as many or more
        // ops/s as one per CPU with 13-23% less CPU per op, and it opens one
        // connection per server, not one per CPU per server.
        let workers = number(&raw.workers, "workers", DEFAULT_WORKERS, 0..=1024)?;
        let max_client_buffer_bytes = match &raw.max_client_buffer_bytes {
            None => None,
            Some(_) => Some(number(
                &raw.max_client_buffer_bytes,
                "max_client_buffer_bytes",
                0,
                64 * 1024..=MAX_VALUE_BYTES_LIMIT * 4,
            )? as usize),
        };
        let max_buffer_bytes = number(
            &raw.max_buffer_bytes,
            "max_buffer_bytes",
            DEFAULT_MAX_BUFFER_BYTES,
            1024 * 1024..=1 << 40,
        )?;
        let client_write_timeout_ms = number(
            &raw.client_write_timeout_ms,
            "client_write_timeout_ms",
            DEFAULT_CLIENT_WRITE_TIMEOUT_MS,
            1..=86_400_000,
        )?;
        let handoff_ms = number(
            &raw.handoff_ms,
            "handoff_ms",
            DEFAULT_HANDOFF_MS,
            0..=86_400_000,
        )?;

        let shared_with = match &raw.shared_with {
            None => SharedWith::default(),
            Some(name) => SharedWith::ALL
                .into_iter()
                .find(|s| s.name() == name.get_ref())
                .ok_or_else(|| {
                    at(
                        name.span(),
                        format!(
                            "shared_with = \"{}\" is not who shares the servers (one of: memring, readers, writers)",
                            name.get_ref()
                        ),
                    )
                })?,
        };
        let failover = failover(raw, &at, &number, replicas)?;
        let ring = ring_spec(raw, &at)?;
        if raw.shared_with.is_none() && handoff_ms > 0 && ring.flavour != Flavour::Memring {
            server_warnings.push(format!(
                "ring = \"{}\" usually means other clients (nutcracker, libmemcached clients, scripts) use these servers too, and shared_with is not set: in a hand-off window memring copies moved keys through leases that those clients would read as values; set shared_with = \"writers\" if they write, \"readers\" if they only read, or shared_with = \"memring\" if only memring sidecars use the servers (docs/handoff.md, \"Shared servers\")",
                ring.flavour.name()
            ));
        }
        let hot_keys = hot_key_settings(raw, &at, &number)?;
        let (tls_listen, backend_tls) = tls_settings(raw, &at, path, listen, admin_listen)?;
        let state_file = match &raw.state_file {
            None => None,
            Some(value) => {
                let text = value.get_ref().trim();
                if text.is_empty() {
                    return Err(at(value.span(), "state_file must name a file".into()));
                }
                let base = Path::new(path).parent().unwrap_or(Path::new(""));
                Some(base.join(text))
            }
        };
        if lookup.is_some() {
            check_tls_files(raw, &at, tls_listen.as_ref(), backend_tls.as_ref())?;
        }

        Ok(Config {
            ring,
            listen,
            servers,
            connections_per_server: connections_per_server as usize,
            connect_timeout: Duration::from_millis(connect_timeout_ms),
            request_timeout: Duration::from_millis(request_timeout_ms),
            limits: Limits {
                max_line_bytes: DEFAULT_MAX_LINE_BYTES,
                max_get_line_bytes: DEFAULT_MAX_GET_LINE_BYTES,
                max_value_bytes: max_value_bytes as usize,
                max_keys_per_get: crate::protocol::DEFAULT_MAX_KEYS_PER_GET,
            },
            max_client_connections: max_client_connections as usize,
            max_pending_per_client: max_pending_per_client as usize,
            shutdown_grace: Duration::from_millis(shutdown_grace_ms),
            auto_eject: raw.auto_eject.unwrap_or(false),
            failure_limit: failure_limit as u32,
            ejection,
            client_idle_timeout: (client_idle_timeout_ms > 0)
                .then(|| Duration::from_millis(client_idle_timeout_ms)),
            admin_listen,
            replicas: replicas as usize,
            read_miss_fallthrough: raw.read_miss_fallthrough.unwrap_or(false),
            max_value_from_servers: raw.max_value_bytes.is_none(),
            workers: workers as usize,
            max_client_buffer_bytes,
            max_buffer_bytes: max_buffer_bytes as usize,
            client_write_timeout: Duration::from_millis(client_write_timeout_ms),
            handoff: Duration::from_millis(handoff_ms),
            shared_with,
            state_file,
            failover,
            hot_keys,
            server_warnings,
            tls_listen,
            backend_tls,
            discovery,
            pools: Vec::new(),
            routes: Vec::new(),
            default_pool: pools::DEFAULT_POOL.to_string(),
        })
    }

    /// Where the hand-off state goes when `state_file` is not set: beside
    /// the config file, named after it (`memring.toml` keeps its windows in
    /// `memring.toml.handoff-state`).
    pub fn default_state_file(config_path: &Path) -> std::path::PathBuf {
        let mut name = config_path
            .file_name()
            .map_or_else(|| std::ffi::OsString::from("memring"), |n| n.to_owned());
        name.push(".handoff-state");
        config_path.with_file_name(name)
    }

    /// The same config with `state_file` set to its default for a file at
    /// `config_path` when the file does not set it.
    pub fn with_default_state_file(mut self, config_path: &Path) -> Config {
        if self.state_file.is_none() {
            self.state_file = Some(Config::default_state_file(config_path));
        }
        self
    }

    /// The ring members, in config order.
    pub fn members(&self) -> Vec<Member> {
        self.servers.iter().map(ServerConfig::member).collect()
    }

    /// Settings that are valid but probably not what was meant. The config
    /// still loads; `check`, start and reload print these.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        if self.replicas > self.servers.len() && !self.servers.is_empty() {
            warnings.push(format!(
                "replicas = {} but only {} server{}: a key cannot have more copies than there are servers",
                self.replicas,
                self.servers.len(),
                if self.servers.len() == 1 { "" } else { "s" },
            ));
        }
        warnings.extend(self.server_warnings.iter().cloned());
        warnings
    }

    /// The ring nodes (members with their addresses), in config order.
    pub fn ring_nodes(&self) -> Vec<Node> {
        self.servers.iter().map(ServerConfig::node).collect()
    }

    /// The ring of every configured server, in the configured flavour.
    pub fn build_ring(&self) -> Ring {
        Ring::build_with(&self.ring, self.ring_nodes())
    }
}

/// `ring`, `hash` and `hash_tag`: which ring to reproduce and how keys are
/// hashed onto it.
fn ring_spec(
    raw: &RawConfig,
    at: &dyn Fn(Range<usize>, String) -> ConfigError,
) -> Result<Spec, ConfigError> {
    let mut spec = Spec::default();
    if let Some(name) = &raw.ring {
        spec.flavour = Flavour::from_name(name.get_ref()).ok_or_else(|| {
            let known: Vec<&str> = Flavour::ALL.iter().map(|f| f.name()).collect();
            at(
                name.span(),
                format!(
                    "ring = \"{}\" is not a ring flavour (one of: {})",
                    name.get_ref(),
                    known.join(", ")
                ),
            )
        })?;
    }
    if let Some(name) = &raw.hash {
        let function = HashFunction::from_name(name.get_ref()).ok_or_else(|| {
            let known: Vec<&str> = HashFunction::ALL.iter().map(|f| f.name()).collect();
            at(
                name.span(),
                format!(
                    "hash = \"{}\" is not a hash function (one of: {})",
                    name.get_ref(),
                    known.join(", ")
                ),
            )
        })?;
        match spec.flavour {
            Flavour::Twemproxy => spec.hash = function,
            Flavour::Libmemcached if function == HashFunction::Md5 => {}
            Flavour::Libmemcached => {
                return Err(at(
                    name.span(),
                    "ring = \"libmemcached\" hashes keys with md5 only".into(),
                ))
            }
            Flavour::Memring => {
                return Err(at(
                    name.span(),
                    "hash applies to ring = \"twemproxy\" (the memring ring always uses xxh3)"
                        .into(),
                ))
            }
        }
    }
    if let Some(tag) = &raw.hash_tag {
        let bytes = tag.get_ref().as_bytes();
        match bytes {
            [open, close] if bytes.iter().all(|b| b.is_ascii_graphic()) => {
                spec.hash_tag = Some([*open, *close]);
            }
            _ => {
                return Err(at(
                    tag.span(),
                    format!(
                    "hash_tag = \"{}\" must be two printable ASCII characters, such as \"{{}}\"",
                    tag.get_ref()
                ),
                ))
            }
        }
    }
    Ok(spec)
}

/// `[tls_listen]`, `[backend_tls]` and the servers' `tls`, checked without
/// reading the files. Relative paths are taken from the config file's
/// directory, so a config and its certificates move together.
fn tls_settings(
    raw: &RawConfig,
    at: &dyn Fn(Range<usize>, String) -> ConfigError,
    path: &str,
    listen: SocketAddr,
    admin_listen: Option<SocketAddr>,
) -> Result<(Option<TlsListen>, Option<crate::tls::BackendFiles>), ConfigError> {
    let base = Path::new(path).parent().unwrap_or(Path::new(""));
    let file = |value: &Spanned<String>, key: &str| -> Result<std::path::PathBuf, ConfigError> {
        let text = value.get_ref().trim();
        if text.is_empty() {
            return Err(at(value.span(), format!("{key} must name a file")));
        }
        Ok(base.join(text))
    };
    let tls_listen = match &raw.tls_listen {
        None => None,
        Some(section) => {
            let section = section.get_ref();
            let addr = section.addr.get_ref().parse::<SocketAddr>().map_err(|_| {
                at(
                    section.addr.span(),
                    format!(
                        "tls_listen.addr: `{}` is not an IP:port address",
                        section.addr.get_ref()
                    ),
                )
            })?;
            for (other, name) in [(Some(listen), "listen"), (admin_listen, "admin_listen")] {
                if other.is_some_and(|other| binds_overlap(addr, other)) {
                    return Err(at(
                        section.addr.span(),
                        format!(
                            "tls_listen.addr = \"{addr}\" takes the port of {name}: the TLS listener needs an address of its own"
                        ),
                    ));
                }
            }
            Some(TlsListen {
                addr,
                files: crate::tls::ListenFiles {
                    cert_file: file(&section.cert_file, "tls_listen.cert_file")?,
                    key_file: file(&section.key_file, "tls_listen.key_file")?,
                    client_ca_file: section
                        .client_ca_file
                        .as_ref()
                        .map(|f| file(f, "tls_listen.client_ca_file"))
                        .transpose()?,
                },
            })
        }
    };
    let backend_tls = match &raw.backend_tls {
        None => None,
        Some(section) => {
            let span = section.span();
            let section = section.get_ref();
            // Roots from the system's store would make verification depend
            // on the machine (and many containers have none): say which.
            let Some(ca_file) = &section.ca_file else {
                return Err(at(
                    span,
                    "[backend_tls] needs ca_file: the PEM file of the CA certificates that issued the servers' certificates (memring does not use the system's roots)".into(),
                ));
            };
            let client_cert = match (&section.cert_file, &section.key_file) {
                (None, None) => None,
                (Some(cert), Some(key)) => Some((
                    file(cert, "backend_tls.cert_file")?,
                    file(key, "backend_tls.key_file")?,
                )),
                (Some(cert), None) => {
                    return Err(at(
                        cert.span(),
                        "backend_tls.cert_file needs key_file too (the client certificate's private key)".into(),
                    ))
                }
                (None, Some(key)) => {
                    return Err(at(
                        key.span(),
                        "backend_tls.key_file needs cert_file too (the client certificate)".into(),
                    ))
                }
            };
            if let Some(name) = &section.server_name {
                let text = name.get_ref();
                if rustls::pki_types::ServerName::try_from(text.as_str()).is_err() {
                    return Err(at(
                        name.span(),
                        format!("backend_tls.server_name `{text}` is neither a DNS name nor an IP address"),
                    ));
                }
            }
            Some(crate::tls::BackendFiles {
                ca_file: file(ca_file, "backend_tls.ca_file")?,
                client_cert,
                server_name: section.server_name.as_ref().map(|n| n.get_ref().clone()),
            })
        }
    };
    if backend_tls.is_none() {
        let tls_server = raw.servers.iter().find_map(|s| {
            s.get_ref()
                .tls
                .as_ref()
                .filter(|t| *t.get_ref())
                .map(|t| (t.span(), s.get_ref().addr.get_ref().clone()))
        });
        if let Some((span, addr)) = tls_server {
            return Err(at(
                span,
                format!("server `{addr}` has tls = true but there is no [backend_tls] with the ca_file to verify it by"),
            ));
        }
        let discovered = raw
            .discovery
            .as_ref()
            .and_then(|d| d.get_ref().tls.as_ref());
        if let Some(tls) = discovered.filter(|t| *t.get_ref()) {
            return Err(at(
                tls.span(),
                "[discovery] has tls = true but there is no [backend_tls] with the ca_file to verify the servers by".into(),
            ));
        }
    }
    Ok((tls_listen, backend_tls))
}

/// Reads every TLS file named in the config, as start-up will, and says
/// which one is unusable, at the line that names it.
fn check_tls_files(
    raw: &RawConfig,
    at: &dyn Fn(Range<usize>, String) -> ConfigError,
    listen: Option<&TlsListen>,
    backend: Option<&crate::tls::BackendFiles>,
) -> Result<(), ConfigError> {
    // The key that names the file the error is about.
    let span_of = |error: &crate::tls::TlsError| -> Range<usize> {
        let mut spans: Vec<(std::path::PathBuf, Range<usize>)> = Vec::new();
        if let (Some(files), Some(raw)) = (listen, &raw.tls_listen) {
            let raw = raw.get_ref();
            spans.push((files.files.cert_file.clone(), raw.cert_file.span()));
            spans.push((files.files.key_file.clone(), raw.key_file.span()));
            if let (Some(ca), Some(raw_ca)) = (&files.files.client_ca_file, &raw.client_ca_file) {
                spans.push((ca.clone(), raw_ca.span()));
            }
        }
        if let (Some(files), Some(raw)) = (backend, &raw.backend_tls) {
            let section = raw.get_ref();
            if let Some(ca) = &section.ca_file {
                spans.push((files.ca_file.clone(), ca.span()));
            }
            if let (Some((cert, key)), Some(raw_cert), Some(raw_key)) =
                (&files.client_cert, &section.cert_file, &section.key_file)
            {
                spans.push((cert.clone(), raw_cert.span()));
                spans.push((key.clone(), raw_key.span()));
            }
        }
        spans
            .into_iter()
            .find(|(path, _)| *path == error.path)
            .map_or(0..0, |(_, span)| span)
    };
    if let Some(listen) = listen {
        crate::tls::check_listen(&listen.files)
            .map_err(|e| at(span_of(&e), format!("tls_listen: {e}")))?;
    }
    if let Some(backend) = backend {
        crate::tls::check_backend(backend)
            .map_err(|e| at(span_of(&e), format!("backend_tls: {e}")))?;
    }
    Ok(())
}

/// The `[discovery]` table, validated.
fn discovery_settings(
    raw: Option<&Spanned<RawDiscovery>>,
    at: &dyn Fn(Range<usize>, String) -> ConfigError,
) -> Result<Discovery, ConfigError> {
    let mut discovery = Discovery::default();
    let Some(raw) = raw else {
        return Ok(discovery);
    };
    let raw = raw.get_ref();
    for text in [&raw.srv, &raw.a, &raw.resolver].into_iter().flatten() {
        if let Some(byte) = refused_char(text.get_ref()) {
            return Err(at(
                text.span(),
                format!("{:?} contains {byte}", text.get_ref()),
            ));
        }
    }
    discovery.source = match (&raw.srv, &raw.a) {
        (Some(_), Some(a)) => {
            return Err(at(a.span(), "[discovery] takes srv or a, not both".into()))
        }
        (Some(srv), None) => {
            let name = srv.get_ref().trim().trim_end_matches('.');
            if !is_dns_name(name) {
                return Err(at(
                    srv.span(),
                    format!(
                        "[discovery] srv = \"{}\" is not a DNS name (for example \"_memcache._tcp.cache.default.svc\"; no port: the records carry it)",
                        srv.get_ref()
                    ),
                ));
            }
            Some(Source::Srv(name.to_string()))
        }
        (None, Some(a)) => {
            let written = a.get_ref().trim();
            let parsed = written
                .rsplit_once(':')
                .and_then(|(host, port)| Some((host, port.parse::<u16>().ok()?)))
                .filter(|(host, port)| *port > 0 && is_dns_name(host));
            let Some((host, port)) = parsed else {
                return Err(at(
                    a.span(),
                    format!(
                        "[discovery] a = \"{}\" must be host:port, a DNS name and the port its servers listen on (for example \"cache.default.svc:11211\")",
                        a.get_ref()
                    ),
                ));
            };
            Some(Source::A {
                host: host.trim_end_matches('.').to_string(),
                port,
            })
        }
        (None, None) => None,
    };
    if let Some(interval) = &raw.interval_ms {
        let range = 100..=3_600_000;
        if !range.contains(interval.get_ref()) {
            return Err(at(
                interval.span(),
                format!(
                    "interval_ms = {} is out of range {}..={}",
                    interval.get_ref(),
                    range.start(),
                    range.end()
                ),
            ));
        }
        discovery.interval = Duration::from_millis(*interval.get_ref());
    }
    if let Some(resolver) = &raw.resolver {
        let written = resolver.get_ref().trim();
        let server = written.parse::<SocketAddr>().ok().or_else(|| {
            written
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<IpAddr>()
                .ok()
                .map(|ip| SocketAddr::new(ip, DNS_PORT))
        });
        match server {
            Some(server) if server.port() > 0 => discovery.dns.server = Some(server),
            _ => {
                return Err(at(
                    resolver.span(),
                    format!(
                        "resolver = \"{}\" must be the IP address of a DNS server, with a port if not 53 (for example \"127.0.0.1:5353\")",
                        resolver.get_ref()
                    ),
                ))
            }
        }
    }
    discovery.tls = raw.tls.as_ref().is_some_and(|t| *t.get_ref());
    Ok(discovery)
}

/// Letters, digits, `-`, `_` and dots between labels: the names memring asks
/// DNS about.
fn is_dns_name(name: &str) -> bool {
    !name.is_empty()
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// `ejection` and `retry_timeout_ms`.
fn ejection(
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
fn failover(
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

/// Reads one integer setting: its value, a default, and its allowed range.
type NumberSetting<'a> = dyn Fn(&Option<Spanned<u64>>, &str, u64, std::ops::RangeInclusive<u64>) -> Result<u64, ConfigError>
    + 'a;

/// The `hot_key_*` settings, validated.
fn hot_key_settings(
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

/// Whether binding both addresses would fail with "address in use": the same
/// port (0 means any free port, so never) on the same address or where one
/// is a wildcard that covers the other (`0.0.0.0` every IPv4 address, `::`
/// every address, as memring's IPv6 sockets are dual-stack).
fn binds_overlap(a: SocketAddr, b: SocketAddr) -> bool {
    let (a, b) = (canonical(a), canonical(b));
    let covers = |wide: SocketAddr, narrow: SocketAddr| {
        wide.ip().is_unspecified() && (wide.is_ipv6() || narrow.is_ipv4())
    };
    a.port() != 0 && a.port() == b.port() && (a.ip() == b.ip() || covers(a, b) || covers(b, a))
}

/// Looks up a host name and port, as connecting would.
type Lookup<'a> = &'a dyn Fn(&str, u16) -> std::io::Result<Vec<SocketAddr>>;

/// What a server address reaches, to tell two spellings of one memcached
/// apart.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Endpoint {
    /// An IP address and port; an IPv4-mapped IPv6 address as its IPv4
    /// address (a dual-stack socket reaches the same listener).
    Ip(SocketAddr),
    /// A host name, lowercase (DNS names are case-insensitive), and port.
    Name(String, u16),
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Ip(socket) => write!(f, "{socket}"),
            Endpoint::Name(host, port) => write!(f, "{host}:{port}"),
        }
    }
}

/// The endpoint of an address that [`check_server_addr`] accepted, without
/// looking anything up. The port is read as decimal (`011211` is 11211), as
/// the resolver reads it.
fn endpoint_of(addr: &str) -> Option<Endpoint> {
    if let Ok(socket) = addr.parse::<SocketAddr>() {
        return Some(Endpoint::Ip(canonical(socket)));
    }
    let (host, port) = addr.rsplit_once(':')?;
    let port = port.parse::<u16>().ok()?;
    Some(match numeric_ipv4(host) {
        Some(ip) => Endpoint::Ip(SocketAddr::new(IpAddr::V4(ip), port)),
        None => Endpoint::Name(host.to_ascii_lowercase(), port),
    })
}

/// IPv4-mapped IPv6 (`::ffff:a.b.c.d`) as the IPv4 address it maps.
fn canonical(socket: SocketAddr) -> SocketAddr {
    match socket.ip() {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), socket.port()),
            None => socket,
        },
        IpAddr::V4(_) => socket,
    }
}

/// The IPv4 address that glibc's `getaddrinfo` reads from a numeric host
/// before it would ask DNS (its `inet_aton`): one to four parts, each
/// decimal, octal (a leading `0`) or hex (`0x`), the last filling the bytes
/// left. So `127.0.0.01` and `127.1` are 127.0.0.1, and `0127.0.0.1` is
/// 87.0.0.1. A backend address Rust's parser refuses (it reads only dotted
/// decimal without leading zeros) is connected to through `getaddrinfo`, so
/// this is the address memring would reach.
fn numeric_ipv4(host: &str) -> Option<Ipv4Addr> {
    let parts = host
        .split('.')
        .map(inet_part)
        .collect::<Option<Vec<u32>>>()?;
    let (last, leading) = parts.split_last()?;
    if leading.len() > 3 || leading.iter().any(|&part| part > 0xff) {
        return None;
    }
    let last_bits = 32 - 8 * leading.len() as u32;
    if last_bits < 32 && *last >> last_bits != 0 {
        return None;
    }
    let value = leading.iter().enumerate().fold(*last, |value, (i, part)| {
        value | part << (24 - 8 * i as u32)
    });
    Some(Ipv4Addr::from(value))
}

/// One part of an `inet_aton` address: `0x1f`, `017` or `15`.
fn inet_part(part: &str) -> Option<u32> {
    let (digits, radix) = match part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
        Some(hex) => (hex, 16),
        None if part.len() > 1 && part.starts_with('0') => (&part[1..], 8),
        None => (part, 10),
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u32::from_str_radix(digits, radix).ok()
}

/// Pairs of servers (first, second, in config order) that reach a common
/// endpoint, each pair once, with the endpoint they share.
fn aliases(reaches: &[(Range<usize>, Vec<Endpoint>)]) -> Vec<(usize, usize, Endpoint)> {
    let mut first_reacher: HashMap<&Endpoint, usize> = HashMap::new();
    let mut pairs: Vec<(usize, usize, Endpoint)> = Vec::new();
    for (index, (_, endpoints)) in reaches.iter().enumerate() {
        for endpoint in endpoints {
            match first_reacher.get(endpoint) {
                Some(&first) if first != index => {
                    if !pairs.iter().any(|&(a, b, _)| (a, b) == (first, index)) {
                        pairs.push((first, index, endpoint.clone()));
                    }
                }
                Some(_) => {}
                None => {
                    first_reacher.insert(endpoint, index);
                }
            }
        }
    }
    pairs
}

/// `host:port:weight` or `host:port:weight name`, twemproxy's way of writing
/// a server, as the memring lines that say the same.
fn twemproxy_server(addr: &str) -> Option<String> {
    let (server, name) = match addr.split_once(char::is_whitespace) {
        Some((server, name)) => (server, Some(name.trim())),
        None => (addr, None),
    };
    let (host_port, weight) = server.rsplit_once(':')?;
    if weight.is_empty() || !weight.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    check_server_addr(host_port).ok()?;
    let mut lines = format!("addr = \"{host_port}\", weight = {weight}");
    match name {
        Some(name) if !name.is_empty() && !name.contains(char::is_whitespace) => {
            lines.push_str(&format!(", name = \"{name}\""));
        }
        Some(_) => return None,
        None => {}
    }
    Some(lines)
}

/// Every key the config file accepts, derived from the serde structs: each
/// top-level setting (`listen`, `servers`, ...) and, for a key that holds a
/// table or an array of tables, each of its keys as `table.key`
/// (`servers.addr`). The docs checks (tests/integration/docs.rs) use them,
/// so a new key cannot go undocumented.
pub fn setting_names() -> Vec<String> {
    let mut names = Vec::new();
    for key in struct_fields::<RawConfig>() {
        names.push(key.to_string());
        for header in [format!("[{key}]"), format!("[[{key}]]")] {
            names.extend(
                table_keys(&header)
                    .into_iter()
                    .map(|k| format!("{key}.{k}")),
            );
        }
    }
    names
}

/// The keys serde accepts in the table that `header` opens, read from its
/// unknown-key message; none when that key is not a table.
fn table_keys(header: &str) -> Vec<String> {
    const PROBE: &str = "memring_probe_not_a_key";
    let text = format!("listen = \"127.0.0.1:1\"\n{header}\n{PROBE} = 1\n");
    let Err(error) = toml::from_str::<RawConfig>(&text) else {
        return Vec::new();
    };
    match error
        .message()
        .strip_prefix(&format!("unknown field `{PROBE}`, expected "))
    {
        Some(list) => list
            .split('`')
            .skip(1)
            .step_by(2)
            .map(String::from)
            .collect(),
        None => Vec::new(),
    }
}

/// The field names that a derived `Deserialize` passes to
/// `deserialize_struct`, caught by a deserializer that reads nothing.
fn struct_fields<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    struct Fields<'a>(&'a mut &'static [&'static str]);
    impl<'de> serde::Deserializer<'de> for Fields<'_> {
        type Error = serde::de::value::Error;
        fn deserialize_any<V: serde::de::Visitor<'de>>(
            self,
            _: V,
        ) -> Result<V::Value, Self::Error> {
            Err(serde::de::Error::custom("not a struct"))
        }
        fn deserialize_struct<V: serde::de::Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(serde::de::Error::custom("only the field names were wanted"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map
            enum identifier ignored_any
        }
    }
    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(Fields(&mut fields));
    fields
}

/// An example value of every key, for messages about a value of the wrong
/// type: the default where there is one, else a typical value.
const EXAMPLES: &[(&str, &str)] = &[
    ("listen", "\"127.0.0.1:22122\""),
    ("connections_per_server", "1"),
    ("connect_timeout_ms", "500"),
    ("request_timeout_ms", "1000"),
    ("max_value_bytes", "1048576"),
    ("max_client_connections", "16384"),
    ("max_pending_per_client", "256"),
    ("shutdown_grace_ms", "5000"),
    ("auto_eject", "true"),
    ("failure_limit", "3"),
    ("ejection", "\"twemproxy\""),
    ("retry_timeout_ms", "30000"),
    ("client_idle_timeout_ms", "60000"),
    ("admin_listen", "\"127.0.0.1:9100\""),
    ("replicas", "2"),
    ("read_miss_fallthrough", "true"),
    ("workers", "4"),
    ("max_client_buffer_bytes", "8388608"),
    ("max_buffer_bytes", "268435456"),
    ("client_write_timeout_ms", "30000"),
    ("handoff_ms", "300000"),
    ("shared_with", "\"writers\""),
    ("state_file", "\"/var/lib/memring/handoff-state\""),
    ("ring", "\"twemproxy\""),
    ("hash", "\"fnv1a_64\""),
    ("hash_tag", "\"{}\""),
    ("hot_key_detect", "true"),
    ("hot_key_window_ms", "1000"),
    ("hot_key_share", "0.2"),
    ("hot_key_top", "20"),
    ("hot_key_metrics", "true"),
    ("hot_key_coalesce", "true"),
    ("hot_key_cache_ms", "100"),
    ("hot_key_cache_bytes", "67108864"),
    ("discovery", "{ interval_ms = 5000 }"),
    ("srv", "\"_memcache._tcp.cache.default.svc\""),
    ("a", "\"cache.default.svc:11211\""),
    ("interval_ms", "5000"),
    ("resolver", "\"127.0.0.1:5353\""),
    ("addr", "\"10.0.0.1:11211\""),
    ("weight", "2"),
    ("name", "\"cache-01\""),
    ("tls", "true"),
    ("cert_file", "\"server.pem\""),
    ("key_file", "\"server.key\""),
    ("client_ca_file", "\"clients-ca.pem\""),
    ("ca_file", "\"ca.pem\""),
    ("server_name", "\"cache.internal\""),
    (
        "pools",
        "[{ name = \"sessions\", servers = [{ addr = \"10.0.0.9:11211\" }] }]",
    ),
    ("routes", "[{ prefix = \"sess:\", pool = \"default\" }]"),
    ("default_pool", "\"default\""),
    ("prefix", "\"sess:\""),
    ("failover", "\"gutter\""),
    ("failover_ttl_s", "10"),
    ("pool", "\"sessions\""),
    ("shadow", "{ pool = \"candidate\", fraction = 0.1 }"),
    ("fraction", "0.1"),
];

/// serde's and toml's messages, rewritten for people where they are not:
/// an unknown key gets the nearest known one instead of the list of all, and
/// a value of the wrong type gets its key and an example. `at` is where the
/// error's span starts.
fn explain_toml_error(message: &str, text: &str, at: usize) -> String {
    if let Some(rest) = message.strip_prefix("unknown field `") {
        let Some((unknown, expected)) = rest.split_once('`') else {
            return message.to_string();
        };
        let known: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
        let place = if known.contains(&"weight") {
            " in [[servers]]"
        } else if known.contains(&"srv") {
            " in [discovery]"
        } else if known.contains(&"prefix") {
            " in [[routes]]"
        } else if known.contains(&"handoff_ms") && !known.contains(&"workers") {
            if struct_fields::<RawConfig>().contains(&unknown) {
                return format!(
                    "`{unknown}` is set for the whole process, not per pool: write it at the top of the file, before any [[pools]]"
                );
            }
            " in [[pools]]"
        } else {
            ""
        };
        return match nearest(unknown, &known) {
            Some(near) => format!("unknown key `{unknown}`{place}; did you mean `{near}`?"),
            None => format!(
                "unknown key `{unknown}`{place}: no key is spelt like it (docs/configuration.md lists them all)"
            ),
        };
    }
    let Some((found, expected)) = message
        .strip_prefix("invalid type: ")
        .or_else(|| message.strip_prefix("invalid value: "))
        .and_then(|rest| rest.split_once(", expected "))
    else {
        return message.to_string();
    };
    let Some(key) = key_at(text, at) else {
        return message.to_string();
    };
    let wanted = match expected {
        "u64" => "a whole number, 0 or more",
        "i64" => "a whole number",
        "f64" => "a number",
        "a boolean" => "true or false",
        "a string" => "a quoted string",
        "a sequence" => "an array",
        other => other,
    };
    let found = if found == "map" { "a table" } else { found };
    if key == "servers" {
        return format!(
            "servers: expected {wanted}, found {found}; write one [[servers]] table (double brackets) per server, for example [[servers]] with addr = \"10.0.0.1:11211\" on the next line"
        );
    }
    match EXAMPLES.iter().find(|(name, _)| *name == key) {
        Some((_, example)) => {
            format!("{key}: expected {wanted}, found {found}; for example: {key} = {example}")
        }
        None => format!("{key}: expected {wanted}, found {found}"),
    }
}

/// The key whose value (or table header) starts at byte `at` of `text`: the
/// last part of `key =` before it on its line, or the name of a
/// `[table]` / `[[table]]` header that begins there.
fn key_at(text: &str, at: usize) -> Option<&str> {
    let at = at.min(text.len());
    let line_start = text[..at].rfind('\n').map_or(0, |nl| nl + 1);
    let before = text[..at].trim_end();
    if before.len() <= line_start {
        let line = text[line_start..].lines().next().unwrap_or("");
        let name = line
            .trim()
            .trim_start_matches('[')
            .split(']')
            .next()?
            .trim();
        return (!name.is_empty()).then_some(name);
    }
    let key = before[line_start..].strip_suffix('=')?.trim_end();
    // The key ends the line's text; an inline table may come before it.
    let key = key
        .rsplit(|c: char| !(c.is_ascii_alphanumeric() || "_-.\"'".contains(c)))
        .next()?;
    let key = key
        .rsplit('.')
        .next()?
        .trim_matches(|c| c == '"' || c == '\'');
    (!key.is_empty()).then_some(key)
}

/// The known name nearest to `unknown`, if it is near enough to be a slip:
/// at most a third of the longer name's letters changed (rounded up), with
/// a swap of two neighbours counted as one change.
fn nearest<'a>(unknown: &str, known: &[&'a str]) -> Option<&'a str> {
    let unknown = unknown.to_ascii_lowercase();
    let (distance, near) = known
        .iter()
        .map(|name| (edit_distance(&unknown, name), *name))
        .min_by_key(|(distance, _)| *distance)?;
    let longer = unknown.chars().count().max(near.chars().count());
    (distance <= longer.div_ceil(3)).then_some(near)
}

/// Insertions, deletions, substitutions and swaps of adjacent characters
/// that turn `a` into `b` (optimal string alignment distance).
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // rows[i][j]: distance between a[..i] and b[..j].
    let mut rows = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in rows[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (rows[i - 1][j] + 1)
                .min(rows[i][j - 1] + 1)
                .min(rows[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = best;
        }
    }
    rows[a.len()][b.len()]
}

/// The first character that may not appear in a server's name or address,
/// described for a person. Names and addresses are printed in `stats`
/// replies, metric labels and log lines, where a quote, a backslash or a
/// control byte would break the line or its quoting.
fn refused_char(text: &str) -> Option<String> {
    text.chars().find_map(|c| match c {
        '"' => Some("a double quote (\")".to_string()),
        '\\' => Some("a backslash (\\)".to_string()),
        '\0' => Some("a NUL byte (0x00)".to_string()),
        '\x7f' => Some("a DEL byte (0x7f)".to_string()),
        c if (c as u32) < 0x20 => Some(format!("a control byte (0x{:02x})", c as u32)),
        _ => None,
    })
}

/// `host:port` with a port from 1 to 65535 and a plausible host (an IP address,
/// `[v6]`, or a DNS name resolved at connect time).
fn check_server_addr(addr: &str) -> Result<(), &'static str> {
    if let Ok(socket) = addr.parse::<SocketAddr>() {
        return if socket.port() == 0 {
            Err("port must be a number from 1 to 65535")
        } else {
            Ok(())
        };
    }
    let (host, port) = addr.rsplit_once(':').ok_or("expected host:port")?;
    match port.parse::<u16>() {
        Ok(p) if p > 0 => {}
        _ => return Err("port must be a number from 1 to 65535"),
    }
    let host_ok = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'_');
    if host_ok {
        Ok(())
    } else {
        Err("host must be an IP address or a DNS name")
    }
}

/// 1-based line and column of a byte offset.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before
        .rfind('\n')
        .map_or(before.len(), |nl| before.len() - nl - 1)
        + 1;
    (line, column)
}

impl Config {
    /// Worker threads to run: `workers`, or one per CPU this process may use
    /// (affinity and cgroup quota respected, as `available_parallelism` reads
    /// them), at least one.
    pub fn worker_count(&self) -> usize {
        if self.workers > 0 {
            return self.workers;
        }
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    }

    /// Reply bytes one client may be owed before memring stops reading it.
    pub fn client_buffer_bytes(&self, max_value_bytes: usize) -> usize {
        self.max_client_buffer_bytes
            .unwrap_or(max_value_bytes + CLIENT_BUFFER_HEADROOM_BYTES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
listen = "127.0.0.1:22122"

[[servers]]
addr = "127.0.0.1:11211"

[[servers]]
addr = "127.0.0.1:11212"
weight = 2
name = "cache-02"
"#;

    fn error_of(text: &str) -> String {
        Config::parse(text, "memring.toml").unwrap_err().to_string()
    }

    #[test]
    fn tls_on_a_server_without_backend_tls_is_refused_at_its_line() {
        let text = "listen = \"127.0.0.1:1\"\n[[servers]]\naddr = \"127.0.0.1:2\"\ntls = true\n";
        let error = error_of(text);
        assert!(
            error.starts_with("memring.toml:4:7: server `127.0.0.1:2` has tls = true but there is no [backend_tls]"),
            "{error}"
        );
    }

    #[test]
    fn tls_for_discovered_servers_needs_backend_tls_and_marks_every_server() {
        let base = "listen = \"127.0.0.1:1\"\n[discovery]\nsrv = \"_m._tcp.cache\"\ntls = true\n";
        let error = error_of(base);
        assert!(
            error.starts_with(
                "memring.toml:4:7: [discovery] has tls = true but there is no [backend_tls]"
            ),
            "{error}"
        );
        let text = format!("{base}[backend_tls]\nca_file = \"ca.pem\"\n");
        let config = Config::parse(&text, "memring.toml").expect("valid");
        assert!(config.discovery.tls);
        let plain = Config::parse(
            "listen = \"127.0.0.1:1\"\n[discovery]\nsrv = \"_m._tcp.cache\"\n",
            "memring.toml",
        )
        .expect("valid");
        assert!(!plain.discovery.tls);
    }

    #[test]
    fn backend_tls_needs_a_ca_file_and_both_halves_of_a_client_certificate() {
        let base = "listen = \"127.0.0.1:1\"\n[[servers]]\naddr = \"127.0.0.1:2\"\ntls = true\n";
        let error = error_of(&format!("{base}[backend_tls]\nserver_name = \"cache\"\n"));
        assert!(
            error.starts_with("memring.toml:5:1: [backend_tls] needs ca_file"),
            "{error}"
        );
        let error = error_of(&format!(
            "{base}[backend_tls]\nca_file = \"ca.pem\"\ncert_file = \"c.pem\"\n"
        ));
        assert!(
            error.starts_with("memring.toml:7:13: backend_tls.cert_file needs key_file"),
            "{error}"
        );
        let error = error_of(&format!(
            "{base}[backend_tls]\nca_file = \"ca.pem\"\nserver_name = \"not a name\"\n"
        ));
        assert!(
            error.contains("7:15: backend_tls.server_name `not a name`"),
            "{error}"
        );
    }

    #[test]
    fn the_state_file_is_beside_the_config_unless_set() {
        let servers = "[[servers]]\naddr = \"127.0.0.1:2\"\n";
        let at = Path::new("/etc/memring/memring.toml");
        let unset = Config::parse(
            &format!("listen = \"127.0.0.1:7000\"\n{servers}"),
            "/etc/memring/memring.toml",
        )
        .unwrap();
        assert_eq!(
            unset.state_file, None,
            "only the binary fills in the default"
        );
        assert_eq!(
            unset.with_default_state_file(at).state_file.as_deref(),
            Some(Path::new("/etc/memring/memring.toml.handoff-state"))
        );
        for (written, path) in [
            ("state/windows", "/etc/memring/state/windows"),
            (
                "/var/lib/memring/handoff-state",
                "/var/lib/memring/handoff-state",
            ),
        ] {
            let text =
                format!("listen = \"127.0.0.1:7000\"\nstate_file = \"{written}\"\n{servers}");
            let config = Config::parse(&text, "/etc/memring/memring.toml").unwrap();
            let config = config.with_default_state_file(at);
            assert_eq!(config.state_file.as_deref(), Some(Path::new(path)));
        }
        let error = Config::parse(
            &format!("listen = \"127.0.0.1:7000\"\nstate_file = \" \"\n{servers}"),
            "m.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("state_file must name a file"), "{error}");
    }

    #[test]
    fn tls_paths_are_relative_to_the_config_file_and_tls_listen_needs_its_own_port() {
        let text = "listen = \"127.0.0.1:7000\"\n[tls_listen]\naddr = \"127.0.0.1:7001\"\ncert_file = \"s.pem\"\nkey_file = \"/abs/s.key\"\n[backend_tls]\nca_file = \"ca.pem\"\n[[servers]]\naddr = \"127.0.0.1:2\"\ntls = true\n";
        let config = Config::parse(text, "/etc/memring/memring.toml").unwrap();
        let listen = config.tls_listen.expect("tls_listen");
        assert_eq!(listen.files.cert_file, Path::new("/etc/memring/s.pem"));
        assert_eq!(listen.files.key_file, Path::new("/abs/s.key"));
        assert_eq!(
            config.backend_tls.expect("backend_tls").ca_file,
            Path::new("/etc/memring/ca.pem")
        );
        assert!(config.servers[0].tls);
        let error = error_of(&text.replace("127.0.0.1:7001", "127.0.0.1:7000"));
        assert!(
            error.contains("3:8: tls_listen.addr = \"127.0.0.1:7000\" takes the port of listen"),
            "{error}"
        );
        let error = error_of(&text.replace("cert_file", "cert_fil"));
        assert!(
            error.contains("unknown key `cert_fil`; did you mean `cert_file`?"),
            "{error}"
        );
    }

    #[test]
    fn a_missing_or_unparsable_tls_file_is_an_error_at_the_line_naming_it() {
        let dir = std::env::temp_dir().join(format!("memring-config-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("ca.pem"), "not a certificate\n").unwrap();
        let path = dir.join("memring.toml");
        let text = "listen = \"127.0.0.1:1\"\n[backend_tls]\nca_file = \"ca.pem\"\n[[servers]]\naddr = \"127.0.0.1:2\"\ntls = true\n";
        std::fs::write(&path, text).unwrap();
        let error = Config::load(&path).unwrap_err().to_string();
        assert!(
            error.contains("memring.toml:3:11: backend_tls: ")
                && error.contains("ca.pem: holds no PEM certificate"),
            "{error}"
        );
        std::fs::write(&path, text.replace("ca.pem", "missing.pem")).unwrap();
        let error = Config::load(&path).unwrap_err().to_string();
        assert!(
            error.contains(":3:11: backend_tls: ") && error.contains("missing.pem: cannot read"),
            "{error}"
        );
        // Parsing alone reads no file.
        assert!(Config::parse(text, "memring.toml").is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn good_config_gets_defaults_and_identities() {
        let config = Config::parse(GOOD, "memring.toml").unwrap();
        assert_eq!(config.listen, "127.0.0.1:22122".parse().unwrap());
        assert_eq!(config.servers.len(), 2);
        assert_eq!(config.servers[0].name, "127.0.0.1:11211");
        assert_eq!(config.servers[0].weight, 1);
        assert_eq!(config.servers[1].name, "cache-02");
        assert_eq!(config.servers[1].weight, 2);
        assert_eq!(config.connections_per_server, 1);
        assert_eq!(config.limits.max_value_bytes, 1024 * 1024);
    }

    #[test]
    fn duplicate_server_names_file_line_and_first_place() {
        let text = GOOD.replace("127.0.0.1:11212", "127.0.0.1:11211");
        let message = error_of(&text);
        assert!(
            message.starts_with("memring.toml:8:8: duplicate server `127.0.0.1:11211`"),
            "{message}"
        );
        assert!(message.contains("first at line 4"), "{message}");
    }

    #[test]
    fn weight_zero_is_rejected_with_its_place() {
        let message = error_of(&GOOD.replace("weight = 2", "weight = 0"));
        assert!(message.starts_with("memring.toml:9:10: "), "{message}");
        assert!(message.contains("weight 0"), "{message}");
    }

    #[test]
    fn bad_addresses_are_rejected() {
        for bad in [
            "127.0.0.1",
            "127.0.0.1:0",
            "127.0.0.1:99999",
            "bad host:1",
            ":11211",
        ] {
            let message = error_of(&GOOD.replace("127.0.0.1:11212", bad));
            assert!(message.contains("server addr"), "{bad}: {message}");
        }
        assert!(error_of(&GOOD.replace("127.0.0.1:22122", "nowhere")).contains("listen"));
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let message = error_of(&format!("{GOOD}\nmax_conns = 3\n"));
        assert!(
            message.contains("unknown key `max_conns` in [[servers]]"),
            "{message}"
        );
        assert!(message.starts_with("memring.toml:12:1"), "{message}");
    }

    #[test]
    fn an_unknown_key_gets_the_nearest_known_key_not_the_list_of_all() {
        for (written, suggested) in [
            ("handof_ms", Some("handoff_ms")),
            ("handoff", Some("handoff_ms")),
            ("hnadoff_ms", Some("handoff_ms")),
            ("handoff_msec", Some("handoff_ms")),
            ("Listen", Some("listen")),
            ("server", Some("servers")),
            ("replica", Some("replicas")),
            ("hot_keys_share", Some("hot_key_share")),
            ("request_timeout", Some("request_timeout_ms")),
            ("max_conns", None),
            ("distribution", None),
            ("timeout", None),
        ] {
            let message = error_of(&format!("{written} = 1\n{GOOD}"));
            let expected = match suggested {
                Some(near) => format!("memring.toml:1:1: unknown key `{written}`; did you mean `{near}`?"),
                None => format!("memring.toml:1:1: unknown key `{written}`: no key is spelt like it (docs/configuration.md lists them all)"),
            };
            assert_eq!(message, expected, "{written}");
        }
        for (written, suggested) in [
            ("address", "addr"),
            ("adr", "addr"),
            ("weigth", "weight"),
            ("nmae", "name"),
        ] {
            let message = error_of(&GOOD.replace("weight = 2", &format!("{written} = 2")));
            assert_eq!(
                message,
                format!("memring.toml:9:1: unknown key `{written}` in [[servers]]; did you mean `{suggested}`?")
            );
        }
    }

    #[test]
    fn a_value_of_the_wrong_type_names_its_key_and_an_example() {
        for (written, expected) in [
            ("request_timeout_ms = \"100\"", "1:22: request_timeout_ms: expected a whole number, 0 or more, found string \"100\"; for example: request_timeout_ms = 1000"),
            ("max_value_bytes = -1", "1:19: max_value_bytes: expected a whole number, 0 or more, found integer `-1`; for example: max_value_bytes = 1048576"),
            ("replicas = 1.5", "1:12: replicas: expected a whole number, 0 or more, found floating point `1.5`; for example: replicas = 2"),
            ("auto_eject = \"yes\"", "1:14: auto_eject: expected true or false, found string \"yes\"; for example: auto_eject = true"),
            ("hot_key_share = \"x\"", "1:17: hot_key_share: expected a number, found string \"x\"; for example: hot_key_share = 0.2"),
            ("ring = 5", "1:8: ring: expected a quoted string, found integer `5`; for example: ring = \"twemproxy\""),
            ("  \"handoff_ms\" = true", "1:18: handoff_ms: expected a whole number, 0 or more, found boolean `true`; for example: handoff_ms = 300000"),
        ] {
            let message = error_of(&format!("{written}\n{GOOD}"));
            assert_eq!(message, format!("memring.toml:{expected}"), "{written}");
        }
        let inline =
            "listen = \"127.0.0.1:1\"\nservers = [{ addr = \"127.0.0.1:2\", weight = true }]\n";
        assert!(
            error_of(inline).starts_with("memring.toml:2:45: weight: expected a whole number, found boolean `true`; for example: weight = 2"),
            "{}",
            error_of(inline)
        );
        let message = error_of(&GOOD.replace("weight = 2", "weight = \"2\""));
        assert_eq!(message, "memring.toml:9:10: weight: expected a whole number, found string \"2\"; for example: weight = 2");
        let message = error_of(&GOOD.replace("name = \"cache-02\"", "name = 2"));
        assert!(message.ends_with("name: expected a quoted string, found integer `2`; for example: name = \"cache-01\""), "{message}");
        let message = error_of("listen = \"127.0.0.1:1\"\n[servers]\naddr = \"127.0.0.1:2\"\n");
        assert!(
            message.starts_with("memring.toml:2:1: servers: expected an array, found a table; write one [[servers]] table (double brackets) per server"),
            "{message}"
        );
    }

    #[test]
    fn every_key_has_an_example_that_loads() {
        let known = |text: &str| -> Vec<String> {
            let message = toml::from_str::<RawConfig>(text)
                .unwrap_err()
                .message()
                .to_string();
            let (_, list) = message
                .split_once("expected one of ")
                .expect("serde lists the keys");
            list.split('`')
                .skip(1)
                .step_by(2)
                .map(String::from)
                .collect()
        };
        let top = known(&format!("unknown_key = 1\n{GOOD}"));
        let server = known(&GOOD.replace("weight = 2", "unknown_key = 2"));
        assert!(top.len() > 20 && server.len() == 4, "{top:?} {server:?}");
        // The keys of the TLS tables, each with an example for messages.
        let tables = ["tls_listen", "backend_tls"];
        let mut table_keys: Vec<String> = tables
            .iter()
            .flat_map(|table| known(&format!("{GOOD}\n[{table}]\nunknown_key = 1\n")))
            .filter(|key| !server.contains(key))
            .collect();
        table_keys.sort();
        table_keys.dedup();
        for key in &table_keys {
            assert!(
                EXAMPLES.iter().any(|(name, _)| name == key),
                "no example for `{key}`"
            );
        }
        for key in top
            .iter()
            .chain(&server)
            .filter(|k| *k != "servers" && !tables.contains(&k.as_str()))
        {
            let (_, example) = EXAMPLES
                .iter()
                .find(|(name, _)| name == key)
                .unwrap_or_else(|| panic!("no example for `{key}`"));
            let text = if server.contains(key) {
                let addr = if key == "addr" {
                    ""
                } else {
                    "addr = \"127.0.0.1:2\"\n"
                };
                // `tls = true` needs a [backend_tls].
                format!("listen = \"127.0.0.1:1\"\n[backend_tls]\nca_file = \"ca.pem\"\n[[servers]]\n{key} = {example}\n{addr}")
            } else if key == "listen" {
                GOOD.replace("\"127.0.0.1:22122\"", example)
            } else if key == "shadow" {
                // A shadow is another pool.
                format!("{key} = {example}\n{GOOD}[[pools]]\nname = \"candidate\"\n[[pools.servers]]\naddr = \"127.0.0.1:3\"\n")
            } else {
                let ring = if key == "ring" {
                    ""
                } else {
                    "ring = \"twemproxy\"\n"
                };
                // retry_timeout_ms belongs to twemproxy's ejection timing.
                let ejection = if key == "retry_timeout_ms" {
                    "ejection = \"twemproxy\"\n"
                } else {
                    ""
                };
                // failover names a gutter pool; failover_ttl_s needs one.
                let (failover, gutter) = match key.as_str() {
                    "failover" | "failover_ttl_s" => (
                        if key == "failover_ttl_s" { "failover = \"gutter\"\n" } else { "" },
                        "\n[[pools]]\nname = \"gutter\"\n[[pools.servers]]\naddr = \"10.0.0.8:11211\"\n",
                    ),
                    _ => ("", ""),
                };
                format!("{ring}{ejection}{failover}{key} = {example}\n{GOOD}{gutter}")
            };
            assert!(
                Config::parse(&text, "m").is_ok(),
                "{key} = {example}: {:?}",
                Config::parse(&text, "m").err()
            );
        }
        // The keys of [discovery] have examples of their own.
        let discovery = ["srv", "a", "interval_ms", "resolver"];
        // A pool's keys are top-level keys; a route's have their own, and
        // a shadow's `pool` is a route's.
        let route = ["prefix", "pool"];
        let shadow = ["fraction"];
        assert_eq!(
            EXAMPLES.len(),
            top.len() - 1 - tables.len()
                + server.len()
                + table_keys.len()
                + discovery.len()
                + route.len()
                + shadow.len(),
            "an example of a key that is gone"
        );
    }

    #[test]
    fn setting_names_are_the_keys_serde_accepts() {
        let names = setting_names();
        let server: Vec<&str> = names
            .iter()
            .filter_map(|n| n.strip_prefix("servers."))
            .collect();
        assert_eq!(server, ["addr", "weight", "name", "tls"]);
        assert!(names.iter().any(|n| n == "listen") && names.iter().any(|n| n == "servers"));
        // The TLS tables' keys share one example each (`addr` is the
        // servers' already).
        let tables = ["tls_listen", "backend_tls"];
        let mut table_keys: Vec<&str> = names
            .iter()
            .filter_map(|n| n.split_once('.'))
            .filter(|(table, key)| tables.contains(table) && !server.contains(key))
            .map(|(_, key)| key)
            .collect();
        table_keys.sort_unstable();
        table_keys.dedup();
        let mut keys: Vec<&str> = names
            .iter()
            .filter(|n| !n.contains('.') && *n != "servers" && !tables.contains(&n.as_str()))
            .map(String::as_str)
            .chain(server.iter().copied())
            .chain(table_keys)
            .chain(names.iter().filter_map(|n| n.strip_prefix("discovery.")))
            .chain(names.iter().filter_map(|n| n.strip_prefix("routes.")))
            .chain(names.iter().filter_map(|n| n.strip_prefix("shadow.")))
            .chain(
                names
                    .iter()
                    .filter_map(|n| n.strip_prefix("pools."))
                    .filter(|k| *k != "servers"),
            )
            .collect();
        // `tls` is a key of a server and of [discovery]: one example serves.
        keys.sort_unstable();
        keys.dedup();
        for key in &keys {
            assert!(
                EXAMPLES.iter().any(|(name, _)| name == key),
                "`{key}` has no example"
            );
        }
        assert_eq!(EXAMPLES.len(), keys.len());
    }

    #[test]
    fn twemproxy_server_lines_are_answered_with_the_memring_lines() {
        for (written, lines) in [
            (
                "127.0.0.1:11211:1",
                "addr = \"127.0.0.1:11211\", weight = 1",
            ),
            (
                "127.0.0.1:11211:2 cache-01",
                "addr = \"127.0.0.1:11211\", weight = 2, name = \"cache-01\"",
            ),
            (
                "cache.internal:11211:10  cache-01",
                "addr = \"cache.internal:11211\", weight = 10, name = \"cache-01\"",
            ),
            ("[::1]:11211:1", "addr = \"[::1]:11211\", weight = 1"),
        ] {
            let message = error_of(&GOOD.replace("127.0.0.1:11212", written));
            assert_eq!(
                message,
                format!("memring.toml:8:8: server addr `{written}` is twemproxy's `host:port:weight [name]` form; in memring write {lines}")
            );
        }
        // Not the twemproxy form: the usual message.
        for other in [
            "127.0.0.1:11211:x",
            "127.0.0.1:11211:1 two names",
            "nohost:1:1:1",
        ] {
            let message = error_of(&GOOD.replace("127.0.0.1:11212", other));
            assert!(!message.contains("twemproxy"), "{other}: {message}");
        }
    }

    #[test]
    fn host_names_and_ipv6_are_accepted() {
        let text = GOOD.replace("127.0.0.1:11212", "cache-02.internal:11211");
        assert!(Config::parse(&text, "m").is_ok());
        let text = GOOD.replace("127.0.0.1:11212", "[::1]:11211");
        assert!(Config::parse(&text, "m").is_ok());
    }

    #[test]
    fn no_servers_is_an_error() {
        assert!(error_of("listen = \"127.0.0.1:1\"\n").contains("no [[servers]]"));
    }

    #[test]
    fn more_replicas_than_servers_is_a_warning_not_an_error() {
        let config = Config::parse(&format!("replicas = 3\n{GOOD}"), "m").unwrap();
        let warnings = config.warnings();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].starts_with("replicas = 3 but only 2 servers"));
        let config = Config::parse(&format!("replicas = 2\n{GOOD}"), "m").unwrap();
        assert!(config.warnings().is_empty());
    }

    #[test]
    fn ring_hash_and_hash_tag_are_read() {
        let config = Config::parse(
            &format!("ring = \"twemproxy\"\nhash = \"murmur\"\nhash_tag = \"{{}}\"\n{GOOD}"),
            "m",
        )
        .unwrap();
        assert_eq!(config.ring.flavour, Flavour::Twemproxy);
        assert_eq!(config.ring.hash, HashFunction::Murmur);
        assert_eq!(config.ring.hash_tag, Some(*b"{}"));
        let default = Config::parse(GOOD, "m").unwrap();
        assert_eq!(default.ring, Spec::default());
        let libmemcached = Config::parse(&format!("ring = \"libmemcached\"\n{GOOD}"), "m").unwrap();
        // Weights 1 and 2 of two servers: floor(1/3 × 80) × 4 and
        // floor(2/3 × 80) × 4 points.
        assert_eq!(libmemcached.build_ring().point_count(), 104 + 212);
    }

    #[test]
    fn bad_ring_settings_are_rejected_with_their_place() {
        let message = error_of(&format!("ring = \"ketama\"\n{GOOD}"));
        assert!(
            message.starts_with("memring.toml:1:8: ring = \"ketama\""),
            "{message}"
        );
        assert!(
            message.contains("memring, twemproxy, libmemcached"),
            "{message}"
        );
        let message = error_of(&format!("ring = \"twemproxy\"\nhash = \"sha1\"\n{GOOD}"));
        assert!(
            message.starts_with("memring.toml:2:8: hash = \"sha1\""),
            "{message}"
        );
        let message = error_of(&format!("hash = \"md5\"\n{GOOD}"));
        assert!(
            message.contains("hash applies to ring = \"twemproxy\""),
            "{message}"
        );
        let message = error_of(&format!(
            "ring = \"libmemcached\"\nhash = \"murmur\"\n{GOOD}"
        ));
        assert!(message.contains("md5 only"), "{message}");
        for tag in ["{", "{}}", "{ ", ""] {
            let message = error_of(&format!("hash_tag = \"{tag}\"\n{GOOD}"));
            assert!(
                message.contains("two printable ASCII characters"),
                "{tag}: {message}"
            );
        }
    }

    #[test]
    fn hot_key_settings_have_defaults_and_bounds() {
        let default = Config::parse(GOOD, "m").unwrap().hot_keys;
        assert_eq!(default, HotKeySettings::default());
        assert!(default.coalesce && default.cache_ttl.is_none());
        let set = Config::parse(
            &format!("hot_key_share = 0.5\nhot_key_cache_ms = 100\nhot_key_metrics = true\nhot_key_coalesce = false\n{GOOD}"),
            "m",
        )
        .unwrap()
        .hot_keys;
        assert_eq!(set.share, 0.5);
        assert_eq!(set.cache_ttl, Some(Duration::from_millis(100)));
        assert!(set.metrics_names && !set.coalesce);
        for bad in ["0.0", "1.5", "-0.1", "nan"] {
            let message = error_of(&format!("hot_key_share = {bad}\n{GOOD}"));
            assert!(
                message.starts_with("memring.toml:1:17: hot_key_share"),
                "{bad}: {message}"
            );
        }
        let off = Config::parse(&format!("hot_key_detect = false\n{GOOD}"), "m")
            .unwrap()
            .hot_keys;
        assert!(!off.detect && !off.coalesce);
        let message = error_of(&format!(
            "hot_key_detect = false\nhot_key_cache_ms = 100\n{GOOD}"
        ));
        assert!(
            message.starts_with("memring.toml:1:18: hot_key_detect = false leaves"),
            "{message}"
        );
        let message = error_of(&format!("hot_key_window_ms = 5\n{GOOD}"));
        assert!(
            message.contains("hot_key_window_ms = 5 is out of range"),
            "{message}"
        );
    }

    #[test]
    fn quotes_backslashes_and_control_bytes_are_refused_in_names_and_addresses() {
        // (as written in TOML, what the message names)
        for (written, named) in [
            (r#"\""#, "a double quote (\")"),
            (r"\\", "a backslash (\\)"),
            (r"\u0000", "a NUL byte (0x00)"),
            (r"\u0007", "a control byte (0x07)"),
            (r"\t", "a control byte (0x09)"),
            (r"\n", "a control byte (0x0a)"),
            (r"\u001f", "a control byte (0x1f)"),
            (r"\u007f", "a DEL byte (0x7f)"),
        ] {
            let addr = GOOD.replace("127.0.0.1:11212", &format!("127.0.0.1{written}:11212"));
            let message = error_of(&addr);
            assert!(
                message.starts_with("memring.toml:8:8: server addr"),
                "{written}: {message}"
            );
            assert!(
                message.contains(&format!("contains {named}")),
                "{written}: {message}"
            );
            let name = GOOD.replace("cache-02", &format!("cache{written}02"));
            let message = error_of(&name);
            assert!(
                message.starts_with("memring.toml:10:8: server name"),
                "{written}: {message}"
            );
            assert!(
                message.contains(&format!("contains {named}")),
                "{written}: {message}"
            );
        }
        // Other non-ASCII text is a name like any other.
        let config = Config::parse(&GOOD.replace("cache-02", "cache-ü"), "m").unwrap();
        assert_eq!(config.servers[1].name, "cache-ü");
    }

    /// Two servers: 127.0.0.1:11211 at line 5 and `second` at line 7.
    fn two_servers(second: &str, replicas: u32) -> String {
        format!(
            "listen = \"127.0.0.1:22122\"\nreplicas = {replicas}\n\n[[servers]]\naddr = \"127.0.0.1:11211\"\n[[servers]]\naddr = \"{second}\"\n"
        )
    }

    #[test]
    fn spellings_of_one_memcached_are_one_server() {
        for alias in [
            "127.0.0.01:11211",
            "127.0.0.1:011211",
            "[::ffff:127.0.0.1]:11211",
            "[0:0:0:0:0:ffff:7f00:1]:11211",
            "127.1:11211",
            "0x7f.0.0.1:11211",
            "0177.0.0.1:11211",
            "2130706433:11211",
        ] {
            let config = Config::parse(&two_servers(alias, 1), "m").unwrap();
            let warnings = config.warnings();
            assert_eq!(warnings.len(), 1, "{alias}: {warnings:?}");
            assert_eq!(
                warnings[0],
                format!("servers `127.0.0.1:11211` (line 5) and `{alias}` (line 7) are the same memcached (127.0.0.1:11211): it gets the keys of both")
            );
            let message = error_of(&two_servers(alias, 2));
            assert!(
                message.starts_with(&format!("memring.toml:7:8: server `{alias}` is the same memcached as `127.0.0.1:11211` (line 5; both reach 127.0.0.1:11211): with replicas = 2")),
                "{alias}: {message}"
            );
        }
        let names = "listen = \"127.0.0.1:1\"\nreplicas = 2\n[[servers]]\naddr = \"cache.internal:11211\"\n[[servers]]\naddr = \"CACHE.internal:11211\"\n";
        assert!(error_of(names).contains("both reach cache.internal:11211"));
        // Near spellings of other memcacheds are other servers.
        for other in [
            "127.0.0.1:11212",
            "127.0.0.010:11211", // octal: 127.0.0.8
            "0127.0.0.1:11211",  // octal: 87.0.0.1
            "127.0.0.2:11211",
            "[::1]:11211",
            "cache.internal:11211",
        ] {
            let config = Config::parse(&two_servers(other, 2), "m").unwrap();
            assert!(
                config.warnings().is_empty(),
                "{other}: {:?}",
                config.warnings()
            );
        }
    }

    #[test]
    fn numeric_hosts_are_read_as_getaddrinfo_reads_them() {
        // The system resolver is the oracle: these never reach DNS.
        for host in [
            "127.0.0.1",
            "127.0.0.01",
            "127.0.0.010",
            "0127.0.0.1",
            "127.00.0.1",
            "127.1",
            "127.0.1",
            "0x7f.0.0.1",
            "0X7F.1",
            "2130706433",
            "0",
            "10.0x10.255.0377",
            "1.65535",
            "1.2.65535",
        ] {
            let resolved: Vec<IpAddr> = (host, 1)
                .to_socket_addrs()
                .unwrap_or_else(|e| panic!("{host}: {e}"))
                .map(|socket| socket.ip())
                .collect();
            let ours = numeric_ipv4(host).map(IpAddr::V4);
            assert_eq!(resolved, Vec::from_iter(ours), "{host}");
        }
        // Not numbers to getaddrinfo either: it asks DNS for these.
        for name in [
            "127.0.0.08",
            "127.0.0.256",
            "1.2.3.4.5",
            "127.0.0.1.",
            "127..1",
            "0x",
            "1.16777216",
            "4294967296",
            "cache-01",
            "+1.2.3.4",
        ] {
            assert_eq!(numeric_ipv4(name), None, "{name}");
        }
    }

    #[test]
    fn a_host_name_and_its_address_are_one_server_once_resolved() {
        let text = two_servers("localhost:11211", 1);
        // Without looking names up, a name is only its spelling.
        assert!(Config::parse(&text, "m").unwrap().warnings().is_empty());
        let warnings = Config::parse_and_resolve(&text, "m").unwrap().warnings();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0]
                .contains("`localhost:11211` (line 7) are the same memcached (127.0.0.1:11211)"),
            "{warnings:?}"
        );
        let message = Config::parse_and_resolve(&two_servers("localhost:11211", 3), "m")
            .unwrap_err()
            .to_string();
        assert!(
            message.starts_with("m:7:8: server `localhost:11211` is the same memcached"),
            "{message}"
        );
    }

    #[test]
    fn a_name_that_does_not_resolve_is_a_warning_naming_the_server() {
        // RFC 6761: .invalid names never resolve.
        let config =
            Config::parse_and_resolve(&two_servers("memring-test.invalid:11211", 2), "m").unwrap();
        let warnings = config.warnings();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].starts_with(
                "server `memring-test.invalid:11211` (line 7): `memring-test.invalid` does not resolve ("
            ),
            "{warnings:?}"
        );
    }

    #[test]
    fn admin_listen_on_the_port_of_listen_is_refused() {
        for (listen, admin, refused) in [
            ("127.0.0.1:22122", "127.0.0.1:22122", true),
            ("127.0.0.1:22122", "[::ffff:127.0.0.1]:22122", true),
            ("0.0.0.0:22122", "127.0.0.1:22122", true),
            ("127.0.0.1:22122", "0.0.0.0:22122", true),
            ("[::]:22122", "10.0.0.1:22122", true),
            ("[::1]:22122", "[::1]:22122", true),
            ("127.0.0.1:22122", "127.0.0.1:9100", false),
            ("127.0.0.1:22122", "127.0.0.2:22122", false),
            ("0.0.0.0:22122", "[::1]:22122", false),
            ("127.0.0.1:0", "127.0.0.1:0", false),
        ] {
            let text = GOOD.replace(
                "listen = \"127.0.0.1:22122\"",
                &format!("listen = \"{listen}\"\nadmin_listen = \"{admin}\""),
            );
            match Config::parse(&text, "memring.toml") {
                Ok(_) => assert!(!refused, "{listen} {admin}: accepted"),
                Err(e) => {
                    let message = e.to_string();
                    assert!(refused, "{listen} {admin}: {message}");
                    assert_eq!(
                        message,
                        format!("memring.toml:3:16: admin_listen = \"{admin}\" takes the port of listen = \"{listen}\" (line 2): the admin listener needs an address of its own")
                    );
                }
            }
        }
    }

    #[test]
    fn discovery_lists_the_pool_instead_of_servers() {
        let text = "listen = \"127.0.0.1:1\"\n[discovery]\nsrv = \"_memcache._tcp.cache.default.svc.\"\ninterval_ms = 250\nresolver = \"127.0.0.1:5353\"\n";
        let config = Config::parse(text, "m").unwrap();
        assert!(config.servers.is_empty());
        assert!(config.warnings().is_empty(), "{:?}", config.warnings());
        let discovery = &config.discovery;
        assert_eq!(
            discovery.source,
            Some(Source::Srv("_memcache._tcp.cache.default.svc".into()))
        );
        assert_eq!(discovery.interval, Duration::from_millis(250));
        assert_eq!(
            discovery.dns.server,
            Some("127.0.0.1:5353".parse().unwrap())
        );
        let a = Config::parse(
            "listen = \"127.0.0.1:1\"\n[discovery]\na = \"cache.default.svc:11211\"\nresolver = \"10.96.0.10\"\n",
            "m",
        )
        .unwrap();
        assert_eq!(
            a.discovery.source,
            Some(Source::A {
                host: "cache.default.svc".into(),
                port: 11211
            })
        );
        assert_eq!(
            a.discovery.dns.server,
            Some("10.96.0.10:53".parse().unwrap())
        );
        // Without srv or a: only where and how often names are looked up.
        let names = Config::parse(
            &format!("{GOOD}\n[discovery]\nresolver = \"[::1]:53\"\n"),
            "m",
        )
        .unwrap();
        assert_eq!(names.discovery.source, None);
        assert_eq!(names.servers.len(), 2);
        assert_eq!(
            Config::parse(GOOD, "m").unwrap().discovery.interval,
            Duration::from_millis(DEFAULT_DISCOVERY_INTERVAL_MS)
        );
    }

    #[test]
    fn bad_discovery_settings_are_rejected_with_their_place() {
        let base = "listen = \"127.0.0.1:1\"\n[discovery]\n";
        for (body, expected) in [
            (
                "srv = \"_m._tcp.x\"\na = \"x:1\"\n",
                "m:4:5: [discovery] takes srv or a, not both",
            ),
            (
                "srv = \"_m._tcp.x:11211\"\n",
                "m:3:7: [discovery] srv = \"_m._tcp.x:11211\" is not a DNS name",
            ),
            (
                "a = \"cache.svc\"\n",
                "m:3:5: [discovery] a = \"cache.svc\" must be host:port",
            ),
            (
                "a = \"cache.svc:0\"\n",
                "m:3:5: [discovery] a = \"cache.svc:0\"",
            ),
            (
                "interval_ms = 10\n",
                "m:3:15: interval_ms = 10 is out of range 100..=3600000",
            ),
            (
                "resolver = \"dns.local:53\"\n",
                "m:3:12: resolver = \"dns.local:53\" must be the IP address of a DNS server",
            ),
            (
                "intervall_ms = 100\n",
                "m:3:1: unknown key `intervall_ms` in [discovery]; did you mean `interval_ms`?",
            ),
            (
                "",
                "no [[servers]]: at least one server is needed (or [discovery] with srv or a)",
            ),
        ] {
            let message = Config::parse(&format!("{base}{body}"), "m")
                .unwrap_err()
                .to_string();
            assert!(message.contains(expected), "{body}: {message}");
        }
        let both = format!("{GOOD}\n[discovery]\nsrv = \"_m._tcp.x\"\n");
        let message = Config::parse(&both, "m").unwrap_err().to_string();
        assert!(
            message.starts_with("m:4:1: [[servers]] and [discovery] srv _m._tcp.x both list the default pool's servers"),
            "{message}"
        );
    }

    #[test]
    fn a_servers_ring_place_comes_from_its_name_as_written_not_its_address() {
        // Two spellings that reach the same memcached are two places; the
        // same name is one place whatever it resolves to (resolution never
        // enters the ring).
        let named = |addr: &str| {
            Config::parse(
                &format!("listen = \"127.0.0.1:1\"\n[[servers]]\naddr = \"{addr}\"\n[[servers]]\naddr = \"cache-1.svc:11211\"\n"),
                "m",
            )
            .unwrap()
            .build_ring()
        };
        assert_eq!(named("cache-0.svc:11211"), named("cache-0.svc:11211"));
        assert_ne!(named("cache-0.svc:11211"), named("10.0.0.7:11211"));
        for flavour in ["twemproxy", "libmemcached"] {
            let ring = |addr: &str| {
                Config::parse(
                    &format!("ring = \"{flavour}\"\nlisten = \"127.0.0.1:1\"\n[[servers]]\naddr = \"{addr}\"\n[[servers]]\naddr = \"b.svc:1\"\n"),
                    "m",
                )
                .unwrap()
                .build_ring()
            };
            assert_eq!(ring("a.svc:1"), ring("a.svc:1"), "{flavour}");
        }
    }

    #[test]
    fn out_of_range_settings_are_rejected() {
        let message = error_of(&format!("connections_per_server = 0\n{GOOD}"));
        assert!(
            message.starts_with("memring.toml:1:26: connections_per_server"),
            "{message}"
        );
    }

    #[test]
    fn shared_with_says_who_else_uses_the_servers_and_a_drop_in_ring_without_it_is_warned() {
        let parse = |text: &str| Config::parse(&format!("{text}\n{GOOD}"), "memring.toml");
        assert_eq!(parse("").unwrap().shared_with, SharedWith::Memring);
        for value in SharedWith::ALL {
            let config = parse(&format!("shared_with = \"{}\"", value.name())).unwrap();
            assert_eq!(config.shared_with, value);
        }
        assert_eq!(
            (
                SharedWith::Memring.reads_through(),
                SharedWith::Memring.copies()
            ),
            (true, true)
        );
        assert_eq!(
            (
                SharedWith::Readers.reads_through(),
                SharedWith::Readers.copies()
            ),
            (true, false)
        );
        assert_eq!(
            (
                SharedWith::Writers.reads_through(),
                SharedWith::Writers.copies()
            ),
            (false, false)
        );
        let message = error_of(&format!("shared_with = \"nutcracker\"\n{GOOD}"));
        assert!(
            message.starts_with("memring.toml:1:15: shared_with = \"nutcracker\" is not who shares the servers (one of: memring, readers, writers)"),
            "{message}"
        );
        // A drop-in ring without the setting is warned about; with it, or
        // without a window, or on memring's own ring, it is not.
        let warned = |text: &str| {
            parse(text)
                .unwrap()
                .warnings()
                .iter()
                .any(|w| w.contains("shared_with is not set"))
        };
        assert!(warned("ring = \"twemproxy\""));
        assert!(warned("ring = \"libmemcached\""));
        assert!(!warned("ring = \"twemproxy\"\nshared_with = \"memring\""));
        assert!(!warned("ring = \"twemproxy\"\nshared_with = \"writers\""));
        assert!(!warned("ring = \"twemproxy\"\nhandoff_ms = 0"));
        assert!(!warned(""));
        // A pool takes the top level's value or sets its own.
        let pools = Config::parse(
            &format!("shared_with = \"readers\"\n{GOOD}\n[[pools]]\nname = \"a\"\n[[pools.servers]]\naddr = \"127.0.0.1:5\"\n[[pools]]\nname = \"b\"\nshared_with = \"writers\"\n[[pools.servers]]\naddr = \"127.0.0.1:6\"\n"),
            "memring.toml",
        )
        .unwrap();
        assert_eq!(
            pools.pool("a").unwrap().config.shared_with,
            SharedWith::Readers
        );
        assert_eq!(
            pools.pool("b").unwrap().config.shared_with,
            SharedWith::Writers
        );
    }

    #[test]
    fn twemproxy_ejection_takes_nutcrackers_defaults_and_retry_needs_it() {
        let parse = |text: &str| Config::parse(&format!("{text}\n{GOOD}"), "memring.toml");
        let own = parse("").unwrap();
        assert_eq!((own.ejection, own.failure_limit), (Ejection::Memring, 3));
        let twemproxy = parse("ejection = \"twemproxy\"").unwrap();
        assert_eq!(
            (twemproxy.ejection, twemproxy.failure_limit),
            (
                Ejection::Twemproxy {
                    retry: Duration::from_millis(30_000)
                },
                2
            ),
            "server_retry_timeout and server_failure_limit as nutcracker's defaults"
        );
        let set =
            parse("ejection = \"twemproxy\"\nretry_timeout_ms = 3000\nfailure_limit = 5").unwrap();
        assert_eq!(
            (set.ejection, set.failure_limit),
            (
                Ejection::Twemproxy {
                    retry: Duration::from_millis(3000)
                },
                5
            )
        );
        let message = error_of(&format!("retry_timeout_ms = 3000\n{GOOD}"));
        assert!(
            message.starts_with(
                "memring.toml:1:20: retry_timeout_ms applies to ejection = \"twemproxy\""
            ),
            "{message}"
        );
        let message = error_of(&format!("ejection = \"nutcracker\"\n{GOOD}"));
        assert!(
            message.ends_with(
                "ejection = \"nutcracker\" is not an ejection timing (one of: memring, twemproxy)"
            ),
            "{message}"
        );
    }
}
