//! Hot keys against real memcached: `stats hotkeys` names the hottest keys of
//! a skewed workload, coalesced gets never return a value older than a write
//! the reader could know of, and the near cache drops a key on every write
//! through memring while writes that bypass memring are seen within its
//! staleness bound. A relay between memring and memcached holds back chosen
//! connections to show that a get never joins a request memcached may run
//! before its own client's write, and that a near-cached get never overtakes
//! its client's earlier read; pipelining readers check that one
//! connection's reads never go back in time.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{
    config_text, parse_single_value, show, wait_for, Client, Memcached, Proxy, TempDir, DEADLINE,
};
use memring::protocol::ReplyKind;

/// One line of `stats hotkeys`, by rank.
#[derive(Debug, Clone)]
struct Reported {
    key: String,
    server: String,
    rate: f64,
    share: f64,
}

fn hotkeys(client: &mut Client) -> Vec<Reported> {
    let stats = client.stats("hotkeys");
    let mut by_rank: HashMap<usize, Reported> = HashMap::new();
    for (name, value) in stats {
        let Some(rest) = name.strip_prefix("hotkey:") else {
            continue;
        };
        let (rank, field) = rest.split_once(':').unwrap();
        let entry = by_rank
            .entry(rank.parse().unwrap())
            .or_insert_with(|| Reported {
                key: String::new(),
                server: String::new(),
                rate: 0.0,
                share: 0.0,
            });
        match field {
            "key" => entry.key = value,
            "server" => entry.server = value,
            "rate" => entry.rate = value.parse().unwrap(),
            "share" => entry.share = value.parse().unwrap(),
            "error" => {}
            other => panic!("unexpected field {other}"),
        }
    }
    let mut ranks: Vec<usize> = by_rank.keys().copied().collect();
    ranks.sort_unstable();
    assert_eq!(ranks, (1..=ranks.len()).collect::<Vec<_>>(), "ranks 1..n");
    ranks.into_iter().map(|r| by_rank[&r].clone()).collect()
}

/// How `stats hotkeys` and `/metrics` name `key` unless `hot_key_metrics`
/// asks for names.
fn label(key: &str) -> String {
    format!("xxh3:{:016x}", memring::hotkeys::key_hash(key.as_bytes()))
}

/// xorshift64*: a deterministic generator for the workload.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Cumulative weights of Zipf(`s`) over `n` ranks.
fn zipf_cdf(n: usize, s: f64) -> Vec<f64> {
    let mut total = 0.0;
    let mut cdf = Vec::with_capacity(n);
    for rank in 1..=n {
        total += 1.0 / (rank as f64).powf(s);
        cdf.push(total);
    }
    cdf.iter().map(|c| c / total).collect()
}

#[test]
fn stats_hotkeys_names_the_hottest_keys_of_a_zipf_workload() {
    let servers: Vec<Memcached> = (0..4).map(|_| Memcached::start()).collect();
    let names: Vec<String> = servers.iter().map(Memcached::addr).collect();
    let proxy = Proxy::start(
        &servers.iter().collect::<Vec<_>>(),
        "workers = 2\nhot_key_window_ms = 1000\nhot_key_top = 20\nadmin_listen = \"127.0.0.1:0\"",
    );
    let mut admin = proxy.client();
    // Nothing counted yet: only the header lines.
    assert!(hotkeys(&mut admin).is_empty());

    let cdf = Arc::new(zipf_cdf(1000, 0.99));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let generators: Vec<_> = (0..4u64)
        .map(|seed| {
            let (cdf, stop) = (cdf.clone(), stop.clone());
            let mut client = proxy.client();
            std::thread::spawn(move || {
                let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (seed + 1));
                let mut counts = vec![0u64; cdf.len()];
                let mut batch = Vec::new();
                // Bounded in time whatever happens to the main thread.
                while !stop.load(Ordering::Relaxed) && started.elapsed() < DEADLINE {
                    batch.clear();
                    for _ in 0..50 {
                        let u = rng.unit();
                        let rank = cdf.partition_point(|&c| c < u).min(cdf.len() - 1);
                        counts[rank] += 1;
                        batch.extend_from_slice(format!("get key:{rank}\r\n").as_bytes());
                    }
                    client.send(&batch);
                    for _ in 0..50 {
                        client.reply(ReplyKind::Values);
                    }
                }
                counts
            })
        })
        .collect();

    // Two whole windows under load, then a report of at least 20 keys.
    wait_for("two windows of load", || {
        started.elapsed() > Duration::from_millis(2500)
    });
    let mut reported = Vec::new();
    wait_for("20 hot keys reported", || {
        reported = hotkeys(&mut admin);
        reported.len() >= 20
    });
    // The gauges follow the same windows, with hashed key names.
    let stats = proxy.running().stats.clone();
    wait_for("hot-key gauges", || {
        stats
            .prometheus_text()
            .contains("memring_hot_key_requests_per_second{")
    });
    let metrics = stats.prometheus_text();
    stop.store(true, Ordering::Relaxed);
    let mut counts = vec![0u64; cdf.len()];
    for generator in generators {
        for (total, n) in counts.iter_mut().zip(generator.join().unwrap()) {
            *total += n;
        }
    }

    assert_eq!(reported.len(), 20, "hot_key_top = 20");
    let mut ranks: Vec<usize> = (0..counts.len()).collect();
    ranks.sort_by_key(|&r| std::cmp::Reverse(counts[r]));
    let listed: Vec<&str> = reported.iter().map(|r| r.key.as_str()).collect();
    for &rank in &ranks[..10] {
        let key = label(&format!("key:{rank}"));
        assert!(
            listed.contains(&key.as_str()),
            "{key} ({} requests) not in memring's top 20: {listed:?}",
            counts[rank]
        );
    }
    for r in &reported {
        assert!(names.contains(&r.server), "{r:?}");
        assert!(r.share > 0.0 && r.share <= 1.0, "{r:?}");
        assert!(r.rate > 0.0, "{r:?}");
    }
    let rates: Vec<f64> = reported.iter().map(|r| r.rate).collect();
    assert!(rates.windows(2).all(|w| w[0] >= w[1]), "{rates:?}");
    // The hottest key takes about 13% of all requests, so about half of its
    // server's (four servers): far above any other key's share.
    assert!(reported[0].share > 0.2, "{:?}", reported[0]);

    assert!(
        metrics.contains("memring_hot_key_server_share{"),
        "{metrics}"
    );
    assert!(
        metrics.contains("key=\"xxh3:"),
        "key names are hashed by default"
    );
    assert!(
        !metrics.contains("key=\"key:"),
        "no key names without hot_key_metrics"
    );
}

