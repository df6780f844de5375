//! One pool's [`Config`] from its raw table: every setting validated, at
//! the line that sets it. The steps run in the order of the file's
//! sections, so a file with several mistakes is told about the same one
//! first every time.

use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::time::Duration;

use toml::Spanned;

use super::addr::{binds_overlap, parse_listen, Listen, ListenError, Lookup};
use super::diagnose::{at_in, line_column, At, NumberSetting};
use super::discovery::discovery_settings;
use super::ejection::{ejection, failover};
use super::hot_keys::hot_key_settings;
use super::raw::RawConfig;
use super::read_balance::read_balance;
use super::request_log::request_log_settings;
use super::ring::{check_weights, ring_spec};
use super::servers::ServerList;
use super::shared_with::{flush_new_servers, shared_with, unshared_ring_warning};
use super::tls::{check_tls_files, tls_settings};
use super::{
    Config, Discovery, Ejection, DEFAULT_CLIENT_WRITE_TIMEOUT_MS, DEFAULT_CONNECTIONS_PER_SERVER,
    DEFAULT_CONNECT_TIMEOUT_MS, DEFAULT_FAILURE_LIMIT, DEFAULT_HANDOFF_MS,
    DEFAULT_MAX_BUFFER_BYTES, DEFAULT_MAX_CLIENT_CONNECTIONS, DEFAULT_MAX_PENDING_PER_CLIENT,
    DEFAULT_MAX_SERVER_INFLIGHT, DEFAULT_POOL, DEFAULT_REQUEST_TIMEOUT_MS,
    DEFAULT_SHUTDOWN_GRACE_MS, DEFAULT_WORKERS, MAX_VALUE_BYTES_LIMIT, TWEMPROXY_FAILURE_LIMIT,
};
use crate::error::ConfigError;
use crate::protocol::{Limits, DEFAULT_MAX_GET_LINE_BYTES, DEFAULT_MAX_LINE_BYTES};

impl Config {
    /// One pool's config from `raw` (the top level, or a `[[pools]]` entry
    /// laid over it by `pools.rs`).
    pub(super) fn build_pool(
        raw: &RawConfig,
        text: &str,
        path: &str,
        lookup: Option<Lookup<'_>>,
    ) -> Result<Config, ConfigError> {
        let at = at_in(text, path);
        let number = |field: &Option<Spanned<u64>>, name: &str, default, range| {
            read_number(&at, field, name, default, range)
        };

        let (listen, admin_listen) = listeners(raw, text, &at)?;
        let discovery = discovery_settings(raw.discovery.as_ref(), path, &at)?;
        servers_or_discovery(raw, &discovery, &at)?;
        let mut servers = ServerList::read(raw, text, &at, lookup)?;
        let connections = Connections::read(raw, &number)?;
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
        servers.check_aliases(text, &at, replicas)?;
        let serving = Serving::read(raw, &number)?;
        let shared_with = shared_with(raw, &at)?;
        let read_balance = read_balance(raw, &at)?;
        let flush_new_servers = flush_new_servers(raw, &at)?;
        let failover = failover(raw, &at, &number, replicas)?;
        let ring = ring_spec(raw, &at)?;
        check_weights(raw, &ring, &at)?;
        servers
            .warnings
            .extend(unshared_ring_warning(raw, serving.handoff_ms, &ring));
        let hot_keys = hot_key_settings(raw, &at, &number)?;
        let request_log = request_log_settings(raw.request_log.as_ref(), &at)?;
        let (tls_listen, backend_tls) = tls_settings(raw, &at, path, listen.tcp(), admin_listen)?;
        let state_file = state_file(raw, path, &at)?;
        let zone = raw
            .zone
            .as_ref()
            .map(|z| super::servers::zone_name(z, "zone", &at))
            .transpose()?;
        let warming_zones = warming_zones(raw, &at)?;
        let zone_fallback = match raw.zone_fallback.as_ref() {
            None => super::ZoneFallback::InOrder,
            Some(text) => match text.get_ref().as_str() {
                "in_order" => super::ZoneFallback::InOrder,
                "all_at_once" => super::ZoneFallback::AllAtOnce,
                other => {
                    return Err(at(
                        text.span(),
                        format!(
                            "zone_fallback = {other:?}: expected \"in_order\" or \"all_at_once\""
                        ),
                    ))
                }
            },
        };
        super::mark_warming_zones(&mut servers.servers, &warming_zones);
        if lookup.is_some() {
            check_tls_files(raw, &at, tls_listen.as_ref(), backend_tls.as_ref())?;
        }

        Ok(Config {
            ring,
            listen,
            servers: servers.servers,
            connections_per_server: connections.per_server as usize,
            connect_timeout: Duration::from_millis(connections.connect_timeout_ms),
            request_timeout: Duration::from_millis(connections.request_timeout_ms),
            limits: Limits {
                max_line_bytes: DEFAULT_MAX_LINE_BYTES,
                max_get_line_bytes: DEFAULT_MAX_GET_LINE_BYTES,
                max_value_bytes: connections.max_value_bytes as usize,
                max_keys_per_get: crate::protocol::DEFAULT_MAX_KEYS_PER_GET,
            },
            max_client_connections: connections.max_client_connections as usize,
            max_pending_per_client: connections.max_pending_per_client as usize,
            max_server_inflight: connections.max_server_inflight as usize,
            shutdown_grace: Duration::from_millis(connections.shutdown_grace_ms),
            auto_eject: raw.auto_eject.unwrap_or(false),
            failure_limit: failure_limit as u32,
            ejection,
            client_idle_timeout: (serving.client_idle_timeout_ms > 0)
                .then(|| Duration::from_millis(serving.client_idle_timeout_ms)),
            admin_listen,
            replicas: replicas as usize,
            read_miss_fallthrough: raw.read_miss_fallthrough.unwrap_or(false),
            read_balance,
            max_value_from_servers: raw.max_value_bytes.is_none(),
            workers: serving.workers as usize,
            max_client_buffer_bytes: serving.max_client_buffer_bytes,
            max_buffer_bytes: serving.max_buffer_bytes as usize,
            client_write_timeout: Duration::from_millis(serving.client_write_timeout_ms),
            handoff: Duration::from_millis(serving.handoff_ms),
            shared_with,
            flush_new_servers,
            state_file,
            failover,
            hot_keys,
            server_warnings: servers.warnings,
            tls_listen,
            backend_tls,
            discovery,
            request_log,
            pools: Vec::new(),
            routes: Vec::new(),
            default_pool: DEFAULT_POOL.to_string(),
            zone,
            zone_write_back: raw.zone_write_back.unwrap_or(true),
            zone_fallback,
            warming_zones,
        })
    }
}

