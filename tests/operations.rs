//! What operators see: `stats` counters, `flush_all` across the pool, the
//! Prometheus endpoint and readiness, and JSON logs.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};

use common::{show, wait_for, Memcached, Proxy};
use memring::protocol::ReplyKind;

fn stats_of(client: &mut common::Client) -> std::collections::HashMap<String, String> {
    client.send(b"stats\r\n");
    let text = String::from_utf8(client.read_until_suffix(b"END\r\n")).unwrap();
    text.lines()
        .filter_map(|l| l.strip_prefix("STAT "))
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn stats_counters_follow_a_known_sequence() {
    let servers: Vec<Memcached> = (0..3).map(|_| Memcached::start()).collect();
    let proxy = Proxy::start(&servers.iter().collect::<Vec<_>>(), "");
    let mut client = proxy.client();
    let script: &[(&[u8], ReplyKind)] = &[
        (b"set a 0 0 1\r\n1\r\n", ReplyKind::Line),
        (b"set b 0 0 1\r\n2\r\n", ReplyKind::Line),
        (b"get a b c\r\n", ReplyKind::Values),
        (b"gets a\r\n", ReplyKind::Values),
        (b"delete a\r\n", ReplyKind::Line),
        (b"delete zzz\r\n", ReplyKind::Line),
        (b"incr n 1\r\n", ReplyKind::Line),
        (b"set n 0 0 1\r\n5\r\n", ReplyKind::Line),
        (b"incr n 1\r\n", ReplyKind::Line),
        (b"decr n 1\r\n", ReplyKind::Line),
        (b"touch b 10\r\n", ReplyKind::Line),
        (b"touch zz 10\r\n", ReplyKind::Line),
    ];
    for (request, kind) in script {
        client.call(request, *kind);
    }
    let stats = stats_of(&mut client);
    let expect = |name: &str, value: &str| {
        assert_eq!(
            stats.get(name).map(String::as_str),
            Some(value),
            "STAT {name}"
        );
    };
    expect("cmd_get", "4");
    expect("get_hits", "3");
    expect("get_misses", "1");
    expect("cmd_set", "3");
    expect("delete_hits", "1");
    expect("delete_misses", "1");
    expect("incr_hits", "1");
    expect("incr_misses", "1");
    expect("decr_hits", "1");
    expect("decr_misses", "0");
    expect("cmd_touch", "2");
    expect("touch_hits", "1");
    expect("touch_misses", "1");
    expect("curr_connections", "1");
    expect("total_connections", "1");
    expect("version", memring::VERSION_STRING);
    assert!(stats["bytes_read"].parse::<u64>().unwrap() > 100);
    assert!(stats["bytes_written"].parse::<u64>().unwrap() > 50);
    assert!(stats.contains_key("pid") && stats.contains_key("uptime"));
    let mut requests = 0;
    for server in &servers {
        let name = server.addr();
        expect(&format!("server:{name}:state"), "ACTIVE");
        expect(&format!("server:{name}:errors"), "0");
        requests += stats[&format!("server:{name}:requests")]
            .parse::<u64>()
            .unwrap();
        let share: f64 = stats[&format!("server:{name}:ring_share")].parse().unwrap();
        assert!(share > 0.1 && share < 0.6);
    }
    assert!(
        requests >= 12,
        "every forwarded request is counted: {requests}"
    );
}

#[test]
fn per_server_stats_groups_are_refused_clearly() {
    let servers = [Memcached::start()];
    let proxy = Proxy::start(&servers.iter().collect::<Vec<_>>(), "");
    let mut client = proxy.client();
    for group in ["items", "slabs", "settings", "detail dump"] {
        let reply = client.call(format!("stats {group}\r\n").as_bytes(), ReplyKind::Line);
        assert!(
            reply.starts_with(b"CLIENT_ERROR "),
            "{group}: {}",
            show(&reply)
        );
    }
    assert_eq!(client.set("still", b"ok"), b"STORED\r\n");
}

#[test]
fn flush_all_reaches_every_server_and_names_the_failed_ones() {
    let mut servers: Vec<Memcached> = (0..3).map(|_| Memcached::start()).collect();
    let proxy = Proxy::start(
        &servers.iter().collect::<Vec<_>>(),
        "connect_timeout_ms = 200\n",
    );
    let mut client = proxy.client();
    for i in 0..60 {
        assert_eq!(client.set(&format!("f:{i}"), b"x"), b"STORED\r\n");
    }
    for server in &servers {
        let mut direct = server.client();
        assert!((0..60).any(|i| direct.get(&format!("f:{i}")).is_some()));
    }
    assert_eq!(client.call(b"flush_all\r\n", ReplyKind::Line), b"OK\r\n");
    for server in &servers {
        let mut direct = server.client();
        assert!(
            (0..60).all(|i| direct.get(&format!("f:{i}")).is_none()),
            "{} flushed",
            server.addr()
        );
    }
    client.send(b"flush_all noreply\r\n");
    assert_eq!(client.set("after", b"1"), b"STORED\r\n");

    servers[2].kill();
    let reply = client.call(b"flush_all\r\n", ReplyKind::Line);
    let expected = format!("SERVER_ERROR failed on {}\r\n", servers[2].addr());
    assert_eq!(show(&reply), show(expected.as_bytes()));
}

fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(common::DEADLINE)).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response[9..12].parse().unwrap();
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

