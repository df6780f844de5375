use std::net::IpAddr;

use super::addr::numeric_ipv4;
use super::diagnose::EXAMPLES;
use super::*;
use crate::ring::{Flavour, HashFunction};

const GOOD: &str = r#"
listen = "127.0.0.1:22122"

[[servers]]
addr = "127.0.0.1:11211"

[[servers]]
addr = "127.0.0.1:11212"
weight = 2
name = "cache-02"
"#;

fn error_of(text: &str) -> String {
    Config::parse(text, "memring.toml").unwrap_err().to_string()
}

#[test]
fn tls_on_a_server_without_backend_tls_is_refused_at_its_line() {
    let text = "listen = \"127.0.0.1:1\"\n[[servers]]\naddr = \"127.0.0.1:2\"\ntls = true\n";
    let error = error_of(text);
    assert!(
        error.starts_with(
            "memring.toml:4:7: server `127.0.0.1:2` has tls = true but there is no [backend_tls]"
        ),
        "{error}"
    );
}

#[test]
fn tls_for_discovered_servers_needs_backend_tls_and_marks_every_server() {
    let base = "listen = \"127.0.0.1:1\"\n[discovery]\nsrv = \"_m._tcp.cache\"\ntls = true\n";
    let error = error_of(base);
    assert!(
        error.starts_with(
            "memring.toml:4:7: [discovery] has tls = true but there is no [backend_tls]"
        ),
        "{error}"
    );
    let text = format!("{base}[backend_tls]\nca_file = \"ca.pem\"\n");
    let config = Config::parse(&text, "memring.toml").expect("valid");
    assert!(config.discovery.tls);
    let plain = Config::parse(
        "listen = \"127.0.0.1:1\"\n[discovery]\nsrv = \"_m._tcp.cache\"\n",
        "memring.toml",
    )
    .expect("valid");
    assert!(!plain.discovery.tls);
}

#[test]
fn backend_tls_needs_a_ca_file_and_both_halves_of_a_client_certificate() {
    let base = "listen = \"127.0.0.1:1\"\n[[servers]]\naddr = \"127.0.0.1:2\"\ntls = true\n";
    let error = error_of(&format!("{base}[backend_tls]\nserver_name = \"cache\"\n"));
    assert!(
        error.starts_with("memring.toml:5:1: [backend_tls] needs ca_file"),
        "{error}"
    );
    let error = error_of(&format!(
        "{base}[backend_tls]\nca_file = \"ca.pem\"\ncert_file = \"c.pem\"\n"
    ));
    assert!(
        error.starts_with("memring.toml:7:13: backend_tls.cert_file needs key_file"),
        "{error}"
    );
    let error = error_of(&format!(
        "{base}[backend_tls]\nca_file = \"ca.pem\"\nserver_name = \"not a name\"\n"
    ));
    assert!(
        error.contains("7:15: backend_tls.server_name `not a name`"),
        "{error}"
    );
}

#[test]
fn the_state_file_is_beside_the_config_unless_set() {
    let servers = "[[servers]]\naddr = \"127.0.0.1:2\"\n";
    let at = Path::new("/etc/memring/memring.toml");
    let unset = Config::parse(
        &format!("listen = \"127.0.0.1:7000\"\n{servers}"),
        "/etc/memring/memring.toml",
    )
    .unwrap();
    assert_eq!(
        unset.state_file, None,
        "only the binary fills in the default"
    );
    assert_eq!(
        unset.with_default_state_file(at).state_file.as_deref(),
        Some(Path::new("/etc/memring/memring.toml.handoff-state"))
    );
    for (written, path) in [
        ("state/windows", "/etc/memring/state/windows"),
        (
            "/var/lib/memring/handoff-state",
            "/var/lib/memring/handoff-state",
        ),
    ] {
        let text = format!("listen = \"127.0.0.1:7000\"\nstate_file = \"{written}\"\n{servers}");
        let config = Config::parse(&text, "/etc/memring/memring.toml").unwrap();
        let config = config.with_default_state_file(at);
        assert_eq!(config.state_file.as_deref(), Some(Path::new(path)));
    }
    let error = Config::parse(
        &format!("listen = \"127.0.0.1:7000\"\nstate_file = \" \"\n{servers}"),
        "m.toml",
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("state_file must name a file"), "{error}");
}

#[test]
fn tls_paths_are_relative_to_the_config_file_and_tls_listen_needs_its_own_port() {
    let text = "listen = \"127.0.0.1:7000\"\n[tls_listen]\naddr = \"127.0.0.1:7001\"\ncert_file = \"s.pem\"\nkey_file = \"/abs/s.key\"\n[backend_tls]\nca_file = \"ca.pem\"\n[[servers]]\naddr = \"127.0.0.1:2\"\ntls = true\n";
    let config = Config::parse(text, "/etc/memring/memring.toml").unwrap();
    let listen = config.tls_listen.expect("tls_listen");
    assert_eq!(listen.files.cert_file, Path::new("/etc/memring/s.pem"));
    assert_eq!(listen.files.key_file, Path::new("/abs/s.key"));
    assert_eq!(
        config.backend_tls.expect("backend_tls").ca_file,
        Path::new("/etc/memring/ca.pem")
    );
    assert!(config.servers[0].tls);
    let error = error_of(&text.replace("127.0.0.1:7001", "127.0.0.1:7000"));
    assert!(
        error.contains("3:8: tls_listen.addr = \"127.0.0.1:7000\" takes the port of listen"),
        "{error}"
    );
    let error = error_of(&text.replace("cert_file", "cert_fil"));
    assert!(
        error.contains("unknown key `cert_fil`; did you mean `cert_file`?"),
        "{error}"
    );
}

