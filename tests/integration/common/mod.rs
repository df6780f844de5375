//! Test harness: real memcached processes on free loopback ports, memring
//! in-process on `127.0.0.1:0`, and a small blocking client.
//!
//! Every wait polls with a deadline (never a fixed sleep), and every process
//! started here is killed by PID when its handle drops.

#![allow(dead_code)] // not every helper is used by every test area

pub(crate) mod daemon;
pub(crate) mod etcd;
pub(crate) mod exposition;
pub(crate) mod faulty;
pub(crate) mod link;
pub(crate) mod pki;
pub(crate) mod relay;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use memring::config::Config;
use memring::protocol::{frame_reply, ReplyKind};
use tokio_util::sync::CancellationToken;

/// How long any single wait in a test may take before the test fails.
pub(crate) const DEADLINE: Duration = Duration::from_secs(20);

/// A memcached process owned by the test.
pub(crate) struct Memcached {
    pub port: u16,
    /// With TLS (`start_tls`): the TLS port; `port` then stays plain
    /// (`notls`), for the harness and for tests that look behind memring.
    pub(crate) tls_port: Option<u16>,
    args: Vec<String>,
    child: Option<Child>,
    paused: bool,
}

pub(crate) fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|euid| euid == "0"))
        })
        .unwrap_or(false)
}

