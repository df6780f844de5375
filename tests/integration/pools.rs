//! Several pools in one process: key-prefix routes, a pool's own listener,
//! multi-gets across pools, per-pool figures, and reloads that add pools
//! and routes under load. Checked on the memcached servers themselves.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use memring::protocol::ReplyKind;

use crate::common::{wait_for, Client, Memcached, Proxy, TempDir};

/// A config with a `default` pool over `default` and a pool `sessions`
/// over `sessions` (with its own listener), and `routes` after them.
fn two_pools(default: &[&Memcached], sessions: &[&Memcached], routes: &str) -> String {
    let mut text = String::from("listen = \"127.0.0.1:0\"\n");
    for server in default {
        text.push_str(&format!("[[servers]]\naddr = \"{}\"\n", server.addr()));
    }
    text.push_str("\n[[pools]]\nname = \"sessions\"\nlisten = \"127.0.0.1:0\"\n");
    for server in sessions {
        text.push_str(&format!(
            "[[pools.servers]]\naddr = \"{}\"\n",
            server.addr()
        ));
    }
    text.push('\n');
    text.push_str(routes);
    text
}

const SESSIONS_ROUTE: &str = "[[routes]]\nprefix = \"sess:\"\npool = \"sessions\"\n";

/// How many of `keys` each server holds (asked directly).
fn held_by(servers: &[&Memcached], keys: &[String]) -> Vec<usize> {
    servers
        .iter()
        .map(|server| {
            let mut client = server.client();
            keys.iter().filter(|k| client.get(k).is_some()).count()
        })
        .collect()
}

#[test]
fn prefix_routes_send_keys_only_to_their_pools_servers() {
    let (d1, d2, s1, s2) = (
        Memcached::start(),
        Memcached::start(),
        Memcached::start(),
        Memcached::start(),
    );
    let proxy = Proxy::start_text(&two_pools(&[&d1, &d2], &[&s1, &s2], SESSIONS_ROUTE));
    let mut client = proxy.client();
    let sessions: Vec<String> = (0..300).map(|i| format!("sess:{i}")).collect();
    let others: Vec<String> = (0..300).map(|i| format!("user:{i}")).collect();
    for key in sessions.iter().chain(&others) {
        assert_eq!(client.set(key, key.as_bytes()), b"STORED\r\n");
    }
    let on_sessions = held_by(&[&s1, &s2], &sessions);
    let on_default = held_by(&[&d1, &d2], &others);
    assert_eq!(on_sessions.iter().sum::<usize>(), 300, "{on_sessions:?}");
    assert!(
        on_sessions.iter().all(|&n| n > 50),
        "both share: {on_sessions:?}"
    );
    assert_eq!(on_default.iter().sum::<usize>(), 300, "{on_default:?}");
    assert_eq!(held_by(&[&d1, &d2], &sessions), [0, 0]);
    assert_eq!(held_by(&[&s1, &s2], &others), [0, 0]);
    for key in sessions.iter().chain(&others) {
        assert_eq!(client.get(key).as_deref(), Some(key.as_bytes()));
    }

    // The pool's own listener sends every key to it, whatever its prefix.
    let (name, addr) = &proxy.running().pool_addrs[0];
    assert_eq!(name, "sessions");
    let mut bound = Client::connect(&addr.to_string());
    let direct: Vec<String> = (0..100).map(|i| format!("user:direct:{i}")).collect();
    for key in &direct {
        assert_eq!(bound.set(key, b"x"), b"STORED\r\n");
    }
    assert_eq!(held_by(&[&s1, &s2], &direct).iter().sum::<usize>(), 100);
    assert_eq!(held_by(&[&d1, &d2], &direct), [0, 0]);
    assert_eq!(bound.get("sess:7").as_deref(), Some(&b"sess:7"[..]));
    assert_eq!(bound.get("user:7"), None, "user:7 is in the default pool");
    // Meta commands route by their key as well.
    client.send(b"mg sess:9 v\r\n");
    assert_eq!(client.meta_reply(), b"VA 6\r\nsess:9\r\n");
    client.send(b"ms sess:meta 2\r\nhi\r\n");
    assert_eq!(client.meta_reply(), b"HD\r\n");
    assert_eq!(
        held_by(&[&s1, &s2], &["sess:meta".into()])
            .iter()
            .sum::<usize>(),
        1
    );
    // A `b` key routes by its decoded bytes (decoded once for the route and
    // the ring): `c2VzczpiNjQ=` is `sess:b64`, `dXNlcjpiNjQ=` `user:b64`.
    client.send(b"ms c2VzczpiNjQ= 2 b\r\nhi\r\nms dXNlcjpiNjQ= 2 b\r\nho\r\n");
    assert_eq!(client.meta_reply(), b"HD\r\n");
    assert_eq!(client.meta_reply(), b"HD\r\n");
    let (session, user) = (["sess:b64".to_string()], ["user:b64".to_string()]);
    assert_eq!(held_by(&[&s1, &s2], &session).iter().sum::<usize>(), 1);
    assert_eq!(held_by(&[&d1, &d2], &user).iter().sum::<usize>(), 1);
    assert_eq!(held_by(&[&d1, &d2], &session), [0, 0]);
    assert_eq!(held_by(&[&s1, &s2], &user), [0, 0]);
    client.send(b"mg c2VzczpiNjQ= b v\r\nmg dXNlcjpiNjQ= b v\r\n");
    assert_eq!(client.meta_reply(), b"VA 2\r\nhi\r\n");
    assert_eq!(client.meta_reply(), b"VA 2\r\nho\r\n");
    assert_eq!(client.get("sess:b64").as_deref(), Some(&b"hi"[..]));
}

