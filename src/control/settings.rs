//! What a reload changes besides the servers: every top-level setting that
//! differs between two configs, named as in the file, with its values in
//! the file's units, and whether it is read only at start. `reload` logs
//! them; `memring plan` prints them.

use std::time::Duration;

use crate::config::Config;

/// One top-level setting whose value differs between two configs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingChange {
    /// The setting's name in the file.
    pub name: &'static str,
    pub old: String,
    pub new: String,
    /// Read once at start: a reload logs it and keeps the old value.
    pub restart_only: bool,
}

impl std::fmt::Display for SettingChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} -> {}", self.name, self.old, self.new)
    }
}

/// Every top-level setting that differs between `old` and `new`, named as in
/// the file, with values in the file's units. Servers are not settings: a
/// server change is a [`crate::pools::topology::Change`]. A table, one row
/// per setting: its length is the number of settings, not of steps.
pub fn setting_changes(old: &Config, new: &Config) -> Vec<SettingChange> {
    // Destructured in full so that a new setting cannot be forgotten here: the
    // compiler asks for it.
    let Config {
        listen,
        servers: _,
        connections_per_server,
        connect_timeout,
        request_timeout,
        limits: _,
        max_client_connections,
        max_pending_per_client,
        max_server_inflight,
        shutdown_grace,
        auto_eject,
        failure_limit,
        ejection,
        client_idle_timeout,
        admin_listen,
        replicas,
        read_miss_fallthrough,
        read_balance,
        max_value_from_servers: _,
        workers,
        max_client_buffer_bytes,
        max_buffer_bytes,
        client_write_timeout,
        handoff,
        shared_with,
        flush_new_servers,
        state_file,
        failover,
        ring,
        hot_keys,
        server_warnings: _,
        tls_listen,
        backend_tls,
        discovery,
        request_log,
        pools,
        routes,
        default_pool,
        zone,
        zone_write_back,
        zone_fallback,
        warming_zones,
    } = new;
    // Each pool's own settings are its publisher's business (`control/pool_set.rs`);
    // here: the routes between pools, and the pools' listeners (bound at
    // start only).
    let hot = &old.hot_keys;
    // A table, one row per setting (name, old, new, read only at start):
    // long because there are many settings, not because of logic.
    let rows: [(&'static str, String, String, bool); 54] = [
        (
            "discovery",
            discovered(&old.discovery),
            discovered(discovery),
            false,
        ),
        (
            "etcd",
            membership_store(&old.discovery),
            membership_store(discovery),
            true,
        ),
        (
            "ring",
            old.ring.flavour.name().to_string(),
            ring.flavour.name().to_string(),
            false,
        ),
        (
            "hash",
            old.ring.hash.name().to_string(),
            ring.hash.name().to_string(),
            false,
        ),
        (
            "hash_tag",
            tag(&old.ring.hash_tag),
            tag(&ring.hash_tag),
            false,
        ),
        (
            "hash_without_prefix",
            prefix(&old.ring.hash_without_prefix),
            prefix(&ring.hash_without_prefix),
            false,
        ),
        ("listen", old.listen.to_string(), listen.to_string(), true),
        (
            "listen_mode",
            old.listen.mode_text(),
            listen.mode_text(),
            true,
        ),
        (
            "pools.listen",
            listeners_text(&old.pools),
            listeners_text(pools),
            true,
        ),
        (
            "routes",
            routes_text(&old.routes),
            routes_text(routes),
            false,
        ),
        (
            "failover",
            failover_text(&old.failover),
            failover_text(failover),
            false,
        ),
        (
            "default_pool",
            old.default_pool.clone(),
            default_pool.clone(),
            false,
        ),
        (
            "zone",
            old.zone.clone().unwrap_or_else(|| "none".into()),
            zone.clone().unwrap_or_else(|| "none".into()),
            false,
        ),
        (
            "zone_write_back",
            old.zone_write_back.to_string(),
            zone_write_back.to_string(),
            false,
        ),
        (
            "zone_fallback",
            old.zone_fallback.as_str().to_string(),
            zone_fallback.as_str().to_string(),
            false,
        ),
        (
            "warming_zones",
            format!("{:?}", old.warming_zones),
            format!("{warming_zones:?}"),
            false,
        ),
        (
            "shadow",
            shadows_text(&old.pools),
            shadows_text(pools),
            false,
        ),
        (
            "admin_listen",
            address(&old.admin_listen),
            address(admin_listen),
            true,
        ),
        (
            "connections_per_server",
            old.connections_per_server.to_string(),
            connections_per_server.to_string(),
            false,
        ),
        (
            "connect_timeout_ms",
            ms(&old.connect_timeout),
            ms(connect_timeout),
            false,
        ),
        (
            "request_timeout_ms",
            ms(&old.request_timeout),
            ms(request_timeout),
            false,
        ),
        ("max_value_bytes", value_limit(old), value_limit(new), false),
        (
            "max_client_connections",
            old.max_client_connections.to_string(),
            max_client_connections.to_string(),
            true,
        ),
        (
            "max_pending_per_client",
            old.max_pending_per_client.to_string(),
            max_pending_per_client.to_string(),
            true,
        ),
        (
            "max_server_inflight",
            old.max_server_inflight.to_string(),
            max_server_inflight.to_string(),
            false,
        ),
        (
            "shutdown_grace_ms",
            ms(&old.shutdown_grace),
            ms(shutdown_grace),
            true,
        ),
        (
            "auto_eject",
            old.auto_eject.to_string(),
            auto_eject.to_string(),
            false,
        ),
        (
            "failure_limit",
            old.failure_limit.to_string(),
            failure_limit.to_string(),
            false,
        ),
        (
            "ejection",
            old.ejection.name().to_string(),
            ejection.name().to_string(),
            false,
        ),
        (
            "retry_timeout_ms",
            retry(&old.ejection),
            retry(ejection),
            false,
        ),
        (
            "client_idle_timeout_ms",
            optional_ms(&old.client_idle_timeout),
            optional_ms(client_idle_timeout),
            true,
        ),
        (
            "replicas",
            old.replicas.to_string(),
            replicas.to_string(),
            false,
        ),
        (
            "read_miss_fallthrough",
            old.read_miss_fallthrough.to_string(),
            read_miss_fallthrough.to_string(),
            false,
        ),
        (
            "read_balance",
            old.read_balance.mode.name().to_string(),
            read_balance.mode.name().to_string(),
            false,
        ),
        (
            "read_balance_epsilon",
            old.read_balance.epsilon.to_string(),
            read_balance.epsilon.to_string(),
            false,
        ),
        ("workers", automatic(old.workers), automatic(*workers), true),
        (
            "max_client_buffer_bytes",
            client_buffer(&old.max_client_buffer_bytes),
            client_buffer(max_client_buffer_bytes),
            true,
        ),
        (
            "max_buffer_bytes",
            old.max_buffer_bytes.to_string(),
            max_buffer_bytes.to_string(),
            true,
        ),
        (
            "client_write_timeout_ms",
            ms(&old.client_write_timeout),
            ms(client_write_timeout),
            true,
        ),
        ("handoff_ms", ms(&old.handoff), ms(handoff), false),
        (
            "shared_with",
            old.shared_with.name().to_string(),
            shared_with.name().to_string(),
            false,
        ),
        (
            "flush_new_servers",
            old.flush_new_servers.name().to_string(),
            flush_new_servers.name().to_string(),
            false,
        ),
        (
            "state_file",
            path_text(&old.state_file),
            path_text(state_file),
            true,
        ),
        (
            "tls_listen",
            tls_listen_text(&old.tls_listen),
            tls_listen_text(tls_listen),
            true,
        ),
        (
            "backend_tls",
            backend_tls_text(&old.backend_tls),
            backend_tls_text(backend_tls),
            true,
        ),
        // Hot-key detection and its window are set up when the workers
        // start; the rest applies live.
        (
            "hot_key_detect",
            hot.detect.to_string(),
            hot_keys.detect.to_string(),
            true,
        ),
        (
            "hot_key_window_ms",
            ms(&hot.window),
            ms(&hot_keys.window),
            true,
        ),
        (
            "hot_key_share",
            hot.share.to_string(),
            hot_keys.share.to_string(),
            false,
        ),
        (
            "hot_key_top",
            hot.top.to_string(),
            hot_keys.top.to_string(),
            false,
        ),
        (
            "hot_key_metrics",
            hot.metrics_names.to_string(),
            hot_keys.metrics_names.to_string(),
            false,
        ),
        (
            "hot_key_coalesce",
            hot.coalesce.to_string(),
            hot_keys.coalesce.to_string(),
            false,
        ),
        (
            "hot_key_cache_ms",
            optional_ms(&hot.cache_ttl),
            optional_ms(&hot_keys.cache_ttl),
            false,
        ),
        (
            "hot_key_cache_bytes",
            hot.cache_bytes.to_string(),
            hot_keys.cache_bytes.to_string(),
            false,
        ),
        // Each worker takes its request log's settings when it starts.
        (
            "request_log",
            old.request_log.to_string(),
            request_log.to_string(),
            true,
        ),
    ];
    rows.into_iter()
        .filter(|(_, old, new, _)| old != new)
        .map(|(name, old, new, restart_only)| SettingChange {
            name,
            old,
            new,
            restart_only,
        })
        .collect()
}

/// The names of the restart-only settings that differ between `started` and
/// `new`.
pub fn restart_only_changes(started: &Config, new: &Config) -> Vec<&'static str> {
    setting_changes(started, new)
        .into_iter()
        .filter(|s| s.restart_only)
        .map(|s| s.name)
        .collect()
}

