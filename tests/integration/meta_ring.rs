//! Meta commands through memring over several real memcached servers: quiet
//! pipelines ended by `mn`, classic and meta commands mixed on one
//! connection, base64 keys routed by their decoded bytes, replication rules,
//! and per-command counters. Every reply stream is compared with what one
//! memcached answers to the same bytes.

use crate::common::{show, wait_for, Client, Memcached, Proxy};
use crate::replication::replicas_of;
use memring::protocol::Command;

/// Sent after a pipeline: a miss whose opaque makes its reply unique.
const SENTINEL: &[u8] = b"mg __sentinel__ Oend\r\n";
const SENTINEL_REPLY: &[u8] = b"EN Oend\r\n";

fn start(servers: usize, settings: &str) -> (Vec<Memcached>, Proxy) {
    let backends: Vec<Memcached> = (0..servers).map(|_| Memcached::start()).collect();
    let proxy = Proxy::start(&backends.iter().collect::<Vec<_>>(), settings);
    (backends, proxy)
}

/// Sends `bytes` then the sentinel; returns everything before its reply.
fn pipeline(client: &mut Client, bytes: &[u8]) -> Vec<u8> {
    client.send(bytes);
    client.send(SENTINEL);
    client.read_until_suffix(SENTINEL_REPLY)
}

/// Masks the numbers that differ between servers: `c<n>` tokens of meta
/// lines and the cas of `VALUE` lines.
fn mask_cas(stream: &[u8]) -> Vec<u8> {
    let (classic, _) = crate::common::normalize_cas(stream);
    let mut out = Vec::new();
    for line in classic.split_inclusive(|&b| b == b'\n') {
        let meta = [&b"HD"[..], b"VA", b"EN", b"NS", b"EX", b"NF"]
            .iter()
            .any(|status| line.starts_with(status));
        if !meta {
            out.extend(line);
            continue;
        }
        let body = line.strip_suffix(b"\r\n").unwrap_or(line);
        for (i, token) in body.split(|&b| b == b' ').enumerate() {
            if i > 0 {
                out.push(b' ');
            }
            if i > 0
                && token.len() > 1
                && token[0] == b'c'
                && token[1..].iter().all(u8::is_ascii_digit)
            {
                out.extend(b"c<n>");
            } else {
                out.extend(token);
            }
        }
        out.extend(&line[body.len()..]);
    }
    out
}

fn servers_holding(backends: &[Memcached], key_b64: &str) -> Vec<usize> {
    (0..backends.len())
        .filter(|&s| {
            let mut client = backends[s].client();
            let reply = pipeline(&mut client, format!("mg {key_b64} b v\r\n").as_bytes());
            reply.starts_with(b"VA")
        })
        .collect()
}

/// Standard base64 (with padding), as meta clients encode binary keys.
fn base64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[test]
fn a_quiet_pipeline_over_four_servers_answers_like_one_memcached() {
    let (backends, proxy) = start(4, "");
    let single = Memcached::start();
    let keys: Vec<String> = (0..120).map(|i| format!("quiet:{i}")).collect();
    // Every third key is stored; the rest miss.
    let mut setup = Vec::new();
    for (i, key) in keys.iter().enumerate().filter(|(i, _)| i % 3 == 0) {
        setup.extend(format!("ms {key} 2 q T0 F{i}\r\nv{}\r\n", i % 10).as_bytes());
    }
    setup.extend(b"mn\r\n");
    let mut batch = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        match i % 10 {
            // An error is never suppressed.
            7 => batch.extend(format!("mg {key} v q Nx\r\n").as_bytes()),
            // A quiet delete of a missing key says NF; of a present one, nothing.
            8 => batch.extend(format!("md {key} q\r\n").as_bytes()),
            9 => batch.extend(format!("ma {key} q N0 J5\r\n").as_bytes()),
            _ => batch.extend(format!("mg {key} v k f q O{i}\r\n").as_bytes()),
        }
    }
    batch.extend(b"mn\r\n");
    for (i, key) in keys.iter().enumerate().step_by(7) {
        batch.extend(format!("mg {key} v k q O{i}\r\n").as_bytes());
    }
    batch.extend(b"mn\r\n");

    let mut direct = single.client();
    let mut through = proxy.client();
    let want_setup = pipeline(&mut direct, &setup);
    assert_eq!(show(&pipeline(&mut through, &setup)), show(&want_setup));
    let want = pipeline(&mut direct, &batch);
    let got = pipeline(&mut through, &batch);
    assert!(want.ends_with(b"MN\r\n") && want.windows(4).filter(|w| w == b"MN\r\n").count() == 2);
    assert!(
        want.starts_with(b"VA 2 kquiet:0 f0 O0\r\n"),
        "{}",
        show(&want)
    );
    assert_eq!(show(&got), show(&want));
    let hits = want.windows(3).filter(|w| w == b"VA ").count();
    println!(
        "quiet pipeline: {} keys, {hits} hits, {} reply bytes",
        keys.len(),
        got.len()
    );

    // The keys are spread over all four servers.
    let per_server: Vec<usize> = backends
        .iter()
        .map(|b| {
            let mut client = b.client();
            keys.iter()
                .filter(|k| pipeline(&mut client, format!("mg {k}\r\n").as_bytes()) == b"HD\r\n")
                .count()
        })
        .collect();
    println!("stored keys per server: {per_server:?}");
    assert!(per_server.iter().all(|&n| n > 0), "{per_server:?}");
    // The three client `mn`s are memring's to answer, and counted as such.
    assert_eq!(proxy.running().stats.command_count(Command::MetaNoop), 3);
}