#[test]
fn a_get_across_pools_answers_in_key_order() {
    let (d1, d2, s1) = (Memcached::start(), Memcached::start(), Memcached::start());
    let proxy = Proxy::start_text(&two_pools(&[&d1, &d2], &[&s1], SESSIONS_ROUTE));
    let mut client = proxy.client();
    // Keys alternate between the pools in runs of 1 to 3; every seventh is
    // never stored (a miss in the middle of a run).
    let keys: Vec<String> = (0..50)
        .map(|i| {
            if (i / (i % 3 + 1)) % 2 == 0 {
                format!("sess:{i}")
            } else {
                format!("user:{i}")
            }
        })
        .collect();
    assert!(
        keys.iter().any(|k| k.starts_with("sess:")) && keys.iter().any(|k| k.starts_with("user:"))
    );
    let mut expected = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        if i % 7 == 3 {
            continue;
        }
        let value = format!("value-of-{key}");
        assert_eq!(client.set(key, value.as_bytes()), b"STORED\r\n");
        expected
            .extend_from_slice(format!("VALUE {key} 0 {}\r\n{value}\r\n", value.len()).as_bytes());
    }
    expected.extend_from_slice(b"END\r\n");
    let line = format!("get {}\r\n", keys.join(" "));
    assert_eq!(
        String::from_utf8_lossy(&client.call(line.as_bytes(), ReplyKind::Values)),
        String::from_utf8_lossy(&expected)
    );
    // The same with `gat`, and pipelined behind another request.
    let line = format!("gat 100 {}\r\nget {}\r\n", keys.join(" "), keys[1]);
    client.send(line.as_bytes());
    assert_eq!(
        String::from_utf8_lossy(&client.reply(ReplyKind::Values)),
        String::from_utf8_lossy(&expected)
    );
    let single = client.reply(ReplyKind::Values);
    let value_of_1 = format!("VALUE {} 0 ", keys[1]);
    assert!(
        single.starts_with(value_of_1.as_bytes()),
        "{}",
        String::from_utf8_lossy(&single)
    );
    // All misses across pools: just the END.
    assert_eq!(
        client.call(b"get sess:none user:none sess:none2\r\n", ReplyKind::Values),
        b"END\r\n"
    );
}

#[test]
fn stats_and_metrics_name_each_pool() {
    let (d1, s1, s2) = (Memcached::start(), Memcached::start(), Memcached::start());
    let proxy = Proxy::start_text(&two_pools(&[&d1], &[&s1, &s2], SESSIONS_ROUTE));
    let mut client = proxy.client();
    assert_eq!(client.set("sess:a", b"1"), b"STORED\r\n");
    assert_eq!(client.set("user:a", b"1"), b"STORED\r\n");
    // Per pool: sessions 2 hits (one classic, one meta) and 2 misses (one
    // quiet); default 1 hit and 1 miss, the last two in one get across both.
    assert!(client.get("sess:a").is_some() && client.get("sess:none").is_none());
    client.send(b"mg sess:a v\r\nmg sess:gone v q\r\nmn\r\n");
    assert!(client.meta_reply().starts_with(b"VA 1"));
    assert_eq!(client.meta_reply(), b"MN\r\n");
    let reply = client.call(b"get user:a user:none\r\n", ReplyKind::Values);
    assert!(
        reply.starts_with(b"VALUE user:a"),
        "{}",
        String::from_utf8_lossy(&reply)
    );
    let stats = client.stats("");
    let stat = |name: &str| {
        stats
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no STAT {name}: {stats:?}"))
    };
    assert_eq!(stat("ring_servers"), "1");
    assert_eq!(stat("pool:sessions:get_hits"), "2");
    assert_eq!(stat("pool:sessions:get_misses"), "2");
    assert_eq!(stat("pool:default:get_hits"), "1");
    assert_eq!(stat("pool:default:get_misses"), "1");
    // set, get, get, mg, mg (mn is answered by memring on no pool's behalf).
    assert_eq!(stat("pool:sessions:requests"), "5");
    assert_eq!(stat("pool:sessions:ring_servers"), "2");
    assert_eq!(stat("pool:sessions:ring_version"), "1");
    let s1_name = s1.addr();
    assert_eq!(
        stat(&format!("pool:sessions:server:{s1_name}:state")),
        "ACTIVE"
    );
    let metrics = proxy.running().stats.prometheus_text();
    for line in [
        "memring_ring_version{pool=\"default\"} 1".to_string(),
        "memring_ring_version{pool=\"sessions\"} 1".to_string(),
        "memring_servers_configured{pool=\"sessions\"} 2".to_string(),
        "memring_pool_get_keys_total{pool=\"sessions\",result=\"hit\"} 2".to_string(),
        "memring_pool_requests_total{pool=\"sessions\",command=\"mg\"} 2".to_string(),
        format!("memring_server_membership{{pool=\"sessions\",server=\"{s1_name}\",state=\"ACTIVE\"}} 1"),
    ] {
        assert!(metrics.contains(&line), "{line} in\n{metrics}");
    }
    let requests = |pool: &str| {
        metrics
            .lines()
            .filter(|l| l.starts_with(&format!("memring_backend_requests_total{{pool=\"{pool}\"")))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
            .sum::<u64>()
    };
    assert!(requests("sessions") >= 1, "{metrics}");
}

