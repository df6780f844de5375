//! memring over servers other clients use too (`shared_with`, docs/handoff.md
//! "Shared servers"): beside a real nutcracker and clients that talk to the
//! servers directly, through changes of the server list made in both.
//!
//! What must hold: no reader that is not memring ever gets memring's
//! hand-off lease, and no reader (through memring, nutcracker or directly)
//! gets a value older than an acknowledged write. A miss is always allowed.
//! With the default setting (memring sidecars alone) the same scenario
//! hands nutcracker's clients the lease: the reason the setting exists.
//!
//! Every process is started here on free loopback ports and killed by PID.

use std::collections::HashMap;
use std::time::Instant;

use crate::common::{
    config_text, free_port, replace_by_rename, show, wait_for, Client, Memcached, Proxy, TempDir,
};
use crate::twemproxy::{import_listening_anywhere, Nutcracker};
use memring::protocol::ReplyKind;

/// The hand-off window of these tests: long enough for a phase's traffic,
/// short enough that each phase ends (with its sweep) within seconds.
const WINDOW_MS: u64 = 4000;
/// Requests per phase of the side-by-side scenario, at most.
const OPS_PER_PHASE: usize = 1500;

/// The client flags of a lease as memcached prints them, and its data.
const LEASE_FLAGS: &[u8] = b" 1835821873 ";
const LEASE_MARKER: &[u8] = b"\0memring hand-off lease\0";

/// nutcracker's pool over `servers`: md5 ketama, no ejection.
fn yaml(port: u16, servers: &[&Memcached]) -> String {
    let mut text = format!(
        "side:\n  listen: 127.0.0.1:{port}\n  hash: md5\n  distribution: ketama\n  timeout: 2000\n  servers:\n"
    );
    for server in servers {
        text.push_str(&format!("   - {}:1\n", server.addr()));
    }
    text
}

/// What `memring import twemproxy` prints for nutcracker's `conf`, with
/// the hand-off window of these tests and `shared_with` as given (`None`:
/// the line removed, memring's default); and `flush_new_servers =
/// "always"` for import's `"never"`: these tests add back a server removed
/// before, which holds what it had then, and only a flush keeps the three
/// clients from reading it (nutcracker alone reads it too).
fn memring_config(conf: &std::path::Path, shared_with: Option<&str>) -> String {
    let imported = import_listening_anywhere(conf);
    assert!(
        imported.contains("\nshared_with = \"writers\"\n"),
        "import writes the setting for nutcracker: {imported}"
    );
    assert!(
        imported.contains("\nflush_new_servers = \"never\"\n"),
        "import writes the setting for nutcracker: {imported}"
    );
    let mut text: String = imported
        .lines()
        .filter(|l| !l.starts_with("shared_with") && !l.starts_with("flush_new_servers"))
        .map(|l| format!("{l}\n"))
        .collect();
    let mut settings = format!("handoff_ms = {WINDOW_MS}\nflush_new_servers = \"always\"\n");
    if let Some(value) = shared_with {
        settings.push_str(&format!("shared_with = \"{value}\"\n"));
    }
    // Top-level keys go before the first table.
    let at = text.find("\n[[servers]]").expect("servers");
    text.insert_str(at + 1, &settings);
    text
}

/// Whether a reply carries memring's lease.
fn is_lease(reply: &[u8]) -> bool {
    let has = |needle: &[u8]| reply.windows(needle.len()).any(|w| w == needle);
    has(LEASE_FLAGS) || has(LEASE_MARKER)
}

/// A small deterministic generator (no dependency for one test).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) % n as u64) as usize
    }
}

/// What readers got that they must not have.
#[derive(Debug, Default)]
struct Found {
    /// Replies that held a lease, by who read it.
    leases: Vec<String>,
    /// Values older than the last acknowledged write (or a deleted value).
    stale: Vec<String>,
    /// Reads done, and reads that hit.
    reads: usize,
    hits: usize,
}

impl Found {
    /// Checks `reply` to a `get key` read by `who` against the last
    /// acknowledged value of the key.
    fn read(
        &mut self,
        who: &str,
        key: &str,
        reply: &[u8],
        model: &HashMap<String, Option<String>>,
    ) {
        self.reads += 1;
        if is_lease(reply) {
            self.leases.push(format!("{who} {key}: {}", show(reply)));
            return;
        }
        let value = crate::common::parse_single_value(reply)
            .unwrap_or_else(|| panic!("{who} get {key}: {}", show(reply)));
        if let Some(value) = value {
            self.hits += 1;
            let value = String::from_utf8(value).expect("utf-8 values");
            if model.get(key).cloned().flatten().as_deref() != Some(value.as_str()) {
                self.stale.push(format!(
                    "{who} {key}: {value}, last acknowledged {:?}",
                    model.get(key)
                ));
            }
        }
    }
}

