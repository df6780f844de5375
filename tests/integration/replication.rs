//! `replicas = 3` over five real memcached servers: placement, quorum writes,
//! fall-through reads, and what a dead server costs.

use std::time::{Duration, Instant};

use crate::common::{show, wait_for, Memcached, Proxy};
use smallvec::SmallVec;

const SETTINGS: &str = "replicas = 3\nconnect_timeout_ms = 200\nrequest_timeout_ms = 400\n";

fn start(settings: &str) -> (Vec<Memcached>, Proxy) {
    let servers: Vec<Memcached> = (0..5).map(|_| Memcached::start()).collect();
    let proxy = Proxy::start(&servers.iter().collect::<Vec<_>>(), settings);
    (servers, proxy)
}

/// The servers `key`'s replicas are on (the topology's replica walk).
pub(crate) fn replicas_of(proxy: &Proxy, key: &str) -> SmallVec<[usize; 4]> {
    let mut set = SmallVec::new();
    proxy
        .running()
        .topology
        .load()
        .replicas(key.as_bytes(), &mut set);
    set
}

#[test]
fn every_key_lands_on_exactly_its_three_replicas() {
    let (servers, proxy) = start(SETTINGS);
    let mut client = proxy.client();
    let mut direct: Vec<_> = servers.iter().map(Memcached::client).collect();
    // How many distinct servers hold copies of server 0's keys.
    let mut partners = std::collections::BTreeSet::new();
    for i in 0..300 {
        let key = format!("rep:{i}");
        assert_eq!(client.set(&key, key.as_bytes()), b"STORED\r\n");
        let expected = replicas_of(&proxy, &key);
        assert_eq!(expected.len(), 3);
        let mut sorted = expected.to_vec();
        sorted.sort_unstable();
        // STORED comes on a quorum of 2; the third copy may land a moment later.
        let mut holders = Vec::new();
        wait_for(&format!("{key} on exactly its replica set"), || {
            holders = (0..5)
                .filter(|&s| direct[s].get(&key).is_some())
                .collect::<Vec<usize>>();
            holders == sorted
        });
        if expected[0] == 0 {
            partners.extend(expected[1..].iter().copied());
        }
    }
    println!(
        "server 0's keys have copies on {} other servers: {partners:?}",
        partners.len()
    );
    assert_eq!(
        partners.len(),
        4,
        "copies spread over all the other servers"
    );
}

#[test]
fn with_one_server_killed_writes_succeed_and_every_key_is_still_readable() {
    let (mut servers, proxy) = start(SETTINGS);
    let mut client = proxy.client();
    let keys: Vec<String> = (0..200).map(|i| format!("safe:{i}")).collect();
    for key in &keys {
        assert_eq!(client.set(key, b"before"), b"STORED\r\n");
    }
    servers[1].kill();
    for key in &keys {
        assert_eq!(
            client.get(key),
            Some(b"before".to_vec()),
            "{key} survives a dead server"
        );
    }
    for key in &keys {
        assert_eq!(
            client.set(key, b"after"),
            b"STORED\r\n",
            "{key}: quorum of 2 holds"
        );
        assert_eq!(client.get(key), Some(b"after".to_vec()));
    }
    let on_dead: Vec<&String> = keys
        .iter()
        .filter(|k| replicas_of(&proxy, k).contains(&1))
        .collect();
    assert!(!on_dead.is_empty());
    for key in on_dead {
        assert_eq!(
            client.call(
                format!("delete {key}\r\n").as_bytes(),
                memring::protocol::ReplyKind::Line
            ),
            b"DELETED\r\n"
        );
    }
}

#[test]
fn with_two_of_three_replicas_down_writes_fail_promptly() {
    let (mut servers, proxy) = start(SETTINGS);
    let mut client = proxy.client();
    let key = "fragile";
    let set = replicas_of(&proxy, key);
    servers[set[0]].kill();
    servers[set[2]].kill();
    let started = Instant::now();
    let reply = client.call(
        b"set fragile 0 0 1\r\nx\r\n",
        memring::protocol::ReplyKind::Line,
    );
    assert!(
        reply.starts_with(b"SERVER_ERROR no quorum: failed on "),
        "{}",
        show(&reply)
    );
    let text = String::from_utf8_lossy(&reply);
    assert!(
        text.contains(&servers[set[0]].addr()) && text.contains(&servers[set[2]].addr()),
        "{text}"
    );
    assert!(started.elapsed() < Duration::from_secs(2), "nothing hangs");
    // The surviving replica still serves reads of what it holds. (The failed
    // write was answered early, on two failures; wait for its third copy to
    // land so that it cannot overwrite the value set here.)
    let mut direct = servers[set[1]].client();
    wait_for("the surviving replica's copy", || {
        direct.get(key) == Some(b"x".to_vec())
    });
    assert_eq!(direct.set(key, b"kept"), b"STORED\r\n");
    assert_eq!(client.get(key), Some(b"kept".to_vec()));
}