fn routes_text(routes: &[crate::config::Route]) -> String {
    if routes.is_empty() {
        return "(none)".to_string();
    }
    routes
        .iter()
        .map(|r| format!("{}->{}", r.prefix, r.pool))
        .collect::<Vec<_>>()
        .join(",")
}

fn failover_text(f: &Option<crate::config::Failover>) -> String {
    f.as_ref().map_or("(off)".to_string(), |f| {
        format!("{} (failover_ttl_s {})", f.pool, f.ttl.as_secs())
    })
}

fn listeners_text(pools: &[crate::config::PoolConfig]) -> String {
    let listeners: Vec<String> = pools
        .iter()
        .filter_map(|p| {
            let listen = p.listen.as_ref()?;
            Some(match listen.unix_path() {
                Some(_) => format!("{}={listen} (mode {})", p.name, listen.mode_text()),
                None => format!("{}={listen}", p.name),
            })
        })
        .collect();
    if listeners.is_empty() {
        "(none)".to_string()
    } else {
        listeners.join(",")
    }
}

fn shadows_text(pools: &[crate::config::PoolConfig]) -> String {
    let shadows: Vec<String> = pools
        .iter()
        .filter_map(|p| {
            let shadow = p.shadow.as_ref()?;
            Some(format!("{}->{} {}", p.name, shadow.pool, shadow.fraction))
        })
        .collect();
    if shadows.is_empty() {
        "(none)".to_string()
    } else {
        shadows.join(",")
    }
}