#[test]
fn a_reload_adds_a_pool_and_a_route_under_load_with_no_errors() {
    let (d1, d2, n1, n2) = (
        Memcached::start(),
        Memcached::start(),
        Memcached::start(),
        Memcached::start(),
    );
    let dir = TempDir::new("pools", "reload");
    let path = dir.path("memring.toml");
    let one = format!(
        "listen = \"127.0.0.1:0\"\n[[servers]]\naddr = \"{}\"\n[[servers]]\naddr = \"{}\"\n",
        d1.addr(),
        d2.addr()
    );
    std::fs::write(&path, &one).unwrap();
    let proxy = Proxy::start_file(&path);
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(AtomicU64::new(0));
    // A key that changes pool is not handed off: its value stays in the
    // pool it was written to, so a read right after the switch may miss.
    let cart_misses = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let load: Vec<_> = (0..4)
        .map(|t| {
            let (stop, errors, done) = (stop.clone(), errors.clone(), done.clone());
            let cart_misses = cart_misses.clone();
            let mut client = proxy.client();
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) && i < 200_000 {
                    let key = if i % 2 == 0 {
                        format!("cart:{t}:{}", i % 500)
                    } else {
                        format!("user:{t}:{}", i % 500)
                    };
                    let value = format!("{i}");
                    if client.set(&key, value.as_bytes()) != b"STORED\r\n" {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                    match client.get(&key) {
                        Some(v) if v == value.as_bytes() => {}
                        None if key.starts_with("cart:") => {
                            cart_misses.fetch_add(1, Ordering::Relaxed);
                        }
                        _ => {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            })
        })
        .collect();
    wait_for("load to run", || done.load(Ordering::Relaxed) > 500);
    let two = format!(
        "{one}\n[[pools]]\nname = \"carts\"\nhandoff_ms = 0\n[[pools.servers]]\naddr = \"{}\"\n[[pools.servers]]\naddr = \"{}\"\n\n[[routes]]\nprefix = \"cart:\"\npool = \"carts\"\n",
        n1.addr(),
        n2.addr()
    );
    std::fs::write(&path, &two).unwrap();
    let new_pool = [&n1, &n2];
    // Every key the load writes now and then (cart keys have even numbers).
    let probe: Vec<String> = (0..4)
        .flat_map(|t| (0..500).step_by(2).map(move |i| format!("cart:{t}:{i}")))
        .collect();
    wait_for("cart keys to reach the new pool", || {
        held_by(&new_pool, &probe).iter().sum::<usize>() > 100
    });
    let at_switch = done.load(Ordering::Relaxed);
    wait_for("more load on the new layout", || {
        done.load(Ordering::Relaxed) > at_switch + 2_000
    });
    stop.store(true, Ordering::Relaxed);
    for thread in load {
        thread.join().unwrap();
    }
    assert_eq!(errors.load(Ordering::Relaxed), 0);
    // At most the one write of each client that the switch came between.
    assert!(cart_misses.load(Ordering::Relaxed) <= 4, "{cart_misses:?}");
    // After the switch no cart key is written to the default pool: its
    // servers keep only what was written before.
    let mut client = proxy.client();
    assert_eq!(client.set("cart:new", b"1"), b"STORED\r\n");
    assert_eq!(held_by(&[&d1, &d2], &["cart:new".into()]), [0, 0]);
    assert_eq!(
        held_by(&new_pool, &["cart:new".into()])
            .iter()
            .sum::<usize>(),
        1
    );
    assert!(proxy
        .running()
        .stats
        .prometheus_text()
        .contains("memring_ring_version{pool=\"carts\"} 1"));

    // Removing the pool again sends its keys back to the default pool.
    std::fs::write(&path, &one).unwrap();
    wait_for("the carts pool to go", || {
        !proxy
            .running()
            .stats
            .prometheus_text()
            .contains("memring_ring_version{pool=\"carts\"}")
    });
    assert_eq!(client.set("cart:back", b"1"), b"STORED\r\n");
    assert_eq!(
        held_by(&[&d1, &d2], &["cart:back".into()])
            .iter()
            .sum::<usize>(),
        1
    );
}

#[test]
fn a_gat_across_pools_ends_once_when_a_pool_in_a_window_runs_it_as_the_lease_retry() {
    let (d1, s1, s2, s3) = (
        Memcached::start(),
        Memcached::start(),
        Memcached::start(),
        Memcached::start(),
    );
    let dir = TempDir::new("pools", "gat-lease");
    let path = dir.path("memring.toml");
    std::fs::write(&path, two_pools(&[&d1], &[&s1, &s2], SESSIONS_ROUTE)).unwrap();
    let proxy = Proxy::start_file(&path);
    let mut client = proxy.client();
    let keys: Vec<String> = (0..40).map(|i| format!("sess:{i}")).collect();
    for key in &keys {
        assert_eq!(client.set(key, b"v"), b"STORED\r\n");
    }
    assert_eq!(client.set("user:x", b"u"), b"STORED\r\n");
    // The sessions pool gets a window; the default pool none.
    std::fs::write(&path, two_pools(&[&d1], &[&s1, &s2, &s3], SESSIONS_ROUTE)).unwrap();
    wait_for("the sessions pool's ring v2", || {
        client
            .stats("")
            .into_iter()
            .any(|(k, v)| k == "pool:sessions:ring_version" && v == "2")
    });
    // A one-key run of a key that stayed is the lease retry in its pool;
    // the reply still has one `END`, after the last run's values.
    for key in &keys {
        let got = client.call(
            format!("gat 0 {key} user:x\r\n").as_bytes(),
            ReplyKind::Values,
        );
        let want = format!("VALUE {key} 0 1\r\nv\r\nVALUE user:x 0 1\r\nu\r\nEND\r\n");
        assert_eq!(String::from_utf8_lossy(&got), want);
    }
    assert_eq!(client.get("user:x").as_deref(), Some(&b"u"[..]));
}

#[test]
fn a_pool_whose_servers_change_gets_its_own_hand_off_window() {
    let (d1, s1, s2, s3) = (
        Memcached::start(),
        Memcached::start(),
        Memcached::start(),
        Memcached::start(),
    );
    let dir = TempDir::new("pools", "handoff");
    let path = dir.path("memring.toml");
    let before = two_pools(&[&d1], &[&s1, &s2], SESSIONS_ROUTE);
    std::fs::write(&path, &before).unwrap();
    let proxy = Proxy::start_file(&path);
    let mut client = proxy.client();
    let keys: Vec<String> = (0..1000).map(|i| format!("sess:{i}")).collect();
    for key in &keys {
        assert_eq!(client.set(key, b"v"), b"STORED\r\n");
    }
    let after = two_pools(&[&d1], &[&s1, &s2, &s3], SESSIONS_ROUTE);
    std::fs::write(&path, &after).unwrap();
    let stat = |client: &mut Client, name: &str| {
        client
            .stats("")
            .into_iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v)
    };
    wait_for("the sessions pool's ring v2", || {
        stat(&mut client, "pool:sessions:ring_version").as_deref() == Some("2")
    });
    assert_ne!(
        stat(&mut client, "pool:sessions:handoff_until").as_deref(),
        Some("0")
    );
    assert_eq!(
        stat(&mut client, "handoff_until").as_deref(),
        Some("0"),
        "the default pool did not change"
    );
    assert_eq!(stat(&mut client, "ring_version").as_deref(), Some("1"));
    let hits = keys.iter().filter(|k| client.get(k).is_some()).count();
    assert_eq!(
        hits,
        keys.len(),
        "moved keys are read through from their previous owners"
    );
    assert!(
        held_by(&[&s3], &keys)[0] > 100,
        "the new server owns its share"
    );
}