/// Memcached clients to each server, by address.
struct Direct(HashMap<String, Client>);

impl Direct {
    fn to(servers: &[Memcached]) -> Direct {
        Direct(servers.iter().map(|s| (s.addr(), s.client())).collect())
    }

    /// The client of the server that owns `key` in memring's ring now
    /// (nutcracker's too: the same ring).
    fn owner(&mut self, proxy: &Proxy, key: &str) -> &mut Client {
        let topology = proxy.running().topology.load();
        let addr = topology.backends[proxy.owner_now(key)].addr().to_string();
        self.0.get_mut(&addr).expect("a known server")
    }
}

/// memring beside nutcracker and a direct client over five memcached
/// servers, through 4 -> 5 -> 4 -> 5 servers changed in both (memring by a
/// reload, nutcracker by a restart with the new file, no traffic between
/// the two). In each window, random writes and deletes through all three,
/// and reads of a key through memring, then at once through nutcracker
/// and directly from its owner, as the users did. After each
/// phase every server is searched for leases, and once the window (and its
/// sweep) is over every key is read through all three again.
fn side_by_side(shared_with: Option<&str>, test: &str) -> Found {
    let dir = TempDir::new("shared", test);
    let servers: Vec<Memcached> = (0..5).map(|_| Memcached::start()).collect();
    let all: Vec<&Memcached> = servers.iter().collect();
    let lists = [&all[..4], &all[..], &all[..4], &all[..]];
    let port = free_port();
    let conf = dir.path("nutcracker.yml");
    std::fs::write(&conf, yaml(port, lists[0])).expect("write nutcracker.yml");
    let mut nutcracker = Some(Nutcracker::start(&conf, port, dir.path("n0.log")));
    let path = dir.path("memring.toml");
    std::fs::write(&path, memring_config(&conf, shared_with)).expect("write memring.toml");
    let proxy = Proxy::start_file(&path);
    let mut memring = proxy.client();
    let mut nut = nutcracker.as_ref().expect("started").client();
    let mut direct = Direct::to(&servers);

    let keys: Vec<String> = (0..400).map(|i| format!("shared:{i}")).collect();
    let mut model: HashMap<String, Option<String>> = HashMap::new();
    for key in &keys {
        let value = format!("{key}=v0");
        assert_eq!(nut.set(key, value.as_bytes()), b"STORED\r\n");
        model.insert(key.clone(), Some(value));
    }
    let mut found = Found::default();
    let mut rng = Lcg(0x5eed);
    let mut version = 0u64;
    for (phase, list) in lists.iter().enumerate().skip(1) {
        // Both proxies change, memring first; no traffic in between.
        std::fs::write(&conf, yaml(port, list)).expect("write nutcracker.yml");
        let ring = proxy.ring_version();
        replace_by_rename(&path, &memring_config(&conf, shared_with));
        wait_for("memring's change", || proxy.ring_version() > ring);
        drop(nutcracker.take());
        nutcracker = Some(Nutcracker::start(
            &conf,
            port,
            dir.path(&format!("n{phase}.log")),
        ));
        nut = nutcracker.as_ref().expect("started").client();
        assert!(
            proxy.running().topology.load().previous.is_some(),
            "phase {phase}: a window"
        );
        let started = Instant::now();
        for _ in 0..OPS_PER_PHASE {
            if proxy.running().topology.load().previous.is_none() {
                break;
            }
            let key = &keys[rng.below(keys.len())];
            let who = rng.below(3);
            match rng.below(10) {
                // A write through one of the three.
                0..=2 => {
                    version += 1;
                    let value = format!("{key}=v{version}");
                    let reply = match who {
                        0 => memring.set(key, value.as_bytes()),
                        1 => nut.set(key, value.as_bytes()),
                        _ => direct.owner(&proxy, key).set(key, value.as_bytes()),
                    };
                    assert_eq!(reply, b"STORED\r\n", "set {key}");
                    model.insert(key.clone(), Some(value));
                }
                // A delete through one of the three.
                3 | 4 => {
                    let request = format!("delete {key}\r\n");
                    let reply = match who {
                        0 => memring.call(request.as_bytes(), ReplyKind::Line),
                        1 => nut.call(request.as_bytes(), ReplyKind::Line),
                        _ => direct
                            .owner(&proxy, key)
                            .call(request.as_bytes(), ReplyKind::Line),
                    };
                    assert!(
                        reply == b"DELETED\r\n" || reply == b"NOT_FOUND\r\n",
                        "delete {key}: {}",
                        show(&reply)
                    );
                    model.insert(key.clone(), None);
                }
                // memring, then at once nutcracker and the owner directly.
                _ => {
                    let reply = memring.get_raw(key);
                    found.read("memring", key, &reply, &model);
                    let reply = nut.get_raw(key);
                    found.read("nutcracker", key, &reply, &model);
                    let reply = direct.owner(&proxy, key).get_raw(key);
                    found.read("direct", key, &reply, &model);
                }
            }
        }
        println!(
            "phase {phase}: {} servers, traffic for {:?}",
            list.len(),
            started.elapsed()
        );
        // Nothing memring wrote for itself on any server, for any key.
        for server in &servers {
            let mut client = server.client();
            for key in &keys {
                let reply = client.get_raw(key);
                if is_lease(&reply) {
                    found
                        .leases
                        .push(format!("server {} {key}: {}", server.addr(), show(&reply)));
                }
            }
        }
        wait_for("the window and its sweep to end", || {
            proxy.running().topology.load().previous.is_none()
        });
        for key in &keys {
            let reply = memring.get_raw(key);
            found.read("memring after the window", key, &reply, &model);
            let reply = nut.get_raw(key);
            found.read("nutcracker after the window", key, &reply, &model);
            let reply = direct.owner(&proxy, key).get_raw(key);
            found.read("direct after the window", key, &reply, &model);
        }
    }
    println!(
        "shared_with {shared_with:?}: {} reads, {} hits, {} leases, {} stale",
        found.reads,
        found.hits,
        found.leases.len(),
        found.stale.len()
    );
    found
}

