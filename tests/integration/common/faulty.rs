//! A scripted faulty memcached: it listens on a free loopback port, answers
//! the `stats settings` probe a new memring connection sends first like
//! memcached would, then misbehaves on requests in one chosen way.
//!
//! It is not a stand-in for memcached (tests that need a server use the real
//! one); it plays the broken or hostile server that memring must contain.
//! Every thread it starts polls a stop flag with short socket timeouts and is
//! joined when the handle drops.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// What the faulty server does with each request (after the probe).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Misbehaviour {
    /// Answers every request with `HELLO I AM NOT MEMCACHED\r\n`.
    GarbageLine,
    /// Answers with `HELLO I AM NOT MEMCACHED` and never a line end.
    GarbageNoNewline,
    /// Answers honestly, with an extra `END\r\n` before every third reply.
    ExtraEnd,
    /// Answers honestly, with a `VALUE` for a key nobody asked for before
    /// every other reply.
    ExtraValue,
    /// Sends `VALUE <key> 0 5\r\nabc` and then nothing more on that
    /// connection.
    PartialValueStall,
    /// Declares a 4 GiB value (`VALUE <key> 0 4294967296`), sends a few bytes
    /// and stalls.
    Declares4GiB,
    /// Declares a 1 GiB value and streams up to 16 MiB of it, then stalls.
    Value1GiB,
    /// Never reads anything after the probe.
    NeverReads,
    /// Sends the first half of an honest reply, then closes.
    ClosesMidRequest,
}

/// What the faulty server says its item size limit is (memcached's default).
pub(crate) const ITEM_SIZE_MAX: usize = 1024 * 1024;

/// The value the faulty server streams at most for [`Misbehaviour::Value1GiB`].
const STREAMED_BYTES: usize = 16 * 1024 * 1024;

/// How often every thread looks at the stop flag.
const POLL: Duration = Duration::from_millis(50);

/// A running faulty server; stopped and joined on drop.
pub(crate) struct FaultyServer {
    pub port: u16,
    stop: Arc<AtomicBool>,
    requests: Arc<AtomicUsize>,
    probes: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
}

impl FaultyServer {
    pub(crate) fn start(behaviour: Misbehaviour) -> FaultyServer {
        FaultyServer::start_claiming(behaviour, ITEM_SIZE_MAX)
    }

    /// Like `start`, telling memring's probe `item_size_max` is
    /// `item_size_max`.
    pub(crate) fn start_claiming(behaviour: Misbehaviour, item_size_max: usize) -> FaultyServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        listener
            .set_nonblocking(true)
            .expect("nonblocking listener");
        let port = listener.local_addr().expect("local addr").port();
        let stop = Arc::new(AtomicBool::new(false));
        let requests = Arc::new(AtomicUsize::new(0));
        let probes = Arc::new(AtomicUsize::new(0));
        let thread = {
            let stop = stop.clone();
            let counters = Counters {
                requests: requests.clone(),
                probes: probes.clone(),
            };
            std::thread::spawn(move || {
                accept_loop(listener, behaviour, item_size_max, &stop, &counters)
            })
        };
        FaultyServer {
            port,
            stop,
            requests,
            probes,
            thread: Some(thread),
        }
    }

    pub(crate) fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Requests (not probes) it has received so far.
    pub(crate) fn requests(&self) -> usize {
        self.requests.load(Ordering::Relaxed)
    }

    /// `stats settings` probes it has answered so far.
    pub(crate) fn probes(&self) -> usize {
        self.probes.load(Ordering::Relaxed)
    }
}