#[test]
fn stats_hotkeys_hashes_key_names_as_metrics_do_unless_asked() {
    let server = Memcached::start();
    let key = "user:alice@example.com:profile";
    for names in [false, true] {
        let proxy = Proxy::start(
            &[&server],
            &format!("hot_key_window_ms = 200\nhot_key_metrics = {names}"),
        );
        let mut client = proxy.client();
        let mut other = proxy.client();
        let stats = proxy.running().stats.clone();
        let shown = if names { key.to_string() } else { label(key) };
        wait_for("the key in stats hotkeys and the gauges", || {
            for _ in 0..20 {
                client.get(key);
            }
            hotkeys(&mut other).first().map(|r| r.key.clone()) == Some(shown.clone())
                && stats
                    .prometheus_text()
                    .contains(&format!("key=\"{shown}\""))
        });
        other.send(b"stats hotkeys\r\n");
        let text = String::from_utf8(other.read_until_suffix(b"END\r\n")).unwrap();
        assert_eq!(text.contains("alice"), names, "{text}");
    }
}

#[test]
fn hot_key_metrics_names_keys_when_asked() {
    let server = Memcached::start();
    let proxy = Proxy::start(
        &[&server],
        "hot_key_window_ms = 200\nhot_key_metrics = true",
    );
    let mut client = proxy.client();
    let stats = proxy.running().stats.clone();
    wait_for("the named gauge", || {
        for _ in 0..20 {
            client.get("feature:flag");
        }
        stats.prometheus_text().contains("key=\"feature:flag\"")
    });
}

/// A hot key's gets are answered by the server, so no server error may be
/// counted for them: alerts on `memring_backend_errors_total` must stay quiet
/// on a healthy cluster, with coalescing on and off.
#[test]
fn gets_of_a_hot_key_count_no_server_errors() {
    for coalesce in ["true", "false"] {
        let server = Memcached::start();
        let proxy = Proxy::start(
            &[&server],
            &format!("hot_key_window_ms = 100\nhot_key_coalesce = {coalesce}"),
        );
        let mut client = proxy.client();
        assert_eq!(client.set("feature:flag", b"on"), b"STORED\r\n");
        wait_for("the key to be hot", || {
            for _ in 0..50 {
                assert_eq!(client.get("feature:flag").as_deref(), Some(&b"on"[..]));
            }
            hotkeys(&mut client)
                .iter()
                .any(|r| r.key == label("feature:flag"))
        });
        for _ in 0..2_000 {
            assert_eq!(client.get("feature:flag").as_deref(), Some(&b"on"[..]));
        }
        assert_eq!(
            proxy.running().stats.backend_errors(),
            0,
            "coalesce = {coalesce}: gets that all hit counted errors"
        );
        let stats = client.stats("");
        let errors: Vec<_> = stats
            .iter()
            .filter(|(name, _)| name.ends_with(":errors"))
            .collect();
        assert!(!errors.is_empty(), "stats names each server's errors");
        assert!(
            errors.iter().all(|(_, value)| value == "0"),
            "coalesce = {coalesce}: {errors:?}"
        );
    }
}

/// Asks for `key` (any bytes) with meta `mg <base64> b v`, which is how a
/// client gets a key with spaces, control or high bytes past the parser.
fn meta_get(client: &mut Client, key: &[u8]) {
    let line = format!("mg {} b v\r\n", memring::protocol::meta::encode_key(key));
    let reply = client.call(line.as_bytes(), ReplyKind::Line);
    assert!(
        reply == b"EN\r\n" || reply.starts_with(b"VA "),
        "{}",
        show(&reply)
    );
}

/// The key bytes a `stats hotkeys` key token or hot-key label names: the
/// token itself, or the base64 before a trailing ` b`, decoded as memcached
/// decodes `b` keys.
fn reported_key(token: &str) -> Vec<u8> {
    match token.strip_suffix(" b") {
        Some(base64) => memring::protocol::meta::decode_key(base64.as_bytes())
            .unwrap_or_else(|| panic!("not base64: {token:?}"))
            .to_vec(),
        None => token.as_bytes().to_vec(),
    }
}