#[test]
fn a_missing_or_unparsable_tls_file_is_an_error_at_the_line_naming_it() {
    let dir = std::env::temp_dir().join(format!("memring-config-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("ca.pem"), "not a certificate\n").unwrap();
    let path = dir.join("memring.toml");
    let text = "listen = \"127.0.0.1:1\"\n[backend_tls]\nca_file = \"ca.pem\"\n[[servers]]\naddr = \"127.0.0.1:2\"\ntls = true\n";
    std::fs::write(&path, text).unwrap();
    let error = Config::load(&path).unwrap_err().to_string();
    assert!(
        error.contains("memring.toml:3:11: backend_tls: ")
            && error.contains("ca.pem: holds no PEM certificate"),
        "{error}"
    );
    std::fs::write(&path, text.replace("ca.pem", "missing.pem")).unwrap();
    let error = Config::load(&path).unwrap_err().to_string();
    assert!(
        error.contains(":3:11: backend_tls: ") && error.contains("missing.pem: cannot read"),
        "{error}"
    );
    // Parsing alone reads no file.
    assert!(Config::parse(text, "memring.toml").is_ok());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn good_config_gets_defaults_and_identities() {
    let config = Config::parse(GOOD, "memring.toml").unwrap();
    assert_eq!(config.listen, "127.0.0.1:22122".parse().unwrap());
    assert_eq!(config.servers.len(), 2);
    assert_eq!(config.servers[0].name, "127.0.0.1:11211");
    assert_eq!(config.servers[0].weight, 1);
    assert_eq!(config.servers[1].name, "cache-02");
    assert_eq!(config.servers[1].weight, 2);
    assert_eq!(config.connections_per_server, 1);
    assert_eq!(config.limits.max_value_bytes, 1024 * 1024);
    assert_eq!(config.max_server_inflight, 4096);
}

#[test]
fn max_server_inflight_is_a_count_or_zero_for_no_limit() {
    for (written, read) in [("0", 0), ("1", 1), ("1000000", 1_000_000)] {
        let text = format!("max_server_inflight = {written}\n{GOOD}");
        let config = Config::parse(&text, "memring.toml").unwrap();
        assert_eq!(config.max_server_inflight, read);
    }
    let message = error_of(&format!("max_server_inflight = 1000001\n{GOOD}"));
    assert!(
        message.contains("max_server_inflight = 1000001 is out of range 0..=1000000"),
        "{message}"
    );
}

#[test]
fn duplicate_server_names_file_line_and_first_place() {
    let text = GOOD.replace("127.0.0.1:11212", "127.0.0.1:11211");
    let message = error_of(&text);
    assert!(
        message.starts_with("memring.toml:8:8: duplicate server `127.0.0.1:11211`"),
        "{message}"
    );
    assert!(message.contains("first at line 4"), "{message}");
}

#[test]
fn weight_zero_is_rejected_with_its_place() {
    let message = error_of(&GOOD.replace("weight = 2", "weight = 0"));
    assert!(message.starts_with("memring.toml:9:10: "), "{message}");
    assert!(message.contains("weight 0"), "{message}");
}

#[test]
fn bad_addresses_are_rejected() {
    for bad in [
        "127.0.0.1",
        "127.0.0.1:0",
        "127.0.0.1:99999",
        "bad host:1",
        ":11211",
    ] {
        let message = error_of(&GOOD.replace("127.0.0.1:11212", bad));
        assert!(message.contains("server addr"), "{bad}: {message}");
    }
    assert!(error_of(&GOOD.replace("127.0.0.1:22122", "nowhere")).contains("listen"));
}

#[test]
fn unknown_keys_are_rejected() {
    let message = error_of(&format!("{GOOD}\nmax_conns = 3\n"));
    assert!(
        message.contains("unknown key `max_conns` in [[servers]]"),
        "{message}"
    );
    assert!(message.starts_with("memring.toml:12:1"), "{message}");
}

#[test]
fn an_unknown_key_gets_the_nearest_known_key_not_the_list_of_all() {
    for (written, suggested) in [
        ("handof_ms", Some("handoff_ms")),
        ("handoff", Some("handoff_ms")),
        ("hnadoff_ms", Some("handoff_ms")),
        ("handoff_msec", Some("handoff_ms")),
        ("Listen", Some("listen")),
        ("server", Some("servers")),
        ("replica", Some("replicas")),
        ("hot_keys_share", Some("hot_key_share")),
        ("request_timeout", Some("request_timeout_ms")),
        ("max_conns", None),
        ("distribution", None),
        ("timeout", None),
    ] {
        let message = error_of(&format!("{written} = 1\n{GOOD}"));
        let expected = match suggested {
                Some(near) => format!("memring.toml:1:1: unknown key `{written}`; did you mean `{near}`?"),
                None => format!("memring.toml:1:1: unknown key `{written}`: no key is spelt like it (docs/configuration.md lists them all)"),
            };
        assert_eq!(message, expected, "{written}");
    }
    for (written, suggested) in [
        ("address", "addr"),
        ("adr", "addr"),
        ("weigth", "weight"),
        ("nmae", "name"),
    ] {
        let message = error_of(&GOOD.replace("weight = 2", &format!("{written} = 2")));
        assert_eq!(
                message,
                format!("memring.toml:9:1: unknown key `{written}` in [[servers]]; did you mean `{suggested}`?")
            );
    }
}

#[test]
fn a_value_of_the_wrong_type_names_its_key_and_an_example() {
    for (written, expected) in [
            ("request_timeout_ms = \"100\"", "1:22: request_timeout_ms: expected a whole number, 0 or more, found string \"100\"; for example: request_timeout_ms = 1000"),
            ("max_value_bytes = -1", "1:19: max_value_bytes: expected a whole number, 0 or more, found integer `-1`; for example: max_value_bytes = 1048576"),
            ("replicas = 1.5", "1:12: replicas: expected a whole number, 0 or more, found floating point `1.5`; for example: replicas = 2"),
            ("auto_eject = \"yes\"", "1:14: auto_eject: expected true or false, found string \"yes\"; for example: auto_eject = true"),
            ("hot_key_share = \"x\"", "1:17: hot_key_share: expected a number, found string \"x\"; for example: hot_key_share = 0.2"),
            ("ring = 5", "1:8: ring: expected a quoted string, found integer `5`; for example: ring = \"twemproxy\""),
            ("  \"handoff_ms\" = true", "1:18: handoff_ms: expected a whole number, 0 or more, found boolean `true`; for example: handoff_ms = 300000"),
        ] {
            let message = error_of(&format!("{written}\n{GOOD}"));
            assert_eq!(message, format!("memring.toml:{expected}"), "{written}");
        }
    let inline =
        "listen = \"127.0.0.1:1\"\nservers = [{ addr = \"127.0.0.1:2\", weight = true }]\n";
    assert!(
            error_of(inline).starts_with("memring.toml:2:45: weight: expected a whole number, found boolean `true`; for example: weight = 2"),
            "{}",
            error_of(inline)
        );
    let message = error_of(&GOOD.replace("weight = 2", "weight = \"2\""));
    assert_eq!(message, "memring.toml:9:10: weight: expected a whole number, found string \"2\"; for example: weight = 2");
    let message = error_of(&GOOD.replace("name = \"cache-02\"", "name = 2"));
    assert!(
        message.ends_with(
            "name: expected a quoted string, found integer `2`; for example: name = \"cache-01\""
        ),
        "{message}"
    );
    let message = error_of("listen = \"127.0.0.1:1\"\n[servers]\naddr = \"127.0.0.1:2\"\n");
    assert!(
            message.starts_with("memring.toml:2:1: servers: expected an array, found a table; write one [[servers]] table (double brackets) per server"),
            "{message}"
        );
}

#[test]
fn every_key_has_an_example_that_loads() {
    let known = |text: &str| -> Vec<String> {
        let message = toml::from_str::<RawConfig>(text)
            .unwrap_err()
            .message()
            .to_string();
        let (_, list) = message
            .split_once("expected one of ")
            .expect("serde lists the keys");
        list.split('`')
            .skip(1)
            .step_by(2)
            .map(String::from)
            .collect()
    };
    let top = known(&format!("unknown_key = 1\n{GOOD}"));
    let server = known(&GOOD.replace("weight = 2", "unknown_key = 2"));
    assert!(top.len() > 20 && server.len() == 6, "{top:?} {server:?}");
    // The keys of the TLS tables, each with an example for messages.
    let tables = ["tls_listen", "backend_tls"];
    let mut table_keys: Vec<String> = tables
        .iter()
        .flat_map(|table| known(&format!("{GOOD}\n[{table}]\nunknown_key = 1\n")))
        .filter(|key| !server.contains(key))
        .collect();
    table_keys.sort();
    table_keys.dedup();
    for key in &table_keys {
        assert!(
            EXAMPLES.iter().any(|(name, _)| name == key),
            "no example for `{key}`"
        );
    }
    for key in top
        .iter()
        .chain(&server)
        .filter(|k| *k != "servers" && !tables.contains(&k.as_str()))
    {
        let (_, example) = EXAMPLES
            .iter()
            .find(|(name, _)| name == key)
            .unwrap_or_else(|| panic!("no example for `{key}`"));
        let text = if server.contains(key) {
            let addr = if key == "addr" {
                ""
            } else {
                "addr = \"127.0.0.1:2\"\n"
            };
            // `tls = true` needs a [backend_tls].
            format!("listen = \"127.0.0.1:1\"\n[backend_tls]\nca_file = \"ca.pem\"\n[[servers]]\n{key} = {example}\n{addr}")
        } else if key == "listen" {
            GOOD.replace("\"127.0.0.1:22122\"", example)
        } else if key == "listen_mode" {
            // A mode is a Unix socket's.
            GOOD.replace(
                "\"127.0.0.1:22122\"",
                &format!("\"unix:/run/memring.sock\"\n{key} = {example}"),
            )
        } else if key == "shadow" {
            // A shadow is another pool.
            format!("{key} = {example}\n{GOOD}[[pools]]\nname = \"candidate\"\n[[pools.servers]]\naddr = \"127.0.0.1:3\"\n")
        } else {
            let ring = if key == "ring" {
                ""
            } else {
                "ring = \"twemproxy\"\n"
            };
            // retry_timeout_ms belongs to twemproxy's ejection timing.
            let ejection = if key == "retry_timeout_ms" {
                "ejection = \"twemproxy\"\n"
            } else {
                ""
            };
            // failover names a gutter pool; failover_ttl_s needs one.
            let (failover, gutter) = match key.as_str() {
                    "failover" | "failover_ttl_s" => (
                        if key == "failover_ttl_s" { "failover = \"gutter\"\n" } else { "" },
                        "\n[[pools]]\nname = \"gutter\"\n[[pools.servers]]\naddr = \"10.0.0.8:11211\"\n",
                    ),
                    _ => ("", ""),
                };
            format!("{ring}{ejection}{failover}{key} = {example}\n{GOOD}{gutter}")
        };
        assert!(
            Config::parse(&text, "m").is_ok(),
            "{key} = {example}: {:?}",
            Config::parse(&text, "m").err()
        );
    }
    // The keys of [discovery] have examples of their own.
    let discovery = [
        "srv",
        "a",
        "interval_ms",
        "resolver",
        "etcd_endpoints",
        "etcd_prefix",
        "member_grace_ms",
        "fleet_switch_ms",
        "etcd_cut_off",
        "etcd_cache_file",
        "etcd_ca_file",
        "etcd_cert_file",
        "etcd_key_file",
        "etcd_username",
        "etcd_password_file",
    ];
    // A pool's keys are top-level keys; a route's have their own, and
    // a shadow's `pool` is a route's.
    let route = ["prefix", "pool"];
    let shadow = ["fraction"];
    let request_log = ["sample", "slow_ms", "errors", "keys", "max_lines_per_s"];
    for key in request_log {
        let (_, example) = EXAMPLES.iter().find(|(name, _)| *name == key).unwrap();
        let text = format!("{GOOD}\n[request_log]\n{key} = {example}\n");
        assert!(Config::parse(&text, "m").is_ok(), "{key} = {example}");
    }
    assert_eq!(
        EXAMPLES.len(),
        top.len() - 1 - tables.len()
            + server.len()
            + table_keys.len()
            + discovery.len()
            + route.len()
            + shadow.len()
            + request_log.len()
            // `zone` is a top-level key and a server's: one example serves.
            - 1,
        "an example of a key that is gone"
    );
}

#[test]
fn setting_names_are_the_keys_serde_accepts() {
    let names = setting_names();
    let server: Vec<&str> = names
        .iter()
        .filter_map(|n| n.strip_prefix("servers."))
        .collect();
    assert_eq!(server, ["addr", "weight", "name", "tls", "warming", "zone"]);
    assert!(names.iter().any(|n| n == "listen") && names.iter().any(|n| n == "servers"));
    // The TLS tables' keys share one example each (`addr` is the
    // servers' already).
    let tables = ["tls_listen", "backend_tls"];
    let mut table_keys: Vec<&str> = names
        .iter()
        .filter_map(|n| n.split_once('.'))
        .filter(|(table, key)| tables.contains(table) && !server.contains(key))
        .map(|(_, key)| key)
        .collect();
    table_keys.sort_unstable();
    table_keys.dedup();
    let mut keys: Vec<&str> = names
        .iter()
        .filter(|n| !n.contains('.') && *n != "servers" && !tables.contains(&n.as_str()))
        .map(String::as_str)
        .chain(server.iter().copied())
        .chain(table_keys)
        .chain(names.iter().filter_map(|n| n.strip_prefix("discovery.")))
        .chain(names.iter().filter_map(|n| n.strip_prefix("request_log.")))
        .chain(names.iter().filter_map(|n| n.strip_prefix("routes.")))
        .chain(names.iter().filter_map(|n| n.strip_prefix("shadow.")))
        .chain(
            names
                .iter()
                .filter_map(|n| n.strip_prefix("pools."))
                .filter(|k| *k != "servers"),
        )
        .collect();
    // `tls` is a key of a server and of [discovery]: one example serves.
    keys.sort_unstable();
    keys.dedup();
    for key in &keys {
        assert!(
            EXAMPLES.iter().any(|(name, _)| name == key),
            "`{key}` has no example"
        );
    }
    assert_eq!(EXAMPLES.len(), keys.len());
}

#[test]
fn twemproxy_server_lines_are_answered_with_the_memring_lines() {
    for (written, lines) in [
        (
            "127.0.0.1:11211:1",
            "addr = \"127.0.0.1:11211\", weight = 1",
        ),
        (
            "127.0.0.1:11211:2 cache-01",
            "addr = \"127.0.0.1:11211\", weight = 2, name = \"cache-01\"",
        ),
        (
            "cache.internal:11211:10  cache-01",
            "addr = \"cache.internal:11211\", weight = 10, name = \"cache-01\"",
        ),
        ("[::1]:11211:1", "addr = \"[::1]:11211\", weight = 1"),
    ] {
        let message = error_of(&GOOD.replace("127.0.0.1:11212", written));
        assert_eq!(
                message,
                format!("memring.toml:8:8: server addr `{written}` is twemproxy's `host:port:weight [name]` form; in memring write {lines}")
            );
    }
    // Not the twemproxy form: the usual message.
    for other in [
        "127.0.0.1:11211:x",
        "127.0.0.1:11211:1 two names",
        "nohost:1:1:1",
    ] {
        let message = error_of(&GOOD.replace("127.0.0.1:11212", other));
        assert!(!message.contains("twemproxy"), "{other}: {message}");
    }
}

#[test]
fn host_names_and_ipv6_are_accepted() {
    let text = GOOD.replace("127.0.0.1:11212", "cache-02.internal:11211");
    assert!(Config::parse(&text, "m").is_ok());
    let text = GOOD.replace("127.0.0.1:11212", "[::1]:11211");
    assert!(Config::parse(&text, "m").is_ok());
}

#[test]
fn no_servers_is_an_error() {
    assert!(error_of("listen = \"127.0.0.1:1\"\n").contains("no [[servers]]"));
}

#[test]
fn more_replicas_than_servers_is_a_warning_not_an_error() {
    let config = Config::parse(&format!("replicas = 3\n{GOOD}"), "m").unwrap();
    let warnings = config.warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].starts_with("replicas = 3 but only 2 servers"));
    let config = Config::parse(&format!("replicas = 2\n{GOOD}"), "m").unwrap();
    assert!(config.warnings().is_empty());
}

#[test]
fn ring_hash_and_hash_tag_are_read() {
    let config = Config::parse(
        &format!("ring = \"twemproxy\"\nhash = \"murmur\"\nhash_tag = \"{{}}\"\n{GOOD}"),
        "m",
    )
    .unwrap();
    assert_eq!(config.ring.flavour, Flavour::Twemproxy);
    assert_eq!(config.ring.hash, HashFunction::Murmur);
    assert_eq!(config.ring.hash_tag, Some(*b"{}"));
    let default = Config::parse(GOOD, "m").unwrap();
    assert_eq!(default.ring, Spec::default());
    let libmemcached = Config::parse(&format!("ring = \"libmemcached\"\n{GOOD}"), "m").unwrap();
    // Weights 1 and 2 of two servers: floor(1/3 × 80) × 4 and
    // floor(2/3 × 80) × 4 points.
    assert_eq!(libmemcached.build_ring().point_count(), 104 + 212);
}

#[test]
fn hash_without_prefix_is_read_at_the_top_and_per_pool() {
    let pool = "[[pools]]\nname = \"other\"\nhash_without_prefix = \"b:\"\n[[pools.servers]]\naddr = \"127.0.0.1:3\"\n";
    let config = Config::parse(
        &format!("hash_without_prefix = \"myapp:\"\n{GOOD}{pool}"),
        "m",
    )
    .unwrap();
    assert_eq!(&*config.ring.hash_without_prefix, b"myapp:");
    let other = config.pool("other").expect("pool other");
    assert_eq!(&*other.config.ring.hash_without_prefix, b"b:");
    let ring = config.build_ring();
    assert_eq!(ring.owner(b"myapp:user:1"), ring.owner(b"user:1"));
    for (bad, why) in [
        ("", "strips nothing"),
        ("my app:", "space or control character"),
        ("my\\tapp:", "space or control character"),
    ] {
        let message = error_of(&format!("hash_without_prefix = \"{bad}\"\n{GOOD}"));
        assert!(
            message.starts_with("memring.toml:1:23: hash_without_prefix") && message.contains(why),
            "{bad:?}: {message}"
        );
    }
    let long = "p".repeat(251);
    let message = error_of(&format!("hash_without_prefix = \"{long}\"\n{GOOD}"));
    assert!(message.contains("at most 250"), "{message}");
}

#[test]
fn bad_ring_settings_are_rejected_with_their_place() {
    let message = error_of(&format!("ring = \"ketama\"\n{GOOD}"));
    assert!(
        message.starts_with("memring.toml:1:8: ring = \"ketama\""),
        "{message}"
    );
    assert!(
        message.contains("memring, twemproxy, libmemcached, rendezvous, dalli, php-memcache"),
        "{message}"
    );
    let message = error_of(&format!("ring = \"twemproxy\"\nhash = \"sha1\"\n{GOOD}"));
    assert!(
        message.starts_with("memring.toml:2:8: hash = \"sha1\""),
        "{message}"
    );
    let message = error_of(&format!("hash = \"md5\"\n{GOOD}"));
    assert!(
        message.contains("hash applies to ring = \"twemproxy\""),
        "{message}"
    );
    let message = error_of(&format!(
        "ring = \"libmemcached\"\nhash = \"murmur\"\n{GOOD}"
    ));
    assert!(message.contains("md5 only"), "{message}");
    for tag in ["{", "{}}", "{ ", ""] {
        let message = error_of(&format!("hash_tag = \"{tag}\"\n{GOOD}"));
        assert!(
            message.contains("two printable ASCII characters"),
            "{tag}: {message}"
        );
    }
}

#[test]
fn dalli_ring_takes_weights_and_refuses_a_hash() {
    let config = Config::parse(&format!("ring = \"dalli\"\n{GOOD}"), "m").unwrap();
    assert_eq!(config.ring.flavour, Flavour::Dalli);
    // Weights 1 and 2 of two servers: floor(2 × 160 × 1 / 3) and
    // floor(2 × 160 × 2 / 3) points.
    assert_eq!(config.build_ring().point_count(), 106 + 213);
    let message = error_of(&format!("ring = \"dalli\"\nhash = \"crc32a\"\n{GOOD}"));
    assert!(message.contains("crc32 as Dalli does"), "{message}");
}

#[test]
fn php_memcache_ring_takes_phps_hash_names() {
    let config = Config::parse(&format!("ring = \"php-memcache\"\n{GOOD}"), "m").unwrap();
    assert_eq!(config.ring.flavour, Flavour::PhpMemcache);
    assert_eq!(config.ring.hash, HashFunction::Crc32a, "PHP's default");
    // 160 points per unit of weight: weights 1 and 2.
    assert_eq!(config.build_ring().point_count(), 160 + 320);
    let fnv = Config::parse(
        &format!("ring = \"php-memcache\"\nhash = \"fnv\"\n{GOOD}"),
        "m",
    )
    .unwrap();
    assert_eq!(fnv.ring.hash, HashFunction::Fnv1a32);
    let message = error_of(&format!(
        "ring = \"php-memcache\"\nhash = \"fnv1a_64\"\n{GOOD}"
    ));
    assert!(
        message.starts_with(
            "memring.toml:2:8: ring = \"php-memcache\" takes memcache.hash_function's names"
        ),
        "{message}"
    );
}

#[test]
fn rendezvous_ring_refuses_weights_and_a_hash() {
    let servers = "[[servers]]\naddr = \"127.0.0.1:11211\"\n\n[[servers]]\naddr = \"127.0.0.1:11212\"\nname = \"b\"\nweight = 1\n";
    let config = Config::parse(
        &format!("listen = \"127.0.0.1:22122\"\nring = \"rendezvous\"\nreplicas = 2\n{servers}"),
        "m",
    )
    .unwrap();
    assert_eq!(config.ring.flavour, Flavour::Rendezvous);
    assert_eq!(config.build_ring().point_count(), 2);
    let slow = |w: &String| w.contains("takes over 1 µs per key above");
    assert!(
        !config.warnings().iter().any(slow),
        "{:?}",
        config.warnings()
    );
    // Above the server count where a lookup passes 1 µs, check says so.
    let most = crate::ring::rendezvous::MAX_SERVERS_UNDER_A_MICROSECOND;
    let many: String = (0..=most)
        .map(|i| {
            format!(
                "[[servers]]\naddr = \"10.0.{}.{}:11211\"\n",
                i / 250,
                i % 250
            )
        })
        .collect();
    let config = Config::parse(
        &format!("listen = \"127.0.0.1:22122\"\nring = \"rendezvous\"\n{many}"),
        "m",
    )
    .unwrap();
    let warnings = config.warnings();
    assert!(warnings.iter().any(slow), "{warnings:?}");
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("takes over 1 µs per key above")),
        "{warnings:?}"
    );
    // pymemcache's HashClient has no weights: a weight it cannot honour is
    // an error at its place.
    let message = error_of(&format!("ring = \"rendezvous\"\n{GOOD}"));
    assert!(
        message.starts_with("memring.toml:10:10: ring = \"rendezvous\" has no weights"),
        "{message}"
    );
    let message = error_of(&format!("ring = \"rendezvous\"\nhash = \"murmur\"\n{GOOD}"));
    assert!(message.contains("murmur3_32"), "{message}");
}