/// The TLS settings as one line each; their files are read at start
/// (the listener's certificate reloads by itself when its files change).
fn tls_listen_text(t: &Option<crate::config::TlsListen>) -> String {
    t.as_ref().map_or("(off)".to_string(), |t| {
        format!(
            "{} {} {} {}",
            t.addr,
            t.files.cert_file.display(),
            t.files.key_file.display(),
            t.files
                .client_ca_file
                .as_ref()
                .map_or("(no client_ca_file)".to_string(), |p| p
                    .display()
                    .to_string())
        )
    })
}

fn backend_tls_text(t: &Option<crate::tls::BackendFiles>) -> String {
    t.as_ref().map_or("(off)".to_string(), |t| format!("{t:?}"))
}

fn ms(d: &Duration) -> String {
    d.as_millis().to_string()
}

fn path_text(p: &Option<std::path::PathBuf>) -> String {
    p.as_ref()
        .map_or("(none)".to_string(), |p| p.display().to_string())
}

fn optional_ms(d: &Option<Duration>) -> String {
    d.as_ref().map_or("0".to_string(), ms)
}

fn address(a: &Option<std::net::SocketAddr>) -> String {
    a.map_or("(off)".to_string(), |a| a.to_string())
}

/// Unset, max_value_bytes follows the servers' item_size_max.
fn value_limit(c: &Config) -> String {
    if c.max_value_from_servers {
        "(from the servers)".to_string()
    } else {
        c.limits.max_value_bytes.to_string()
    }
}

fn automatic(n: usize) -> String {
    if n == 0 {
        "0 (one per CPU)".to_string()
    } else {
        n.to_string()
    }
}

fn client_buffer(b: &Option<usize>) -> String {
    b.map_or("(max_value_bytes + 4 MiB)".to_string(), |b| b.to_string())
}

fn tag(t: &Option<[u8; 2]>) -> String {
    t.map_or("(none)".to_string(), |t| {
        String::from_utf8_lossy(&t).into_owned()
    })
}

fn prefix(p: &[u8]) -> String {
    if p.is_empty() {
        return "(none)".to_string();
    }
    format!("{:?}", String::from_utf8_lossy(p))
}

fn retry(e: &crate::config::Ejection) -> String {
    match e {
        crate::config::Ejection::Twemproxy { retry } => ms(retry),
        crate::config::Ejection::Memring => "(memring ejection)".to_string(),
    }
}

fn membership_store(d: &crate::config::Discovery) -> String {
    d.etcd.as_ref().map_or("(none)".to_string(), |e| {
        format!(
            "{e}, grace {} ms, fleet switch {} ms, cut off: {}, cache {}",
            e.member_grace.as_millis(),
            e.fleet_switch.as_millis(),
            e.cut_off.as_str(),
            e.cache_file.display()
        )
    })
}

fn discovered(d: &crate::config::Discovery) -> String {
    let source = d
        .source
        .as_ref()
        .map_or("[[servers]]".to_string(), ToString::to_string);
    let server = d
        .dns
        .server
        .map_or("the system resolver".to_string(), |s| s.to_string());
    format!(
        "({source}, every {} ms, via {server})",
        d.interval.as_millis()
    )
}
