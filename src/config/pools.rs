//! `[[pools]]`, `[[routes]]` and `default_pool`: the pools one process
//! serves beside the top-level one, and which keys go to which. A pool's
//! entry is laid over the top-level settings, so each pool's config is a
//! whole [`Config`] checked by the same code, and its errors point at the
//! pool's own lines. No I/O here beyond the host-name lookups of `lookup`.

use std::ops::Range;
use std::sync::Arc;

use toml::Spanned;

use super::addr::{parse_listen, refused_char, Listen, ListenError, Lookup};
use super::diagnose::{at_in, line_column, At};
use super::raw::{RawConfig, RawPool, RawRoute, RawShadow};
use super::Config;
use crate::error::ConfigError;

/// The name of the pool the top-level `[[servers]]` (or `[discovery]`) make.
pub const DEFAULT_POOL: &str = "default";

/// A pool's shadow: the pool that also gets `fraction` of its keys (chosen
/// by key hash), whose replies are compared and never answered.
#[derive(Debug, Clone, PartialEq)]
pub struct ShadowConfig {
    pub pool: String,
    /// In 0.0..=1.0 (the config refuses anything else, NaN included).
    pub fraction: f64,
}

// `fraction` is never NaN (see `check_shadows`), so equality is total.
impl Eq for ShadowConfig {}

/// One pool: its name, the listener whose clients use it for every key, and
/// its settings as a whole config (whose own `pools` is empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    pub name: String,
    pub listen: Option<Listen>,
    pub config: Arc<Config>,
    /// Where this pool's sampled keys are also sent (`[pools.shadow]`).
    pub shadow: Option<ShadowConfig>,
}

/// Keys starting with `prefix` (on the main `listen`) go to `pool`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub prefix: String,
    pub pool: String,
}

impl Config {
    /// Every pool of this config, the default one first when it is the
    /// top-level one: the config itself when it has no `[[pools]]`.
    pub fn pool_list(&self) -> Vec<PoolConfig> {
        if self.pools.is_empty() {
            return vec![PoolConfig {
                name: DEFAULT_POOL.to_string(),
                listen: None,
                config: Arc::new(self.clone()),
                shadow: None,
            }];
        }
        self.pools.clone()
    }

    /// The pool named `name`.
    pub fn pool(&self, name: &str) -> Option<PoolConfig> {
        self.pool_list().into_iter().find(|p| p.name == name)
    }
}

/// The config of a whole file: the top-level pool (when it has servers),
/// each `[[pools]]` entry over it, and the routes between them. The returned
/// config's own pool settings are the default pool's.
pub(super) fn build(
    raw: &RawConfig,
    text: &str,
    path: &str,
    lookup: Option<Lookup<'_>>,
) -> Result<Config, ConfigError> {
    if raw.pools.is_empty()
        && raw.routes.is_empty()
        && raw.default_pool.is_none()
        && raw.failover.is_none()
        && raw.shadow.is_none()
    {
        return Config::build_pool(raw, text, path, lookup);
    }
    let at = at_in(text, path);
    let top_has_servers = !raw.servers.is_empty()
        || raw
            .discovery
            .as_ref()
            .is_some_and(|d| d.get_ref().srv.is_some() || d.get_ref().a.is_some());
    let mut pools = Pools {
        list: Vec::new(),
        written: Vec::new(),
        top_has_servers,
    };
    if top_has_servers {
        pools.list.push(PoolConfig {
            name: DEFAULT_POOL.to_string(),
            listen: None,
            config: Arc::new(Config::build_pool(raw, text, path, lookup)?),
            shadow: None,
        });
        pools.written.push((0..0, None));
    } else if let Some(shadow) = &raw.shadow {
        return Err(at(
            shadow.span(),
            "[shadow] is the top-level pool's, and there is none: write [pools.shadow] under the [[pools]] entry it is for".into(),
        ));
    }
    for entry in &raw.pools {
        pools.add(raw, entry, text, path, lookup, &at)?;
    }
    let mut pools = pools.list;
    check_failovers(raw, &pools, &at)?;
    let raw_shadows: Vec<Option<&Spanned<RawShadow>>> = top_has_servers
        .then_some(raw.shadow.as_ref())
        .into_iter()
        .chain(raw.pools.iter().map(|p| p.get_ref().shadow.as_ref()))
        .collect();
    check_shadows(&mut pools, &raw_shadows, &at)?;
    let default_pool = default_pool(raw, &pools, top_has_servers, &at)?;
    let (routes, warnings) = routes(raw, &pools, text, &at)?;
    Ok(whole_file(pools, routes, default_pool, warnings))
}

