//! Live reconfiguration against real memcached: servers added, removed and
//! reweighted by editing the config file, under load, with only the keys that
//! must move moving and no client connection dropped.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{replace_by_rename, show, wait_for, Client, Memcached, Proxy, TempDir};
use memring::ring::Ring;

const KEYS: usize = 2000;

/// Config text naming each server `cache-<i>` with the given weights.
fn config(servers: &[(&Memcached, u32)]) -> String {
    // Without hand-off: these tests measure what a change moves.
    let mut text =
        String::from("listen = \"127.0.0.1:0\"\nrequest_timeout_ms = 2000\nhandoff_ms = 0\n");
    for (i, (server, weight)) in servers.iter().enumerate() {
        text.push_str(&format!(
            "[[servers]]\naddr = \"{}\"\nname = \"cache-{}\"\nweight = {weight}\n",
            server.addr(),
            server.port
        ));
        let _ = i;
    }
    text
}

fn wait_for_version(proxy: &Proxy, version: u64) -> Duration {
    let started = Instant::now();
    wait_for(&format!("ring version {version}"), || {
        proxy.ring_version() >= version
    });
    started.elapsed()
}

fn store_keys(client: &mut Client) -> Vec<String> {
    let keys: Vec<String> = (0..KEYS).map(|i| format!("moving:{i}")).collect();
    let mut batch = Vec::new();
    for key in &keys {
        batch.extend(format!("set {key} 0 0 {}\r\n{key}\r\n", key.len()).bytes());
    }
    client.send(&batch);
    for _ in &keys {
        assert_eq!(
            client.reply(memring::protocol::ReplyKind::Line),
            b"STORED\r\n"
        );
    }
    keys
}

/// Which of `keys` miss through memring now.
fn misses(client: &mut Client, keys: &[String]) -> Vec<String> {
    keys.iter()
        .filter(|key| client.get(key).is_none())
        .cloned()
        .collect()
}

fn owner_name(ring: &Ring, key: &str) -> String {
    ring.members()[ring.owner(key.as_bytes()).unwrap()]
        .identity
        .clone()
}

fn ring_of(path: &Path) -> Ring {
    Ring::build(memring::config::Config::load(path).unwrap().members())
}

#[test]
fn adding_a_fifth_server_misses_about_a_fifth_all_owned_by_it() {
    let dir = TempDir::new("reload", "add");
    let servers: Vec<Memcached> = (0..5).map(|_| Memcached::start()).collect();
    let path = dir.path("memring.toml");
    let four: Vec<(&Memcached, u32)> = servers[..4].iter().map(|s| (s, 1)).collect();
    std::fs::write(&path, config(&four)).unwrap();
    let proxy = Proxy::start_file(&path);
    let mut client = proxy.client();
    let keys = store_keys(&mut client);
    let before = ring_of(&path);
    let untouched_connections = connections_opened(&servers[0]);

    let five: Vec<(&Memcached, u32)> = servers.iter().map(|s| (s, 1)).collect();
    replace_by_rename(&path, &config(&five));
    wait_for_version(&proxy, 2);
    let after = ring_of(&path);

    let missed = misses(&mut client, &keys);
    let share = missed.len() as f64 / keys.len() as f64;
    println!(
        "4 -> 5 servers: {:.1}% of stored keys became misses",
        share * 100.0
    );
    let new_name = format!("cache-{}", servers[4].port);
    // Names carry random ports, so the new server's share of the ring varies
    // around a fifth; the misses must be exactly the keys the ring gives it.
    let owned = keys
        .iter()
        .filter(|k| owner_name(&after, k) == new_name)
        .count();
    assert_eq!(
        missed.len(),
        owned,
        "misses are the keys the new server owns"
    );
    assert!((0.12..=0.30).contains(&share), "miss share {share}");
    for key in &missed {
        assert_eq!(owner_name(&after, key), new_name, "{key} moved elsewhere");
        assert_ne!(owner_name(&before, key), new_name);
    }
    // Set the moved keys again: they now live on the new server.
    let mut direct = servers[4].client();
    for key in missed.iter().take(50) {
        assert_eq!(client.set(key, b"again"), b"STORED\r\n");
        assert_eq!(direct.get(key), Some(b"again".to_vec()));
    }
    // An unchanged server kept its connections: no reconnect storm.
    assert_eq!(
        connections_opened(&servers[0]),
        untouched_connections + 1,
        "only our stats probe connected"
    );
}