#[test]
fn beside_nutcracker_and_direct_clients_no_reader_gets_a_lease_or_an_older_value() {
    let found = side_by_side(Some("writers"), "writers");
    assert!(found.leases.is_empty(), "leases read: {:#?}", found.leases);
    assert!(
        found.stale.is_empty(),
        "older values read: {:#?}",
        found.stale
    );
    assert!(
        found.hits > found.reads / 4,
        "most keys stay readable: {} of {}",
        found.hits,
        found.reads
    );
}

/// Why the setting exists: memring's default (memring sidecars alone) in
/// the same scenario hands nutcracker's and the direct client's readers
/// the lease as a value, and a read-through brings back what they deleted.
#[test]
fn with_the_default_setting_nutcracker_and_direct_readers_get_leases() {
    let found = side_by_side(None, "default");
    let by_others = found
        .leases
        .iter()
        .filter(|l| !l.starts_with("memring"))
        .count();
    assert!(
        by_others > 0,
        "the default copies through leases that other readers see: {found:?}"
    );
}

/// The owner's address of each key in memring's ring now.
fn owners(proxy: &Proxy, keys: &[String]) -> Vec<String> {
    let topology = proxy.running().topology.load();
    keys.iter()
        .map(|key| topology.backends[proxy.owner_now(key)].addr().to_string())
        .collect()
}

/// Replaces the config at `path` with `config` and waits for the new ring:
/// the owner of each of `keys` before the change, and the keys that moved.
fn change_moving<'k>(
    proxy: &Proxy,
    path: &std::path::Path,
    config: &str,
    keys: &'k [String],
) -> (Vec<String>, Vec<&'k String>) {
    let before = owners(proxy, keys);
    replace_by_rename(path, config);
    wait_for("the change", || proxy.ring_version() >= 2);
    let after = owners(proxy, keys);
    let moved = keys
        .iter()
        .zip(before.iter().zip(&after))
        .filter(|(_, (b, a))| b != a)
        .map(|(k, _)| k)
        .collect();
    (before, moved)
}

/// Every server searched for a lease of any of `keys`.
fn leases_on(servers: &[Memcached], keys: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    for server in servers {
        let mut client = server.client();
        for key in keys {
            let reply = client.get_raw(key);
            if is_lease(&reply) {
                found.push(format!("{} {key}: {}", server.addr(), show(&reply)));
            }
        }
    }
    found
}

