//! `memring plan OLD NEW` and `memring plan --discovery CONFIG`: how a
//! config change would move the keyspace, which settings change, and which
//! of them need a restart, without touching anything.

use std::path::Path;

use anyhow::Context as _;

use memring::config::Config;
use memring::pools::topology::Change;

pub(crate) fn run(old: &Path, new: &Path) -> anyhow::Result<()> {
    let old_config = Config::load(old)?;
    let new_config = Config::load(new)?;
    print_plan(&old_config, &new_config, &new.display().to_string())
}

/// The plan of the change the next `[discovery]` round would make: from the
/// servers the running memring at `from` uses to what DNS lists now.
pub(crate) fn plan_discovery(file: &Path, from: Option<&str>) -> anyhow::Result<()> {
    let config = Config::load(file)?;
    let Some(source) = &config.discovery.source else {
        anyhow::bail!(
            "{}: no [discovery] srv or a: its servers do not come from DNS",
            file.display()
        );
    };
    let from = match from {
        Some(addr) => addr.to_string(),
        None => match config.listen.tcp() {
            Some(addr) if addr.ip().is_unspecified() => format!("127.0.0.1:{}", addr.port()),
            _ => config.listen.to_string(),
        },
    };
    let running = running_servers(&from).with_context(|| {
        format!("cannot ask the running memring at {from} which servers it uses")
    })?;
    let found = memring::control::discovery::servers_blocking(
        source,
        config.discovery.dns,
        config.discovery.tls,
    )
    .map_err(|e| {
        anyhow::anyhow!(
            "[discovery] {source}: {e}; the running memring keeps its {} servers",
            running.len()
        )
    })?;
    println!(
        "discovery: {source}: {} server{} in use at {from}, {} listed now",
        running.len(),
        if running.len() == 1 { "" } else { "s" },
        found.len()
    );
    print_plan(
        &config.with_servers(running),
        &config.with_servers(found),
        &file.display().to_string(),
    )
}

/// The servers the memring at `addr` discovered (its `stats`): names from
/// `discovery_server_list`, weights from `server:NAME:weight`.
fn running_servers(addr: &str) -> anyhow::Result<Vec<memring::config::ServerConfig>> {
    use std::io::{Read, Write};
    let timeout = std::time::Duration::from_secs(5);
    let mut stream = super::send::Conn::open(addr, timeout)?;
    stream.write_all(b"stats\r\n")?;
    let mut reply = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    while !reply.ends_with(b"END\r\n") {
        let n = stream.read(&mut chunk)?;
        anyhow::ensure!(n > 0, "the connection closed before the end of the stats");
        reply.extend_from_slice(&chunk[..n]);
    }
    let text = String::from_utf8_lossy(&reply);
    let stat = |name: &str| {
        text.lines()
            .find_map(|l| {
                l.strip_prefix("STAT ")?
                    .strip_prefix(name)?
                    .strip_prefix(' ')
            })
            .map(str::to_string)
    };
    let list = stat("discovery_server_list").ok_or_else(|| {
        anyhow::anyhow!("it reports no discovered servers (no [discovery] srv or a?)")
    })?;
    Ok(list
        .split(',')
        .filter(|name| !name.is_empty())
        .map(|name| memring::config::ServerConfig {
            weight: stat(&format!("server:{name}:weight"))
                .and_then(|w| w.parse().ok())
                .unwrap_or(1),
            ..memring::config::ServerConfig::plain(name.to_string(), name.to_string())
        })
        .collect())
}

/// `plan`'s output for a change from `old_config` to `new_config` (the
/// file `new` is named in warnings).
fn print_plan(old_config: &Config, new_config: &Config, new: &str) -> anyhow::Result<()> {
    if old_config.pools.is_empty() && new_config.pools.is_empty() {
        print_pool_plan(old_config, new_config);
    } else {
        print_pools_plan(old_config, new_config);
    }
    let settings = memring::control::settings::setting_changes(old_config, new_config);
    for setting in &settings {
        let when = if setting.restart_only {
            "needs a restart"
        } else {
            "applied on reload"
        };
        println!("setting: {setting} ({when})");
    }
    let restart: Vec<&str> = settings
        .iter()
        .filter(|s| s.restart_only)
        .map(|s| s.name)
        .collect();
    if !restart.is_empty() {
        println!(
            "restart needed: {} {} read only at start; a reload keeps the old value",
            restart.join(", "),
            if restart.len() == 1 { "is" } else { "are" }
        );
    }
    for warning in new_config.warnings() {
        println!("warning: {new}: {warning}");
    }
    Ok(())
}