#[test]
fn reads_fall_through_on_error_and_on_miss_when_enabled() {
    for fallthrough in [false, true] {
        let (mut servers, proxy) = start(&format!(
            "{SETTINGS}read_miss_fallthrough = {fallthrough}\n"
        ));
        let mut client = proxy.client();
        let key = "falls";
        assert_eq!(client.set(key, b"v"), b"STORED\r\n");
        let set = replicas_of(&proxy, key);
        // A miss on the owner (its copy evicted).
        let mut owner = servers[set[0]].client();
        assert_eq!(
            owner.call(b"delete falls\r\n", memring::protocol::ReplyKind::Line),
            b"DELETED\r\n"
        );
        let expected = if fallthrough {
            Some(b"v".to_vec())
        } else {
            None
        };
        assert_eq!(
            client.get(key),
            expected,
            "fallthrough on miss = {fallthrough}"
        );
        // An error on the owner always falls through.
        servers[set[0]].kill();
        assert_eq!(client.get(key), Some(b"v".to_vec()));
        let multi = client.call(
            b"get falls nothing falls\r\n",
            memring::protocol::ReplyKind::Values,
        );
        assert_eq!(
            show(&multi),
            show(b"VALUE falls 0 1\r\nv\r\nVALUE falls 0 1\r\nv\r\nEND\r\n")
        );
    }
}

#[test]
fn cas_is_checked_on_the_owner_and_copied_to_the_replicas() {
    let (servers, proxy) = start(SETTINGS);
    let mut client = proxy.client();
    assert_eq!(client.set("token", b"one"), b"STORED\r\n");
    let reply = client.call(b"gets token\r\n", memring::protocol::ReplyKind::Values);
    let header = String::from_utf8_lossy(&reply)
        .lines()
        .next()
        .unwrap()
        .to_string();
    let cas: u64 = header.rsplit(' ').next().unwrap().parse().unwrap();
    let request = format!("cas token 0 0 3 {cas}\r\ntwo\r\n");
    assert_eq!(
        client.call(request.as_bytes(), memring::protocol::ReplyKind::Line),
        b"STORED\r\n"
    );
    assert_eq!(
        client.call(request.as_bytes(), memring::protocol::ReplyKind::Line),
        b"EXISTS\r\n"
    );
    for &replica in &replicas_of(&proxy, "token") {
        let mut direct = servers[replica].client();
        wait_for("the new value on every replica", || {
            direct.get("token") == Some(b"two".to_vec())
        });
    }
}