#[test]
fn pools_meet_replicas_quiet_meta_and_a_dead_server() {
    let (d1, s1, s2) = (Memcached::start(), Memcached::start(), Memcached::start());
    let text = two_pools(&[&d1], &[&s1, &s2], SESSIONS_ROUTE).replace(
        "listen = \"127.0.0.1:0\"\n[[pools.servers]]",
        "listen = \"127.0.0.1:0\"\nreplicas = 2\n[[pools.servers]]",
    );
    let proxy = Proxy::start_text(&text);
    let mut client = proxy.client();
    for i in 0..50 {
        assert_eq!(client.set(&format!("sess:{i}"), b"s"), b"STORED\r\n");
        assert_eq!(client.set(&format!("user:{i}"), b"u"), b"STORED\r\n");
    }
    // replicas = 2 in the sessions pool: both of its servers hold each key.
    let sessions: Vec<String> = (0..50).map(|i| format!("sess:{i}")).collect();
    assert_eq!(held_by(&[&s1, &s2], &sessions), [50, 50]);
    // Quiet meta gets across pools, pipelined: only the hits answer, in
    // order, then MN.
    client.send(b"mg sess:1 v q\r\nmg user:1 v q\r\nmg sess:none v q\r\nmg user:2 v q\r\nmn\r\n");
    let mut replies = Vec::new();
    loop {
        let reply = client.meta_reply();
        let last = reply == b"MN\r\n";
        replies.push(String::from_utf8_lossy(&reply).into_owned());
        if last {
            break;
        }
    }
    assert_eq!(
        replies,
        ["VA 1\r\ns\r\n", "VA 1\r\nu\r\n", "VA 1\r\nu\r\n", "MN\r\n"]
    );
    // The default pool's only server dies: its keys fail, a get across the
    // pools still answers the sessions keys (with both replicas there), and
    // the sessions pool is not affected.
    drop(d1);
    let line = "get sess:1 user:1 sess:2 user:2\r\n";
    wait_for("the dead server to be noticed", || {
        let reply = client.call(line.as_bytes(), ReplyKind::Values);
        reply == b"VALUE sess:1 0 1\r\ns\r\nVALUE sess:2 0 1\r\ns\r\nEND\r\n"
    });
    assert_eq!(client.get("sess:3").as_deref(), Some(&b"s"[..]));
    let reply = client.get_raw("user:3");
    assert!(
        reply.starts_with(b"SERVER_ERROR"),
        "{}",
        String::from_utf8_lossy(&reply)
    );
}

/// The `t` (seconds left) of `key` on `server`, asked with `mg key t`.
fn ttl_on(server: &Memcached, key: &str) -> Option<i64> {
    let mut client = server.client();
    client.send(format!("mg {key} t\r\n").as_bytes());
    let reply = String::from_utf8(client.meta_reply()).unwrap();
    reply
        .split_whitespace()
        .find_map(|token| token.strip_prefix('t'))
        .and_then(|t| t.parse().ok())
}

#[test]
fn a_gutter_pool_takes_a_dead_servers_keys_with_short_ttls_and_serves_nothing_stale() {
    let (m1, mut m2, g1) = (Memcached::start(), Memcached::start(), Memcached::start());
    let text = format!(
        "listen = \"127.0.0.1:0\"\nrequest_timeout_ms = 200\nfailover = \"gutter\"\nfailover_ttl_s = 5\n\
         [[servers]]\naddr = \"{}\"\n[[servers]]\naddr = \"{}\"\n\n\
         [[pools]]\nname = \"gutter\"\n[[pools.servers]]\naddr = \"{}\"\n",
        m1.addr(),
        m2.addr(),
        g1.addr()
    );
    let proxy = Proxy::start_text(&text);
    let mut client = proxy.client();
    let keys: Vec<String> = (0..200).map(|i| format!("k{i}")).collect();
    for key in &keys {
        assert_eq!(client.set(key, b"v1"), b"STORED\r\n");
    }
    let on_m2: Vec<String> = {
        let mut direct = m2.client();
        keys.iter()
            .filter(|k| direct.get(k).is_some())
            .cloned()
            .collect()
    };
    let on_m1: Vec<String> = keys
        .iter()
        .filter(|k| !on_m2.contains(k))
        .cloned()
        .collect();
    assert!(
        on_m2.len() > 40 && on_m1.len() > 40,
        "{} {}",
        on_m2.len(),
        on_m1.len()
    );

    // m2 hangs: after its failures it is DEAD and its keys go to the gutter.
    m2.pause();
    wait_for("m2's keys to fail over to the gutter", || {
        client.set(&on_m2[0], b"v2") == b"STORED\r\n"
    });
    for key in &on_m2 {
        assert_eq!(client.set(key, b"v2"), b"STORED\r\n");
    }
    for key in on_m2.iter().take(20) {
        let ttl = ttl_on(&g1, key).expect("the write reached the gutter");
        assert!((1..=5).contains(&ttl), "{key}: t{ttl}, failover_ttl_s = 5");
    }
    // A meta set and a touch to the gutter are capped as well.
    client.send(format!("ms {} 2 T3600\r\nv3\r\n", on_m2[1]).as_bytes());
    assert_eq!(client.meta_reply(), b"HD\r\n");
    assert!(ttl_on(&g1, &on_m2[1]).is_some_and(|t| (1..=5).contains(&t)));
    assert_eq!(
        client.call(
            format!("touch {} 0\r\n", on_m2[2]).as_bytes(),
            ReplyKind::Line
        ),
        b"TOUCHED\r\n"
    );
    assert!(ttl_on(&g1, &on_m2[2]).is_some_and(|t| (1..=5).contains(&t)));
    for key in &on_m2[3..] {
        assert_eq!(
            client.get(key).as_deref(),
            Some(&b"v2"[..]),
            "{key} from the gutter"
        );
    }
    // A get across both: m1's keys from m1, m2's from the gutter, in order.
    let line = format!("get {} {} {}\r\n", on_m1[0], on_m2[3], on_m1[1]);
    let expected = format!(
        "VALUE {} 0 2\r\nv1\r\nVALUE {} 0 2\r\nv2\r\nVALUE {} 0 2\r\nv1\r\nEND\r\n",
        on_m1[0], on_m2[3], on_m1[1]
    );
    assert_eq!(
        String::from_utf8_lossy(&client.call(line.as_bytes(), ReplyKind::Values)),
        expected
    );
    // Nothing of m1's went to the gutter.
    assert!(on_m1.iter().all(|k| ttl_on(&g1, k).is_none()));

    // m2 comes back: flushed before its keys return, so its v1 (older
    // than the acknowledged v2) is never read again.
    m2.resume();
    wait_for("m2's keys to return to it", || {
        client.get(&on_m2[3]).is_none()
    });
    for key in &on_m2 {
        let got = client.get(key);
        assert_ne!(
            got.as_deref(),
            Some(&b"v1"[..]),
            "{key}: a value older than an acknowledged write"
        );
    }
    let mut direct = m2.client();
    assert!(
        on_m2.iter().all(|k| direct.get(k).is_none()),
        "m2 was flushed"
    );
    assert_eq!(client.set(&on_m2[3], b"v4"), b"STORED\r\n");
    assert_eq!(
        direct.get(&on_m2[3]).as_deref(),
        Some(&b"v4"[..]),
        "written to m2 again"
    );

    // m2 hangs again at once: the gutter still holds its v2 of the last
    // outage for up to failover_ttl_s, older than v4. Until those copies
    // have expired, m2's keys fail rather than go to the gutter.
    m2.pause();
    wait_for("m2's keys to fail over again", || {
        client.set(&on_m2[4], b"v5") == b"STORED\r\n"
    });
    assert_ne!(
        client.get(&on_m2[3]).as_deref(),
        Some(&b"v2"[..]),
        "the gutter's copy from the last outage is older than v4"
    );
    m2.resume();
}

