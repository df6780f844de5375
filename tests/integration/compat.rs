//! Ring compatibility with the tools memring replaces: a real `nutcracker`
//! (twemproxy 0.5) and real libmemcached (through pylibmc's weighted ketama)
//! run side by side with memring over the same memcached servers. Keys written
//! through one are found through the other, in both directions, so switching
//! proxies costs no extra misses.
//!
//! Every process is started here on free loopback ports and killed by PID.

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use crate::common::{free_port, Client, Memcached, Proxy, DEADLINE};
use memring::protocol::ReplyKind;

/// Keys per direction per scenario.
const KEYS: usize = 240;

/// Keys that exercise the hash: plain, with bytes >= 0x80 (raw and UTF-8),
/// and long.
fn keys(prefix: &str, count: usize) -> Vec<Vec<u8>> {
    (0..count)
        .map(|i| {
            let mut key = format!("{prefix}:{i}:").into_bytes();
            match i % 4 {
                0 => key.extend_from_slice(b"plain"),
                1 => key.extend_from_slice(&[0x80, 0xff, 0xc3, 0x9f, b'x', (i % 120) as u8 + 0x80]),
                2 => key.extend_from_slice("ключ-λ".as_bytes()),
                _ => key.extend_from_slice(&[b'z'; 180]),
            }
            key
        })
        .collect()
}

fn value_of(key: &[u8]) -> Vec<u8> {
    let mut value = b"v-".to_vec();
    value.extend_from_slice(&key[..key.len().min(40)]);
    value
}

fn set(client: &mut Client, key: &[u8]) {
    let value = value_of(key);
    let mut request = b"set ".to_vec();
    request.extend_from_slice(key);
    request.extend_from_slice(format!(" 0 0 {}\r\n", value.len()).as_bytes());
    request.extend_from_slice(&value);
    request.extend_from_slice(b"\r\n");
    let reply = client.call(&request, ReplyKind::Line);
    assert_eq!(reply, b"STORED\r\n", "set {}", crate::common::show(key));
}

/// True when `key` is there with the value `set` stored.
fn found(client: &mut Client, key: &[u8]) -> bool {
    let mut request = b"get ".to_vec();
    request.extend_from_slice(key);
    request.extend_from_slice(b"\r\n");
    let reply = client.call(&request, ReplyKind::Values);
    match single_value(&reply) {
        Some(Some(value)) => value == value_of(key),
        Some(None) => false,
        None => panic!(
            "get {}: {}",
            crate::common::show(key),
            crate::common::show(&reply)
        ),
    }
}

/// Like `crate::common::parse_single_value`, for keys that are not UTF-8: `Some(None)`
/// for `END`, `Some(Some(value))` for one value, `None` otherwise.
fn single_value(reply: &[u8]) -> Option<Option<Vec<u8>>> {
    if reply == b"END\r\n" {
        return Some(None);
    }
    let header_end = reply.windows(2).position(|w| w == b"\r\n")?;
    let mut fields = reply[..header_end].split(|&b| b == b' ');
    if fields.next()? != b"VALUE" {
        return None;
    }
    let len: usize = std::str::from_utf8(fields.nth(2)?).ok()?.parse().ok()?;
    let start = header_end + 2;
    let value = reply.get(start..start + len)?.to_vec();
    (reply.get(start + len..)? == b"\r\nEND\r\n").then_some(Some(value))
}

/// One memcached server of a scenario: one of ours on a free port, or one on
/// port 11211 of another loopback address.
enum Backend {
    Free(Memcached),
    Default(DefaultPortMemcached),
}

impl Backend {
    fn addr(&self) -> String {
        match self {
            Backend::Free(m) => m.addr(),
            Backend::Default(m) => m.addr(),
        }
    }
}

/// memcached on 127.0.0.2:11211, so the "port 11211 is left out of the
/// name" rule is exercised with a real twemproxy.
struct DefaultPortMemcached {
    child: Child,
}

