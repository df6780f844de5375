//! Shadow pools: sampled keys' writes copied to the shadow, their gets
//! compared with it, `stats shadow`. Checked on the memcached servers
//! themselves; a shadow server that hangs or dies must never reach a client.

use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

use memring::protocol::ReplyKind;

use crate::common::{wait_for, Client, Memcached, Proxy, TempDir};

const BIN: &str = env!("CARGO_BIN_EXE_memring");

/// A config whose top-level pool (`default`, over `primary`) is shadowed
/// by `fraction` of its keys to a pool `candidate`, with `candidate_settings`
/// in that pool's entry; `settings` go at the top, `shadow` says whether the
/// `[shadow]` table is written, `more` comes last.
fn config(
    primary: &[&Memcached],
    candidate: &[&Memcached],
    settings: &str,
    shadow: Option<&str>,
    candidate_settings: &str,
    more: &str,
) -> String {
    let mut text = format!("listen = \"127.0.0.1:0\"\n{settings}\n");
    for server in primary {
        text.push_str(&format!("[[servers]]\naddr = \"{}\"\n", server.addr()));
    }
    if let Some(fraction) = shadow {
        text.push_str(&format!(
            "[shadow]\npool = \"candidate\"\nfraction = {fraction}\n"
        ));
    }
    text.push_str(&format!(
        "\n[[pools]]\nname = \"candidate\"\n{candidate_settings}\n"
    ));
    for server in candidate {
        text.push_str(&format!(
            "[[pools.servers]]\naddr = \"{}\"\n",
            server.addr()
        ));
    }
    text.push('\n');
    text.push_str(more);
    text
}

/// The default pool's `stats shadow` lines, without `shadow:default:`.
fn shadow_stats(client: &mut Client) -> HashMap<String, String> {
    client
        .stats("shadow")
        .into_iter()
        .filter_map(|(k, v)| Some((k.strip_prefix("shadow:default:")?.to_string(), v)))
        .collect()
}

fn figure(stats: &HashMap<String, String>, name: &str) -> u64 {
    stats
        .get(name)
        .unwrap_or_else(|| panic!("no shadow:default:{name} in {stats:?}"))
        .parse()
        .unwrap()
}

/// Waits until `compared` gets have both answers, and returns the figures.
fn compared(client: &mut Client, n: u64) -> HashMap<String, String> {
    let mut stats = HashMap::new();
    wait_for(&format!("{n} gets compared"), || {
        stats = shadow_stats(client);
        stats.get("compared").and_then(|v| v.parse().ok()) == Some(n)
    });
    stats
}

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

/// One number of a memcached's own `stats`.
fn server_stat(server: &Memcached, name: &str) -> u64 {
    server
        .client()
        .stats("")
        .into_iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("no STAT {name}"))
        .1
        .parse()
        .unwrap()
}

fn keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

#[test]
fn a_shadow_of_another_size_reports_the_hit_rate_of_the_keys_its_servers_hold() {
    let primary = [Memcached::start(), Memcached::start()];
    let candidate = [Memcached::start(), Memcached::start(), Memcached::start()];
    let primary: Vec<&Memcached> = primary.iter().collect();
    let candidate: Vec<&Memcached> = candidate.iter().collect();
    let proxy = Proxy::start_text(&config(&primary, &candidate, "", Some("1.0"), "", ""));
    let mut client = proxy.client();
    let keys = keys("k:", 400);
    for key in &keys {
        assert_eq!(client.set(key, key.as_bytes()), b"STORED\r\n");
    }
    wait_for("every write copied to the shadow", || {
        held_by(&candidate, &keys).iter().sum::<usize>() == 400
    });
    let spread = held_by(&candidate, &keys);
    assert!(spread.iter().all(|&n| n > 60), "its own ring: {spread:?}");
    // The shadow loses a quarter of the keys and one value changes there,
    // behind memring's back.
    for key in &keys[..100] {
        for server in &candidate {
            server
                .client()
                .call(format!("delete {key}\r\n").as_bytes(), ReplyKind::Line);
        }
    }
    for server in &candidate {
        let mut direct = server.client();
        if direct.get(&keys[100]).is_some() {
            assert_eq!(direct.set(&keys[100], b"changed"), b"STORED\r\n");
        }
    }
    for key in &keys {
        assert_eq!(client.get(key).as_deref(), Some(key.as_bytes()), "{key}");
    }
    let stats = compared(&mut client, 400);
    let present: usize = held_by(&candidate, &keys).iter().sum();
    assert_eq!(present, 300);
    assert_eq!(figure(&stats, "shadow_hits"), present as u64);
    assert_eq!(figure(&stats, "primary_hits"), 400);
    assert_eq!(figure(&stats, "hit_hit"), 299);
    assert_eq!(figure(&stats, "mismatch"), 1);
    assert_eq!(figure(&stats, "hit_miss"), 100);
    assert_eq!(figure(&stats, "miss_hit") + figure(&stats, "miss_miss"), 0);
    assert_eq!(stats["primary_hit_rate"], "1.0000");
    assert_eq!(stats["shadow_hit_rate"], "0.7500");
    assert_eq!(stats["pool"], "candidate");
    assert_eq!(figure(&stats, "sent"), 800);
    assert_eq!(figure(&stats, "failed") + figure(&stats, "shed"), 0);
    // Shadow traffic is nobody's request: memring counts the client's 400
    // gets, and the primary's servers saw exactly those.
    assert_eq!(client.stat("cmd_get"), 400);
    let primary_gets: u64 = primary.iter().map(|s| server_stat(s, "cmd_get")).sum();
    assert_eq!(primary_gets, 400);
}

