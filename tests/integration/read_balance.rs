//! Read balancing (`read_balance`, `read_balance_epsilon`, hot keys spread
//! over their replicas), against real memcached: three servers,
//! `replicas = 3`, so every key is on every server and the only question is
//! which one a read asks.

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::common::relay::{Fault, Relay};
use crate::common::{wait_for, Memcached, Proxy, TempDir};

/// `cmd_get` of each server, asked directly (not through a relay).
fn cmd_gets(servers: &[Memcached]) -> Vec<u64> {
    servers.iter().map(|s| s.client().stat("cmd_get")).collect()
}

/// The config over `addrs` (server 0 possibly a relay), named so that the
/// ring is the same whatever the address, with `settings` on top.
fn config(addrs: &[String], settings: &str) -> String {
    let mut text = format!("listen = \"127.0.0.1:0\"\nreplicas = 3\nworkers = 2\n{settings}\n");
    for (i, addr) in addrs.iter().enumerate() {
        text.push_str(&format!(
            "[[servers]]\naddr = \"{addr}\"\nname = \"s{i}\"\n"
        ));
    }
    text
}

/// Writes `keys` through `proxy` (each value its key), each `STORED`.
fn write_all(proxy: &Proxy, keys: &[String]) {
    let mut client = proxy.client();
    for key in keys {
        assert_eq!(client.set(key, key.as_bytes()), b"STORED\r\n", "{key}");
    }
}

/// `clients` clients read every key of `keys` `rounds` times between
/// them, one `get` at a time each, taking the next read from one shared
/// list so that all stay busy to the end; every read must hit with the
/// key's value.
fn read_concurrently(proxy: &Proxy, keys: &[String], clients: usize, rounds: usize) {
    let next = AtomicUsize::new(0);
    let reads = keys.len() * rounds;
    std::thread::scope(|scope| {
        for _ in 0..clients {
            let mut client = proxy.client();
            let next = &next;
            scope.spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= reads {
                    break;
                }
                let key = &keys[i % keys.len()];
                assert_eq!(client.get(key).as_deref(), Some(key.as_bytes()), "{key}");
            });
        }
    });
}

/// The same reads through a sidecar with `read_balance = "local"` (the
/// default) and one with `"least_loaded"`, server 0 behind a relay that
/// holds each chunk 40 ms each way: the slow replica takes under 20 % of the
/// reads it took in ring order.
#[test]
fn least_loaded_takes_the_reads_off_a_slow_replica() {
    let servers: Vec<Memcached> = (0..3).map(|_| Memcached::start()).collect();
    let relay = Relay::start(
        &servers[0].addr(),
        Fault::delaying(Duration::from_millis(40)),
    );
    let addrs = vec![relay.addr(), servers[1].addr(), servers[2].addr()];
    let keys: Vec<String> = (0..100).map(|i| format!("balance:{i}")).collect();
    let mut took = Vec::new();
    for settings in ["", "read_balance = \"least_loaded\"\n"] {
        let proxy = Proxy::start_text(&config(&addrs, settings));
        write_all(&proxy, &keys);
        // Every copy landed (a write is answered on a quorum of two).
        wait_for("every copy on server 0", || {
            let mut direct = servers[0].client();
            keys.iter().all(|k| direct.get(k).is_some())
        });
        let before = cmd_gets(&servers);
        read_concurrently(&proxy, &keys, 8, 8);
        let after = cmd_gets(&servers);
        let moved: Vec<u64> = (0..3).map(|s| after[s] - before[s]).collect();
        let balanced = proxy.client().stat("read_balance_moved");
        println!("{settings:?}: cmd_get moved by {moved:?}, read_balance_moved {balanced}");
        // Each read asked one server.
        assert_eq!(
            moved.iter().sum::<u64>(),
            8 * keys.len() as u64,
            "{moved:?}"
        );
        if settings.is_empty() {
            assert_eq!(balanced, 0, "ring order moves nothing");
            assert!(moved[0] > 0, "server 0 owns some keys: {moved:?}");
        }
        took.push(moved[0]);
    }
    let (local, least_loaded) = (took[0], took[1]);
    assert!(
        least_loaded * 5 < local,
        "the slow replica took {least_loaded} reads with least_loaded, {local} in ring order"
    );
}

