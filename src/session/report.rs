//! memring's answer to the memcached `stats` command: its own counters in
//! memcached's format, then one group of lines per server. Rendering only;
//! the counters live in the rest of `stats/`, which imports nothing of the
//! topology.

use bytes::BytesMut;

use crate::pools::layout::Layout;
use crate::pools::topology::Topology;
use crate::protocol::encode::write_stat;
use crate::protocol::Command;
use crate::stats::Stats;

/// Writes the `stats shadow` reply, ending with `END`: for each pool with a
/// shadow, `shadow:<pool>:<field>` lines with the shadow's figures beside
/// the primary's for the same keys.
pub(crate) fn write_shadow_stats(out: &mut BytesMut, layout: &Layout) {
    for (i, pool) in layout.pools().iter().enumerate() {
        let Some(link) = layout.shadow_of(i) else {
            continue;
        };
        let figures = link.counters.figures();
        let field = |name: &str| format!("shadow:{}:{name}", pool.name);
        let compared = figures.compared();
        let rate = |hits| format!("{:.4}", crate::stats::ratio(hits, compared));
        write_stat(out, &field("pool"), &layout.pools()[link.pool].name);
        write_stat(out, &field("fraction"), &link.sampler.fraction());
        write_stat(out, &field("compared"), &compared);
        write_stat(out, &field("primary_hits"), &figures.primary_hits());
        write_stat(out, &field("shadow_hits"), &figures.shadow_hits());
        write_stat(
            out,
            &field("primary_hit_rate"),
            &rate(figures.primary_hits()),
        );
        write_stat(out, &field("shadow_hit_rate"), &rate(figures.shadow_hits()));
        for (name, count) in crate::stats::SHADOW_PAIRINGS.iter().zip(figures.pairs) {
            write_stat(out, &field(name), &count);
        }
        write_stat(out, &field("sent"), &figures.sent);
        write_stat(out, &field("failed"), &figures.failed);
        write_stat(out, &field("shed"), &figures.shed);
        write_stat(out, &field("lost_writes"), &figures.lost_writes);
    }
    out.extend_from_slice(b"END\r\n");
}

/// The counters of the `stats` reply that `stats reset` sets back to zero,
/// by `STAT` name, as they read now: memcached's own (`total_connections`,
/// `cmd_*`, `*_hits`, `*_misses`, `cas_*`, `bytes_*`) and memring's hot-key
/// and hand-off counters. Gauges (connections open, bytes owed, the ring)
/// and the per-server and per-pool lines are not reset, nor is anything in
/// `/metrics` (Prometheus counters only grow).
fn counters(stats: &Stats) -> Vec<(String, u64)> {
    let mut counters: Vec<(String, u64)> = Vec::with_capacity(40);
    let mut add = |name: &str, value: u64| counters.push((name.to_string(), value));
    add("total_connections", stats.total_connections());
    add("cmd_get", stats.keys_requested());
    let set_count: u64 = Command::ALL
        .iter()
        .filter(|c| c.is_storage())
        .map(|&c| stats.command_count(c))
        .sum();
    add("cmd_set", set_count);
    add("cmd_touch", stats.command_count(Command::Touch));
    add("cmd_flush", stats.command_count(Command::FlushAll));
    for (name, hits, misses) in stats.hits_and_misses() {
        add(&format!("{name}_hits"), hits);
        add(&format!("{name}_misses"), misses);
    }
    let (cas_hits, cas_misses, cas_badval) = stats.cas_counts();
    add("cas_misses", cas_misses);
    add("cas_hits", cas_hits);
    add("cas_badval", cas_badval);
    let (read, written) = stats.client_bytes();
    add("bytes_read", read);
    add("bytes_written", written);
    let hot = &stats.hot;
    add("hot_key_coalesced_gets", hot.coalesced.get());
    add("near_cache_hits", hot.cache_hits.get());
    add("near_cache_misses", hot.cache_misses.get());
    add("near_cache_evictions", hot.cache_evictions.get());
    for (name, value) in stats.handoff() {
        add(name, value);
    }
    add("read_balance_moved", stats.read_balance_moved.get());
    for (name, value) in stats.zone_counters() {
        add(&name, value);
    }
    counters
}

