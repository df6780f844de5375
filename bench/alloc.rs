//! Allocations per request through memring, counted by a global allocator.
//!
//! Starts four real memcached on free loopback ports and memring in this
//! process with its defaults (`listen` and one `[[servers]]`; four for the
//! last rows, whose keys spread over them, the very last with `replicas =
//! 2`, so that an `mg` reads over its replicas), pipelines each
//! kind of request from a blocking client whose buffers are made before the
//! count starts, and divides the allocations made meanwhile (memring's
//! workers, its control plane and the client together; the client makes none)
//! by the requests sent. Prints a Markdown table.
//!
//! `cargo bench --bench alloc`. Needs `memcached` on PATH. Everything runs on
//! 127.0.0.1 and the memcached processes it starts are killed by PID when it
//! ends.

// A global allocator is an unsafe trait: the one unsafe code of the project.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The system allocator, counting every allocation.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

/// Allocations by size, in 8-byte classes (the last: everything larger),
/// printed with `ALLOC_SIZES=1` to tell which object a count is.
const SIZE_CLASSES: usize = 512;
#[allow(clippy::declare_interior_mutable_const)]
const NONE_YET: AtomicU64 = AtomicU64::new(0);
static SIZES: [AtomicU64; SIZE_CLASSES] = [NONE_YET; SIZE_CLASSES];

// SAFETY: every call is passed on unchanged to the system allocator; the
// counter is an atomic, touched without allocating.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        SIZES[(layout.size() / 8).min(SIZE_CLASSES - 1)].fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller upholds `alloc`'s contract; forwarded as is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as for `dealloc`, and the caller upholds `realloc`'s.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Requests per measured run, sent in pipelined batches.
const REQUESTS: usize = 20_000;
const BATCH: usize = 100;
/// memring's default `hot_key_window_ms`.
const HOT_KEY_WINDOW: Duration = Duration::from_millis(1000);

struct Memcached(std::process::Child, u16);

