//! Warming servers (`warming = true`), against real memcached: a warming
//! server is written every key it will own beside the key's owner, is never
//! read, and joins (`warming = false`, a reload) without a flush, holding
//! those keys: they hit on it at once, and no read finds a value older than
//! an acknowledged write.

use std::path::Path;

use crate::common::{replace_by_rename, wait_for, Client, Memcached, Proxy, TempDir};
use memring::config::Config;
use memring::protocol::ReplyKind;
use memring::ring::Ring;

fn name_of(server: &Memcached) -> String {
    format!("cache-{}", server.port)
}

/// A config over `on_ring` and the `warming` servers, each named
/// `cache-<port>`, with `settings` at the top.
fn config(on_ring: &[&Memcached], warming: &[&Memcached], settings: &str) -> String {
    let mut text = format!("listen = \"127.0.0.1:0\"\nrequest_timeout_ms = 2000\n{settings}\n");
    for (server, warm) in on_ring
        .iter()
        .map(|s| (s, false))
        .chain(warming.iter().map(|s| (s, true)))
    {
        text.push_str(&format!(
            "[[servers]]\naddr = \"{}\"\nname = \"{}\"\n",
            server.addr(),
            name_of(server)
        ));
        if warm {
            text.push_str("warming = true\n");
        }
    }
    text
}

/// The ring of `text` once every server in it has joined.
fn ring_of(text: &str) -> Ring {
    Config::parse(text, "warming.toml").unwrap().build_ring()
}

/// The names of `key`'s `count` replicas on `ring`, owner first.
fn replicas_of(ring: &Ring, key: &str, count: usize) -> Vec<String> {
    let mut out = smallvec::SmallVec::new();
    ring.replicas(key.as_bytes(), count, &mut out);
    out.iter()
        .map(|&m| ring.members()[m].identity.clone())
        .collect()
}

fn stat(server: &Memcached, name: &str) -> u64 {
    server.client().stat(name)
}

/// How many of `keys` `server` holds, asked directly.
fn held_by(server: &Memcached, keys: &[String]) -> usize {
    let mut client = server.client();
    keys.iter().filter(|k| client.get(k).is_some()).count()
}

fn store(client: &mut Client, keys: &[String], value: &str) {
    for key in keys {
        assert_eq!(client.set(key, value.as_bytes()), b"STORED\r\n", "{key}");
    }
}

fn reload(proxy: &Proxy, path: &Path, text: &str) {
    let version = proxy.ring_version();
    replace_by_rename(path, text);
    wait_for("the reload", || proxy.ring_version() > version);
}

#[test]
fn a_warming_server_is_written_the_keys_it_will_own_and_never_read() {
    let dir = TempDir::new("warming", "written");
    let servers: Vec<Memcached> = (0..3).map(|_| Memcached::start()).collect();
    let (a, b, w) = (&servers[0], &servers[1], &servers[2]);
    let path = dir.path("memring.toml");
    std::fs::write(&path, config(&[a, b], &[w], "handoff_ms = 60000")).unwrap();
    let proxy = Proxy::start_file(&path);
    let mut client = proxy.client();
    let keys: Vec<String> = (0..1000).map(|i| format!("warm:{i}")).collect();
    store(&mut client, &keys, "v1");
    for key in &keys {
        assert_eq!(client.get(key), Some(b"v1".to_vec()), "{key}");
    }
    // No read went to it.
    assert_eq!(stat(w, "cmd_get"), 0, "a warming server serves no reads");
    let membership = |server: &Memcached| {
        let name = format!("server:{}:membership", name_of(server));
        let stats = proxy.client().stats("");
        stats.into_iter().find(|(k, _)| *k == name).map(|(_, v)| v)
    };
    assert_eq!(membership(w).as_deref(), Some("WARMING"));
    assert_eq!(membership(a).as_deref(), Some("ACTIVE"));

    let joined = config(&[a, b, w], &[], "handoff_ms = 60000");
    let after = ring_of(&joined);
    let before = ring_of(&config(&[a, b], &[], ""));
    let (theirs, others): (Vec<String>, Vec<String>) = keys
        .iter()
        .cloned()
        .partition(|k| replicas_of(&after, k, 1)[0] == name_of(w));
    assert!(
        theirs.len() > 150,
        "{} keys for the third server",
        theirs.len()
    );
    assert_eq!(
        held_by(w, &theirs),
        theirs.len(),
        "its keys were written to it"
    );
    assert_eq!(held_by(w, &others), 0, "and no other key");
    // The servers on the ring hold their own keys and nothing else.
    for server in [a, b] {
        let (own, not_own): (Vec<String>, Vec<String>) = keys
            .iter()
            .cloned()
            .partition(|k| replicas_of(&before, k, 1)[0] == name_of(server));
        assert_eq!(held_by(server, &own), own.len());
        assert_eq!(held_by(server, &not_own), 0);
    }

    // It joins: a window opens, it is not flushed, its keys hit on it.
    reload(&proxy, &path, &joined);
    assert!(
        proxy.running().topology.load().previous.is_some(),
        "a hand-off window"
    );
    assert_eq!(membership(w).as_deref(), Some("JOINING"));
    let asked = |s: &Memcached| stat(s, "cmd_get");
    let (a_before, b_before, w_before) = (asked(a), asked(b), stat(w, "get_hits"));
    for key in &theirs {
        assert_eq!(client.get(key), Some(b"v1".to_vec()), "{key}");
    }
    assert_eq!(
        (asked(a), asked(b)),
        (a_before, b_before),
        "no read-through: every key it owns hit on it"
    );
    assert_eq!(stat(w, "get_hits") - w_before, theirs.len() as u64);
    assert_eq!(stat(w, "cmd_flush"), 0, "no flush_all reached it");
}