/// The pools read so far, and where each one's name (and listen) is
/// written, for "first at line".
struct Pools {
    list: Vec<PoolConfig>,
    written: Vec<(Range<usize>, Option<Range<usize>>)>,
    top_has_servers: bool,
}

impl Pools {
    /// One `[[pools]]` entry: its name, its config laid over the top level,
    /// and its own listener.
    fn add(
        &mut self,
        raw: &RawConfig,
        entry: &Spanned<RawPool>,
        text: &str,
        path: &str,
        lookup: Option<Lookup<'_>>,
        at: &At<'_>,
    ) -> Result<(), ConfigError> {
        let pool = entry.get_ref();
        let name = pool.name.get_ref();
        self.check_name(pool, text, at)?;
        if pool.servers.is_empty() {
            return Err(at(
                entry.span(),
                format!("pool `{name}` has no servers: add [[pools.servers]] entries after it"),
            ));
        }
        let layered = layered(raw, pool);
        let config = Config::build_pool(&layered, text, path, lookup)?;
        let pool_listen = match &pool.listen {
            None => {
                if let Some(mode) = &pool.listen_mode {
                    return Err(at(
                        mode.span(),
                        format!("pool `{name}`: listen_mode without a listen = \"unix:PATH\" of the pool's own"),
                    ));
                }
                None
            }
            Some(addr) => Some(self.listener(name, pool, addr, &config, text, at)?),
        };
        self.written
            .push((pool.name.span(), pool.listen.as_ref().map(|l| l.span())));
        self.list.push(PoolConfig {
            name: name.clone(),
            listen: pool_listen,
            config: Arc::new(config),
            shadow: None,
        });
        Ok(())
    }

    /// A pool's name: printable, one word, not another pool's.
    fn check_name(&self, pool: &RawPool, text: &str, at: &At<'_>) -> Result<(), ConfigError> {
        let name = pool.name.get_ref();
        if let Some(byte) = refused_char(name) {
            return Err(at(
                pool.name.span(),
                format!("pool name {name:?} contains {byte}, which no name may contain"),
            ));
        }
        if name.is_empty() || name.contains(char::is_whitespace) {
            return Err(at(
                pool.name.span(),
                "pool name must be non-empty and contain no whitespace".into(),
            ));
        }
        if let Some(first) = self.list.iter().position(|p| &p.name == name) {
            let message = if first == 0 && self.top_has_servers {
                format!("pool `{name}` is the one the top-level [[servers]] make: give this pool another name")
            } else {
                format!(
                    "duplicate pool name `{name}` (first at line {})",
                    line_column(text, self.written[first].0.start).0
                )
            };
            return Err(at(pool.name.span(), message));
        }
        Ok(())
    }

    /// A pool's own `listen` (with its own `listen_mode`): an IP:port
    /// address or `unix:PATH` no other listener takes.
    fn listener(
        &self,
        name: &str,
        pool: &RawPool,
        addr: &Spanned<String>,
        config: &Config,
        text: &str,
        at: &At<'_>,
    ) -> Result<Listen, ConfigError> {
        let mode = pool.listen_mode.as_ref();
        let socket = parse_listen(
            &format!("pool `{name}`: listen"),
            addr.get_ref(),
            mode.map(|m| m.get_ref().as_str()),
        )
        .map_err(|e| match (e, mode) {
            (ListenError::Mode(message), Some(mode)) => {
                at(mode.span(), format!("pool `{name}`: {message}"))
            }
            (ListenError::Addr(message) | ListenError::Mode(message), _) => {
                at(addr.span(), message)
            }
        })?;
        let mut taken: Vec<(Listen, String)> = vec![(config.listen.clone(), "listen".to_string())];
        taken.extend(
            config
                .admin_listen
                .map(|a| (Listen::Tcp(a), "admin_listen".to_string())),
        );
        taken.extend(
            config
                .tls_listen
                .as_ref()
                .map(|t| (Listen::Tcp(t.addr), "tls_listen.addr".to_string())),
        );
        for (other, span) in self.list.iter().zip(&self.written) {
            if let (Some(other_listen), Some(span)) = (other.listen.clone(), &span.1) {
                taken.push((
                    other_listen,
                    format!(
                        "pool `{}`'s listen (line {})",
                        other.name,
                        line_column(text, span.start).0
                    ),
                ));
            }
        }
        if let Some((_, owner)) = taken.iter().find(|(a, _)| a.overlaps(&socket)) {
            return Err(at(
                addr.span(),
                format!(
                    "pool `{name}`: listen = \"{}\" takes the address of {owner}: each listener needs an address of its own",
                    addr.get_ref()
                ),
            ));
        }
        Ok(socket)
    }
}