#[test]
fn hot_key_settings_have_defaults_and_bounds() {
    let default = Config::parse(GOOD, "m").unwrap().hot_keys;
    assert_eq!(default, HotKeySettings::default());
    assert!(default.coalesce && default.cache_ttl.is_none());
    let set = Config::parse(
            &format!("hot_key_share = 0.5\nhot_key_cache_ms = 100\nhot_key_metrics = true\nhot_key_coalesce = false\n{GOOD}"),
            "m",
        )
        .unwrap()
        .hot_keys;
    assert_eq!(set.share, 0.5);
    assert_eq!(set.cache_ttl, Some(Duration::from_millis(100)));
    assert!(set.metrics_names && !set.coalesce);
    for bad in ["0.0", "1.5", "-0.1", "nan"] {
        let message = error_of(&format!("hot_key_share = {bad}\n{GOOD}"));
        assert!(
            message.starts_with("memring.toml:1:17: hot_key_share"),
            "{bad}: {message}"
        );
    }
    let off = Config::parse(&format!("hot_key_detect = false\n{GOOD}"), "m")
        .unwrap()
        .hot_keys;
    assert!(!off.detect && !off.coalesce);
    let message = error_of(&format!(
        "hot_key_detect = false\nhot_key_cache_ms = 100\n{GOOD}"
    ));
    assert!(
        message.starts_with("memring.toml:1:18: hot_key_detect = false leaves"),
        "{message}"
    );
    let message = error_of(&format!("hot_key_window_ms = 5\n{GOOD}"));
    assert!(
        message.contains("hot_key_window_ms = 5 is out of range"),
        "{message}"
    );
}