/// What each key of the staleness test is written while the server warms,
/// and what a read must then find.
fn written(i: usize) -> (&'static str, Option<&'static [u8]>) {
    match i % 8 {
        0 => ("set", Some(b"10")),
        1 => ("overwrite", Some(b"v2")),
        2 => ("delete", None),
        3 => ("incr", Some(b"15")),
        4 => ("append", Some(b"10+a")),
        5 => ("ms", Some(b"v3")),
        6 => ("md", None),
        _ => ("ma", Some(b"11")),
    }
}

/// Changes each of `keys` (stored as `10`) as [`written`] says.
fn change_each(client: &mut Client, keys: &[String]) {
    for (i, key) in keys.iter().enumerate() {
        let (request, reply): (String, &[u8]) = match written(i).0 {
            "set" => continue,
            "overwrite" => (format!("set {key} 0 0 2\r\nv2\r\n"), b"STORED\r\n"),
            "delete" => (format!("delete {key}\r\n"), b"DELETED\r\n"),
            "incr" => (format!("incr {key} 5\r\n"), b"15\r\n"),
            "append" => (format!("append {key} 0 0 2\r\n+a\r\n"), b"STORED\r\n"),
            "ms" => (format!("ms {key} 2 T0\r\nv3\r\n"), b"HD\r\n"),
            "md" => (format!("md {key}\r\n"), b"HD\r\n"),
            _ => (format!("ma {key}\r\n"), b"HD\r\n"),
        };
        client.send(request.as_bytes());
        assert_eq!(client.meta_reply(), reply, "{request}");
    }
}

