//! The operator's fleet view: `ring_digest` (in `stats`, `/metrics`,
//! `/ready?digest=` and `memring healthcheck --digest`) agreeing across
//! sidecars that place keys alike and differing as soon as one key would go
//! elsewhere. Sidecars are real memring processes over real memcached.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;

use crate::common::exposition::{promtool_check, strict_samples};
use crate::common::{free_port, wait_for, Client, Daemon, Memcached, TempDir};

const BIN: &str = env!("CARGO_BIN_EXE_memring");

/// One memring process with its listen and admin addresses.
struct Sidecar {
    _daemon: Daemon,
    listen: String,
    admin: String,
}

impl Sidecar {
    /// memring on a config of `body` (servers, pools, routes) with listen and
    /// admin ports of its own; returns once its admin listener is ready.
    fn start(dir: &TempDir, name: &str, body: &str) -> Sidecar {
        let listen = format!("127.0.0.1:{}", free_port());
        let admin = format!("127.0.0.1:{}", free_port());
        let config = dir.path(&format!("{name}.toml"));
        let text = format!("listen = \"{listen}\"\nadmin_listen = \"{admin}\"\n{body}");
        std::fs::write(&config, text).unwrap();
        let daemon = Daemon::start(&config, &dir.path(&format!("{name}.log")), &[]);
        let sidecar = Sidecar {
            _daemon: daemon,
            listen,
            admin,
        };
        wait_for("the sidecar's admin listener", || {
            http_get(&sidecar.admin, "/ready").0 == 200
        });
        sidecar
    }

    fn digest(&self) -> String {
        Client::connect(&self.listen)
            .stats("")
            .into_iter()
            .find(|(name, _)| name == "ring_digest")
            .map(|(_, value)| value)
            .expect("a ring_digest line in stats")
    }

    fn healthcheck(&self, digest: &str) -> std::process::Output {
        Command::new(BIN)
            .args(["healthcheck", &self.admin, "--digest", digest])
            .output()
            .unwrap()
    }
}

fn http_get(addr: &str, path: &str) -> (u16, String) {
    let Ok(mut stream) = TcpStream::connect(addr) else {
        return (0, String::new());
    };
    stream
        .set_read_timeout(Some(crate::common::DEADLINE))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    if stream.read_to_string(&mut response).is_err() || response.len() < 12 {
        return (0, String::new());
    }
    let status = response[9..12].parse().unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_string());
    (status, body)
}

/// `[[servers]]` tables for `servers` in this order, named and weighted.
fn servers_text(servers: &[(&Memcached, &str, u32)]) -> String {
    servers
        .iter()
        .map(|(server, name, weight)| {
            format!(
                "[[servers]]\naddr = \"{}\"\nname = \"{name}\"\nweight = {weight}\n",
                server.addr()
            )
        })
        .collect()
}

#[test]
fn sidecars_with_the_same_servers_in_any_order_report_the_same_digest() {
    let caches: Vec<Memcached> = (0..4).map(|_| Memcached::start()).collect();
    let dir = TempDir::new("fleet", "digest");
    let [a, b, c, d] = [&caches[0], &caches[1], &caches[2], &caches[3]];
    let forward = servers_text(&[(a, "a", 1), (b, "b", 2), (c, "c", 1)]);
    let backward = servers_text(&[(c, "c", 1), (b, "b", 2), (a, "a", 1)]);
    let one = Sidecar::start(&dir, "one", &forward);
    let two = Sidecar::start(&dir, "two", &backward);
    let digest = one.digest();
    assert_eq!(digest.len(), 16, "{digest}");
    assert!(digest.bytes().all(|b| b.is_ascii_hexdigit()), "{digest}");
    assert_eq!(two.digest(), digest, "same servers, other order and ports");

    // One server elsewhere: some keys would go elsewhere, so the digest differs.
    let changed = servers_text(&[(c, "c", 1), (b, "b", 2), (d, "a", 1)]);
    let three = Sidecar::start(&dir, "three", &changed);
    assert_ne!(three.digest(), digest);

    // healthcheck --digest passes on the sidecar's own digest, fails on another.
    let ok = one.healthcheck(&digest);
    assert!(ok.status.success(), "{ok:?}");
    let mismatch = three.healthcheck(&digest);
    assert_eq!(mismatch.status.code(), Some(1), "{mismatch:?}");
    let said = String::from_utf8_lossy(&mismatch.stderr);
    assert!(
        said.contains(&format!("ring digest is {}, not {digest}", three.digest())),
        "{said}"
    );
    let (status, body) = http_get(&three.admin, &format!("/ready?digest={digest}"));
    assert_eq!(status, 503, "{body}");
    assert_eq!(
        http_get(&one.admin, &format!("/ready?digest={digest}")).0,
        200
    );
    let bad = one.healthcheck("not-a-digest");
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("16 hex digits"));
}

