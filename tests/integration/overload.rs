//! Overload: a server that stops answering gets at most
//! `max_server_inflight` requests from a worker, the rest answered
//! `SERVER_ERROR server busy` at once; and one client pipelining without
//! end to a slow server does not hold up another client's request to it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use memring::protocol::ReplyKind;

use crate::common::relay::{Fault, Relay};
use crate::common::{show, wait_for, Memcached, Proxy, DEADLINE};
use crate::failure::keys_by_owner;

/// The body of `GET /metrics` on the admin listener.
fn metrics_text(admin: std::net::SocketAddr) -> String {
    let mut stream = TcpStream::connect(admin).expect("admin listener");
    stream.set_read_timeout(Some(DEADLINE)).unwrap();
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    response
}

/// The value of the `/metrics` sample that starts with `series`.
fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
}

/// How long a `get` of `keys` takes to be answered, and its reply.
fn timed_get(client: &mut crate::common::Client, keys: &str) -> (Duration, Vec<u8>) {
    let start = Instant::now();
    client.send(format!("get {keys}\r\n").as_bytes());
    let reply = client.reply(ReplyKind::Values);
    (start.elapsed(), reply)
}

#[test]
fn a_hung_server_gets_max_server_inflight_requests_and_the_rest_are_busy_at_once() {
    const AT_ONCE: Duration = Duration::from_secs(2);
    let servers = [Memcached::start(), Memcached::start()];
    let mut servers = servers;
    let proxy = Proxy::start(
        &[&servers[0], &servers[1]],
        // A long timeout: what is held must stay held through the test.
        "max_server_inflight = 4\nrequest_timeout_ms = 30000\nadmin_listen = \"127.0.0.1:0\"\n",
    );
    let admin = proxy.running().admin_addr.expect("admin listener");
    let owned = keys_by_owner(&proxy, 40);
    let (hung, healthy) = (&owned[1], &owned[0]);
    let mut client = proxy.client();
    for key in hung.iter().chain(healthy) {
        assert_eq!(client.set(key, b"v"), b"STORED\r\n");
    }
    let topology = proxy.running().topology.load_full();
    let backend = topology.backends[1].clone();
    let sent = backend.metrics().requests.get();

    servers[1].pause();
    // Four gets fill the hung server's share of this (only) worker.
    let mut held = proxy.client();
    for key in &hung[..4] {
        held.send(format!("get {key}\r\n").as_bytes());
    }
    wait_for("four requests in flight to the hung server", || {
        backend.metrics().requests.get() == sent + 4
    });

    // The fifth and later are answered at once, from other clients too.
    // "At once" is bounded well below the 30 s a held request waits, and
    // loose enough for a loaded machine (50 ms failed at load 10).
    let mut excess = proxy.client();
    for key in &hung[4..7] {
        let (took, reply) = timed_get(&mut excess, key);
        assert_eq!(show(&reply), "SERVER_ERROR server busy\\r\\n");
        assert!(took < AT_ONCE, "busy after {took:?}");
    }
    // Another server's keys are not affected, alone or beside a busy key
    // in one multi-get (where the busy key reads as a miss, as a DEAD
    // server's keys do).
    let mut other = proxy.client();
    for key in &healthy[..5] {
        let (took, reply) = timed_get(&mut other, key);
        assert_eq!(
            show(&reply),
            show(format!("VALUE {key} 0 1\r\nv\r\nEND\r\n").as_bytes())
        );
        assert!(took < AT_ONCE, "healthy after {took:?}");
    }
    let (took, reply) = timed_get(&mut other, &format!("{} {}", hung[7], healthy[5]));
    assert_eq!(
        show(&reply),
        show(format!("VALUE {} 0 1\r\nv\r\nEND\r\n", healthy[5]).as_bytes())
    );
    assert!(took < AT_ONCE, "multi-get after {took:?}");

    // Counted as rejections of that server, not as its failures.
    assert_eq!(backend.metrics().rejected_busy.get(), 4);
    assert_eq!(backend.metrics().error_count(), 0);
    let text = metrics_text(admin);
    let series = format!(
        "memring_backend_rejected_total{{pool=\"default\",server=\"{}\",reason=\"busy\"}}",
        backend.name()
    );
    assert_eq!(metric(&text, &series), Some(4.0), "{text}");
    let stats = client.stats("");
    let line = format!("server:{}:rejected_busy", backend.name());
    assert!(
        stats
            .iter()
            .any(|(name, value)| *name == line && value == "4"),
        "{stats:?}"
    );
    // The three gets turned away were told of an error, not of a miss:
    // the multi-get's busy key, which its client saw as missing, is the
    // one miss; the six values read are the hits.
    let counted = |wanted: &str| {
        stats
            .iter()
            .find(|(name, _)| *name == wanted)
            .map(|(_, value)| value.clone())
    };
    assert_eq!(counted("get_misses").as_deref(), Some("1"), "{stats:?}");
    assert_eq!(counted("get_hits").as_deref(), Some("6"), "{stats:?}");

    // Once the server answers, the held requests get their values and
    // there is room again.
    servers[1].resume();
    for key in &hung[..4] {
        assert_eq!(
            show(&held.reply(ReplyKind::Values)),
            show(format!("VALUE {key} 0 1\r\nv\r\nEND\r\n").as_bytes())
        );
    }
    assert_eq!(excess.get(&hung[4]), Some(b"v".to_vec()));
}