#[test]
fn quotes_backslashes_and_control_bytes_are_refused_in_names_and_addresses() {
    // (as written in TOML, what the message names)
    for (written, named) in [
        (r#"\""#, "a double quote (\")"),
        (r"\\", "a backslash (\\)"),
        (r"\u0000", "a NUL byte (0x00)"),
        (r"\u0007", "a control byte (0x07)"),
        (r"\t", "a control byte (0x09)"),
        (r"\n", "a control byte (0x0a)"),
        (r"\u001f", "a control byte (0x1f)"),
        (r"\u007f", "a DEL byte (0x7f)"),
    ] {
        let addr = GOOD.replace("127.0.0.1:11212", &format!("127.0.0.1{written}:11212"));
        let message = error_of(&addr);
        assert!(
            message.starts_with("memring.toml:8:8: server addr"),
            "{written}: {message}"
        );
        assert!(
            message.contains(&format!("contains {named}")),
            "{written}: {message}"
        );
        let name = GOOD.replace("cache-02", &format!("cache{written}02"));
        let message = error_of(&name);
        assert!(
            message.starts_with("memring.toml:10:8: server name"),
            "{written}: {message}"
        );
        assert!(
            message.contains(&format!("contains {named}")),
            "{written}: {message}"
        );
    }
    // Other non-ASCII text is a name like any other.
    let config = Config::parse(&GOOD.replace("cache-02", "cache-ü"), "m").unwrap();
    assert_eq!(config.servers[1].name, "cache-ü");
}

/// Two servers: 127.0.0.1:11211 at line 5 and `second` at line 7.
fn two_servers(second: &str, replicas: u32) -> String {
    format!(
            "listen = \"127.0.0.1:22122\"\nreplicas = {replicas}\n\n[[servers]]\naddr = \"127.0.0.1:11211\"\n[[servers]]\naddr = \"{second}\"\n"
        )
}

#[test]
fn spellings_of_one_memcached_are_one_server() {
    for alias in [
        "127.0.0.01:11211",
        "127.0.0.1:011211",
        "[::ffff:127.0.0.1]:11211",
        "[0:0:0:0:0:ffff:7f00:1]:11211",
        "127.1:11211",
        "0x7f.0.0.1:11211",
        "0177.0.0.1:11211",
        "2130706433:11211",
    ] {
        let config = Config::parse(&two_servers(alias, 1), "m").unwrap();
        let warnings = config.warnings();
        assert_eq!(warnings.len(), 1, "{alias}: {warnings:?}");
        assert_eq!(
                warnings[0],
                format!("servers `127.0.0.1:11211` (line 5) and `{alias}` (line 7) are the same memcached (127.0.0.1:11211): it gets the keys of both")
            );
        let message = error_of(&two_servers(alias, 2));
        assert!(
                message.starts_with(&format!("memring.toml:7:8: server `{alias}` is the same memcached as `127.0.0.1:11211` (line 5; both reach 127.0.0.1:11211): with replicas = 2")),
                "{alias}: {message}"
            );
    }
    let names = "listen = \"127.0.0.1:1\"\nreplicas = 2\n[[servers]]\naddr = \"cache.internal:11211\"\n[[servers]]\naddr = \"CACHE.internal:11211\"\n";
    assert!(error_of(names).contains("both reach cache.internal:11211"));
    // Near spellings of other memcacheds are other servers.
    for other in [
        "127.0.0.1:11212",
        "127.0.0.010:11211", // octal: 127.0.0.8
        "0127.0.0.1:11211",  // octal: 87.0.0.1
        "127.0.0.2:11211",
        "[::1]:11211",
        "cache.internal:11211",
    ] {
        let config = Config::parse(&two_servers(other, 2), "m").unwrap();
        assert!(
            config.warnings().is_empty(),
            "{other}: {:?}",
            config.warnings()
        );
    }
}

#[test]
fn numeric_hosts_are_read_as_getaddrinfo_reads_them() {
    // The system resolver is the oracle: these never reach DNS.
    for host in [
        "127.0.0.1",
        "127.0.0.01",
        "127.0.0.010",
        "0127.0.0.1",
        "127.00.0.1",
        "127.1",
        "127.0.1",
        "0x7f.0.0.1",
        "0X7F.1",
        "2130706433",
        "0",
        "10.0x10.255.0377",
        "1.65535",
        "1.2.65535",
    ] {
        let resolved: Vec<IpAddr> = (host, 1)
            .to_socket_addrs()
            .unwrap_or_else(|e| panic!("{host}: {e}"))
            .map(|socket| socket.ip())
            .collect();
        let ours = numeric_ipv4(host).map(IpAddr::V4);
        assert_eq!(resolved, Vec::from_iter(ours), "{host}");
    }
    // Not numbers to getaddrinfo either: it asks DNS for these.
    for name in [
        "127.0.0.08",
        "127.0.0.256",
        "1.2.3.4.5",
        "127.0.0.1.",
        "127..1",
        "0x",
        "1.16777216",
        "4294967296",
        "cache-01",
        "+1.2.3.4",
    ] {
        assert_eq!(numeric_ipv4(name), None, "{name}");
    }
}

#[test]
fn a_host_name_and_its_address_are_one_server_once_resolved() {
    let text = two_servers("localhost:11211", 1);
    // Without looking names up, a name is only its spelling.
    assert!(Config::parse(&text, "m").unwrap().warnings().is_empty());
    let warnings = Config::parse_and_resolve(&text, "m").unwrap().warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("`localhost:11211` (line 7) are the same memcached (127.0.0.1:11211)"),
        "{warnings:?}"
    );
    let message = Config::parse_and_resolve(&two_servers("localhost:11211", 3), "m")
        .unwrap_err()
        .to_string();
    assert!(
        message.starts_with("m:7:8: server `localhost:11211` is the same memcached"),
        "{message}"
    );
}

