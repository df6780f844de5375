//! A hand-off window survives a restart of the memring binary (SIGTERM or
//! SIGKILL): the window's rings and deadline are kept in the state file
//! (`state_file`, beside the config by default) and taken up at start, so
//! writes and deletes through the restarted sidecar keep reaching previous
//! owners that another sidecar still reads through. A state file that is
//! missing, stale, corrupt or not a regular file is reported, and never
//! makes a read return a value older than an acknowledged write
//! (docs/handoff.md, "Restarts").

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use memring::protocol::ReplyKind;

use crate::common::{config_text, replace_by_rename, wait_for, Client, Memcached, Proxy, DEADLINE};

const BIN: &str = env!("CARGO_BIN_EXE_memring");

/// How a sidecar is stopped before its restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Term,
    Kill,
}

/// The memring binary running a config file, with its log lines.
struct Sidecar {
    child: Child,
    addr: String,
    log: Arc<Mutex<Vec<String>>>,
}

impl Sidecar {
    /// Starts `memring --config path` and waits until it listens.
    fn start(path: &Path) -> Sidecar {
        let mut child = Command::new(BIN)
            .arg("--config")
            .arg(path)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start memring");
        let stderr = child.stderr.take().expect("piped stderr");
        let log = Arc::new(Mutex::new(Vec::new()));
        let lines = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { return };
                lines.lock().unwrap().push(plain(&line));
            }
        });
        let mut sidecar = Sidecar {
            child,
            addr: String::new(),
            log,
        };
        let mut addr = None;
        wait_for("memring to listen", || {
            addr = sidecar.find_log(|line| {
                let rest = line.split("local_addr=").nth(1)?;
                Some(rest.split_whitespace().next()?.to_string())
            });
            assert!(
                sidecar.child.try_wait().unwrap().is_none(),
                "memring exited: {:?}",
                sidecar.lines()
            );
            addr.is_some()
        });
        sidecar.addr = addr.unwrap();
        sidecar
    }

    fn find_log<T>(&self, f: impl Fn(&str) -> Option<T>) -> Option<T> {
        self.log.lock().unwrap().iter().find_map(|l| f(l))
    }

    fn lines(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// The first log line containing `text`.
    fn logged(&self, text: &str) -> Option<String> {
        self.find_log(|l| l.contains(text).then(|| l.to_string()))
    }

    fn client(&self) -> Client {
        Client::connect(&self.addr)
    }

    /// Stops it with SIGTERM (waiting for its exit) or SIGKILL.
    fn stop(mut self, how: Stop) {
        match how {
            Stop::Term => {
                let status = Command::new("kill")
                    .args(["-TERM", &self.child.id().to_string()])
                    .status()
                    .unwrap();
                assert!(status.success());
                let mut exit = None;
                wait_for("memring to exit after SIGTERM", || {
                    exit = self.child.try_wait().unwrap();
                    exit.is_some()
                });
                assert_eq!(exit.unwrap().code(), Some(0), "{:?}", self.lines());
            }
            Stop::Kill => {
                self.child.kill().unwrap();
                self.child.wait().unwrap();
            }
        }
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `line` without terminal colour codes.
fn plain(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn temp_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("memring-restart-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// Waits until memring at `addr` serves exactly `servers` (LEAVING ones
/// aside) in its default pool.
fn wait_servers(addr: &str, servers: &[&Memcached]) {
    let want: BTreeSet<String> = servers.iter().map(|s| s.addr()).collect();
    wait_for("the servers to be applied", || {
        let stats = Client::connect(addr).stats("");
        let serving: BTreeSet<String> = stats
            .iter()
            .filter_map(|(k, v)| {
                let name = k.strip_prefix("server:")?.strip_suffix(":membership")?;
                (v != "LEAVING").then(|| name.to_string())
            })
            .collect();
        serving == want
    });
}

fn call(client: &mut Client, request: &str) -> String {
    String::from_utf8_lossy(&client.call(request.as_bytes(), ReplyKind::Line)).into_owned()
}

/// Two sidecars over the same servers, 4 -> 5, sidecar A restarted inside
/// the window: keys deleted through A never come back through B, and
/// `incr` through A continues the counters written before the change.
fn deletes_and_counts_survive(how: Stop) {
    let servers: Vec<Memcached> = (0..5).map(|_| Memcached::start()).collect();
    let four: Vec<&Memcached> = servers[..4].iter().collect();
    let five: Vec<&Memcached> = servers.iter().collect();
    let dir = temp_dir(&format!("survive-{how:?}"));
    let (a_path, b_path) = (dir.join("a.toml"), dir.join("b.toml"));
    std::fs::write(&a_path, config_text(&four, "")).unwrap();
    std::fs::write(&b_path, config_text(&four, "")).unwrap();
    let a = Sidecar::start(&a_path);
    let b = Proxy::start_file(&b_path);
    let mut b_client = b.client();
    const KEYS: usize = 400;
    for i in 0..KEYS {
        assert_eq!(b_client.set(&format!("key:{i}"), b"v1"), b"STORED\r\n");
        assert_eq!(b_client.set(&format!("count:{i}"), b"10"), b"STORED\r\n");
    }
    replace_by_rename(&a_path, &config_text(&five, ""));
    replace_by_rename(&b_path, &config_text(&five, ""));
    wait_servers(&a.addr, &five);
    wait_servers(&b.addr.to_string(), &five);
    assert!(a.client().stat("handoff_until") > 0);

    a.stop(how);
    let a = Sidecar::start(&a_path);
    let mut a_client = a.client();
    let mut not_deleted = Vec::new();
    for i in 0..KEYS {
        let reply = call(&mut a_client, &format!("delete key:{i}\r\n"));
        if reply != "DELETED\r\n" {
            not_deleted.push((i, reply));
        }
    }
    let back: Vec<usize> = (0..KEYS)
        .filter(|i| b_client.get(&format!("key:{i}")).is_some())
        .collect();
    let back_through_a: Vec<usize> = (0..KEYS)
        .filter(|i| a_client.get(&format!("key:{i}")).is_some())
        .collect();
    let lost_counts: Vec<(usize, String)> = (0..KEYS)
        .map(|i| (i, call(&mut a_client, &format!("incr count:{i} 1\r\n"))))
        .filter(|(_, reply)| reply != "11\r\n")
        .collect();
    assert!(
        back.is_empty() && back_through_a.is_empty(),
        "{} keys deleted through the restarted sidecar came back through the other one, {} through itself",
        back.len(),
        back_through_a.len()
    );
    assert!(
        lost_counts.is_empty(),
        "incr through the restarted sidecar lost {} of {KEYS} counters: {:?}",
        lost_counts.len(),
        &lost_counts[..lost_counts.len().min(5)]
    );
    assert!(not_deleted.is_empty(), "{not_deleted:?}");
    let state = dir.join("a.toml.handoff-state");
    let line = a
        .logged("resumed hand-off window from")
        .unwrap_or_else(|| panic!("no resume line: {:?}", a.lines()));
    assert!(line.contains(&state.display().to_string()), "{line}");
    assert_eq!(a.client().stat("handoff_windows_resumed"), 1);
    assert!(a.client().stat("handoff_until") > 0);
    drop(a);
    drop(b);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_sidecar_restarted_with_sigterm_inside_a_window_keeps_reaching_previous_owners() {
    deletes_and_counts_survive(Stop::Term);
}

#[test]
fn a_sidecar_killed_inside_a_window_keeps_reaching_previous_owners() {
    deletes_and_counts_survive(Stop::Kill);
}

/// The config edited while memring was down (5 -> 6 servers, after
/// 4 -> 5): the edit chains onto the saved window as a reload would, so a
/// delete through the restarted sidecar still reaches the first change's
/// previous owners. The server the saved window knows keeps its data; the
/// one it does not know is flushed before it joins.
#[test]
fn a_config_changed_while_down_chains_onto_the_saved_window() {
    let servers: Vec<Memcached> = (0..6).map(|_| Memcached::start()).collect();
    let four: Vec<&Memcached> = servers[..4].iter().collect();
    let five: Vec<&Memcached> = servers[..5].iter().collect();
    let six: Vec<&Memcached> = servers.iter().collect();
    let dir = temp_dir("changed-while-down");
    let (a_path, b_path) = (dir.join("a.toml"), dir.join("b.toml"));
    std::fs::write(&a_path, config_text(&four, "")).unwrap();
    std::fs::write(&b_path, config_text(&four, "")).unwrap();
    let a = Sidecar::start(&a_path);
    let b = Proxy::start_file(&b_path);
    let mut b_client = b.client();
    const KEYS: usize = 400;
    for i in 0..KEYS {
        b_client.set(&format!("key:{i}"), b"v1");
    }
    replace_by_rename(&a_path, &config_text(&five, ""));
    replace_by_rename(&b_path, &config_text(&five, ""));
    wait_servers(&a.addr, &five);
    wait_servers(&b.addr.to_string(), &five);
    // Written in the window: the fifth server holds live data.
    for i in 0..KEYS {
        b_client.set(&format!("live:{i}"), b"new");
    }
    let on_fifth = servers[4].client().stat("curr_items");
    assert!(on_fifth > 0);
    // The sixth server holds values from some earlier life.
    let mut sixth = servers[5].client();
    for i in 0..50 {
        sixth.set(&format!("stale:{i}"), b"old");
    }
    a.stop(Stop::Term);
    std::fs::write(&a_path, config_text(&six, "")).unwrap();
    let a = Sidecar::start(&a_path);
    wait_servers(&a.addr, &six);
    let mut a_client = a.client();
    for i in 0..KEYS {
        call(&mut a_client, &format!("delete key:{i}\r\n"));
    }
    let back = (0..KEYS)
        .filter(|i| b_client.get(&format!("key:{i}")).is_some())
        .count();
    assert_eq!(back, 0, "deleted keys came back through the other sidecar");
    assert_eq!(
        servers[5].client().stat("curr_items"),
        0,
        "the new server was not flushed"
    );
    assert!(
        servers[4].client().stat("curr_items") >= on_fifth,
        "the server the saved window knew was flushed"
    );
    let lost = (0..KEYS)
        .filter(|i| a_client.get(&format!("live:{i}")).as_deref() != Some(b"new"))
        .count();
    assert_eq!(lost, 0);
    let line = a
        .logged("changed while memring was down")
        .unwrap_or_else(|| panic!("{:?}", a.lines()));
    assert!(line.contains("resumed hand-off window from"), "{line}");
    drop(a);
    drop(b);
    let _ = std::fs::remove_dir_all(dir);
}

/// A window whose time ran out while memring was down, its sweep not run:
/// taken up with its deadline passed, so its sweep runs at once and
/// deletes the previous owners' copies, which an undo would otherwise
/// read back.
#[test]
fn a_window_that_ended_while_down_is_swept_at_start() {
    let servers: Vec<Memcached> = (0..5).map(|_| Memcached::start()).collect();
    let four: Vec<&Memcached> = servers[..4].iter().collect();
    let five: Vec<&Memcached> = servers.iter().collect();
    let dir = temp_dir("swept-at-start");
    let path = dir.join("a.toml");
    std::fs::write(&path, config_text(&four, "handoff_ms = 2000")).unwrap();
    let a = Sidecar::start(&path);
    let mut client = a.client();
    const KEYS: usize = 300;
    for i in 0..KEYS {
        client.set(&format!("key:{i}"), b"v1");
    }
    replace_by_rename(&path, &config_text(&five, "handoff_ms = 2000"));
    wait_servers(&a.addr, &five);
    let until = client.stat("handoff_until");
    a.stop(Stop::Kill);
    let held_before: u64 = four.iter().map(|s| s.client().stat("curr_items")).sum();
    assert_eq!(held_before, KEYS as u64);
    wait_for("the window's time to pass", || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            > until
    });
    let a = Sidecar::start(&path);
    // The sweep deletes, from the first four servers, the keys the fifth
    // owns now.
    let mut swept = 0;
    wait_for("the sweep at start", || {
        swept = a.client().stat("handoff_sweeps");
        swept >= 5
    });
    wait_for("the window to end", || {
        a.client().stat("handoff_until") == 0
    });
    let held_after: u64 = four.iter().map(|s| s.client().stat("curr_items")).sum();
    assert!(held_after < held_before, "nothing swept");
    assert!(a.logged("its time was up").is_some(), "{:?}", a.lines());
    drop(a);
    let _ = std::fs::remove_dir_all(dir);
}

/// Missing, corrupt, another version, a FIFO: each is reported (a missing
/// one at info), none stops memring from serving, and the unusable ones
/// start the guarded window: a delete through the sidecar then reaches
/// every server, so another sidecar still in its window reads a miss.
#[test]
fn missing_corrupt_and_foreign_state_files_are_reported_and_safe() {
    let servers: Vec<Memcached> = (0..5).map(|_| Memcached::start()).collect();
    let four: Vec<&Memcached> = servers[..4].iter().collect();
    let five: Vec<&Memcached> = servers.iter().collect();
    let dir = temp_dir("bad-state");
    let (a_path, b_path) = (dir.join("a.toml"), dir.join("b.toml"));
    let state = dir.join("a.toml.handoff-state");
    std::fs::write(&a_path, config_text(&five, "")).unwrap();
    // Missing: a first start.
    let a = Sidecar::start(&a_path);
    let line = a
        .logged("no hand-off state file at")
        .unwrap_or_else(|| panic!("{:?}", a.lines()));
    assert!(line.contains("INFO"), "{line}");
    assert_eq!(a.client().stat("handoff_state_errors"), 0);
    assert_eq!(a.client().stat("handoff_until"), 0);
    a.stop(Stop::Term);

    std::fs::write(&b_path, config_text(&four, "")).unwrap();
    let b = Proxy::start_file(&b_path);
    let mut b_client = b.client();
    replace_by_rename(&b_path, &config_text(&five, ""));
    type Make<'a> = &'a dyn Fn(&Path);
    let bad: [(&str, Make<'_>, &str); 4] = [
        (
            "corrupt",
            &|p| std::fs::write(p, b"\x00\x01 not toml [[[").unwrap(),
            "not a state file",
        ),
        (
            "another version",
            &|p| std::fs::write(p, "version = 99\n").unwrap(),
            "format version 99",
        ),
        (
            "a FIFO",
            &|p| {
                let status = Command::new("mkfifo").arg(p).status().unwrap();
                assert!(status.success());
            },
            "not a regular file",
        ),
        (
            "a directory",
            &|p| std::fs::create_dir(p).unwrap(),
            "Is a directory",
        ),
    ];
    for (round, (what, make, reason)) in bad.iter().enumerate() {
        let _ = std::fs::remove_file(&state);
        let _ = std::fs::remove_dir_all(&state);
        // B's window (4 -> 5) holds the keys on their previous owners.
        let keys: Vec<String> = (0..200).map(|i| format!("r{round}:{i}")).collect();
        replace_by_rename(&b_path, &config_text(&four, ""));
        wait_servers(&b.addr.to_string(), &four);
        for key in &keys {
            b_client.set(key, b"old");
        }
        replace_by_rename(&b_path, &config_text(&five, ""));
        wait_servers(&b.addr.to_string(), &five);
        make(&state);
        let started = Instant::now();
        let a = Sidecar::start(&a_path);
        assert!(started.elapsed() < DEADLINE, "{what}: start blocked");
        let line = a
            .logged("is unusable")
            .unwrap_or_else(|| panic!("{what}: {:?}", a.lines()));
        assert!(line.contains(reason), "{what}: {line}");
        assert!(
            line.contains(&state.display().to_string()),
            "{what}: {line}"
        );
        // A directory cannot be written over either: counted again.
        assert!(a.client().stat("handoff_state_errors") >= 1, "{what}");
        let mut a_client = a.client();
        for key in &keys {
            call(&mut a_client, &format!("delete {key}\r\n"));
        }
        let back = keys.iter().filter(|k| b_client.get(k).is_some()).count();
        assert_eq!(
            back, 0,
            "{what}: deleted keys read back through the other sidecar"
        );
        assert!(
            a.client().stat("handoff_until") > 0,
            "{what}: no guarded window"
        );
        a.stop(Stop::Kill);
    }
    drop(b);
    let _ = std::fs::remove_dir_all(dir);
}

/// A small model: two sidecars (A the binary, B in-process) over six
/// servers, random sets, deletes, increments and reads through either,
/// membership flips between server sets applied to both, and A restarted
/// (SIGTERM or SIGKILL) inside the windows. Every read must return the
/// last acknowledged value or miss; never an older one.
#[test]
fn restarts_inside_windows_never_read_an_overwritten_value() {
    let servers: Vec<Memcached> = (0..6).map(|_| Memcached::start()).collect();
    let sets: [&[usize]; 4] = [
        &[0, 1, 2, 3],
        &[0, 1, 2, 3, 4],
        &[1, 2, 3, 4, 5],
        &[0, 2, 3, 4],
    ];
    let list = |set: &[usize]| -> Vec<&Memcached> { set.iter().map(|&i| &servers[i]).collect() };
    let dir = temp_dir("model");
    let (a_path, b_path) = (dir.join("a.toml"), dir.join("b.toml"));
    std::fs::write(&a_path, config_text(&list(sets[0]), "")).unwrap();
    std::fs::write(&b_path, config_text(&list(sets[0]), "")).unwrap();
    let mut a = Some(Sidecar::start(&a_path));
    let b = Proxy::start_file(&b_path);
    let mut b_client = b.client();
    let mut a_client = a.as_ref().unwrap().client();
    // A fixed seed: the run is the same every time.
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    const KEYS: u64 = 80;
    let mut model: BTreeMap<u64, Option<String>> = BTreeMap::new();
    let mut version = 0u64;
    let (mut reads, mut hits, mut restarts) = (0, 0, 0);
    let started = Instant::now();
    for round in 0..8 {
        let set = sets[(round + 1) % sets.len()];
        replace_by_rename(&a_path, &config_text(&list(set), ""));
        replace_by_rename(&b_path, &config_text(&list(set), ""));
        wait_servers(&a.as_ref().unwrap().addr, &list(set));
        wait_servers(&b.addr.to_string(), &list(set));
        let restart_at = next(150);
        for step in 0..150 {
            if step == restart_at {
                let how = if next(2) == 0 { Stop::Term } else { Stop::Kill };
                a.take().unwrap().stop(how);
                a = Some(Sidecar::start(&a_path));
                a_client = a.as_ref().unwrap().client();
                restarts += 1;
            }
            let key = next(KEYS);
            let name = format!("m:{key}");
            let client = if next(2) == 0 {
                &mut a_client
            } else {
                &mut b_client
            };
            match next(10) {
                0..=2 => {
                    version += 1;
                    let value = format!("v{version}");
                    assert_eq!(client.set(&name, value.as_bytes()), b"STORED\r\n");
                    model.insert(key, Some(value));
                }
                3 => {
                    let reply = call(client, &format!("delete {name}\r\n"));
                    assert!(
                        reply == "DELETED\r\n" || reply == "NOT_FOUND\r\n",
                        "{reply}"
                    );
                    model.insert(key, None);
                }
                4 => {
                    // Counters live in values that are numbers.
                    let reply = call(client, &format!("incr {name} 1\r\n"));
                    match reply.trim_end().parse::<u64>() {
                        Ok(n) => {
                            model.insert(key, Some(n.to_string()));
                        }
                        // Not a number (a `v…` value) or gone: a miss for
                        // a counter is allowed, and leaves the value.
                        Err(_) if reply.starts_with("CLIENT_ERROR") => {}
                        // A miss changes nothing: a later read may still
                        // return the last value written, never an older one.
                        Err(_) => assert_eq!(reply, "NOT_FOUND\r\n"),
                    }
                }
                5 => {
                    version += 1;
                    let value = format!("{version}");
                    assert_eq!(client.set(&name, value.as_bytes()), b"STORED\r\n");
                    model.insert(key, Some(value));
                }
                _ => {
                    reads += 1;
                    let got = client.get(&name).map(|v| String::from_utf8(v).unwrap());
                    if let Some(got) = got {
                        hits += 1;
                        assert_eq!(
                            Some(&got),
                            model.get(&key).and_then(|v| v.as_ref()),
                            "round {round} step {step}: {name} read a value that is not the last acknowledged one"
                        );
                    }
                }
            }
        }
    }
    eprintln!(
        "model: {reads} reads ({hits} hits), {restarts} restarts, {:?}",
        started.elapsed()
    );
    assert!(
        hits > reads / 4,
        "too few hits to mean anything: {hits} of {reads}"
    );
    drop(a);
    drop(b);
    let _ = std::fs::remove_dir_all(dir);
}

/// Each pool keeps its own window: a routed pool's 4 -> 5 change is
/// resumed after a restart while the default pool, unchanged, has none.
#[test]
fn each_pool_resumes_its_own_window() {
    let servers: Vec<Memcached> = (0..7).map(|_| Memcached::start()).collect();
    let text = |carts: &[Memcached]| {
        let mut text = config_text(&[&servers[0], &servers[1]], "");
        text.push_str("[[pools]]\nname = \"carts\"\n");
        for server in carts {
            text.push_str(&format!(
                "[[pools.servers]]\naddr = \"{}\"\n",
                server.addr()
            ));
        }
        text.push_str("[[routes]]\nprefix = \"cart:\"\npool = \"carts\"\n");
        text
    };
    let dir = temp_dir("pools");
    let (a_path, b_path) = (dir.join("a.toml"), dir.join("b.toml"));
    std::fs::write(&a_path, text(&servers[2..6])).unwrap();
    std::fs::write(&b_path, text(&servers[2..6])).unwrap();
    let a = Sidecar::start(&a_path);
    let b = Proxy::start_file(&b_path);
    let mut b_client = b.client();
    const KEYS: usize = 300;
    for i in 0..KEYS {
        b_client.set(&format!("cart:{i}"), b"v1");
        b_client.set(&format!("plain:{i}"), b"v1");
    }
    replace_by_rename(&a_path, &text(&servers[2..7]));
    replace_by_rename(&b_path, &text(&servers[2..7]));
    let carts_joined = |addr: &str| {
        let name = format!("pool:carts:server:{}:membership", servers[6].addr());
        Client::connect(addr)
            .stats("")
            .iter()
            .any(|(k, v)| *k == name && v == "JOINING")
    };
    wait_for("A to apply the change", || carts_joined(&a.addr));
    wait_for("B to apply the change", || {
        carts_joined(&b.addr.to_string())
    });
    a.stop(Stop::Kill);
    let a = Sidecar::start(&a_path);
    let mut a_client = a.client();
    for i in 0..KEYS {
        call(&mut a_client, &format!("delete cart:{i}\r\n"));
    }
    let back = (0..KEYS)
        .filter(|i| b_client.get(&format!("cart:{i}")).is_some())
        .count();
    assert_eq!(back, 0, "deleted keys of the routed pool came back");
    let plain = (0..KEYS)
        .filter(|i| a_client.get(&format!("plain:{i}")).as_deref() == Some(b"v1"))
        .count();
    assert_eq!(plain, KEYS);
    let line = a
        .logged("pool carts: resumed hand-off window from")
        .unwrap_or_else(|| panic!("{:?}", a.lines()));
    assert!(line.contains("same ring in force"), "{line}");
    assert_eq!(a.client().stat("handoff_windows_resumed"), 1);
    assert_eq!(
        a.client().stat("handoff_until"),
        0,
        "the default pool has no window"
    );
    assert!(a.client().stat("pool:carts:handoff_until") > 0);
    drop(a);
    drop(b);
    let _ = std::fs::remove_dir_all(dir);
}

/// A state file that cannot be written: logged once, counted, and memring
/// serves on (the window itself works as without a state file).
#[test]
fn an_unwritable_state_file_is_logged_once_and_memring_serves_on() {
    let servers: Vec<Memcached> = (0..6).map(|_| Memcached::start()).collect();
    let dir = temp_dir("unwritable");
    let path = dir.join("a.toml");
    let settings = format!(
        "state_file = \"{}\"",
        dir.join("no such directory").join("state").display()
    );
    let list = |n: usize| -> Vec<&Memcached> { servers[..n].iter().collect() };
    std::fs::write(&path, config_text(&list(4), &settings)).unwrap();
    let a = Sidecar::start(&path);
    let mut client = a.client();
    for i in 0..100 {
        client.set(&format!("key:{i}"), b"v1");
    }
    replace_by_rename(&path, &config_text(&list(5), &settings));
    wait_servers(&a.addr, &list(5));
    let hits = (0..100)
        .filter(|i| client.get(&format!("key:{i}")).as_deref() == Some(b"v1"))
        .count();
    assert_eq!(
        hits, 100,
        "the window reads through as without a state file"
    );
    replace_by_rename(&path, &config_text(&list(6), &settings));
    wait_servers(&a.addr, &list(6));
    assert!(client.stat("handoff_state_errors") >= 2);
    let warnings = a
        .lines()
        .iter()
        .filter(|l| l.contains("cannot write the hand-off state file"))
        .count();
    assert_eq!(warnings, 1, "{:?}", a.lines());
    drop(a);
    let _ = std::fs::remove_dir_all(dir);
}