#[test]
fn classic_and_meta_commands_mixed_keep_their_order() {
    let (_backends, proxy) = start(4, "");
    let single = Memcached::start();
    let mut batch = Vec::new();
    for i in 0..40 {
        let key = format!("mix:{i}");
        match i % 5 {
            0 => batch.extend(format!("set {key} 3 0 2\r\nc{}\r\nmg {key} v f\r\n", i % 10).as_bytes()),
            1 => batch.extend(format!("ms {key} 2 F7\r\nm{}\r\nget {key}\r\n", i % 10).as_bytes()),
            2 => batch.extend(format!("ms {key} 1 q\r\n5\r\nincr {key} 3\r\nma {key} v\r\nmg {key} v q\r\n").as_bytes()),
            3 => batch.extend(format!("add {key} 0 0 1\r\nx\r\nmd {key} q\r\ndelete {key}\r\nmg {key} v\r\n").as_bytes()),
            _ => batch.extend(format!("ms {key} 1 c\r\ny\r\ngets {key}\r\nmn\r\ntouch {key} 100\r\nmg {key} t v k\r\n").as_bytes()),
        }
    }
    let keys: Vec<String> = (0..40).map(|i| format!("mix:{i}")).collect();
    batch.extend(format!("get {}\r\nmn\r\n", keys.join(" ")).as_bytes());
    let want = mask_cas(&pipeline(&mut single.client(), &batch));
    let got = mask_cas(&pipeline(&mut proxy.client(), &batch));
    assert!(want.windows(6).any(|w| w == b"VALUE "), "{}", show(&want));
    assert_eq!(show(&got), show(&want));
}

