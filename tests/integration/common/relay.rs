//! A relay between memring and a real memcached that plays a faulty or a newer
//! server: it frames memcached's replies one by one and slips extra bytes in
//! before some of them (a doubled `HD`, a stray `VA`, an extra `MN`, `END` or
//! `ERROR`), or rewrites request lines on their way (to stand for a memcached
//! that accepts flags 1.6.18 does not know), or keeps requests back from a
//! given one on until the test releases them (a server slow to answer just
//! that request), or holds every chunk it reads for a while before passing
//! it on, each way (a slow server, or a long way to it). Everything else is
//! memcached's own behaviour.
//!
//! Every thread it starts polls a stop flag with short socket timeouts and is
//! joined when the handle drops.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

const POLL: Duration = Duration::from_millis(20);

/// Rewrites one request line (without its line end).
pub(crate) type Rewrite = fn(&[u8]) -> Vec<u8>;

/// What the relay does to the traffic.
#[derive(Clone, Copy)]
pub(crate) struct Fault {
    /// Bytes sent before every `every`-th reply of a connection, once it
    /// has relayed `after` replies untouched.
    pub inject: &'static [u8],
    pub every: usize,
    pub after: usize,
    /// Applied to every request line (without its line end).
    pub rewrite: Option<Rewrite>,
    /// Request bytes from the first occurrence of this on are kept back
    /// until [`Relay::release`].
    pub hold_from: Option<&'static [u8]>,
    /// How long each chunk read, either way, waits before it is passed on;
    /// the next is read only then, so a busy connection queues behind it.
    pub delay: Duration,
}

impl Fault {
    /// Relays replies untouched and rewrites request lines.
    pub(crate) fn rewriting(rewrite: Rewrite) -> Fault {
        Fault {
            inject: b"",
            every: 0,
            after: 0,
            rewrite: Some(rewrite),
            hold_from: None,
            delay: Duration::ZERO,
        }
    }

    /// Injects `inject` before every `every`-th reply after the first `after`.
    pub(crate) fn injecting(inject: &'static [u8], every: usize, after: usize) -> Fault {
        Fault {
            inject,
            every,
            after,
            rewrite: None,
            hold_from: None,
            delay: Duration::ZERO,
        }
    }

    /// Relays everything until a request contains `needle`, then keeps that
    /// request and every later byte back until [`Relay::release`].
    pub(crate) fn holding_from(needle: &'static [u8]) -> Fault {
        Fault {
            inject: b"",
            every: 0,
            after: 0,
            rewrite: None,
            hold_from: Some(needle),
            delay: Duration::ZERO,
        }
    }

    /// Relays everything untouched, each chunk read `delay` late.
    pub(crate) fn delaying(delay: Duration) -> Fault {
        Fault {
            inject: b"",
            every: 0,
            after: 0,
            rewrite: None,
            hold_from: None,
            delay,
        }
    }
}

/// Whether a relay keeps requests back ([`Fault::holding_from`]).
#[derive(Default)]
struct Gate {
    holding: AtomicBool,
    released: AtomicBool,
}

/// A running relay; stopped and joined on drop.
pub(crate) struct Relay {
    pub port: u16,
    stop: Arc<AtomicBool>,
    injected: Arc<AtomicUsize>,
    gate: Arc<Gate>,
    threads: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Relay {
    pub(crate) fn start(upstream: &str, fault: Fault) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("local addr").port();
        let relay = Relay {
            port,
            stop: Arc::default(),
            injected: Arc::default(),
            gate: Arc::default(),
            threads: Arc::default(),
        };
        let (stop, injected, gate, threads) = (
            relay.stop.clone(),
            relay.injected.clone(),
            relay.gate.clone(),
            relay.threads.clone(),
        );
        let upstream = upstream.to_string();
        let accept = std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let Ok((client, _)) = listener.accept() else {
                    std::thread::sleep(POLL);
                    continue;
                };
                let Ok(server) = TcpStream::connect(&upstream) else {
                    continue;
                };
                for stream in [&client, &server] {
                    let _ = stream.set_nodelay(true);
                    let _ = stream.set_read_timeout(Some(POLL));
                }
                let (up_from, up_to) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let (stop_up, stop_down) = (stop.clone(), stop.clone());
                let injected = injected.clone();
                let gate = gate.clone();
                let mut threads = threads.lock().unwrap();
                threads.push(std::thread::spawn(move || {
                    requests(up_from, up_to, fault, &stop_up, &gate)
                }));
                threads.push(std::thread::spawn(move || {
                    replies(server, client, fault, &stop_down, &injected)
                }));
            }
        });
        relay.threads.lock().unwrap().push(accept);
        relay
    }

    pub(crate) fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Whether requests are being kept back ([`Fault::holding_from`]).
    pub(crate) fn holding(&self) -> bool {
        self.gate.holding.load(Ordering::SeqCst)
    }

    /// Lets requests kept back go on, and relays everything from now on.
    pub(crate) fn release(&self) {
        self.gate.released.store(true, Ordering::SeqCst);
    }

    /// How many times the fault has been injected so far.
    pub(crate) fn injected(&self) -> usize {
        self.injected.load(Ordering::Relaxed)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let threads = std::mem::take(&mut *self.threads.lock().unwrap());
        for thread in threads {
            let _ = thread.join();
        }
    }
}