/// Readers that are not memring (direct clients, batch jobs, older
/// sidecars) and memring the only writer: `shared_with = "readers"` reads
/// moved keys through and copies nothing, so no server ever holds a lease;
/// a command that would have copied a moved key first answers exactly what
/// memcached answers for an absent key, and leaves no older copy behind.
#[test]
fn beside_direct_readers_memring_reads_through_and_writes_nothing_of_its_own() {
    let dir = TempDir::new("shared", "readers");
    let servers: Vec<Memcached> = (0..5).map(|_| Memcached::start()).collect();
    let all: Vec<&Memcached> = servers.iter().collect();
    let settings = "handoff_ms = 120000\nshared_with = \"readers\"\n";
    let path = dir.path("memring.toml");
    std::fs::write(&path, config_text(&all[..4], settings)).unwrap();
    let proxy = Proxy::start_file(&path);
    let mut client = proxy.client();
    let keys: Vec<String> = (0..1500).map(|i| format!("r:{i}")).collect();
    for key in &keys {
        assert_eq!(
            client.set(key, format!("{key}=v0").as_bytes()),
            b"STORED\r\n"
        );
    }
    let (before, moved) = change_moving(&proxy, &path, &config_text(&all, settings), &keys);
    assert!(moved.len() > 150, "a fifth moves: {}", moved.len());
    let mut direct = Direct::to(&servers);

    // Reads: through memring, the previous owner's value, every time; to a
    // direct reader of the new owner, a miss.
    let (readers, commands) = moved.split_at(moved.len() / 2);
    for key in readers {
        for _ in 0..2 {
            assert_eq!(
                client.get(key).as_deref(),
                Some(format!("{key}=v0").as_bytes()),
                "{key}"
            );
            let reply = direct.owner(&proxy, key).get_raw(key);
            assert_eq!(reply, b"END\r\n", "{key} directly: {}", show(&reply));
        }
    }
    assert!(leases_on(&servers, &keys).is_empty());

    // Commands that used to copy a moved key first: exactly what one
    // memcached answers where the key is absent, and then the key is gone
    // everywhere (no read finds the previous owner's value any more).
    let absent = Memcached::start();
    let mut memcached = absent.client();
    let requests: [(&str, Option<ReplyKind>); 10] = [
        ("incr {k} 1\r\n", Some(ReplyKind::Line)),
        ("decr {k} 1\r\n", Some(ReplyKind::Line)),
        ("touch {k} 60\r\n", Some(ReplyKind::Line)),
        ("append {k} 0 0 1\r\nx\r\n", Some(ReplyKind::Line)),
        ("prepend {k} 0 0 1\r\nx\r\n", Some(ReplyKind::Line)),
        ("replace {k} 0 0 1\r\nx\r\n", Some(ReplyKind::Line)),
        ("cas {k} 0 0 1 1\r\nx\r\n", Some(ReplyKind::Line)),
        ("ma {k}\r\n", None),
        ("ms {k} 1 MA\r\nx\r\n", None),
        ("mg {k} T30 v\r\n", None),
    ];
    for (i, key) in commands.iter().enumerate() {
        let (request, kind) = requests[i % requests.len()];
        let request = request.replace("{k}", key);
        // `None`: a meta reply.
        let ask = |client: &mut Client| match kind {
            Some(kind) => client.call(request.as_bytes(), kind),
            None => {
                client.send(request.as_bytes());
                client.meta_reply()
            }
        };
        let expected = ask(&mut memcached);
        let answered = ask(&mut client);
        assert_eq!(show(&answered), show(&expected), "{}", request.trim());
        assert_eq!(client.get(key), None, "{key} after {}", request.trim());
        assert_eq!(
            direct
                .0
                .get_mut(&before[keys.iter().position(|k| k == *key).unwrap()])
                .unwrap()
                .get(key),
            None
        );
    }
    // An add of a moved key stores (the key is absent to it), and reads
    // then get the added value.
    let key = readers[0];
    let added = format!("{key}=added");
    let request = format!("add {key} 0 0 {}\r\n{added}\r\n", added.len());
    assert_eq!(
        client.call(request.as_bytes(), ReplyKind::Line),
        b"STORED\r\n"
    );
    assert_eq!(client.get(key).as_deref(), Some(added.as_bytes()));
    // Writes and deletes: never an older value afterwards.
    let (key, other) = (readers[1], readers[2]);
    assert_eq!(client.set(key, b"v2"), b"STORED\r\n");
    assert_eq!(client.get(key).as_deref(), Some(&b"v2"[..]));
    assert_eq!(
        client.call(format!("delete {other}\r\n").as_bytes(), ReplyKind::Line),
        b"DELETED\r\n"
    );
    assert_eq!(client.get(other), None);

    assert!(
        leases_on(&servers, &keys).is_empty(),
        "no server holds a lease"
    );
    assert_eq!(client.stat("handoff_copies"), 0);
    assert!(client.stat("handoff_read_through_hits") > 0);
}