#[test]
fn hot_keys_with_quotes_backslashes_and_newlines_keep_metrics_valid() {
    let server = Memcached::start();
    let proxy = Proxy::start(
        &[&server],
        "hot_key_window_ms = 200\nhot_key_metrics = true",
    );
    let mut client = proxy.client();
    let stats = proxy.running().stats.clone();
    let keys: [&[u8]; 4] = [
        b"say\"cheese\"",
        b"back\\slash\\",
        b"new\nline",
        b"\"} 1\nmemring_fake_total 7\n",
    ];
    let mut text = String::new();
    wait_for("every hot key in the gauges", || {
        for _ in 0..5 {
            for key in keys {
                meta_get(&mut client, key);
            }
        }
        text = stats.prometheus_text();
        let samples = crate::common::exposition::strict_samples(&text);
        let named: Vec<Vec<u8>> = samples
            .iter()
            .filter(|s| s.name == "memring_hot_key_requests_per_second")
            .filter_map(|s| s.label("key"))
            .map(reported_key)
            .collect();
        keys.iter().all(|k| named.contains(&k.to_vec()))
    });
    assert!(!text.contains("memring_fake_total"), "{text}");
    // Printable keys keep their name; the quote and backslash are escaped.
    assert!(text.contains(r#"key="say\"cheese\"""#), "{text}");
    assert!(text.contains(r#"key="back\\slash\\""#), "{text}");
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .expect("prometheus-parse reads it");
    let hot = scrape
        .samples
        .iter()
        .filter(|s| s.metric == "memring_hot_key_server_share")
        .count();
    assert_eq!(hot, keys.len(), "one share gauge per hot key: {text}");
    crate::common::exposition::promtool_check(&text);
}

#[test]
fn stats_hotkeys_prints_binary_keys_as_base64_and_cannot_be_injected() {
    let server = Memcached::start();
    let proxy = Proxy::start(
        &[&server],
        "hot_key_window_ms = 200\nhot_key_metrics = true",
    );
    let mut client = proxy.client();
    let mut admin = proxy.client();
    let injecting = b"\r\nEND\r\nSTAT injected 1\r\n";
    let high_a = [b'k', 0xff];
    let high_b = [b'k', 0xfe];
    let keys: [&[u8]; 3] = [injecting, &high_a, &high_b];
    let mut reported = Vec::new();
    wait_for("the three keys in stats hotkeys", || {
        for _ in 0..5 {
            for key in keys {
                meta_get(&mut client, key);
            }
        }
        admin.send(b"stats hotkeys\r\n");
        let text = String::from_utf8(admin.read_until_suffix(b"END\r\n")).unwrap();
        // The whole reply up to its one END: only STAT lines.
        for line in text.split_terminator("\r\n") {
            assert!(line.starts_with("STAT hotkey"), "{line:?} in {text:?}");
        }
        assert!(!text.contains("injected"), "{text:?}");
        assert_eq!(
            admin.call(b"version\r\n", ReplyKind::Line)[..8],
            b"VERSION "[..],
            "the reply ended where it said"
        );
        reported = text
            .split_terminator("\r\n")
            .filter_map(|l| l.strip_prefix("STAT hotkey:"))
            .filter_map(|l| l.split_once(":key "))
            .map(|(_, token)| token.to_string())
            .collect();
        reported.len() == keys.len()
    });
    for key in keys {
        let token = reported
            .iter()
            .find(|t| reported_key(t) == key)
            .unwrap_or_else(|| panic!("{key:?} not reported: {reported:?}"));
        assert!(token.ends_with(" b"), "{token:?}");
        assert_eq!(token.matches(' ').count(), 1, "{token:?}");
    }
    let (a, b) = (
        memring::protocol::meta::encode_key(&high_a),
        memring::protocol::meta::encode_key(&high_b),
    );
    assert!(reported.contains(&format!("{a} b")), "{reported:?}");
    assert!(reported.contains(&format!("{b} b")), "{reported:?}");
    assert_ne!(a, b);
}

fn value_of(reply: &[u8]) -> Option<Vec<u8>> {
    parse_single_value(reply).unwrap_or_else(|| panic!("unexpected reply {}", show(reply)))
}

fn seq_of(value: Option<Vec<u8>>) -> u64 {
    value.map_or(0, |v| String::from_utf8(v).unwrap().parse().unwrap())
}

/// One writer stores increasing numbers in `hot` and reads each back (after
/// its reply, pipelined behind it, and after a `noreply`), while readers on
/// both workers hammer `hot`: no read may return a number older than one
/// stored before it was sent. Runs until `counter` reached 200; returns it.
/// With `moved`, the key is one that a second server's join moves, and the
/// test runs within the join's hand-off window (the key stored before it):
/// every write then goes through the hand-off.
fn reads_follow_writes(settings: &str, counter_name: &str, moved: bool) -> u64 {
    let servers = [Memcached::start(), Memcached::start()];
    // Two workers, two connections per server: the readers and the writer
    // are spread over both workers and over different connections, so a get
    // can overtake a write on its way to memcached.
    let settings =
        format!("workers = 2\nconnections_per_server = 2\nhot_key_window_ms = 100\n{settings}");
    let dir = TempDir::new(
        "hotkeys",
        &format!("reads-follow-writes-{counter_name}-{moved}"),
    );
    let path = dir.path("memring.toml");
    std::fs::write(&path, config_text(&[&servers[0]], &settings)).unwrap();
    let proxy = Proxy::start_file(&path);
    let mut setup = proxy.client();
    // A key the second server takes, when asked for one.
    let key: &'static str = if moved {
        let both = |key: &str| {
            let config = memring::config::Config::parse(
                &config_text(&[&servers[0], &servers[1]], &settings),
                "t.toml",
            )
            .unwrap();
            let ring = memring::ring::Ring::build(config.members());
            ring.members()[ring.owner(key.as_bytes()).unwrap()]
                .identity
                .clone()
        };
        let second = memring::config::Config::parse(&config_text(&[&servers[1]], ""), "t.toml")
            .unwrap()
            .members()[0]
            .identity
            .clone();
        let name = (0..100)
            .map(|i| format!("hot{i}"))
            .find(|k| both(k) == second)
            .unwrap();
        Box::leak(name.into_boxed_str())
    } else {
        "hot"
    };
    assert_eq!(setup.set(key, b"0"), b"STORED\r\n");
    if moved {
        let version = proxy.ring_version();
        crate::common::replace_by_rename(
            &path,
            &config_text(&[&servers[0], &servers[1]], &settings),
        );
        wait_for("the second server's join", || {
            proxy.ring_version() > version
        });
        assert!(setup.stat("handoff_until") > 0, "a hand-off window");
    }
    // The last value the writer knows stored.
    let acked = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let running =
        move |stop: &AtomicBool| !stop.load(Ordering::Relaxed) && started.elapsed() < DEADLINE;

    // Readers keep `hot` hot and their gets in flight, pipelined.
    let readers: Vec<_> = (0..6)
        .map(|_| {
            let (stop, acked) = (stop.clone(), acked.clone());
            let mut client = proxy.client();
            std::thread::spawn(move || {
                let mut checked = 0u64;
                while running(&stop) {
                    // Any get sent after the writer's acknowledgement must
                    // see that write or a later one.
                    let floor = acked.load(Ordering::SeqCst);
                    client.send(format!("get {key}\r\nget {key}\r\nget {key}\r\n").as_bytes());
                    for _ in 0..3 {
                        let seq = seq_of(value_of(&client.reply(ReplyKind::Values)));
                        assert!(seq >= floor, "read {seq} after {floor} was stored");
                        checked += 1;
                    }
                }
                checked
            })
        })
        .collect();

    let mut writer = proxy.client();
    let mut seq = 0u64;
    let mut coalesced = 0;
    while running(&stop) {
        for _ in 0..50 {
            seq += 1;
            let value = seq.to_string();
            match seq % 4 {
                // Write, wait for STORED, then read on the same connection.
                0 => {
                    assert_eq!(writer.set(key, value.as_bytes()), b"STORED\r\n");
                    acked.store(seq, Ordering::SeqCst);
                    let got = seq_of(value_of(&writer.get_raw(key)));
                    assert_eq!(got, seq, "the writer's own read");
                }
                // Write and read pipelined in one packet.
                1 => {
                    writer.send(
                        format!("set {key} 0 0 {}\r\n{value}\r\nget {key}\r\n", value.len())
                            .as_bytes(),
                    );
                    assert_eq!(writer.reply(ReplyKind::Line), b"STORED\r\n");
                    acked.store(seq, Ordering::SeqCst);
                    let got = seq_of(value_of(&writer.reply(ReplyKind::Values)));
                    assert_eq!(got, seq, "a read pipelined after a write");
                }
                // A meta set and a read pipelined in one packet.
                2 => {
                    writer.send(
                        format!("ms {key} {}\r\n{value}\r\nget {key}\r\n", value.len()).as_bytes(),
                    );
                    assert_eq!(writer.reply(ReplyKind::Line), b"HD\r\n");
                    acked.store(seq, Ordering::SeqCst);
                    let got = seq_of(value_of(&writer.reply(ReplyKind::Values)));
                    assert_eq!(got, seq, "a read pipelined after a meta write");
                }
                // `noreply`, then a read: memcached's order on one
                // connection says the read sees it.
                _ => {
                    writer.send(
                        format!(
                            "set {key} 0 0 {} noreply\r\n{value}\r\nget {key}\r\n",
                            value.len()
                        )
                        .as_bytes(),
                    );
                    let got = seq_of(value_of(&writer.reply(ReplyKind::Values)));
                    assert_eq!(got, seq, "a read after a noreply write");
                    acked.store(seq, Ordering::SeqCst);
                }
            }
        }
        coalesced = setup.stat(counter_name);
        if coalesced >= 200 && seq >= 600 {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let checked: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
    assert!(
        coalesced >= 200,
        "{counter_name} must grow for this test to mean anything: {coalesced}, {seq} writes, {checked} reads"
    );
    // Every coalesced get is counted against its server too (all traffic has
    // stopped: the figures no longer move).
    let stats: HashMap<String, String> = setup.stats("").into_iter().collect();
    let per_server: u64 = stats
        .iter()
        .filter(|(k, _)| k.starts_with("server:") && k.ends_with(":coalesced_gets"))
        .map(|(_, v)| v.parse::<u64>().unwrap())
        .sum();
    assert_eq!(per_server.to_string(), stats["hot_key_coalesced_gets"]);
    coalesced
}

/// Coalescing × hand-off: the same, on a key a join moved, within the
/// join's hand-off window.
#[test]
fn coalesced_gets_of_a_moved_key_never_miss_a_write() {
    reads_follow_writes("", "hot_key_coalesced_gets", true);
}

/// Near cache × hand-off: the same, on a key a join moved.
#[test]
fn near_cached_gets_of_a_moved_key_never_miss_a_write() {
    reads_follow_writes("hot_key_cache_ms = 60000", "near_cache_hits", true);
}

#[test]
fn coalesced_gets_never_miss_a_write_the_reader_could_know_of() {
    reads_follow_writes("", "hot_key_coalesced_gets", false);
}

#[test]
fn near_cached_gets_never_miss_a_write_through_memring() {
    // A long life: every fresh read after a write is the invalidation's doing.
    reads_follow_writes("hot_key_cache_ms = 60000", "near_cache_hits", false);
}

#[test]
fn near_cache_drops_a_key_on_every_write_through_memring() {
    let server = Memcached::start();
    // A long life: only invalidation can make these reads fresh.
    let proxy = Proxy::start(
        &[&server],
        "hot_key_window_ms = 500\nhot_key_cache_ms = 60000",
    );
    let mut client = proxy.client();
    let mut admin = proxy.client();
    let mut direct = server.client();
    let key = "cfg";
    assert_eq!(client.set(key, b"1"), b"STORED\r\n");

    // Each case: the key cached, its value changed behind memring's back,
    // then one command through memring; the next read must come from the
    // server. (name, command, its reply, the value then expected).
    let cases: [(&str, String, ReplyKind, Option<&[u8]>); 14] = [
        (
            "set",
            "set cfg 0 0 1\r\n7\r\n".into(),
            ReplyKind::Line,
            Some(b"7"),
        ),
        (
            "set noreply",
            "set cfg 0 0 1 noreply\r\n8\r\n".into(),
            ReplyKind::Line,
            Some(b"8"),
        ),
        (
            "touch",
            "touch cfg 0\r\n".into(),
            ReplyKind::Line,
            Some(b"direct"),
        ),
        (
            "incr",
            "incr cfg 5\r\n".into(),
            ReplyKind::Line,
            Some(b"15"),
        ),
        (
            "append",
            "append cfg 0 0 1\r\nx\r\n".into(),
            ReplyKind::Line,
            Some(b"directx"),
        ),
        (
            "gat",
            "gat 0 cfg\r\n".into(),
            ReplyKind::Values,
            Some(b"direct"),
        ),
        ("delete", "delete cfg\r\n".into(), ReplyKind::Line, None),
        (
            "add",
            "add cfg 0 0 1\r\n9\r\n".into(),
            ReplyKind::Line,
            Some(b"direct"),
        ),
        ("flush_all", "flush_all\r\n".into(), ReplyKind::Line, None),
        (
            "ms",
            "ms cfg 1\r\n6\r\n".into(),
            ReplyKind::Line,
            Some(b"6"),
        ),
        // `Y2Zn` is `cfg` in base64.
        (
            "ms b",
            "ms Y2Zn 1 b\r\n5\r\n".into(),
            ReplyKind::Line,
            Some(b"5"),
        ),
        ("md", "md cfg\r\n".into(), ReplyKind::Line, None),
        ("ma", "ma cfg\r\n".into(), ReplyKind::Line, Some(b"11")),
        (
            "mg T",
            "mg cfg T0\r\n".into(),
            ReplyKind::Line,
            Some(b"direct"),
        ),
    ];
    for (name, command, kind, expected) in cases {
        assert_eq!(client.set(key, b"1"), b"STORED\r\n");
        let cached = crate::common::get_until_near_cached(&mut client, &mut admin, key);
        assert_eq!(cached.as_deref(), Some(&b"1"[..]), "{name}");
        let behind = if name == "incr" || name == "ma" {
            &b"10"[..]
        } else {
            b"direct"
        };
        assert_eq!(direct.set(key, behind), b"STORED\r\n");
        // Still cached: the near cache does not see writes that bypass it.
        assert_eq!(client.get(key).as_deref(), Some(&b"1"[..]), "{name}");
        client.send(command.as_bytes());
        if !command.contains("noreply") {
            let reply = client.reply(kind);
            assert!(
                !reply.starts_with(b"SERVER_ERROR"),
                "{name}: {}",
                show(&reply)
            );
        }
        assert_eq!(client.get(key).as_deref(), expected, "after {name}");
    }
    assert!(admin.stat("near_cache_misses") > 0);
}

#[test]
fn a_hot_keys_stored_value_answers_the_next_get_without_a_round_trip() {
    let server = Memcached::start();
    let proxy = Proxy::start(
        &[&server],
        "hot_key_window_ms = 1000\nhot_key_cache_ms = 60000",
    );
    let mut client = proxy.client();
    let mut admin = proxy.client();
    let mut direct = server.client();
    assert_eq!(client.set("cfg", b"1"), b"STORED\r\n");
    // (write, what a get then answers, whether memcached is asked)
    let cases: [(&[u8], &[u8], bool); 4] = [
        (
            b"set cfg 0 0 1\r\n2\r\n",
            b"VALUE cfg 0 1\r\n2\r\nEND\r\n",
            false,
        ),
        (
            b"set cfg 05 0 1\r\n3\r\n",
            b"VALUE cfg 5 1\r\n3\r\nEND\r\n",
            false,
        ),
        // An expiring value is not kept: memcached may drop it first.
        (
            b"set cfg 0 100 1\r\n4\r\n",
            b"VALUE cfg 0 1\r\n4\r\nEND\r\n",
            true,
        ),
        // Not stored: the cache keeps nothing from it.
        (
            b"add cfg 0 0 1\r\n5\r\n",
            b"VALUE cfg 0 1\r\n4\r\nEND\r\n",
            true,
        ),
    ];
    for (write, expected, asks_server) in cases {
        // One try: the key cached, the write, then a get. A loaded machine
        // can stall long enough for the key to cool off between the write
        // and the get (its value then comes from memcached), so a case that
        // must not ask memcached is tried until one try shows it.
        let mut attempt = || {
            crate::common::get_until_near_cached(&mut client, &mut admin, "cfg");
            let gets_before = direct.stat("cmd_get");
            client.send(write);
            client.reply(ReplyKind::Line);
            assert_eq!(client.get_raw("cfg"), expected, "{}", show(write));
            direct.stat("cmd_get") > gets_before
        };
        if asks_server {
            assert!(attempt(), "{}", show(write));
        } else {
            wait_for(&format!("{} answered from memory", show(write)), || {
                !attempt()
            });
        }
    }
}

#[test]
fn a_reload_turns_the_near_cache_on_and_off() {
    let dir = TempDir::new("hotkeys", "reload");
    let server = Memcached::start();
    let path = dir.path("memring.toml");
    let text = config_text(&[&server], "hot_key_window_ms = 200");
    std::fs::write(&path, &text).unwrap();
    let proxy = Proxy::start_file(&path);
    let mut client = proxy.client();
    let mut admin = proxy.client();
    let mut direct = server.client();
    assert_eq!(client.set("flag", b"1"), b"STORED\r\n");
    wait_for("flag reported hot", || {
        for _ in 0..40 {
            client.get("flag");
        }
        hotkeys(&mut admin).first().map(|r| r.key.clone()) == Some(label("flag"))
    });
    assert_eq!(admin.stat("near_cache_hits"), 0);

    let on = text.replace(
        "hot_key_window_ms = 200",
        "hot_key_window_ms = 200\nhot_key_cache_ms = 60000",
    );
    std::fs::write(&path, on).unwrap();
    // Cached: a write behind memring's back is not seen (tried again if the
    // key cooled off in between on a slow machine)...
    let mut behind = String::new();
    wait_for("a write behind memring's back hidden", || {
        let cached = crate::common::get_until_near_cached(&mut client, &mut admin, "flag");
        behind = format!("{}x", String::from_utf8_lossy(cached.as_deref().unwrap()));
        assert_eq!(direct.set("flag", behind.as_bytes()), b"STORED\r\n");
        client.get("flag") == cached
    });

    // ...until the cache is turned off again.
    std::fs::write(&path, &text).unwrap();
    wait_for("the near cache off", || {
        client.get("flag").as_deref() == Some(behind.as_bytes())
    });
}

#[test]
fn near_cache_sees_writes_that_bypass_it_within_its_life() {
    let server = Memcached::start();
    let proxy = Proxy::start(
        &[&server],
        "hot_key_window_ms = 100\nhot_key_cache_ms = 300",
    );
    let mut client = proxy.client();
    let mut admin = proxy.client();
    let mut direct = server.client();
    assert_eq!(client.set("flag", b"old"), b"STORED\r\n");
    crate::common::get_until_near_cached(&mut client, &mut admin, "flag");
    assert_eq!(direct.set("flag", b"new"), b"STORED\r\n");
    let changed = Instant::now();
    wait_for("the new value through memring", || {
        client.get("flag").as_deref() == Some(&b"new"[..])
    });
    // At most the entry's life, plus the machine's slowness.
    let seen = changed.elapsed();
    assert!(
        seen < Duration::from_millis(300) + Duration::from_secs(3),
        "{seen:?}"
    );
}

#[test]
fn without_a_near_cache_nothing_is_cached() {
    let server = Memcached::start();
    let proxy = Proxy::start(&[&server], "hot_key_window_ms = 100");
    let mut client = proxy.client();
    let mut admin = proxy.client();
    let mut direct = server.client();
    assert_eq!(client.set("plain", b"1"), b"STORED\r\n");
    // The key is hot all the same.
    wait_for("plain reported hot", || {
        for _ in 0..40 {
            client.get("plain");
        }
        hotkeys(&mut admin).first().map(|r| r.key.clone()) == Some(label("plain"))
    });
    assert_eq!(direct.set("plain", b"2"), b"STORED\r\n");
    assert_eq!(client.get("plain").as_deref(), Some(&b"2"[..]));
    assert_eq!(admin.stat("near_cache_hits"), 0);
}

/// A TCP relay between memring and one real memcached that can hold back
/// what memring sends on any one of its connections, so that a test decides
/// in which order memcached sees two connections' requests. Every thread it
/// starts polls a stop flag and is joined when it drops.
struct Relay {
    port: u16,
    conns: Arc<Mutex<Vec<Arc<RelayConn>>>>,
    stop: Arc<AtomicBool>,
    threads: Arc<Mutex<Vec<std::thread::JoinHandle<()>>>>,
}

/// One relayed connection: whether its requests are held back, and every
/// byte memring sent on it.
#[derive(Default)]
struct RelayConn {
    held: AtomicBool,
    sent: Mutex<Vec<u8>>,
}

const RELAY_POLL: Duration = Duration::from_millis(5);

impl Relay {
    fn start(upstream: &str) -> Relay {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let relay = Relay {
            port,
            conns: Arc::default(),
            stop: Arc::default(),
            threads: Arc::default(),
        };
        let (conns, stop, threads) = (
            relay.conns.clone(),
            relay.stop.clone(),
            relay.threads.clone(),
        );
        let upstream = upstream.to_string();
        let accept = std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let Ok((client, _)) = listener.accept() else {
                    std::thread::sleep(RELAY_POLL);
                    continue;
                };
                let server = TcpStream::connect(&upstream).unwrap();
                let conn = Arc::new(RelayConn::default());
                conns.lock().unwrap().push(conn.clone());
                let up = relay_half(client.try_clone().unwrap(), server.try_clone().unwrap());
                let down = relay_half(server, client);
                let (stop_up, stop_down) = (stop.clone(), stop.clone());
                let mut threads = threads.lock().unwrap();
                threads.push(std::thread::spawn(move || up(&stop_up, Some(&conn))));
                threads.push(std::thread::spawn(move || down(&stop_down, None)));
            }
        });
        relay.threads.lock().unwrap().push(accept);
        relay
    }

    fn conn(&self, index: usize) -> Arc<RelayConn> {
        self.conns.lock().unwrap()[index].clone()
    }

    /// How many times each connection has carried `needle` so far.
    fn counts(&self, needle: &[u8]) -> Vec<usize> {
        self.conns
            .lock()
            .unwrap()
            .iter()
            .map(|c| {
                let sent = c.sent.lock().unwrap();
                sent.windows(needle.len()).filter(|w| *w == needle).count()
            })
            .collect()
    }

    /// The connection that carries what `request` makes memring send
    /// (`needle`).
    fn conn_carrying(&self, needle: &[u8], request: impl FnOnce()) -> usize {
        let before = self.counts(needle);
        request();
        let mut found = None;
        wait_for("the relayed request", || {
            let now = self.counts(needle);
            found = (0..now.len()).find(|&i| now[i] > before.get(i).copied().unwrap_or(0));
            found.is_some()
        });
        found.unwrap()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let threads = std::mem::take(&mut *self.threads.lock().unwrap());
        for thread in threads {
            let _ = thread.join();
        }
    }
}

/// Copies `from` to `to` until either closes or `stop`; with `conn`, records
/// what passes and keeps it back while `conn` is held.
fn relay_half(
    mut from: TcpStream,
    mut to: TcpStream,
) -> impl FnOnce(&AtomicBool, Option<&RelayConn>) {
    move |stop, conn| {
        from.set_read_timeout(Some(RELAY_POLL)).unwrap();
        let mut waiting = Vec::new();
        let mut buf = [0u8; 16384];
        while !stop.load(Ordering::Relaxed) {
            match from.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => {
                    if let Some(conn) = conn {
                        conn.sent.lock().unwrap().extend_from_slice(&buf[..n]);
                    }
                    waiting.extend_from_slice(&buf[..n]);
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(_) => return,
            }
            if !conn.is_some_and(|c| c.held.load(Ordering::SeqCst)) && !waiting.is_empty() {
                if to.write_all(&waiting).is_err() {
                    return;
                }
                waiting.clear();
            }
        }
    }
}

#[test]
fn a_get_never_joins_a_request_its_clients_write_could_be_overtaken_by() {
    let server = Memcached::start();
    let relay = Relay::start(&server.addr());
    // One worker, two connections to the server: the writer and the reader
    // use different ones, so memcached may run the reader's requests before
    // the writer's.
    let proxy = Proxy::start_text(&format!(
        "listen = \"127.0.0.1:0\"\nworkers = 1\nconnections_per_server = 2\n\
         hot_key_window_ms = 1000\n[[servers]]\naddr = \"127.0.0.1:{}\"\n",
        relay.port
    ));
    let mut writer = proxy.client();
    let mut reader = proxy.client();
    let mut admin = proxy.client();
    assert_eq!(writer.set("k", b"old"), b"STORED\r\n");
    wait_for("k reported hot", || {
        for _ in 0..40 {
            reader.get("k");
        }
        hotkeys(&mut admin).first().map(|r| r.key.clone()) == Some(label("k"))
    });
    let get = b"get k\r\n";
    let writer_conn = relay.conn_carrying(get, || assert!(writer.get("k").is_some()));
    let reader_conn = relay.conn_carrying(get, || assert!(reader.get("k").is_some()));
    assert_ne!(writer_conn, reader_conn, "the clients share a connection");
    let (writer_conn, reader_conn) = (relay.conn(writer_conn), relay.conn(reader_conn));
    let carried = |conn: &RelayConn, needle: &[u8]| {
        let sent = conn.sent.lock().unwrap();
        sent.windows(needle.len()).filter(|w| *w == needle).count()
    };

    // The writer's set waits in the relay; then the reader's get of the hot
    // key goes out (held too), then the writer's own get.
    writer_conn.held.store(true, Ordering::SeqCst);
    reader_conn.held.store(true, Ordering::SeqCst);
    writer.send(b"set k 0 0 3\r\nnew\r\n");
    wait_for("the set relayed", || {
        carried(&writer_conn, b"\r\nnew\r\n") == 1
    });
    let reader_gets = carried(&reader_conn, get);
    reader.send(get);
    wait_for("the reader's get relayed", || {
        carried(&reader_conn, get) > reader_gets
    });
    let writer_gets = carried(&writer_conn, get);
    let joined = admin.stat("hot_key_coalesced_gets");
    writer.send(get);
    wait_for("the writer's get sent or joined", || {
        carried(&writer_conn, get) > writer_gets || admin.stat("hot_key_coalesced_gets") > joined
    });

    // memcached runs the reader's get first: it sees the old value, which is
    // right for a get concurrent with another client's unanswered write...
    reader_conn.held.store(false, Ordering::SeqCst);
    let seen = value_of(&reader.reply(ReplyKind::Values));
    assert_eq!(seen.as_deref(), Some(&b"old"[..]));
    // ...but not for the writer, whose get came after its own set.
    writer_conn.held.store(false, Ordering::SeqCst);
    assert_eq!(writer.reply(ReplyKind::Line), b"STORED\r\n");
    let own = value_of(&writer.reply(ReplyKind::Values));
    assert_eq!(own.as_deref(), Some(&b"new"[..]), "the writer's own read");
}

/// The value of a one-value reply to `get`, `gets` or `mg … v`.
fn read_value(client: &mut Client, meta: bool) -> Vec<u8> {
    if !meta {
        return value_of(&client.reply(ReplyKind::Values)).expect("a hit");
    }
    let reply = client.meta_reply();
    let line_end = reply.windows(2).position(|w| w == b"\r\n").unwrap();
    assert!(reply.starts_with(b"VA "), "{}", show(&reply));
    reply[line_end + 2..reply.len() - 2].to_vec()
}

/// One worker with two connections to one memcached behind a relay, and
/// two clients that memring sends on different ones, with a key hot.
struct TwoLanes {
    server: Memcached,
    _relay: Relay,
    _proxy: Proxy,
    first: Client,
    second: Client,
    /// The relayed connections `first` and `second` use.
    first_conn: Arc<RelayConn>,
    second_conn: Arc<RelayConn>,
    admin: Client,
}

impl TwoLanes {
    fn start(settings: &str, key: &str) -> TwoLanes {
        let server = Memcached::start();
        let relay = Relay::start(&server.addr());
        let proxy = Proxy::start_text(&format!(
            "listen = \"127.0.0.1:0\"\nworkers = 1\nconnections_per_server = 2\n{settings}\n\
             [[servers]]\naddr = \"127.0.0.1:{}\"\n",
            relay.port
        ));
        let mut first = proxy.client();
        let mut second = proxy.client();
        let mut admin = proxy.client();
        assert_eq!(first.set(key, b"1"), b"STORED\r\n");
        wait_for(&format!("{key} reported hot"), || {
            for _ in 0..40 {
                second.get(key);
            }
            hotkeys(&mut admin).first().map(|r| r.key.clone()) == Some(label(key))
        });
        // `gets`: never answered from the near cache.
        let gets = format!("gets {key}\r\n");
        let on_server = |client: &mut Client| {
            relay.conn_carrying(gets.as_bytes(), || {
                assert!(value_of(&client.call(gets.as_bytes(), ReplyKind::Values)).is_some());
            })
        };
        let (first_at, second_at) = (on_server(&mut first), on_server(&mut second));
        assert_ne!(first_at, second_at, "the clients share a connection");
        TwoLanes {
            first_conn: relay.conn(first_at),
            second_conn: relay.conn(second_at),
            server,
            _relay: relay,
            _proxy: proxy,
            first,
            second,
            admin,
        }
    }
}

/// How many times `conn` has carried `needle`.
fn carried(conn: &RelayConn, needle: &[u8]) -> usize {
    let sent = conn.sent.lock().unwrap();
    sent.windows(needle.len()).filter(|w| *w == needle).count()
}

/// A client reads `k` (a request the near cache does not answer, held on its
/// way to memcached), then `get k`, which the near cache could answer at
/// once; another client's write lands in between. memcached would run the
/// second read after the first on one connection, so it may not be older.
#[test]
fn a_near_cached_get_never_overtakes_an_earlier_read_of_its_client() {
    let TwoLanes {
        first: mut writer,
        second: mut reader,
        second_conn: reader_conn,
        first_conn: writer_conn,
        mut admin,
        // Bound, so that they live to the end of the test.
        server: _server,
        _relay,
        _proxy,
        ..
    } = TwoLanes::start("hot_key_window_ms = 1000\nhot_key_cache_ms = 60000", "k");
    let mut version = 1u64;
    // (the earlier read, what memring sends for it, whether it is meta)
    let cases: [(&[u8], &[u8], bool); 3] = [
        (b"gets k\r\n", b"gets k\r\n", false),
        (b"get x k\r\n", b"get x k\r\n", false),
        (b"mg k v\r\n", b"mg k v", true),
    ];
    for (earlier, sent, meta) in cases {
        let name = show(earlier);
        version += 1;
        let value = version.to_string();
        assert_eq!(writer.set("k", value.as_bytes()), b"STORED\r\n");
        let cached = crate::common::get_until_near_cached(&mut reader, &mut admin, "k");
        assert_eq!(cached, Some(value.clone().into_bytes()), "{name}");

        reader_conn.held.store(true, Ordering::SeqCst);
        let (hits, sent_before, gets) = (
            admin.stat("near_cache_hits"),
            carried(&reader_conn, sent),
            carried(&reader_conn, b"get k\r\n"),
        );
        reader.send(&[earlier, b"get k\r\n"].concat());
        wait_for(
            "the earlier read relayed, the later one answered or sent",
            || {
                carried(&reader_conn, sent) > sent_before
                    && (admin.stat("near_cache_hits") > hits
                        || carried(&reader_conn, b"get k\r\n") > gets)
            },
        );
        version += 1;
        let newer = version.to_string();
        assert_eq!(writer.set("k", newer.as_bytes()), b"STORED\r\n");
        let set = format!("set k 0 0 {}\r\n{newer}\r\n", newer.len());
        assert_eq!(
            carried(&writer_conn, set.as_bytes()),
            1,
            "past the held read"
        );
        reader_conn.held.store(false, Ordering::SeqCst);

        let first = read_value(&mut reader, meta);
        let second = read_value(&mut reader, false);
        assert_eq!(
            first,
            newer.as_bytes(),
            "{name}: memcached ran it after the write"
        );
        assert_eq!(
            String::from_utf8_lossy(&second),
            newer,
            "{name}: the later get went back to an older value"
        );
    }
}

/// A client's `get k` joins another client's request held on the other
/// connection; then the client's own read and write go out on its own
/// connection and memcached runs them first. The joined get would answer
/// with the value of the client's own later write.
#[test]
fn a_get_never_joins_a_request_its_clients_later_requests_could_overtake() {
    let TwoLanes {
        server,
        first: mut other,
        first_conn: other_conn,
        second: mut client,
        second_conn: client_conn,
        _relay,
        _proxy,
        ..
    } = TwoLanes::start("hot_key_window_ms = 1000", "k");
    other_conn.held.store(true, Ordering::SeqCst);
    let others = carried(&other_conn, b"get k\r\n");
    other.send(b"get k\r\n");
    wait_for("the other client's get relayed", || {
        carried(&other_conn, b"get k\r\n") > others
    });
    let reads = carried(&client_conn, b"get k x\r\n");
    client.send(b"get k\r\nget k x\r\n");
    wait_for("the client's second read relayed", || {
        carried(&client_conn, b"get k x\r\n") > reads
    });
    client.send(b"set k 0 0 1\r\n2\r\n");
    let mut direct = server.client();
    wait_for("the client's write at memcached", || {
        direct.get("k").as_deref() == Some(&b"2"[..])
    });
    other_conn.held.store(false, Ordering::SeqCst);
    assert!(value_of(&other.reply(ReplyKind::Values)).is_some());

    let first = read_value(&mut client, false);
    let second = read_value(&mut client, false);
    assert_eq!(client.reply(ReplyKind::Line), b"STORED\r\n");
    assert_eq!(
        (&first[..], &second[..]),
        (&b"1"[..], &b"1"[..]),
        "reads before the client's own write of 2"
    );
}

/// One writer stores increasing numbers in a hot, near-cached key as fast
/// as it can while pipelining readers on both workers read it in batches:
/// within each reader's connection the numbers never go down.
#[test]
fn near_cached_reads_never_go_back_on_one_connection() {
    const BATCH: usize = 20;
    let server = Memcached::start();
    let proxy = Proxy::start(
        &[&server],
        "workers = 2\nconnections_per_server = 2\nhot_key_window_ms = 100\n\
         hot_key_cache_ms = 60000",
    );
    let mut admin = proxy.client();
    assert_eq!(admin.set("hot", b"0"), b"STORED\r\n");
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let stop = stop.clone();
            let mut client = proxy.client();
            std::thread::spawn(move || {
                let batch = b"get hot\r\n".repeat(BATCH);
                let (mut last, mut reads) = (0u64, 0u64);
                while !stop.load(Ordering::Relaxed) && started.elapsed() < DEADLINE {
                    client.send(&batch);
                    for _ in 0..BATCH {
                        let seq = seq_of(value_of(&client.reply(ReplyKind::Values)));
                        assert!(seq >= last, "read {seq} after {last} on one connection");
                        last = seq;
                        reads += 1;
                    }
                }
                reads
            })
        })
        .collect();
    let mut writer = proxy.client();
    let mut seq = 0u64;
    while started.elapsed() < Duration::from_secs(3) && !readers.iter().any(|r| r.is_finished()) {
        seq += 1;
        assert_eq!(writer.set("hot", seq.to_string().as_bytes()), b"STORED\r\n");
    }
    stop.store(true, Ordering::Relaxed);
    let reads: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
    let hits = admin.stat("near_cache_hits");
    assert!(
        hits > 0,
        "no read came from the near cache: {reads} reads, {seq} writes"
    );
}

