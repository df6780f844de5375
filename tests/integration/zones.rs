//! Zones: three zones of two real memcached servers each, `replicas = 3`:
//! where copies go (one per zone), checked on the servers themselves.

use memring::protocol::ReplyKind;

use crate::common::{held_values, wait_for, Memcached, Proxy};

const ZONES: [&str; 3] = ["a", "b", "c"];

/// Six servers, two per zone (servers 0, 1 in a; 2, 3 in b; 4, 5 in c).
fn six_servers() -> Vec<Memcached> {
    (0..6).map(|_| Memcached::start()).collect()
}

fn zone_of(server: usize) -> &'static str {
    ZONES[server / 2]
}

/// The config over `servers` with each in its zone and `settings` on top.
fn zoned_config(servers: &[Memcached], settings: &str) -> String {
    let mut text = format!("listen = \"127.0.0.1:0\"\n{settings}\n");
    for (i, server) in servers.iter().enumerate() {
        text.push_str(&format!(
            "[[servers]]\naddr = \"{}\"\nzone = \"{}\"\n",
            server.addr(),
            zone_of(i)
        ));
    }
    text
}

/// Writes `keys` through `proxy`, 100 sets at a time, each `STORED`.
fn write_all(proxy: &Proxy, keys: &[String], value: impl Fn(&str) -> String) {
    let mut client = proxy.client();
    for chunk in keys.chunks(100) {
        let mut batch = Vec::new();
        for key in chunk {
            let value = value(key);
            batch.extend_from_slice(
                format!("set {key} 0 0 {}\r\n{value}\r\n", value.len()).as_bytes(),
            );
        }
        client.send(&batch);
        for key in chunk {
            assert_eq!(client.reply(ReplyKind::Line), b"STORED\r\n", "{key}");
        }
    }
}

#[test]
fn every_key_has_exactly_one_copy_in_each_zone() {
    let servers = six_servers();
    let proxy = Proxy::start_text(&zoned_config(&servers, "replicas = 3\nzone = \"b\""));
    let keys: Vec<String> = (0..10_000).map(|i| format!("zoned:{i}")).collect();
    write_all(&proxy, &keys, |k| k.to_string());
    let key_bytes: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
    let mut direct: Vec<_> = servers.iter().map(Memcached::client).collect();
    // STORED comes on a quorum of 2; the third copy may land a moment later.
    let mut held: Vec<Vec<Option<Vec<u8>>>> = Vec::new();
    wait_for("every key on three servers", || {
        held = direct
            .iter_mut()
            .map(|c| held_values(c, &key_bytes))
            .collect();
        (0..keys.len()).all(|k| held.iter().filter(|h| h[k].is_some()).count() == 3)
    });
    let mut per_server = [0usize; 6];
    for (k, key) in keys.iter().enumerate() {
        let holders: Vec<usize> = (0..6).filter(|&s| held[s][k].is_some()).collect();
        let mut zones: Vec<&str> = holders.iter().map(|&s| zone_of(s)).collect();
        zones.sort_unstable();
        assert_eq!(zones, ZONES, "{key} is on {holders:?}");
        for &s in &holders {
            assert_eq!(held[s][k].as_deref(), Some(key.as_bytes()));
            per_server[s] += 1;
        }
    }
    // Within a zone the two servers share its copies by their ring share.
    println!("copies per server: {per_server:?}");
    for s in 0..6 {
        assert!((3_000..7_000).contains(&per_server[s]), "{per_server:?}");
    }
}
