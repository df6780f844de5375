//! A relay between memring and a real memcached that plays a faulty or a newer
//! server: it frames memcached's replies one by one and slips extra bytes in
//! before some of them (a doubled `HD`, a stray `VA`, an extra `MN`, `END` or
//! `ERROR`), or rewrites request lines on their way (to stand for a memcached
//! that accepts flags 1.6.18 does not know). Everything else is memcached's
//! own behaviour.
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
pub type Rewrite = fn(&[u8]) -> Vec<u8>;

/// What the relay does to the traffic.
#[derive(Clone, Copy)]
pub struct Fault {
    /// Bytes sent before every `every`-th reply of a connection, once it
    /// has relayed `after` replies untouched.
    pub inject: &'static [u8],
    pub every: usize,
    pub after: usize,
    /// Applied to every request line (without its line end).
    pub rewrite: Option<Rewrite>,
}

impl Fault {
    /// Relays replies untouched and rewrites request lines.
    pub fn rewriting(rewrite: Rewrite) -> Fault {
        Fault {
            inject: b"",
            every: 0,
            after: 0,
            rewrite: Some(rewrite),
        }
    }

    /// Injects `inject` before every `every`-th reply after the first `after`.
    pub fn injecting(inject: &'static [u8], every: usize, after: usize) -> Fault {
        Fault {
            inject,
            every,
            after,
            rewrite: None,
        }
    }
}

/// A running relay; stopped and joined on drop.
pub struct Relay {
    pub port: u16,
    stop: Arc<AtomicBool>,
    injected: Arc<AtomicUsize>,
    threads: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Relay {
    pub fn start(upstream: &str, fault: Fault) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("local addr").port();
        let relay = Relay {
            port,
            stop: Arc::default(),
            injected: Arc::default(),
            threads: Arc::default(),
        };
        let (stop, injected, threads) = (
            relay.stop.clone(),
            relay.injected.clone(),
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
                let mut threads = threads.lock().unwrap();
                threads.push(std::thread::spawn(move || {
                    requests(up_from, up_to, fault.rewrite, &stop_up)
                }));
                threads.push(std::thread::spawn(move || {
                    replies(server, client, fault, &stop_down, &injected)
                }));
            }
        });
        relay.threads.lock().unwrap().push(accept);
        relay
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// How many times the fault has been injected so far.
    pub fn injected(&self) -> usize {
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

/// Reads more bytes into `buffer`: false at EOF, error or stop.
fn fill(from: &mut TcpStream, buffer: &mut Vec<u8>, stop: &AtomicBool) -> bool {
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if stop.load(Ordering::Relaxed) {
            return false;
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
fn requests(mut from: TcpStream, mut to: TcpStream, rewrite: Option<Rewrite>, stop: &AtomicBool) {
    let mut buffer = Vec::new();
    while fill(&mut from, &mut buffer, stop) {
        let out = match rewrite {
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
        if to.write_all(&out).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}

/// The length of the complete reply at the start of `buffer`, if any: one
/// line, plus the data block of a `VA <size>` or `VALUE <key> <flags> <size>`.
pub fn reply_len(buffer: &[u8]) -> Option<usize> {
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
    while fill(&mut from, &mut buffer, stop) {
        let mut out = Vec::new();
        while let Some(len) = reply_len(&buffer) {
            relayed += 1;
            if fault.every > 0 && relayed > fault.after && relayed % fault.every == 0 {
                out.extend_from_slice(fault.inject);
                injected.fetch_add(1, Ordering::Relaxed);
            }
            out.extend(buffer.drain(..len));
        }
        if to.write_all(&out).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}
