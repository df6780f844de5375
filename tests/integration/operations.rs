//! What operators see: `stats` counters, `flush_all` across the pool, the
//! Prometheus endpoint (checked with `promtool` when installed) and readiness,
//! JSON logs, and the bounds that keep operations from hurting the data path:
//! one log line per config problem, a bounded admin listener.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};

use crate::common::{free_port, show, wait_for, Daemon, Memcached, Proxy};
use memring::protocol::ReplyKind;

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
    let stats: std::collections::HashMap<String, String> = client.stats("").into_iter().collect();
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

/// `cas_hits`, `cas_misses`, `cas_badval` of a `stats` reply.
fn cas_stats(client: &mut crate::common::Client) -> [u64; 3] {
    let stats: std::collections::HashMap<String, String> = client.stats("").into_iter().collect();
    ["cas_hits", "cas_misses", "cas_badval"].map(|name| {
        stats
            .get(name)
            .unwrap_or_else(|| panic!("no STAT {name}"))
            .parse()
            .unwrap()
    })
}

/// The cas token of `key` from a classic `gets`.
fn gets_cas(client: &mut crate::common::Client, key: &str) -> u64 {
    let reply = client.call(format!("gets {key}\r\n").as_bytes(), ReplyKind::Values);
    let text = String::from_utf8(reply).unwrap();
    let header = text.lines().next().unwrap();
    header.rsplit(' ').next().unwrap().parse().unwrap()
}

#[test]
fn stats_count_cas_outcomes_and_cpu_time_like_memcached() {
    let server = Memcached::start();
    let proxy = Proxy::start(&[&server], "");
    let mut client = proxy.client();
    let mut direct = server.client();
    let (before, server_before) = (cas_stats(&mut client), cas_stats(&mut direct));

    // Classic: one stored (hit), one stale (badval), one missing (miss).
    assert_eq!(client.set("c", b"1"), b"STORED\r\n");
    let cas = gets_cas(&mut client, "c");
    for (request, reply) in [
        (format!("cas c 0 0 1 {cas}\r\n2\r\n"), "STORED\r\n"),
        (format!("cas c 0 0 1 {cas}\r\n3\r\n"), "EXISTS\r\n"),
        ("cas absent 0 0 1 1\r\n4\r\n".to_string(), "NOT_FOUND\r\n"),
    ] {
        let got = client.call(request.as_bytes(), ReplyKind::Line);
        assert_eq!(show(&got), show(reply.as_bytes()), "{request:?}");
    }
    let after_classic = cas_stats(&mut client);
    let delta = |a: [u64; 3], b: [u64; 3]| [a[0] - b[0], a[1] - b[1], a[2] - b[2]];
    assert_eq!(delta(after_classic, before), [1, 1, 1], "classic cas");

    // Meta: the same three with `ms ... C<cas>`.
    assert_eq!(client.call(b"ms m 1\r\n1\r\n", ReplyKind::Line), b"HD\r\n");
    let cas = gets_cas(&mut client, "m");
    for (request, reply) in [
        (format!("ms m 1 C{cas}\r\n2\r\n"), "HD\r\n"),
        (format!("ms m 1 C{cas}\r\n3\r\n"), "EX\r\n"),
        ("ms absent 1 C1\r\n4\r\n".to_string(), "NF\r\n"),
    ] {
        let got = client.call(request.as_bytes(), ReplyKind::Line);
        assert_eq!(show(&got), show(reply.as_bytes()), "{request:?}");
    }
    let after_meta = cas_stats(&mut client);
    assert_eq!(delta(after_meta, after_classic), [1, 1, 1], "meta cas");

    // A hit `q` suppressed still counts; `C` in add mode is not a cas to
    // memcached, and not to memring.
    let cas = gets_cas(&mut client, "m");
    let quiet = format!("ms m 1 C{cas} q\r\n5\r\nmn\r\n");
    assert_eq!(client.call(quiet.as_bytes(), ReplyKind::Line), b"MN\r\n");
    let add = format!("ms m 1 C{cas} ME\r\n6\r\n");
    assert_eq!(client.call(add.as_bytes(), ReplyKind::Line), b"NS\r\n");
    let after_quiet = cas_stats(&mut client);
    assert_eq!(
        delta(after_quiet, after_meta),
        [1, 0, 0],
        "quiet and add mode"
    );
    // memcached, which saw every request, counted the same.
    assert_eq!(
        delta(cas_stats(&mut direct), server_before),
        delta(after_quiet, before),
        "memring and memcached agree"
    );

    let stats: std::collections::HashMap<String, String> = client.stats("").into_iter().collect();
    for name in ["rusage_user", "rusage_system"] {
        let value = &stats[name];
        let (whole, micros) = value.split_once('.').expect("seconds.microseconds");
        assert!(
            whole.parse::<u64>().is_ok() && micros.len() == 6 && micros.parse::<u32>().is_ok(),
            "STAT {name} {value}"
        );
        assert!(value.parse::<f64>().unwrap() >= 0.0);
    }

    let text = proxy.running().stats.prometheus_text();
    let samples = crate::common::exposition::strict_samples(&text);
    let cas_total = |result: &str| {
        samples
            .iter()
            .find(|s| s.name == "memring_cas_total" && s.label("result") == Some(result))
            .unwrap_or_else(|| panic!("no memring_cas_total{{result={result:?}}}"))
            .value
    };
    let expected = delta(after_quiet, [0, 0, 0]).map(|n| n as f64);
    assert_eq!(
        [cas_total("hit"), cas_total("miss"), cas_total("badval")],
        expected
    );
    assert!(samples
        .iter()
        .any(|s| s.name == "memring_cpu_seconds_total" && s.label("mode") == Some("user")));
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
    let (status, _, body) = http_get_with(addr, path, "");
    (status, body)
}