#[test]
fn after_warming_no_read_finds_a_value_older_than_an_acknowledged_write() {
    let dir = TempDir::new("warming", "stale");
    let servers: Vec<Memcached> = (0..3).map(|_| Memcached::start()).collect();
    let (a, b, w) = (&servers[0], &servers[1], &servers[2]);
    let path = dir.path("memring.toml");
    let settings = "handoff_ms = 60000";
    std::fs::write(&path, config(&[a, b], &[], settings)).unwrap();
    let proxy = Proxy::start_file(&path);
    let mut client = proxy.client();
    // Written before it warms: read through from their owners once it joins.
    let early: Vec<String> = (0..400).map(|i| format!("early:{i}")).collect();
    store(&mut client, &early, "10");
    reload(&proxy, &path, &config(&[a, b], &[w], settings));
    let flushes = stat(w, "cmd_flush");
    // The warming server lacks these keys: an `add` the owner refuses must
    // not store there, and an `ma` that creates a missing key (`N`) must
    // not create it there at 0, or it would serve that over the count.
    for (i, key) in early.iter().enumerate() {
        let (request, reply): (String, &[u8]) = if i % 2 == 0 {
            (format!("add {key} 0 0 7\r\nrefused\r\n"), b"NOT_STORED\r\n")
        } else {
            (format!("ma {key} N0\r\n"), b"HD\r\n")
        };
        client.send(request.as_bytes());
        assert_eq!(client.meta_reply(), reply, "{request}");
    }

    let keys: Vec<String> = (0..1600).map(|i| format!("stale:{i}")).collect();
    store(&mut client, &keys, "10");
    change_each(&mut client, &keys);
    // Reads while it warms never reach it.
    for (i, key) in keys.iter().enumerate() {
        assert_eq!(client.get(key).as_deref(), written(i).1, "{key}");
    }
    assert_eq!(stat(w, "cmd_get"), 0);

    let joined = config(&[a, b, w], &[], settings);
    let after = ring_of(&joined);
    let theirs = |keys: &[String]| -> Vec<(usize, String)> {
        keys.iter()
            .cloned()
            .enumerate()
            .filter(|(_, k)| replicas_of(&after, k, 1)[0] == name_of(w))
            .collect()
    };
    reload(&proxy, &path, &joined);
    // Stored whole (set, overwritten, ms): a hit on it, nothing read through.
    let asked = |s: &Memcached| stat(s, "cmd_get");
    let (a_before, b_before) = (asked(a), asked(b));
    let stored: Vec<(usize, String)> = theirs(&keys)
        .into_iter()
        .filter(|(i, _)| matches!(written(*i).0, "set" | "overwrite" | "ms"))
        .collect();
    assert!(stored.len() > 100, "{}", stored.len());
    for (i, key) in &stored {
        assert_eq!(client.get(key).as_deref(), written(*i).1, "{key}");
    }
    assert_eq!(
        (asked(a), asked(b)),
        (a_before, b_before),
        "no read-through"
    );
    // Every key reads its last acknowledged value, or a miss if deleted:
    // none is older (the others were deleted on it, and read through).
    for (i, key) in keys.iter().enumerate() {
        assert_eq!(
            client.get(key).as_deref(),
            written(i).1,
            "{key} ({})",
            written(i).0
        );
    }
    for (i, key) in early.iter().enumerate() {
        let expected: &[u8] = if i % 2 == 0 { b"10" } else { b"11" };
        assert_eq!(client.get(key).as_deref(), Some(expected), "{key}");
    }
    assert_eq!(stat(w, "cmd_flush"), flushes, "joining flushed nothing");
}

#[test]
fn with_replicas_every_warming_replica_gets_the_writes() {
    let dir = TempDir::new("warming", "replicas");
    let servers: Vec<Memcached> = (0..4).map(|_| Memcached::start()).collect();
    let all: Vec<&Memcached> = servers.iter().collect();
    let w = all[3];
    let path = dir.path("memring.toml");
    let settings = "replicas = 2\nhandoff_ms = 60000";
    std::fs::write(&path, config(&all[..3], &[w], settings)).unwrap();
    let proxy = Proxy::start_file(&path);
    let mut client = proxy.client();
    let keys: Vec<String> = (0..1000).map(|i| format!("rep:{i}")).collect();
    store(&mut client, &keys, "v1");
    for key in &keys {
        assert_eq!(client.get(key), Some(b"v1".to_vec()), "{key}");
    }
    assert_eq!(stat(w, "cmd_get"), 0);

    let joined = config(&all, &[], settings);
    let after = ring_of(&joined);
    let (theirs, others): (Vec<String>, Vec<String>) = keys
        .iter()
        .cloned()
        .partition(|k| replicas_of(&after, k, 2).contains(&name_of(w)));
    let owned: Vec<String> = theirs
        .iter()
        .filter(|k| replicas_of(&after, k, 2)[0] == name_of(w))
        .cloned()
        .collect();
    assert!(owned.len() > 100 && theirs.len() > owned.len() + 100);
    assert_eq!(held_by(w, &theirs), theirs.len(), "owner or second replica");
    assert_eq!(held_by(w, &others), 0);

    reload(&proxy, &path, &joined);
    let asked: Vec<u64> = all[..3].iter().map(|s| stat(s, "cmd_get")).collect();
    for key in &owned {
        assert_eq!(client.get(key), Some(b"v1".to_vec()), "{key}");
    }
    let now: Vec<u64> = all[..3].iter().map(|s| stat(s, "cmd_get")).collect();
    assert_eq!(now, asked, "its keys hit on it: no other replica asked");
    assert_eq!(stat(w, "cmd_flush"), 0);
}