#[test]
fn the_near_cache_never_answers_one_pools_key_with_anothers_value() {
    let (d1, s1) = (Memcached::start(), Memcached::start());
    let text = two_pools(&[&d1], &[&s1], "").replace(
        "listen = \"127.0.0.1:0\"\n[[servers]]",
        "listen = \"127.0.0.1:0\"\nhot_key_window_ms = 500\nhot_key_cache_ms = 60000\n[[servers]]",
    );
    let proxy = Proxy::start_text(&text);
    let mut main = proxy.client();
    let mut admin = proxy.client();
    let (_, addr) = &proxy.running().pool_addrs[0];
    let mut sessions = Client::connect(&addr.to_string());
    // One key name, a value in each pool.
    assert_eq!(main.set("shared", b"default"), b"STORED\r\n");
    assert_eq!(sessions.set("shared", b"sessions"), b"STORED\r\n");
    assert_eq!(
        crate::common::get_until_near_cached(&mut main, &mut admin, "shared").as_deref(),
        Some(&b"default"[..])
    );
    // Hot, and cached for the default pool: the sessions pool's clients
    // still read their own pool's value.
    for _ in 0..50 {
        assert_eq!(sessions.get("shared").as_deref(), Some(&b"sessions"[..]));
    }
    assert_eq!(
        crate::common::get_until_near_cached(&mut sessions, &mut admin, "shared").as_deref(),
        Some(&b"sessions"[..])
    );
    assert_eq!(main.get("shared").as_deref(), Some(&b"default"[..]));
}

#[test]
fn a_pool_with_a_listener_removed_by_a_reload_serves_its_clients_until_a_restart() {
    let (d1, s1) = (Memcached::start(), Memcached::start());
    let dir = TempDir::new("pools", "listener-removed");
    let path = dir.path("memring.toml");
    std::fs::write(&path, two_pools(&[&d1], &[&s1], SESSIONS_ROUTE)).unwrap();
    let proxy = Proxy::start_file(&path);
    let (_, addr) = &proxy.running().pool_addrs[0];
    let mut bound = Client::connect(&addr.to_string());
    assert_eq!(bound.set("user:1", b"a"), b"STORED\r\n");
    let only_default = format!(
        "listen = \"127.0.0.1:0\"\n[[servers]]\naddr = \"{}\"\n",
        d1.addr()
    );
    crate::common::replace_by_rename(&path, &only_default);
    let mut main = proxy.client();
    // The route is gone: sess: keys go to the default pool now.
    wait_for("the route to go", || {
        main.set("sess:probe", b"p") == b"STORED\r\n"
            && held_by(&[&d1], &["sess:probe".into()]) == [1]
    });
    // The listener still serves its pool, old and new connections alike.
    assert_eq!(bound.get("user:1").as_deref(), Some(&b"a"[..]));
    let mut again = Client::connect(&addr.to_string());
    assert_eq!(again.set("user:2", b"b"), b"STORED\r\n");
    assert_eq!(held_by(&[&s1], &["user:2".into()]), [1]);
    assert_eq!(held_by(&[&d1], &["user:2".into()]), [0]);
    // A pool that is still served is still reported.
    let metrics = proxy.running().stats.prometheus_text();
    assert!(
        metrics.contains("memring_ring_version{pool=\"sessions\"} 1"),
        "{metrics}"
    );
}