/// `stats reset`: from now on, the `stats` reply counts [`counters`] from
/// their values at this moment (memcached answers `RESET`).
pub(crate) fn reset_stats(stats: &Stats) {
    stats.set_reset_baseline(counters(stats).into_iter().collect());
}

/// Writes the whole `stats` reply, ending with `END`: the default pool's
/// lines as a one-pool memring writes them, then every other pool's with
/// `pool:<name>:` before each.
pub(crate) fn write_stats(out: &mut BytesMut, stats: &Stats, layout: &Layout) {
    let topology = layout.default_topology();
    let topology = &*topology;
    let now = crate::runtime::clock::unix_now();
    let baseline = stats.reset_baseline();
    let counters = counters(stats);
    // A counter's count since the last `stats reset`: each is read once,
    // above, so `stats reset` and `stats` cannot disagree on what one is.
    let mut counters = counters.iter().map(|(name, value)| {
        let since = value.saturating_sub(baseline.get(name).copied().unwrap_or(0));
        (name.as_str(), since)
    });
    let mut counter = |out: &mut BytesMut, name: &str| {
        let (listed, value) = counters
            .next()
            .expect("the stats reply writes every counter, in `counters` order");
        debug_assert_eq!(listed, name);
        write_stat(out, name, &value);
    };
    write_stat(out, "pid", &std::process::id());
    write_stat(out, "uptime", &stats.uptime_seconds());
    write_stat(out, "time", &now);
    write_stat(out, "version", &crate::VERSION_STRING);
    // memcached prints these as seconds.microseconds.
    let cpu = crate::stats::process_cpu();
    let seconds = |micros: u64| format!("{}.{:06}", micros / 1_000_000, micros % 1_000_000);
    write_stat(out, "rusage_user", &seconds(cpu.user_micros));
    write_stat(out, "rusage_system", &seconds(cpu.system_micros));
    write_stat(out, "curr_connections", &stats.curr_connections());
    counter(out, "total_connections");
    write_stat(out, "reply_bytes_owed", &stats.reply_bytes_owed());
    for name in ["cmd_get", "cmd_set", "cmd_touch", "cmd_flush"] {
        counter(out, name);
    }
    for (name, _, _) in stats.hits_and_misses() {
        counter(out, &format!("{name}_hits"));
        counter(out, &format!("{name}_misses"));
    }
    for name in [
        "cas_misses",
        "cas_hits",
        "cas_badval",
        "bytes_read",
        "bytes_written",
        "hot_key_coalesced_gets",
        "near_cache_hits",
        "near_cache_misses",
        "near_cache_evictions",
    ] {
        counter(out, name);
    }
    write_ring(out, "", topology);
    let digest = crate::ring::digest::hex(layout.ring_digest());
    write_stat(out, "ring_digest", &digest);
    for (name, _) in stats.handoff() {
        counter(out, name);
    }
    counter(out, "read_balance_moved");
    // Per zone (as many as `counters` read), then the zones warming.
    for (name, value) in counters {
        write_stat(out, name, &value);
    }
    for zone in &topology.config.warming_zones {
        write_stat(out, &format!("zone:{zone}:warming"), &1);
    }
    let discovered = &topology.config.discovery;
    let source = if discovered.etcd.is_some() {
        "etcd"
    } else if discovered.source.is_some() {
        "dns"
    } else {
        "file"
    };
    write_stat(out, "membership_source", &source);
    write_stat(out, "membership_revision", &stats.membership_revision());
    if discovered.etcd.is_some() {
        let (staged, waiting, forced) = stats.fleet();
        write_stat(out, "membership_staged_revision", &staged);
        write_stat(out, "fleet_sidecars_waited_on", &waiting);
        write_stat(out, "fleet_forced_switches", &forced);
        write_stat(out, "fleet_cut_off", &u8::from(stats.is_fleet_cut_off()));
    }
    if let Some(discovery) = stats.discovery() {
        // `srv _memcache._tcp.cache` as `discovery_srv _memcache._tcp.cache`:
        // a STAT value has no spaces.
        let (kind, name) = discovery
            .source
            .split_once(' ')
            .unwrap_or(("source", discovery.source.as_str()));
        write_stat(out, &format!("discovery_{kind}"), &name);
        write_stat(out, "discovery_servers", &discovery.servers.len());
        write_stat(out, "discovery_server_list", &discovery.servers.join(","));
        write_stat(out, "discovery_last_change", &discovery.last_change);
        write_stat(out, "discovery_changes", &discovery.changes);
        write_stat(out, "discovery_lookup_failures", &discovery.lookup_failures);
        write_stat(out, "discovery_failing", &u8::from(discovery.failing));
    }
    write_servers(out, "", topology);
    // An etcd member's place in its lifecycle, beside its health `state`.
    for backend in topology.backends.iter() {
        if let Some(member) = stats.member_state(backend.name()) {
            write_stat(
                out,
                &format!("server:{}:member_state", backend.name()),
                &member,
            );
        }
    }
    for pool in layout.pools() {
        let prefix = format!("pool:{}:", pool.name);
        let topology = pool.topology.load_full();
        if layout.pools().len() > 1 {
            // Each pool's own share of the traffic (the lines above count
            // every pool together).
            let figures = &topology.figures;
            let (hits, misses) = figures.hits_and_misses();
            write_stat(out, &format!("{prefix}requests"), &figures.requests());
            write_stat(out, &format!("{prefix}get_hits"), &hits);
            write_stat(out, &format!("{prefix}get_misses"), &misses);
        }
        if &*pool.name == layout.default_name() {
            continue;
        }
        write_ring(out, &prefix, &topology);
        write_servers(out, &prefix, &topology);
    }
    out.extend_from_slice(b"END\r\n");
}