/// memcached's `total_connections`, read over a direct connection (which
/// itself counts one).
fn connections_opened(server: &Memcached) -> u64 {
    server.client().stat("total_connections")
}

#[test]
fn removing_one_of_five_misses_only_its_keys() {
    let dir = TempDir::new("reload", "remove");
    let servers: Vec<Memcached> = (0..5).map(|_| Memcached::start()).collect();
    let path = dir.path("memring.toml");
    let five: Vec<(&Memcached, u32)> = servers.iter().map(|s| (s, 1)).collect();
    std::fs::write(&path, config(&five)).unwrap();
    let proxy = Proxy::start_file(&path);
    let mut client = proxy.client();
    let keys = store_keys(&mut client);
    let before = ring_of(&path);

    let removed = format!("cache-{}", servers[2].port);
    let four: Vec<(&Memcached, u32)> = five
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 2)
        .map(|(_, s)| *s)
        .collect();
    replace_by_rename(&path, &config(&four));
    wait_for_version(&proxy, 2);

    let missed = misses(&mut client, &keys);
    let expected: Vec<String> = keys
        .iter()
        .filter(|k| owner_name(&before, k) == removed)
        .cloned()
        .collect();
    assert_eq!(missed, expected, "exactly the removed server's keys miss");
    assert!(!missed.is_empty());
    // The removed server's connections close once their requests are done
    // (the one left is ours, asking).
    wait_for("the removed server's connections to close", || {
        servers[2].client().stat("curr_connections") == 1
    });
}

#[test]
fn reweighting_moves_keys_only_to_the_reweighted_server() {
    let dir = TempDir::new("reload", "weight");
    let servers: Vec<Memcached> = (0..4).map(|_| Memcached::start()).collect();
    let path = dir.path("memring.toml");
    let even: Vec<(&Memcached, u32)> = servers.iter().map(|s| (s, 1)).collect();
    std::fs::write(&path, config(&even)).unwrap();
    let proxy = Proxy::start_file(&path);
    let mut client = proxy.client();
    let keys = store_keys(&mut client);

    let heavier: Vec<(&Memcached, u32)> = servers
        .iter()
        .enumerate()
        .map(|(i, s)| (s, if i == 1 { 2 } else { 1 }))
        .collect();
    replace_by_rename(&path, &config(&heavier));
    wait_for_version(&proxy, 2);
    let after = ring_of(&path);
    let reweighted = format!("cache-{}", servers[1].port);
    let missed = misses(&mut client, &keys);
    assert!(!missed.is_empty());
    for key in &missed {
        assert_eq!(
            owner_name(&after, key),
            reweighted,
            "{key} moved to a server that was not reweighted"
        );
    }
}

#[test]
fn invalid_edit_keeps_the_old_ring_serving_and_the_next_valid_edit_applies() {
    let dir = TempDir::new("reload", "invalid");
    let servers: Vec<Memcached> = (0..3).map(|_| Memcached::start()).collect();
    let path = dir.path("memring.toml");
    let two: Vec<(&Memcached, u32)> = servers[..2].iter().map(|s| (s, 1)).collect();
    std::fs::write(&path, config(&two)).unwrap();
    let proxy = Proxy::start_file(&path);
    let mut client = proxy.client();
    assert_eq!(client.set("steady", b"1"), b"STORED\r\n");

    replace_by_rename(&path, &config(&two).replace("weight = 1", "weight = 0"));
    // The bad file is seen and rejected, and the old ring keeps serving.
    let stats = proxy.running().stats.clone();
    wait_for("the invalid file to be rejected", || {
        assert_eq!(client.get("steady"), Some(b"1".to_vec()));
        stats.reload_count(false) == 1
    });
    assert_eq!(
        proxy.ring_version(),
        1,
        "an invalid file must not be applied"
    );

    let three: Vec<(&Memcached, u32)> = servers.iter().map(|s| (s, 1)).collect();
    replace_by_rename(&path, &config(&three));
    wait_for_version(&proxy, 2);
    assert_eq!(proxy.ring_version(), 2);
    assert_eq!(proxy.running().topology.load().backends.len(), 3);
}