#[test]
fn a_name_that_does_not_resolve_is_a_warning_naming_the_server() {
    // RFC 6761: .invalid names never resolve.
    let config =
        Config::parse_and_resolve(&two_servers("memring-test.invalid:11211", 2), "m").unwrap();
    let warnings = config.warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
            warnings[0].starts_with(
                "server `memring-test.invalid:11211` (line 7): `memring-test.invalid` does not resolve ("
            ),
            "{warnings:?}"
        );
}

#[test]
fn admin_listen_on_the_port_of_listen_is_refused() {
    for (listen, admin, refused) in [
        ("127.0.0.1:22122", "127.0.0.1:22122", true),
        ("127.0.0.1:22122", "[::ffff:127.0.0.1]:22122", true),
        ("0.0.0.0:22122", "127.0.0.1:22122", true),
        ("127.0.0.1:22122", "0.0.0.0:22122", true),
        ("[::]:22122", "10.0.0.1:22122", true),
        ("[::1]:22122", "[::1]:22122", true),
        ("127.0.0.1:22122", "127.0.0.1:9100", false),
        ("127.0.0.1:22122", "127.0.0.2:22122", false),
        ("0.0.0.0:22122", "[::1]:22122", false),
        ("127.0.0.1:0", "127.0.0.1:0", false),
    ] {
        let text = GOOD.replace(
            "listen = \"127.0.0.1:22122\"",
            &format!("listen = \"{listen}\"\nadmin_listen = \"{admin}\""),
        );
        match Config::parse(&text, "memring.toml") {
            Ok(_) => assert!(!refused, "{listen} {admin}: accepted"),
            Err(e) => {
                let message = e.to_string();
                assert!(refused, "{listen} {admin}: {message}");
                assert_eq!(
                        message,
                        format!("memring.toml:3:16: admin_listen = \"{admin}\" takes the port of listen = \"{listen}\" (line 2): the admin listener needs an address of its own")
                    );
            }
        }
    }
}

#[test]
fn discovery_lists_the_pool_instead_of_servers() {
    let text = "listen = \"127.0.0.1:1\"\n[discovery]\nsrv = \"_memcache._tcp.cache.default.svc.\"\ninterval_ms = 250\nresolver = \"127.0.0.1:5353\"\n";
    let config = Config::parse(text, "m").unwrap();
    assert!(config.servers.is_empty());
    assert!(config.warnings().is_empty(), "{:?}", config.warnings());
    let discovery = &config.discovery;
    assert_eq!(
        discovery.source,
        Some(Source::Srv("_memcache._tcp.cache.default.svc".into()))
    );
    assert_eq!(discovery.interval, Duration::from_millis(250));
    assert_eq!(
        discovery.dns.server,
        Some("127.0.0.1:5353".parse().unwrap())
    );
    let a = Config::parse(
            "listen = \"127.0.0.1:1\"\n[discovery]\na = \"cache.default.svc:11211\"\nresolver = \"10.96.0.10\"\n",
            "m",
        )
        .unwrap();
    assert_eq!(
        a.discovery.source,
        Some(Source::A {
            host: "cache.default.svc".into(),
            port: 11211
        })
    );
    assert_eq!(
        a.discovery.dns.server,
        Some("10.96.0.10:53".parse().unwrap())
    );
    // Without srv or a: only where and how often names are looked up.
    let names = Config::parse(
        &format!("{GOOD}\n[discovery]\nresolver = \"[::1]:53\"\n"),
        "m",
    )
    .unwrap();
    assert_eq!(names.discovery.source, None);
    assert_eq!(names.servers.len(), 2);
    assert_eq!(
        Config::parse(GOOD, "m").unwrap().discovery.interval,
        Duration::from_millis(DEFAULT_DISCOVERY_INTERVAL_MS)
    );
}

#[test]
fn etcd_discovery_needs_no_servers_and_takes_its_defaults() {
    let text = "listen = \"127.0.0.1:1\"\n[discovery]\netcd_endpoints = [\"127.0.0.1:2379\", \"http://10.0.0.2:2379/\"]\netcd_prefix = \"/memring/web/\"\n";
    let config = Config::parse(text, "/etc/memring.toml").unwrap();
    assert!(config.servers.is_empty());
    let etcd = config.discovery.etcd.unwrap();
    assert_eq!(
        etcd.endpoints,
        ["http://127.0.0.1:2379", "http://10.0.0.2:2379"]
    );
    assert_eq!(etcd.prefix, "/memring/web/");
    assert_eq!(etcd.member_grace, std::time::Duration::from_millis(10_000));
    assert_eq!(etcd.fleet_switch, std::time::Duration::from_millis(30_000));
    assert_eq!(
        etcd.cache_file,
        std::path::PathBuf::from("/etc/memring.toml.members.json")
    );
    assert_eq!(etcd.access, crate::config::EtcdAccess::default());
    // The file's servers are kept beside etcd's.
    let with = format!("{text}[[servers]]\naddr = \"127.0.0.1:2\"\n");
    assert_eq!(Config::parse(&with, "m").unwrap().servers.len(), 1);
    // With a CA, host:port alone is https.
    let tls = "listen = \"127.0.0.1:1\"\n[discovery]\netcd_endpoints = [\"10.0.0.1:2379\"]\netcd_prefix = \"/m/\"\netcd_ca_file = \"ca.pem\"\netcd_cert_file = \"c.pem\"\netcd_key_file = \"c.key\"\netcd_username = \"memring\"\netcd_password_file = \"pw\"\n";
    let etcd = Config::parse(tls, "m").unwrap().discovery.etcd.unwrap();
    assert_eq!(etcd.endpoints, ["https://10.0.0.1:2379"]);
    assert_eq!(etcd.access.ca_file, Some("ca.pem".into()));
    assert_eq!(etcd.access.identity, Some(("c.pem".into(), "c.key".into())));
    assert_eq!(etcd.access.user, Some(("memring".into(), "pw".into())));
}

