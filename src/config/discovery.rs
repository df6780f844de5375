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
    /// What this sidecar does once etcd has not renewed its registration's
    /// lease for the lease's length (`etcd_cut_off`).
    pub cut_off: CutOff,
    /// Where the last membership applied is kept, for a start while etcd
    /// cannot be reached.
    pub cache_file: PathBuf,
    /// TLS and authentication to etcd.
    pub access: EtcdAccess,
}

/// `etcd_cut_off`: what a sidecar does once its registration's lease may
/// have expired in etcd (no keep-alive answered for the lease's length):
/// the other sidecars stop waiting for it and may move reads for a change
/// it has not seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CutOff {
    /// Serve the membership it has (etcd down for every sidecar looks the
    /// same from here, and then nobody moves reads).
    #[default]
    Serve,
    /// Answer retrievals as misses and refuse writes until it is registered
    /// again and has read every member (no stale read elsewhere).
    Miss,
}

impl CutOff {
    pub fn as_str(self) -> &'static str {
        match self {
            CutOff::Serve => "serve",
            CutOff::Miss => "miss",
        }
    }
}

/// How memring (and `memring member`) reaches etcd beyond plain HTTP: the
/// files are read at each connection, so a renewed certificate or a changed
/// password is taken at the next reconnect. The password is never in the
/// config file: only the path of a file holding it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EtcdAccess {
    /// `etcd_ca_file`: the CA that signed etcd's certificate; set, the
    /// endpoints are `https://`.
    pub ca_file: Option<PathBuf>,
    /// `etcd_cert_file` and `etcd_key_file`: a client certificate, for an
    /// etcd started with `--client-cert-auth`.
    pub identity: Option<(PathBuf, PathBuf)>,
    /// `etcd_username` and `etcd_password_file`: etcd's authentication.
    pub user: Option<(String, PathBuf)>,
}

impl EtcdAccess {
    /// Checks that the settings go together, with `https` saying whether
    /// the endpoints are `https://`.
    ///
    /// # Errors
    /// Which setting is missing or is one too many, in words.
    pub fn validate(&self, https: bool) -> Result<(), String> {
        if https && self.ca_file.is_none() {
            return Err(
                "https:// endpoints need etcd_ca_file, the CA that signed etcd's certificate"
                    .into(),
            );
        }
        if !https && (self.ca_file.is_some() || self.identity.is_some()) {
            return Err("etcd_ca_file, etcd_cert_file and etcd_key_file are TLS settings: the endpoints must then be https://".into());
        }
        if let Some((name, _)) = &self.user {
            if name.is_empty() || name.chars().any(|c| c.is_control() || c == ' ') {
                return Err(format!(
                    "etcd_username = {name:?} must be a name without spaces or control characters"
                ));
            }
        }
        Ok(())
    }
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
/// `etcd_cut_off`, `etcd_cache_file`, and the TLS and authentication keys.
fn etcd_settings(
    raw: &RawDiscovery,
    path: &str,
    at: &dyn Fn(Range<usize>, String) -> ConfigError,
) -> Result<Option<EtcdSource>, ConfigError> {
    let Some(endpoints) = &raw.etcd_endpoints else {
        no_etcd_settings_alone(raw, at)?;
        return Ok(None);
    };
    let listed = etcd_endpoint_urls(endpoints, raw.etcd_ca_file.is_some(), at)?;
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
    let member_grace = millis_setting(
        "member_grace_ms",
        raw.member_grace_ms.as_ref(),
        super::DEFAULT_MEMBER_GRACE_MS,
        at,
    )?;
    let fleet_switch = millis_setting(
        "fleet_switch_ms",
        raw.fleet_switch_ms.as_ref(),
        super::DEFAULT_FLEET_SWITCH_MS,
        at,
    )?;
    let cut_off = match raw.etcd_cut_off.as_ref() {
        None => CutOff::default(),
        Some(v) if v.get_ref() == "serve" => CutOff::Serve,
        Some(v) if v.get_ref() == "miss" => CutOff::Miss,
        Some(v) => {
            return Err(at(
                v.span(),
                format!(
                    "etcd_cut_off = {:?}: expected \"serve\" or \"miss\"",
                    v.get_ref()
                ),
            ))
        }
    };
    let cache_file = match &raw.etcd_cache_file {
        Some(file) if file.get_ref().trim().is_empty() => {
            return Err(at(file.span(), "etcd_cache_file is empty".into()))
        }
        Some(file) => PathBuf::from(file.get_ref()),
        None => PathBuf::from(format!("{path}.members.json")),
    };
    let access = etcd_access(raw, &listed, endpoints.span(), at)?;
    Ok(Some(EtcdSource {
        endpoints: listed,
        prefix: text.clone(),
        member_grace,
        fleet_switch,
        cut_off,
        cache_file,
        access,
    }))
}

/// Without `etcd_endpoints`, no other etcd setting may be given: it would
/// do nothing.
fn no_etcd_settings_alone(
    raw: &RawDiscovery,
    at: &dyn Fn(Range<usize>, String) -> ConfigError,
) -> Result<(), ConfigError> {
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
        ("etcd_cut_off", raw.etcd_cut_off.as_ref().map(Spanned::span)),
        (
            "etcd_cache_file",
            raw.etcd_cache_file.as_ref().map(Spanned::span),
        ),
        ("etcd_ca_file", raw.etcd_ca_file.as_ref().map(Spanned::span)),
        (
            "etcd_cert_file",
            raw.etcd_cert_file.as_ref().map(Spanned::span),
        ),
        (
            "etcd_key_file",
            raw.etcd_key_file.as_ref().map(Spanned::span),
        ),
        (
            "etcd_username",
            raw.etcd_username.as_ref().map(Spanned::span),
        ),
        (
            "etcd_password_file",
            raw.etcd_password_file.as_ref().map(Spanned::span),
        ),
    ] {
        if let Some(span) = span {
            return Err(at(
                span,
                format!("{name} is an etcd setting: it needs etcd_endpoints"),
            ));
        }
    }
    Ok(())
}