#[test]
fn base64_keys_route_by_their_decoded_bytes() {
    let (backends, proxy) = start(4, "");
    let mut client = proxy.client();
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..40u8 {
        // Keys readable with the classic protocol: bytes 0x80..=0xFF.
        let key = vec![0xFF, 0x80 + i, b'k', 0xFE];
        let encoded = base64(&key);
        let stored = pipeline(
            &mut client,
            format!("ms {encoded} 2 b\r\nb{}\r\n", i % 10).as_bytes(),
        );
        assert_eq!(stored, b"HD\r\n");
        let mut get = b"get ".to_vec();
        get.extend(&key);
        get.extend(b"\r\n");
        let mut want = b"VALUE ".to_vec();
        want.extend(&key);
        want.extend(format!(" 0 2\r\nb{}\r\nEND\r\n", i % 10).as_bytes());
        assert_eq!(show(&pipeline(&mut client, &get)), show(&want));
        // And the reverse: written classic, read meta.
        let mut set = b"set ".to_vec();
        set.extend(&key);
        set.extend(b" 0 0 3\r\nnew\r\n");
        assert_eq!(pipeline(&mut client, &set), b"STORED\r\n");
        let read = pipeline(&mut client, format!("mg {encoded} b v\r\n").as_bytes());
        assert_eq!(show(&read), "VA 3\\r\\nnew\\r\\n");
        let holders = servers_holding(&backends, &encoded);
        assert_eq!(holders.len(), 1, "{encoded}");
        seen.insert(holders[0]);
    }
    assert_eq!(seen.len(), 4, "binary keys spread over every server");
    // Keys with NUL bytes exist only in the meta protocol; they still land
    // on exactly one server and read back.
    for key in [&b"\x00"[..], b"\x00\xff", b"a\x00b", b"\xff\x00\xff\x00"] {
        let encoded = base64(key);
        let stored = pipeline(
            &mut client,
            format!("ms {encoded} 1 b k\r\nz\r\n").as_bytes(),
        );
        assert_eq!(
            show(&stored),
            show(format!("HD k{encoded} b\r\n").as_bytes())
        );
        let read = pipeline(&mut client, format!("mg {encoded} b v\r\n").as_bytes());
        assert_eq!(read, b"VA 1\r\nz\r\n");
        assert_eq!(servers_holding(&backends, &encoded).len(), 1);
    }
    // memcached's own error for a key that is not base64.
    assert_eq!(
        pipeline(&mut client, b"mg Zm9 b v\r\n"),
        b"CLIENT_ERROR error decoding key\r\n"
    );
}

fn value_on(backend: &Memcached, key: &str) -> Vec<u8> {
    pipeline(&mut backend.client(), format!("mg {key} v\r\n").as_bytes())
}

#[test]
fn replicated_meta_writes_reads_and_leases() {
    let (mut backends, proxy) = start(
        4,
        "replicas = 3\nconnect_timeout_ms = 200\nrequest_timeout_ms = 400\n",
    );
    let mut client = proxy.client();
    for i in 0..20 {
        let key = format!("rep:{i}");
        let replicas = replicas_of(&proxy, &key);
        assert_eq!(
            pipeline(&mut client, format!("ms {key} 2\r\nv1\r\n").as_bytes()),
            b"HD\r\n"
        );
        wait_for("ms on every replica", || {
            replicas
                .iter()
                .all(|&s| value_on(&backends[s], &key) == b"VA 2\r\nv1\r\n")
        });
        // C is decided on the owner, then copied without C.
        let owner_cas = pipeline(
            &mut backends[replicas[0]].client(),
            format!("mg {key} c\r\n").as_bytes(),
        );
        let cas = String::from_utf8_lossy(&owner_cas[4..owner_cas.len() - 2]).to_string();
        assert_eq!(
            pipeline(
                &mut client,
                format!("ms {key} 2 C999999 q\r\nxx\r\n").as_bytes()
            ),
            b"EX\r\n"
        );
        assert_eq!(
            pipeline(
                &mut client,
                format!("ms {key} 2 C{cas} q\r\nv2\r\n").as_bytes()
            ),
            b""
        );
        wait_for("the cas write copied to every replica", || {
            replicas
                .iter()
                .all(|&s| value_on(&backends[s], &key) == b"VA 2\r\nv2\r\n")
        });
        assert_eq!(
            pipeline(&mut client, format!("ma {key}n N0 J10 v\r\n").as_bytes()),
            b"VA 2\r\n10\r\n"
        );
        assert_eq!(
            pipeline(&mut client, format!("ma {key}n v\r\n").as_bytes()),
            b"VA 2\r\n11\r\n"
        );
        let counter = format!("{key}n");
        let counter_replicas = replicas_of(&proxy, &counter);
        wait_for("the counter equal on every replica", || {
            counter_replicas
                .iter()
                .all(|&s| value_on(&backends[s], &counter) == b"VA 2\r\n11\r\n")
        });
        // A lease goes to the owner only, so one client wins it.
        let lease = format!("{key}l");
        let lease_replicas = replicas_of(&proxy, &lease);
        assert_eq!(
            pipeline(&mut client, format!("mg {lease} N30\r\n").as_bytes()),
            b"HD W\r\n"
        );
        assert_eq!(
            pipeline(&mut client, format!("mg {lease} N30\r\n").as_bytes()),
            b"HD Z\r\n"
        );
        assert_eq!(
            value_on(&backends[lease_replicas[0]], &lease),
            b"VA 0 Z\r\n\r\n"
        );
        for &s in &lease_replicas[1..] {
            assert_eq!(
                value_on(&backends[s], &lease),
                b"EN\r\n",
                "lease copied to a replica"
            );
        }
        assert_eq!(
            pipeline(
                &mut client,
                format!("md {key} q\r\nmg {key} v\r\n").as_bytes()
            ),
            b"EN\r\n"
        );
    }
    // With the owner gone, mg falls through to the next replica.
    let key = "rep:read";
    assert_eq!(
        pipeline(&mut client, format!("ms {key} 2\r\nok\r\n").as_bytes()),
        b"HD\r\n"
    );
    let replicas = replicas_of(&proxy, key);
    wait_for("on every replica", || {
        replicas
            .iter()
            .all(|&s| value_on(&backends[s], key) == b"VA 2\r\nok\r\n")
    });
    backends[replicas[0]].kill();
    assert_eq!(
        show(&pipeline(&mut client, format!("mg {key} v\r\n").as_bytes())),
        "VA 2\\r\\nok\\r\\n"
    );
    assert_eq!(
        show(&pipeline(
            &mut client,
            format!("mg {key} v q\r\nmn\r\n").as_bytes()
        )),
        "VA 2\\r\\nok\\r\\nMN\\r\\n"
    );
}