#[test]
fn a_multi_key_gets_is_compared_key_by_key_whatever_the_cas_numbers() {
    let primary = [Memcached::start(), Memcached::start()];
    let candidate = Memcached::start();
    let proxy = Proxy::start_text(&config(
        &[&primary[0], &primary[1]],
        &[&candidate],
        "",
        Some("1.0"),
        "",
        "",
    ));
    let mut client = proxy.client();
    let keys = keys("m:", 25);
    for key in &keys[..20] {
        assert_eq!(client.set(key, key.as_bytes()), b"STORED\r\n");
    }
    wait_for("the copies on the shadow", || {
        held_by(&[&candidate], &keys) == [20]
    });
    let mut direct = candidate.client();
    for key in &keys[..5] {
        direct.call(format!("delete {key}\r\n").as_bytes(), ReplyKind::Line);
    }
    // The primary's cas numbers are not the shadow's: the data is compared.
    let reply = client.call(
        format!("gets {}\r\n", keys.join(" ")).as_bytes(),
        ReplyKind::Values,
    );
    let values = String::from_utf8_lossy(&reply).matches("VALUE ").count();
    assert_eq!(values, 20, "{}", String::from_utf8_lossy(&reply));
    let stats = compared(&mut client, 25);
    assert_eq!(figure(&stats, "hit_hit"), 15, "{stats:?}");
    assert_eq!(figure(&stats, "hit_miss"), 5, "{stats:?}");
    assert_eq!(figure(&stats, "miss_miss"), 5, "{stats:?}");
    assert_eq!(figure(&stats, "mismatch"), 0, "{stats:?}");
}