/// Each `etcd_endpoints` entry as `http://host:port` or `https://host:port`;
/// `host:port` alone is https when `with_ca` (`etcd_ca_file` is set).
fn etcd_endpoint_urls(
    endpoints: &Spanned<Vec<String>>,
    with_ca: bool,
    at: &dyn Fn(Range<usize>, String) -> ConfigError,
) -> Result<Vec<String>, ConfigError> {
    if endpoints.get_ref().is_empty() {
        return Err(at(
            endpoints.span(),
            "etcd_endpoints is empty: list at least one, for example [\"http://127.0.0.1:2379\"]"
                .into(),
        ));
    }
    let mut listed = Vec::new();
    let mut schemes = std::collections::BTreeSet::new();
    for endpoint in endpoints.get_ref() {
        let written = endpoint.trim();
        let (scheme, rest) = match written.split_once("://") {
            Some((scheme, rest)) => (Some(scheme), rest),
            None => (None, written),
        };
        let ok = refused_char(written).is_none()
            && matches!(scheme, None | Some("http" | "https"))
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
                    "etcd_endpoints: {written:?} must be http://host:port or https://host:port (for example \"http://127.0.0.1:2379\")"
                ),
            ));
        }
        // host:port alone is https with etcd_ca_file, http without.
        let https = scheme.map_or(with_ca, |s| s == "https");
        schemes.insert(https);
        let scheme = if https { "https" } else { "http" };
        listed.push(format!("{scheme}://{}", rest.trim_end_matches('/')));
    }
    if schemes.len() > 1 {
        return Err(at(
            endpoints.span(),
            "etcd_endpoints mixes http:// and https://: one etcd cluster speaks one of them".into(),
        ));
    }
    Ok(listed)
}

/// A duration in milliseconds, 0 to one hour; `default` when not given.
fn millis_setting(
    name: &str,
    value: Option<&Spanned<u64>>,
    default: u64,
    at: &dyn Fn(Range<usize>, String) -> ConfigError,
) -> Result<Duration, ConfigError> {
    let Some(ms) = value else {
        return Ok(Duration::from_millis(default));
    };
    let range = 0..=3_600_000;
    if !range.contains(ms.get_ref()) {
        return Err(at(
            ms.span(),
            format!(
                "{name} = {} is out of range {}..={}",
                ms.get_ref(),
                range.start(),
                range.end()
            ),
        ));
    }
    Ok(Duration::from_millis(*ms.get_ref()))
}

/// `etcd_ca_file`, `etcd_cert_file`/`etcd_key_file` (together) and
/// `etcd_username`/`etcd_password_file` (together), against the scheme of
/// the `listed` endpoints. The files are read when memring connects (and by
/// `memring check`), not here.
fn etcd_access(
    raw: &RawDiscovery,
    listed: &[String],
    endpoints: Range<usize>,
    at: &dyn Fn(Range<usize>, String) -> ConfigError,
) -> Result<EtcdAccess, ConfigError> {
    let path = |file: &Option<Spanned<String>>, name: &str| match file {
        Some(file) if file.get_ref().trim().is_empty() => {
            Err(at(file.span(), format!("{name} is empty")))
        }
        Some(file) => Ok(Some(PathBuf::from(file.get_ref()))),
        None => Ok(None),
    };
    let pair = |first: (&Option<Spanned<String>>, &str),
                second: (&Option<Spanned<String>>, &str)| {
        match (first.0, second.0) {
            (Some(one), None) => Err(at(
                one.span(),
                format!("{} needs {} beside it", first.1, second.1),
            )),
            (None, Some(other)) => Err(at(
                other.span(),
                format!("{} needs {} beside it", second.1, first.1),
            )),
            _ => Ok(()),
        }
    };
    pair(
        (&raw.etcd_cert_file, "etcd_cert_file"),
        (&raw.etcd_key_file, "etcd_key_file"),
    )?;
    pair(
        (&raw.etcd_username, "etcd_username"),
        (
            &raw.etcd_password_file,
            "etcd_password_file (the password itself is never in the config)",
        ),
    )?;
    let identity = match (
        path(&raw.etcd_cert_file, "etcd_cert_file")?,
        path(&raw.etcd_key_file, "etcd_key_file")?,
    ) {
        (Some(cert), Some(key)) => Some((cert, key)),
        _ => None,
    };
    let user = match (
        &raw.etcd_username,
        path(&raw.etcd_password_file, "etcd_password_file")?,
    ) {
        (Some(name), Some(file)) => Some((name.get_ref().clone(), file)),
        _ => None,
    };
    let access = EtcdAccess {
        ca_file: path(&raw.etcd_ca_file, "etcd_ca_file")?,
        identity,
        user,
    };
    let https = listed.iter().any(|e| e.starts_with("https://"));
    access.validate(https).map_err(|why| {
        let span = raw
            .etcd_ca_file
            .as_ref()
            .map_or(endpoints.clone(), Spanned::span);
        at(span, why)
    })?;
    Ok(access)
}