#[test]
fn rename_in_place_and_symlink_swap_edits_are_each_picked_up() {
    let dir = TempDir::new("reload", "styles");
    let servers: Vec<Memcached> = (0..3).map(|_| Memcached::start()).collect();
    let one = config(&[(&servers[0], 1)]);
    let two = config(&[(&servers[0], 1), (&servers[1], 1)]);
    let three = config(&[(&servers[0], 1), (&servers[1], 1), (&servers[2], 1)]);

    // Kubernetes ConfigMap layout: memring.toml -> ..data/memring.toml, and
    // ..data -> a timestamped directory swapped by renaming a new symlink.
    let first = dir.path("..2026_01");
    std::fs::create_dir(&first).unwrap();
    std::fs::write(first.join("memring.toml"), &one).unwrap();
    std::os::unix::fs::symlink("..2026_01", dir.path("..data")).unwrap();
    std::os::unix::fs::symlink("..data/memring.toml", dir.path("memring.toml")).unwrap();
    let path = dir.path("memring.toml");
    let proxy = Proxy::start_file(&path);
    assert_eq!(proxy.ring_version(), 1);

    let second = dir.path("..2026_02");
    std::fs::create_dir(&second).unwrap();
    std::fs::write(second.join("memring.toml"), &two).unwrap();
    std::os::unix::fs::symlink("..2026_02", dir.path("..data_tmp")).unwrap();
    std::fs::rename(dir.path("..data_tmp"), dir.path("..data")).unwrap();
    let symlink_swap = wait_for_version(&proxy, 2);
    std::fs::remove_dir_all(&first).unwrap();

    // In place, as an editor that truncates and rewrites the file.
    std::fs::write(second.join("memring.toml"), &three).unwrap();
    let in_place = wait_for_version(&proxy, 3);

    // Rename over the original path (replacing the symlink with a file).
    replace_by_rename(&path, &one);
    let rename = wait_for_version(&proxy, 4);

    println!(
        "picked up after: symlink swap {symlink_swap:?}, in place {in_place:?}, rename {rename:?}"
    );
    // Each edit was picked up (wait_for_version fails the test past its
    // deadline); how fast is printed above, not asserted.
    assert_eq!(proxy.running().topology.load().backends.len(), 1);
}

#[test]
fn reload_under_load_fails_no_request_and_drops_no_connection() {
    let dir = TempDir::new("reload", "load");
    let servers: Vec<Memcached> = (0..5).map(|_| Memcached::start()).collect();
    let path = dir.path("memring.toml");
    let four: Vec<(&Memcached, u32)> = servers[..4].iter().map(|s| (s, 1)).collect();
    let five: Vec<(&Memcached, u32)> = servers.iter().map(|s| (s, 1)).collect();
    std::fs::write(&path, config(&four)).unwrap();
    let proxy = Proxy::start_file(&path);

    let stop = Arc::new(AtomicBool::new(false));
    let requests = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..16)
        .map(|w| {
            let (stop, requests) = (stop.clone(), requests.clone());
            let mut client = proxy.client();
            std::thread::spawn(move || {
                let mut round = 0usize;
                while !stop.load(Ordering::Relaxed) && round < 200_000 {
                    round += 1;
                    let key = format!("load:{w}:{}", round % 50);
                    let stored = client.set(&key, b"v");
                    assert_eq!(stored, b"STORED\r\n", "set failed during reload");
                    let reply = client.get_raw(&key);
                    // A miss is expected right after a key moves; an error is not.
                    assert!(
                        reply == b"END\r\n"
                            || reply.starts_with(format!("VALUE {key} ").as_bytes()),
                        "get failed during reload: {}",
                        show(&reply)
                    );
                    requests.fetch_add(2, Ordering::Relaxed);
                }
                // The connection is still open and usable.
                assert_eq!(client.set("after", b"x"), b"STORED\r\n");
            })
        })
        .collect();

    let mut version = 1;
    for edit in 0..6 {
        let at = requests.load(Ordering::Relaxed);
        wait_for("traffic between reloads", || {
            requests.load(Ordering::Relaxed) > at + 300
        });
        let text = if edit % 2 == 0 {
            config(&five)
        } else {
            config(&four)
        };
        replace_by_rename(&path, &text);
        version += 1;
        wait_for_version(&proxy, version);
    }
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker
            .join()
            .expect("no request failed and no connection dropped");
    }
    let stats = proxy.running().stats.clone();
    assert_eq!(stats.backend_errors(), 0);
}

