//! Dead and hung servers with and without ejection, client limits, idle and
//! non-reading clients, and shutdown under load.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{show, wait_for, Memcached, Proxy};
use memring::protocol::ReplyKind;

const FAST_FAILURE: &str =
    "connect_timeout_ms = 200\nrequest_timeout_ms = 300\nfailure_limit = 2\n";

fn pool(n: usize) -> Vec<Memcached> {
    (0..n).map(|_| Memcached::start()).collect()
}

fn refs(servers: &[Memcached]) -> Vec<&Memcached> {
    servers.iter().collect()
}

#[test]
fn ejection_spreads_a_dead_servers_keys_over_the_others_and_restores_it() {
    let mut servers = pool(4);
    let proxy = Proxy::start(
        &refs(&servers),
        &format!("{FAST_FAILURE}auto_eject = true\n"),
    );
    let keys: Vec<String> = (0..400).map(|i| format!("eject:{i}")).collect();
    let mut client = proxy.client();
    for key in &keys {
        assert_eq!(client.set(key, b"v"), b"STORED\r\n");
    }
    let victims: Vec<&String> = keys.iter().filter(|k| proxy.owner_now(k) == 0).collect();
    assert!(victims.len() > 40);

    servers[0].kill();
    wait_for("the dead server to be ejected", || {
        proxy.running().topology.load().ejected.len() == 1
    });
    // Its keys are now served elsewhere: misses, then stored on the others,
    // spread over all three thanks to the virtual nodes.
    let mut landed = [0usize; 4];
    for key in &victims {
        assert_eq!(client.get(key), None, "{key}");
        assert_eq!(client.set(key, b"moved"), b"STORED\r\n");
        landed[proxy.owner_now(key)] += 1;
    }
    assert_eq!(landed[0], 0);
    assert!(
        landed[1..].iter().all(|&n| n > 0),
        "spread over all others: {landed:?}"
    );
    for key in keys.iter().filter(|k| !victims.contains(k)) {
        assert_eq!(
            client.get(key),
            Some(b"v".to_vec()),
            "{key} must be untouched"
        );
    }

    servers[0].restart();
    wait_for("the recovered server to be put back", || {
        proxy.running().topology.load().ejected.is_empty()
    });
    let key = victims[0];
    assert_eq!(proxy.owner_now(key), 0);
    assert_eq!(client.set(key, b"home"), b"STORED\r\n");
    assert_eq!(servers[0].client().get(key), Some(b"home".to_vec()));
}

#[test]
fn without_ejection_a_hung_server_fails_fast_once_dead_and_recovers() {
    let mut servers = pool(3);
    let proxy = Proxy::start(&refs(&servers), FAST_FAILURE);
    let keys: Vec<String> = (0..60).map(|i| format!("hung:{i}")).collect();
    let mut client = proxy.client();
    for key in &keys {
        assert_eq!(client.set(key, b"v"), b"STORED\r\n");
    }
    let hung: Vec<&String> = keys.iter().filter(|k| proxy.owner_now(k) == 1).collect();
    let healthy: Vec<&String> = keys.iter().filter(|k| proxy.owner_now(k) != 1).collect();

    servers[1].pause();
    let reply = client.get_raw(hung[0]);
    assert!(reply.starts_with(b"SERVER_ERROR"), "{}", show(&reply));
    let backend = proxy.running().topology.load().backends[1].clone();
    wait_for("the hung server to be declared DEAD", || {
        backend.state() == memring::backend::health::HealthState::Dead
    });
    // DEAD: its keys fail at once instead of after the request timeout.
    let timeouts = [memring::error::BackendErrorKind::Timeout.index()];
    let timed_out = backend.metrics().errors_of(&timeouts);
    for key in &hung {
        let reply = client.get_raw(key);
        assert!(
            reply.ends_with(b"server is DEAD, failing fast while it is probed\r\n"),
            "{}",
            show(&reply)
        );
    }
    assert_eq!(backend.metrics().errors_of(&timeouts), timed_out);
    for key in &healthy {
        assert_eq!(client.get(key), Some(b"v".to_vec()));
    }

    servers[1].resume();
    wait_for("the server to answer again", || {
        client.get_raw(hung[0]).starts_with(b"VALUE")
    });
}

#[test]
fn clients_past_the_connection_limit_wait_while_existing_ones_work() {
    let servers = pool(2);
    let proxy = Proxy::start(&refs(&servers), "max_client_connections = 3");
    let mut admitted: Vec<_> = (0..3).map(|_| proxy.client()).collect();
    for (i, client) in admitted.iter_mut().enumerate() {
        assert_eq!(client.set(&format!("limit:{i}"), b"x"), b"STORED\r\n");
    }
    let mut waiting = TcpStream::connect(proxy.addr).unwrap();
    waiting
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    waiting.write_all(b"get limit:0\r\n").unwrap();
    let mut buffer = [0u8; 64];
    let early = waiting.read(&mut buffer);
    assert!(
        matches!(&early, Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::TimedOut),
        "the fourth client must wait, got {early:?}"
    );
    for client in admitted.iter_mut() {
        assert_eq!(client.get("limit:1"), Some(b"x".to_vec()));
    }
    drop(admitted.pop());
    waiting
        .set_read_timeout(Some(crate::common::DEADLINE))
        .unwrap();
    let mut got = Vec::new();
    while !got.ends_with(b"END\r\n") {
        let n = waiting.read(&mut buffer).unwrap();
        assert!(n > 0);
        got.extend_from_slice(&buffer[..n]);
    }
    assert_eq!(got, b"VALUE limit:0 0 1\r\nx\r\nEND\r\n");
}