#[test]
fn meta_commands_are_counted_by_name() {
    let (_backends, proxy) = start(2, "");
    let mut client = proxy.client();
    pipeline(
        &mut client,
        b"ms c 1\r\n1\r\nmg c v\r\nmg c q\r\nma c\r\nmd c\r\nme c\r\nmn\r\nmg Zm9 b\r\n",
    );
    let stats = &proxy.running().stats;
    // The sentinel is an mg too; a request memring rejects is not counted.
    let counts: Vec<(&str, u64)> = [
        Command::MetaSet,
        Command::MetaGet,
        Command::MetaArithmetic,
        Command::MetaDelete,
        Command::MetaDebug,
        Command::MetaNoop,
    ]
    .iter()
    .map(|&c| (c.name(), stats.command_count(c)))
    .collect();
    assert_eq!(
        counts,
        vec![
            ("ms", 1),
            ("mg", 3),
            ("ma", 1),
            ("md", 1),
            ("me", 1),
            ("mn", 1)
        ]
    );
}

/// The Python that has meta-memcache: `MEMRING_TEST_PYTHON` (scripts/test
/// points it at a virtual environment of its own), else `python3`.
fn meta_python() -> String {
    std::env::var("MEMRING_TEST_PYTHON").unwrap_or_else(|_| "python3".to_string())
}

/// Runs tests/clients/meta_memcache_check.py against `addr`; its stdout.
fn run_meta_memcache(addr: &str) -> String {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/clients/meta_memcache_check.py"
    );
    let mut child = std::process::Command::new(meta_python())
        .arg(script)
        .arg(addr)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    wait_for("the meta-memcache script to finish", || {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
        }
        child.try_wait().expect("try_wait").is_some()
    });
    let output = child.wait_with_output().expect("script output");
    assert!(
        output.status.success(),
        "meta-memcache script against {addr} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("utf-8 output")
}

#[test]
fn the_meta_memcache_client_gets_the_same_results_through_memring() {
    let available = std::process::Command::new(meta_python())
        .args(["-c", "import meta_memcache"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !available {
        eprintln!(
            "SKIPPED: the PyPI package meta-memcache is not installed \
             (pip install meta-memcache) — third-party meta client not exercised"
        );
        return;
    }
    let single = Memcached::start();
    let want = run_meta_memcache(&single.addr());
    let (backends, proxy) = start(4, "");
    let got = run_meta_memcache(&proxy.addr.to_string());
    assert!(want.lines().count() > 80, "{want}");
    assert!(want.contains("[\"lease_after\", \"filled\"]"), "{want}");
    assert_eq!(got, want);
    // The client's keys were spread over the four servers.
    for backend in &backends {
        let mut client = backend.client();
        client.send(b"stats\r\n");
        let stats = String::from_utf8_lossy(&client.read_until_suffix(b"END\r\n")).to_string();
        assert!(
            !stats.contains("STAT curr_items 0\r\n"),
            "{}",
            backend.addr()
        );
    }
}