#[test]
fn metrics_show_each_pools_ring_digest() {
    let caches: Vec<Memcached> = (0..3).map(|_| Memcached::start()).collect();
    let dir = TempDir::new("fleet", "ring-info");
    let body = format!(
        "{}[[pools]]\nname = \"sessions\"\n[[pools.servers]]\naddr = \"{}\"\n[[routes]]\nprefix = \"s:\"\npool = \"sessions\"\n",
        servers_text(&[(&caches[0], "a", 1), (&caches[1], "b", 1)]),
        caches[2].addr()
    );
    let sidecar = Sidecar::start(&dir, "pools", &body);
    let (status, text) = http_get(&sidecar.admin, "/metrics");
    assert_eq!(status, 200);
    promtool_check(&text);
    let info: Vec<_> = strict_samples(&text)
        .into_iter()
        .filter(|s| s.name == "memring_ring_info")
        .collect();
    let pools: Vec<_> = info.iter().map(|s| s.label("pool").unwrap()).collect();
    assert_eq!(pools, ["default", "sessions"], "{info:?}");
    for sample in &info {
        assert_eq!(sample.value, 1.0);
        assert_eq!(sample.label("digest").unwrap().len(), 16);
    }
    assert_ne!(info[0].label("digest"), info[1].label("digest"));

    // OpenMetrics has an info type: the same series, ahead of `# EOF`.
    let mut stream = TcpStream::connect(&sidecar.admin).unwrap();
    stream
        .set_read_timeout(Some(crate::common::DEADLINE))
        .unwrap();
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: test\r\nAccept: application/openmetrics-text;version=1.0.0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let openmetrics = response.split_once("\r\n\r\n").unwrap().1;
    assert!(
        openmetrics.contains("# TYPE memring_ring info\n"),
        "{openmetrics}"
    );
    let sample = format!(
        "memring_ring_info{{pool=\"sessions\",digest=\"{}\"}} 1\n# EOF\n",
        info[1].label("digest").unwrap()
    );
    assert!(openmetrics.ends_with(&sample), "{openmetrics}");
    assert_eq!(openmetrics.matches("# EOF").count(), 1);
}

/// The servers holding `key`, asked of each memcached directly.
fn holders(servers: &mut [(String, Client)], key: &str) -> Vec<String> {
    let mut held = Vec::new();
    for (addr, client) in servers.iter_mut() {
        if client.get(key).is_some() {
            held.push(addr.clone());
        }
    }
    held
}

fn addr_of(server: &serde_json::Value) -> String {
    server["addr"].as_str().expect("an addr").to_string()
}