/// `warming_zones`: zone names, each valid and listed once.
fn warming_zones(raw: &RawConfig, at: &At<'_>) -> Result<Vec<String>, ConfigError> {
    let Some(zones) = &raw.warming_zones else {
        return Ok(Vec::new());
    };
    let mut list: Vec<String> = Vec::new();
    for zone in zones.get_ref() {
        if let Err(problem) = super::servers::check_zone(zone) {
            return Err(at(zones.span(), format!("warming_zones: zone {problem}")));
        }
        if list.contains(zone) {
            return Err(at(
                zones.span(),
                format!("warming_zones lists zone `{zone}` twice"),
            ));
        }
        list.push(zone.clone());
    }
    Ok(list)
}

/// `field`'s value, `default` when unset, an error at its place when out of
/// `range`.
fn read_number(
    at: &At<'_>,
    field: &Option<Spanned<u64>>,
    name: &str,
    default: u64,
    range: RangeInclusive<u64>,
) -> Result<u64, ConfigError> {
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
}

/// `listen` (an IP:port address or `unix:PATH`, with `listen_mode`) and
/// `admin_listen` (an IP:port address): they do not take each other's port.
fn listeners(
    raw: &RawConfig,
    text: &str,
    at: &At<'_>,
) -> Result<(Listen, Option<SocketAddr>), ConfigError> {
    let mode = raw.listen_mode.as_ref();
    let listen = parse_listen(
        "listen",
        raw.listen.get_ref(),
        mode.map(|m| m.get_ref().as_str()),
    )
    .map_err(|e| match (e, mode) {
        (ListenError::Mode(message), Some(mode)) => at(mode.span(), message),
        (ListenError::Addr(message) | ListenError::Mode(message), _) => {
            at(raw.listen.span(), message)
        }
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
    if let (Some(admin), Some(admin_raw), Some(listen)) =
        (admin_listen, &raw.admin_listen, listen.tcp())
    {
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
    Ok((listen, admin_listen))
}

/// The default pool's servers come from `[[servers]]` or from `[discovery]`
/// records: exactly one of them.
fn servers_or_discovery(
    raw: &RawConfig,
    discovery: &Discovery,
    at: &At<'_>,
) -> Result<(), ConfigError> {
    match (&discovery.source, raw.servers.first()) {
        // etcd lists the servers, beside any in the file.
        (None, None) if discovery.etcd.is_some() => Ok(()),
        (None, None) => Err(at(
            0..0,
            "no [[servers]]: at least one server is needed (or [discovery] with srv, a or etcd_endpoints)".into(),
        )),
        (Some(source), Some(first)) => Err(at(
            first.span(),
            format!(
                "[[servers]] and [discovery] {source} both list the default pool's servers: keep one of them"
            ),
        )),
        _ => Ok(()),
    }
}

/// The settings of the connections to servers and from clients, read
/// before the ejection settings.
struct Connections {
    per_server: u64,
    connect_timeout_ms: u64,
    request_timeout_ms: u64,
    max_value_bytes: u64,
    max_client_connections: u64,
    max_pending_per_client: u64,
    max_server_inflight: u64,
    shutdown_grace_ms: u64,
}

impl Connections {
    fn read(raw: &RawConfig, number: &NumberSetting<'_>) -> Result<Connections, ConfigError> {
        Ok(Connections {
            per_server: number(
                &raw.connections_per_server,
                "connections_per_server",
                DEFAULT_CONNECTIONS_PER_SERVER,
                1..=64,
            )?,
            connect_timeout_ms: number(
                &raw.connect_timeout_ms,
                "connect_timeout_ms",
                DEFAULT_CONNECT_TIMEOUT_MS,
                1..=60_000,
            )?,
            request_timeout_ms: number(
                &raw.request_timeout_ms,
                "request_timeout_ms",
                DEFAULT_REQUEST_TIMEOUT_MS,
                1..=600_000,
            )?,
            max_value_bytes: number(
                &raw.max_value_bytes,
                "max_value_bytes",
                crate::protocol::DEFAULT_MAX_VALUE_BYTES as u64,
                1..=MAX_VALUE_BYTES_LIMIT,
            )?,
            max_client_connections: number(
                &raw.max_client_connections,
                "max_client_connections",
                DEFAULT_MAX_CLIENT_CONNECTIONS,
                1..=1_000_000,
            )?,
            max_pending_per_client: number(
                &raw.max_pending_per_client,
                "max_pending_per_client",
                DEFAULT_MAX_PENDING_PER_CLIENT,
                1..=65_536,
            )?,
            max_server_inflight: number(
                &raw.max_server_inflight,
                "max_server_inflight",
                DEFAULT_MAX_SERVER_INFLIGHT,
                0..=1_000_000,
            )?,
            shutdown_grace_ms: number(
                &raw.shutdown_grace_ms,
                "shutdown_grace_ms",
                DEFAULT_SHUTDOWN_GRACE_MS,
                0..=600_000,
            )?,
        })
    }
}

/// How clients are served (idle and write timeouts, workers, reply
/// buffers) and how long a hand-off window lasts, read after the servers'
/// replicas.
struct Serving {
    client_idle_timeout_ms: u64,
    workers: u64,
    max_client_buffer_bytes: Option<usize>,
    max_buffer_bytes: u64,
    client_write_timeout_ms: u64,
    handoff_ms: u64,
}

impl Serving {
    fn read(raw: &RawConfig, number: &NumberSetting<'_>) -> Result<Serving, ConfigError> {
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
        Ok(Serving {
            client_idle_timeout_ms,
            workers,
            max_client_buffer_bytes,
            max_buffer_bytes: number(
                &raw.max_buffer_bytes,
                "max_buffer_bytes",
                DEFAULT_MAX_BUFFER_BYTES,
                1024 * 1024..=1 << 40,
            )?,
            client_write_timeout_ms: number(
                &raw.client_write_timeout_ms,
                "client_write_timeout_ms",
                DEFAULT_CLIENT_WRITE_TIMEOUT_MS,
                1..=86_400_000,
            )?,
            handoff_ms: number(
                &raw.handoff_ms,
                "handoff_ms",
                DEFAULT_HANDOFF_MS,
                0..=86_400_000,
            )?,
        })
    }
}

/// `state_file`, taken from the config file's directory when relative.
fn state_file(raw: &RawConfig, path: &str, at: &At<'_>) -> Result<Option<PathBuf>, ConfigError> {
    let Some(value) = &raw.state_file else {
        return Ok(None);
    };
    let text = value.get_ref().trim();
    if text.is_empty() {
        return Err(at(value.span(), "state_file must name a file".into()));
    }
    let base = Path::new(path).parent().unwrap_or(Path::new(""));
    Ok(Some(base.join(text)))
}