/// Each pool's gutter is another pool, which has none of its own.
fn check_failovers(raw: &RawConfig, pools: &[PoolConfig], at: &At<'_>) -> Result<(), ConfigError> {
    let failover_spans =
        raw.failover
            .iter()
            .map(|f| (DEFAULT_POOL, f.span()))
            .chain(raw.pools.iter().filter_map(|p| {
                let p = p.get_ref();
                Some((p.name.get_ref().as_str(), p.failover.as_ref()?.span()))
            }));
    for (name, span) in failover_spans {
        let Some(pool) = pools.iter().find(|p| p.name == name) else {
            continue;
        };
        let Some(failover) = &pool.config.failover else {
            continue;
        };
        let gutter = pools.iter().find(|p| p.name == failover.pool);
        let problem = match gutter {
            _ if failover.pool == name => Some("a pool cannot be its own gutter".to_string()),
            None => Some(format!("names no pool (pools: {})", known(pools))),
            Some(gutter) if gutter.config.failover.is_some() => Some(format!(
                "pool `{}` has a failover of its own: a gutter pool takes keys, it does not pass them on",
                gutter.name
            )),
            Some(_) => None,
        };
        if let Some(problem) = problem {
            return Err(at(
                span,
                format!("pool `{name}`: failover = \"{}\" {problem}", failover.pool),
            ));
        }
    }
    Ok(())
}