/// One pool's ring lines.
fn write_ring(out: &mut BytesMut, prefix: &str, topology: &Topology) {
    write_stat(out, &format!("{prefix}ring_version"), &topology.version);
    write_stat(
        out,
        &format!("{prefix}ring_servers"),
        &topology.backends.len(),
    );
    write_stat(
        out,
        &format!("{prefix}ring_ejected"),
        &topology.ejected.len(),
    );
    let handoff_until = topology.previous.as_ref().map_or(0, |p| p.until_unix);
    write_stat(out, &format!("{prefix}handoff_until"), &handoff_until);
}

/// One pool's lines per server.
fn write_servers(out: &mut BytesMut, prefix: &str, topology: &Topology) {
    let shares = topology.shares();
    let timeout = [crate::error::BackendErrorKind::Timeout.index()];
    for (i, backend) in topology.backends.iter().enumerate() {
        let name = backend.name();
        let metrics = backend.metrics();
        let stat = |out: &mut BytesMut, what: &str, value: &dyn std::fmt::Display| {
            write_stat(out, &format!("{prefix}server:{name}:{what}"), value);
        };
        stat(out, "addr", &backend.addr());
        stat(
            out,
            "weight",
            &topology
                .config
                .servers
                .iter()
                .find(|s| s.name == name)
                .map_or(0, |s| s.weight),
        );
        stat(out, "state", &backend.state().as_str());
        stat(out, "membership", &topology.membership(i).as_str());

        stat(out, "requests", &metrics.requests.get());
        stat(out, "coalesced_gets", &metrics.coalesced.get());
        stat(out, "errors", &metrics.error_count());
        stat(out, "timeouts", &metrics.errors_of(&timeout));
        stat(out, "rejected_busy", &metrics.rejected_busy.get());
        stat(out, "connections", &metrics.connections.get());
        let share = shares.get(i).copied().unwrap_or(0.0);
        stat(out, "ring_share", &format_args!("{share:.4}"));
    }
}