/// A GET with extra header lines; the status, the response head and the body.
fn http_get_with(addr: SocketAddr, path: &str, headers: &str) -> (u16, String, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(crate::common::DEADLINE))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: test\r\n{headers}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response[9..12].parse().unwrap();
    let (head, body) = response
        .split_once("\r\n\r\n")
        .map(|(h, b)| (h.to_string(), b.to_string()))
        .unwrap_or_default();
    (status, head, body)
}

/// A GET's status, or `None` when the connection fails or is reset.
fn http_status(addr: SocketAddr, path: &str) -> Option<u16> {
    let mut stream = TcpStream::connect(addr).ok()?;
    stream
        .set_read_timeout(Some(crate::common::DEADLINE))
        .ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    response.get(9..12)?.parse().ok()
}

/// The value of header `name` (lower case) in a response head.
fn header(head: &str, name: &str) -> Option<String> {
    head.lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim().to_string())
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
    for (command, count) in [("get", 30.0), ("set", 50.0)] {
        let labels = [("command", command)];
        let timed = sample(&metrics, "memring_request_duration_seconds_count", &labels).max(
            sample(&metrics, "memring_request_duration_seconds", &labels),
        );
        assert_eq!(timed, count, "{command} requests timed");
    }
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
    let admin_port = free_port();
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

#[test]
fn metrics_pass_promtool_and_are_served_as_prometheus_text() {
    let servers: Vec<Memcached> = (0..2).map(|_| Memcached::start()).collect();
    let proxy = Proxy::start(
        &servers.iter().collect::<Vec<_>>(),
        "admin_listen = \"127.0.0.1:0\"\n",
    );
    let admin = proxy.running().admin_addr.expect("admin listener");
    let mut client = proxy.client();
    for i in 0..20 {
        assert_eq!(client.set(&format!("p:{i}"), b"v"), b"STORED\r\n");
        client.get(&format!("p:{i}"));
        client.get(&format!("absent:{i}"));
    }
    let (status, head, body) = http_get_with(admin, "/metrics", "");
    assert_eq!(status, 200);
    assert_eq!(
        header(&head, "content-type").as_deref(),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    assert!(
        !body.contains("# EOF"),
        "OpenMetrics terminator in 0.0.4 text"
    );
    assert!(body.contains("# TYPE memring_client_requests_total counter"));
    assert!(body.contains("# TYPE memring_request_duration_seconds histogram"));
    // The 40 gets above, timed by the worker that served them.
    let timed_gets: u64 = body
        .lines()
        .find_map(|l| l.strip_prefix("memring_request_duration_seconds_count{command=\"get\"} "))
        .and_then(|n| n.parse().ok())
        .expect("the gets' latency count");
    assert!(timed_gets >= 40, "{timed_gets} gets timed");
    // Every metric the Grafana dashboard queries exists.
    let dashboard = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/config/grafana/memring-dashboard.json"
    ))
    .unwrap();
    for (start, _) in dashboard.match_indices("memring_") {
        let name: String = dashboard[start..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        assert!(
            body.contains(&format!("\n{name}{{"))
                || body.contains(&format!("\n{name} "))
                || body.contains(&format!("# TYPE {name} ")),
            "the dashboard queries {name}, which /metrics does not have"
        );
    }

    crate::common::exposition::strict_samples(&body);
    crate::common::exposition::promtool_check(&body);

    // OpenMetrics only for a scraper that asks for it.
    let (status, head, body) = http_get_with(
        admin,
        "/metrics",
        "Accept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5\r\n",
    );
    assert_eq!(status, 200);
    assert!(header(&head, "content-type")
        .unwrap_or_default()
        .starts_with("application/openmetrics-text; version=1.0.0"));
    assert!(body.ends_with("# EOF\n"), "OpenMetrics ends with # EOF");
}

