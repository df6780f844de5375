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
}