/// One pool's part of a plan: each server's share before and after, what
/// moves, and the hand-off window.
fn print_pool_plan(old_config: &Config, new_config: &Config) {
    let old_ring = old_config.build_ring();
    let new_ring = new_config.build_ring();
    if old_config.ring != new_config.ring {
        println!(
            "ring: {} -> {} (keys are placed by another hash; the moved share is the expected one)",
            describe_ring(old_config),
            describe_ring(new_config)
        );
    }
    let old_shares = old_ring.shares();
    let new_shares = new_ring.shares();
    let mut names: Vec<&str> = old_config.servers.iter().map(|s| s.name.as_str()).collect();
    for server in &new_config.servers {
        if !names.contains(&server.name.as_str()) {
            names.push(&server.name);
        }
    }
    // The ring's members are the servers that are not warming, in order.
    let share_of = |config: &Config, shares: &[f64], name: &str| {
        config
            .servers
            .iter()
            .filter(|s| !s.warming)
            .position(|s| s.name == name)
            .map(|i| shares[i])
    };
    let warming =
        |config: &Config, name: &str| config.servers.iter().any(|s| s.name == name && s.warming);
    println!("{:<32} {:>9} {:>9}", "server", "before", "after");
    for name in names {
        let show = |config: &Config, share: Option<f64>| {
            if warming(config, name) {
                return "warming".to_string();
            }
            share.map_or("-".to_string(), |s| format!("{:.2}%", s * 100.0))
        };
        println!(
            "{:<32} {:>9} {:>9}",
            name,
            show(old_config, share_of(old_config, &old_shares, name)),
            show(new_config, share_of(new_config, &new_shares, name))
        );
    }
    print_warming(new_config);
    print_zones(old_config, new_config);
    let on_ring = |config: &Config| -> Vec<memring::config::ServerConfig> {
        config
            .servers
            .iter()
            .filter(|s| !s.warming)
            .cloned()
            .collect()
    };
    let change = Change::between(
        &on_ring(old_config),
        &old_ring,
        &on_ring(new_config),
        &new_ring,
    );
    println!("keyspace that moves: {:.2}%", change.moved_share * 100.0);
    println!("change: {change}");
    print_flush(old_config, new_config);
    if change.moved_share > 0.0 {
        let window = new_config.handoff.as_secs();
        if window == 0 {
            println!("hand-off: off (handoff_ms = 0): moved keys miss once");
        } else if !new_config.shared_with.reads_through() {
            println!(
                "hand-off: for {window} s, writes of moved keys (about {} per 100000 stored keys) \
                 delete their previous owner's copy; reads of them miss (shared_with = \"writers\")",
                (change.moved_share * 100_000.0).round() as u64
            );
        } else if !new_config.shared_with.copies() {
            println!(
                "hand-off: for {window} s, reads of moved keys (about {} per 100000 stored keys) \
                 fall through to their previous owner, never copied (shared_with = \"readers\")",
                (change.moved_share * 100_000.0).round() as u64
            );
        } else {
            println!(
                "hand-off: for {window} s, reads of moved keys (about {} per 100000 stored keys) \
                 fall through to their previous owner and are copied on a hit",
                (change.moved_share * 100_000.0).round() as u64
            );
        }
    }
}

/// Whether the servers `new_config` adds are sent `flush_all` before they
/// join (`control/newcomers.rs`): those whose name `old_config` does not
/// list. A running memring also spares a server still leaving in a hand-off
/// window, which a plan of two files cannot see.
fn print_flush(old_config: &Config, new_config: &Config) {
    let joining: Vec<&str> = new_config
        .servers
        .iter()
        .filter(|s| !old_config.servers.iter().any(|o| o.name == s.name))
        .map(|s| s.name.as_str())
        .collect();
    if joining.is_empty() {
        return;
    }
    let why = format!(
        "flush_new_servers = \"{}\", shared_with = \"{}\"",
        new_config.flush_new_servers.name(),
        new_config.shared_with.name()
    );
    if new_config.flush_new_servers.flushes(new_config.shared_with) {
        println!(
            "flush: flush_all on {} before {} the ring ({why}): what {} now is lost",
            joining.join(", "),
            if joining.len() == 1 {
                "it joins"
            } else {
                "they join"
            },
            if joining.len() == 1 {
                "it holds"
            } else {
                "they hold"
            }
        );
    } else {
        println!(
            "flush: none; {} {} the ring with what {} ({why})",
            joining.join(", "),
            if joining.len() == 1 { "joins" } else { "join" },
            if joining.len() == 1 {
                "it holds"
            } else {
                "they hold"
            }
        );
    }
}