/// The pools' names, quoted, for messages: "`a`, `b`".
fn known(pools: &[PoolConfig]) -> String {
    pools
        .iter()
        .map(|p| format!("`{}`", p.name))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `default_pool`: a pool that exists, `default` when the top level has
/// servers and it is not set.
fn default_pool(
    raw: &RawConfig,
    pools: &[PoolConfig],
    top_has_servers: bool,
    at: &At<'_>,
) -> Result<String, ConfigError> {
    match &raw.default_pool {
        Some(name) => {
            if !pools.iter().any(|p| &p.name == name.get_ref()) {
                return Err(at(
                    name.span(),
                    format!(
                        "default_pool = \"{}\" names no pool (pools: {})",
                        name.get_ref(),
                        known(pools)
                    ),
                ));
            }
            Ok(name.get_ref().clone())
        }
        None if top_has_servers => Ok(DEFAULT_POOL.to_string()),
        None => Err(at(
            0..0,
            format!(
                "keys that match no route go to pool `default`, and there is none: set default_pool to one of {} (or add top-level [[servers]])",
                known(pools)
            ),
        )),
    }
}

/// `[[routes]]`, in file order, with a warning for each route an earlier
/// prefix hides.
fn routes(
    raw: &RawConfig,
    pools: &[PoolConfig],
    text: &str,
    at: &At<'_>,
) -> Result<(Vec<Route>, Vec<String>), ConfigError> {
    let line_of = |span: Range<usize>| line_column(text, span.start).0;
    let mut routes: Vec<Route> = Vec::new();
    let mut warnings = Vec::new();
    for (i, entry) in raw.routes.iter().enumerate() {
        let route = entry.get_ref();
        let prefix = route.prefix.get_ref();
        check_route(route, pools, at)?;
        if let Some(earlier) = routes.iter().position(|r| prefix.starts_with(&r.prefix)) {
            let earlier_span = raw.routes[earlier].get_ref().prefix.span();
            if &routes[earlier].prefix == prefix {
                return Err(at(
                    route.prefix.span(),
                    format!(
                        "duplicate route prefix `{prefix}` (first at line {})",
                        line_of(earlier_span)
                    ),
                ));
            }
            warnings.push(format!(
                "route `{prefix}` (line {}) never matches: route `{}` (line {}) comes first and takes its keys",
                line_of(raw.routes[i].get_ref().prefix.span()),
                routes[earlier].prefix,
                line_of(earlier_span)
            ));
        }
        routes.push(Route {
            prefix: prefix.clone(),
            pool: route.pool.get_ref().clone(),
        });
    }
    Ok((routes, warnings))
}

/// One route on its own: a prefix a key may start with, and a pool.
fn check_route(route: &RawRoute, pools: &[PoolConfig], at: &At<'_>) -> Result<(), ConfigError> {
    let prefix = route.prefix.get_ref();
    if prefix.is_empty() {
        return Err(at(
            route.prefix.span(),
            "route prefix must not be empty (keys that match no route go to default_pool)".into(),
        ));
    }
    if let Some(byte) = refused_char(prefix).or_else(|| {
        prefix
            .bytes()
            .any(|b| b == b' ' || b.is_ascii_control())
            .then(|| "a space or a control character".to_string())
    }) {
        return Err(at(
            route.prefix.span(),
            format!("route prefix {prefix:?} contains {byte}, which no key may contain"),
        ));
    }
    if !pools.iter().any(|p| &p.name == route.pool.get_ref()) {
        return Err(at(
            route.pool.span(),
            format!(
                "route `{prefix}`: pool = \"{}\" names no pool (pools: {})",
                route.pool.get_ref(),
                known(pools)
            ),
        ));
    }
    Ok(())
}

/// The file's config: the default pool's settings, every pool, the routes,
/// and every pool's warnings (each named after its pool but the default's).
fn whole_file(
    pools: Vec<PoolConfig>,
    routes: Vec<Route>,
    default_pool: String,
    warnings: Vec<String>,
) -> Config {
    let default = pools
        .iter()
        .find(|p| p.name == default_pool)
        .expect("default_pool was checked to name a pool");
    let mut config = (*default.config).clone();
    config.server_warnings.extend(warnings);
    for pool in &pools {
        if pool.name != default_pool {
            config.server_warnings.extend(
                pool.config
                    .server_warnings
                    .iter()
                    .map(|w| format!("pool `{}`: {w}", pool.name)),
            );
        }
    }
    config.pools = pools;
    config.routes = routes;
    config.default_pool = default_pool;
    config
}

/// Checks each pool's shadow now that every pool is known, and keeps it in
/// its pool: the shadow must be another pool, the fraction a share, and no
/// pool may be its own shadow's shadow, however far round.
fn check_shadows(
    pools: &mut [PoolConfig],
    raw: &[Option<&Spanned<RawShadow>>],
    at: &dyn Fn(Range<usize>, String) -> ConfigError,
) -> Result<(), ConfigError> {
    let names: Vec<String> = pools.iter().map(|p| p.name.clone()).collect();
    let known = names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ");
    for (pool, shadow) in pools.iter_mut().zip(raw) {
        let Some(shadow) = shadow else { continue };
        let shadow = shadow.get_ref();
        let target = shadow.pool.get_ref();
        if !names.contains(target) {
            return Err(at(
                shadow.pool.span(),
                format!(
                    "pool `{}`: shadow pool = \"{target}\" names no pool (pools: {known})",
                    pool.name
                ),
            ));
        }
        if *target == pool.name {
            return Err(at(
                shadow.pool.span(),
                format!(
                    "pool `{}` shadows itself: a shadow is another pool, with the new layout",
                    pool.name
                ),
            ));
        }
        let fraction = match &shadow.fraction {
            None => 1.0,
            Some(f) if (0.0..=1.0).contains(f.get_ref()) => *f.get_ref(),
            Some(f) => {
                return Err(at(
                    f.span(),
                    format!(
                        "pool `{}`: shadow fraction = {} must be a share from 0.0 to 1.0",
                        pool.name,
                        f.get_ref()
                    ),
                ))
            }
        };
        pool.shadow = Some(ShadowConfig {
            pool: target.clone(),
            fraction,
        });
    }
    let shadow_of = |name: &str| {
        pools
            .iter()
            .find(|p| p.name == name)
            .and_then(|p| p.shadow.as_ref())
            .map(|s| s.pool.clone())
    };
    for (pool, shadow) in pools.iter().zip(raw) {
        let Some(shadow) = shadow else { continue };
        let mut path = vec![pool.name.clone()];
        let mut next = shadow_of(&pool.name);
        while let Some(name) = next {
            if name == pool.name {
                path.push(name);
                return Err(at(
                    shadow.get_ref().pool.span(),
                    format!(
                        "pool `{}` is in a shadow cycle ({}): a pool cannot shadow a pool that shadows it",
                        pool.name,
                        path.join(" -> ")
                    ),
                ));
            }
            if path.contains(&name) {
                // A cycle that does not pass through this pool: reported
                // at its own members.
                break;
            }
            path.push(name.clone());
            next = shadow_of(&name);
        }
    }
    Ok(())
}

/// The top-level settings with `pool`'s own laid over them. The ring settings
/// go together (a pool that sets `ring` does not take the top level's
/// `hash`), as do the ejection timings; discovery stays with the top level.
fn layered(top: &RawConfig, pool: &RawPool) -> RawConfig {
    let mut raw = top.clone();
    raw.pools.clear();
    raw.routes.clear();
    raw.default_pool = None;
    // The top-level `[shadow]` is the default pool's alone.
    raw.shadow = None;
    raw.servers = pool.servers.clone();
    if let Some(discovery) = raw.discovery.as_mut() {
        let discovery = discovery.get_mut();
        discovery.srv = None;
        discovery.a = None;
        discovery.tls = None;
        discovery.etcd_endpoints = None;
        discovery.etcd_prefix = None;
        discovery.member_grace_ms = None;
        discovery.fleet_switch_ms = None;
        discovery.etcd_cut_off = None;
        discovery.etcd_cache_file = None;
        discovery.etcd_ca_file = None;
        discovery.etcd_cert_file = None;
        discovery.etcd_key_file = None;
        discovery.etcd_username = None;
        discovery.etcd_password_file = None;
    }
    macro_rules! own {
        ($($field:ident),*) => {
            $(if pool.$field.is_some() {
                raw.$field = pool.$field.clone();
            })*
        };
    }
    own!(
        connections_per_server,
        connect_timeout_ms,
        request_timeout_ms,
        auto_eject,
        failure_limit,
        replicas,
        read_miss_fallthrough,
        read_balance,
        read_balance_epsilon,
        handoff_ms,
        shared_with,
        flush_new_servers
    );
    // A gutter is the pool's own choice: never taken from the top level.
    raw.failover = pool.failover.clone();
    raw.failover_ttl_s = pool.failover_ttl_s.clone();
    if pool.ring.is_some()
        || pool.hash.is_some()
        || pool.hash_tag.is_some()
        || pool.hash_without_prefix.is_some()
    {
        raw.ring = pool.ring.clone();
        raw.hash = pool.hash.clone();
        raw.hash_tag = pool.hash_tag.clone();
        raw.hash_without_prefix = pool.hash_without_prefix.clone();
    }
    if pool.ejection.is_some() || pool.retry_timeout_ms.is_some() {
        raw.ejection = pool.ejection.clone();
        raw.retry_timeout_ms = pool.retry_timeout_ms.clone();
    }
    raw
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, String> {
        Config::parse(text, "t.toml").map_err(|e| e.to_string())
    }

    const TWO_POOLS: &str = r#"listen = "127.0.0.1:22121"
hash = "fnv1a_64"
ring = "twemproxy"
[[servers]]
addr = "127.0.0.1:11211"

[[pools]]
name = "sessions"
listen = "127.0.0.1:22122"
replicas = 2
[[pools.servers]]
addr = "127.0.0.1:11311"
[[pools.servers]]
addr = "127.0.0.1:11312"

[[routes]]
prefix = "sess:"
pool = "sessions"
"#;

    #[test]
    fn a_pool_takes_the_top_level_settings_it_does_not_set() {
        let config = parse(TWO_POOLS).unwrap();
        let names: Vec<&str> = config.pools.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["default", "sessions"]);
        let sessions = config.pool("sessions").unwrap();
        assert_eq!(sessions.listen, Some("127.0.0.1:22122".parse().unwrap()));
        assert_eq!(sessions.config.replicas, 2);
        assert_eq!(sessions.config.ring, config.ring, "ring settings inherited");
        assert_eq!(sessions.config.servers.len(), 2);
        assert_eq!(config.replicas, 1, "the top level is the default pool");
        assert_eq!(config.servers.len(), 1);
        assert_eq!(
            config.routes,
            vec![Route {
                prefix: "sess:".into(),
                pool: "sessions".into()
            }]
        );
        assert_eq!(config.default_pool, "default");
    }

    #[test]
    fn a_pool_that_sets_its_ring_takes_none_of_the_top_levels_ring_settings() {
        let text = TWO_POOLS.replace("replicas = 2", "ring = \"memring\"");
        let config = parse(&text).unwrap();
        let sessions = config.pool("sessions").unwrap();
        assert_eq!(sessions.config.ring, crate::ring::Spec::default());
    }

    #[test]
    fn without_top_level_servers_default_pool_must_name_a_pool() {
        let text = TWO_POOLS.replace("[[servers]]\naddr = \"127.0.0.1:11211\"\n", "");
        let error = parse(&text).unwrap_err();
        assert!(
            error.contains("set default_pool to one of `sessions`"),
            "{error}"
        );
        let config = parse(&format!("default_pool = \"sessions\"\n{text}")).unwrap();
        assert_eq!(config.pools.len(), 1);
        assert_eq!(config.replicas, 2, "the top level is the default pool");
        assert_eq!(config.servers.len(), 2);
    }

    #[test]
    fn bad_pools_and_routes_are_errors_at_their_line() {
        let cases: &[(&str, &str, &str)] = &[
            ("pool = \"sessions\"\n", "pool = \"nope\"\n", "t.toml:18:8: route `sess:`: pool = \"nope\" names no pool (pools: `default`, `sessions`)"),
            ("prefix = \"sess:\"", "prefix = \"\"", "t.toml:17:10: route prefix must not be empty"),
            ("name = \"sessions\"", "name = \"default\"", "t.toml:8:8: pool `default` is the one the top-level [[servers]] make"),
            ("listen = \"127.0.0.1:22122\"", "listen = \"127.0.0.1:22121\"", "t.toml:9:10: pool `sessions`: listen = \"127.0.0.1:22121\" takes the address of listen"),
            ("[[pools.servers]]\naddr = \"127.0.0.1:11311\"\n[[pools.servers]]\naddr = \"127.0.0.1:11312\"\n", "", "t.toml:7:1: pool `sessions` has no servers"),
            ("replicas = 2", "replicas = 99", "t.toml:10:12: replicas = 99 is out of range"),
            ("replicas = 2", "workers = 2", "t.toml:10:1: `workers` is set for the whole process, not per pool"),
        ];
        for (from, to, expected) in cases {
            let text = TWO_POOLS.replacen(from, to, 1);
            let error = parse(&text).unwrap_err();
            assert!(error.starts_with(expected), "{from} -> {to}: {error}");
        }
    }

    #[test]
    fn duplicate_pools_listens_and_prefixes_are_refused_and_shadowed_routes_warned() {
        let second =
            "\n[[pools]]\nname = \"sessions\"\n[[pools.servers]]\naddr = \"127.0.0.1:11400\"\n";
        let error = parse(&format!("{TWO_POOLS}{second}")).unwrap_err();
        assert!(
            error.contains("duplicate pool name `sessions` (first at line 8)"),
            "{error}"
        );
        let third = "\n[[pools]]\nname = \"other\"\nlisten = \"127.0.0.1:22122\"\n[[pools.servers]]\naddr = \"127.0.0.1:11400\"\n";
        let error = parse(&format!("{TWO_POOLS}{third}")).unwrap_err();
        assert!(
            error.contains("takes the address of pool `sessions`'s listen (line 9)"),
            "{error}"
        );
        let again = "\n[[routes]]\nprefix = \"sess:\"\npool = \"default\"\n";
        let error = parse(&format!("{TWO_POOLS}{again}")).unwrap_err();
        assert!(
            error.contains("duplicate route prefix `sess:` (first at line 17)"),
            "{error}"
        );
        let shadowed = "\n[[routes]]\nprefix = \"sess:x\"\npool = \"default\"\n";
        let config = parse(&format!("{TWO_POOLS}{shadowed}")).unwrap();
        assert!(
            config
                .warnings()
                .iter()
                .any(|w| w.contains("route `sess:x` (line 21) never matches")),
            "{:?}",
            config.warnings()
        );
    }

    #[test]
    fn one_pool_configs_list_themselves_as_the_default_pool() {
        let config =
            parse("listen = \"127.0.0.1:1\"\n[[servers]]\naddr = \"127.0.0.1:2\"\n").unwrap();
        assert!(config.pools.is_empty());
        let list = config.pool_list();
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].name, DEFAULT_POOL);
        assert_eq!(list[0].config.servers, config.servers);
    }

    #[test]
    fn adding_a_pool_leaves_the_default_pools_config_as_it_was() {
        let one = "listen = \"127.0.0.1:1\"\n[[servers]]\naddr = \"127.0.0.1:2\"\n";
        let two =
            format!("{one}[[pools]]\nname = \"b\"\n[[pools.servers]]\naddr = \"127.0.0.1:3\"\n");
        let before = Config::parse(one, "t.toml").unwrap();
        let after = Config::parse(&two, "t.toml").unwrap();
        let (before, after) = (
            before.pool_list()[0].config.clone(),
            after.pool_list()[0].config.clone(),
        );
        assert_eq!(format!("{before:#?}"), format!("{after:#?}"));
    }

    #[test]
    fn a_gutter_is_another_pool_without_one_of_its_own() {
        let gutter =
            "\n[[pools]]\nname = \"gutter\"\n[[pools.servers]]\naddr = \"127.0.0.1:11400\"\n";
        let ok = format!("failover = \"gutter\"\nfailover_ttl_s = 4\n{TWO_POOLS}{gutter}");
        let config = parse(&ok).unwrap();
        let failover = config.failover.clone().unwrap();
        assert_eq!(
            (failover.pool.as_str(), failover.ttl.as_secs()),
            ("gutter", 4)
        );
        assert_eq!(
            config.pool("sessions").unwrap().config.failover,
            None,
            "not inherited"
        );
        let cases: &[(&str, &str)] = &[
            (
                "failover = \"nope\"\n",
                "pool `default`: failover = \"nope\" names no pool",
            ),
            (
                "failover = \"default\"\n",
                "a pool cannot be its own gutter",
            ),
            (
                "failover_ttl_s = 4\n",
                "failover_ttl_s applies with failover",
            ),
            ("failover = \"gutter\"\nauto_eject = true\n", "keep one"),
            (
                "failover = \"gutter\"\nfailover_ttl_s = 0\n",
                "failover_ttl_s = 0 is out of range 1..=86400",
            ),
        ];
        for (top, expected) in cases {
            let error = parse(&format!("{top}{TWO_POOLS}{gutter}")).unwrap_err();
            assert!(error.contains(expected), "{top}: {error}");
        }
        let passing_on = gutter.replace(
            "name = \"gutter\"\n",
            "name = \"gutter\"\nfailover = \"sessions\"\n",
        );
        let chained = format!("failover = \"gutter\"\n{TWO_POOLS}{passing_on}");
        let error = parse(&chained).unwrap_err();
        assert!(
            error.contains("pool `gutter` has a failover of its own"),
            "{error}"
        );
        let replicated = TWO_POOLS.replace("replicas = 2", "replicas = 2\nfailover = \"default\"");
        let error = parse(&replicated).unwrap_err();
        assert!(
            error.contains("failover applies to replicas = 1"),
            "{error}"
        );
        // A one-pool file has no pool to fail over to.
        let error = parse("failover = \"gutter\"\nlisten = \"127.0.0.1:1\"\n[[servers]]\naddr = \"127.0.0.1:2\"\n").unwrap_err();
        assert!(error.contains("names no pool"), "{error}");
    }

    const SHADOWED: &str = r#"listen = "127.0.0.1:22121"