#[test]
fn adding_a_sixth_server_keeps_more_hits_with_replicas_than_without() {
    let mut hit_rates = Vec::new();
    for settings in ["", "replicas = 2\nread_miss_fallthrough = true\n"] {
        let servers: Vec<Memcached> = (0..6).map(|_| Memcached::start()).collect();
        let dir = std::env::temp_dir().join(format!(
            "memring-rep-{}-{}",
            std::process::id(),
            hit_rates.len()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("memring.toml");
        std::fs::write(
            &path,
            crate::common::config_text(&servers[..5].iter().collect::<Vec<_>>(), settings),
        )
        .unwrap();
        let proxy = Proxy::start_file(&path);
        let mut client = proxy.client();
        let keys: Vec<String> = (0..600).map(|i| format!("grow:{i}")).collect();
        for key in &keys {
            assert_eq!(client.set(key, b"v"), b"STORED\r\n");
        }
        let temporary = dir.join("next.toml");
        std::fs::write(
            &temporary,
            crate::common::config_text(&servers.iter().collect::<Vec<_>>(), settings),
        )
        .unwrap();
        std::fs::rename(&temporary, &path).unwrap();
        wait_for("the sixth server", || proxy.ring_version() == 2);
        let hits = keys.iter().filter(|k| client.get(k).is_some()).count();
        hit_rates.push(hits as f64 / keys.len() as f64);
        let _ = std::fs::remove_dir_all(dir);
    }
    println!(
        "hit rate after 5 -> 6 servers: replicas=1 {:.3}, replicas=2 with fall-through {:.3}",
        hit_rates[0], hit_rates[1]
    );
    assert!(hit_rates[1] >= hit_rates[0], "{hit_rates:?}");
    assert!(hit_rates[1] > 0.95, "{hit_rates:?}");
}

#[test]
fn killing_any_one_server_under_load_loses_no_key_and_fails_no_request() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    let (mut servers, proxy) = start(SETTINGS);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..6)
        .map(|w| {
            let (stop, done) = (stop.clone(), done.clone());
            let mut client = proxy.client();
            std::thread::spawn(move || {
                let mut last = std::collections::HashMap::new();
                for round in 0..200_000 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let key = format!("load:{w}:{}", round % 40);
                    let value = format!("{round}");
                    assert_eq!(
                        client.set(&key, value.as_bytes()),
                        b"STORED\r\n",
                        "set {key}"
                    );
                    last.insert(key.clone(), value);
                    let probe = format!("load:{w}:{}", (round * 7) % 40);
                    if let Some(expected) = last.get(&probe) {
                        assert_eq!(
                            client.get(&probe),
                            Some(expected.clone().into_bytes()),
                            "{probe} lost or stale"
                        );
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
                last
            })
        })
        .collect();
    wait_for("load to run", || done.load(Ordering::Relaxed) > 1500);
    servers[3].kill();
    let at_kill = done.load(Ordering::Relaxed);
    wait_for("load to go on without the server", || {
        done.load(Ordering::Relaxed) > at_kill + 3000
    });
    stop.store(true, Ordering::Relaxed);
    let mut client = proxy.client();
    for worker in workers {
        let last = worker.join().expect("no request failed");
        for (key, value) in last {
            assert_eq!(client.get(&key), Some(value.into_bytes()), "{key} survives");
        }
    }
}

#[test]
fn a_set_pipelined_after_a_cas_is_never_overwritten_by_the_cas_copy() {
    let (servers, proxy) = start(SETTINGS);
    let mut client = proxy.client();
    let mut direct: Vec<_> = servers.iter().map(Memcached::client).collect();
    for i in 0..100 {
        let key = format!("cas-order:{i}");
        assert_eq!(client.set(&key, b"old"), b"STORED\r\n");
        let reply = client.call(
            format!("gets {key}\r\n").as_bytes(),
            memring::protocol::ReplyKind::Values,
        );
        let header = String::from_utf8_lossy(&reply);
        let unique = header
            .lines()
            .next()
            .and_then(|line| line.split(' ').nth(4))
            .unwrap_or_else(|| panic!("no cas unique in {header}"))
            .to_string();
        // One write: the cas, then a set of the same key right behind it.
        client.send(
            format!("cas {key} 0 0 3 {unique}\r\nmid\r\nset {key} 0 0 3\r\nnew\r\n").as_bytes(),
        );
        assert_eq!(
            client.reply(memring::protocol::ReplyKind::Line),
            b"STORED\r\n"
        );
        assert_eq!(
            client.reply(memring::protocol::ReplyKind::Line),
            b"STORED\r\n"
        );
        // The set answers on a quorum; wait for every copy, then none may
        // hold the cas's older value.
        let replicas = replicas_of(&proxy, &key);
        wait_for(
            &format!("{key}: every replica has the newest value"),
            || {
                replicas
                    .iter()
                    .all(|&s| direct[s].get(&key) == Some(b"new".to_vec()))
            },
        );
    }
}

/// `replicas = 2` and a fifth server joining: the hand-off window reads the
/// keys whose replica set changed from the previous ring's replicas too, so
/// nearly every key still hits, with classic and meta gets.
#[test]
fn replicas_and_a_join_keep_every_key_readable() {
    let dir = crate::common::TempDir::new("replication", "join");
    let servers: Vec<Memcached> = (0..5).map(|_| Memcached::start()).collect();
    let config = |n: usize| {
        crate::common::config_text(&servers.iter().take(n).collect::<Vec<_>>(), "replicas = 2")
    };
    let path = dir.path("memring.toml");
    std::fs::write(&path, config(4)).unwrap();
    let proxy = Proxy::start_file(&path);
    let mut client = proxy.client();
    let keys: Vec<String> = (0..4_000).map(|i| format!("join:{i}")).collect();
    for key in &keys {
        assert_eq!(client.set(key, key.as_bytes()), b"STORED\r\n");
    }
    let temporary = path.with_extension("tmp");
    std::fs::write(&temporary, config(5)).unwrap();
    std::fs::rename(&temporary, &path).unwrap();
    wait_for("ring version 2", || proxy.ring_version() >= 2);
    let mut hits = 0;
    for chunk in keys.chunks(50) {
        let request = format!("get {}\r\n", chunk.join(" "));
        let reply = client.call(request.as_bytes(), memring::protocol::ReplyKind::Values);
        hits += reply.windows(6).filter(|w| w == b"VALUE ").count();
    }
    let mut meta_hits = 0;
    for key in keys.iter().step_by(4) {
        client.send(format!("mg {key} v\r\n").as_bytes());
        let reply = client.meta_reply();
        if reply.starts_with(b"VA ") {
            assert!(
                show(&reply).contains(key.as_str()),
                "{key}: {}",
                show(&reply)
            );
            meta_hits += 1;
        }
    }
    println!(
        "replicas = 2, 4 -> 5: {hits} of {} keys hit, meta {meta_hits} of {}",
        keys.len(),
        keys.len() / 4
    );
    assert!(
        hits >= keys.len() * 995 / 1000,
        "{hits} of {} hit",
        keys.len()
    );
    assert!(
        meta_hits >= keys.len() / 4 * 995 / 1000,
        "meta: {meta_hits}"
    );
}

/// A replicated pool of 4 servers (`replicas = 2`) grown to 5 within its
/// config file, with each of `keys` stored as `<key>=v1` before: the
/// hand-off window the undo tests write in. Returns the file's directory,
/// the servers, the file and memring.
fn window_of_five(
    test: &str,
    keys: &[String],
) -> (
    crate::common::TempDir,
    Vec<Memcached>,
    std::path::PathBuf,
    Proxy,
) {
    let dir = crate::common::TempDir::new("replication", test);
    let servers: Vec<Memcached> = (0..5).map(|_| Memcached::start()).collect();
    let path = dir.path("memring.toml");
    std::fs::write(&path, replicated_config(&servers, 4)).unwrap();
    let proxy = Proxy::start_file(&path);
    let mut client = proxy.client();
    for key in keys {
        assert_eq!(
            client.set(key, format!("{key}=v1").as_bytes()),
            b"STORED\r\n"
        );
    }
    crate::common::replace_by_rename(&path, &replicated_config(&servers, 5));
    wait_for("ring version 2", || proxy.ring_version() >= 2);
    (dir, servers, path, proxy)
}

/// The config over the first `n` of `servers`, with `replicas = 2`.
fn replicated_config(servers: &[Memcached], n: usize) -> String {
    crate::common::config_text(&servers.iter().take(n).collect::<Vec<_>>(), "replicas = 2")
}

/// Undoes the change of [`window_of_five`] and lists the replicas (now)
/// of `keys` that still hold `<key>=v1`, asked directly.
fn undo_and_find_v1(
    servers: &[Memcached],
    path: &std::path::Path,
    proxy: &Proxy,
    keys: &[String],
) -> Vec<String> {
    crate::common::replace_by_rename(path, &replicated_config(servers, 4));
    wait_for("ring version 3", || proxy.ring_version() >= 3);
    let mut direct: Vec<_> = servers.iter().map(Memcached::client).collect();
    let mut held_old = Vec::new();
    for key in keys {
        for replica in replicas_of(proxy, key) {
            if direct[replica].get(key) == Some(format!("{key}=v1").into_bytes()) {
                held_old.push(format!("{key} on server {replica}"));
            }
        }
    }
    held_old
}

/// `replicas = 2`: 4 -> 5 servers, every key rewritten (`set` and `ms`), then the change
/// undone within the window. A replica of the old ring that is not one now
/// gets a `delete` with each write, so after the undo no key reads the value
/// the rewrite replaced.
#[test]
fn replicated_writes_in_a_window_leave_no_older_copy_for_an_undo() {
    let keys: Vec<String> = (0..2_000).map(|i| format!("rundo:{i}")).collect();
    let (_dir, servers, path, proxy) = window_of_five("undo", &keys);
    let mut client = proxy.client();
    for (i, key) in keys.iter().enumerate() {
        let value = format!("{key}=v2");
        if i % 2 == 0 {
            assert_eq!(client.set(key, value.as_bytes()), b"STORED\r\n");
        } else {
            client.send(format!("ms {key} {}\r\n{value}\r\n", value.len()).as_bytes());
            assert_eq!(client.meta_reply(), b"HD\r\n");
        }
    }
    // Not only the first replica: none of the key's replicas now may hold
    // the old value, or a read falling through (its first replica DEAD, or
    // evicted) would return it.
    let held_old = undo_and_find_v1(&servers, &path, &proxy, &keys);
    let stale = keys
        .iter()
        .filter(|key| client.get(key) == Some(format!("{key}=v1").into_bytes()))
        .count();
    assert_eq!(stale, 0, "reads of the overwritten v1 after the undo");
    assert!(
        held_old.is_empty(),
        "{} replicas hold v1: {:?}",
        held_old.len(),
        &held_old[..held_old.len().min(5)]
    );
}

/// As above with `cas` (classic `gets`/`cas`, and meta `mg c`/`ms C`): a
/// replica of the old ring that is not one now gets the cas's copy, so
/// after the undo no key whose cas was stored reads the value it replaced,
/// and no replica holds it.
#[test]
fn replicated_cas_in_a_window_leaves_no_older_copy_for_an_undo() {
    let keys: Vec<String> = (0..1_000).map(|i| format!("casundo:{i}")).collect();
    let (_dir, servers, path, proxy) = window_of_five("cas-undo", &keys);
    let mut client = proxy.client();
    let mut stored = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let value = format!("{key}=v2");
        if i % 2 == 0 {
            let reply = client.call(
                format!("gets {key}\r\n").as_bytes(),
                memring::protocol::ReplyKind::Values,
            );
            let text = String::from_utf8_lossy(&reply).into_owned();
            let Some(cas) = text.lines().next().and_then(|l| l.split(' ').nth(4)) else {
                continue;
            };
            let request = format!("cas {key} 0 0 {} {cas}\r\n{value}\r\n", value.len());
            if client.call(request.as_bytes(), memring::protocol::ReplyKind::Line) == b"STORED\r\n"
            {
                stored.push(key.clone());
            }
        } else {
            client.send(format!("mg {key} c\r\n").as_bytes());
            let reply = String::from_utf8_lossy(&client.meta_reply()).into_owned();
            let Some(cas) = reply.split_whitespace().find_map(|t| t.strip_prefix('c')) else {
                continue;
            };
            client.send(format!("ms {key} {} C{cas}\r\n{value}\r\n", value.len()).as_bytes());
            if client.meta_reply() == b"HD\r\n" {
                stored.push(key.clone());
            }
        }
    }
    assert!(
        stored.len() > keys.len() / 2,
        "{} of {} cas stored",
        stored.len(),
        keys.len()
    );
    let held_old = undo_and_find_v1(&servers, &path, &proxy, &stored);
    let stale: Vec<&String> = stored
        .iter()
        .filter(|key| client.get(key) == Some(format!("{key}=v1").into_bytes()))
        .collect();
    assert!(
        stale.is_empty(),
        "{} stored cas read back v1: {:?}",
        stale.len(),
        &stale[..stale.len().min(5)]
    );
    assert!(
        held_old.is_empty(),
        "{} replicas hold v1: {:?}",
        held_old.len(),
        &held_old[..held_old.len().min(5)]
    );
}

