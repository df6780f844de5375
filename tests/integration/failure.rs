//! A stopped, hung or restarted server affects only its own keys, fails them
//! within the configured timeouts, and recovers by itself.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::common::{show, wait_for, Memcached, Proxy};
use memring::ring::Ring;

const SETTINGS: &str = "connect_timeout_ms = 200\nrequest_timeout_ms = 400\n";

/// Keys `key:0..n` grouped by the index of the server that owns them.
pub(crate) fn keys_by_owner(proxy: &Proxy, n: usize) -> Vec<Vec<String>> {
    let ring = Ring::build(proxy.config.members());
    let mut owned = vec![Vec::new(); proxy.config.servers.len()];
    for i in 0..n {
        let key = format!("key:{i}");
        owned[ring.owner(key.as_bytes()).expect("ring has servers")].push(key);
    }
    owned
}

fn start_pool() -> (Vec<Memcached>, Proxy) {
    let pool: Vec<Memcached> = (0..3).map(|_| Memcached::start()).collect();
    let proxy = Proxy::start(&pool.iter().collect::<Vec<_>>(), SETTINGS);
    (pool, proxy)
}

#[test]
fn stopped_server_fails_only_its_keys_at_once_then_recovers() {
    let (mut pool, proxy) = start_pool();
    let owned = keys_by_owner(&proxy, 90);
    let mut client = proxy.client();
    for keys in &owned {
        assert!(!keys.is_empty(), "every server owns some keys");
        for key in keys {
            assert_eq!(client.set(key, key.as_bytes()), b"STORED\r\n");
        }
    }

    pool[1].kill();
    let dead = proxy.running().topology.load().backends[1].clone();
    let timeouts = [memring::error::BackendErrorKind::Timeout.index()];
    for key in &owned[1] {
        let reply = client.get_raw(key);
        assert!(
            reply.starts_with(b"SERVER_ERROR backend "),
            "{key}: {}",
            show(&reply)
        );
    }
    // Connection refused fails at once, never by waiting for the request
    // timeout: every failure is a refused connect, a closed socket or DEAD.
    assert!(dead.metrics().error_count() >= owned[1].len() as u64);
    assert_eq!(
        dead.metrics().errors_of(&timeouts),
        0,
        "a refused server's requests timed out"
    );
    for (server, keys) in owned.iter().enumerate().filter(|(i, _)| *i != 1) {
        for key in keys {
            assert_eq!(
                client.get(key),
                Some(key.clone().into_bytes()),
                "server {server}"
            );
        }
    }
    // A multi-get spanning the dead server answers what the others hold.
    let multi = format!("get {} {} {}\r\n", owned[0][0], owned[1][0], owned[2][0]);
    let reply = client.call(multi.as_bytes(), memring::protocol::ReplyKind::Values);
    let expected = format!(
        "VALUE {a} 0 {la}\r\n{a}\r\nVALUE {c} 0 {lc}\r\n{c}\r\nEND\r\n",
        a = owned[0][0],
        la = owned[0][0].len(),
        c = owned[2][0],
        lc = owned[2][0].len()
    );
    assert_eq!(show(&reply), show(expected.as_bytes()));

    pool[1].restart();
    let probe = owned[1][0].clone();
    wait_for("the restarted server to serve its keys again", || {
        client.get_raw(&probe) == b"END\r\n"
    });
    assert_eq!(client.set(&probe, b"back"), b"STORED\r\n");
    assert_eq!(
        pool[1].client().get(&probe),
        Some(b"back".to_vec()),
        "the key is stored on its owner again"
    );
}

#[test]
fn hung_server_fails_within_the_timeout_and_others_are_untouched() {
    let (mut pool, proxy) = start_pool();
    let owned = keys_by_owner(&proxy, 60);
    let mut client = proxy.client();
    for keys in &owned {
        for key in keys {
            assert_eq!(client.set(key, b"v"), b"STORED\r\n");
        }
    }

    pool[2].pause();
    let hung_key = &owned[2][0];
    let reply = client.get_raw(hung_key);
    // It failed because the server made no progress for the timeout: not
    // before (no other kind of error), and not never (the client's read has
    // its own deadline).
    assert!(
        reply.starts_with(b"SERVER_ERROR backend ") && reply.ends_with(b"request timed out\r\n"),
        "{}",
        show(&reply)
    );

    // Other servers answer while one is hung, from another client too, and
    // none of their requests fails or times out.
    let topology = proxy.running().topology.load_full();
    let mut other = proxy.client();
    for keys in owned.iter().take(2) {
        for key in keys {
            assert_eq!(other.get(key), Some(b"v".to_vec()));
        }
    }
    for healthy in &topology.backends[..2] {
        assert_eq!(healthy.metrics().error_count(), 0, "{}", healthy.name());
    }

    pool[2].resume();
    let stored = format!("VALUE {hung_key} 0 1\r\nv\r\nEND\r\n").into_bytes();
    wait_for("the resumed server to answer", || {
        client.get_raw(hung_key) == stored
    });
}

#[test]
fn backend_killed_mid_run_under_load_fails_only_its_keys() {
    let (mut pool, proxy) = start_pool();
    let owned = Arc::new(keys_by_owner(&proxy, 60));
    let stop = Arc::new(AtomicBool::new(false));
    let wrong = Arc::new(AtomicUsize::new(0));
    let served = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (owned, stop, wrong, served) =
                (owned.clone(), stop.clone(), wrong.clone(), served.clone());
            let mut client = proxy.client();
            std::thread::spawn(move || {
                let mut round = 0u64;
                while !stop.load(Ordering::Relaxed) && round < 100_000 {
                    round += 1;
                    for (server, keys) in owned.iter().enumerate() {
                        // Each worker writes only its own keys, so values never race.
                        let mine: Vec<&String> = keys.iter().skip(w).step_by(4).collect();
                        let key = mine[round as usize % mine.len()];
                        let value = format!("{w}-{round}");
                        let stored = client.set(key, value.as_bytes());
                        let got = client.get_raw(key);
                        if server == 0 {
                            // The victim: any reply is fine as long as it is a
                            // whole memcached reply (framing is checked by the
                            // client) and not someone else's value.
                            if got.starts_with(b"VALUE")
                                && !got.windows(value.len()).any(|x| x == value.as_bytes())
                                && stored == b"STORED\r\n"
                            {
                                wrong.fetch_add(1, Ordering::Relaxed);
                            }
                        } else if stored != b"STORED\r\n"
                            || !got.windows(value.len()).any(|x| x == value.as_bytes())
                        {
                            wrong.fetch_add(1, Ordering::Relaxed);
                        }
                        served.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    wait_for("load to run", || served.load(Ordering::Relaxed) > 500);
    pool[0].kill();
    let at_kill = served.load(Ordering::Relaxed);
    wait_for("load to continue after the kill", || {
        served.load(Ordering::Relaxed) > at_kill + 1500
    });
    pool[0].restart();
    let at_restart = served.load(Ordering::Relaxed);
    wait_for("load to continue after the restart", || {
        served.load(Ordering::Relaxed) > at_restart + 1500
    });
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.join().expect("worker panicked");
    }
    assert_eq!(
        wrong.load(Ordering::Relaxed),
        0,
        "healthy servers' keys failed or replies mixed up"
    );
    let mut client = proxy.client();
    let key = &owned[0][0];
    wait_for("the restarted server to take writes", || {
        client.set(key, b"x") == b"STORED\r\n"
    });
}