impl Drop for Memcached {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

fn start_memcached() -> Memcached {
    let port = free_port();
    let child = std::process::Command::new("memcached")
        .args([
            "-p",
            &port.to_string(),
            "-U",
            "0",
            "-l",
            "127.0.0.1",
            "-m",
            "64",
        ])
        .args(if running_as_root() {
            vec!["-u", "root"]
        } else {
            vec![]
        })
        .spawn()
        .expect("memcached on PATH (apt-get install memcached)");
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "memcached did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
    Memcached(child, port)
}

/// memcached refuses to run as root without `-u`.
fn running_as_root() -> bool {
    std::env::var("USER").map_or(true, |u| u == "root")
}

/// Sends `batch` (`BATCH` requests) `REQUESTS / BATCH` times, reading each
/// batch's replies (which end with `end`) before the next; the allocations
/// counted meanwhile, per request.
fn measure(client: &mut TcpStream, batch: &[u8], end: &[u8], reply_buf: &mut Vec<u8>) -> f64 {
    let mut run = || {
        for _ in 0..REQUESTS / BATCH {
            client.write_all(batch).expect("send");
            reply_buf.clear();
            let mut chunk = [0u8; 64 * 1024];
            while !reply_buf.ends_with(end) {
                let n = client.read(&mut chunk).expect("read");
                assert!(n > 0, "memring closed the connection");
                reply_buf.extend_from_slice(&chunk[..n]);
            }
        }
    };
    // Warm-up: buffers grown, connections open, estimates settled, and a
    // hot-key window (`hot_key_window_ms`, 1 s by default) ended, so that
    // the keys these requests make hot are counted as hot (their gets
    // coalesced) however fast the build.
    let warm_up = Instant::now();
    while warm_up.elapsed() < HOT_KEY_WINDOW + Duration::from_millis(200) {
        run();
    }
    let sizes_before: Vec<u64> = SIZES.iter().map(|n| n.load(Ordering::Relaxed)).collect();
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    run();
    let after = ALLOCATIONS.load(Ordering::Relaxed);
    if std::env::var_os("ALLOC_SIZES").is_some() {
        for (class, (n, was)) in SIZES.iter().zip(sizes_before).enumerate() {
            let per_request = (n.load(Ordering::Relaxed) - was) as f64 / REQUESTS as f64;
            if per_request >= 0.01 {
                eprintln!("  {} bytes: {per_request:.2}", class * 8);
            }
        }
    }
    (after - before) as f64 / REQUESTS as f64
}

/// memring with its defaults in front of `servers`, on `runtime`; a client
/// connected to it with ten 32-byte values `k0`..`k9` and a `counter` stored.
fn start_proxy(
    runtime: &tokio::runtime::Runtime,
    servers: &[Memcached],
    settings: &str,
    shutdown: &tokio_util::sync::CancellationToken,
) -> TcpStream {
    let mut text = format!("listen = \"127.0.0.1:0\"\n{settings}");
    for server in servers {
        text.push_str(&format!("[[servers]]\naddr = \"127.0.0.1:{}\"\n", server.1));
    }
    let config = memring::config::Config::parse(&text, "bench.toml").expect("config");
    let running = runtime
        .block_on(memring::server::start(&config, shutdown.clone()))
        .expect("memring starts");
    let mut client = TcpStream::connect(running.local_addr).expect("connect");
    client.set_nodelay(true).expect("nodelay");
    let mut seed = Vec::new();
    for i in 0..10 {
        seed.extend(format!("set k{i} 0 0 32\r\n{}\r\n", "v".repeat(32)).bytes());
    }
    seed.extend(b"set counter 0 0 1\r\n0\r\n");
    client.write_all(&seed).expect("seed");
    let mut stored = Vec::new();
    let mut chunk = [0u8; 4096];
    while stored.windows(8).filter(|w| w == b"STORED\r\n").count() < 11 {
        let n = client.read(&mut chunk).expect("read");
        assert!(n > 0, "memring closed the connection");
        stored.extend_from_slice(&chunk[..n]);
    }
    client
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let servers: Vec<Memcached> = (0..4).map(|_| start_memcached()).collect();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let mut client = start_proxy(&runtime, &servers[..1], "", &shutdown);
    let mut reply_buf = Vec::with_capacity(1 << 20);

    // Each batch ends with a request whose reply marks its end: `version`
    // (answered by memring itself) after classic requests, `mn` after meta.
    let classic = |request: &[u8]| [request.repeat(BATCH - 1), b"version\r\n".to_vec()].concat();
    let meta = |request: &[u8]| [request.repeat(BATCH - 1), b"mn\r\n".to_vec()].concat();
    let version_end: &[u8] = memring::VERSION_REPLY;
    let value = "w".repeat(32);
    let cases: [(&str, Vec<u8>, &[u8]); 10] = [
        ("`get` (hit)", classic(b"get k1\r\n"), version_end),
        (
            "`set`",
            classic(format!("set k2 0 0 32\r\n{value}\r\n").as_bytes()),
            version_end,
        ),
        (
            "`delete` (miss)",
            classic(b"delete nothing\r\n"),
            version_end,
        ),
        (
            "10-key `get`",
            classic(b"get k0 k1 k2 k3 k4 k5 k6 k7 k8 k9\r\n"),
            version_end,
        ),
        ("`incr`", classic(b"incr counter 1\r\n"), version_end),
        ("`mg k v` (hit)", meta(b"mg k1 v\r\n"), b"MN\r\n"),
        (
            "`ms`",
            meta(format!("ms k3 32\r\n{value}\r\n").as_bytes()),
            b"MN\r\n",
        ),
        ("`md` (miss)", meta(b"md nothing\r\n"), b"MN\r\n"),
        ("quiet `mg` (miss)", meta(b"mg nothing v q\r\n"), b"MN\r\n"),
        // `azE=` is `k1` in base64.
        ("`mg azE= b v` (hit)", meta(b"mg azE= b v\r\n"), b"MN\r\n"),
    ];
    println!("| request | allocations per request |");
    println!("| --- | ---: |");
    for (name, batch, end) in cases {
        let per_request = measure(&mut client, &batch, end, &mut reply_buf);
        println!("| {name} | {per_request:.3} |");
    }
    drop(client);
    // The ten keys spread over four servers: one sub-request per server.
    let mut spread = start_proxy(&runtime, &servers, "", &shutdown);
    let batch = classic(b"get k0 k1 k2 k3 k4 k5 k6 k7 k8 k9\r\n");
    let per_request = measure(&mut spread, &batch, version_end, &mut reply_buf);
    println!("| 10-key `get`, 4 servers | {per_request:.3} |");
    drop(spread);
    // An `mg` read over its replicas, one at a time (it hits the first).
    let mut replicated = start_proxy(&runtime, &servers, "replicas = 2\n", &shutdown);
    let batch = meta(b"mg k1 v\r\n");
    let per_request = measure(&mut replicated, &batch, b"MN\r\n", &mut reply_buf);
    println!("| `mg k v` (hit), `replicas = 2`, 4 servers | {per_request:.3} |");
    drop(replicated);
    shutdown.cancel();
    drop(runtime);
}