/// The keys of `keys` whose owner (first replica) changed in the hand-off
/// window `proxy` is in.
fn moved_owner(proxy: &Proxy, keys: &[String]) -> Vec<String> {
    let topology = proxy.running().topology.load();
    keys.iter()
        .filter(|key| {
            let (mut now, mut before) = (SmallVec::new(), SmallVec::new());
            topology.replicas(key.as_bytes(), &mut now);
            topology.previous_replicas(key.as_bytes(), &mut before);
            now.first() != before.first()
        })
        .cloned()
        .collect()
}

/// The cas number of a `gets` reply (`VALUE k f n <cas>`) or of an `mg … c`
/// reply (`c<cas>`).
fn cas_number(reply: &[u8]) -> String {
    let text = String::from_utf8_lossy(reply);
    let line = text.lines().next().unwrap_or_default().to_string();
    line.split(' ')
        .find_map(|t| t.strip_prefix('c').filter(|n| n.parse::<u64>().is_ok()))
        .or_else(|| line.split(' ').nth(4))
        .unwrap_or_else(|| panic!("no cas number in {line:?}"))
        .to_string()
}

/// `replicas = 2`, 4 -> 5 servers: a moved key's `gets` (or `mg … c`) is
/// answered by the previous ring's owner, now the second replica, with its
/// cas number. A `cas` (`ms … C`) with it stores (the new owner lacks the key:
/// it is tried on the previous owner, and the value then set on every
/// replica before the answer); the same number again is stale (`EXISTS`);
/// and one that another client's write overtook does not store over it,
/// nor does one that another sidecar's write has overtaken on the owner
/// only (its hand-off not yet done).
fn replicated_cas_of_moved_keys(meta: bool) {
    let keys: Vec<String> = (0..1_500)
        .map(|i| format!("rcas-{}:{i}", if meta { "m" } else { "c" }))
        .collect();
    let test = if meta { "cas-moved-meta" } else { "cas-moved" };
    let (_dir, servers, _path, proxy) = window_of_five(test, &keys);
    // cas numbers are per server (a counter of its stores): the joining
    // server's would otherwise soon reach the numbers the others handed
    // out, and a stale number could be current on it by chance. Start it
    // well above them.
    let mut joining = servers[4].client();
    let mut filler = Vec::new();
    for n in 0..20_000 {
        filler.extend(format!("ms filler:{n} 1 q\r\nx\r\n").bytes());
    }
    filler.extend(b"mn\r\n");
    joining.send(&filler);
    assert_eq!(joining.meta_reply(), b"MN\r\n");
    let moved = moved_owner(&proxy, &keys);
    assert!(moved.len() > 100, "{} keys moved", moved.len());
    let (mut client, mut other) = (proxy.client(), proxy.client());
    let mut direct: Vec<_> = servers.iter().map(Memcached::client).collect();
    let read_cas = |client: &mut crate::common::Client, key: &str| {
        if meta {
            client.send(format!("mg {key} c v\r\n").as_bytes());
            cas_number(&client.meta_reply())
        } else {
            let reply = client.call(
                format!("gets {key}\r\n").as_bytes(),
                memring::protocol::ReplyKind::Values,
            );
            cas_number(&reply)
        }
    };
    let cas = |client: &mut crate::common::Client, key: &str, unique: &str, value: &str| {
        if meta {
            client.send(format!("ms {key} {} C{unique}\r\n{value}\r\n", value.len()).as_bytes());
            match &client.meta_reply()[..] {
                b"HD\r\n" => "stored".to_string(),
                b"EX\r\n" => "exists".to_string(),
                other => show(other),
            }
        } else {
            let request = format!("cas {key} 0 0 {} {unique}\r\n{value}\r\n", value.len());
            match &client.call(request.as_bytes(), memring::protocol::ReplyKind::Line)[..] {
                b"STORED\r\n" => "stored".to_string(),
                b"EXISTS\r\n" => "exists".to_string(),
                other => show(other),
            }
        }
    };
    let (mut failures, mut refused) = (Vec::new(), 0);
    for (i, key) in moved.iter().enumerate() {
        let unique = read_cas(&mut client, key);
        let (overtaken, halfway) = (i % 3 == 2, i % 3 == 1);
        let owner = replicas_of(&proxy, key)[0];
        let expected = if overtaken {
            assert_eq!(other.set(key, b"other"), b"STORED\r\n");
            "other".to_string()
        } else if halfway {
            // Another sidecar's write that has reached the owner only.
            assert_eq!(direct[owner].set(key, b"halfway"), b"STORED\r\n");
            "halfway".to_string()
        } else {
            format!("{key}=v2")
        };
        let wanted = if overtaken || halfway {
            "exists"
        } else {
            "stored"
        };
        let got = cas(&mut client, key, &unique, &format!("{key}=v2"));
        if got != wanted {
            refused += usize::from(!overtaken && !halfway);
            failures.push(format!("{key}: {got}, wanted {wanted}"));
            continue;
        }
        if halfway {
            if direct[owner].get(key).as_deref() != Some(&b"halfway"[..]) {
                failures.push(format!("{key}: the owner's newer write replaced"));
            }
            continue;
        }
        if !overtaken {
            let again = cas(&mut client, key, &unique, &format!("{key}=v3"));
            if again != "exists" {
                failures.push(format!("{key}: a stale cas {again}"));
            }
        }
        if client.get(key) != Some(expected.clone().into_bytes()) {
            failures.push(format!(
                "{key}: reads {:?}",
                client.get(key).map(|v| show(&v))
            ));
        }
        for replica in replicas_of(&proxy, key) {
            if direct[replica].get(key) != Some(expected.clone().into_bytes()) {
                failures.push(format!("{key}: replica {replica} lacks {expected}"));
            }
        }
    }
    println!(
        "{test}: {} moved keys, {refused} cas with the number just read refused",
        moved.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {} moved keys: {:?}",
        failures.len(),
        moved.len(),
        &failures[..failures.len().min(8)]
    );
}