/// Round trips of `set` then `get` of each key, one at a time.
fn round_trips(client: &mut Client, keys: &[String]) -> Vec<Duration> {
    keys.iter()
        .map(|key| {
            let start = Instant::now();
            assert_eq!(client.set(key, b"v"), b"STORED\r\n");
            assert_eq!(client.get(key).as_deref(), Some(&b"v"[..]));
            start.elapsed()
        })
        .collect()
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

#[test]
fn a_hung_shadow_server_never_delays_a_client_and_its_copies_are_shed() {
    let primary = Memcached::start();
    let mut candidate = [Memcached::start(), Memcached::start()];
    let text = {
        let candidate: Vec<&Memcached> = candidate.iter().collect();
        // A client that waited for the hung shadow would wait this long.
        config(
            &[&primary],
            &candidate,
            "",
            Some("1.0"),
            "request_timeout_ms = 5000",
            "",
        )
    };
    let proxy = Proxy::start_text(&text);
    let mut client = proxy.client();
    round_trips(&mut client, &keys("warm:", 50));
    let before = round_trips(&mut client, &keys("before:", 300));
    candidate[0].pause();
    let during = round_trips(&mut client, &keys("during:", 300));
    // A client held by the shadow would wait out the 5 s request timeout;
    // the bounds below stay under it with room for a loaded machine.
    let slowest = *during.iter().max().unwrap();
    assert!(
        slowest < Duration::from_millis(3000),
        "a client waited for the shadow: {slowest:?}"
    );
    let (before, during) = (median(before), median(during));
    assert!(
        during <= before * 10 + Duration::from_millis(5),
        "median round trip {before:?} before, {during:?} with the shadow hung"
    );
    // Thousands of writes while it hangs: the copies for the hung server
    // pile up to the worker's bound, then are shed; the client is answered
    // at once.
    let mut burst = Vec::new();
    for i in 0..10_000 {
        burst.extend_from_slice(format!("set burst:{i} 0 0 1 noreply\r\nx\r\n").as_bytes());
    }
    client.send(&burst);
    let start = Instant::now();
    assert_eq!(client.set("after", b"v"), b"STORED\r\n");
    assert_eq!(client.get("after").as_deref(), Some(&b"v"[..]));
    assert!(
        start.elapsed() < Duration::from_millis(4000),
        "the burst took {:?}",
        start.elapsed()
    );
    let stats = shadow_stats(&mut client);
    assert!(figure(&stats, "shed") > 0, "{stats:?}");
    assert!(
        figure(&stats, "sent") < 300 * 2 * 2 + 10_000,
        "some were not sent: {stats:?}"
    );
    // The primary's health is its own.
    let state = client
        .stats("")
        .into_iter()
        .find(|(k, _)| *k == format!("server:{}:state", primary.addr()))
        .map(|(_, v)| v);
    assert_eq!(state.as_deref(), Some("ACTIVE"));
    candidate[0].resume();
}

#[test]
fn meta_commands_reach_the_shadow_as_plain_writes_and_quiet_replies_stay_the_clients() {
    let primary = Memcached::start();
    let candidate = Memcached::start();
    let proxy = Proxy::start_text(&config(&[&primary], &[&candidate], "", Some("1.0"), "", ""));
    let mut client = proxy.client();
    let mut direct = candidate.client();
    client.send(b"ms m1 2 T0\r\nhi\r\n");
    assert_eq!(client.meta_reply(), b"HD\r\n");
    client.send(b"mg m1 c\r\n");
    let reply = String::from_utf8(client.meta_reply()).unwrap();
    let cas = reply
        .trim()
        .strip_prefix("HD c")
        .unwrap_or_else(|| panic!("{reply}"));
    // The primary's cas number means nothing to the shadow: it gets a
    // plain set.
    client.send(format!("ms m1 2 C{cas}\r\nyo\r\n").as_bytes());
    assert_eq!(client.meta_reply(), b"HD\r\n");
    wait_for("the cas write on the shadow", || {
        direct.send(b"mg m1 v\r\n");
        direct.meta_reply() == b"VA 2\r\nyo\r\n"
    });
    // Quiet requests: the client sees what memcached alone would send.
    client.send(b"ms m2 1 q\r\nz\r\nmg nope v q\r\nmd m1 q\r\nmn\r\n");
    assert_eq!(client.read_until_suffix(b"MN\r\n"), b"", "only the MN");
    wait_for("the quiet writes on the shadow", || {
        direct.send(b"mg m2 v\r\nmg m1 v\r\n");
        let first = direct.meta_reply();
        let second = direct.meta_reply();
        first == b"VA 1\r\nz\r\n" && second == b"EN\r\n"
    });
    // A base64 key is sampled and placed by its decoded bytes.
    client.send(b"ms a2V5 1 b\r\nv\r\nmg a2V5 b v\r\n");
    assert_eq!(client.meta_reply(), b"HD\r\n");
    assert_eq!(client.meta_reply(), b"VA 1\r\nv\r\n");
    wait_for("the base64 write on the shadow", || {
        direct.get("key").as_deref() == Some(&b"v"[..])
    });
    // Compared: `mg m1 c` (a hit without a value), the quiet miss, and the
    // base64 get.
    let stats = compared(&mut client, 3);
    assert_eq!(figure(&stats, "hit_hit"), 2, "{stats:?}");
    assert_eq!(figure(&stats, "miss_miss"), 1, "{stats:?}");
    assert_eq!(figure(&stats, "failed"), 0, "{stats:?}");
}

#[test]
fn a_get_across_pools_compares_only_the_shadowed_pools_keys() {
    let primary = Memcached::start();
    let sessions = Memcached::start();
    let candidate = Memcached::start();
    let more = format!(
        "[[pools]]\nname = \"sessions\"\n[[pools.servers]]\naddr = \"{}\"\n\n[[routes]]\nprefix = \"sess:\"\npool = \"sessions\"\n",
        sessions.addr()
    );
    let proxy = Proxy::start_text(&config(
        &[&primary],
        &[&candidate],
        "",
        Some("1.0"),
        "",
        &more,
    ));
    let mut client = proxy.client();
    let keys: Vec<String> = (0..50)
        .map(|i| {
            if i % 2 == 0 {
                format!("sess:{i}")
            } else {
                format!("user:{i}")
            }
        })
        .collect();
    for key in &keys {
        assert_eq!(client.set(key, key.as_bytes()), b"STORED\r\n");
    }
    let mut expected = Vec::new();
    for key in &keys {
        expected.extend_from_slice(format!("VALUE {key} 0 {}\r\n{key}\r\n", key.len()).as_bytes());
    }
    expected.extend_from_slice(b"END\r\n");
    let reply = client.call(
        format!("get {}\r\n", keys.join(" ")).as_bytes(),
        ReplyKind::Values,
    );
    assert_eq!(
        String::from_utf8_lossy(&reply),
        String::from_utf8_lossy(&expected)
    );
    let stats = compared(&mut client, 25);
    assert_eq!(figure(&stats, "hit_hit"), 25, "{stats:?}");
    let (user, sess): (Vec<String>, Vec<String>) =
        keys.iter().cloned().partition(|k| k.starts_with("user:"));
    assert_eq!(held_by(&[&candidate], &user), [25]);
    assert_eq!(held_by(&[&candidate], &sess), [0]);
    assert_eq!(
        client
            .stats("shadow")
            .iter()
            .filter(|(k, _)| k.starts_with("shadow:sessions:"))
            .count(),
        0
    );
}

fn replace_by_rename(path: &std::path::Path, text: &str) {
    let temporary = path.with_extension("tmp");
    std::fs::write(&temporary, text).unwrap();
    std::fs::rename(&temporary, path).unwrap();
}

#[test]
fn a_reload_adds_and_removes_the_shadow_live_and_a_cycle_keeps_the_old_config() {
    let primary = Memcached::start();
    let candidate = Memcached::start();
    let dir = TempDir::new("shadow", "reload");
    let path = dir.path("memring.toml");
    let text = |shadow: Option<&str>, candidate_settings: &str| {
        config(
            &[&primary],
            &[&candidate],
            "",
            shadow,
            candidate_settings,
            "",
        )
    };
    std::fs::write(&path, text(None, "")).unwrap();
    let proxy = Proxy::start_file(&path);
    let mut client = proxy.client();
    assert!(client.stats("shadow").is_empty());
    let keys = keys("r:", 100);
    for key in &keys {
        assert_eq!(client.set(key, b"old"), b"STORED\r\n");
    }
    replace_by_rename(&path, &text(Some("1.0"), ""));
    wait_for("the shadow to be added", || {
        shadow_stats(&mut client).contains_key("pool")
    });
    // A cold shadow: every key misses there.
    for key in &keys {
        assert_eq!(client.get(key).as_deref(), Some(&b"old"[..]));
    }
    let stats = compared(&mut client, 100);
    assert_eq!(figure(&stats, "hit_miss"), 100);
    // Warmed by the writes that follow, it converges.
    for key in &keys {
        assert_eq!(client.set(key, b"new"), b"STORED\r\n");
    }
    for key in &keys {
        assert_eq!(client.get(key).as_deref(), Some(&b"new"[..]));
    }
    let stats = compared(&mut client, 200);
    assert_eq!(figure(&stats, "hit_hit"), 100);
    assert_eq!(stats["shadow_hit_rate"], "0.5000");

    // A cycle is refused, and the shadow goes on as it was.
    let stats_handle = proxy.running().stats.clone();
    let failed_before = stats_handle.reload_count(false);
    replace_by_rename(
        &path,
        &text(Some("1.0"), "[pools.shadow]\npool = \"default\""),
    );
    wait_for("the cycle to be refused", || {
        stats_handle.reload_count(false) > failed_before
    });
    assert_eq!(client.get(&keys[0]).as_deref(), Some(&b"new"[..]));
    compared(&mut client, 201);

    replace_by_rename(&path, &text(None, ""));
    wait_for("the shadow to be removed", || {
        client.stats("shadow").is_empty()
    });
    assert_eq!(client.set("unshadowed", b"x"), b"STORED\r\n");
    assert_eq!(client.get("unshadowed").as_deref(), Some(&b"x"[..]));
    assert_eq!(candidate.client().get("unshadowed"), None);
}

#[test]
fn a_dead_shadow_server_fails_only_its_own_copies() {
    let primary = [Memcached::start(), Memcached::start()];
    let mut candidate = [Memcached::start(), Memcached::start()];
    let text = {
        let primary: Vec<&Memcached> = primary.iter().collect();
        let candidate: Vec<&Memcached> = candidate.iter().collect();
        config(&primary, &candidate, "", Some("1.0"), "", "")
    };
    candidate[1].kill();
    let proxy = Proxy::start_text(&text);
    let mut client = proxy.client();
    let keys = keys("d:", 200);
    for key in &keys {
        assert_eq!(client.set(key, key.as_bytes()), b"STORED\r\n");
        assert_eq!(client.get(key).as_deref(), Some(key.as_bytes()));
    }
    let live = held_by(&[&candidate[0]], &keys)[0];
    assert!(live > 50 && live < 150, "its share: {live}");
    let lost = (200 - live) as u64;
    let mut stats = HashMap::new();
    wait_for("every shadow request answered or failed", || {
        stats = shadow_stats(&mut client);
        figure(&stats, "compared") == live as u64 && figure(&stats, "failed") == 2 * lost
    });
    assert_eq!(figure(&stats, "hit_hit"), live as u64);
    for server in &primary {
        let state = client
            .stats("")
            .into_iter()
            .find(|(k, _)| *k == format!("server:{}:state", server.addr()))
            .map(|(_, v)| v);
        assert_eq!(state.as_deref(), Some("ACTIVE"));
    }
}

#[test]
fn check_names_the_shadow_and_refuses_bad_ones_with_their_line() {
    let dir = TempDir::new("shadow", "check");
    let good = "listen = \"127.0.0.1:22122\"\n[[servers]]\naddr = \"127.0.0.1:21211\"\n[shadow]\npool = \"candidate\"\nfraction = 0.1\n[[pools]]\nname = \"candidate\"\n[[pools.servers]]\naddr = \"127.0.0.1:21311\"\n";
    let path = dir.path("good.toml");
    std::fs::write(&path, good).unwrap();
    let output = Command::new(BIN).arg("check").arg(&path).output().unwrap();
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("pool default -> shadow pool candidate (10% of keys)"),
        "{stdout}"
    );
    let cases = [
        (
            good.replace("pool = \"candidate\"", "pool = \"nope\""),
            "bad.toml:5:8: pool `default`: shadow pool = \"nope\" names no pool",
        ),
        (
            good.replace(
                "name = \"candidate\"\n",
                "name = \"candidate\"\n[pools.shadow]\npool = \"default\"\n",
            ),
            "bad.toml:5:8: pool `default` is in a shadow cycle (default -> candidate -> default)",
        ),
    ];
    for (text, expected) in cases {
        let path = dir.path("bad.toml");
        std::fs::write(&path, &text).unwrap();
        let output = Command::new(BIN).arg("check").arg(&path).output().unwrap();
        assert_eq!(output.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expected), "{stderr}");
    }
}