const DEFAULT_PORT_HOST: &str = "127.0.0.2";

impl DefaultPortMemcached {
    /// `None` (with the reason) when 127.0.0.2:11211 cannot be had.
    fn start() -> Result<DefaultPortMemcached, String> {
        TcpListener::bind((DEFAULT_PORT_HOST, 11211))
            .map_err(|e| format!("{DEFAULT_PORT_HOST}:11211 is not free ({e})"))?;
        let mut child = Command::new("memcached")
            .args(["-l", DEFAULT_PORT_HOST, "-p", "11211", "-U", "0", "-t", "1"])
            .args(["-m", "64", "-u", "root"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot run memcached: {e}"))?;
        let start = Instant::now();
        while TcpStream::connect((DEFAULT_PORT_HOST, 11211)).is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!(
                    "memcached on {DEFAULT_PORT_HOST}:11211 exited: {status}"
                ));
            }
            if start.elapsed() > DEADLINE {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "memcached on {DEFAULT_PORT_HOST}:11211 did not start"
                ));
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        Ok(DefaultPortMemcached { child })
    }

    fn addr(&self) -> String {
        format!("{DEFAULT_PORT_HOST}:11211")
    }
}

impl Drop for DefaultPortMemcached {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One server line of a twemproxy pool.
struct ServerSpec {
    addr: String,
    weight: u32,
    name: Option<String>,
}

/// One twemproxy pool: its name, key hash, hash tag and servers.
struct PoolSpec {
    name: String,
    hash: String,
    hash_tag: Option<String>,
    servers: Vec<ServerSpec>,
}

/// A nutcracker process serving some pools.
struct Nutcracker {
    child: Child,
    dir: std::path::PathBuf,
    /// Listen port of each pool, in the order given.
    ports: Vec<u16>,
}

impl Nutcracker {
    fn yaml(pools: &[PoolSpec], ports: &[u16]) -> String {
        let mut text = String::new();
        for (pool, port) in pools.iter().zip(ports) {
            text.push_str(&format!(
                "{}:\n  listen: 127.0.0.1:{port}\n  hash: {}\n  distribution: ketama\n  timeout: 2000\n",
                pool.name, pool.hash
            ));
            if let Some(tag) = &pool.hash_tag {
                text.push_str(&format!("  hash_tag: \"{tag}\"\n"));
            }
            text.push_str("  servers:\n");
            for server in &pool.servers {
                text.push_str(&format!("   - {}:{}", server.addr, server.weight));
                if let Some(name) = &server.name {
                    text.push_str(&format!(" {name}"));
                }
                text.push('\n');
            }
            text.push('\n');
        }
        text
    }