#[test]
fn replicated_cas_of_a_moved_key_stores_with_the_unique_its_gets_returned() {
    replicated_cas_of_moved_keys(false);
}

#[test]
fn replicated_meta_cas_of_a_moved_key_stores_with_the_cas_its_mg_returned() {
    replicated_cas_of_moved_keys(true);
}

/// `replicas = 2`, two sidecars, servers 0-3 swapped for 0, 1, 4, 5, and a
/// key whose replicas all changed: its value is only on the previous ring's
/// replicas. Sidecar
/// A reads it through from a former replica X and copies it to the first
/// current replica Z; a relay keeps A's lease to Z back. Sidecar B deletes
/// the key; a relay keeps B's delete at X back. A's lease then lands, A
/// finds the value still at X and copies it to Z. Only then does B's delete
/// reach X. B's answer must leave no replica serving the value: B
/// deletes the former replicas first and the current ones after, so the
/// copy on Z goes too. With both at once, as before, Z kept the deleted
/// value for good.
#[test]
fn a_replicated_delete_reaches_the_former_replicas_before_the_current_ones() {
    replicated_delete_racing_a_copy("classic", "delete", false);
    replicated_delete_racing_a_copy("meta", "md", false);
}

/// The same race after B has undone the change (A has not): A's copy goes
/// from one of B's current replicas (X) to one of B's former ones (Z), the
/// opposite way to B's own copies. B's delete reaches the former replicas,
/// then the current ones, then the former ones again, so Z loses A's copy.
/// Before, Z kept the deleted value.
#[test]
fn a_replicated_delete_after_an_undo_reaches_the_former_replicas_last_too() {
    replicated_delete_racing_a_copy("classic", "delete", true);
    replicated_delete_racing_a_copy("meta", "md", true);
}