#[test]
fn flush_all_on_the_main_listener_flushes_every_routed_pool_and_its_gutter() {
    let (d1, s1, s2, g1) = (
        Memcached::start(),
        Memcached::start(),
        Memcached::start(),
        Memcached::start(),
    );
    // The sessions pool fails over to a gutter pool.
    let text = two_pools(&[&d1], &[&s1, &s2], SESSIONS_ROUTE).replacen(
        "name = \"sessions\"\n",
        "name = \"sessions\"\nfailover = \"gutter\"\n",
        1,
    ) + &format!(
        "\n[[pools]]\nname = \"gutter\"\n[[pools.servers]]\naddr = \"{}\"\n",
        g1.addr()
    );
    let proxy = Proxy::start_text(&text);
    let mut client = proxy.client();
    let sessions: Vec<String> = (0..200).map(|i| format!("sess:{i}")).collect();
    let others: Vec<String> = (0..50).map(|i| format!("user:{i}")).collect();
    for key in sessions.iter().chain(&others) {
        assert_eq!(client.set(key, b"v"), b"STORED\r\n");
    }
    // The gutter holds a value as a failed-over write would leave it.
    assert_eq!(g1.client().set("sess:gutter", b"g"), b"STORED\r\n");
    assert_eq!(held_by(&[&s1, &s2], &sessions).iter().sum::<usize>(), 200);

    assert_eq!(client.call(b"flush_all\r\n", ReplyKind::Line), b"OK\r\n");
    for key in sessions.iter().chain(&others) {
        assert_eq!(client.get(key), None, "{key} after flush_all");
    }
    assert_eq!(
        held_by(&[&s1, &s2], &sessions),
        [0, 0],
        "routed pool flushed"
    );
    assert_eq!(held_by(&[&d1], &others), [0], "default pool flushed");
    assert_eq!(
        g1.client().get("sess:gutter"),
        None,
        "the gutter is flushed too"
    );

    // A pool's own listener flushes its pool (and gutter) only.
    for key in sessions.iter().chain(&others) {
        assert_eq!(client.set(key, b"v"), b"STORED\r\n");
    }
    let (_, addr) = &proxy.running().pool_addrs[0];
    let mut bound = Client::connect(&addr.to_string());
    assert_eq!(bound.call(b"flush_all\r\n", ReplyKind::Line), b"OK\r\n");
    assert_eq!(held_by(&[&s1, &s2], &sessions), [0, 0]);
    assert_eq!(held_by(&[&d1], &others), [50], "not the default pool");
    // noreply: nothing comes back, and the next reply is the next request's.
    client.send(b"flush_all noreply\r\n");
    assert_eq!(client.set("after", b"1"), b"STORED\r\n");
    assert_eq!(held_by(&[&d1], &others), [0]);
}

#[test]
fn flush_all_refused_in_one_pool_answers_the_servers_words_for_every_pool() {
    // The default pool's second server refuses (`-F`); its first server and
    // the routed pool flush. The refusal comes from the first pool of the
    // joined flush, so it must be carried to the last one, which answers for
    // all: memcached's words, no server named.
    let (d1, s1) = (Memcached::start(), Memcached::start());
    let refusing = Memcached::start_with(&["-F"]);
    let expected = refusing.client().call(b"flush_all\r\n", ReplyKind::Line);
    assert_eq!(expected, b"CLIENT_ERROR flush_all not allowed\r\n");
    let proxy = Proxy::start_text(&two_pools(&[&d1, &refusing], &[&s1], SESSIONS_ROUTE));
    let mut client = proxy.client();
    let sessions: Vec<String> = (0..50).map(|i| format!("sess:{i}")).collect();
    for key in &sessions {
        assert_eq!(client.set(key, b"v"), b"STORED\r\n");
    }
    assert_eq!(client.call(b"flush_all\r\n", ReplyKind::Line), expected);
    // The servers that could flush did: the refusal is one server's word.
    assert_eq!(held_by(&[&s1], &sessions), [0], "routed pool flushed");
    // The connection stays in step after a quiet refusal.
    client.send(b"flush_all noreply\r\n");
    assert_eq!(client.set("after", b"1"), b"STORED\r\n");
}

/// Writes `text` over `path` in one rename, as an editor or a deploy does.
fn rewrite(path: &std::path::Path, text: &str) {
    let temporary = path.with_extension("tmp");
    std::fs::write(&temporary, text).unwrap();
    std::fs::rename(&temporary, path).unwrap();
}

#[test]
fn keys_that_change_pool_and_come_back_never_read_an_overwritten_value() {
    let (d1, c1) = (Memcached::start(), Memcached::start());
    let dir = TempDir::new("pools", "moves");
    let path = dir.path("memring.toml");
    let text = |top: &str, routes: &str| {
        format!(
            "listen = \"127.0.0.1:0\"\n{top}\n[[servers]]\naddr = \"{}\"\n\n\
             [[pools]]\nname = \"carts\"\n[[pools.servers]]\naddr = \"{}\"\n\n{routes}",
            d1.addr(),
            c1.addr()
        )
    };
    let route = "[[routes]]\nprefix = \"cart:\"\npool = \"carts\"\n";
    std::fs::write(&path, text("", "")).unwrap();
    let proxy = Proxy::start_file(&path);
    let stats = proxy.running().stats.clone();
    let reload = |text: String| {
        let applied = stats.reload_count(true);
        rewrite(&path, &text);
        wait_for("the reload", || stats.reload_count(true) > applied);
    };
    let mut client = proxy.client();
    let carts = keys_with("cart:", 300);
    let others = keys_with("user:", 300);
    for key in carts.iter().chain(&others) {
        assert_eq!(client.set(key, b"v1"), b"STORED\r\n");
    }
    let older = |client: &mut Client, keys: &[String]| {
        keys.iter()
            .filter(|k| client.get(k).as_deref() == Some(&b"v1"[..]))
            .count()
    };

    // A route added, v2 written to its pool, the route removed.
    reload(text("", route));
    for key in &carts {
        assert_eq!(client.set(key, b"v2"), b"STORED\r\n");
    }
    assert_eq!(held_by(&[&c1], &carts), [300]);
    reload(text("", ""));
    assert_eq!(
        older(&mut client, &carts),
        0,
        "cart: keys back in the default pool"
    );

    // The default pool switched to carts and back.
    reload(text("default_pool = \"carts\"", ""));
    for key in &others {
        assert_eq!(client.set(key, b"v2"), b"STORED\r\n");
    }
    reload(text("", ""));
    assert_eq!(
        older(&mut client, &others),
        0,
        "user: keys back in the default pool"
    );

    // And the route added again: carts held the cart: keys' v2 from
    // before, older than the v3 written since.
    for key in &carts {
        assert_eq!(client.set(key, b"v3"), b"STORED\r\n");
    }
    reload(text("", route));
    let v2 = carts
        .iter()
        .filter(|k| client.get(k).as_deref() == Some(&b"v2"[..]))
        .count();
    assert_eq!(v2, 0, "cart: keys back in pool carts");
}

