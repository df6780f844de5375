//! One pool's [`Config`] from its raw table: every setting validated, at
//! the line that sets it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::Path;
use std::time::Duration;

use toml::Spanned;

use super::addr::{
    aliases, binds_overlap, canonical, check_server_addr, endpoint_of, refused_char,
    twemproxy_server, Endpoint, Lookup,
};
use super::diagnose::line_column;
use super::discovery::discovery_settings;
use super::ejection::{ejection, failover};
use super::hot_keys::hot_key_settings;
use super::raw::RawConfig;
use super::ring::ring_spec;
use super::tls::{check_tls_files, tls_settings};
use super::*;
use crate::error::ConfigError;
use crate::protocol::{Limits, DEFAULT_MAX_GET_LINE_BYTES, DEFAULT_MAX_LINE_BYTES};
use crate::ring::Flavour;

impl Config {
    /// One pool's config from `raw` (the top level, or a `[[pools]]` entry
    /// laid over it by `pools.rs`).
    pub(super) fn build_pool(
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
}

/// Reads one integer setting: its value, a default, and its allowed range.
pub(super) type NumberSetting<'a> = dyn Fn(&Option<Spanned<u64>>, &str, u64, std::ops::RangeInclusive<u64>) -> Result<u64, ConfigError>
    + 'a;