#[test]
fn a_shadow_that_shed_writes_is_flushed_when_it_is_switched_to_serve() {
    let primary = Memcached::start();
    let mut candidate = Memcached::start();
    let dir = TempDir::new("shadow", "promote");
    let path = dir.path("memring.toml");
    // A shadow request stays in flight for as long as the stopped shadow
    // server holds it, so the worker's bound fills and copies are shed.
    let grading = config(
        &[&primary],
        &[&candidate],
        "",
        Some("1.0"),
        "request_timeout_ms = 30000",
        "",
    );
    let switched = config(
        &[&primary],
        &[&candidate],
        "default_pool = \"candidate\"",
        None,
        "request_timeout_ms = 30000\n[pools.shadow]\npool = \"default\"\nfraction = 1.0",
        "",
    );
    std::fs::write(&path, &grading).unwrap();
    let proxy = Proxy::start_file(&path);
    let mut client = proxy.client();
    let overwritten = keys("over:", 300);
    let deleted = keys("gone:", 200);
    for key in overwritten.iter().chain(&deleted) {
        assert_eq!(client.set(key, b"v1"), b"STORED\r\n");
    }
    wait_for("the shadow to hold every v1", || {
        held_by(&[&candidate], &overwritten)[0] == 300 && held_by(&[&candidate], &deleted)[0] == 200
    });
    assert_eq!(figure(&shadow_stats(&mut client), "lost_writes"), 0);

    // The shadow server stops; 20 000 pipelined noreply sets fill the
    // worker's bound, and the overwrites and deletes after them are shed.
    candidate.pause();
    let mut burst = Vec::new();
    for i in 0..20_000 {
        burst.extend_from_slice(format!("set fill:{i} 0 0 1 noreply\r\nx\r\n").as_bytes());
    }
    for key in &overwritten {
        burst.extend_from_slice(format!("set {key} 0 0 2 noreply\r\nv2\r\n").as_bytes());
    }
    for key in &deleted {
        burst.extend_from_slice(format!("delete {key} noreply\r\n").as_bytes());
    }
    client.send(&burst);
    assert_eq!(client.get(&overwritten[299]).as_deref(), Some(&b"v2"[..]));
    candidate.resume();
    // Its copies in flight land before a later one on the same connection.
    let mut n = 0;
    wait_for("the shadow to catch up", || {
        n += 1;
        let key = format!("barrier:{n}");
        client.set(&key, b"b") == b"STORED\r\n" && candidate.client().get(&key).is_some()
    });
    let stats = shadow_stats(&mut client);
    assert!(figure(&stats, "shed") > 0, "{stats:?}");
    assert!(
        figure(&stats, "lost_writes") >= 500,
        "the grade says the shadow lacks writes: {stats:?}"
    );
    let mut shadow = candidate.client();
    let stale = overwritten
        .iter()
        .filter(|k| shadow.get(k).as_deref() == Some(&b"v1"[..]))
        .count();
    println!("before the switch the shadow holds {stale} values older than the primary's");

    // The documented switch: the shadow serves, the old pool shadows it.
    let applied = proxy.running().stats.reload_count(true);
    replace_by_rename(&path, &switched);
    wait_for("the switch", || {
        proxy.running().stats.reload_count(true) > applied
    });
    let older = overwritten
        .iter()
        .filter(|k| client.get(k).as_deref() == Some(&b"v1"[..]))
        .count();
    let back = deleted.iter().filter(|k| client.get(k).is_some()).count();
    assert_eq!(
        (older, back),
        (0, 0),
        "overwritten values and deleted keys read after the switch"
    );
    // The switched layout serves and writes as usual.
    assert_eq!(client.set(&overwritten[0], b"v3"), b"STORED\r\n");
    assert_eq!(client.get(&overwritten[0]).as_deref(), Some(&b"v3"[..]));
    assert_eq!(
        candidate.client().get(&overwritten[0]).as_deref(),
        Some(&b"v3"[..])
    );
}