/// The same for a store after the undo: A's copy of the old value to Z
/// must not outlive B's `set`, so B deletes the former replicas only once
/// the current ones stored. Before, both went at once and Z kept `v1`.
#[test]
fn a_replicated_store_after_an_undo_reaches_the_former_replicas_last() {
    replicated_delete_racing_a_copy("classic", "set", true);
    replicated_delete_racing_a_copy("meta", "ms", true);
}

/// The tests above, with B writing by `verb` (`delete` or `md`; `set` or
/// `ms` storing `v2`), and with `undo` B back on the first list before it
/// writes.
fn replicated_delete_racing_a_copy(dialect: &str, verb: &str, undo: bool) {
    use crate::common::relay::{Fault, Relay};
    use crate::common::{replace_by_rename, TempDir};
    use memring::protocol::ReplyKind;
    let dir = TempDir::new(
        "replication",
        &format!("delete-order-{dialect}-{verb}-{undo}"),
    );
    let servers: Vec<Memcached> = (0..6).map(|_| Memcached::start()).collect();
    let (old_list, new_list) = ([0, 1, 2, 3], [0, 1, 4, 5]);
    let config = |list: &[usize], via: &[(usize, String)]| {
        let mut text = String::from("listen = \"127.0.0.1:0\"\nreplicas = 2\n");
        for &i in list {
            let server = &servers[i];
            let addr = via
                .iter()
                .find(|(at, _)| *at == i)
                .map_or_else(|| server.addr(), |(_, addr)| addr.clone());
            text.push_str(&format!(
                "[[servers]]\naddr = \"{addr}\"\nname = \"cache-{}\"\n",
                server.port
            ));
        }
        text
    };
    let ring = |list: &[usize]| {
        let parsed = memring::config::Config::parse(&config(list, &[]), "ring.toml").unwrap();
        memring::ring::Ring::build(parsed.members())
    };
    let (old_ring, new_ring) = (ring(&old_list), ring(&new_list));
    let replicas_in = |ring: &memring::ring::Ring, key: &str| -> Vec<usize> {
        let mut members = SmallVec::new();
        ring.replicas(key.as_bytes(), 2, &mut members);
        members
            .iter()
            .map(|&m| {
                let name = &ring.members()[m].identity;
                servers
                    .iter()
                    .position(|s| &format!("cache-{}", s.port) == name)
                    .unwrap()
            })
            .collect()
    };
    let (key, before, now) = (0..5000)
        .map(|i| format!("replaced-{dialect}:{i}"))
        .map(|key| {
            let (before, now) = (replicas_in(&old_ring, &key), replicas_in(&new_ring, &key));
            (key, before, now)
        })
        .find(|(_, before, now)| before.iter().all(|b| !now.contains(b)))
        .expect("a key whose replicas all change");
    let (x, z) = (before[0], now[0]);
    let relay_z = Relay::start(&servers[z].addr(), Fault::holding_from(b"ms "));
    let stores = verb == "set" || verb == "ms";
    let request = match verb {
        "set" => format!("set {key} 1 0 2\r\nv2\r\n"),
        "ms" => format!("ms {key} 2 F1\r\nv2\r\n"),
        _ => format!("{verb} {key}\r\n"),
    };
    // B's request line (flags 1: not the `v1` stored first).
    let line_end = request.find('\r').expect("a line");
    let held: &'static [u8] = request.as_bytes()[..line_end].to_vec().leak();
    let relay_x = Relay::start(&servers[x].addr(), Fault::holding_from(held));
    let via_a = [(z, relay_z.addr())];
    let via_b = [(x, relay_x.addr())];
    let (path_a, path_b) = (dir.path("a.toml"), dir.path("b.toml"));
    std::fs::write(&path_a, config(&old_list, &via_a)).unwrap();
    std::fs::write(&path_b, config(&old_list, &via_b)).unwrap();
    let (a, b) = (Proxy::start_file(&path_a), Proxy::start_file(&path_b));
    assert_eq!(b.client().set(&key, b"v1"), b"STORED\r\n");
    replace_by_rename(&path_a, &config(&new_list, &via_a));
    replace_by_rename(&path_b, &config(&new_list, &via_b));
    for proxy in [&a, &b] {
        wait_for("ring version 2", || proxy.ring_version() >= 2);
    }
    if undo {
        replace_by_rename(&path_b, &config(&old_list, &via_b));
        wait_for("B back on the first list", || b.ring_version() >= 3);
    }

    assert_eq!(a.client().get(&key), Some(b"v1".to_vec()), "read through A");
    wait_for("A's lease to Z kept back", || relay_z.holding());
    let mut through_b = b.client();
    through_b.send(request.as_bytes());
    // X is B's former replica (deleted first), or after the undo its current
    // one (deleted after the former ones).
    wait_for("B's delete at X kept back", || relay_x.holding());
    relay_z.release();
    wait_for("A's copy checked", || {
        a.client().stat("handoff_copies_checked") == 1
    });
    relay_x.release();
    // `DELETED` when the copy reached a current replica first; the key is
    // gone either way.
    let answered = through_b.reply(ReplyKind::Line);
    let answers: [&[u8]; 5] = [
        b"DELETED\r\n",
        b"NOT_FOUND\r\n",
        b"HD\r\n",
        b"NF\r\n",
        b"STORED\r\n",
    ];
    assert!(
        answers.contains(&&answered[..]),
        "{dialect}: {}",
        show(&answered)
    );
    for replica in now {
        assert_ne!(
            servers[replica].client().get(&key),
            Some(b"v1".to_vec()),
            "{dialect} {verb}: replica {replica} after B's answer"
        );
    }
    let now_read = stores.then(|| b"v2".to_vec());
    for proxy in [&a, &b] {
        assert_eq!(
            proxy.client().get(&key),
            now_read,
            "{dialect} {verb}: read after B's answer"
        );
    }
    if undo && verb == "delete" {
        // A `noreply` delete takes the same three steps before the next
        // request's answer.
        assert_eq!(through_b.set(&key, b"v2"), b"STORED\r\n");
        through_b.send(format!("delete {key} noreply\r\n").as_bytes());
        assert_eq!(through_b.get(&key), None, "after a noreply delete");
    }
}