fn scrape(addr: SocketAddr) -> prometheus_parse::Scrape {
    let (status, body) = http_get(addr, "/metrics");
    assert_eq!(status, 200);
    let lines = body.lines().map(|l| Ok(l.to_string()));
    prometheus_parse::Scrape::parse(lines).expect("valid Prometheus text")
}

fn sample(scrape: &prometheus_parse::Scrape, metric: &str, labels: &[(&str, &str)]) -> f64 {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == metric)
        .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match &s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => *v,
            prometheus_parse::Value::Histogram(buckets) => buckets.last().map_or(0.0, |b| b.count),
            _ => 0.0,
        })
        .sum()
}

#[test]
fn metrics_parse_as_prometheus_text_and_match_the_requests_sent() {
    let servers: Vec<Memcached> = (0..3).map(|_| Memcached::start()).collect();
    let proxy = Proxy::start(
        &servers.iter().collect::<Vec<_>>(),
        "admin_listen = \"127.0.0.1:0\"\n",
    );
    let admin = proxy.running().admin_addr.expect("admin listener");
    let mut client = proxy.client();
    for i in 0..50 {
        assert_eq!(client.set(&format!("m:{i}"), b"v"), b"STORED\r\n");
    }
    for i in 0..30 {
        client.get(&format!("m:{i}"));
    }
    let metrics = scrape(admin);
    assert_eq!(
        sample(
            &metrics,
            "memring_client_requests_total",
            &[("command", "set")]
        ),
        50.0
    );
    assert_eq!(
        sample(
            &metrics,
            "memring_client_requests_total",
            &[("command", "get")]
        ),
        30.0
    );
    assert_eq!(
        sample(&metrics, "memring_hits_total", &[("command", "get")]),
        30.0
    );
    assert_eq!(
        sample(&metrics, "memring_backend_requests_total", &[]),
        80.0
    );
    for server in &servers {
        let name = server.addr();
        let sent = sample(
            &metrics,
            "memring_backend_requests_total",
            &[("server", &name)],
        );
        assert!(sent > 0.0, "{name} got requests");
        let observed = sample(
            &metrics,
            "memring_backend_latency_seconds_count",
            &[("server", &name)],
        )
        .max(sample(
            &metrics,
            "memring_backend_latency_seconds",
            &[("server", &name)],
        ));
        assert!(
            observed >= sent,
            "{name}: latency observed {observed} for {sent} requests"
        );
        assert_eq!(
            sample(
                &metrics,
                "memring_server_state",
                &[("server", &name), ("state", "ACTIVE")]
            ),
            1.0
        );
    }
    assert_eq!(sample(&metrics, "memring_client_connections", &[]), 1.0);
    assert_eq!(sample(&metrics, "memring_ring_version", &[]), 1.0);
    assert_eq!(sample(&metrics, "memring_servers_configured", &[]), 3.0);
    assert_eq!(sample(&metrics, "memring_servers_effective", &[]), 3.0);
    assert_eq!(http_get(admin, "/live").0, 200);
    assert_eq!(http_get(admin, "/nothing").0, 404);
}

#[test]
fn readiness_flips_when_every_server_is_down_and_back() {
    let mut servers: Vec<Memcached> = (0..2).map(|_| Memcached::start()).collect();
    let proxy = Proxy::start(
        &servers.iter().collect::<Vec<_>>(),
        "admin_listen = \"127.0.0.1:0\"\nconnect_timeout_ms = 200\nfailure_limit = 1\n",
    );
    let admin = proxy.running().admin_addr.unwrap();
    wait_for("ready", || http_get(admin, "/ready").0 == 200);
    for server in servers.iter_mut() {
        server.kill();
    }
    wait_for("not ready with every server down", || {
        http_get(admin, "/ready").0 == 503
    });
    assert_eq!(http_get(admin, "/live").0, 200, "still live");
    servers[0].restart();
    wait_for("ready again", || http_get(admin, "/ready").0 == 200);
}

#[test]
fn json_logs_and_the_healthcheck_subcommand_work() {
    let backend = Memcached::start();
    let dir = std::env::temp_dir().join(format!("memring-ops-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("memring.toml");
    let admin_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:{admin_port}\"\n[[servers]]\naddr = \"{}\"\n",
            backend.addr()
        ),
    )
    .unwrap();
    let bin = env!("CARGO_BIN_EXE_memring");
    let mut child = Command::new(bin)
        .args(["--log-format", "json", "--config"])
        .arg(&config)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let first = BufReader::new(stderr).lines().next().unwrap().unwrap();
    assert!(first.starts_with('{') && first.ends_with('}'), "{first}");
    assert!(first.contains("\"level\":\"INFO\""), "{first}");
    let admin = format!("127.0.0.1:{admin_port}");
    wait_for("the healthcheck to pass", || {
        Command::new(bin)
            .args(["healthcheck", &admin])
            .status()
            .unwrap()
            .success()
    });
    let _ = child.kill();
    let _ = child.wait();
    assert!(!Command::new(bin)
        .args(["healthcheck", &admin])
        .status()
        .unwrap()
        .success());
    let _ = std::fs::remove_dir_all(dir);
}