/// Reads more bytes into `buffer`: false at EOF, error or stop. Returns
/// with nothing read after a poll interval when `idle` says so.
fn fill(
    from: &mut TcpStream,
    buffer: &mut Vec<u8>,
    stop: &AtomicBool,
    idle: impl Fn() -> bool,
) -> bool {
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        if idle() {
            return true;
        }
        match from.read(&mut chunk) {
            Ok(0) => return false,
            Ok(n) => {
                buffer.extend_from_slice(&chunk[..n]);
                return true;
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
}

/// Client to server: verbatim, or line by line through `rewrite` (only for
/// tests whose requests carry no data blocks).
fn requests(mut from: TcpStream, mut to: TcpStream, fault: Fault, stop: &AtomicBool, gate: &Gate) {
    let mut buffer = Vec::new();
    let mut held = Vec::new();
    let holding = std::cell::Cell::new(false);
    let released = || gate.released.load(Ordering::SeqCst);
    let held_to_release = || holding.get() && released();
    while fill(&mut from, &mut buffer, stop, held_to_release) {
        if held_to_release() {
            holding.set(false);
            gate.holding.store(false, Ordering::SeqCst);
            if to.write_all(&std::mem::take(&mut held)).is_err() {
                break;
            }
        }
        let mut out = match fault.rewrite {
            None => std::mem::take(&mut buffer),
            Some(rewrite) => {
                let mut out = Vec::new();
                while let Some(end) = buffer.iter().position(|&b| b == b'\n') {
                    let line: Vec<u8> = buffer.drain(..=end).collect();
                    let content = line
                        .strip_suffix(b"\r\n")
                        .unwrap_or(&line[..line.len() - 1]);
                    out.extend(rewrite(content));
                    out.extend_from_slice(b"\r\n");
                }
                out
            }
        };
        if let Some(needle) = fault.hold_from.filter(|_| !released()) {
            if holding.get() {
                held.append(&mut out);
            } else if let Some(at) = out.windows(needle.len()).position(|w| w == needle) {
                held.extend(out.drain(at..));
                holding.set(true);
                gate.holding.store(true, Ordering::SeqCst);
            }
        }
        if !out.is_empty() {
            std::thread::sleep(fault.delay);
        }
        if to.write_all(&out).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}

/// The length of the complete reply at the start of `buffer`, if any: one
/// line, plus the data block of a `VA <size>` or `VALUE <key> <flags> <size>`.
pub(crate) fn reply_len(buffer: &[u8]) -> Option<usize> {
    let end = buffer.iter().position(|&b| b == b'\n')? + 1;
    let line = std::str::from_utf8(&buffer[..end]).ok()?.trim_end();
    let mut tokens = line.split(' ');
    let size = match tokens.next() {
        Some("VA") => tokens.next(),
        Some("VALUE") => tokens.nth(2),
        _ => return Some(end),
    };
    let size: usize = size?.parse().ok()?;
    let total = end + size + 2;
    (buffer.len() >= total).then_some(total)
}

/// Server to client, one reply at a time, with the fault slipped in.
fn replies(
    mut from: TcpStream,
    mut to: TcpStream,
    fault: Fault,
    stop: &AtomicBool,
    injected: &AtomicUsize,
) {
    let mut buffer = Vec::new();
    let mut relayed = 0usize;
    while fill(&mut from, &mut buffer, stop, || false) {
        let mut out = Vec::new();
        while let Some(len) = reply_len(&buffer) {
            relayed += 1;
            if fault.every > 0 && relayed > fault.after && relayed % fault.every == 0 {
                out.extend_from_slice(fault.inject);
                injected.fetch_add(1, Ordering::Relaxed);
            }
            out.extend(buffer.drain(..len));
        }
        if !out.is_empty() {
            std::thread::sleep(fault.delay);
        }
        if to.write_all(&out).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}