#[test]
fn with_replicas_a_cas_incr_or_add_leaves_the_warming_replica_without_the_key() {
    let dir = TempDir::new("warming", "replicas-cas");
    let servers: Vec<Memcached> = (0..4).map(|_| Memcached::start()).collect();
    let all: Vec<&Memcached> = servers.iter().collect();
    let w = all[3];
    let path = dir.path("memring.toml");
    let settings = "replicas = 2\nhandoff_ms = 60000";
    std::fs::write(&path, config(&all[..3], &[w], settings)).unwrap();
    let proxy = Proxy::start_file(&path);
    let mut client = proxy.client();
    let joined = config(&all, &[], settings);
    let after = ring_of(&joined);
    let keys: Vec<String> = (0..900)
        .map(|i| format!("repcas:{i}"))
        .filter(|k| replicas_of(&after, k, 2).contains(&name_of(w)))
        .collect();
    assert!(keys.len() > 150, "{}", keys.len());
    store(&mut client, &keys, "10");
    assert_eq!(held_by(w, &keys), keys.len(), "written while warming");
    let expected = |i: usize| -> &'static [u8] {
        match i % 3 {
            0 => b"v9",
            1 => b"15",
            _ => b"10",
        }
    };
    for (i, key) in keys.iter().enumerate() {
        match i % 3 {
            0 => {
                let reply = client.call(
                    format!("gets {key}\r\n").as_bytes(),
                    memring::protocol::ReplyKind::Values,
                );
                let text = String::from_utf8(reply).unwrap();
                let cas = text.split_whitespace().nth(4).unwrap().to_string();
                let line = format!("cas {key} 0 0 2 {cas}\r\nv9\r\n");
                assert_eq!(
                    client.call(line.as_bytes(), memring::protocol::ReplyKind::Line),
                    b"STORED\r\n",
                    "{key}"
                );
            }
            1 => {
                let line = format!("incr {key} 5\r\n");
                assert_eq!(
                    client.call(line.as_bytes(), memring::protocol::ReplyKind::Line),
                    b"15\r\n",
                    "{key}"
                );
            }
            _ => {
                let line = format!("add {key} 0 0 7\r\nrefused\r\n");
                assert_eq!(
                    client.call(line.as_bytes(), memring::protocol::ReplyKind::Line),
                    b"NOT_STORED\r\n",
                    "{key}"
                );
            }
        }
    }
    // Deleted there rather than repeated: never a value the replicas lack.
    assert_eq!(
        held_by(w, &keys),
        0,
        "each lost the key on the warming server"
    );

    reload(&proxy, &path, &joined);
    for (i, key) in keys.iter().enumerate() {
        assert_eq!(client.get(key).as_deref(), Some(expected(i)), "{key}");
    }
}

#[test]
fn check_accepts_a_warming_server_and_plan_shows_it_apart() {
    let dir = TempDir::new("warming", "plan");
    let servers: Vec<Memcached> = (0..3).map(|_| Memcached::start()).collect();
    let (a, b, w) = (&servers[0], &servers[1], &servers[2]);
    let (before, warming, joined) = (
        dir.path("before.toml"),
        dir.path("warming.toml"),
        dir.path("joined.toml"),
    );
    std::fs::write(&before, config(&[a, b], &[], "")).unwrap();
    std::fs::write(&warming, config(&[a, b], &[w], "")).unwrap();
    std::fs::write(&joined, config(&[a, b, w], &[], "")).unwrap();
    let run = |args: &[&std::path::Path]| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_memring"))
            .args(args)
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        String::from_utf8(output.stdout).unwrap()
    };
    let checked = run(&[Path::new("check"), &warming]);
    assert!(checked.contains(": ok (3 servers"), "{checked}");
    // Adding it warming moves nothing; it is listed apart with its share.
    let plan = run(&[Path::new("plan"), &before, &warming]);
    assert!(plan.contains("keyspace that moves: 0.00%"), "{plan}");
    let name = name_of(w);
    assert!(
        plan.lines()
            .any(|l| l.starts_with(&name) && l.trim_end().ends_with("warming")),
        "{plan}"
    );
    let share: f64 = plan
        .split(&format!("warming: {name} takes the writes of "))
        .nth(1)
        .and_then(|rest| rest.split('%').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{plan}"));
    assert!((20.0..45.0).contains(&share), "about a third: {plan}");
    // Its joining is the change that moves its share.
    let plan = run(&[Path::new("plan"), &warming, &joined]);
    assert!(plan.contains(&format!("+1 server ({name})")), "{plan}");
    assert!(!plan.contains("keyspace that moves: 0.00%"), "{plan}");
}