[[servers]]
addr = "127.0.0.1:11211"

[[pools]]
name = "main"
[pools.shadow]
pool = "candidate"
fraction = 0.25
[[pools.servers]]
addr = "127.0.0.1:11311"

[[pools]]
name = "candidate"
[[pools.servers]]
addr = "127.0.0.1:11411"
"#;

    #[test]
    fn a_pools_shadow_is_kept_with_it_and_not_inherited() {
        let config = parse(SHADOWED).unwrap();
        assert_eq!(
            config.pool("main").unwrap().shadow,
            Some(ShadowConfig {
                pool: "candidate".into(),
                fraction: 0.25
            })
        );
        assert_eq!(config.pool("candidate").unwrap().shadow, None);
        assert_eq!(config.pool("default").unwrap().shadow, None);
        let top = format!(
            "[shadow]\npool = \"candidate\"\n{}",
            SHADOWED.replacen("listen = \"127.0.0.1:22121\"\n", "", 1)
        );
        let config = parse(&format!("listen = \"127.0.0.1:22121\"\n{top}")).unwrap();
        let default = config.pool("default").unwrap().shadow.unwrap();
        assert_eq!(
            (default.pool.as_str(), default.fraction),
            ("candidate", 1.0)
        );
        assert_eq!(
            config.pool("candidate").unwrap().shadow,
            None,
            "[shadow] is the top-level pool's alone"
        );
    }

    #[test]
    fn bad_shadows_are_errors_at_their_line() {
        let cases: &[(&str, &str, &str)] = &[
            ("pool = \"candidate\"", "pool = \"nope\"", "t.toml:8:8: pool `main`: shadow pool = \"nope\" names no pool (pools: `default`, `main`, `candidate`)"),
            ("pool = \"candidate\"", "pool = \"main\"", "t.toml:8:8: pool `main` shadows itself"),
            ("fraction = 0.25", "fraction = 1.5", "t.toml:9:12: pool `main`: shadow fraction = 1.5 must be a share from 0.0 to 1.0"),
            ("fraction = 0.25", "fraction = nan", "t.toml:9:12: pool `main`: shadow fraction = NaN must be a share"),
            ("fraction = 0.25", "fractoin = 0.25", "t.toml:9:1: "),
        ];
        for (from, to, expected) in cases {
            let text = SHADOWED.replacen(from, to, 1);
            let error = parse(&text).unwrap_err();
            assert!(error.starts_with(expected), "{from} -> {to}: {error}");
        }
    }

    #[test]
    fn shadow_cycles_are_refused_however_long() {
        let back = SHADOWED.replacen(
            "name = \"candidate\"\n",
            "name = \"candidate\"\n[pools.shadow]\npool = \"main\"\n",
            1,
        );
        let error = parse(&back).unwrap_err();
        assert!(
            error.starts_with(
                "t.toml:8:8: pool `main` is in a shadow cycle (main -> candidate -> main)"
            ),
            "{error}"
        );
        let three = format!(
            "[shadow]\npool = \"main\"\n{}",
            SHADOWED.replacen(
                "name = \"candidate\"\n",
                "name = \"candidate\"\n[pools.shadow]\npool = \"default\"\n",
                1
            )
        )
        .replacen("listen = \"127.0.0.1:22121\"\n", "", 1);
        let error = parse(&format!("listen = \"127.0.0.1:22121\"\n{three}")).unwrap_err();
        assert!(
            error.contains(
                "pool `default` is in a shadow cycle (default -> main -> candidate -> default)"
            ),
            "{error}"
        );
        // A chain is fine: the shadow's own shadow gets client traffic only.
        let chain = format!(
            "{SHADOWED}[[pools]]\nname = \"third\"\n[[pools.servers]]\naddr = \"127.0.0.1:11511\"\n"
        )
        .replacen(
            "name = \"candidate\"\n",
            "name = \"candidate\"\n[pools.shadow]\npool = \"third\"\n",
            1,
        );
        assert!(parse(&chain).is_ok());
    }

    #[test]
    fn a_top_level_shadow_needs_a_top_level_pool_and_another_pool() {
        let one = "listen = \"127.0.0.1:1\"\n[[servers]]\naddr = \"127.0.0.1:2\"\n[shadow]\npool = \"default\"\n";
        let error = parse(one).unwrap_err();
        assert!(
            error.starts_with("t.toml:5:8: pool `default` shadows itself"),
            "{error}"
        );
        let none = SHADOWED.replacen(
            "[[servers]]\naddr = \"127.0.0.1:11211\"\n",
            "default_pool = \"main\"\n[shadow]\npool = \"main\"\n",
            1,
        );
        let error = parse(&none).unwrap_err();
        assert!(
            error.contains("[shadow] is the top-level pool's, and there is none"),
            "{error}"
        );
    }
}