/// A worker busy enough counts only a sample of its requests (see
/// `hotkeys::detect`): `stats hotkeys` says so, its hot key still leads with
/// about its true share, and its gets are still coalesced.
#[test]
fn a_busy_worker_counts_a_sample_and_still_finds_its_hot_key() {
    let server = Memcached::start();
    // Long windows, so that even a slow debug build on a loaded machine
    // passes the 8 192 requests per window that start the sampling.
    let proxy = Proxy::start(&[&server], "workers = 1\nhot_key_window_ms = 3000");
    let mut admin = proxy.client();
    let mut loader = proxy.client();
    loader.send(b"set hot 0 0 1\r\nh\r\n");
    assert_eq!(loader.reply(ReplyKind::Line), b"STORED\r\n");
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let generator = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let (mut batch, mut i) = (Vec::new(), 0u64);
            while !stop.load(Ordering::Relaxed) && started.elapsed() < 3 * DEADLINE {
                batch.clear();
                // One get in ten is of `hot`; the others each of a new key.
                for _ in 0..100 {
                    i += 1;
                    match i % 10 {
                        0 => batch.extend_from_slice(b"get hot\r\n"),
                        _ => batch.extend_from_slice(format!("get cold:{i}\r\n").as_bytes()),
                    }
                }
                loader.send(&batch);
                for _ in 0..100 {
                    loader.reply(ReplyKind::Values);
                }
            }
        })
    };
    let mut stats = Vec::new();
    let sampled = |stats: &[(String, String)]| {
        stats
            .iter()
            .find(|(name, _)| name == "hotkeys_sampled_one_in")
            .map(|(_, value)| value.parse::<u64>().unwrap())
    };
    // Two windows: the first counts every request, the next a sample.
    wait_for("a sampled window", || {
        stats = admin.stats("hotkeys");
        sampled(&stats).is_some_and(|n| n > 1)
    });
    let reported = hotkeys(&mut admin);
    let coalesced_before = admin.stat("hot_key_coalesced_gets");
    // Then clients that each read `hot` one get at a time: what coalescing
    // joins.
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let (stop, mut client) = (stop.clone(), proxy.client());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) && started.elapsed() < 3 * DEADLINE {
                    client.send(b"get hot\r\n");
                    assert_eq!(
                        client.reply(ReplyKind::Values),
                        b"VALUE hot 0 1\r\nh\r\nEND\r\n"
                    );
                }
            })
        })
        .collect();
    // Under the sample, gets of `hot` are coalesced.
    wait_for("coalesced gets under sampling", || {
        admin.stat("hot_key_coalesced_gets") > coalesced_before
    });
    stop.store(true, Ordering::Relaxed);
    generator.join().unwrap();
    for reader in readers {
        reader.join().unwrap();
    }

    let one_in = sampled(&stats).unwrap();
    assert!(one_in > 1, "the busy worker samples: {stats:?}");
    assert_eq!(reported[0].key, label("hot"), "{reported:?}");
    assert!(
        (0.07..0.14).contains(&reported[0].share),
        "hot takes a tenth of the requests: {:?}",
        reported[0]
    );
}

