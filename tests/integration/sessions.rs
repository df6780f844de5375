//! Client sessions: per-client ordering across several backend connections,
//! many concurrent clients, routing by the ring, and connection handling.

use crate::common::{
    free_port, parse_single_value, show, wait_for, Client, Daemon, Memcached, Proxy, TempDir,
};
use memring::protocol::ReplyKind;
use memring::ring::Ring;
use std::io::{Read, Write};

#[test]
fn pipelined_set_then_get_returns_the_new_value_with_four_connections_per_server() {
    let pool: Vec<Memcached> = (0..3).map(|_| Memcached::start()).collect();
    let proxy = Proxy::start(
        &pool.iter().collect::<Vec<_>>(),
        "connections_per_server = 4",
    );
    let workers: Vec<_> = (0..6)
        .map(|w| {
            let mut client = proxy.client();
            std::thread::spawn(move || {
                for round in 0..300 {
                    let key = format!("order:{w}:{}", round % 7);
                    let value = format!("v{round}");
                    let mut batch = Vec::new();
                    batch.extend(format!("set {key} 0 0 {}\r\n{value}\r\n", value.len()).bytes());
                    batch.extend(format!("get {key}\r\n").bytes());
                    batch.extend(format!("delete {key}\r\nget {key}\r\n").bytes());
                    client.send(&batch);
                    assert_eq!(client.reply(ReplyKind::Line), b"STORED\r\n");
                    let got = client.reply(ReplyKind::Values);
                    let expected = format!("VALUE {key} 0 {}\r\n{value}\r\nEND\r\n", value.len());
                    assert_eq!(show(&got), show(expected.as_bytes()), "round {round}");
                    assert_eq!(client.reply(ReplyKind::Line), b"DELETED\r\n");
                    assert_eq!(client.reply(ReplyKind::Values), b"END\r\n");
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().expect("ordering held");
    }
}

#[test]
fn keys_live_on_the_server_the_ring_names() {
    let pool: Vec<Memcached> = (0..4).map(|_| Memcached::start()).collect();
    let proxy = Proxy::start(&pool.iter().collect::<Vec<_>>(), "");
    let ring = Ring::build(proxy.config.members());
    let mut client = proxy.client();
    let mut per_server = [0usize; 4];
    for i in 0..400 {
        let key = format!("route:{i}");
        assert_eq!(client.set(&key, b"x"), b"STORED\r\n");
        let owner = ring.owner(key.as_bytes()).unwrap();
        per_server[owner] += 1;
        for (server, memcached) in pool.iter().enumerate() {
            let held = memcached.client().get(&key).is_some();
            assert_eq!(held, server == owner, "{key} on server {server}");
        }
    }
    assert!(
        per_server.iter().all(|&n| n > 50),
        "keys spread over all servers: {per_server:?}"
    );
}

/// How many client connections this process can open alongside the proxy's
/// side of each (two descriptors per connection), capped at `wanted`.
fn connection_budget(wanted: usize) -> usize {
    let soft_limit = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|limits| {
            limits
                .lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| {
                    l.split_whitespace()
                        .nth(3)
                        .and_then(|n| n.parse::<usize>().ok())
                })
        })
        .unwrap_or(1024);
    wanted.min(soft_limit.saturating_sub(256) / 2)
}

#[test]
fn thousands_of_concurrent_clients_each_get_their_own_replies() {
    let pool: Vec<Memcached> = (0..3).map(|_| Memcached::start()).collect();
    let proxy = Proxy::start(&pool.iter().collect::<Vec<_>>(), "");
    let count = connection_budget(2000);
    assert!(count >= 400, "file descriptor limit too low for this test");
    let mut clients: Vec<std::net::TcpStream> = (0..count)
        .map(|_| {
            let stream = std::net::TcpStream::connect(proxy.addr).expect("connect");
            stream
                .set_read_timeout(Some(crate::common::DEADLINE))
                .unwrap();
            stream
        })
        .collect();
    // All connections are open at once; each sends, then all read.
    for (i, stream) in clients.iter_mut().enumerate() {
        let value = format!("value-{i}");
        let request = format!(
            "set conc:{i} 0 0 {}\r\n{value}\r\nget conc:{i}\r\n",
            value.len()
        );
        stream.write_all(request.as_bytes()).unwrap();
    }
    for (i, stream) in clients.iter_mut().enumerate() {
        let value = format!("value-{i}");
        let expected = format!(
            "STORED\r\nVALUE conc:{i} 0 {}\r\n{value}\r\nEND\r\n",
            value.len()
        );
        let mut got = vec![0u8; expected.len()];
        stream.read_exact(&mut got).expect("reply");
        assert_eq!(show(&got), show(expected.as_bytes()));
    }
    let stats = proxy.running().stats.clone();
    assert_eq!(stats.curr_connections() as usize, count);
}

#[test]
fn quit_closes_only_that_client() {
    let pool: Vec<Memcached> = (0..2).map(|_| Memcached::start()).collect();
    let proxy = Proxy::start(&pool.iter().collect::<Vec<_>>(), "");
    let mut quitter = proxy.client();
    let mut other = proxy.client();
    quitter.send(b"set q 0 0 1\r\nq\r\nquit\r\nget q\r\n");
    assert_eq!(quitter.reply(ReplyKind::Line), b"STORED\r\n");
    assert!(
        quitter.closed(),
        "quit closes the connection without more replies"
    );
    assert_eq!(other.get("q"), Some(b"q".to_vec()));
}

#[test]
fn endless_line_is_refused_and_closed_without_hurting_others() {
    let pool: Vec<Memcached> = (0..2).map(|_| Memcached::start()).collect();
    let proxy = Proxy::start(&pool.iter().collect::<Vec<_>>(), "");
    let mut other = proxy.client();
    assert_eq!(other.set("safe", b"1"), b"STORED\r\n");
    let mut hostile = proxy.client();
    hostile.send(&vec![b'x'; 5000]);
    let reply = hostile.read_until_suffix(b"CLIENT_ERROR line too long\r\n");
    assert_eq!(reply, b"");
    assert!(hostile.closed());
    // A get line may be longer than 2048 bytes.
    let mut long_get = b"get".to_vec();
    for i in 0..400 {
        long_get.extend(format!(" k{i}").bytes());
    }
    long_get.extend(b" safe\r\n");
    assert_eq!(
        other.call(&long_get, ReplyKind::Values),
        b"VALUE safe 0 1\r\n1\r\nEND\r\n"
    );
}

#[test]
fn oversized_value_removes_the_stored_value_and_keeps_the_connection_in_step() {
    let pool: Vec<Memcached> = (0..2).map(|_| Memcached::start()).collect();
    let proxy = Proxy::start(&pool.iter().collect::<Vec<_>>(), "max_value_bytes = 1000");
    let mut client = proxy.client();
    assert_eq!(client.set("kept", b"old"), b"STORED\r\n");
    // Header first, then the block slowly: nothing of it is buffered as a value.
    client.send(b"set kept 0 0 5000\r\n");
    assert_eq!(
        client.reply(ReplyKind::Line),
        b"SERVER_ERROR object too large for cache\r\n"
    );
    for _ in 0..5 {
        client.send(&[b'z'; 1000]);
    }
    // As memcached, the value the client meant to replace is gone.
    client.send(b"\r\nget kept\r\n");
    assert_eq!(client.reply(ReplyKind::Values), b"END\r\n");
}

#[test]
fn client_disconnect_mid_request_is_harmless() {
    let pool: Vec<Memcached> = (0..2).map(|_| Memcached::start()).collect();
    let proxy = Proxy::start(&pool.iter().collect::<Vec<_>>(), "");
    for _ in 0..20 {
        let mut stream = std::net::TcpStream::connect(proxy.addr).unwrap();
        stream
            .write_all(b"set half 0 0 100\r\nonly a few bytes")
            .unwrap();
        drop(stream);
    }
    let mut client = proxy.client();
    assert_eq!(client.get("half"), None);
    let stats = proxy.running().stats.clone();
    wait_for("sessions to end", || stats.curr_connections() == 1);
}

#[test]
fn a_pipeline_longer_than_the_pending_bound_is_answered_in_full() {
    let pool: Vec<Memcached> = (0..2).map(|_| Memcached::start()).collect();
    let proxy = Proxy::start(
        &pool.iter().collect::<Vec<_>>(),
        "max_pending_per_client = 4",
    );
    let mut client = proxy.client();
    let mut batch = Vec::new();
    for i in 0..500 {
        batch.extend(format!("set p:{i} 0 0 1\r\n{}\r\n", i % 10).bytes());
    }
    for i in 0..500 {
        batch.extend(format!("get p:{i}\r\n").bytes());
    }
    // Everything is read by memring long before the FIFO has room for it.
    client.send(&batch);
    for _ in 0..500 {
        assert_eq!(client.reply(ReplyKind::Line), b"STORED\r\n");
    }
    for i in 0..500 {
        let expected = format!("VALUE p:{i} 0 1\r\n{}\r\nEND\r\n", i % 10);
        assert_eq!(
            show(&client.reply(ReplyKind::Values)),
            show(expected.as_bytes())
        );
    }
}

/// Sends `requests` from a thread of its own (memring may stop reading while
/// its budget is spent, so the writer must not block the reader) and reads
/// until the reply ends with `MN\r\n`, or the deadline passes. Returns what
/// came before the `MN`, or `None` on a stall.
fn quiet_batch(addr: &str, requests: Vec<u8>, deadline: std::time::Duration) -> Option<Vec<u8>> {
    let stream = std::net::TcpStream::connect(addr).expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let mut writer = stream.try_clone().expect("clone");
    let sender = std::thread::spawn(move || writer.write_all(&requests).is_ok());
    let mut reader = stream;
    let started = std::time::Instant::now();
    let mut got = Vec::new();
    let mut chunk = [0u8; 64 * 1024];
    let result = loop {
        if got.ends_with(b"MN\r\n") {
            got.truncate(got.len() - 4);
            break Some(got);
        }
        let left = deadline.saturating_sub(started.elapsed());
        if left.is_zero() {
            break None;
        }
        reader.set_read_timeout(Some(left)).expect("timeout");
        match reader.read(&mut chunk) {
            Ok(0) => break None,
            Ok(n) => got.extend_from_slice(&chunk[..n]),
            Err(_) => break None,
        }
    };
    drop(reader);
    let _ = sender.join();
    result
}

/// A quiet pipeline of misses over several servers, closed by `mn`, always
/// gets its `MN`: a budget released by replies that write nothing must let
/// the session dispatch again without waiting for more client input.
#[test]
fn quiet_meta_misses_over_four_servers_always_reach_their_mn() {
    let pool: Vec<Memcached> = (0..4).map(|_| Memcached::start()).collect();
    let proxy = Proxy::start(&pool.iter().collect::<Vec<_>>(), "");
    let addr = proxy.addr.to_string();
    for batch in 0..30 {
        let mut requests = Vec::new();
        for i in 0..200 {
            requests.extend(format!("mg quiet:{batch}:{i} v q\r\n").bytes());
        }
        requests.extend(b"mn\r\n");
        let before = quiet_batch(&addr, requests, std::time::Duration::from_secs(10))
            .unwrap_or_else(|| panic!("batch {batch}: no MN within 10 s"));
        assert_eq!(show(&before), "", "batch {batch}: misses are silent");
    }
    let mut requests = Vec::with_capacity(100_000 * 24);
    for i in 0..100_000 {
        requests.extend(format!("mg big:{i} v q\r\n").bytes());
    }
    requests.extend(b"mn\r\n");
    let started = std::time::Instant::now();
    let before = quiet_batch(&addr, requests, std::time::Duration::from_secs(60))
        .expect("100 000 quiet misses: no MN within 60 s");
    // Reported, not asserted: a loaded machine and a debug build are slow,
    // and a stall (what this test is about) never ends at all.
    println!(
        "100 000 quiet misses + mn: MN after {:?}",
        started.elapsed()
    );
    assert_eq!(show(&before), "");
}

/// Reply bytes a client is owed are reserved from the reply budget and go
/// back with the request that reserved them, whatever ends it: values a
/// client never reads (some of them coalesced, `big` turns hot), quiet meta
/// gets, and a get still waiting on a stopped server all leave nothing
/// owed once their clients are gone, and memring serves on in full.
#[test]
fn clients_that_leave_owing_replies_leave_no_reply_bytes_owed() {
    const VALUE_BYTES: usize = 100 * 1024;
    const HOGS: usize = 3;
    let mut server = Memcached::start();
    let proxy = Proxy::start(&[&server], "max_client_buffer_bytes = 1048576");
    let mut admin = proxy.client();
    let value = vec![b'v'; VALUE_BYTES];
    assert_eq!(admin.set("big", &value), b"STORED\r\n");
    assert_eq!(admin.stat("reply_bytes_owed"), 0);

    // 30 MB of replies each, far more than socket buffers take.
    let hogs: Vec<std::net::TcpStream> = (0..HOGS)
        .map(|_| {
            let mut hog = std::net::TcpStream::connect(proxy.addr).expect("connect");
            hog.write_all(&b"get big\r\n".repeat(300))
                .expect("requests fit");
            hog
        })
        .collect();
    let mut owed = 0;
    wait_for("the hogs' replies to be owed", || {
        owed = admin.stat("reply_bytes_owed");
        owed >= (HOGS * VALUE_BYTES) as u64
    });
    // Each hog is held near its 1 MiB bound (one reply may pass it).
    assert!(owed <= (HOGS * 2 * 1024 * 1024) as u64, "owed {owed}");
    drop(hogs);
    wait_for("the hogs' reservations to be given back", || {
        admin.stat("reply_bytes_owed") == 0
    });

    server.pause();
    let mut waiting = proxy.client();
    waiting.send(b"get big\r\nmg big v q\r\nmg absent v q\r\nmn\r\n");
    wait_for("the waiting client's reservations", || {
        admin.stat("reply_bytes_owed") > 0
    });
    drop(waiting);
    // The server stays stopped: its requests end by timing out.
    wait_for("the waiting client's reservations to be given back", || {
        admin.stat("reply_bytes_owed") == 0
    });
    server.resume();
    // Until its health recovers, the resumed server's requests may still
    // fail fast with `SERVER_ERROR`.
    wait_for("memring to serve the value again", || {
        parse_single_value(&admin.get_raw("big")) == Some(Some(value.clone()))
    });
}

/// Many clients busy at once and then idle together (issue 48): they all
/// park their buffers, the worker frees most of them and of what it keeps
/// for later requests and trims its heap, and every client is then served
/// as before, on buffers taken anew.
#[test]
fn clients_that_park_together_are_served_after_their_worker_trimmed() {
    // Enough for parking to free over a MiB on the one worker: more than
    // its shelf and spares keep.
    const CLIENTS: usize = 600;
    let backend = Memcached::start();
    let dir = TempDir::new("sessions", "park-together");
    let listen = format!("127.0.0.1:{}", free_port());
    let config = dir.path("memring.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"{listen}\"\nworkers = 1\nmax_client_connections = {}\n\
             [[servers]]\naddr = \"{}\"\n",
            CLIENTS + 10,
            backend.addr()
        ),
    )
    .unwrap();
    let daemon = Daemon::start(
        &config,
        &dir.path("memring.log"),
        &["--log-level", "info,memring::runtime::trim=debug"],
    );
    daemon.wait_for_log("listening");
    let mut clients: Vec<Client> = (0..CLIENTS).map(|_| Client::connect(&listen)).collect();
    // Every request is sent before any reply is read: all clients are busy
    // at once.
    for (i, client) in clients.iter_mut().enumerate() {
        client.send(format!("set park{i} 0 0 6\r\nfirst{}\r\nget park{i}\r\n", i % 10).as_bytes());
    }
    for (i, client) in clients.iter_mut().enumerate() {
        assert_eq!(client.reply(ReplyKind::Line), b"STORED\r\n", "client {i}");
        let got = client.reply(ReplyKind::Values);
        assert_eq!(
            parse_single_value(&got),
            Some(Some(format!("first{}", i % 10).into_bytes()))
        );
    }
    daemon.wait_for_log("heap trimmed");
    for (i, client) in clients.iter_mut().enumerate() {
        assert_eq!(
            client.get(&format!("park{i}")),
            Some(format!("first{}", i % 10).into_bytes())
        );
        assert_eq!(client.set(&format!("park{i}"), b"second"), b"STORED\r\n");
        assert_eq!(
            client.get(&format!("park{i}")).as_deref(),
            Some(&b"second"[..])
        );
    }
}
