//! A TCP relay of raw bytes (memring to etcd) that a test can cut or hold,
//! and a thread of requests through memring that counts what failed.
//! (`relay.rs` relays memcached and reads its replies; this one does not
//! read what it passes on.)
//!
//! Every thread polls a stop flag with short socket timeouts and is joined
//! when its handle drops or finishes.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::Client;

/// What the test has asked of a [`Link`].
#[derive(Default)]
struct Switches {
    /// Every connection dropped, and new ones refused.
    cut: AtomicBool,
    /// Nothing the upstream sends is read (it falls behind), while what
    /// the client sends still goes through.
    hold: AtomicBool,
    stop: AtomicBool,
}

/// A relay from a local port to `127.0.0.1:<upstream>`.
pub(crate) struct Link {
    pub(crate) port: u16,
    switches: Arc<Switches>,
    thread: Option<JoinHandle<()>>,
}

impl Link {
    pub(crate) fn start(upstream: u16) -> Link {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let switches = Arc::new(Switches::default());
        let shared = switches.clone();
        let thread = std::thread::spawn(move || {
            let mut pipes = Vec::new();
            while !shared.stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) if !shared.cut.load(Ordering::Relaxed) => {
                        let Ok(server) = connect_small(upstream) else {
                            continue;
                        };
                        // Cut while connecting: dropped like the rest.
                        if shared.cut.load(Ordering::SeqCst) {
                            continue;
                        }
                        for (from, to, holds) in [
                            (
                                client.try_clone().unwrap(),
                                server.try_clone().unwrap(),
                                false,
                            ),
                            (server, client, true),
                        ] {
                            let switches = shared.clone();
                            pipes
                                .push(std::thread::spawn(move || pipe(from, to, &switches, holds)));
                        }
                    }
                    // Cut: the connection is dropped as it comes.
                    Ok(_) => {}
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
            for p in pipes {
                let _ = p.join();
            }
        });
        Link {
            port,
            switches,
            thread: Some(thread),
        }
    }

    pub(crate) fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Cuts the link (every connection dropped, new ones refused), or
    /// mends it.
    pub(crate) fn cut(&self, cut: bool) {
        self.switches.cut.store(cut, Ordering::SeqCst);
    }

    /// Holds back what the upstream sends (it is not read, so the
    /// upstream's writes pile up), or lets it through again.
    pub(crate) fn hold(&self, hold: bool) {
        self.switches.hold.store(hold, Ordering::Relaxed);
    }
}

/// How much the kernel may buffer of what the upstream sends (Linux
/// doubles it): fixed, so that what a held link lets pile up in the
/// upstream does not depend on receive-buffer autotuning (up to 32 MB here).
const UPSTREAM_RECEIVE_BUFFER: libc::c_int = 32 * 1024;

/// A connection to `127.0.0.1:<port>` whose receive buffer is set to
/// [`UPSTREAM_RECEIVE_BUFFER`] before it connects (so the window it offers
/// is sized on it from the start). std has no way to set it before
/// connecting, hence libc, and the one allowance of unsafe code here.
#[allow(unsafe_code)]
fn connect_small(port: u16) -> std::io::Result<TcpStream> {
    use std::os::fd::FromRawFd;
    // SAFETY: plain socket calls on a descriptor this function owns; it is
    // handed to `TcpStream` (which closes it) before any early return.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let stream = TcpStream::from_raw_fd(fd);
        let size = UPSTREAM_RECEIVE_BUFFER;
        let set = libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            std::ptr::addr_of!(size).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
        if set != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let addr = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: port.to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(std::net::Ipv4Addr::LOCALHOST).to_be(),
            },
            sin_zero: [0; 8],
        };
        let connected = libc::connect(
            fd,
            std::ptr::addr_of!(addr).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        if connected != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(stream)
    }
}

/// Copies `from` to `to` until either closes, the link is cut or stopped;
/// while held, a pipe that `holds` reads nothing.
fn pipe(mut from: TcpStream, mut to: TcpStream, switches: &Switches, holds: bool) {
    from.set_read_timeout(Some(Duration::from_millis(20)))
        .unwrap();
    let mut buffer = [0u8; 16 * 1024];
    while !switches.stop.load(Ordering::Relaxed) && !switches.cut.load(Ordering::Relaxed) {
        if holds && switches.hold.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        match from.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => {
                // A chunk read as the hold began is held too: nothing the
                // upstream sends after `hold(true)` returned goes through.
                while holds
                    && switches.hold.load(Ordering::Relaxed)
                    && !switches.stop.load(Ordering::Relaxed)
                    && !switches.cut.load(Ordering::Relaxed)
                {
                    std::thread::sleep(Duration::from_millis(10));
                }
                // Read once the link was cut: dropped, not passed on. The
                // read may have begun before the cut, and on a loaded
                // machine this thread may run again only after the
                // upstream sent what the test did after cutting (memring
                // then learnt of a member joined while cut off).
                if switches.cut.load(Ordering::SeqCst) {
                    break;
                }
                if to.write_all(&buffer[..n]).is_err() {
                    break;
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::TimedOut => {}
            Err(_) => break,
        }
    }
    let _ = from.shutdown(std::net::Shutdown::Both);
    let _ = to.shutdown(std::net::Shutdown::Both);
}

impl Drop for Link {
    fn drop(&mut self) {
        self.switches.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Sets and gets through memring at `addr`, in a thread, until finished,
/// counting the requests that failed.
pub(crate) struct Traffic {
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
    errors: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl Traffic {
    pub(crate) fn start(addr: &str) -> Traffic {
        let addr = addr.to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(AtomicU64::new(0));
        let (s, d, e) = (stop.clone(), done.clone(), errors.clone());
        let thread = std::thread::spawn(move || {
            let mut client = Client::connect(&addr);
            let mut i = 0u64;
            while !s.load(Ordering::Relaxed) {
                let key = format!("traffic:{}", i % 500);
                if client.set(&key, b"x") != b"STORED\r\n" {
                    e.fetch_add(1, Ordering::Relaxed);
                }
                if client.get(&key).is_none() {
                    e.fetch_add(1, Ordering::Relaxed);
                }
                d.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
        });
        Traffic {
            stop,
            done,
            errors,
            thread: Some(thread),
        }
    }

    /// Rounds (a set and a get) made so far.
    pub(crate) fn done(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    /// Stops; the rounds made and the requests that failed.
    pub(crate) fn finish(mut self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        (self.done(), self.errors.load(Ordering::Relaxed))
    }
}

impl Drop for Traffic {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