#[test]
fn a_reload_names_each_changed_setting_and_reports_a_problem_once() {
    use memring::control::reload::{Outcome, Reloader};
    let dir = TempDir::new("reload", "settings");
    let server = Memcached::start();
    let path = dir.path("memring.toml");
    let text = config(&[(&server, 1)]);
    std::fs::write(&path, &text).unwrap();
    let proxy = Proxy::start_file(&path);
    // A second reloader on the same file and publisher, driven by hand.
    let mut reloader = Reloader::new(
        path.clone(),
        proxy.config.clone(),
        proxy.running().pools.clone(),
    );
    let mut reload = || proxy.block_on(async { reloader.reload() });

    let edited = text
        .replace("request_timeout_ms = 2000", "request_timeout_ms = 700")
        .replace(
            "listen = \"127.0.0.1:0\"",
            "listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nauto_eject = true",
        );
    std::fs::write(&path, &edited).unwrap();
    let Ok(Outcome::Applied { settings, .. }) = reload() else {
        panic!("the edit is applied");
    };
    let shown: Vec<(String, bool)> = settings
        .iter()
        .map(|s| (s.to_string(), s.restart_only))
        .collect();
    assert_eq!(
        shown,
        [
            ("request_timeout_ms 2000 -> 700".to_string(), false),
            ("auto_eject false -> true".to_string(), false),
            ("admin_listen (off) -> 127.0.0.1:0".to_string(), true),
        ]
    );
    assert_eq!(reload().unwrap(), Outcome::Unchanged);

    // The same read error twice is reported once; a different one again.
    std::fs::remove_file(&path).unwrap();
    let first = reload().expect_err("a missing file is an error");
    assert!(first.to_string().contains("cannot read"), "{first}");
    assert_eq!(reload().unwrap(), Outcome::Unchanged);
    std::fs::create_dir(&path).unwrap();
    assert!(reload().is_err(), "a directory is a new problem");
    assert_eq!(reload().unwrap(), Outcome::Unchanged);
    std::fs::remove_dir(&path).unwrap();

    // The same invalid text is rejected once.
    std::fs::write(&path, edited.replace("weight = 1", "weight = 0")).unwrap();
    assert!(reload().is_err());
    assert_eq!(reload().unwrap(), Outcome::Unchanged);
    // Back to the running config: nothing to apply.
    std::fs::write(&path, &edited).unwrap();
    assert_eq!(reload().unwrap(), Outcome::Unchanged);
}

/// memring (the real binary) under an open file limit it cannot raise,
/// logging to a file, killed by PID on drop.
struct LimitedDaemon {
    child: std::process::Child,
    log: std::path::PathBuf,
}

impl LimitedDaemon {
    fn start(nofile: u32, config: &Path, log: &Path) -> LimitedDaemon {
        // `ulimit -n` in sh sets the soft and the hard limit; exec keeps the pid.
        let child = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("ulimit -n {nofile} && exec \"$0\" --config \"$1\""))
            .arg(env!("CARGO_BIN_EXE_memring"))
            .arg(config)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap();
        LimitedDaemon {
            child,
            log: log.to_path_buf(),
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn wait_for_log(&self, text: &str) -> String {
        wait_for(&format!("log line `{text}`"), || self.log().contains(text));
        let log = self.log();
        log.lines().find(|l| l.contains(text)).unwrap().to_string()
    }

    fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id()))
            .map(|dir| dir.count())
            .unwrap_or(0)
    }
}