#[test]
fn a_switch_to_a_shadow_that_lost_writes_and_cannot_be_flushed_is_refused() {
    let primary = Memcached::start();
    let mut candidate = Memcached::start();
    let dir = TempDir::new("shadow", "refuse");
    let path = dir.path("memring.toml");
    let grading = config(
        &[&primary],
        &[&candidate],
        "connect_timeout_ms = 200\nrequest_timeout_ms = 200",
        Some("1.0"),
        "",
        "",
    );
    let switched = config(
        &[&primary],
        &[&candidate],
        "connect_timeout_ms = 200\nrequest_timeout_ms = 200\ndefault_pool = \"candidate\"",
        None,
        "",
        "",
    );
    std::fs::write(&path, &grading).unwrap();
    let proxy = Proxy::start_file(&path);
    let mut client = proxy.client();
    assert_eq!(client.set("k", b"v1"), b"STORED\r\n");
    // A flush of the primary never reaches the shadow: a lost write.
    assert_eq!(client.call(b"flush_all\r\n", ReplyKind::Line), b"OK\r\n");
    assert_eq!(figure(&shadow_stats(&mut client), "lost_writes"), 1);
    assert_eq!(candidate.client().get("k").as_deref(), Some(&b"v1"[..]));
    candidate.kill();
    let rejected = proxy.running().stats.reload_count(false);
    replace_by_rename(&path, &switched);
    wait_for("the switch to be refused", || {
        proxy.running().stats.reload_count(false) > rejected
    });
    // The primary still serves: the flushed key stays a miss.
    assert_eq!(client.set("after", b"a"), b"STORED\r\n");
    assert_eq!(primary.client().get("after").as_deref(), Some(&b"a"[..]));
    assert_eq!(client.get("k"), None);
}