/// The near cache answers the hottest key's gets without a round trip (the
/// cooler keys are read with `gets`, which it never answers), and yet
/// `stats hotkeys` still names that key first and gives it its clients' share:
/// a get is counted when memring plans it, before the near cache (or a
/// coalesced flight) answers it, so a key's rate is what clients ask of it,
/// not what its server still sees. Were cached gets left out, the hottest
/// key would fall behind cooler ones as soon as it is cached (issue 50).
#[test]
fn stats_hotkeys_names_the_hottest_key_first_while_the_near_cache_serves_it() {
    let servers: Vec<Memcached> = (0..4).map(|_| Memcached::start()).collect();
    // A long life: once cached, `hot` is read from memring's memory only.
    // Windows of a second: a 300 ms one held too few of each client's
    // cycles on a loaded machine (a stalled reader left `warm:3` ahead of
    // `warm:1` in one window).
    let proxy = Proxy::start(
        &servers.iter().collect::<Vec<_>>(),
        "workers = 1\nhot_key_window_ms = 1000\nhot_key_cache_ms = 60000\nhot_key_metrics = true",
    );
    let mut admin = proxy.client();
    // Per 20 gets: `hot` 6 (30 %), the next key 4 (20 %), then 3, 3, 2, 2.
    let mix: [(&str, usize); 6] = [
        ("hot", 6),
        ("warm:1", 4),
        ("warm:2", 3),
        ("warm:3", 3),
        ("warm:4", 2),
        ("warm:5", 2),
    ];
    for (key, _) in mix {
        assert_eq!(admin.set(key, key.as_bytes()), b"STORED\r\n");
    }
    let cycle: Arc<Vec<&'static str>> = Arc::new(
        mix.iter()
            .flat_map(|&(key, n)| std::iter::repeat_n(key, n))
            .collect(),
    );
    assert_eq!(cycle.len(), 20);
    let stop = Arc::new(AtomicBool::new(false));
    let gets = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    // One get at a time per client: the near cache answers a client that
    // waits for nothing else from the key's server.
    let readers: Vec<_> = (0..4)
        .map(|r| {
            let (stop, gets, cycle) = (stop.clone(), gets.clone(), cycle.clone());
            let mut client = proxy.client();
            std::thread::spawn(move || {
                let mut i = 5 * r;
                while !stop.load(Ordering::Relaxed) && started.elapsed() < 3 * DEADLINE {
                    let key = cycle[i % cycle.len()];
                    if key == "hot" {
                        assert_eq!(client.get(key).as_deref(), Some(key.as_bytes()));
                    } else {
                        // `gets` (cas ids) are never near-cached: these
                        // keys' gets all go to their servers.
                        let reply =
                            client.call(format!("gets {key}\r\n").as_bytes(), ReplyKind::Values);
                        let head = format!("VALUE {key} 0 {} ", key.len());
                        assert!(reply.starts_with(head.as_bytes()), "{}", show(&reply));
                    }
                    gets.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            })
        })
        .collect();

    wait_for("the near cache answering `hot`", || {
        admin.stat("near_cache_hits") > 0
    });
    let rates = |report: &[Reported]| -> Vec<(String, f64)> {
        report.iter().map(|r| (r.key.clone(), r.rate)).collect()
    };
    // Each window's end changes the report. The first window to end may
    // have begun before the cache answered; the next three did not.
    let mut last = hotkeys(&mut admin);
    let mut checked = Vec::new();
    for window in 0..4 {
        let (hits, asked) = (admin.stat("near_cache_hits"), gets.load(Ordering::Relaxed));
        let mut report = Vec::new();
        wait_for("the next window's report", || {
            report = hotkeys(&mut admin);
            !report.is_empty() && rates(&report) != rates(&last)
        });
        let hits = admin.stat("near_cache_hits") - hits;
        let asked = gets.load(Ordering::Relaxed) - asked;
        last = report.clone();
        if window > 0 {
            checked.push((report, hits, asked));
        }
    }
    stop.store(true, Ordering::Relaxed);
    for reader in readers {
        reader.join().unwrap();
    }

    for (report, hits, asked) in &checked {
        // The condition under test: the cache answered most of `hot`'s gets
        // (30 % of all) while these windows ran.
        assert!(
            *hits * 5 >= *asked,
            "{hits} near-cache hits of {asked} gets: {report:?}"
        );
        assert_eq!(report[0].key, "hot", "{report:?}");
        let total: f64 = report.iter().map(|r| r.rate).sum();
        assert!(
            (0.25..0.35).contains(&(report[0].rate / total)),
            "`hot` is asked in 30 % of the gets: {report:?}"
        );
        assert_eq!(report[1].key, "warm:1", "{report:?}");
    }
}