impl Drop for FaultyServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn accept_loop(
    listener: TcpListener,
    behaviour: Misbehaviour,
    item_size_max: usize,
    stop: &Arc<AtomicBool>,
    counters: &Counters,
) {
    // One store for all connections, as one server has.
    let store: Arc<Mutex<HashMap<Vec<u8>, Vec<u8>>>> = Arc::default();
    let mut connections = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, _)) => {
                let stop = stop.clone();
                let counters = counters.clone();
                let store = store.clone();
                connections.push(std::thread::spawn(move || {
                    let mut connection = Connection {
                        stream,
                        buffer: Vec::new(),
                        behaviour,
                        item_size_max,
                        stop,
                        counters,
                        store,
                        replies: 0,
                    };
                    connection.serve();
                }));
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(_) => std::thread::sleep(POLL),
        }
    }
    for connection in connections {
        let _ = connection.join();
    }
}

#[derive(Clone)]
struct Counters {
    requests: Arc<AtomicUsize>,
    probes: Arc<AtomicUsize>,
}

/// One request as the faulty server understood it.
struct Request {
    command: Vec<u8>,
    keys: Vec<Vec<u8>>,
    /// The data block of a storage command.
    data: Option<Vec<u8>>,
}

struct Connection {
    stream: TcpStream,
    buffer: Vec<u8>,
    behaviour: Misbehaviour,
    item_size_max: usize,
    stop: Arc<AtomicBool>,
    counters: Counters,
    store: Arc<Mutex<HashMap<Vec<u8>, Vec<u8>>>>,
    /// Replies sent on this connection (for "every n-th" behaviours).
    replies: usize,
}

impl Connection {
    fn serve(&mut self) {
        // Each reply goes out as soon as it is written, also the second
        // piece of one written in two (no Nagle wait for an ACK).
        if self.stream.set_nodelay(true).is_err()
            || self.stream.set_read_timeout(Some(POLL)).is_err()
            || self.stream.set_write_timeout(Some(POLL)).is_err()
        {
            return;
        }
        let mut probed = false;
        while let Some(request) = self.next_request() {
            if request.command.starts_with(b"stats") {
                probed = true;
                let reply = format!(
                    "STAT pid 1\r\nSTAT item_size_max {}\r\nEND\r\n",
                    self.item_size_max
                );
                if !self.write(reply.as_bytes()) {
                    return;
                }
                self.counters.probes.fetch_add(1, Ordering::Relaxed);
                if self.behaviour == Misbehaviour::NeverReads {
                    self.idle();
                    return;
                }
                continue;
            }
            if !probed {
                // memring always probes first; anything else is not memring.
                return;
            }
            self.counters.requests.fetch_add(1, Ordering::Relaxed);
            if !self.misbehave(&request) {
                return;
            }
        }
    }

    /// Handles one request; false when the connection is done.
    fn misbehave(&mut self, request: &Request) -> bool {
        let key = request.keys.first().cloned().unwrap_or_default();
        let key = String::from_utf8_lossy(&key).into_owned();
        self.replies += 1;
        match self.behaviour {
            Misbehaviour::GarbageLine => self.write(b"HELLO I AM NOT MEMCACHED\r\n"),
            Misbehaviour::GarbageNoNewline => self.write(b"HELLO I AM NOT MEMCACHED"),
            Misbehaviour::ExtraEnd => {
                let honest = self.honest(request);
                (self.replies % 3 != 0 || self.write(b"END\r\n")) && self.write(&honest)
            }
            Misbehaviour::ExtraValue => {
                let honest = self.honest(request);
                (self.replies % 2 != 0 || self.write(b"VALUE intruder 0 6\r\nsecret\r\n"))
                    && self.write(&honest)
            }
            Misbehaviour::PartialValueStall => {
                self.write(format!("VALUE {key} 0 5\r\nabc").as_bytes());
                self.drain()
            }
            Misbehaviour::Declares4GiB => {
                self.write(format!("VALUE {key} 0 4294967296\r\nabc").as_bytes());
                self.drain()
            }
            Misbehaviour::Value1GiB => {
                if !self.write(format!("VALUE {key} 0 1073741824\r\n").as_bytes()) {
                    return false;
                }
                let chunk = vec![b'x'; 64 * 1024];
                for _ in 0..STREAMED_BYTES / chunk.len() {
                    if !self.write(&chunk) {
                        return false;
                    }
                }
                self.drain()
            }
            Misbehaviour::NeverReads => self.idle(),
            Misbehaviour::ClosesMidRequest => {
                let honest = self.honest(request);
                self.write(&honest[..honest.len() / 2]);
                false
            }
        }
    }