/// What each setting costs in misses, 4 -> 5 servers: the moved keys that
/// hit on a first and a second read in the window, and once it is over.
#[test]
fn what_each_setting_costs_in_moved_keys_that_miss() {
    let servers: Vec<Memcached> = (0..5).map(|_| Memcached::start()).collect();
    let keys: Vec<String> = (0..2000).map(|i| format!("cost:{i}")).collect();
    for setting in ["memring", "readers", "writers"] {
        // The two reads must fall within the window: 3 s is ample on a quiet
        // machine; a loaded one that runs past it tries again with a longer
        // window (the counts are checked only for a run that fit).
        let (moved, first, second, after_window) = [3_000, 6_000, 12_000]
            .into_iter()
            .find_map(|window_ms| hits_in_a_window(&servers, &keys, setting, window_ms))
            .unwrap_or_else(|| panic!("{setting}: the reads never fit in a window"));
        let n = moved;
        let expected = match setting {
            "memring" => (n, n, n),
            "readers" => (n, n, 0),
            _ => (0, 0, 0),
        };
        assert_eq!((first, second, after_window), expected, "{setting}");
    }
}

/// One run of [`what_each_setting_costs_in_moved_keys_that_miss`] with
/// `setting` and a window of `window_ms`: how many keys moved and the hits
/// among them on a first and a second read and after the window, or `None`
/// if the two reads did not both fall within the window.
fn hits_in_a_window(
    servers: &[Memcached],
    keys: &[String],
    setting: &str,
    window_ms: u64,
) -> Option<(usize, usize, usize, usize)> {
    let all: Vec<&Memcached> = servers.iter().collect();
    for server in servers {
        server.client().call(b"flush_all\r\n", ReplyKind::Line);
    }
    let dir = TempDir::new("shared", &format!("cost-{setting}"));
    let settings = format!("handoff_ms = {window_ms}\nshared_with = \"{setting}\"\n");
    let path = dir.path("memring.toml");
    std::fs::write(&path, config_text(&all[..4], &settings)).unwrap();
    let proxy = Proxy::start_file(&path);
    let mut client = proxy.client();
    for key in keys {
        assert_eq!(client.set(key, b"v"), b"STORED\r\n");
    }
    let (_, moved) = change_moving(&proxy, &path, &config_text(&all, &settings), keys);
    let hits = |client: &mut Client| moved.iter().filter(|k| client.get(k).is_some()).count();
    let first = hits(&mut client);
    let second = hits(&mut client);
    let in_window = proxy.running().topology.load().previous.is_some();
    wait_for("the window and its sweep to end", || {
        proxy.running().topology.load().previous.is_none()
    });
    let after_window = hits(&mut client);
    println!(
        "shared_with = \"{setting}\", window {window_ms} ms: {} of {} keys moved; hits among them: {first} on a first read in the window, {second} on a second, {after_window} after the window{}",
        moved.len(),
        keys.len(),
        if in_window { "" } else { " (the reads ran past the window: not counted)" }
    );
    in_window.then_some((moved.len(), first, second, after_window))
}

/// `shared_with` applies on reload, within a running window: the window
/// carries on, and moved keys stop being read through at once.
#[test]
fn shared_with_changes_live_within_a_window() {
    let dir = TempDir::new("shared", "live");
    let servers: Vec<Memcached> = (0..5).map(|_| Memcached::start()).collect();
    let all: Vec<&Memcached> = servers.iter().collect();
    let path = dir.path("memring.toml");
    std::fs::write(&path, config_text(&all[..4], "handoff_ms = 120000\n")).unwrap();
    let proxy = Proxy::start_file(&path);
    let mut client = proxy.client();
    let keys: Vec<String> = (0..600).map(|i| format!("live:{i}")).collect();
    for key in &keys {
        assert_eq!(client.set(key, b"v0"), b"STORED\r\n");
    }
    let (_, moved) = change_moving(
        &proxy,
        &path,
        &config_text(&all, "handoff_ms = 120000\n"),
        &keys,
    );
    let (early, late) = moved.split_at(moved.len() / 2);
    assert!(
        early.iter().all(|k| client.get(k).is_some()),
        "read through"
    );
    let version = proxy.ring_version();
    replace_by_rename(
        &path,
        &config_text(&all, "handoff_ms = 120000\nshared_with = \"writers\"\n"),
    );
    wait_for("the setting applied", || proxy.ring_version() > version);
    assert!(
        proxy.running().topology.load().previous.is_some(),
        "the window carries on"
    );
    assert!(
        late.iter().all(|k| client.get(k).is_none()),
        "moved keys not read before are misses now"
    );
    // Copied before the switch: on the new owner, read there.
    assert!(early.iter().all(|k| client.get(k).is_some()));
}