#[test]
fn a_busy_replica_is_a_failed_replica_for_the_quorum() {
    let mut servers = [Memcached::start(), Memcached::start()];
    let proxy = Proxy::start(
        &[&servers[0], &servers[1]],
        "replicas = 2\nmax_server_inflight = 1\nrequest_timeout_ms = 30000\n",
    );
    let owned = keys_by_owner(&proxy, 30);
    let topology = proxy.running().topology.load_full();
    let backend = topology.backends[1].clone();
    let mut client = proxy.client();
    assert_eq!(client.set(&owned[0][0], b"v"), b"STORED\r\n");
    servers[1].pause();
    let sent = backend.metrics().requests.get();
    // One request holds the hung replica's only slot.
    let mut held = proxy.client();
    held.send(format!("get {}\r\n", owned[1][0]).as_bytes());
    wait_for("a request in flight to the hung server", || {
        backend.metrics().requests.get() == sent + 1
    });
    // Both servers hold a copy of every key and both must store it: the
    // busy one fails the quorum at once, not after the request timeout.
    let start = Instant::now();
    let reply = client.call(
        format!("set {} 0 0 1\r\nw\r\n", owned[0][0]).as_bytes(),
        ReplyKind::Line,
    );
    let took = start.elapsed();
    assert!(
        reply.starts_with(b"SERVER_ERROR no quorum"),
        "{}",
        show(&reply)
    );
    assert!(took < Duration::from_millis(500), "{took:?}");
    assert_eq!(backend.metrics().rejected_busy.get(), 1);
    servers[1].resume();
    // The held get is answered (a miss: that key was never set).
    assert_eq!(show(&held.reply(ReplyKind::Values)), "END\\r\\n");
}

/// A client that pipelines gets without end from its own threads and
/// reads every reply, until dropped.
struct Flood {
    stream: TcpStream,
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicUsize>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Flood {
    fn start(addr: &str, gets: usize) -> Flood {
        let stream = TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let answered = Arc::new(AtomicUsize::new(0));
        let mut writer = stream.try_clone().unwrap();
        let mut reader = stream.try_clone().unwrap();
        let sender = std::thread::spawn(move || {
            let mut batch = Vec::new();
            for i in 0..gets {
                batch.extend_from_slice(format!("get flood:{i}\r\n").as_bytes());
                if batch.len() > 16 * 1024 {
                    // Fails once the test shuts the socket down.
                    if writer.write_all(&std::mem::take(&mut batch)).is_err() {
                        return;
                    }
                }
            }
            let _ = writer.write_all(&batch);
        });
        let (stop_reading, counted) = (stop.clone(), answered.clone());
        let receiver = std::thread::spawn(move || {
            let mut chunk = [0u8; 16 * 1024];
            let mut tail = Vec::new();
            while !stop_reading.load(Ordering::Relaxed) {
                match reader.read(&mut chunk) {
                    Ok(0) => return,
                    Ok(n) => {
                        // Every get is a miss: count the `END`s.
                        tail.extend_from_slice(&chunk[..n]);
                        let ends = tail.windows(5).filter(|w| w == b"END\r\n").count();
                        counted.fetch_add(ends, Ordering::Relaxed);
                        let keep = tail.len().min(4);
                        tail.drain(..tail.len() - keep);
                    }
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) => {}
                    Err(_) => return,
                }
            }
        });
        Flood {
            stream,
            stop,
            answered,
            threads: vec![sender, receiver],
        }
    }

