//! The TOML config file: `RawConfig` (what serde reads, with source spans) is
//! validated into `Config` (what memring runs on), and every problem is reported
//! as `file:line:column: what is wrong`. No I/O beyond reading the file and,
//! in [`Config::load`] and [`Config::parse_and_resolve`], looking up server
//! host names to tell two spellings of one memcached apart.
//!
//! One job per file: `raw.rs` (the serde structs and the list of every key),
//! `build.rs` (one pool's `Config` from its raw table, step by step;
//! `servers.rs` its `[[servers]]`),
//! `pools.rs` (`[[pools]]`, `[[routes]]`, shadows: the config of each pool),
//! one file per section (`discovery.rs`, `tls.rs`, `ring.rs`,
//! `hot_keys.rs`, `request_log.rs`, `ejection.rs` with `failover`, `shared_with.rs`),
//! `addr.rs` (what an address is and reaches), `diagnose.rs` (messages for
//! people: did-you-mean, examples, `line:column`) and `defaults.rs` (every
//! default and limit). What a reload changes is `control::settings::setting_changes`.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::time::Duration;

use crate::error::ConfigError;
use crate::protocol::Limits;
use crate::ring::{Member, Node, Ring, Spec};

mod addr;
mod build;
mod defaults;
mod diagnose;
mod discovery;
mod ejection;
mod hot_keys;
mod pools;
mod raw;
mod read_balance;
mod request_log;
mod ring;
mod servers;
mod shared_with;
mod tls;

pub use addr::Listen;
use addr::Lookup;
pub use defaults::*;
use diagnose::{at_in, explain_toml_error};
pub use discovery::{CutOff, Discovery, EtcdAccess, EtcdSource, Source};
pub use ejection::{Ejection, Failover};
pub use hot_keys::HotKeySettings;
pub use pools::{PoolConfig, Route, ShadowConfig, DEFAULT_POOL};
pub use raw::setting_names;
use raw::RawConfig;
pub use read_balance::{ReadBalance, ReadBalanceMode};
pub use request_log::RequestLogSettings;
pub use shared_with::{FlushNewServers, SharedWith};

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
    /// Warming: the server takes writes for the keys it will own, beside
    /// their current owners, and serves no reads yet (an etcd member in
    /// `JOINING`). Not on the ring until it stops warming.
    pub warming: bool,
    /// Staged out: on the ring in force, but not on the ring a membership
    /// change has staged (the fleet has not switched to it yet): the keys'
    /// staged owners take their writes too (see `Topology::staged_replicas`).
    /// Never set by a config file.
    pub staged_out: bool,
    /// Staged in: not on the ring in force, on the staged ring (it joins
    /// with the staged change). Unlike a warming server it gets no write
    /// itself, only a delete of each key written that it will own: another
    /// sidecar that has not staged the change yet writes only to the key's
    /// owner now, so a value here could be older than that write by the
    /// time reads move here; a miss is read through from the previous
    /// owner instead. Never set by a config file.
    pub staged_in: bool,
    /// Staged reweight: on the ring in force with `weight`, on the staged
    /// ring with this weight (the keys it moves are staged as a join's
    /// are: their staged owners get deletes). Never set by a config file.
    pub staged_weight: Option<u32>,
    /// `zone`: with zones, a key's replicas are in distinct zones, and a
    /// sidecar reads from its own zone's replica first (docs/zones.md).
    pub zone: Option<String>,
}

impl ServerConfig {
    /// Server `name` at `addr`: weight 1, no TLS, not warming nor staged,
    /// in no zone. Set the rest with `..ServerConfig::plain(name, addr)`.
    pub fn plain(name: impl Into<String>, addr: impl Into<String>) -> ServerConfig {
        ServerConfig {
            addr: addr.into(),
            name: name.into(),
            weight: 1,
            tls: false,
            warming: false,
            staged_out: false,
            staged_in: false,
            staged_weight: None,
            zone: None,
        }
    }

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
            zone: self.zone.clone(),
        }
    }
}