fn temp_dir(test: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("memring-ops-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn an_unreadable_config_is_logged_once_even_with_the_log_beside_it() {
    let backend = Memcached::start();
    let dir = temp_dir("unreadable");
    let config = dir.join("memring.toml");
    let text = format!(
        "listen = \"127.0.0.1:{}\"\n[[servers]]\naddr = \"{}\"\n",
        free_port(),
        backend.addr()
    );
    std::fs::write(&config, &text).unwrap();
    // The log file in the config's directory, at debug level: each log line
    // is an event in the watched directory.
    let daemon = Daemon::start(&config, &dir.join("memring.log"), &["--log-level", "debug"]);
    daemon.wait_for_log("watching config for changes");

    std::fs::remove_file(&config).unwrap();
    daemon.wait_for_log("No such file or directory");
    // Other files changing in the directory are no reason to re-read.
    for i in 0..50 {
        std::fs::write(dir.join(format!("other-{}.txt", i % 5)), format!("{i}")).unwrap();
    }
    // A different problem is a new line...
    std::fs::create_dir(&config).unwrap();
    daemon.wait_for_log("Is a directory");
    // ...and a good file again is applied and says what changed.
    std::fs::remove_dir(&config).unwrap();
    std::fs::write(
        &config,
        text.replace("[[servers]]", "request_timeout_ms = 1500\n[[servers]]"),
    )
    .unwrap();
    daemon.wait_for_log("request_timeout_ms 1000 -> 1500");

    let log = daemon.log();
    assert_eq!(daemon.count("No such file or directory"), 1, "{log}");
    assert_eq!(daemon.count("Is a directory"), 1, "{log}");
    assert!(daemon.count("config unchanged") <= 2, "{log}");
    assert!(
        log.lines().count() < 40,
        "{} log lines: {log}",
        log.lines().count()
    );
    // The message names the cause once.
    assert_eq!(log.matches("No such file or directory").count(), 1, "{log}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn slow_admin_connections_leave_fds_bounded_and_the_data_path_healthy() {
    const SLOW: usize = 1000;
    // The test holds SLOW sockets of its own.
    let (soft, hard) = rlimit::getrlimit(rlimit::Resource::NOFILE).unwrap();
    let wanted = (SLOW as u64 + 512).min(hard);
    if soft < wanted {
        rlimit::setrlimit(rlimit::Resource::NOFILE, wanted, hard).unwrap();
    }
    let slow_count = SLOW.min(wanted.saturating_sub(256) as usize);
    assert!(
        slow_count > 2 * memring::control::admin::MAX_CONNECTIONS,
        "fd limit {hard} too low for this test"
    );

    let backend = Memcached::start();
    let dir = temp_dir("slowloris");
    let config = dir.join("memring.toml");
    let listen = format!("127.0.0.1:{}", free_port());
    let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    std::fs::write(
        &config,
        format!(
            "listen = \"{listen}\"\nadmin_listen = \"{admin}\"\n[[servers]]\naddr = \"{}\"\n",
            backend.addr()
        ),
    )
    .unwrap();
    let daemon = Daemon::start(&config, &dir.join("memring.log"), &[]);
    wait_for("the admin listener", || {
        TcpStream::connect(admin).is_ok() && daemon.count("memring started") > 0
    });
    assert_eq!(http_get(admin, "/live").0, 200);
    let mut client = crate::common::Client::connect(&listen);
    assert_eq!(client.set("before", b"1"), b"STORED\r\n");
    let baseline = daemon.open_fds();

    let started = std::time::Instant::now();
    // Each sends half a request header and then nothing.
    let slow: Vec<TcpStream> = (0..slow_count)
        .map(|_| {
            let mut stream = TcpStream::connect(admin).expect("connect (or wait in the backlog)");
            let _ = stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ");
            stream
        })
        .collect();
    eprintln!(
        "{slow_count} slow connections open after {:?}",
        started.elapsed()
    );
    daemon.wait_for_log("admin listener at its limit of");
    let bound = baseline + memring::control::admin::MAX_CONNECTIONS + 16;
    // The data path keeps working, and new clients get in, while the admin
    // slots are all taken.
    let mut peak = 0;
    for round in 0..100 {
        let key = format!("slow:{round}");
        assert_eq!(client.set(&key, b"v"), b"STORED\r\n");
        assert_eq!(client.get(&key), Some(b"v".to_vec()));
        if round % 10 == 0 {
            let mut fresh = crate::common::Client::connect(&listen);
            assert_eq!(fresh.get(&key), Some(b"v".to_vec()));
            peak = peak.max(daemon.open_fds());
        }
    }
    assert!(peak <= bound, "{peak} fds open, bound {bound}");
    eprintln!("peak {peak} fds (baseline {baseline}, bound {bound})");
    eprintln!("data path checked after {:?}", started.elapsed());
    // A connection that never finishes its headers is closed by memring.
    // The slow clients go away; a scrape works again.
    let mut first = slow.into_iter().next().unwrap();
    // Until a slot frees up, a scrape may be accepted and closed at once
    // (a reset): tried again, not a failure.
    wait_for("a scrape after the slow clients left", || {
        http_status(admin, "/metrics") == Some(200)
    });
    first
        .set_read_timeout(Some(crate::common::DEADLINE))
        .unwrap();
    let mut rest = Vec::new();
    assert!(
        first.read_to_end(&mut rest).is_ok(),
        "the header timeout closes a silent admin connection"
    );
    eprintln!("first slow connection closed after {:?}", started.elapsed());
    // Logged once per episode, not per refused connection (an episode ends
    // when a slot frees up, 5 s after the first slow client at the latest).
    let episodes = daemon.count("admin listener at its limit of");
    assert!(
        episodes >= 1 && episodes <= daemon.count("below its limit again") + 1 && episodes < 10,
        "{}",
        daemon.log()
    );
    assert_eq!(daemon.count("cannot accept"), 0, "{}", daemon.log());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn probes_are_answered_while_idle_connections_hold_every_admin_slot() {
    let backend = Memcached::start();
    let proxy = Proxy::start(&[&backend], "admin_listen = \"127.0.0.1:0\"\n");
    let admin = proxy.running().admin_addr.unwrap();
    wait_for("ready", || http_get(admin, "/ready").0 == 200);
    // More idle connections than there are slots: they connect and send
    // nothing, as a port scanner or a half-open load balancer check does.
    let idle: Vec<TcpStream> = (0..memring::control::admin::MAX_CONNECTIONS + 6)
        .map(|_| TcpStream::connect(admin).unwrap())
        .collect();
    // Every probe is answered at once, not refused: none waits for the idle
    // ones to time out.
    for round in 0..20 {
        assert_eq!(http_status(admin, "/ready"), Some(200), "probe {round}");
        assert_eq!(http_status(admin, "/live"), Some(200), "probe {round}");
    }
    // An idle connection is closed by memring within a bounded time, and so
    // is a keep-alive connection that went quiet after a request.
    let mut kept = TcpStream::connect(admin).unwrap();
    kept.set_read_timeout(Some(crate::common::DEADLINE))
        .unwrap();
    kept.write_all(b"GET /live HTTP/1.1\r\nHost: test\r\n\r\n")
        .unwrap();
    let mut response = Vec::new();
    kept.read_to_end(&mut response)
        .expect("memring closes a quiet keep-alive admin connection");
    assert!(response.starts_with(b"HTTP/1.1 200"), "{response:?}");
    for mut stream in idle.into_iter().take(4) {
        stream
            .set_read_timeout(Some(crate::common::DEADLINE))
            .unwrap();
        let mut rest = Vec::new();
        let _ = stream.read_to_end(&mut rest);
        assert!(
            rest.is_empty() || rest.starts_with(b"HTTP/1.1 408"),
            "{rest:?}"
        );
    }
}