    fn answered(&self) -> usize {
        self.answered.load(Ordering::Relaxed)
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// How long the slowest of a few gets of another client takes while one
/// client pipelines 100 000 gets to a server behind a relay that holds
/// every chunk for `delay` each way.
fn slowest_get_beside_a_flood(settings: &str, delay: Duration) -> (Duration, usize) {
    let server = Memcached::start();
    let relay = Relay::start(&server.addr(), Fault::delaying(delay));
    let proxy = Proxy::start_text(&format!(
        "listen = \"127.0.0.1:0\"\nrequest_timeout_ms = 30000\n{settings}\n[[servers]]\naddr = \"{}\"\n",
        relay.addr()
    ));
    let mut client = proxy.client();
    assert_eq!(client.set("other", b"v"), b"STORED\r\n");
    let flood = Flood::start(&proxy.addr.to_string(), 100_000);
    // In full flow: the flood's gets are being answered.
    wait_for("the flood's first replies", || flood.answered() >= 100);
    let mut slowest = Duration::ZERO;
    for _ in 0..5 {
        let (took, reply) = timed_get(&mut client, "other");
        assert_eq!(show(&reply), "VALUE other 0 1\\r\\nv\\r\\nEND\\r\\n");
        eprintln!("took {took:?} answered {}", flood.answered());
        slowest = slowest.max(took);
    }
    let answered = flood.answered();
    drop(flood);
    (slowest, answered)
}

#[test]
fn a_client_pipelining_100000_gets_delays_another_by_a_few_round_trips_at_most() {
    // One round trip to the server is two delays (the request's chunk and
    // the reply's). With the default settings the flood has at most
    // `max_pending_per_client` gets ahead of the other client's, a chunk
    // each way: the other client's get waits for at most the chunk in
    // the relay before its own, each way: four delays at most, six
    // asserted. Without the bound (`max_pending_per_client = 65536`,
    // `max_server_inflight = 0`) it took 16 to 32 delays.
    // Long enough that a loaded machine's scheduling is small beside it.
    let delay = Duration::from_millis(100);
    let (slowest, answered) = slowest_get_beside_a_flood("", delay);
    assert!(
        slowest <= delay * 6,
        "another client's get took {slowest:?} beside the flood ({answered} flood gets answered)"
    );
    assert!(
        answered < 100_000,
        "the flood was still running: {answered}"
    );
}

#[test]
fn without_the_per_client_bound_a_flood_holds_up_another_client() {
    // The test above measures something: with neither bound the flood has
    // thousands of gets ahead of the other client's, many chunks each way.
    let delay = Duration::from_millis(100);
    let (slowest, answered) = slowest_get_beside_a_flood(
        "max_pending_per_client = 65536\nmax_server_inflight = 0",
        delay,
    );
    assert!(
        slowest > delay * 6,
        "another client's get took only {slowest:?} ({answered} flood gets answered)"
    );
}

#[test]
fn a_reload_changes_max_server_inflight() {
    let mut server = Memcached::start();
    let dir = crate::common::TempDir::new("overload", "reload");
    let path = dir.path("memring.toml");
    let addr = server.addr();
    let config = |limit: usize| {
        format!(
            "listen = \"127.0.0.1:0\"\nrequest_timeout_ms = 30000\nmax_server_inflight = {limit}\n[[servers]]\naddr = \"{addr}\"\n"
        )
    };
    std::fs::write(&path, config(1)).unwrap();
    let proxy = Proxy::start_file(&path);
    let mut client = proxy.client();
    assert_eq!(client.set("k", b"v"), b"STORED\r\n");
    let backend = || proxy.running().topology.load().backends[0].clone();
    server.pause();
    let mut held = proxy.client();
    held.send(b"get k\r\n");
    let first = backend();
    wait_for("a request in flight", || {
        first.metrics().requests.get() == 2
    });
    assert_eq!(show(&client.get_raw("k")), "SERVER_ERROR server busy\\r\\n");

    crate::common::replace_by_rename(&path, &config(2));
    wait_for("the new limit in force", || {
        backend().settings().max_inflight == 2
    });
    // The new limit holds on the new connection: two gets wait for the
    // server, the third is busy. (A server's figures are its name's: the
    // old backend's count on.)
    let second = backend();
    let (sent, refused) = (
        second.metrics().requests.get(),
        second.metrics().rejected_busy.get(),
    );
    let mut waiting = [proxy.client(), proxy.client()];
    for client in &mut waiting {
        client.send(b"get k\r\n");
    }
    wait_for("two gets sent under the new limit", || {
        second.metrics().requests.get() == sent + 2
    });
    assert_eq!(second.metrics().rejected_busy.get(), refused);
    assert_eq!(show(&client.get_raw("k")), "SERVER_ERROR server busy\\r\\n");
    assert_eq!(second.metrics().rejected_busy.get(), refused + 1);
    server.resume();
    for mut client in waiting.into_iter().chain([held]) {
        assert_eq!(
            show(&client.reply(ReplyKind::Values)),
            "VALUE k 0 1\\r\\nv\\r\\nEND\\r\\n"
        );
    }
}