#[test]
fn route_names_the_servers_a_write_through_memring_lands_on() {
    let main: Vec<Memcached> = (0..3).map(|_| Memcached::start()).collect();
    let sessions: Vec<Memcached> = (0..2).map(|_| Memcached::start()).collect();
    let dir = TempDir::new("fleet", "route");
    let mut body = "replicas = 2\n".to_string();
    body.push_str(&servers_text(&[
        (&main[0], "a", 1),
        (&main[1], "b", 1),
        (&main[2], "c", 2),
    ]));
    body.push_str("[[pools]]\nname = \"sessions\"\nreplicas = 1\n");
    for server in &sessions {
        body.push_str(&format!(
            "[[pools.servers]]\naddr = \"{}\"\n",
            server.addr()
        ));
    }
    body.push_str("[[routes]]\nprefix = \"s:\"\npool = \"sessions\"\n");
    let sidecar = Sidecar::start(&dir, "route", &body);
    let mut proxy = Client::connect(&sidecar.listen);
    let mut direct: Vec<(String, Client)> = main
        .iter()
        .chain(&sessions)
        .map(|m| (m.addr(), m.client()))
        .collect();
    let digest = sidecar.digest();
    let keys: Vec<String> = (0..1000)
        .map(|i| match i % 2 {
            0 => format!("user:{i}:profile"),
            _ => format!("s:{i}"),
        })
        .collect();
    for key in &keys {
        assert_eq!(proxy.set(key, b"v"), b"STORED\r\n");
        let (status, text) = http_get(&sidecar.admin, &format!("/route?key={key}"));
        assert_eq!(status, 200, "{text}");
        let route: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(route["key"], key.as_str());
        assert_eq!(route["ring_digest"], digest.as_str());
        assert_eq!(route["previous_owner"], serde_json::Value::Null);
        assert_eq!(route["gutter"], serde_json::Value::Null);
        assert_eq!(route["owner"]["state"], "ACTIVE");
        let replicas: Vec<String> = route["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .map(addr_of)
            .collect();
        let (pool, copies) = match key.starts_with("s:") {
            true => ("sessions", 1),
            false => ("default", 2),
        };
        assert_eq!(route["pool"], pool, "{key}");
        assert_eq!(replicas.len(), copies, "{key}: {route}");
        assert_eq!(replicas[0], addr_of(&route["owner"]), "{key}: owner first");
        let mut held = holders(&mut direct, key);
        let mut expected = replicas.clone();
        held.sort();
        expected.sort();
        assert_eq!(held, expected, "{key}: /route said {route}");
    }

    // `where --config` on the same file agrees without asking memring, and
    // `where --admin` prints the same for people.
    let config = dir.path("route.toml");
    let some: Vec<&str> = keys.iter().take(200).map(String::as_str).collect();
    let offline = Command::new(BIN)
        .args(["where", "--json", "--config"])
        .arg(&config)
        .args(&some)
        .output()
        .unwrap();
    assert!(offline.status.success(), "{offline:?}");
    let offline = String::from_utf8(offline.stdout).unwrap();
    for (line, key) in offline.lines().zip(&some) {
        let (_, text) = http_get(&sidecar.admin, &format!("/route?key={key}"));
        let offline: serde_json::Value = serde_json::from_str(line).unwrap();
        let online: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(offline, online, "{key}");
    }
    assert_eq!(offline.lines().count(), some.len());
    let people = Command::new(BIN)
        .args(["where", "--admin", &sidecar.admin, "s:1", "user:0:profile"])
        .output()
        .unwrap();
    assert!(people.status.success(), "{people:?}");
    let people = String::from_utf8(people.stdout).unwrap();
    assert!(
        people.starts_with("s:1\n  pool         sessions\n"),
        "{people}"
    );
    assert!(
        people.contains(&format!("  ring_digest  {digest}\n")),
        "{people}"
    );
}

#[test]
fn route_refuses_a_key_memcached_would_refuse_and_takes_binary_keys() {
    let cache = Memcached::start();
    let dir = TempDir::new("fleet", "route-keys");
    let sidecar = Sidecar::start(&dir, "keys", &servers_text(&[(&cache, "a", 1)]));
    let long = "k".repeat(251);
    for query in [
        format!("key={long}"),
        "key=a%20b".to_string(),
        "key=".to_string(),
        "nokey=1".to_string(),
        "key_b64=%21%21".to_string(),
    ] {
        let (status, text) = http_get(&sidecar.admin, &format!("/route?{query}"));
        assert_eq!(status, 400, "{query}: {text}");
        let error: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert!(
            error["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{text}"
        );
    }
    let (status, text) = http_get(&sidecar.admin, "/route?key_b64=AP8%3D");
    assert_eq!(status, 200, "{text}");
    let route: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(route["key_b64"], "AP8=");
    assert_eq!(addr_of(&route["owner"]), cache.addr());
    let refused = Command::new(BIN)
        .args(["where", "--admin", &sidecar.admin, &long, "ok"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(1));
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("251 bytes"), "{said}");
    assert!(String::from_utf8_lossy(&refused.stdout).starts_with("ok\n"));
}

#[test]
fn route_names_the_previous_owner_in_a_handoff_window() {
    let caches: Vec<Memcached> = (0..4).map(|_| Memcached::start()).collect();
    let dir = TempDir::new("fleet", "route-window");
    let three = servers_text(&[
        (&caches[0], "a", 1),
        (&caches[1], "b", 1),
        (&caches[2], "c", 1),
    ]);
    let sidecar = Sidecar::start(&dir, "window", &format!("handoff_ms = 600000\n{three}"));
    let mut proxy = Client::connect(&sidecar.listen);
    let keys: Vec<String> = (0..300).map(|i| format!("k:{i}")).collect();
    let mut before = Vec::new();
    for key in &keys {
        assert_eq!(proxy.set(key, b"v"), b"STORED\r\n");
        let (_, text) = http_get(&sidecar.admin, &format!("/route?key={key}"));
        let route: serde_json::Value = serde_json::from_str(&text).unwrap();
        before.push(addr_of(&route["owner"]));
    }
    // A fourth server: a quarter of the keys move to it, and until the
    // window ends their previous owner is where their values are.
    let digest = sidecar.digest();
    let config = dir.path("window.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    crate::common::replace_by_rename(
        &config,
        &format!("{text}{}", servers_text(&[(&caches[3], "d", 1)])),
    );
    wait_for("the reload", || sidecar.digest() != digest);
    let mut moved = 0;
    for (key, was) in keys.iter().zip(&before) {
        let (_, text) = http_get(&sidecar.admin, &format!("/route?key={key}"));
        let route: serde_json::Value = serde_json::from_str(&text).unwrap();
        if addr_of(&route["owner"]) == *was {
            assert_eq!(route["previous_owner"], serde_json::Value::Null, "{route}");
        } else {
            moved += 1;
            assert_eq!(addr_of(&route["owner"]), caches[3].addr(), "{route}");
            assert_eq!(addr_of(&route["previous_owner"]), *was, "{route}");
        }
    }
    assert!(moved > 30, "{moved} of 300 keys moved");
}

#[test]
fn route_names_the_gutter_while_the_owner_is_dead() {
    let (m1, mut m2, g1) = (Memcached::start(), Memcached::start(), Memcached::start());
    let dir = TempDir::new("fleet", "route-gutter");
    let body = format!(
        "request_timeout_ms = 200\nfailover = \"gutter\"\nfailover_ttl_s = 5\n{}[[pools]]\nname = \"gutter\"\n[[pools.servers]]\naddr = \"{}\"\n",
        servers_text(&[(&m1, "m1", 1), (&m2, "m2", 1)]),
        g1.addr()
    );
    let sidecar = Sidecar::start(&dir, "gutter", &body);
    let digest = sidecar.digest();
    let route = |key: &str| -> serde_json::Value {
        let (status, text) = http_get(&sidecar.admin, &format!("/route?key={key}"));
        assert_eq!(status, 200, "{text}");
        serde_json::from_str(&text).unwrap()
    };
    let keys: Vec<String> = (0..100).map(|i| format!("k{i}")).collect();
    let on_m2: Vec<&String> = keys
        .iter()
        .filter(|k| addr_of(&route(k)["owner"]) == m2.addr())
        .collect();
    assert!(on_m2.len() > 20, "{}", on_m2.len());
    assert!(on_m2.iter().all(|k| route(k)["gutter"].is_null()));

    // m2 hangs: once it is DEAD its keys go to the gutter pool, and /route
    // says so; with failover it keeps its place, so the digest stays.
    m2.pause();
    let mut proxy = Client::connect(&sidecar.listen);
    wait_for("m2's keys to fail over to the gutter", || {
        proxy.set(on_m2[0], b"v") == b"STORED\r\n"
    });
    let mut gutter = g1.client();
    for key in &on_m2 {
        assert_eq!(proxy.set(key, b"v"), b"STORED\r\n");
        let route = route(key);
        assert_eq!(route["owner"]["state"], "DEAD", "{route}");
        assert_eq!(route["gutter"]["pool"], "gutter", "{route}");
        assert_eq!(addr_of(&route["gutter"]["owner"]), g1.addr(), "{route}");
        assert!(gutter.get(key).is_some(), "{key} written to the gutter");
    }
    assert_eq!(sidecar.digest(), digest);
    m2.resume();
}