#[test]
fn bad_discovery_settings_are_rejected_with_their_place() {
    let base = "listen = \"127.0.0.1:1\"\n[discovery]\n";
    for (body, expected) in [
        (
            "srv = \"_m._tcp.x\"\na = \"x:1\"\n",
            "m:4:5: [discovery] takes srv or a, not both",
        ),
        (
            "srv = \"_m._tcp.x:11211\"\n",
            "m:3:7: [discovery] srv = \"_m._tcp.x:11211\" is not a DNS name",
        ),
        (
            "a = \"cache.svc\"\n",
            "m:3:5: [discovery] a = \"cache.svc\" must be host:port",
        ),
        (
            "a = \"cache.svc:0\"\n",
            "m:3:5: [discovery] a = \"cache.svc:0\"",
        ),
        (
            "interval_ms = 10\n",
            "m:3:15: interval_ms = 10 is out of range 100..=3600000",
        ),
        (
            "resolver = \"dns.local:53\"\n",
            "m:3:12: resolver = \"dns.local:53\" must be the IP address of a DNS server",
        ),
        (
            "intervall_ms = 100\n",
            "m:3:1: unknown key `intervall_ms` in [discovery]; did you mean `interval_ms`?",
        ),
        (
            "",
            "no [[servers]]: at least one server is needed (or [discovery] with srv, a or etcd_endpoints)",
        ),
        (
            "etcd_endpoints = [\"http://127.0.0.1:2379\"]\n",
            "etcd_endpoints needs etcd_prefix",
        ),
        (
            "etcd_endpoints = []\netcd_prefix = \"/m/\"\n",
            "etcd_endpoints is empty",
        ),
        (
            "etcd_endpoints = [\"https://e:2379\"]\netcd_prefix = \"/m/\"\n",
            "https:// endpoints need etcd_ca_file",
        ),
        (
            "etcd_endpoints = [\"ftp://e:2379\"]\netcd_prefix = \"/m/\"\n",
            "must be http://host:port or https://host:port",
        ),
        (
            "etcd_endpoints = [\"http://e:2379\", \"https://f:2379\"]\netcd_prefix = \"/m/\"\netcd_ca_file = \"ca.pem\"\n",
            "mixes http:// and https://",
        ),
        (
            "etcd_endpoints = [\"http://e:2379\"]\netcd_prefix = \"/m/\"\netcd_ca_file = \"ca.pem\"\n",
            "the endpoints must then be https://",
        ),
        (
            "etcd_endpoints = [\"https://e:2379\"]\netcd_prefix = \"/m/\"\netcd_ca_file = \"ca.pem\"\netcd_cert_file = \"c.pem\"\n",
            "m:6:18: etcd_cert_file needs etcd_key_file beside it",
        ),
        (
            "etcd_endpoints = [\"http://e:2379\"]\netcd_prefix = \"/m/\"\netcd_username = \"root\"\n",
            "etcd_username needs etcd_password_file",
        ),
        (
            "etcd_endpoints = [\"http://e:2379\"]\netcd_prefix = \"/m/\"\netcd_password = \"pw\"\n",
            "unknown key `etcd_password` in [discovery]",
        ),
        (
            "etcd_username = \"root\"\n",
            "etcd_username is an etcd setting: it needs etcd_endpoints",
        ),
        (
            "etcd_endpoints = [\"http://e:2379\"]\netcd_prefix = \"/m\"\n",
            "etcd_prefix = \"/m\" must end in /",
        ),
        (
            "etcd_prefix = \"/m/\"\n",
            "etcd_prefix is an etcd setting: it needs etcd_endpoints",
        ),
        (
            "etcd_endpoints = [\"http://e:2379\"]\netcd_prefix = \"/m/\"\nmember_grace_ms = 3600001\n",
            "member_grace_ms = 3600001 is out of range 0..=3600000",
        ),
        (
            "etcd_endpoints = [\"http://e:2379\"]\netcd_prefix = \"/m/\"\nfleet_switch_ms = 3600001\n",
            "fleet_switch_ms = 3600001 is out of range 0..=3600000",
        ),
        (
            "etcd_endpoints = [\"http://e:2379\"]\netcd_prefix = \"/m/\"\nsrv = \"_m._tcp.x\"\n",
            "[discovery] etcd_endpoints and srv _m._tcp.x both list the default pool's servers",
        ),
    ] {
        let message = Config::parse(&format!("{base}{body}"), "m")
            .unwrap_err()
            .to_string();
        assert!(message.contains(expected), "{body}: {message}");
    }
    let both = format!("{GOOD}\n[discovery]\nsrv = \"_m._tcp.x\"\n");
    let message = Config::parse(&both, "m").unwrap_err().to_string();
    assert!(
        message.starts_with(
            "m:4:1: [[servers]] and [discovery] srv _m._tcp.x both list the default pool's servers"
        ),
        "{message}"
    );
}

#[test]
fn a_servers_ring_place_comes_from_its_name_as_written_not_its_address() {
    // Two spellings that reach the same memcached are two places; the
    // same name is one place whatever it resolves to (resolution never
    // enters the ring).
    let named = |addr: &str| {
        Config::parse(
                &format!("listen = \"127.0.0.1:1\"\n[[servers]]\naddr = \"{addr}\"\n[[servers]]\naddr = \"cache-1.svc:11211\"\n"),
                "m",
            )
            .unwrap()
            .build_ring()
    };
    assert_eq!(named("cache-0.svc:11211"), named("cache-0.svc:11211"));
    assert_ne!(named("cache-0.svc:11211"), named("10.0.0.7:11211"));
    for flavour in ["twemproxy", "libmemcached"] {
        let ring = |addr: &str| {
            Config::parse(
                    &format!("ring = \"{flavour}\"\nlisten = \"127.0.0.1:1\"\n[[servers]]\naddr = \"{addr}\"\n[[servers]]\naddr = \"b.svc:1\"\n"),
                    "m",
                )
                .unwrap()
                .build_ring()
        };
        assert_eq!(ring("a.svc:1"), ring("a.svc:1"), "{flavour}");
    }
}

#[test]
fn out_of_range_settings_are_rejected() {
    let message = error_of(&format!("connections_per_server = 0\n{GOOD}"));
    assert!(
        message.starts_with("memring.toml:1:26: connections_per_server"),
        "{message}"
    );
}

