//! `[[servers]]`: each server's address, weight and name checked, no server
//! listed twice, and what each address reaches, to tell two spellings of one
//! memcached apart.

use std::collections::HashMap;
use std::ops::Range;

use super::addr::{
    aliases, canonical, check_server_addr, endpoint_of, refused_char, twemproxy_server, Endpoint,
    Lookup,
};
use super::diagnose::{line_column, At};
use super::raw::{RawConfig, RawServer};
use super::{ServerConfig, MAX_WEIGHT};
use crate::error::ConfigError;

/// The servers of one pool, validated, with what loading noticed about them.
pub(super) struct ServerList {
    pub(super) servers: Vec<ServerConfig>,
    /// Per server: where its addr is written and every endpoint it reaches.
    reaches: Vec<(Range<usize>, Vec<Endpoint>)>,
    /// Host names that do not resolve, two spellings of one memcached.
    pub(super) warnings: Vec<String>,
}

impl ServerList {
    /// Every `[[servers]]` entry of `raw`, in file order; with `lookup`, each
    /// host name is looked up too.
    pub(super) fn read(
        raw: &RawConfig,
        text: &str,
        at: &At<'_>,
        lookup: Option<Lookup<'_>>,
    ) -> Result<ServerList, ConfigError> {
        let mut list = ServerList {
            servers: Vec::with_capacity(raw.servers.len()),
            reaches: Vec::new(),
            warnings: Vec::new(),
        };
        let mut seen_addr: HashMap<String, usize> = HashMap::new();
        let mut seen_name: HashMap<String, usize> = HashMap::new();
        let line_of = |start: usize| line_column(text, start).0;
        for entry in &raw.servers {
            let server = entry.get_ref();
            let addr = server_addr(server, at)?;
            let weight = server_weight(server, &addr, at)?;
            let name = server_name(server, &addr, at)?;
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
            let endpoints = list.endpoints(server, &addr, text, lookup);
            list.reaches.push((server.addr.span(), endpoints));
            let tls = server.tls.as_ref().is_some_and(|t| *t.get_ref());
            let warming = server.warming.as_ref().is_some_and(|w| *w.get_ref());
            let zone = server
                .zone
                .as_ref()
                .map(|z| zone_name(z, &format!("server `{addr}`: zone"), at))
                .transpose()?;
            list.servers.push(ServerConfig {
                weight,
                tls,
                warming,
                zone,
                ..ServerConfig::plain(name, addr)
            });
        }
        check_zones_everywhere(raw, &list.servers, at)?;
        Ok(list)
    }

    /// Every endpoint `addr` reaches: itself when it is an IP address, and
    /// with `lookup` what its host name resolves to (a name that does not
    /// resolve is a warning).
    fn endpoints(
        &mut self,
        server: &RawServer,
        addr: &str,
        text: &str,
        lookup: Option<Lookup<'_>>,
    ) -> Vec<Endpoint> {
        let mut endpoints: Vec<Endpoint> = endpoint_of(addr).into_iter().collect();
        if let (Some(lookup), Some(Endpoint::Name(host, port))) = (lookup, endpoints.first()) {
            match lookup(host, *port) {
                Ok(found) => endpoints.extend(
                    found
                        .into_iter()
                        .map(|socket| Endpoint::Ip(canonical(socket))),
                ),
                Err(e) => self.warnings.push(format!(
                    "server `{addr}` (line {}): `{host}` does not resolve ({e}); it counts as failing until it does",
                    line_column(text, server.addr.span().start).0
                )),
            }
        }
        endpoints
    }

    /// Two servers that reach one memcached: an error with replicas (both
    /// copies of a key could land on it), else a warning.
    pub(super) fn check_aliases(
        &mut self,
        text: &str,
        at: &At<'_>,
        replicas: u64,
    ) -> Result<(), ConfigError> {
        for (first, second, endpoint) in aliases(&self.reaches) {
            let (first_span, second_span) = (
                self.reaches[first].0.clone(),
                self.reaches[second].0.clone(),
            );
            let (first_addr, second_addr) = (&self.servers[first].addr, &self.servers[second].addr);
            let first_line = line_column(text, first_span.start).0;
            if replicas > 1 {
                return Err(at(
                    second_span,
                    format!(
                        "server `{second_addr}` is the same memcached as `{first_addr}` (line {first_line}; both reach {endpoint}): with replicas = {replicas} both copies of a key could be stored on it; list each memcached once"
                    ),
                ));
            }
            self.warnings.push(format!(
                "servers `{first_addr}` (line {first_line}) and `{second_addr}` (line {}) are the same memcached ({endpoint}): it gets the keys of both",
                line_column(text, second_span.start).0
            ));
        }
        Ok(())
    }
}

/// A server's `addr`, trimmed: no quote, backslash or control byte, and
/// `host:port` (twemproxy's `host:port:weight` gets the memring lines).
fn server_addr(server: &RawServer, at: &At<'_>) -> Result<String, ConfigError> {
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
    Ok(addr)
}

/// A server's `weight`: 1 unless set, at most [`MAX_WEIGHT`].
fn server_weight(server: &RawServer, addr: &str, at: &At<'_>) -> Result<u32, ConfigError> {
    let Some(w) = &server.weight else {
        return Ok(1);
    };
    match u32::try_from(*w.get_ref()) {
        Ok(w) if (1..=MAX_WEIGHT).contains(&w) => Ok(w),
        _ => Err(at(
            w.span(),
            format!(
                "server `{addr}`: weight {} must be an integer from 1 to {MAX_WEIGHT}",
                w.get_ref()
            ),
        )),
    }
}

/// A server's `name`: its address unless set; printable, one word.
fn server_name(server: &RawServer, addr: &str, at: &At<'_>) -> Result<String, ConfigError> {
    let Some(n) = &server.name else {
        return Ok(addr.to_string());
    };
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
    Ok(n.get_ref().clone())
}

/// A zone name (`what` says whose, for the error): printable, one word.
pub(super) fn zone_name(
    zone: &toml::Spanned<String>,
    what: &str,
    at: &At<'_>,
) -> Result<String, ConfigError> {
    check_zone(zone.get_ref()).map_err(|problem| at(zone.span(), format!("{what} {problem}")))?;
    Ok(zone.get_ref().clone())
}

/// Why `zone` cannot be a zone name, if it cannot: it must be non-empty,
/// printable and without whitespace (it names metrics and `stats` lines).
pub(super) fn check_zone(zone: &str) -> Result<(), String> {
    if let Some(byte) = refused_char(zone) {
        return Err(format!(
            "{zone:?} contains {byte}, which no zone may contain"
        ));
    }
    if zone.trim().is_empty() || zone.contains(char::is_whitespace) {
        return Err(format!(
            "{zone:?} must be non-empty and contain no whitespace"
        ));
    }
    Ok(())
}

/// Zones on some servers only is an error: which zone a server without one
/// is in would be a guess, and a guess places copies of keys.
fn check_zones_everywhere(
    raw: &RawConfig,
    servers: &[ServerConfig],
    at: &At<'_>,
) -> Result<(), ConfigError> {
    let Some(zoned) = servers.iter().position(|s| s.zone.is_some()) else {
        return Ok(());
    };
    let Some(bare) = servers.iter().position(|s| s.zone.is_none()) else {
        return Ok(());
    };
    Err(at(
        raw.servers[bare].get_ref().addr.span(),
        format!(
            "server `{}` has no zone, but `{}` is in zone `{}`: set a zone on every server of the pool, or on none",
            servers[bare].addr,
            servers[zoned].addr,
            servers[zoned].zone.as_deref().unwrap_or_default()
        ),
    ))
}