/// A validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `listen` (with `listen_mode`): where clients connect.
    pub listen: Listen,
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
    /// Requests one worker may have in flight to one server; past it a
    /// request is answered `SERVER_ERROR server busy` at once (0: no limit).
    pub max_server_inflight: usize,
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
    /// `read_balance`, `read_balance_epsilon`: which live replica a read
    /// goes to first, by load (see `plan::placement::order_read`).
    pub read_balance: ReadBalance,
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
    /// `flush_new_servers`: whether a server new to the ring is flushed
    /// before it joins (`control/newcomers.rs`).
    pub flush_new_servers: FlushNewServers,
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
    /// `[request_log]`: which finished requests get a log line, read at
    /// start.
    pub request_log: RequestLogSettings,
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
    /// `zone` (or `MEMRING_ZONE`, which wins): the zone this sidecar runs
    /// in, whose replica of a key it reads first.
    pub zone: Option<String>,
    /// `zone_write_back`: a hit found in another zone is copied to the
    /// key's replica in this sidecar's zone (through the hand-off's lease).
    pub zone_write_back: bool,
    /// `zone_fallback`: after a local miss or error, the other zones'
    /// replicas are asked one after another (the default) or all at once.
    pub zone_fallback: ZoneFallback,
    /// `warming_zones`: every server in these zones is warming (written,
    /// never read), whatever its own `warming` says.
    pub warming_zones: Vec<String>,
}

/// How a read asks the other zones' replicas of a key after its local
/// replica missed or failed (`zone_fallback`, docs/zones.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ZoneFallback {
    /// One after another, in ring order (`"in_order"`).
    #[default]
    InOrder,
    /// All of them at once; the first hit answers (`"all_at_once"`).
    AllAtOnce,
}

impl ZoneFallback {
    /// As written in the file.
    pub fn as_str(self) -> &'static str {
        match self {
            ZoneFallback::InOrder => "in_order",
            ZoneFallback::AllAtOnce => "all_at_once",
        }
    }
}