#[test]
fn shared_with_says_who_else_uses_the_servers_and_a_drop_in_ring_without_it_is_warned() {
    let parse = |text: &str| Config::parse(&format!("{text}\n{GOOD}"), "memring.toml");
    assert_eq!(parse("").unwrap().shared_with, SharedWith::Memring);
    for value in SharedWith::ALL {
        let config = parse(&format!("shared_with = \"{}\"", value.name())).unwrap();
        assert_eq!(config.shared_with, value);
    }
    assert_eq!(
        (
            SharedWith::Memring.reads_through(),
            SharedWith::Memring.copies()
        ),
        (true, true)
    );
    assert_eq!(
        (
            SharedWith::Readers.reads_through(),
            SharedWith::Readers.copies()
        ),
        (true, false)
    );
    assert_eq!(
        (
            SharedWith::Writers.reads_through(),
            SharedWith::Writers.copies()
        ),
        (false, false)
    );
    let message = error_of(&format!("shared_with = \"nutcracker\"\n{GOOD}"));
    assert!(
            message.starts_with("memring.toml:1:15: shared_with = \"nutcracker\" is not who shares the servers (one of: memring, readers, writers)"),
            "{message}"
        );
    // A drop-in ring without the setting is warned about; with it, or
    // without a window, or on memring's own ring, it is not.
    let warned = |text: &str| {
        parse(text)
            .unwrap()
            .warnings()
            .iter()
            .any(|w| w.contains("shared_with is not set"))
    };
    assert!(warned("ring = \"twemproxy\""));
    assert!(warned("ring = \"libmemcached\""));
    assert!(!warned("ring = \"twemproxy\"\nshared_with = \"memring\""));
    assert!(!warned("ring = \"twemproxy\"\nshared_with = \"writers\""));
    assert!(!warned("ring = \"twemproxy\"\nhandoff_ms = 0"));
    assert!(!warned(""));
    // A pool takes the top level's value or sets its own.
    let pools = Config::parse(
            &format!("shared_with = \"readers\"\n{GOOD}\n[[pools]]\nname = \"a\"\n[[pools.servers]]\naddr = \"127.0.0.1:5\"\n[[pools]]\nname = \"b\"\nshared_with = \"writers\"\n[[pools.servers]]\naddr = \"127.0.0.1:6\"\n"),
            "memring.toml",
        )
        .unwrap();
    assert_eq!(
        pools.pool("a").unwrap().config.shared_with,
        SharedWith::Readers
    );
    assert_eq!(
        pools.pool("b").unwrap().config.shared_with,
        SharedWith::Writers
    );
}

#[test]
fn flush_new_servers_is_auto_by_default_and_auto_spares_servers_shared_with_writers() {
    use crate::config::FlushNewServers;
    let parse = |text: &str| Config::parse(&format!("{text}\n{GOOD}"), "memring.toml");
    assert_eq!(parse("").unwrap().flush_new_servers, FlushNewServers::Auto);
    for value in FlushNewServers::ALL {
        let config = parse(&format!("flush_new_servers = \"{}\"", value.name())).unwrap();
        assert_eq!(config.flush_new_servers, value);
    }
    for (setting, shared, flushes) in [
        (FlushNewServers::Auto, SharedWith::Memring, true),
        (FlushNewServers::Auto, SharedWith::Readers, true),
        (FlushNewServers::Auto, SharedWith::Writers, false),
        (FlushNewServers::Always, SharedWith::Writers, true),
        (FlushNewServers::Never, SharedWith::Memring, false),
    ] {
        assert_eq!(setting.flushes(shared), flushes, "{setting:?} {shared:?}");
    }
    let message = error_of(&format!("flush_new_servers = \"yes\"\n{GOOD}"));
    assert!(
        message.starts_with("memring.toml:1:21: flush_new_servers = \"yes\" is not a choice (one of: auto, always, never)"),
        "{message}"
    );
    // A pool takes the top level's value or sets its own.
    let pools = Config::parse(
            &format!("flush_new_servers = \"never\"\n{GOOD}\n[[pools]]\nname = \"a\"\n[[pools.servers]]\naddr = \"127.0.0.1:5\"\n[[pools]]\nname = \"b\"\nflush_new_servers = \"always\"\n[[pools.servers]]\naddr = \"127.0.0.1:6\"\n"),
            "memring.toml",
        )
        .unwrap();
    assert_eq!(
        pools.pool("a").unwrap().config.flush_new_servers,
        FlushNewServers::Never
    );
    assert_eq!(
        pools.pool("b").unwrap().config.flush_new_servers,
        FlushNewServers::Always
    );
}

#[test]
fn twemproxy_ejection_takes_nutcrackers_defaults_and_retry_needs_it() {
    let parse = |text: &str| Config::parse(&format!("{text}\n{GOOD}"), "memring.toml");
    let own = parse("").unwrap();
    assert_eq!((own.ejection, own.failure_limit), (Ejection::Memring, 3));
    let twemproxy = parse("ejection = \"twemproxy\"").unwrap();
    assert_eq!(
        (twemproxy.ejection, twemproxy.failure_limit),
        (
            Ejection::Twemproxy {
                retry: Duration::from_millis(30_000)
            },
            2
        ),
        "server_retry_timeout and server_failure_limit as nutcracker's defaults"
    );
    let set =
        parse("ejection = \"twemproxy\"\nretry_timeout_ms = 3000\nfailure_limit = 5").unwrap();
    assert_eq!(
        (set.ejection, set.failure_limit),
        (
            Ejection::Twemproxy {
                retry: Duration::from_millis(3000)
            },
            5
        )
    );
    let message = error_of(&format!("retry_timeout_ms = 3000\n{GOOD}"));
    assert!(
        message
            .starts_with("memring.toml:1:20: retry_timeout_ms applies to ejection = \"twemproxy\""),
        "{message}"
    );
    let message = error_of(&format!("ejection = \"nutcracker\"\n{GOOD}"));
    assert!(
        message.ends_with(
            "ejection = \"nutcracker\" is not an ejection timing (one of: memring, twemproxy)"
        ),
        "{message}"
    );
}

#[test]
fn listen_takes_a_unix_socket_with_its_mode_and_refuses_what_cannot_be_one() {
    let servers = "\n[[servers]]\naddr = \"127.0.0.1:11211\"\n";
    let parse = |head: &str| Config::parse(&format!("{head}{servers}"), "memring.toml");
    let config =
        parse("listen = \"unix:/run/memring/memring.sock\"\nlisten_mode = \"0660\"").unwrap();
    assert_eq!(
        config.listen,
        Listen::Unix {
            path: "/run/memring/memring.sock".into(),
            mode: Some(0o660)
        }
    );
    assert_eq!(config.listen.to_string(), "unix:/run/memring/memring.sock");
    assert_eq!(config.listen.mode_text(), "0660");
    // Without listen_mode: the umask decides.
    let config = parse("listen = \"unix:/run/m.sock\"").unwrap();
    assert_eq!(
        config.listen.unix_path(),
        Some(std::path::Path::new("/run/m.sock"))
    );
    assert_eq!(config.listen.mode_text(), "-");
    let long = format!("/{}", "a".repeat(107));
    for (head, expected) in [
        (
            "listen = \"unix:run/m.sock\"".to_string(),
            "memring.toml:1:10: listen: `unix:run/m.sock`: a Unix socket's path must be absolute",
        ),
        (
            format!("listen = \"unix:{long}\""),
            "a Unix socket's path has at most 107 bytes",
        ),
        (
            "listen = \"unix:/run/m.sock\"\nlisten_mode = \"0999\"".to_string(),
            "memring.toml:2:15: listen_mode = \"0999\" is not a file mode",
        ),
        (
            "listen = \"unix:/run/m.sock\"\nlisten_mode = \"1777\"".to_string(),
            "listen_mode = \"1777\" is not a file mode",
        ),
        (
            "listen = \"127.0.0.1:1\"\nlisten_mode = \"0660\"".to_string(),
            "memring.toml:2:15: listen_mode applies to a Unix socket only",
        ),
        (
            "listen = \"/run/m.sock\"".to_string(),
            "`/run/m.sock` is not an IP:port address or unix:PATH",
        ),
    ] {
        let message = parse(&head).unwrap_err().to_string();
        assert!(message.contains(expected), "{head}: {message}");
    }
    // A pool's own socket: not the main listener's path, its own mode.
    let pools = |pool: &str| {
        Config::parse(
            &format!("listen = \"unix:/run/main.sock\"{servers}[[pools]]\nname = \"p\"\n{pool}\n[[pools.servers]]\naddr = \"127.0.0.1:5\"\n"),
            "memring.toml",
        )
    };
    let config = pools("listen = \"unix:/run/p.sock\"\nlisten_mode = \"0600\"").unwrap();
    assert_eq!(
        config.pool("p").unwrap().listen,
        Some(Listen::Unix {
            path: "/run/p.sock".into(),
            mode: Some(0o600)
        })
    );
    let message = pools("listen = \"unix:/run/main.sock\"")
        .unwrap_err()
        .to_string();
    assert!(message.contains("takes the address of listen"), "{message}");
    let message = pools("listen_mode = \"0600\"").unwrap_err().to_string();
    assert!(
        message.contains("listen_mode without a listen"),
        "{message}"
    );
}