    /// What memcached would answer (for the commands the tests send).
    fn honest(&self, request: &Request) -> Vec<u8> {
        let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        match (&request.command[..], &request.data) {
            (b"get", _) => {
                let mut reply = Vec::new();
                for key in &request.keys {
                    if let Some(value) = store.get(key) {
                        reply.extend_from_slice(b"VALUE ");
                        reply.extend_from_slice(key);
                        reply.extend_from_slice(format!(" 0 {}\r\n", value.len()).as_bytes());
                        reply.extend_from_slice(value);
                        reply.extend_from_slice(b"\r\n");
                    }
                }
                reply.extend_from_slice(b"END\r\n");
                reply
            }
            (b"set", Some(data)) => {
                store.insert(request.keys[0].clone(), data.clone());
                b"STORED\r\n".to_vec()
            }
            _ => b"ERROR\r\n".to_vec(),
        }
    }

    /// The next complete request, or `None` at EOF, error or stop.
    fn next_request(&mut self) -> Option<Request> {
        loop {
            if let Some(end) = self.buffer.windows(2).position(|w| w == b"\r\n") {
                let line = self.buffer[..end].to_vec();
                let mut tokens = line.split(|&b| b == b' ').filter(|t| !t.is_empty());
                let command = tokens.next().unwrap_or_default().to_vec();
                let rest: Vec<Vec<u8>> = tokens.map(<[u8]>::to_vec).collect();
                let storage = matches!(
                    &command[..],
                    b"set" | b"add" | b"replace" | b"append" | b"prepend" | b"cas"
                );
                if storage {
                    let len: usize = rest
                        .get(3)
                        .and_then(|n| std::str::from_utf8(n).ok())
                        .and_then(|n| n.parse().ok())
                        .unwrap_or(0);
                    let total = end + 2 + len + 2;
                    if self.buffer.len() >= total {
                        let data = self.buffer[end + 2..end + 2 + len].to_vec();
                        self.buffer.drain(..total);
                        return Some(Request {
                            command,
                            keys: rest.into_iter().take(1).collect(),
                            data: Some(data),
                        });
                    }
                } else {
                    self.buffer.drain(..end + 2);
                    return Some(Request {
                        command,
                        keys: rest,
                        data: None,
                    });
                }
            }
            if !self.fill() {
                return None;
            }
        }
    }

    /// Reads more bytes; false at EOF, error or stop.
    fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 16 * 1024];
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return false;
            }
            match self.stream.read(&mut chunk) {
                Ok(0) => return false,
                Ok(n) => {
                    self.buffer.extend_from_slice(&chunk[..n]);
                    return true;
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
    }

    /// Writes all of `bytes`; false if the peer is gone or stop was asked.
    fn write(&mut self, mut bytes: &[u8]) -> bool {
        while !bytes.is_empty() {
            if self.stop.load(Ordering::Relaxed) {
                return false;
            }
            match self.stream.write(bytes) {
                Ok(0) => return false,
                Ok(n) => bytes = &bytes[n..],
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                    ) => {}
                Err(_) => return false,
            }
        }
        true
    }

    /// Reads and ignores everything until EOF or stop; always false.
    fn drain(&mut self) -> bool {
        while self.fill() {
            self.buffer.clear();
        }
        false
    }

    /// Keeps the connection open without reading until stop; always false.
    fn idle(&mut self) -> bool {
        while !self.stop.load(Ordering::Relaxed) {
            std::thread::sleep(POLL);
        }
        false
    }
}