#[test]
fn warming_during_a_hand_off_window_keeps_every_value() {
    let dir = TempDir::new("warming", "window");
    let servers: Vec<Memcached> = (0..4).map(|_| Memcached::start()).collect();
    let (a, b, c, w) = (&servers[0], &servers[1], &servers[2], &servers[3]);
    let path = dir.path("memring.toml");
    let settings = "handoff_ms = 60000";
    std::fs::write(&path, config(&[a, b], &[w], settings)).unwrap();
    let proxy = Proxy::start_file(&path);
    let mut client = proxy.client();
    // Written while the fourth server warms: it holds those it will own.
    let early: Vec<String> = (0..800).map(|i| format!("early:{i}")).collect();
    store(&mut client, &early, "10");
    // A third server joins (a window opens) while the fourth still warms:
    // writes of keys moved to the third go through the hand-off and delete
    // the key on the warming server first, which must not keep its `10`.
    reload(&proxy, &path, &config(&[a, b, c], &[w], settings));
    assert!(proxy.running().topology.load().previous.is_some());
    change_each(&mut client, &early);
    let keys: Vec<String> = (0..800).map(|i| format!("late:{i}")).collect();
    store(&mut client, &keys, "10");
    change_each(&mut client, &keys);
    assert_eq!(stat(w, "cmd_get"), 0, "nothing read from it");

    let joined = config(&[a, b, c, w], &[], settings);
    let staged = ring_of(&joined);
    let its_key = early
        .iter()
        .find(|k| replicas_of(&staged, k, 1)[0] == name_of(w))
        .unwrap();
    reload(&proxy, &path, &joined);
    // Once this client's reads reach it:
    let asked = stat(w, "cmd_get");
    wait_for("reads to reach the joined server", || {
        client.get(its_key);
        stat(w, "cmd_get") > asked
    });
    // It joined within the window: a chained change. Early keys that moved
    // to the third server and were not written since are only on their
    // first owner, which a chained window does not read (docs/handoff.md,
    // "Chained changes"): a miss. Every other key reads its last value.
    for (i, key) in early.iter().chain(&keys).enumerate() {
        let (what, expected) = written(i % early.len());
        let got = client.get(key);
        let lost = i < early.len() && what == "set" && got.is_none();
        assert!(
            got.as_deref() == expected || lost,
            "{key} ({what}): {got:?}"
        );
    }
}

/// Warming × meta quiet mode and × the near cache: a quiet write reaches the
/// warming server and says nothing, a quiet delete removes the key there,
/// and a near-cached hot key written while the server warms is written to
/// it and read back new.
#[test]
fn quiet_meta_writes_and_a_near_cached_key_reach_a_warming_server() {
    let dir = TempDir::new("warming", "quiet-near");
    let servers: Vec<Memcached> = (0..3).map(|_| Memcached::start()).collect();
    let (a, b, w) = (&servers[0], &servers[1], &servers[2]);
    let settings = "handoff_ms = 60000\nhot_key_window_ms = 100\nhot_key_cache_ms = 60000";
    let path = dir.path("memring.toml");
    std::fs::write(&path, config(&[a, b], &[w], settings)).unwrap();
    let proxy = Proxy::start_file(&path);
    let after = ring_of(&config(&[a, b, w], &[], ""));
    let theirs: Vec<String> = (0..2000)
        .map(|i| format!("quiet:{i}"))
        .filter(|k| replicas_of(&after, k, 1)[0] == name_of(w))
        .take(60)
        .collect();
    assert_eq!(theirs.len(), 60);
    let mut client = proxy.client();

    // Quiet sets: only the `mn` answers, and every value reached it.
    let mut batch = Vec::new();
    for key in &theirs {
        batch.extend_from_slice(format!("ms {key} 2 q\r\nv1\r\n").as_bytes());
    }
    batch.extend_from_slice(b"mn\r\n");
    client.send(&batch);
    assert_eq!(client.reply(ReplyKind::Line), b"MN\r\n");
    // Quiet deletes of the first ten: gone there too.
    let mut batch = Vec::new();
    for key in &theirs[..10] {
        batch.extend_from_slice(format!("md {key} q\r\n").as_bytes());
    }
    batch.extend_from_slice(b"mn\r\n");
    client.send(&batch);
    assert_eq!(client.reply(ReplyKind::Line), b"MN\r\n");

    // A hot key, near-cached, then written.
    let hot = &theirs[20];
    wait_for("the hot key's near-cache hits", || {
        for _ in 0..200 {
            assert_eq!(client.get(hot), Some(b"v1".to_vec()));
        }
        client.stat("near_cache_hits") > 0
    });
    assert_eq!(client.set(hot, b"v2"), b"STORED\r\n");
    assert_eq!(client.get(hot), Some(b"v2".to_vec()), "no near-cached v1");

    assert_eq!(stat(w, "cmd_get"), 0, "a warming server serves no reads");
    assert_eq!(held_by(w, &theirs[..10]), 0, "quiet deletes reached it");
    assert_eq!(held_by(w, &theirs[10..]), 50, "quiet sets reached it");
    assert_eq!(w.client().get(hot), Some(b"v2".to_vec()));
}