    fn start(pools: &[PoolSpec]) -> Nutcracker {
        let dir = std::env::temp_dir().join(format!(
            "memring-compat-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let ports: Vec<u16> = pools.iter().map(|_| free_port()).collect();
        let conf = dir.join("nutcracker.yml");
        std::fs::write(&conf, Nutcracker::yaml(pools, &ports)).expect("write nutcracker.yml");
        let child = Command::new("nutcracker")
            .arg("-c")
            .arg(&conf)
            .arg("-o")
            .arg(dir.join("nutcracker.log"))
            .args(["-a", "127.0.0.1", "-s", &free_port().to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nutcracker must be installed (scripts/test installs it)");
        let mut nutcracker = Nutcracker { child, dir, ports };
        let start = Instant::now();
        for &port in &nutcracker.ports.clone() {
            while TcpStream::connect(("127.0.0.1", port)).is_err() {
                if let Ok(Some(status)) = nutcracker.child.try_wait() {
                    panic!("nutcracker exited ({status}): {}", nutcracker.log());
                }
                assert!(
                    start.elapsed() < DEADLINE,
                    "nutcracker did not listen on {port}: {}",
                    nutcracker.log()
                );
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
        nutcracker
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("nutcracker.log")).unwrap_or_default()
    }

    fn conf(&self) -> std::path::PathBuf {
        self.dir.join("nutcracker.yml")
    }

    fn client(&self, pool: usize) -> Client {
        Client::connect(&format!("127.0.0.1:{}", self.ports[pool]))
    }
}

impl Drop for Nutcracker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// memring's config for one pool, made by `memring import` from the very
/// file nutcracker runs, with memring listening on a port of its own.
fn imported_config(nutcracker: &Nutcracker, pool: &str) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_memring"))
        .arg("import")
        .arg("twemproxy")
        .arg(nutcracker.conf())
        .arg(pool)
        .output()
        .expect("run memring import");
    assert!(
        output.status.success(),
        "memring import: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).expect("utf-8 config");
    assert!(text.contains("ring = \"twemproxy\""), "{text}");
    text.lines()
        .map(|line| {
            if line.starts_with("listen = ") {
                "listen = \"127.0.0.1:0\"".to_string()
            } else {
                line.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Writes keys through `writer`, then checks each is on exactly one server and
/// is found through `reader`; returns how many keys each server holds.
fn written_here_found_there(
    writer: &mut Client,
    reader: &mut Client,
    servers: &[String],
    keys: &[Vec<u8>],
) -> Vec<usize> {
    for key in keys {
        set(writer, key);
    }
    // Behind the proxies, each server asked for all the keys at once: which
    // of them it holds with the value `set` stored.
    let asked: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
    let held: Vec<Vec<bool>> = servers
        .iter()
        .map(|addr| {
            let values = crate::common::held_values(&mut Client::connect(addr), &asked);
            let with_value =
                |(value, key): (Option<Vec<u8>>, &Vec<u8>)| value == Some(value_of(key));
            values.into_iter().zip(keys).map(with_value).collect()
        })
        .collect();
    let mut per_server = vec![0usize; servers.len()];
    let mut missing = Vec::new();
    for (k, key) in keys.iter().enumerate() {
        let holders: Vec<usize> = (0..servers.len()).filter(|&i| held[i][k]).collect();
        assert_eq!(
            holders.len(),
            1,
            "{} is on {holders:?}",
            crate::common::show(key)
        );
        per_server[holders[0]] += 1;
        if !found(reader, key) {
            missing.push(crate::common::show(key));
        }
    }
    assert!(
        missing.is_empty(),
        "{} of {} keys not found on the other side, e.g. {:?}",
        missing.len(),
        keys.len(),
        &missing[..missing.len().min(3)]
    );
    per_server
}

/// Runs memring (imported config) beside nutcracker for each pool and checks
/// both directions. Every pool's keys get their own prefix.
fn side_by_side(pools: &[PoolSpec]) {
    let nutcracker = Nutcracker::start(pools);
    for (index, pool) in pools.iter().enumerate() {
        let config = imported_config(&nutcracker, &pool.name);
        let proxy = Proxy::start_text(&config);
        let servers: Vec<String> = pool.servers.iter().map(|s| s.addr.clone()).collect();
        let tagged = |keys: Vec<Vec<u8>>| -> Vec<Vec<u8>> {
            match &pool.hash_tag {
                None => keys,
                Some(tag) => {
                    // Half the keys carry a tag: those with the same tag must
                    // land together.
                    let (open, close) = (tag.as_bytes()[0], tag.as_bytes()[1]);
                    keys.into_iter()
                        .enumerate()
                        .map(|(i, mut key)| {
                            if i % 2 == 0 {
                                key.extend_from_slice(&[b'-', open]);
                                key.extend_from_slice(format!("user{}", i % 7).as_bytes());
                                key.push(close);
                            }
                            key
                        })
                        .collect()
                }
            }
        };
        let forward = tagged(keys(&format!("{}-nut", pool.name), KEYS));
        let backward = tagged(keys(&format!("{}-mem", pool.name), KEYS));
        let mut nut = nutcracker.client(index);
        let mut mem = proxy.client();
        let a = written_here_found_there(&mut nut, &mut mem, &servers, &forward);
        let b = written_here_found_there(&mut mem, &mut nut, &servers, &backward);
        println!(
            "pool {} (hash {}, {} servers): keys per server {a:?} / {b:?}",
            pool.name,
            pool.hash,
            servers.len()
        );
        // twemproxy's crc32 is libmemcached's 15-bit variant: every key hash
        // is below 32768, under nearly every point, so one server takes all
        // keys in nutcracker too. The keys were still found on both sides.
        if servers.len() > 1 && pool.hash != "crc32" {
            let used = a.iter().filter(|&&n| n > 0).count();
            assert!(used > 1, "all keys on one server: {a:?}");
        }
    }
}

fn start_servers(count: usize) -> Vec<Memcached> {
    (0..count).map(|_| Memcached::start()).collect()
}

fn pool(name: &str, hash: &str, servers: &[&Memcached], weights: &[u32]) -> PoolSpec {
    PoolSpec {
        name: name.to_string(),
        hash: hash.to_string(),
        hash_tag: None,
        servers: servers
            .iter()
            .enumerate()
            .map(|(i, m)| ServerSpec {
                addr: m.addr(),
                weight: weights.get(i).copied().unwrap_or(1),
                name: None,
            })
            .collect(),
    }
}

#[test]
fn nutcracker_and_memring_find_each_others_keys_default_md5_murmur_weights_names_tag() {
    let servers = start_servers(4);
    let refs: Vec<&Memcached> = servers.iter().collect();
    let mut named = pool("named", "fnv1a_64", &refs, &[]);
    for (i, server) in named.servers.iter_mut().enumerate() {
        server.name = Some(format!("cache-{}", (b'a' + i as u8) as char));
    }
    let mut tagged = pool("tagged", "fnv1a_64", &refs, &[]);
    tagged.hash_tag = Some("{}".to_string());
    side_by_side(&[
        pool("default", "fnv1a_64", &refs, &[]),
        pool("md5", "md5", &refs, &[]),
        pool("murmur", "murmur", &refs, &[]),
        pool("weighted", "fnv1a_64", &refs, &[1, 2, 3, 1]),
        named,
        tagged,
    ]);
}

#[test]
fn nutcracker_and_memring_agree_for_every_twemproxy_hash() {
    let servers = start_servers(3);
    let refs: Vec<&Memcached> = servers.iter().collect();
    let pools: Vec<PoolSpec> = memring::ring::HashFunction::ALL
        .iter()
        .map(|f| pool(&format!("h_{}", f.name()), f.name(), &refs, &[2, 1, 1]))
        .collect();
    side_by_side(&pools);
}

#[test]
fn nutcracker_and_memring_agree_from_1_to_30_servers() {
    // 25 is the count where twemproxy's float arithmetic gives every server
    // 156 points instead of 160.
    let servers = start_servers(30);
    let pools: Vec<PoolSpec> = [1usize, 2, 3, 7, 25, 30]
        .iter()
        .map(|&n| {
            let refs: Vec<&Memcached> = servers[..n].iter().collect();
            pool(&format!("n{n}"), "fnv1a_64", &refs, &[])
        })
        .collect();
    side_by_side(&pools);
}

#[test]
fn nutcracker_and_memring_agree_with_a_server_on_port_11211() {
    let default_port = match DefaultPortMemcached::start() {
        Ok(server) => server,
        Err(reason) => {
            eprintln!("SKIPPED: needs memcached on {DEFAULT_PORT_HOST}:11211: {reason}");
            return;
        }
    };
    let others = start_servers(3);
    let backends: Vec<Backend> = std::iter::once(Backend::Default(default_port))
        .chain(others.into_iter().map(Backend::Free))
        .collect();
    let servers = backends
        .iter()
        .map(|b| ServerSpec {
            addr: b.addr(),
            weight: 1,
            name: None,
        })
        .collect();
    side_by_side(&[PoolSpec {
        name: "port11211".to_string(),
        hash: "md5".to_string(),
        hash_tag: None,
        servers,
    }]);
}

/// Runs pylibmc (libmemcached) with weighted ketama over `servers`
/// (`host:port:weight`), setting or checking the given keys; returns how many
/// of them it could not find.
fn pylibmc(mode: &str, servers: &[String], keys: &[Vec<u8>]) -> usize {
    const SCRIPT: &str = r#"
import sys, pylibmc
mode, servers = sys.argv[1], sys.argv[2].split(",")
client = pylibmc.Client(servers, behaviors={"ketama_weighted": True})
missing = 0
for line in sys.stdin:
    key = bytes.fromhex(line.strip())
    value = b"v-" + key[:40]
    if mode == "set":
        if not client.set(key, value):
            sys.exit("set failed for %r" % key)
    elif client.get(key) != value:
        missing += 1
print(missing)
"#;
    crate::rings_dropin::run_client("/usr/bin/python3", "-c", SCRIPT, mode, servers, keys)
}

#[test]
fn pylibmc_weighted_ketama_and_memring_find_each_others_keys() {
    let servers = start_servers(5);
    let weights = [1u32, 2, 3, 1, 1];
    let mut text = String::from("listen = \"127.0.0.1:0\"\nring = \"libmemcached\"\n");
    for (server, weight) in servers.iter().zip(weights) {
        text.push_str(&format!(
            "[[servers]]\naddr = \"{}\"\nweight = {weight}\n",
            server.addr()
        ));
    }
    let proxy = Proxy::start_text(&text);
    let specs: Vec<String> = servers
        .iter()
        .zip(weights)
        .map(|(s, w)| format!("{}:{w}", s.addr()))
        .collect();
    let addrs: Vec<String> = servers.iter().map(Memcached::addr).collect();

    // libmemcached writes, memring reads.
    let forward = keys("libmc", KEYS);
    assert_eq!(pylibmc("set", &specs, &forward), 0);
    let mut mem = proxy.client();
    let mut direct: Vec<Client> = addrs.iter().map(|a| Client::connect(a)).collect();
    let mut per_server = vec![0usize; servers.len()];
    for key in &forward {
        assert!(
            found(&mut mem, key),
            "{} not found via memring",
            crate::common::show(key)
        );
        let holder = (0..servers.len())
            .find(|&i| found(&mut direct[i], key))
            .expect("on some server");
        per_server[holder] += 1;
    }
    println!("pylibmc keys per server (weights {weights:?}): {per_server:?}");
    assert!(per_server.iter().all(|&n| n > 0), "{per_server:?}");

    // memring writes, libmemcached reads.
    let backward = keys("memring", KEYS);
    for key in &backward {
        set(&mut mem, key);
    }
    assert_eq!(pylibmc("get", &specs, &backward), 0, "keys pylibmc missed");
}

#[test]
fn check_and_plan_name_the_flavour_and_plan_shows_the_move_to_the_native_ring() {
    let dir = std::env::temp_dir().join(format!("memring-compat-plan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let servers: String = (1..=4)
        .map(|i| format!("[[servers]]\naddr = \"10.0.0.{i}:11211\"\n"))
        .collect();
    let old = dir.join("twemproxy.toml");
    let new = dir.join("native.toml");
    std::fs::write(
        &old,
        format!(
            "listen = \"127.0.0.1:22121\"\nring = \"twemproxy\"\nhash_tag = \"{{}}\"\n{servers}"
        ),
    )
    .expect("write");
    std::fs::write(&new, format!("listen = \"127.0.0.1:22121\"\n{servers}")).expect("write");
    let run = |args: &[&std::ffi::OsStr]| {
        let output = Command::new(env!("CARGO_BIN_EXE_memring"))
            .args(args)
            .output()
            .expect("run memring");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).expect("utf-8")
    };
    let check = run(&["check".as_ref(), old.as_os_str()]);
    assert!(
        check.contains("ring twemproxy (hash fnv1a_64, hash_tag \"{}\")"),
        "{check}"
    );
    let plan = run(&["plan".as_ref(), old.as_os_str(), new.as_os_str()]);
    println!("{plan}");
    assert!(
        plan.contains("ring: twemproxy (hash fnv1a_64, hash_tag \"{}\") -> memring"),
        "{plan}"
    );
    let moved: f64 = plan
        .lines()
        .find_map(|l| l.strip_prefix("keyspace that moves: "))
        .and_then(|p| p.trim_end_matches('%').parse().ok())
        .expect("a moved share line");
    // Four servers of equal share, placed independently: about 3/4 moves.
    assert!((60.0..90.0).contains(&moved), "{plan}");
    let same = run(&["plan".as_ref(), old.as_os_str(), old.as_os_str()]);
    assert!(same.contains("keyspace that moves: 0.00%"), "{same}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_reload_switches_between_the_twemproxy_ring_and_the_native_ring() {
    let servers = start_servers(3);
    let dir = std::env::temp_dir().join(format!("memring-compat-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("memring.toml");
    let body: String = servers
        .iter()
        .map(|s| format!("[[servers]]\naddr = \"{}\"\n", s.addr()))
        .collect();
    let twemproxy =
        format!("listen = \"127.0.0.1:0\"\nring = \"twemproxy\"\nhash = \"md5\"\n{body}");
    std::fs::write(&path, &twemproxy).expect("write");
    let proxy = Proxy::start_file(&path);
    let expected = |text: &str| {
        memring::config::Config::parse(text, "m")
            .expect("valid")
            .build_ring()
    };
    assert_eq!(proxy.running().topology.load().ring, expected(&twemproxy));

    let native = format!("listen = \"127.0.0.1:0\"\n{body}");
    let version = proxy.ring_version();
    std::fs::write(&path, &native).expect("write");
    crate::common::wait_for("the reload", || proxy.ring_version() > version);
    let ring = proxy.running().topology.load().ring.clone();
    assert_eq!(ring, expected(&native));
    assert_ne!(ring, expected(&twemproxy));
    // Keys now go where the native ring says.
    let mut client = proxy.client();
    let mut direct: Vec<Client> = servers.iter().map(Memcached::client).collect();
    for key in keys("after-reload", 60) {
        set(&mut client, &key);
        let owner = ring.owner(&key).expect("owner");
        assert!(
            found(&mut direct[owner], &key),
            "{}",
            crate::common::show(&key)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_twemproxy_example_config_is_what_import_prints_for_its_pool() {
    let example_path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/twemproxy.toml");
    let example = std::fs::read_to_string(example_path).expect("read the example");
    // The pool is quoted in the example's header comment, indented by three.
    let yaml: String = example
        .lines()
        .skip_while(|l| !l.starts_with("#   web:"))
        .take_while(|l| l.starts_with("#   "))
        .map(|l| format!("{}\n", &l[4..]))
        .collect();
    assert!(yaml.contains("servers:"), "{yaml}");
    let dir = std::env::temp_dir().join(format!("memring-compat-example-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let yml = dir.join("nutcracker.yml");
    std::fs::write(&yml, &yaml).expect("write");
    let output = Command::new(env!("CARGO_BIN_EXE_memring"))
        .args(["import".as_ref(), "twemproxy".as_ref(), yml.as_os_str()])
        .output()
        .expect("run memring import");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let imported = String::from_utf8(output.stdout).expect("utf-8");
    let parse = |text: &str| memring::config::Config::parse(text, "m").expect("valid");
    assert_eq!(parse(&imported), parse(&example));
    let _ = std::fs::remove_dir_all(&dir);
}