#[test]
fn a_switch_to_a_shadow_that_got_every_write_keeps_it_warm_both_ways() {
    let primary = Memcached::start();
    let candidate = Memcached::start();
    let dir = TempDir::new("shadow", "clean");
    let path = dir.path("memring.toml");
    let grading = config(&[&primary], &[&candidate], "", Some("1.0"), "", "");
    let switched = config(
        &[&primary],
        &[&candidate],
        "default_pool = \"candidate\"",
        None,
        "[pools.shadow]\npool = \"default\"\nfraction = 1.0",
        "",
    );
    std::fs::write(&path, &grading).unwrap();
    let proxy = Proxy::start_file(&path);
    let stats = proxy.running().stats.clone();
    let switch = |text: &str| {
        let applied = stats.reload_count(true);
        replace_by_rename(&path, text);
        wait_for("the switch", || stats.reload_count(true) > applied);
    };
    let mut client = proxy.client();
    let keys = keys("warm:", 200);
    for key in &keys {
        assert_eq!(client.set(key, b"v1"), b"STORED\r\n");
    }
    wait_for("the shadow to hold every key", || {
        held_by(&[&candidate], &keys)[0] == 200
    });
    switch(&switched);
    assert!(
        keys.iter()
            .all(|k| client.get(k).as_deref() == Some(&b"v1"[..])),
        "not flushed"
    );
    for key in &keys {
        assert_eq!(client.set(key, b"v2"), b"STORED\r\n");
    }
    wait_for("the old pool, now the shadow, to hold every v2", || {
        let mut direct = primary.client();
        keys.iter()
            .all(|k| direct.get(k).as_deref() == Some(&b"v2"[..]))
    });
    switch(&grading);
    assert!(
        keys.iter()
            .all(|k| client.get(k).as_deref() == Some(&b"v2"[..])),
        "back, warm"
    );
}