#[test]
fn a_client_that_never_reads_cannot_make_memring_buffer_without_bound() {
    let servers = pool(2);
    let proxy = Proxy::start(&refs(&servers), "max_pending_per_client = 8");
    let mut client = proxy.client();
    let value = vec![b'b'; 100 * 1024];
    assert_eq!(client.set("big", &value), b"STORED\r\n");

    let mut hostile = TcpStream::connect(proxy.addr).unwrap();
    hostile.set_nonblocking(true).unwrap();
    let request = b"get big\r\n".repeat(1000);
    // Far more than the kernel's socket buffers on both sides can hold.
    const UNBOUNDED_BYTES: usize = 64 * 1024 * 1024;
    let mut sent = 0usize;
    let mut stalled_since = None;
    let started = Instant::now();
    // Each request asks for 100 KiB of reply that is never read.
    while sent < UNBOUNDED_BYTES && started.elapsed() < crate::common::DEADLINE {
        match hostile.write(&request) {
            Ok(n) => {
                sent += n;
                stalled_since = None;
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                let since = *stalled_since.get_or_insert_with(Instant::now);
                if since.elapsed() > Duration::from_millis(500) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("write: {e}"),
        }
    }
    assert!(
        sent < UNBOUNDED_BYTES,
        "memring kept reading from a client that never reads ({sent} bytes taken)"
    );
    // Everyone else is served meanwhile.
    assert_eq!(client.get("big").map(|v| v.len()), Some(value.len()));
    drop(hostile);
    let stats = proxy.running().stats.clone();
    wait_for("the hostile session to end", || {
        stats.curr_connections() == 1
    });
}

#[test]
fn idle_clients_are_closed_after_the_idle_timeout() {
    let servers = pool(1);
    let proxy = Proxy::start(&refs(&servers), "client_idle_timeout_ms = 200");
    let mut idle = proxy.client();
    let mut busy = proxy.client();
    assert_eq!(idle.set("idle", b"1"), b"STORED\r\n");
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(600) {
        assert_eq!(busy.get("idle"), Some(b"1".to_vec()));
    }
    assert!(idle.closed(), "the idle client is closed");
    assert_eq!(busy.get("idle"), Some(b"1".to_vec()), "the busy one is not");
}

#[test]
fn shutdown_under_load_answers_every_request_it_read() {
    let servers = pool(3);
    let mut proxy = Proxy::start(&refs(&servers), "");
    let stored = Arc::new(Mutex::new(Vec::<(String, String)>::new()));
    let answered = Arc::new(AtomicUsize::new(0));
    let running = Arc::new(AtomicBool::new(true));
    let workers: Vec<_> = (0..8)
        .map(|w| {
            let (stored, answered, running) = (stored.clone(), answered.clone(), running.clone());
            let mut client = proxy.client();
            std::thread::spawn(move || {
                for round in 0..1_000_000 {
                    if !running.load(Ordering::Relaxed) && round % 1000 == 999 {
                        break;
                    }
                    let key = format!("drain:{w}:{round}");
                    let value = format!("{round}");
                    client.send(format!("set {key} 0 0 {}\r\n{value}\r\n", value.len()).as_bytes());
                    // Either a whole reply, or a close before any byte of it.
                    match client.try_reply(ReplyKind::Line) {
                        Some(reply) => {
                            assert_eq!(reply, b"STORED\r\n");
                            stored.lock().unwrap().push((key, value));
                            answered.fetch_add(1, Ordering::Relaxed);
                        }
                        None => return,
                    }
                }
            })
        })
        .collect();
    wait_for("load to run", || answered.load(Ordering::Relaxed) > 2000);
    proxy.shutdown();
    running.store(false, Ordering::Relaxed);
    for worker in workers {
        worker.join().expect("no reply was cut off");
    }
    // Every STORED the clients saw is really stored.
    let stored = stored.lock().unwrap();
    let ring = memring::ring::Ring::build(proxy.config.members());
    let mut direct: Vec<_> = servers.iter().map(|s| s.client()).collect();
    for (key, value) in stored.iter().rev().take(300) {
        let owner = ring.owner(key.as_bytes()).unwrap();
        assert_eq!(
            direct[owner].get(key),
            Some(value.clone().into_bytes()),
            "{key}"
        );
    }
    assert!(
        TcpStream::connect(proxy.addr).is_err(),
        "no longer accepting"
    );
}

#[test]
fn shutdown_waits_for_noreply_writes_still_queued_on_backends() {
    let mut servers = pool(2);
    let proxy = Proxy::start(&refs(&servers), "request_timeout_ms = 10000\n");
    let ring = memring::ring::Ring::build(proxy.config.members());
    let keys_of = |server: usize| -> Vec<String> {
        (0..2000)
            .map(|i| format!("nr:{i}"))
            .filter(|k| ring.owner(k.as_bytes()) == Some(server))
            .take(100)
            .collect()
    };
    let (frozen_keys, live_key) = (keys_of(1), keys_of(0).remove(0));
    servers[1].pause();
    let mut client = proxy.client();
    let mut batch = Vec::new();
    for key in &frozen_keys {
        batch.extend(format!("set {key} 0 0 1 noreply\r\nq\r\n").bytes());
    }
    batch.extend(format!("get {live_key}\r\n").bytes());
    client.send(&batch);
    // The get's reply means every set before it was read and routed; the sets
    // now wait on the frozen server's connection.
    assert_eq!(client.reply(ReplyKind::Values), b"END\r\n");
    drop(client);

    let stats = proxy.running().stats.clone();
    let addr = proxy.addr;
    let returned = Arc::new(AtomicBool::new(false));
    let stopper = {
        let returned = returned.clone();
        let mut proxy = proxy;
        std::thread::spawn(move || {
            proxy.shutdown();
            returned.store(true, Ordering::SeqCst);
            proxy
        })
    };
    // Listener closed and every session gone: only the server connections'
    // drain is left.
    wait_for("shutdown to reach the backend drain", || {
        std::net::TcpStream::connect(addr).is_err() && stats.curr_connections() == 0
    });
    assert!(
        !returned.load(Ordering::SeqCst),
        "shutdown must wait for queued writes"
    );
    servers[1].resume();
    let _proxy = stopper.join().unwrap();
    let mut direct = servers[1].client();
    for key in &frozen_keys {
        assert_eq!(
            direct.get(key),
            Some(b"q".to_vec()),
            "{key} written before exit"
        );
    }
}

/// A client still sending when shutdown comes gets every reply memring owes
/// it, whole, then an orderly end of stream: memring half-closes after the
/// last owed byte and reads what is left, so the kernel never answers unread
/// request bytes with a reset that throws away replies not yet delivered.
#[test]
fn shutdown_delivers_every_owed_reply_to_a_client_with_unread_requests() {
    const VALUE_BYTES: usize = 512 * 1024;
    for run in 0..3 {
        let servers = pool(1);
        let mut proxy = Proxy::start(&refs(&servers), "");
        let mut setup = proxy.client();
        let value = vec![b'v'; VALUE_BYTES];
        assert_eq!(setup.set("big", &value), b"STORED\r\n");
        let stream = TcpStream::connect(proxy.addr).unwrap();
        let mut writer = stream.try_clone().unwrap();
        // 40 large replies owed, and far more request bytes behind them than
        // memring will read before it stops.
        let mut requests = b"get big\r\n".repeat(40);
        requests.extend(b"get nothing:here\r\n".repeat(500_000));
        let sender = std::thread::spawn(move || {
            let _ = writer.write_all(&requests);
            // Keep the socket open, as a client waiting for replies does.
            writer
        });
        let mut reader = stream;
        reader
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut got = Vec::new();
        let mut chunk = vec![0u8; 16 * 1024];
        // Shut down once the first value is on its way.
        while got.len() < VALUE_BYTES {
            let n = reader.read(&mut chunk).expect("reading before shutdown");
            assert!(n > 0, "closed before the first value");
            got.extend_from_slice(&chunk[..n]);
        }
        let stopper = std::thread::spawn(move || {
            proxy.shutdown();
            proxy
        });
        // A slow reader: memring hands its last bytes to the kernel long
        // before this client has taken them.
        let end = loop {
            match reader.read(&mut chunk) {
                Ok(0) => break Ok(()),
                Ok(n) => got.extend_from_slice(&chunk[..n]),
                Err(e) => break Err(e),
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        let _writer = sender.join().unwrap();
        drop(stopper.join().unwrap());
        // Whatever came is a run of whole replies, and the stream ended
        // cleanly rather than with a reset.
        let mut at = 0;
        let mut replies = 0;
        while let Some(len) = memring::protocol::frame_reply(&got[at..], ReplyKind::Values)
            .expect("well-formed replies")
        {
            at += len;
            replies += 1;
        }
        assert_eq!(
            at,
            got.len(),
            "run {run}: a reply was cut off after {replies}"
        );
        assert!(
            end.is_ok(),
            "run {run}: {end:?} after {replies} whole replies"
        );
        assert!(
            replies >= 40,
            "run {run}: only {replies} replies of the 40 owed"
        );
    }
}