/// Two servers with `replicas = 2`, reads falling through on a miss.
fn two_replicas() -> (Vec<Memcached>, Proxy) {
    let servers: Vec<Memcached> = (0..2).map(|_| Memcached::start()).collect();
    let settings = "replicas = 2\nread_miss_fallthrough = true\nrequest_timeout_ms = 5000\n";
    let proxy = Proxy::start(&servers.iter().collect::<Vec<_>>(), settings);
    (servers, proxy)
}

/// Another sidecar's hand-off lease on a replica (one may outlive its
/// window by its 5 seconds, or come from a sidecar that reloaded later) is
/// a missing key to a replicated `add`: it is removed and the add stores,
/// on every replica, in both dialects. Before, the add answered
/// `NOT_STORED` for as long as the lease lived.
#[test]
fn an_add_meeting_another_sidecars_lease_on_a_replica_stores_on_every_replica() {
    use memring::protocol::lease::{LEASE_FLAGS, LEASE_MARKER};
    use memring::protocol::ReplyKind;
    let (servers, proxy) = two_replicas();
    let mut client = proxy.client();
    let mut direct: Vec<_> = servers.iter().map(Memcached::client).collect();
    for i in 0..60 {
        let key = format!("leased-add:{i}");
        let replicas = replicas_of(&proxy, &key);
        // On the first replica, the second, or both.
        let leased: &[usize] = match i % 3 {
            0 => &replicas[..1],
            1 => &replicas[1..2],
            _ => &replicas[..2],
        };
        for &server in leased {
            let mut place =
                format!("set {key} {LEASE_FLAGS} 30 {}\r\n", LEASE_MARKER.len()).into_bytes();
            place.extend_from_slice(LEASE_MARKER);
            place.extend_from_slice(b"\r\n");
            assert_eq!(direct[server].call(&place, ReplyKind::Line), b"STORED\r\n");
        }
        let reply = if i % 2 == 0 {
            client.call(
                format!("add {key} 0 0 3\r\nnew\r\n").as_bytes(),
                ReplyKind::Line,
            )
        } else {
            client.send(format!("ms {key} 3 ME\r\nnew\r\n").as_bytes());
            client.meta_reply()
        };
        let stored = if i % 2 == 0 {
            "STORED\\r\\n"
        } else {
            "HD\\r\\n"
        };
        assert_eq!(show(&reply), stored, "{key}, leased on {leased:?}");
        for &server in &replicas[..2] {
            assert_eq!(
                direct[server].get(&key).as_deref(),
                Some(&b"new"[..]),
                "{key}: replica {server}"
            );
        }
    }
}

#[test]
fn an_add_refused_by_one_replica_leaves_its_value_on_none() {
    use memring::protocol::ReplyKind;
    let (servers, proxy) = two_replicas();
    let mut client = proxy.client();
    let mut direct: Vec<_> = servers.iter().map(Memcached::client).collect();
    for i in 0..120 {
        let key = format!("add:{i}");
        // The value that makes the add fail is on one replica only: the
        // first replica for some keys, the second for the others.
        let holder = replicas_of(&proxy, &key)[i % 2];
        assert_eq!(direct[holder].set(&key, b"old"), b"STORED\r\n");
        let reply = match i % 4 {
            0 | 1 => client.call(
                format!("add {key} 0 0 3\r\nnew\r\n").as_bytes(),
                ReplyKind::Line,
            ),
            2 => {
                client.send(format!("ms {key} 3 ME\r\nnew\r\n").as_bytes());
                client.meta_reply()
            }
            _ => {
                client.send(format!("ms {key} 3 ME q O{i}\r\nnew\r\nmn\r\n").as_bytes());
                let refused = client.meta_reply();
                assert_eq!(show(&client.meta_reply()), "MN\\r\\n");
                refused
            }
        };
        let expected = match i % 4 {
            0 | 1 => "NOT_STORED\\r\\n".to_string(),
            2 => "NS\\r\\n".to_string(),
            _ => format!("NS O{i}\\r\\n"),
        };
        assert_eq!(show(&reply), expected, "{key}");
        for (s, server) in direct.iter_mut().enumerate() {
            assert_ne!(
                server.get(&key).as_deref(),
                Some(&b"new"[..]),
                "{key}: the refused add's value stayed on server {s}"
            );
        }
        assert_eq!(client.get(&key).as_deref(), Some(&b"old"[..]), "{key}");
    }
    // noreply: the same, answered with nothing.
    let key = "add:quiet";
    let holder = replicas_of(&proxy, key)[1];
    assert_eq!(direct[holder].set(key, b"old"), b"STORED\r\n");
    client.send(b"add add:quiet 0 0 3 noreply\r\nnew\r\n");
    assert_eq!(client.get(key).as_deref(), Some(&b"old"[..]));
    assert!(direct
        .iter_mut()
        .all(|d| d.get(key).as_deref() != Some(&b"new"[..])));
    // A key on no replica: stored on both, and a meta add returns its cas
    // only when asked.
    assert_eq!(
        client.call(b"add add:fresh 0 0 1\r\nf\r\n", ReplyKind::Line),
        b"STORED\r\n"
    );
    assert!(direct
        .iter_mut()
        .all(|d| d.get("add:fresh").as_deref() == Some(&b"f"[..])));
    client.send(b"ms add:fresh2 1 ME O3 k\r\nf\r\n");
    assert_eq!(show(&client.meta_reply()), "HD O3 kadd:fresh2\\r\\n");
    client.send(b"ms add:fresh3 1 ME c\r\nf\r\n");
    assert!(show(&client.meta_reply()).starts_with("HD c"));
}