/// Inside a hand-off window a `gat` of a key that stayed on its owner is
/// run as the lease retry (a lease there would take the client's TTL), and
/// a moved key's as a read-through: the shadow compares both as it does
/// any other `gat`.
#[test]
fn gats_inside_a_hand_off_window_are_compared_with_the_shadow() {
    let first = Memcached::start();
    let second = Memcached::start();
    let candidate = Memcached::start();
    let dir = TempDir::new("shadow", "window");
    let path = dir.path("memring.toml");
    let text = |primary: &[&Memcached]| config(primary, &[&candidate], "", Some("1.0"), "", "");
    std::fs::write(&path, text(&[&first])).unwrap();
    let proxy = Proxy::start_file(&path);
    let mut client = proxy.client();
    let keys = keys("w:", 30);
    for key in &keys {
        assert_eq!(client.set(key, key.as_bytes()), b"STORED\r\n");
    }
    wait_for("the copies on the shadow", || {
        held_by(&[&candidate], &keys) == [30]
    });
    replace_by_rename(&path, &text(&[&first, &second]));
    wait_for("ring version 2", || proxy.ring_version() >= 2);
    for key in &keys {
        let reply = client.call(format!("gat 100 {key}\r\n").as_bytes(), ReplyKind::Values);
        let value = format!("VALUE {key} 0 {}\r\n{key}\r\nEND\r\n", key.len());
        assert_eq!(String::from_utf8_lossy(&reply), value);
    }
    let stats = compared(&mut client, 30);
    assert_eq!(figure(&stats, "hit_hit"), 30, "{stats:?}");
    assert_eq!(figure(&stats, "mismatch"), 0, "{stats:?}");
}
