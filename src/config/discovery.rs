//! `[discovery]`: the DNS server and interval of host-name lookups, and the
//! records the default pool's servers come from.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::ops::Range;
use std::path::PathBuf;
use std::time::Duration;

use toml::Spanned;

use super::addr::{is_dns_name, refused_char};
use super::raw::RawDiscovery;
use super::{DEFAULT_DISCOVERY_INTERVAL_MS, DNS_PORT};
use crate::error::ConfigError;

/// The `[discovery]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discovery {
    /// Where the default pool's servers come from; `None`: `[[servers]]`.
    pub source: Option<Source>,
    /// How often host names and the discovery records are looked up again.
    pub interval: Duration,
    /// Where questions go (`resolver`, or the system's resolver).
    pub dns: crate::inputs::resolve::Dns,
    /// The discovered servers speak TLS, as `[backend_tls]` says.
    pub tls: bool,
    /// `etcd_endpoints`: the default pool's members come from etcd too.
    pub etcd: Option<EtcdSource>,
}

/// The membership store: the default pool's servers are the `[[servers]]`
/// of the file and the members under `<prefix>members/` in etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdSource {
    /// `http://host:port`, one or more.
    pub endpoints: Vec<String>,
    /// The cluster's keys; ends in `/`.
    pub prefix: String,
    /// How long a member whose key vanished without LEAVING stays.
    pub member_grace: Duration,
    /// How long a sidecar that staged a membership change waits for every
    /// live sidecar to stage it before it switches reads anyway
    /// (`fleet_switch_ms`); zero: at once, without waiting (no gating).
    pub fleet_switch: Duration,
    /// Where the last membership applied is kept, for a start while etcd
    /// cannot be reached.
    pub cache_file: PathBuf,
}

impl fmt::Display for EtcdSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "etcd {} {}", self.endpoints.join(","), self.prefix)
    }
}

impl Default for Discovery {
    fn default() -> Self {
        Discovery {
            source: None,
            interval: Duration::from_millis(DEFAULT_DISCOVERY_INTERVAL_MS),
            dns: crate::inputs::resolve::Dns::default(),
            tls: false,
            etcd: None,
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

/// The `[discovery]` table, validated; `path` is the config file's (the
/// default `etcd_cache_file` is beside it).
pub(super) fn discovery_settings(
    raw: Option<&Spanned<RawDiscovery>>,
    path: &str,
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
    discovery.etcd = etcd_settings(raw, path, at)?;
    if let (Some(etcd), Some(source)) = (&discovery.etcd, &discovery.source) {
        let span = raw.etcd_endpoints.as_ref().map_or(0..0, |e| e.span());
        return Err(at(
            span,
            format!(
                "[discovery] etcd_endpoints and {source} both list the default pool's servers: keep one of them ({etcd})"
            ),
        ));
    }
    Ok(discovery)
}

/// `etcd_endpoints`, `etcd_prefix`, `member_grace_ms`, `fleet_switch_ms`,
/// `etcd_cache_file`.
fn etcd_settings(
    raw: &RawDiscovery,
    path: &str,
    at: &dyn Fn(Range<usize>, String) -> ConfigError,
) -> Result<Option<EtcdSource>, ConfigError> {
    let Some(endpoints) = &raw.etcd_endpoints else {
        for (name, span) in [
            ("etcd_prefix", raw.etcd_prefix.as_ref().map(Spanned::span)),
            (
                "member_grace_ms",
                raw.member_grace_ms.as_ref().map(Spanned::span),
            ),
            (
                "fleet_switch_ms",
                raw.fleet_switch_ms.as_ref().map(Spanned::span),
            ),
            (
                "etcd_cache_file",
                raw.etcd_cache_file.as_ref().map(Spanned::span),
            ),
        ] {
            if let Some(span) = span {
                return Err(at(
                    span,
                    format!("{name} is an etcd setting: it needs etcd_endpoints"),
                ));
            }
        }
        return Ok(None);
    };
    if endpoints.get_ref().is_empty() {
        return Err(at(
            endpoints.span(),
            "etcd_endpoints is empty: list at least one, for example [\"http://127.0.0.1:2379\"]"
                .into(),
        ));
    }
    let mut listed = Vec::new();
    for endpoint in endpoints.get_ref() {
        let written = endpoint.trim();
        let rest = written.strip_prefix("http://").unwrap_or(written);
        let ok = refused_char(written).is_none()
            && rest
                .trim_end_matches('/')
                .rsplit_once(':')
                .is_some_and(|(host, port)| {
                    !host.is_empty()
                        && !host.contains('/')
                        && port.parse::<u16>().is_ok_and(|p| p > 0)
                });
        if !ok {
            return Err(at(
                endpoints.span(),
                format!(
                    "etcd_endpoints: {written:?} must be http://host:port (for example \"http://127.0.0.1:2379\"; https is not supported)"
                ),
            ));
        }
        listed.push(format!("http://{}", rest.trim_end_matches('/')));
    }
    let Some(prefix) = &raw.etcd_prefix else {
        return Err(at(
            endpoints.span(),
            "etcd_endpoints needs etcd_prefix, the cluster's keys (for example \"/memring/web/\")"
                .into(),
        ));
    };
    let text = prefix.get_ref();
    if !text.ends_with('/') || text.len() < 2 || refused_char(text).is_some() || text.contains(' ')
    {
        return Err(at(
            prefix.span(),
            format!("etcd_prefix = {text:?} must end in / and hold no spaces or control characters (for example \"/memring/web/\")"),
        ));
    }
    let mut grace = Duration::from_millis(super::DEFAULT_MEMBER_GRACE_MS);
    if let Some(ms) = &raw.member_grace_ms {
        let range = 0..=3_600_000;
        if !range.contains(ms.get_ref()) {
            return Err(at(
                ms.span(),
                format!(
                    "member_grace_ms = {} is out of range {}..={}",
                    ms.get_ref(),
                    range.start(),
                    range.end()
                ),
            ));
        }
        grace = Duration::from_millis(*ms.get_ref());
    }
    let mut fleet_switch = Duration::from_millis(super::DEFAULT_FLEET_SWITCH_MS);
    if let Some(ms) = &raw.fleet_switch_ms {
        let range = 0..=3_600_000;
        if !range.contains(ms.get_ref()) {
            return Err(at(
                ms.span(),
                format!(
                    "fleet_switch_ms = {} is out of range {}..={}",
                    ms.get_ref(),
                    range.start(),
                    range.end()
                ),
            ));
        }
        fleet_switch = Duration::from_millis(*ms.get_ref());
    }
    let cache_file = match &raw.etcd_cache_file {
        Some(file) if file.get_ref().trim().is_empty() => {
            return Err(at(file.span(), "etcd_cache_file is empty".into()))
        }
        Some(file) => PathBuf::from(file.get_ref()),
        None => PathBuf::from(format!("{path}.members.json")),
    };
    Ok(Some(EtcdSource {
        endpoints: listed,
        prefix: text.clone(),
        member_grace: grace,
        fleet_switch,
        cache_file,
    }))
}