#[test]
fn concurrent_adds_of_one_key_store_exactly_one_value_on_every_replica() {
    use memring::protocol::ReplyKind;
    let (mut servers, proxy) = two_replicas();
    // Keys whose first replica is server 0; server 1, their second, is
    // stopped while both clients' adds reach it, so that it takes them in
    // an order of its own.
    let keys: Vec<String> = (0..2000)
        .map(|i| format!("race:{i}"))
        .filter(|key| replicas_of(&proxy, key)[0] == 0)
        .take(200)
        .collect();
    let batch = |value: &str| -> Vec<u8> {
        keys.iter()
            .flat_map(|key| format!("add {key} 0 0 2\r\n{value}\r\n").into_bytes())
            .collect()
    };
    let (mut one, mut two) = (proxy.client(), proxy.client());
    let mut first = servers[0].client();
    let adds_seen = |first: &mut crate::common::Client, count: u64| {
        // Bounded, and not needed for the outcome: it only gives the adds
        // time to queue on the stopped server (all of them, when every
        // replica is sent an add at once).
        let start = Instant::now();
        while first.stat("cmd_set") < count && start.elapsed() < Duration::from_millis(500) {
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    servers[1].pause();
    one.send(&batch("v1"));
    adds_seen(&mut first, keys.len() as u64);
    two.send(&batch("v2"));
    adds_seen(&mut first, 2 * keys.len() as u64);
    servers[1].resume();
    let replies = |client: &mut crate::common::Client| -> Vec<bool> {
        keys.iter()
            .map(|_| client.reply(ReplyKind::Line) == b"STORED\r\n")
            .collect()
    };
    let (a, b) = (replies(&mut one), replies(&mut two));
    let mut client = proxy.client();
    let mut direct: Vec<_> = servers.iter().map(Memcached::client).collect();
    for (i, key) in keys.iter().enumerate() {
        assert!(
            a[i] ^ b[i],
            "{key}: exactly one add stored ({}, {})",
            a[i],
            b[i]
        );
        let winner: &[u8] = if a[i] { b"v1" } else { b"v2" };
        assert_eq!(client.get(key).as_deref(), Some(winner), "{key}");
        for (s, server) in direct.iter_mut().enumerate() {
            assert_eq!(server.get(key).as_deref(), Some(winner), "{key} on {s}");
        }
    }
}

/// `replicas = 2`, 4 -> 5 servers: an `mg` of a key its current replicas
/// lack reads it through from the previous ring's replica, as a get does,
/// answered as the client asked, and copies it to the key's first replica
/// now (through a lease, as a get's read-through copy).
#[test]
fn an_mg_in_a_window_reads_through_and_copies_as_a_get_does() {
    let keys: Vec<String> = (0..400).map(|i| format!("mgthrough:{i}")).collect();
    let (_dir, servers, _path, proxy) = window_of_five("mgthrough", &keys);
    let mut direct: Vec<_> = servers.iter().map(Memcached::client).collect();
    // Keys held by a server that is not a replica now: their current
    // replicas lose them, so only the previous ring's replica has them.
    let mut moved = Vec::new();
    for key in &keys {
        let now = replicas_of(&proxy, key);
        let elsewhere = (0..4).any(|s| !now.contains(&s) && direct[s].get(key).is_some());
        if elsewhere {
            for &s in &now {
                direct[s].call(
                    format!("delete {key}\r\n").as_bytes(),
                    memring::protocol::ReplyKind::Line,
                );
            }
            moved.push(key.clone());
        }
    }
    assert!(moved.len() >= 40, "{} moved", moved.len());
    let mut client = proxy.client();
    for (i, key) in moved.iter().enumerate() {
        let value = format!("{key}=v1");
        client.send(format!("mg {key} v k O{i}\r\n").as_bytes());
        let expected = format!("VA {} k{key} O{i}\r\n{value}\r\n", value.len());
        let reply = client.meta_reply();
        assert_eq!(show(&reply), show(expected.as_bytes()), "{key}");
    }
    wait_for("the copies on the first replicas", || {
        moved.iter().all(|key| {
            let first = replicas_of(&proxy, key)[0];
            direct[first].get(key) == Some(format!("{key}=v1").into_bytes())
        })
    });
}