/// A key read by 20 clients at once becomes hot; its reads are then spread
/// over its three replicas (with `read_balance = "local"`, the default),
/// none taking more than (1 + epsilon) times their average.
#[test]
fn a_hot_keys_reads_spread_over_its_replicas_within_the_bound() {
    let servers: Vec<Memcached> = (0..3).map(|_| Memcached::start()).collect();
    let addrs: Vec<String> = servers.iter().map(Memcached::addr).collect();
    let proxy = Proxy::start_text(&config(&addrs, "hot_key_window_ms = 100\n"));
    let key = vec!["hot:key".to_string()];
    write_all(&proxy, &key);
    // Hot once a window of each worker has seen it: then about two reads
    // in three start off the owner.
    wait_for("the key to be hot and spread on both workers", || {
        let moved = proxy.client().stat("read_balance_moved");
        read_concurrently(&proxy, &key, 20, 600);
        proxy.client().stat("read_balance_moved") - moved > 300
    });
    let before = cmd_gets(&servers);
    let balanced = proxy.client().stat("read_balance_moved");
    read_concurrently(&proxy, &key, 20, 3000);
    let after = cmd_gets(&servers);
    let moved: Vec<u64> = (0..3).map(|s| after[s] - before[s]).collect();
    let balanced = proxy.client().stat("read_balance_moved") - balanced;
    println!("cmd_get moved by {moved:?}, read_balance_moved by {balanced}");
    let total: u64 = moved.iter().sum();
    assert_eq!(total, 3000, "{moved:?}");
    let average = total as f64 / 3.0;
    for (s, &n) in moved.iter().enumerate() {
        assert!(
            n as f64 <= 1.25 * average,
            "server {s} took {n} of {total} reads: {moved:?}"
        );
    }
}

#[test]
fn check_accepts_read_balance_and_refuses_bad_values() {
    let dir = TempDir::new("read_balance", "check");
    let base = "listen = \"127.0.0.1:22122\"\nreplicas = 2\n[[servers]]\naddr = \"127.0.0.1:11211\"\n[[servers]]\naddr = \"127.0.0.1:11212\"\n";
    let check = |settings: &str| {
        let path = dir.path("memring.toml");
        std::fs::write(&path, format!("{settings}\n{base}")).unwrap();
        Command::new(env!("CARGO_BIN_EXE_memring"))
            .arg("check")
            .arg(&path)
            .output()
            .unwrap()
    };
    for good in [
        "",
        "read_balance = \"local\"",
        "read_balance = \"least_loaded\"\nread_balance_epsilon = 0",
        "read_balance_epsilon = 10",
    ] {
        let output = check(good);
        assert!(
            output.status.success(),
            "{good}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    for (bad, says) in [
        ("read_balance = \"random\"", "memring.toml:1:16: read_balance = \"random\" is not a choice (one of: local, least_loaded)"),
        ("read_balance_epsilon = 11", "memring.toml:1:24: read_balance_epsilon = 11 must be a share from 0 to 10"),
        ("read_balance_epsilon = -1", "memring.toml:1:24: read_balance_epsilon = -1 must be a share from 0 to 10"),
        ("read_balance = 1", "read_balance"),
    ] {
        let output = check(bad);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{bad} accepted");
        assert!(stderr.contains(says), "{bad}: {stderr}");
    }
}

/// Without `read_balance` a replicated read goes as before: every read of
/// a key to its owner, whatever the load, and nothing counted as moved.
#[test]
fn by_default_reads_keep_ring_order() {
    let servers: Vec<Memcached> = (0..3).map(|_| Memcached::start()).collect();
    let addrs: Vec<String> = servers.iter().map(Memcached::addr).collect();
    // Hot keys are not detected: no spreading either.
    let proxy = Proxy::start_text(&config(&addrs, "hot_key_detect = false\n"));
    let key = vec!["plain:key".to_string()];
    write_all(&proxy, &key);
    let before = cmd_gets(&servers);
    read_concurrently(&proxy, &key, 10, 500);
    let after = cmd_gets(&servers);
    let moved: Vec<u64> = (0..3).map(|s| after[s] - before[s]).collect();
    assert_eq!(moved.iter().filter(|&&n| n > 0).count(), 1, "{moved:?}");
    // In `stats` (a panic if it were missing), at 0.
    assert_eq!(proxy.client().stat("read_balance_moved"), 0);
}

/// With zones, `least_loaded` prefers the local zone at equal load: one
/// client reading one key at a time (nothing else in flight) reads only
/// from zone b, as with `read_balance = "local"`, and nothing is moved.
#[test]
fn least_loaded_keeps_an_idle_sidecars_reads_in_its_zone() {
    let servers: Vec<Memcached> = (0..6).map(|_| Memcached::start()).collect();
    let mut text = String::from(
        "listen = \"127.0.0.1:0\"\nreplicas = 3\nzone = \"b\"\nread_balance = \"least_loaded\"\n",
    );
    for (i, server) in servers.iter().enumerate() {
        let zone = ["a", "b", "c"][i / 2];
        text.push_str(&format!(
            "[[servers]]\naddr = \"{}\"\nzone = \"{zone}\"\n",
            server.addr()
        ));
    }
    let proxy = Proxy::start_text(&text);
    let keys: Vec<String> = (0..500).map(|i| format!("zoned:{i}")).collect();
    write_all(&proxy, &keys);
    let before = cmd_gets(&servers);
    let mut client = proxy.client();
    for key in &keys {
        assert_eq!(client.get(key).as_deref(), Some(key.as_bytes()), "{key}");
    }
    let after = cmd_gets(&servers);
    let moved: Vec<u64> = (0..6).map(|s| after[s] - before[s]).collect();
    assert_eq!(moved[2] + moved[3], keys.len() as u64, "{moved:?}");
    assert_eq!(client.stat("read_balance_moved"), 0);
    assert_eq!(client.stat("zone_reads_cross_zone"), 0);
}