fn keys_with(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

/// The keys a reload moves into a pool are deleted from it, and only them:
/// the keys that stay in their pool keep their values when a route is
/// removed or added, and when `default_pool` switches and back (a flush of
/// the pool that takes keys would empty it).
#[test]
fn keys_that_stay_in_their_pool_keep_their_values_when_keys_move_in() {
    let (d1, c1) = (Memcached::start(), Memcached::start());
    let dir = TempDir::new("pools", "stay");
    let path = dir.path("memring.toml");
    // `sess:` stays in the default pool and `bag:` in carts throughout.
    let text = |top: &str, cart: bool| {
        let cart = if cart {
            "[[routes]]\nprefix = \"cart:\"\npool = \"carts\"\n"
        } else {
            ""
        };
        format!(
            "listen = \"127.0.0.1:0\"\n{top}\n[[servers]]\naddr = \"{}\"\n\n\
             [[pools]]\nname = \"carts\"\n[[pools.servers]]\naddr = \"{}\"\n\n\
             [[routes]]\nprefix = \"sess:\"\npool = \"default\"\n\
             [[routes]]\nprefix = \"bag:\"\npool = \"carts\"\n{cart}",
            d1.addr(),
            c1.addr()
        )
    };
    std::fs::write(&path, text("", true)).unwrap();
    let proxy = Proxy::start_file(&path);
    let stats = proxy.running().stats.clone();
    let reload = |text: String| {
        let applied = stats.reload_count(true);
        rewrite(&path, &text);
        wait_for("the reload", || stats.reload_count(true) > applied);
    };
    let mut client = proxy.client();
    let (sessions, bags) = (keys_with("sess:", 300), keys_with("bag:", 300));
    let (carts, users) = (keys_with("cart:", 300), keys_with("user:", 300));
    for key in sessions.iter().chain(&bags).chain(&carts).chain(&users) {
        assert_eq!(client.set(key, b"v1"), b"STORED\r\n");
    }
    assert_eq!(held_by(&[&d1, &c1], &sessions), [300, 0]);
    assert_eq!(held_by(&[&d1, &c1], &bags), [0, 300]);
    let hits = |client: &mut Client, keys: &[String]| {
        keys.iter()
            .filter(|k| client.get(k).as_deref() == Some(&b"v1"[..]))
            .count()
    };

    // The `cart:` route removed: its keys go back to the default pool,
    // whose own keys stay.
    reload(text("", false));
    assert_eq!(hits(&mut client, &sessions), 300, "sess: after the removal");
    assert_eq!(hits(&mut client, &users), 300, "user: after the removal");
    assert_eq!(hits(&mut client, &bags), 300, "bag: after the removal");
    // Written in the default pool now, so that carts's copies are older.
    for key in &carts {
        assert_eq!(client.set(key, b"v2"), b"STORED\r\n");
    }

    // Added again: carts keeps its `bag:` keys and loses only the moved
    // `cart:` keys, whose values there are older than the v2 written since.
    reload(text("", true));
    assert_eq!(hits(&mut client, &bags), 300, "bag: after the addition");
    assert_eq!(
        held_by(&[&c1], &carts),
        [0],
        "moved keys deleted from carts"
    );
    assert_eq!(
        hits(&mut client, &sessions),
        300,
        "sess: after the addition"
    );

    // default_pool switched to carts and back: the keys that stay keep
    // their values both times.
    reload(text("default_pool = \"carts\"", true));
    assert_eq!(hits(&mut client, &bags), 300, "bag: after the switch");
    assert_eq!(hits(&mut client, &sessions), 300, "sess: after the switch");
    assert_eq!(
        held_by(&[&c1], &users),
        [0],
        "moved keys deleted from carts"
    );
    reload(text("", true));
    assert_eq!(
        hits(&mut client, &sessions),
        300,
        "sess: after the switch back"
    );
    assert_eq!(hits(&mut client, &bags), 300, "bag: after the switch back");
}

/// A pool that is to take keys from another but whose server does not list
/// its keys (started without the LRU crawler, as memcached before 1.4.31
/// has none) refuses the reload: the routes in force stay, and nothing is
/// flushed.
#[test]
fn keys_cannot_move_into_a_pool_whose_server_does_not_list_its_keys() {
    let d1 = Memcached::start_with(&["-o", "no_lru_crawler"]);
    let c1 = Memcached::start();
    let dir = TempDir::new("pools", "unlisted");
    let path = dir.path("memring.toml");
    let text = |routes: &str| {
        format!(
            "listen = \"127.0.0.1:0\"\n[[servers]]\naddr = \"{}\"\n\n\
             [[pools]]\nname = \"carts\"\n[[pools.servers]]\naddr = \"{}\"\n\n{routes}",
            d1.addr(),
            c1.addr()
        )
    };
    let route = "[[routes]]\nprefix = \"cart:\"\npool = \"carts\"\n";
    std::fs::write(&path, text(route)).unwrap();
    let proxy = Proxy::start_file(&path);
    let stats = proxy.running().stats.clone();
    let mut client = proxy.client();
    let (carts, users) = (keys_with("cart:", 50), keys_with("user:", 50));
    for key in carts.iter().chain(&users) {
        assert_eq!(client.set(key, b"v1"), b"STORED\r\n");
    }
    let refused = stats.reload_count(false);
    rewrite(&path, &text(""));
    wait_for("the reload to be refused", || {
        stats.reload_count(false) > refused
    });
    assert_eq!(stats.reload_count(true), 0);
    // The route still holds, and the default pool was not flushed.
    assert_eq!(held_by(&[&d1, &c1], &users), [50, 0]);
    assert_eq!(client.set(&carts[0], b"v2"), b"STORED\r\n");
    assert_eq!(c1.client().get(&carts[0]).as_deref(), Some(&b"v2"[..]));
    assert_eq!(held_by(&[&d1], &carts), [0]);
}

/// The model test of pool switches: one writer runs a random sequence of
/// set, delete, append and incr through memring while the layout goes round
/// routes added and removed, `default_pool` switched, a shadow attached with
/// every write and then switched to serve (and back), in a random order.
/// Readers check every read against the model of one memcached: a value may
/// be missing (a miss is always allowed) but never older than a write
/// already acknowledged.
#[test]
fn random_writes_and_pool_switches_never_read_older_than_an_acknowledged_write() {
    const KEYS: usize = 40;
    const STEPS: usize = 900;
    let servers: Vec<Memcached> = (0..3).map(|_| Memcached::start()).collect();
    let dir = TempDir::new("pools", "switch-model");
    let path = dir.path("memring.toml");
    // The default pool over servers 0 and 1; pool `next` over server 2.
    let layout = |state: usize| {
        let (top, default_shadow, next_shadow, routes) = match state {
            // Default serves alone.
            0 => ("", "", "", ""),
            // `next` grades as default's shadow with every write.
            1 => ("", "[shadow]\npool = \"next\"\nfraction = 1.0\n", "", ""),
            // Switched: next serves, default is its shadow.
            2 => (
                "default_pool = \"next\"\n",
                "",
                "[pools.shadow]\npool = \"default\"\nfraction = 1.0\n",
                "",
            ),
            // next serves cart: keys only.
            3 => (
                "",
                "",
                "",
                "[[routes]]\nprefix = \"cart:\"\npool = \"next\"\n",
            ),
            // next serves every key, with no shadow.
            _ => ("default_pool = \"next\"\n", "", "", ""),
        };
        format!(
            "listen = \"127.0.0.1:0\"\n{top}{default_shadow}\
             [[servers]]\naddr = \"{}\"\n[[servers]]\naddr = \"{}\"\n\n\
             [[pools]]\nname = \"next\"\n{next_shadow}[[pools.servers]]\naddr = \"{}\"\n\n{routes}",
            servers[0].addr(),
            servers[1].addr(),
            servers[2].addr()
        )
    };
    std::fs::write(&path, layout(0)).unwrap();
    let proxy = Proxy::start_file(&path);
    let stats = proxy.running().stats.clone();
    let key = |k: usize| {
        if k % 2 == 0 {
            format!("cart:{k}")
        } else {
            format!("user:{k}")
        }
    };
    // Values are `<version>` or, after appends, `<version>.<version>…`; a
    // key's versions only grow. `floor[k]`: the version of k's last
    // acknowledged write (a delete too).
    let floor: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let version_of = |value: &[u8]| -> u64 {
        let text = String::from_utf8_lossy(value);
        let last = text.rsplit('.').next().unwrap_or("").trim().to_string();
        last.parse().unwrap_or_else(|_| panic!("value {text}"))
    };
    let readers: Vec<_> = (0..2)
        .map(|r| {
            let (floor, stop, addr) = (floor.clone(), stop.clone(), proxy.addr);
            std::thread::spawn(move || -> Vec<String> {
                let mut client = Client::connect(&addr.to_string());
                let mut stale = Vec::new();
                let mut k = r;
                while !stop.load(Ordering::Relaxed) {
                    k = (k * 7 + 3) % KEYS;
                    let name = key(k);
                    let before = floor[k].load(Ordering::SeqCst);
                    if let Some(value) = client.get(&name) {
                        let read = version_of(&value);
                        if read < before {
                            stale.push(format!("reader {r}: {name} read v{read} after v{before}"));
                        }
                    }
                }
                stale
            })
        })
        .collect();
    let mut writer = proxy.client();
    let mut rng: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let (mut state, mut version, mut switches) = (0usize, 0u64, 0u32);
    for step in 0..STEPS {
        if step % 60 == 59 {
            let to = loop {
                let to = (next() % 5) as usize;
                if to != state {
                    break to;
                }
            };
            let applied = stats.reload_count(true);
            rewrite(&path, &layout(to));
            wait_for("the switch", || stats.reload_count(true) > applied);
            state = to;
            switches += 1;
        }
        let k = (next() % KEYS as u64) as usize;
        let name = key(k);
        // Versions ending in 9 mark deletes: no read may return one.
        version += 10;
        let request = match next() % 6 {
            0 => format!("delete {name}\r\n"),
            1 => format!(
                "append {name} 0 0 {}\r\n.{version}\r\n",
                format!(".{version}").len()
            ),
            // By 10: the count stays above the key's last version (a value
            // with appends is not a number: memcached refuses it).
            2 => format!("incr {name} 10\r\n"),
            _ => {
                let value = version.to_string();
                format!("set {name} 0 0 {}\r\n{value}\r\n", value.len())
            }
        };
        let reply = writer.call(request.as_bytes(), ReplyKind::Line);
        let acknowledged = match &reply[..] {
            b"STORED\r\n" => Some(version),
            b"DELETED\r\n" => Some(version - 1),
            number if number.first().is_some_and(u8::is_ascii_digit) => {
                let count: u64 = String::from_utf8_lossy(number).trim().parse().unwrap();
                version = version.max(count);
                Some(count)
            }
            b"NOT_FOUND\r\n" | b"NOT_STORED\r\n" => None,
            b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n" => None,
            other => panic!("{request:?} answered {}", String::from_utf8_lossy(other)),
        };
        if let Some(acknowledged) = acknowledged {
            floor[k].fetch_max(acknowledged, Ordering::SeqCst);
        }
        // The writer reads its own keys too: never below its last write.
        let before = floor[k].load(Ordering::SeqCst);
        if let Some(value) = writer.get(&name) {
            let read = version_of(&value);
            assert!(
                read >= before,
                "writer: {name} read v{read} after v{before} (state {state})"
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    let stale: Vec<String> = readers
        .into_iter()
        .flat_map(|r| r.join().unwrap())
        .collect();
    assert!(switches >= 10, "{switches} switches");
    assert!(stale.is_empty(), "{} stale reads: {stale:?}", stale.len());
}