impl Drop for LimitedDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Eight connections per server and two workers: each server costs 16
/// descriptors, so a few servers are a ring too big for a small limit.
fn fd_hungry_config(listen: &str, servers: &[Memcached]) -> String {
    let servers: Vec<&Memcached> = servers.iter().collect();
    format!(
        "listen = \"{listen}\"\nworkers = 2\nconnections_per_server = 8\n{}",
        crate::common::named_servers(&servers)
    )
}

fn set_and_get_on_each(clients: &mut [Client], round: &str) {
    for (i, client) in clients.iter_mut().enumerate() {
        let key = format!("fds:{round}:{i}");
        assert_eq!(client.set(&key, b"v"), b"STORED\r\n", "client {i}");
        assert_eq!(client.get(&key), Some(b"v".to_vec()), "client {i}");
    }
}

#[test]
fn a_reload_that_would_starve_connected_clients_of_fds_is_refused() {
    const NOFILE: u32 = 128;
    let dir = TempDir::new("reload", "fds");
    let servers: Vec<Memcached> = (0..6).map(|_| Memcached::start()).collect();
    let listen = format!("127.0.0.1:{}", crate::common::free_port());
    let path = dir.path("memring.toml");
    std::fs::write(&path, fd_hungry_config(&listen, &servers[..2])).unwrap();
    let daemon = LimitedDaemon::start(NOFILE, &path, &dir.path("memring.log"));
    // 128 - 64 for memring itself - 2 servers × 8 × 2 workers = 32.
    let announced = daemon.wait_for_log("serving at most");
    let limit: usize = announced
        .split("serving at most ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a client limit in `{announced}`"));
    assert_eq!(limit, 32, "{announced}");
    daemon.wait_for_log("memring started");
    let mut clients: Vec<Client> = (0..limit - 2).map(|_| Client::connect(&listen)).collect();
    set_and_get_on_each(&mut clients, "before");
    eprintln!(
        "{} clients within the limit of {limit}: {} fds open of {NOFILE}",
        clients.len(),
        daemon.open_fds()
    );

    // Six servers need 64 more for their connections: 31 client slots (30
    // clients and the one the accept loop holds for the next) + 96 for both
    // rings + 64 is 63 more than the limit.
    std::fs::write(&path, fd_hungry_config(&listen, &servers)).unwrap();
    let refused = daemon.wait_for_log("reload refused");
    assert!(
        refused.contains(
            "reload refused: the new ring needs 63 more file descriptors than the limit leaves (ulimit -n is 128; raise it or lower connections_per_server)"
        ),
        "{refused}"
    );
    set_and_get_on_each(&mut clients, "refused");
    // The new servers were never asked: they are not in the ring.
    for server in &servers[2..] {
        assert!(server.client().get("fds:refused:0").is_none());
    }

    // With 10 clients left, a third server fits (11 + 48 + 64 = 123) by
    // taking client slots nobody uses: the limit for new clients drops.
    clients.truncate(10);
    std::fs::write(&path, fd_hungry_config(&listen, &servers[..3])).unwrap();
    let lowered = daemon.wait_for_log("client limit 32 -> 16");
    daemon.wait_for_log("ring v2");
    eprintln!("{lowered}; {} fds open", daemon.open_fds());
    set_and_get_on_each(&mut clients, "applied");
    // The third server owns some of the keys now.
    let mut fresh = Client::connect(&listen);
    for i in 0..100 {
        assert_eq!(fresh.set(&format!("fds:spread:{i}"), b"v"), b"STORED\r\n");
    }
    let on_third = (0..100)
        .filter(|i| {
            servers[2]
                .client()
                .get(&format!("fds:spread:{i}"))
                .is_some()
        })
        .count();
    assert!(on_third > 0, "the applied ring routes to the third server");

    let log = daemon.log();
    assert!(!log.contains("DEAD"), "no server went DEAD: {log}");
    assert!(!log.contains("accept failed"), "{log}");
    assert_eq!(log.matches("reload refused").count(), 1, "{log}");
}