/// A loopback port nothing listens on now, and one this test binary has not
/// handed out before: the kernel may give the port it just released to the
/// next `bind(0)`, so two servers of one test (or of two tests running at the
/// same time) could otherwise be told the same port.
pub(crate) fn free_port() -> u16 {
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("bind an ephemeral port")
            .port();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// The pid that the memcached-like server on `port` reports in `stats`, or
/// `None` if nothing answers there (yet). A listener that is not memcached
/// reports pid 0.
pub(crate) fn answering_pid(port: u16) -> Option<u32> {
    answering_pid_at("127.0.0.1", port)
}

/// [`answering_pid`] on any loopback address.
pub(crate) fn answering_pid_at(ip: &str, port: u16) -> Option<u32> {
    let mut stream = TcpStream::connect((ip, port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    stream.write_all(b"stats\r\n").ok()?;
    let mut reply = Vec::new();
    let mut chunk = [0u8; 4096];
    while !reply.ends_with(b"END\r\n") && reply.len() < 64 * 1024 {
        match stream.read(&mut chunk) {
            Ok(n) if n > 0 => reply.extend_from_slice(&chunk[..n]),
            _ => return Some(0),
        }
    }
    String::from_utf8_lossy(&reply)
        .lines()
        .find_map(|l| l.strip_prefix("STAT pid "))
        .and_then(|pid| pid.trim().parse().ok())
        .or(Some(0))
}

/// `stream.read`, again when a signal interrupted it. A socket with a read
/// timeout is never restarted after a signal handler ran (signal(7)), even
/// with `SA_RESTART`, and the test process has handlers (tokio's, for the
/// children and the daemons run in-process): a test's child exiting could
/// otherwise fail an unrelated test's read with `EINTR`.
pub(crate) fn read_through_signals(
    stream: &mut TcpStream,
    buf: &mut [u8],
) -> std::io::Result<usize> {
    loop {
        match stream.read(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            read => return read,
        }
    }
}

/// A temporary directory for one test's files, removed on drop.
pub(crate) struct TempDir(std::path::PathBuf);

impl TempDir {
    /// `memring-<suite>-<test>-<pid>` under the system temp directory, empty.
    pub(crate) fn new(suite: &str, test: &str) -> TempDir {
        let dir =
            std::env::temp_dir().join(format!("memring-{suite}-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }

    pub(crate) fn path(&self, name: &str) -> std::path::PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A process's state letter from `/proc/<pid>/stat` (`T` once stopped).
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The state follows the command name, which is in parentheses.
    stat.rsplit_once(") ")?.1.chars().next()
}

/// Writes a temporary file and renames it over `path` (how most tools
/// deploy a config): a reload never reads it half-written.
pub(crate) fn replace_by_rename(path: &std::path::Path, text: &str) {
    let temporary = path.with_extension("tmp");
    std::fs::write(&temporary, text).unwrap();
    std::fs::rename(&temporary, path).unwrap();
}

/// The report of `memring plan OLD NEW` (its stdout), which must succeed.
pub(crate) fn memring_plan(old: &std::path::Path, new: &std::path::Path) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_memring"))
        .arg("plan")
        .arg(old)
        .arg(new)
        .output()
        .expect("run memring plan");
    assert!(
        output.status.success(),
        "memring plan: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Polls `condition` until it holds or `DEADLINE` passes.
pub(crate) fn wait_for(what: &str, mut condition: impl FnMut() -> bool) {
    let start = Instant::now();
    while !condition() {
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

impl Memcached {
    /// Starts a memcached with default settings.
    pub(crate) fn start() -> Memcached {
        Memcached::start_with(&[])
    }

    /// Starts a memcached with extra arguments (for example `["-I", "2m"]`).
    pub(crate) fn start_with(extra: &[&str]) -> Memcached {
        for _ in 0..10 {
            let mut server = Memcached {
                port: free_port(),
                tls_port: None,
                args: extra.iter().map(|s| s.to_string()).collect(),
                child: None,
                paused: false,
            };
            if server.spawn() {
                return server;
            }
        }
        panic!("could not start memcached on a free port");
    }

    /// Starts a memcached that speaks TLS (`-Z`) on `tls_port` with this
    /// certificate chain and key; with `client_ca`, it requires client
    /// certificates issued by it. `port` stays plain text.
    pub(crate) fn start_tls(
        cert: &std::path::Path,
        key: &std::path::Path,
        client_ca: Option<&std::path::Path>,
    ) -> Memcached {
        let mut options = format!(
            "ssl_chain_cert={},ssl_key={}",
            cert.display(),
            key.display()
        );
        if let Some(ca) = client_ca {
            options.push_str(&format!(",ssl_ca_cert={},ssl_verify_mode=2", ca.display()));
        }
        for _ in 0..10 {
            let mut server = Memcached {
                port: free_port(),
                tls_port: Some(free_port()),
                args: vec!["-Z".to_string(), "-o".to_string(), options.clone()],
                child: None,
                paused: false,
            };
            if server.spawn() {
                return server;
            }
        }
        panic!("could not start a TLS memcached on free ports");
    }

    /// The TLS address of a server started with [`Memcached::start_tls`].
    pub(crate) fn tls_addr(&self) -> String {
        format!("127.0.0.1:{}", self.tls_port.expect("started with TLS"))
    }

    /// Starts it on its port; false if it exited (port taken meanwhile).
    fn spawn(&mut self) -> bool {
        let mut command = Command::new("memcached");
        let listen = match self.tls_port {
            Some(tls) => format!("notls:127.0.0.1:{},127.0.0.1:{tls}", self.port),
            None => "127.0.0.1".to_string(),
        };
        command
            .args([
                "-l", &listen, "-U", "0", "-t", "1", "-m", "64", "-c", "4096",
            ])
            .args(["-p", &self.port.to_string()])
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if running_as_root() {
            command.args(["-u", "root"]);
        }
        let mut child = command
            .spawn()
            .expect("memcached must be installed (scripts/test installs it)");
        let start = Instant::now();
        loop {
            match answering_pid(self.port) {
                Some(pid) if pid == child.id() => {
                    self.child = Some(child);
                    return true;
                }
                // Another process took the port between `free_port` and
                // memcached's bind: ours cannot listen there.
                Some(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return false;
                }
                None => {}
            }
            if let Ok(Some(_)) = child.try_wait() {
                return false;
            }
            if start.elapsed() > DEADLINE {
                let _ = child.kill();
                let _ = child.wait();
                panic!("memcached on port {} did not start", self.port);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub(crate) fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Kills the process (SIGKILL) and waits for it.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            if self.paused {
                self.signal_pid(child.id(), "CONT");
                self.paused = false;
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port.
    pub(crate) fn restart(&mut self) {
        self.kill();
        let start = Instant::now();
        while !self.spawn() {
            assert!(
                start.elapsed() < DEADLINE,
                "port {} stayed taken",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Freezes the process (SIGSTOP): connections stay open, nothing answers.
    pub(crate) fn pause(&mut self) {
        let pid = self.pid();
        self.signal_pid(pid, "STOP");
        self.paused = true;
        // `kill` returns before the process has stopped: a request sent at
        // once could still be answered.
        wait_for("memcached to stop", || process_state(pid) == Some('T'));
    }

    /// Resumes a paused process (SIGCONT).
    pub(crate) fn resume(&mut self) {
        self.signal_pid(self.pid(), "CONT");
        self.paused = false;
    }

    fn signal_pid(&self, pid: u32, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {pid}");
    }

    /// A direct client, bypassing memring.
    pub(crate) fn client(&self) -> Client {
        Client::connect(&self.addr())
    }
}

impl Drop for Memcached {
    fn drop(&mut self) {
        self.kill();
    }
}

/// memring running in-process with its own runtime.
pub(crate) struct Proxy {
    pub addr: SocketAddr,
    pub config: Config,
    shutdown: CancellationToken,
    running: Option<memring::server::Running>,
    runtime: Option<tokio::runtime::Runtime>,
}

/// The TOML for a config over `servers` with extra top-level settings.
/// Like [`config_text`], with each server named `cache-<port>` (see
/// [`named_servers`]).
pub(crate) fn named_config_text(servers: &[&Memcached], settings: &str) -> String {
    format!(
        "listen = \"127.0.0.1:0\"\n{settings}\n{}",
        named_servers(servers)
    )
}

/// The `[[servers]]` tables for `servers`, each named `cache-<port>`: a
/// ring by names, which stays the same when a server's address changes.
pub(crate) fn named_servers(servers: &[&Memcached]) -> String {
    let mut text = String::new();
    for server in servers {
        text.push_str(&format!(
            "[[servers]]\naddr = \"{}\"\nname = \"cache-{}\"\n",
            server.addr(),
            server.port
        ));
    }
    text
}

pub(crate) fn config_text(servers: &[&Memcached], settings: &str) -> String {
    let mut text = format!("listen = \"127.0.0.1:0\"\n{settings}\n");
    for server in servers {
        text.push_str(&format!("[[servers]]\naddr = \"{}\"\n", server.addr()));
    }
    text
}

impl Proxy {
    /// memring over `servers`, with extra top-level config settings.
    pub(crate) fn start(servers: &[&Memcached], settings: &str) -> Proxy {
        Proxy::start_text(&config_text(servers, settings))
    }

    pub(crate) fn start_text(text: &str) -> Proxy {
        let config = Config::parse(text, "test.toml").expect("valid test config");
        Proxy::start_config(config, None)
    }

    /// memring from a config file that it watches for live reloads.
    pub(crate) fn start_file(path: &std::path::Path) -> Proxy {
        let config = Config::load(path).expect("valid test config file");
        Proxy::start_config(config, Some(path))
    }

    fn start_config(config: Config, watch: Option<&std::path::Path>) -> Proxy {
        // memring's logs go to the test's captured output (shown on failure).
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let shutdown = CancellationToken::new();
        let running = runtime
            .block_on(memring::server::start(&config, shutdown.clone()))
            .expect("memring starts");
        if let Some(path) = watch {
            let reloader = memring::control::reload::Reloader::new(
                path.to_path_buf(),
                config.clone(),
                running.pools.clone(),
            );
            let _guard = runtime.enter();
            memring::control::reload::spawn(reloader, shutdown.clone());
        }
        Proxy {
            addr: running.local_addr,
            config,
            shutdown,
            running: Some(running),
            runtime: Some(runtime),
        }
    }

    pub(crate) fn client(&self) -> Client {
        Client::connect(&self.addr.to_string())
    }

    /// The version of the ring currently published.
    pub(crate) fn ring_version(&self) -> u64 {
        self.running().topology.load().version
    }

    pub(crate) fn running(&self) -> &memring::server::Running {
        self.running.as_ref().expect("running")
    }

    /// The index of the server that owns `key` in the topology now published.
    pub(crate) fn owner_now(&self, key: &str) -> usize {
        self.running()
            .topology
            .load()
            .owner_index(key.as_bytes())
            .unwrap()
    }

    /// Runs a future on memring's runtime.
    pub(crate) fn block_on<F: std::future::Future>(&self, future: F) -> F::Output {
        self.runtime.as_ref().expect("runtime").block_on(future)
    }

    /// Requests shutdown and waits for the drain to finish.
    pub(crate) fn shutdown(&mut self) {
        self.shutdown.cancel();
        if let (Some(running), Some(runtime)) = (self.running.take(), self.runtime.as_ref()) {
            runtime.block_on(async {
                let _ = tokio::time::timeout(DEADLINE, running.wait()).await;
            });
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shutdown();
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_timeout(Duration::from_secs(2));
        }
    }
}

/// A blocking memcached text-protocol client.
pub(crate) struct Client {
    stream: TcpStream,
    buffer: Vec<u8>,
}

impl Client {
    pub(crate) fn connect(addr: &str) -> Client {
        let stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        stream
            .set_read_timeout(Some(DEADLINE))
            .expect("set timeout");
        stream.set_nodelay(true).expect("nodelay");
        Client {
            stream,
            buffer: Vec::new(),
        }
    }

    pub(crate) fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("send to server");
    }

    fn fill(&mut self) -> usize {
        let mut chunk = [0u8; 64 * 1024];
        match read_through_signals(&mut self.stream, &mut chunk) {
            Ok(n) => {
                self.buffer.extend_from_slice(&chunk[..n]);
                n
            }
            Err(e) => panic!(
                "read failed (timeout?): {e}; have {:?}",
                String::from_utf8_lossy(&self.buffer)
            ),
        }
    }

    /// Reads one complete reply of the given kind.
    pub(crate) fn reply(&mut self, kind: ReplyKind) -> Vec<u8> {
        loop {
            if let Some(len) = frame_reply(&self.buffer, kind).expect("well-formed reply") {
                return self.buffer.drain(..len).collect();
            }
            assert!(self.fill() > 0, "connection closed before a full reply");
        }
    }

    /// Reads one complete reply, or `None` if the server closed the connection
    /// before sending any byte of it. A reply cut off halfway panics.
    pub(crate) fn try_reply(&mut self, kind: ReplyKind) -> Option<Vec<u8>> {
        loop {
            if let Some(len) = frame_reply(&self.buffer, kind).expect("well-formed reply") {
                return Some(self.buffer.drain(..len).collect());
            }
            let mut chunk = [0u8; 64 * 1024];
            match read_through_signals(&mut self.stream, &mut chunk) {
                Ok(0) if self.buffer.is_empty() => return None,
                Ok(0) => panic!("reply cut off: {:?}", show(&self.buffer)),
                Ok(n) => self.buffer.extend_from_slice(&chunk[..n]),
                Err(e)
                    if e.kind() == std::io::ErrorKind::ConnectionReset
                        && self.buffer.is_empty() =>
                {
                    return None
                }
                Err(e) => panic!("read failed: {e}"),
            }
        }
    }

    /// Reads one meta reply (a line, and a `VA` line's data block), or a
    /// classic one-line or `VALUE` reply piece.
    pub(crate) fn meta_reply(&mut self) -> Vec<u8> {
        loop {
            if let Some(len) = relay::reply_len(&self.buffer) {
                return self.buffer.drain(..len).collect();
            }
            assert!(self.fill() > 0, "connection closed before a full reply");
        }
    }

    /// Sends a request and reads its reply.
    pub(crate) fn call(&mut self, request: &[u8], kind: ReplyKind) -> Vec<u8> {
        self.send(request);
        self.reply(kind)
    }

    /// Reads until the buffered input ends with `suffix`; returns what came
    /// before it.
    pub(crate) fn read_until_suffix(&mut self, suffix: &[u8]) -> Vec<u8> {
        while !self.buffer.ends_with(suffix) {
            assert!(
                self.fill() > 0,
                "connection closed before {:?}; got {:?}",
                String::from_utf8_lossy(suffix),
                String::from_utf8_lossy(&self.buffer)
            );
        }
        let before = self.buffer.len() - suffix.len();
        let out = self.buffer[..before].to_vec();
        self.buffer.clear();
        out
    }

    /// True once the server has closed the connection (after any pending bytes).
    pub(crate) fn closed(&mut self) -> bool {
        self.fill() == 0
    }

    pub(crate) fn set(&mut self, key: &str, value: &[u8]) -> Vec<u8> {
        let mut request = format!("set {key} 0 0 {}\r\n", value.len()).into_bytes();
        request.extend_from_slice(value);
        request.extend_from_slice(b"\r\n");
        self.call(&request, ReplyKind::Line)
    }

    /// The value of `key`, `None` on a miss; panics on an error reply.
    pub(crate) fn get(&mut self, key: &str) -> Option<Vec<u8>> {
        let reply = self.call(format!("get {key}\r\n").as_bytes(), ReplyKind::Values);
        parse_single_value(&reply).unwrap_or_else(|| {
            panic!(
                "get {key}: unexpected reply {:?}",
                String::from_utf8_lossy(&reply)
            )
        })
    }

    /// The raw reply of `get key`.
    pub(crate) fn get_raw(&mut self, key: &str) -> Vec<u8> {
        self.call(format!("get {key}\r\n").as_bytes(), ReplyKind::Values)
    }

    /// The `STAT <name> <value>` lines of `stats` (or `stats <group>`), in
    /// order; memring's and memcached's alike.
    pub(crate) fn stats(&mut self, group: &str) -> Vec<(String, String)> {
        let request = if group.is_empty() {
            "stats\r\n".to_string()
        } else {
            format!("stats {group}\r\n")
        };
        self.send(request.as_bytes());
        let text = String::from_utf8(self.read_until_suffix(b"END\r\n")).unwrap();
        text.lines()
            .filter_map(|l| l.strip_prefix("STAT "))
            .filter_map(|l| l.split_once(' '))
            .map(|(k, v)| (k.to_string(), v.trim().to_string()))
            .collect()
    }

    /// One number of `stats`; panics when it is not there.
    pub(crate) fn stat(&mut self, name: &str) -> u64 {
        self.stats("")
            .into_iter()
            .find(|(k, _)| k == name)
            .unwrap_or_else(|| panic!("no STAT {name}"))
            .1
            .parse()
            .unwrap()
    }
}

/// `Some(None)` for `END`, `Some(Some(value))` for one value, `None` otherwise.
pub(crate) fn parse_single_value(reply: &[u8]) -> Option<Option<Vec<u8>>> {
    if reply == b"END\r\n" {
        return Some(None);
    }
    let header_end = reply.windows(2).position(|w| w == b"\r\n")?;
    let header = std::str::from_utf8(&reply[..header_end]).ok()?;
    let mut fields = header.split(' ');
    if fields.next()? != "VALUE" {
        return None;
    }
    let len: usize = fields.nth(2)?.parse().ok()?;
    let start = header_end + 2;
    let value = reply.get(start..start + len)?.to_vec();
    (reply.get(start + len..)? == b"\r\nEND\r\n").then_some(Some(value))
}

/// What one server holds of `keys`, in their order: each key's value, or
/// `None`. Asked with multi-gets of 8 keys (a get line under 2 KB), so a
/// test that looks behind a proxy at thousands of keys on many servers
/// spends one round trip per 8 keys, not per key.
pub(crate) fn held_values(client: &mut Client, keys: &[&[u8]]) -> Vec<Option<Vec<u8>>> {
    let mut held = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(8) {
        let mut request = b"get".to_vec();
        for key in chunk {
            request.push(b' ');
            request.extend_from_slice(key);
        }
        request.extend_from_slice(b"\r\n");
        let reply = client.call(&request, ReplyKind::Values);
        let mut values: Vec<(&[u8], &[u8])> = Vec::new();
        let mut at = 0;
        while &reply[at..] != b"END\r\n" {
            let bad = || panic!("multi-get reply: {}", show(&reply));
            let Some(line) = reply[at..].windows(2).position(|w| w == b"\r\n") else {
                bad()
            };
            let fields: Vec<&[u8]> = reply[at..at + line].split(|&b| b == b' ').collect();
            let len: Option<usize> = fields
                .get(3)
                .and_then(|f| std::str::from_utf8(f).ok())
                .and_then(|f| f.parse().ok());
            let (Some(len), Some(&b"VALUE"), Some(key)) = (len, fields.first(), fields.get(1))
            else {
                bad()
            };
            let start = at + line + 2;
            match reply.get(start..start + len + 2) {
                Some(value) if value.ends_with(b"\r\n") => values.push((key, &value[..len])),
                _ => bad(),
            }
            at = start + len + 2;
        }
        for key in chunk {
            let value = values
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.to_vec());
            held.push(value);
        }
    }
    held
}

/// Replaces the cas token of every `VALUE` line with `<cas>` (cas ids are per
/// server, so they legitimately differ between one memcached and a pool) and
/// returns the normalised bytes with the cas ids seen, in order.
pub(crate) fn normalize_cas(reply: &[u8]) -> (Vec<u8>, Vec<u64>) {
    let mut out = Vec::with_capacity(reply.len());
    let mut cas_ids = Vec::new();
    let mut at = 0;
    while at < reply.len() {
        let line_end = match reply[at..].windows(2).position(|w| w == b"\r\n") {
            Some(i) => at + i + 2,
            None => {
                out.extend_from_slice(&reply[at..]);
                break;
            }
        };
        let line = &reply[at..line_end - 2];
        let fields: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
        if fields.first() == Some(&&b"VALUE"[..]) && fields.len() >= 4 {
            let len: usize = std::str::from_utf8(fields[3])
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            if fields.len() == 5 {
                cas_ids.push(std::str::from_utf8(fields[4]).unwrap().parse().unwrap());
                out.extend_from_slice(&fields[..4].join(&b' '));
                out.extend_from_slice(b" <cas>\r\n");
            } else {
                out.extend_from_slice(&reply[at..line_end]);
            }
            let data_end = (line_end + len + 2).min(reply.len());
            out.extend_from_slice(&reply[line_end..data_end]);
            at = data_end;
        } else {
            out.extend_from_slice(&reply[at..line_end]);
            at = line_end;
        }
    }
    (out, cas_ids)
}

/// Readable form of protocol bytes for assertion messages.
pub(crate) fn show(bytes: &[u8]) -> String {
    const SHOWN_BYTES: usize = 600;
    let shown = bytes[..bytes.len().min(SHOWN_BYTES)]
        .escape_ascii()
        .to_string();
    if bytes.len() > SHOWN_BYTES {
        format!("{shown}…({} bytes)", bytes.len())
    } else {
        shown
    }
}

/// A Kubernetes example under `config/kubernetes/`: the manifest, and the
/// memring config its ConfigMap embeds (`memring.toml: |`, indented four
/// spaces).
pub(crate) fn kubernetes_example(file: &str) -> (String, String) {
    let manifest = std::fs::read_to_string(format!(
        "{}/config/kubernetes/{file}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let start = manifest
        .find("memring.toml: |\n")
        .expect("the ConfigMap's file")
        + 16;
    let config = manifest[start..]
        .lines()
        .take_while(|line| line.is_empty() || line.starts_with("    "))
        .map(|line| format!("{}\n", line.strip_prefix("    ").unwrap_or("")))
        .collect();
    (manifest, config)
}

/// Sends `get key` until one is answered from the near cache; returns the
/// value it answered with.
pub(crate) fn get_until_near_cached(
    client: &mut Client,
    admin: &mut Client,
    key: &str,
) -> Option<Vec<u8>> {
    let mut value = None;
    wait_for(&format!("{key} served from the near cache"), || {
        let before = admin.stat("near_cache_hits");
        for _ in 0..40 {
            value = client.get(key);
        }
        admin.stat("near_cache_hits") > before
    });
    value
}

/// A memring process (the real binary) on a config file, logging to a file,
/// killed by PID on drop.
pub(crate) struct Daemon {
    child: Child,
    log: std::path::PathBuf,
}

impl Daemon {
    /// Starts memring with `args` before `--config config`; it does not wait
    /// for the process to be ready (see [`Daemon::wait_for_log`]).
    pub(crate) fn start(config: &std::path::Path, log: &std::path::Path, args: &[&str]) -> Daemon {
        let log_file = std::fs::File::create(log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_memring"))
            .args(args)
            .arg("--config")
            .arg(config)
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .unwrap();
        Daemon {
            child,
            log: log.to_path_buf(),
        }
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Log lines that contain `text`.
    pub(crate) fn count(&self, text: &str) -> usize {
        self.log().lines().filter(|l| l.contains(text)).count()
    }

    pub(crate) fn wait_for_log(&self, text: &str) {
        wait_for(&format!("log line `{text}`"), || self.count(text) > 0);
    }

    pub(crate) fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id()))
            .map(|dir| dir.count())
            .unwrap_or(0)
    }

    /// Resident memory in KiB.
    pub(crate) fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }

    /// SIGHUP: reload the config.
    pub(crate) fn hang_up(&self) {
        let status = Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