/// The warming servers of `config`: each takes writes for the share of
/// the keys it will own once it joins, and serves no reads until then.
/// Each zone's part of the ring and of the copies before and after, when
/// either config has zones; a change of zones moves copies, not owners.
fn print_zones(old_config: &Config, new_config: &Config) {
    let (before, after) = (old_config.zone_shares(), new_config.zone_shares());
    if before.is_empty() && after.is_empty() {
        return;
    }
    if before != after {
        for share in &before {
            println!("before: {}", memring::ring::zones::describe(share));
        }
    }
    for share in &after {
        println!(
            "{}{} (replicas = {})",
            if before == after { "" } else { "after: " },
            memring::ring::zones::describe(share),
            new_config.replicas
        );
    }
    if after.is_empty() {
        println!(
            "zones: none after the change: replicas are the next servers clockwise, in any zone"
        );
    }
}

fn print_warming(config: &Config) {
    if !config.servers.iter().any(|s| s.warming) {
        return;
    }
    let staged = config.build_staged_ring().shares();
    for (server, share) in config.servers.iter().zip(staged) {
        if server.warming {
            println!(
                "warming: {} takes the writes of {:.2}% of the keys (its share once it joins) and serves no reads; set warming = false to join with them",
                server.name,
                share * 100.0
            );
        }
    }
}

/// A plan over configs with several pools: each pool's part under its name,
/// pools added and removed, and the route prefixes whose pool changes.
fn print_pools_plan(old_config: &Config, new_config: &Config) {
    let (old_pools, new_pools) = (old_config.pool_list(), new_config.pool_list());
    let mut names: Vec<String> = old_pools.iter().map(|p| p.name.clone()).collect();
    for pool in &new_pools {
        if !names.contains(&pool.name) {
            names.push(pool.name.clone());
        }
    }
    for name in &names {
        let before = old_pools.iter().find(|p| &p.name == name);
        let after = new_pools.iter().find(|p| &p.name == name);
        match (before, after) {
            (Some(before), Some(after)) => {
                println!("pool {name}:");
                print_pool_plan(&before.config, &after.config);
            }
            (None, Some(after)) => println!(
                "pool {name}: added, {} server{}",
                after.config.servers.len(),
                if after.config.servers.len() == 1 {
                    ""
                } else {
                    "s"
                }
            ),
            (Some(_), None) => println!("pool {name}: removed"),
            (None, None) => {}
        }
    }
    // Where each prefix either file routes goes, under each file's routes.
    let pool_of = |config: &Config, key: &str| {
        config
            .routes
            .iter()
            .find(|r| key.starts_with(&r.prefix))
            .map_or(config.default_pool.clone(), |r| r.pool.clone())
    };
    let mut prefixes: Vec<&str> = old_config
        .routes
        .iter()
        .map(|r| r.prefix.as_str())
        .collect();
    for route in &new_config.routes {
        if !prefixes.contains(&route.prefix.as_str()) {
            prefixes.push(&route.prefix);
        }
    }
    for prefix in prefixes {
        let (from, to) = (pool_of(old_config, prefix), pool_of(new_config, prefix));
        if from != to {
            println!(
                "route `{prefix}`: keys move from pool {from} to pool {to} (not handed off: their copies in pool {to} are deleted first, unless {to} is {from}'s complete shadow)"
            );
        }
    }
    if old_config.default_pool != new_config.default_pool {
        println!(
            "default_pool: keys that match no route move from pool {} to pool {} (not handed off: their copies in pool {} are deleted first, unless {} is {}'s complete shadow)",
            old_config.default_pool,
            new_config.default_pool,
            new_config.default_pool,
            new_config.default_pool,
            old_config.default_pool
        );
    }
}

/// `twemproxy (hash fnv1a_64, hash_tag "{}")`
pub(crate) fn describe_ring(config: &Config) -> String {
    use memring::ring::Flavour;
    let mut text = config.ring.flavour.name().to_string();
    let mut details = Vec::new();
    if config.ring.flavour == Flavour::Twemproxy {
        details.push(format!("hash {}", config.ring.hash.name()));
    }
    if config.ring.flavour == Flavour::PhpMemcache {
        let hash = memring::ring::php_memcache::ini_name(config.ring.hash);
        details.push(format!("hash {hash}"));
    }
    if let Some(tag) = config.ring.hash_tag {
        details.push(format!("hash_tag \"{}\"", String::from_utf8_lossy(&tag)));
    }
    if !config.ring.hash_without_prefix.is_empty() {
        let prefix = String::from_utf8_lossy(&config.ring.hash_without_prefix);
        details.push(format!("hash_without_prefix {prefix:?}"));
    }
    if !details.is_empty() {
        text.push_str(&format!(" ({})", details.join(", ")));
    }
    text
}