/// Six servers in zones a, b, c (two each), with `extra` at the top.
fn three_zones(extra: &str) -> String {
    let mut text = format!("listen = \"127.0.0.1:1\"\n{extra}\n");
    for (i, zone) in ["a", "a", "b", "b", "c", "c"].iter().enumerate() {
        text.push_str(&format!(
            "[[servers]]\naddr = \"127.0.0.1:{}\"\nzone = \"{zone}\"\n",
            100 + i
        ));
    }
    text
}

#[test]
fn zones_are_read_per_server_and_for_the_sidecar() {
    let config = Config::parse(&three_zones("replicas = 3\nzone = \"b\""), "m").unwrap();
    assert_eq!(config.zone.as_deref(), Some("b"));
    let zones: Vec<_> = config.servers.iter().map(|s| s.zone.as_deref()).collect();
    assert_eq!(
        zones,
        [
            Some("a"),
            Some("a"),
            Some("b"),
            Some("b"),
            Some("c"),
            Some("c")
        ]
    );
    assert!(config.warnings().is_empty(), "{:?}", config.warnings());
    let shares = config.zone_shares();
    assert_eq!(shares.len(), 3);
    for share in &shares {
        assert_eq!(share.keys, 1.0, "a copy of every key in every zone");
        assert!((share.copies - 1.0 / 3.0).abs() < 1e-9);
    }
    let moved = config.clone().with_zone("c", "m").unwrap();
    assert_eq!(moved.zone.as_deref(), Some("c"));
    assert!(config.clone().with_zone("two words", "m").is_err());
    assert!(config.with_zone("", "m").is_err());
    // Without zones nothing is set.
    let plain = Config::parse(GOOD, "m").unwrap();
    assert!(plain.zone.is_none() && plain.servers.iter().all(|s| s.zone.is_none()));
    assert!(plain.zone_shares().is_empty());
}

#[test]
fn zones_on_some_servers_only_are_refused_at_the_first_server_without() {
    let text = "listen = \"127.0.0.1:1\"\n[[servers]]\naddr = \"127.0.0.1:2\"\nzone = \"a\"\n[[servers]]\naddr = \"127.0.0.1:3\"\n";
    let error = error_of(text);
    assert!(
        error.starts_with(
            "memring.toml:6:8: server `127.0.0.1:3` has no zone, but `127.0.0.1:2` is in zone `a`"
        ),
        "{error}"
    );
    let error =
        error_of("listen = \"127.0.0.1:1\"\n[[servers]]\naddr = \"127.0.0.1:2\"\nzone = \"a b\"\n");
    assert!(
        error.contains("zone \"a b\" must be non-empty and contain no whitespace"),
        "{error}"
    );
    let error =
        error_of("listen = \"127.0.0.1:1\"\nzone = \"\"\n[[servers]]\naddr = \"127.0.0.1:2\"\n");
    assert!(
        error.starts_with("memring.toml:2:8: zone \"\" must be"),
        "{error}"
    );
}

#[test]
fn a_zone_too_small_for_its_copies_and_a_stray_sidecar_zone_are_warned_of() {
    // Zone c has one server of six: with a copy per zone it stores a third
    // of all copies on a sixth of the ring... twice its share.
    let mut text = three_zones("replicas = 3\nzone = \"x\"");
    text = text.replacen("zone = \"c\"", "zone = \"b\"", 1);
    let config = Config::parse(&text, "m").unwrap();
    let warnings = config.warnings().join("\n");
    assert!(warnings.contains("zone `c` holds"), "{warnings}");
    assert!(!warnings.contains("zone `a` holds"), "{warnings}");
    assert!(
        warnings.contains("in zone `x` but no server is"),
        "{warnings}"
    );
    let one = Config::parse(&three_zones(""), "m").unwrap();
    assert!(one.warnings().join("\n").contains("replicas = 1"));
    let plain = Config::parse(&format!("zone = \"a\"\n{GOOD}"), "m").unwrap();
    assert!(plain.warnings().join("\n").contains("no server has a zone"));
}

#[test]
fn warming_zones_mark_their_servers_warming_and_are_checked() {
    let config = Config::parse(&three_zones("replicas = 3\nwarming_zones = [\"c\"]"), "m").unwrap();
    let warming: Vec<bool> = config.servers.iter().map(|s| s.warming).collect();
    assert_eq!(warming, [false, false, false, false, true, true]);
    assert!(config.zone_write_back, "on by default");
    // Servers from elsewhere (etcd) are marked too.
    let again = config.with_servers(
        config
            .servers
            .iter()
            .map(|s| ServerConfig {
                warming: false,
                ..s.clone()
            })
            .collect(),
    );
    assert!(again.servers[4].warming && !again.servers[0].warming);
    let stray = Config::parse(&three_zones("replicas = 3\nwarming_zones = [\"x\"]"), "m").unwrap();
    assert!(stray
        .warnings()
        .join("\n")
        .contains("zone `x`, which no server is in"));
    let error = error_of(&three_zones("warming_zones = [\"c\", \"c\"]"));
    assert!(
        error.contains("warming_zones lists zone `c` twice"),
        "{error}"
    );
    let error = error_of(&three_zones("warming_zones = [\"\"]"));
    assert!(
        error.contains("warming_zones: zone \"\" must be non-empty"),
        "{error}"
    );
    let off = Config::parse(&three_zones("zone_write_back = false"), "m").unwrap();
    assert!(!off.zone_write_back);
}

#[test]
fn read_balance_and_its_epsilon_are_read_and_checked() {
    let plain = Config::parse(GOOD, "m").unwrap();
    assert_eq!(plain.read_balance, ReadBalance::default());
    assert_eq!(plain.read_balance.mode, ReadBalanceMode::Local);
    assert_eq!(plain.read_balance.epsilon, 0.25);
    let set = Config::parse(
        &format!("read_balance = \"least_loaded\"\nread_balance_epsilon = 1\n{GOOD}"),
        "m",
    )
    .unwrap();
    assert_eq!(set.read_balance.mode, ReadBalanceMode::LeastLoaded);
    assert_eq!(set.read_balance.epsilon, 1.0);
    let zero = Config::parse(&format!("read_balance_epsilon = 0.0\n{GOOD}"), "m").unwrap();
    assert_eq!(zero.read_balance.epsilon, 0.0);
    let error = error_of(&format!("read_balance = \"random\"\n{GOOD}"));
    assert!(
        error.starts_with("memring.toml:1:16: read_balance = \"random\" is not a choice (one of: local, least_loaded)"),
        "{error}"
    );
    for bad in ["-0.1", "10.5", "nan", "inf"] {
        let error = error_of(&format!("read_balance_epsilon = {bad}\n{GOOD}"));
        assert!(
            error.starts_with("memring.toml:1:24: read_balance_epsilon")
                && error.contains("must be a share from 0 to 10"),
            "{bad}: {error}"
        );
    }
    // A pool has its own, or the top level's.
    let pools = Config::parse(
        &format!(
            "read_balance = \"least_loaded\"\n{GOOD}[[pools]]\nname = \"other\"\nread_balance = \"local\"\nread_balance_epsilon = 2\n[[pools.servers]]\naddr = \"127.0.0.1:3\"\n[[pools]]\nname = \"third\"\n[[pools.servers]]\naddr = \"127.0.0.1:4\"\n"
        ),
        "m",
    )
    .unwrap();
    assert_eq!(pools.read_balance.mode, ReadBalanceMode::LeastLoaded);
    let pool = |name: &str| {
        pools
            .pools
            .iter()
            .find(|p| p.name == name)
            .unwrap()
            .config
            .clone()
    };
    let other = pool("other");
    assert_eq!(
        (other.read_balance.mode, other.read_balance.epsilon),
        (ReadBalanceMode::Local, 2.0)
    );
    let third = pool("third");
    assert_eq!(third.read_balance.mode, ReadBalanceMode::LeastLoaded);
}

#[test]
fn zone_fallback_is_in_order_or_all_at_once() {
    use crate::config::ZoneFallback;
    let default = Config::parse(&three_zones("replicas = 3"), "m").unwrap();
    assert_eq!(default.zone_fallback, ZoneFallback::InOrder);
    let at_once = Config::parse(&three_zones("zone_fallback = \"all_at_once\""), "m").unwrap();
    assert_eq!(at_once.zone_fallback, ZoneFallback::AllAtOnce);
    let error = error_of(&three_zones("zone_fallback = \"random\""));
    assert!(
        error.contains("zone_fallback = \"random\": expected \"in_order\" or \"all_at_once\""),
        "{error}"
    );
}