impl Config {
    /// Reads and validates a config file.
    ///
    /// # Errors
    /// The file cannot be read, is not valid TOML, or fails validation.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let shown = path.display().to_string();
        let text = crate::inputs::regular_file::read_to_string(
            path,
            crate::inputs::regular_file::MAX_CONFIG_FILE_BYTES,
        )
        .map_err(|source| ConfigError::Read {
            path: shown.clone(),
            source,
        })?;
        Config::parse_and_resolve(&text, &shown)?.with_zone_from_env(&shown)
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
            crate::inputs::resolve::block_on(|| async { dns.addresses(host, port).await })
                .map_err(|e| std::io::Error::other(e.detail))
        };
        match dns.server {
            None => Config::parse_with(text, path, Some(&system)),
            Some(_) => Config::parse_with(text, path, Some(&named)),
        }
    }

    /// Why a server that comes from elsewhere than the file (an etcd
    /// member) could not be a `[[servers]]` table with this `name` and
    /// `addr`, if it could not.
    pub fn check_server(name: &str, addr: &str) -> Result<(), String> {
        if let Some(byte) = addr::refused_char(name).or_else(|| addr::refused_char(addr)) {
            return Err(format!("contains {byte}"));
        }
        if name.trim().is_empty() || name.contains(char::is_whitespace) {
            return Err("a name must be non-empty and contain no whitespace".into());
        }
        addr::check_server_addr(addr).map_err(|e| format!("addr `{addr}`: {e}"))
    }

    /// This config with `servers` as its server list (what discovery found).
    /// Discovery fills in the top-level pool, `default`: when it is one of
    /// several, its entry in `pools` gets the same list.
    pub fn with_servers(&self, mut servers: Vec<ServerConfig>) -> Config {
        mark_warming_zones(&mut servers, &self.warming_zones);
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
        let at = at_in(text, path);
        let raw: RawConfig = toml::from_str(text).map_err(|e| {
            let span = e.span().unwrap_or(0..0);
            let message = e.message().trim_end().replace('\n', " ");
            at(span.clone(), explain_toml_error(&message, text, span.start))
        })?;
        pools::build(&raw, text, path, lookup)
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

    /// The ring members, in config order: every server but the warming
    /// ones, which are not on the ring yet.
    pub fn members(&self) -> Vec<Member> {
        self.servers
            .iter()
            .filter(|s| !s.warming)
            .map(ServerConfig::member)
            .collect()
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
        let most = crate::ring::rendezvous::MAX_SERVERS_UNDER_A_MICROSECOND;
        if self.ring.flavour == crate::ring::Flavour::Rendezvous && self.servers.len() > most {
            warnings.push(format!(
                "ring = \"rendezvous\" with {} servers: a rendezvous lookup scores the key on every server, which takes over 1 µs per key above {most} servers (docs/rings.md)",
                self.servers.len()
            ));
        }
        if !self.servers.is_empty() && self.servers.iter().all(|s| s.warming) {
            warnings.push(
                "every server is warming: none is on the ring, so every request answers SERVER_ERROR until one stops warming".to_string(),
            );
        }
        warnings.extend(self.zone_warnings());
        warnings.extend(self.server_warnings.iter().cloned());
        warnings
    }

    /// What is odd about this pool's zones: zones that store far more than
    /// their share of copies, a sidecar zone no server is in, zones that
    /// place nothing.
    fn zone_warnings(&self) -> Vec<String> {
        let zoned = self.servers.iter().any(|s| s.zone.is_some());
        let mut warnings = Vec::new();
        match (&self.zone, zoned) {
            (Some(zone), false) if !self.servers.is_empty() => warnings.push(format!(
                "this sidecar is in zone `{zone}` but no server has a zone: reads go to each key's first replica as without zones"
            )),
            (Some(zone), true) if !self.servers.iter().any(|s| s.zone.as_ref() == Some(zone)) => {
                warnings.push(format!(
                    "this sidecar is in zone `{zone}` but no server is: every read crosses zones"
                ));
            }
            _ => {}
        }
        for zone in &self.warming_zones {
            if !self.servers.iter().any(|s| s.zone.as_ref() == Some(zone)) {
                warnings.push(format!(
                    "warming_zones lists zone `{zone}`, which no server is in"
                ));
            }
        }
        if !zoned {
            return warnings;
        }
        if self.replicas <= 1 {
            warnings.push(
                "servers have zones but replicas = 1: each key has one copy, so zones place nothing and a lost zone loses its keys".to_string(),
            );
            return warnings;
        }
        let shares = crate::ring::zones::zone_shares(&self.build_ring(), self.replicas);
        warnings.extend(crate::ring::zones::overloaded(&shares, self.replicas));
        warnings
    }

    /// Each zone's servers, ring share and copies (empty without zones).
    pub fn zone_shares(&self) -> Vec<crate::ring::zones::ZoneShare> {
        crate::ring::zones::zone_shares(&self.build_ring(), self.replicas)
    }

    /// Why `zone` cannot be a zone name (of a server or a sidecar), if it
    /// cannot.
    pub fn check_zone(zone: &str) -> Result<(), String> {
        servers::check_zone(zone)
    }

    /// This config, and every pool's, with the sidecar's zone `zone`
    /// (`MEMRING_ZONE`, which wins over the file's `zone`).
    ///
    /// # Errors
    /// `zone` is not a valid zone name.
    pub fn with_zone(mut self, zone: &str, path: &str) -> Result<Config, ConfigError> {
        servers::check_zone(zone).map_err(|problem| ConfigError::Refused {
            path: path.to_string(),
            message: format!("MEMRING_ZONE {problem}"),
        })?;
        self.zone = Some(zone.to_string());
        for pool in &mut self.pools {
            let mut config = (*pool.config).clone();
            config.zone = Some(zone.to_string());
            pool.config = std::sync::Arc::new(config);
        }
        Ok(self)
    }

    /// [`Config::with_zone`] with `MEMRING_ZONE` when it is set.
    ///
    /// # Errors
    /// `MEMRING_ZONE` is set to an invalid zone name.
    pub fn with_zone_from_env(self, path: &str) -> Result<Config, ConfigError> {
        match std::env::var("MEMRING_ZONE") {
            Ok(zone) => self.with_zone(&zone, path),
            Err(_) => Ok(self),
        }
    }

    /// The ring nodes (members with their addresses), in config order; the
    /// warming servers are not members.
    pub fn ring_nodes(&self) -> Vec<Node> {
        self.servers
            .iter()
            .filter(|s| !s.warming)
            .map(ServerConfig::node)
            .collect()
    }

    /// The ring of every configured server but the warming ones, in the
    /// configured flavour.
    pub fn build_ring(&self) -> Ring {
        Ring::build_with(&self.ring, self.ring_nodes())
    }

    /// The ring the warming servers are staged to join: every configured
    /// server's.
    pub fn build_staged_ring(&self) -> Ring {
        Ring::build_with(
            &self.ring,
            self.servers.iter().map(ServerConfig::node).collect(),
        )
    }
}

/// Marks every server in one of `zones` warming.
pub(crate) fn mark_warming_zones(servers: &mut [ServerConfig], zones: &[String]) {
    for server in servers {
        if server.zone.as_ref().is_some_and(|z| zones.contains(z)) {
            server.warming = true;
        }
    }
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
mod tests;
