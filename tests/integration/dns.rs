//! Host names and `[discovery]` against a real DNS server: Debian's dnsmasq
//! on a free loopback port, started and killed by PID here, authoritative
//! for `test.local` (names it does not list are NXDOMAIN) and asked by
//! memring through `[discovery] resolver`, never the system's resolver. A
//! record change is a rewrite of its hosts file and SIGHUP (A records) or a
//! restart on the same port (SRV records, given on its command line).
//!
//! memring runs as the real binary, logging to a file, so that the tests can
//! hold it to its log lines. Memcached runs on 127.0.0.1 and, to give a name
//! a new address, on 127.0.0.2 and 127.0.0.3 (all of 127.0.0.0/8 is
//! loopback).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use memring::protocol::ReplyKind;

use crate::common::pki::{Issued, Pki};
use crate::common::{free_port, show, wait_for, Client, Memcached, TempDir, DEADLINE};

const BIN: &str = env!("CARGO_BIN_EXE_memring");
const SRV_NAME: &str = "_memcache._tcp.test.local";

/// dnsmasq lives in /usr/sbin, which a user's PATH may not have.
fn dnsmasq() -> &'static str {
    let in_path = Command::new("dnsmasq")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if in_path {
        "dnsmasq"
    } else {
        "/usr/sbin/dnsmasq"
    }
}

fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{name} {pid}");
}

static NEXT_DNSMASQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// One SRV record: target, port, weight.
type Srv = (String, u16, u16);

/// A dnsmasq process answering for `test.local` on a loopback port.
struct Dnsmasq {
    port: u16,
    /// The domain it answers for alone, and the SRV name in it.
    domain: String,
    /// A name only this instance knows: its start waits for it, so that a
    /// port another test's dnsmasq took meanwhile never passes for ours.
    ready: String,
    srv_name: String,
    hosts: PathBuf,
    srv: Vec<Srv>,
    /// `--txt-record` names: they exist, with no SRV or address record.
    txt: Vec<String>,
    child: Option<Child>,
}

impl Dnsmasq {
    /// Serves `hosts` (lines of `/etc/hosts` form) and the SRV records of
    /// `_memcache._tcp.test.local`.
    fn start(dir: &TempDir, hosts: &str, srv: &[Srv]) -> Dnsmasq {
        Dnsmasq::start_for(dir, "test.local", SRV_NAME, hosts, srv)
    }

    /// The same for another domain and SRV name.
    fn start_for(dir: &TempDir, domain: &str, srv_name: &str, hosts: &str, srv: &[Srv]) -> Dnsmasq {
        let mut dns = Dnsmasq {
            port: 0,
            domain: domain.to_string(),
            ready: format!(
                "ready-{}-{}.{domain}",
                std::process::id(),
                NEXT_DNSMASQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            ),
            srv_name: srv_name.to_string(),
            hosts: dir.path("dnsmasq.hosts"),
            srv: srv.to_vec(),
            txt: Vec::new(),
            child: None,
        };
        dns.write_hosts(hosts);
        for _ in 0..10 {
            dns.port = free_port();
            if dns.spawn() {
                return dns;
            }
        }
        panic!("dnsmasq did not start on a free port");
    }

    /// The hosts file always has the instance's `ready` name.
    fn write_hosts(&self, hosts: &str) {
        let ready = format!("127.0.0.1 {}\n", self.ready);
        std::fs::write(&self.hosts, format!("{ready}{hosts}")).unwrap();
    }

    fn spawn(&mut self) -> bool {
        let mut command = Command::new(dnsmasq());
        command
            .args([
                "--no-daemon",
                "--conf-file=/dev/null",
                "--no-resolv",
                "--no-hosts",
                "--listen-address=127.0.0.1",
                "--bind-interfaces",
                "--pid-file=",
                "--quiet-dhcp",
            ])
            .arg(format!("--local=/{}/", self.domain))
            .arg(format!("--port={}", self.port))
            .arg(format!("--addn-hosts={}", self.hosts.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        for (target, port, weight) in &self.srv {
            command.arg(format!(
                "--srv-host={},{target},{port},0,{weight}",
                self.srv_name
            ));
        }
        for name in &self.txt {
            command.arg(format!("--txt-record={name},memring-test"));
        }
        if crate::common::running_as_root() {
            command.arg("--user=root");
        }
        let mut child = command
            .spawn()
            .expect("dnsmasq must be installed (scripts/test installs it)");
        let start = Instant::now();
        loop {
            if let Ok(Some(_)) = child.try_wait() {
                // The port was taken meanwhile.
                return false;
            }
            if self.lookup(&self.ready).is_ok() {
                self.child = Some(child);
                return true;
            }
            if start.elapsed() > DEADLINE {
                let _ = child.kill();
                let _ = child.wait();
                panic!("dnsmasq on port {} did not answer", self.port);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// `resolver = ...` for memring's config.
    fn resolver(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn dns(&self) -> memring::inputs::resolve::Dns {
        memring::inputs::resolve::Dns {
            server: Some(self.resolver().parse().unwrap()),
        }
    }

    fn lookup(&self, host: &str) -> Result<Vec<SocketAddr>, memring::inputs::resolve::DnsError> {
        let dns = self.dns();
        memring::inputs::resolve::block_on(|| async move { dns.addresses(host, 1).await })
    }

    /// New A records: the hosts file rewritten, then SIGHUP; returns once
    /// dnsmasq answers with them.
    fn set_hosts(&self, hosts: &str, check: (&str, Option<&str>)) {
        self.write_hosts(hosts);
        signal(self.child.as_ref().expect("running").id(), "HUP");
        let (host, ip) = check;
        wait_for(
            &format!("dnsmasq to answer {host} with {ip:?}"),
            || match (self.lookup(host), ip) {
                (Ok(found), Some(ip)) => found.iter().any(|a| a.ip().to_string() == ip),
                (Err(e), None) => e.failure == memring::inputs::resolve::DnsFailure::NoSuchName,
                _ => false,
            },
        );
    }

    /// New SRV records (and TXT-only names): a restart on the same port.
    fn set_srv(&mut self, srv: &[Srv], txt: &[&str]) {
        self.kill();
        self.srv = srv.to_vec();
        self.txt = txt.iter().map(|s| s.to_string()).collect();
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

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A memcached on any loopback address (the harness's listens on
/// 127.0.0.1 only).
struct Loopback {
    ip: &'static str,
    port: u16,
    child: Child,
}

impl Loopback {
    /// A memcached on `ip` at a free port.
    fn start(ip: &'static str) -> Loopback {
        for _ in 0..10 {
            if let Some(server) = Loopback::start_at(ip, free_port()) {
                return server;
            }
        }
        panic!("no free port for memcached on {ip}");
    }

    /// A memcached on `ip:port`; `None` if another process has the port.
    /// Ready once the memcached there reports our child's pid: a port
    /// taken meanwhile by another test's server must not pass for ours.
    fn start_at(ip: &'static str, port: u16) -> Option<Loopback> {
        let mut command = Command::new("memcached");
        command
            .args([
                "-l",
                ip,
                "-p",
                &port.to_string(),
                "-U",
                "0",
                "-t",
                "1",
                "-m",
                "64",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if crate::common::running_as_root() {
            command.args(["-u", "root"]);
        }
        let mut child = command.spawn().expect("memcached must be installed");
        let start = Instant::now();
        loop {
            if let Ok(Some(_)) = child.try_wait() {
                return None;
            }
            if let Some(pid) = crate::common::answering_pid_at(ip, port) {
                if pid == child.id() {
                    return Some(Loopback { ip, port, child });
                }
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "memcached on {ip}:{port} did not start"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn addr(&self) -> String {
        format!("{}:{}", self.ip, self.port)
    }

    fn client(&self) -> Client {
        Client::connect(&self.addr())
    }
}

impl Drop for Loopback {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The memring binary with a config file, logging to a file, killed by PID
/// on drop.
struct Daemon {
    child: Child,
    log: PathBuf,
    addr: String,
}

impl Daemon {
    /// Starts memring on a free port with `config` (which must not set
    /// `listen`) and waits until it accepts clients.
    fn start(dir: &TempDir, config: &str) -> Daemon {
        for _ in 0..10 {
            let port = free_port();
            let path = dir.path("memring.toml");
            std::fs::write(&path, format!("listen = \"127.0.0.1:{port}\"\n{config}")).unwrap();
            let log = dir.path("memring.log");
            let child = Command::new(BIN)
                .args(["--log-level", "info,memring::control::discovery=debug"])
                .arg("--config")
                .arg(&path)
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap();
            let mut daemon = Daemon {
                child,
                log,
                addr: format!("127.0.0.1:{port}"),
            };
            // Its own log says it listens: a port taken meanwhile by another
            // process must not pass for memring's.
            let start = Instant::now();
            while daemon.count("memring started") == 0 {
                if let Ok(Some(status)) = daemon.child.try_wait() {
                    if daemon.count("cannot listen") > 0 {
                        break;
                    }
                    panic!("memring exited ({status}): {}", daemon.log());
                }
                assert!(
                    start.elapsed() < DEADLINE,
                    "memring did not start: {}",
                    daemon.log()
                );
                std::thread::sleep(Duration::from_millis(10));
            }
            if daemon.count("memring started") > 0 {
                return daemon;
            }
        }
        panic!("no free port for memring");
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn count(&self, text: &str) -> usize {
        self.log().lines().filter(|l| l.contains(text)).count()
    }

    fn wait_for_log(&self, text: &str) {
        let start = Instant::now();
        while self.count(text) == 0 {
            assert!(
                start.elapsed() < DEADLINE,
                "no log line `{text}` in:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The first log line containing `text`.
    fn line(&self, text: &str) -> String {
        self.log()
            .lines()
            .find(|l| l.contains(text))
            .unwrap_or_default()
            .to_string()
    }

    fn client(&self) -> Client {
        Client::connect(&self.addr)
    }

    fn stat(&self, name: &str) -> Option<String> {
        self.client()
            .stats("")
            .into_iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `memring ARGS`, its status, stdout and stderr.
fn memring(args: &[&str]) -> (bool, String, String) {
    let output = Command::new(BIN).args(args).output().unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Keys `prefix0..prefixN`.
fn keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

#[test]
fn a_server_given_by_host_name_is_found_through_the_configured_resolver() {
    let dir = TempDir::new("dns", "by-name");
    let cache = Loopback::start("127.0.0.2");
    let dns = Dnsmasq::start(&dir, "127.0.0.2 cache-0.test.local\n", &[]);
    let daemon = Daemon::start(
        &dir,
        &format!(
            "[discovery]\nresolver = \"{}\"\n[[servers]]\naddr = \"cache-0.test.local:{}\"\n",
            dns.resolver(),
            cache.port
        ),
    );
    let mut client = daemon.client();
    assert_eq!(client.set("by-name", b"v1"), b"STORED\r\n");
    assert_eq!(client.get("by-name").as_deref(), Some(&b"v1"[..]));
    // It is on the memcached the name points to.
    assert_eq!(cache.client().get("by-name").as_deref(), Some(&b"v1"[..]));
    // Ring identity is the name as written, and so is the stats line.
    assert_eq!(
        daemon.stat(&format!("server:cache-0.test.local:{}:addr", cache.port)),
        Some(format!("cache-0.test.local:{}", cache.port))
    );
}

#[test]
fn a_name_whose_address_changes_keeps_its_keys_and_its_connections_move() {
    let dir = TempDir::new("dns", "readdress");
    let old = Loopback::start("127.0.0.2");
    let port = old.port;
    let other = Loopback::start("127.0.0.1");
    let dns = Dnsmasq::start(
        &dir,
        "127.0.0.2 cache-0.test.local\n127.0.0.1 cache-1.test.local\n",
        &[],
    );
    let daemon = Daemon::start(
        &dir,
        &format!(
            "[discovery]\nresolver = \"{}\"\ninterval_ms = 100\n\
             [[servers]]\naddr = \"cache-0.test.local:{port}\"\n\
             [[servers]]\naddr = \"cache-1.test.local:{}\"\n",
            dns.resolver(),
            other.port
        ),
    );
    let keys = keys("moving-", 300);
    let mut client = daemon.client();
    for key in &keys {
        assert_eq!(client.set(key, b"before"), b"STORED\r\n");
    }
    let on_old: Vec<&String> = keys
        .iter()
        .filter(|k| old.client().get(k).is_some())
        .collect();
    let on_other: Vec<&String> = keys
        .iter()
        .filter(|k| other.client().get(k).is_some())
        .collect();
    assert_eq!(on_old.len() + on_other.len(), keys.len());
    assert!(
        on_old.len() > 50 && on_other.len() > 50,
        "{} {}",
        on_old.len(),
        on_other.len()
    );

    // The pod comes back elsewhere: the old one still answers (its
    // connections would work), but the name now means the new one.
    // Only this test listens on 127.0.0.3.
    let new = Loopback::start_at("127.0.0.3", port).expect("the port is free on 127.0.0.3");
    dns.set_hosts(
        "127.0.0.3 cache-0.test.local\n127.0.0.1 cache-1.test.local\n",
        ("cache-0.test.local", Some("127.0.0.3")),
    );
    daemon.wait_for_log("now resolves to 127.0.0.3");
    let probe = on_old[0];
    wait_for("writes to reach the new address", || {
        client.set(probe, b"after");
        new.client().get(probe).is_some()
    });
    for key in &keys {
        assert_eq!(client.set(key, b"after"), b"STORED\r\n");
    }
    // Every key of the name is on its new address, none on the old one or
    // on the other server: the name kept its place on the ring.
    for key in &on_old {
        assert_eq!(
            new.client().get(key).as_deref(),
            Some(&b"after"[..]),
            "{key}"
        );
        // (The probe may have been written there before the move.)
        if *key != probe {
            assert_eq!(
                old.client().get(key).as_deref(),
                Some(&b"before"[..]),
                "{key}"
            );
        }
        assert_eq!(other.client().get(key), None, "{key}");
    }
    for key in &on_other {
        assert_eq!(
            other.client().get(key).as_deref(),
            Some(&b"after"[..]),
            "{key}"
        );
        assert_eq!(new.client().get(key), None, "{key}");
    }
    // Keys stay: no membership change, no keyspace moved.
    let line = daemon.line("readdressed by DNS");
    assert!(
        line.contains("servers unchanged, 0.0% of keyspace moves"),
        "{line}"
    );
}

#[test]
fn a_name_that_stops_resolving_fails_fast_like_a_dead_server_and_is_logged_once() {
    let dir = TempDir::new("dns", "gone");
    let cache = Loopback::start("127.0.0.1");
    let other = Loopback::start("127.0.0.1");
    let hosts = "127.0.0.1 cache-0.test.local\n127.0.0.1 cache-1.test.local\n";
    let dns = Dnsmasq::start(&dir, hosts, &[]);
    let interval = Duration::from_millis(100);
    let daemon = Daemon::start(
        &dir,
        &format!(
            "[discovery]\nresolver = \"{}\"\ninterval_ms = {}\n\
             [[servers]]\naddr = \"cache-0.test.local:{}\"\n\
             [[servers]]\naddr = \"cache-1.test.local:{}\"\n",
            dns.resolver(),
            interval.as_millis(),
            cache.port,
            other.port
        ),
    );
    let mut client = daemon.client();
    let keys = keys("gone-", 200);
    for key in &keys {
        assert_eq!(client.set(key, b"v"), b"STORED\r\n");
    }
    let on_gone: Vec<&String> = keys
        .iter()
        .filter(|k| cache.client().get(k).is_some())
        .collect();
    assert!(!on_gone.is_empty());

    // The name goes from DNS; its memcached still runs.
    dns.set_hosts(
        "127.0.0.1 cache-1.test.local\n",
        ("cache-0.test.local", None),
    );
    let name = format!("cache-0.test.local:{}", cache.port);
    daemon.wait_for_log("-> DEAD");
    let dead = daemon.line("-> DEAD");
    assert!(dead.contains(&name), "{dead}");
    assert!(
        dead.contains("cannot resolve its host name (no such name)"),
        "{dead}"
    );
    // The DNS error, in words.
    let words = "`cache-0.test.local` does not exist (NXDOMAIN)";
    assert!(daemon.count(words) >= 1, "{}", daemon.log());
    assert_eq!(daemon.count("uncategorized"), 0, "{}", daemon.log());
    // Its keys fail at once, the others' are served.
    let started = Instant::now();
    let reply = client.get_raw(on_gone[0]);
    assert!(started.elapsed() < Duration::from_millis(500));
    assert!(
        reply.starts_with(b"SERVER_ERROR"),
        "{}",
        String::from_utf8_lossy(&reply)
    );
    let kept: Vec<&String> = keys.iter().filter(|k| !on_gone.contains(k)).collect();
    assert_eq!(client.get(kept[0]).as_deref(), Some(&b"v"[..]));
    // Counted against the server, as `resolve` errors.
    let errors: u64 = daemon
        .stat(&format!("server:{name}:errors"))
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!(errors >= 1);
    // Logged once per episode: many rounds and requests later, the words
    // are in the log once from the rounds and once from the connections.
    let watch = Instant::now();
    while watch.elapsed() < interval * 8 {
        let _ = client.get_raw(on_gone[0]);
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(daemon.count(words) <= 2, "{}", daemon.log());
    assert_eq!(daemon.count("-> DEAD"), 1, "{}", daemon.log());

    // Back in DNS: it serves again.
    dns.set_hosts(hosts, ("cache-0.test.local", Some("127.0.0.1")));
    wait_for("the server to serve again", || {
        client.get_raw(on_gone[0]).starts_with(b"VALUE")
    });
    daemon.wait_for_log("resolves again");
}

#[test]
fn check_looks_up_every_name_and_says_which_do_not_resolve() {
    let dir = TempDir::new("dns", "check");
    let dns = Dnsmasq::start(
        &dir,
        "127.0.0.1 cache-0.test.local\n",
        &[("cache-0.test.local".into(), 11211, 1)],
    );
    let path = dir.path("check.toml");
    let write = |body: &str| {
        std::fs::write(
            &path,
            format!(
                "listen = \"127.0.0.1:22122\"\n[discovery]\nresolver = \"{}\"\n{body}",
                dns.resolver()
            ),
        )
        .unwrap();
    };
    write("[[servers]]\naddr = \"cache-0.test.local:11211\"\n[[servers]]\naddr = \"cache-9.test.local:11211\"\n");
    let (ok, stdout, stderr) = memring(&["check", path.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("ok (2 servers"), "{stdout}");
    assert_eq!(stderr.matches("does not resolve").count(), 1, "{stderr}");
    assert!(
        stderr.contains("server `cache-9.test.local:11211` (line 7): `cache-9.test.local` does not resolve (`cache-9.test.local` does not exist (NXDOMAIN))"),
        "{stderr}"
    );

    // Discovery records: listed, and their targets looked up.
    write(&format!("srv = \"{SRV_NAME}\"\n"));
    let (ok, stdout, stderr) = memring(&["check", path.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains(&format!(
            "[discovery] srv {SRV_NAME} lists 1 server: cache-0.test.local:11211"
        )),
        "{stdout}"
    );
    assert!(stdout.contains("ok (1 server"), "{stdout}");
    // Records that list nothing: memring could not start, and check says so.
    write("srv = \"_memcache._tcp.nothing.test.local\"\n");
    let (ok, _, stderr) = memring(&["check", path.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        stderr.contains("`_memcache._tcp.nothing.test.local` does not exist (NXDOMAIN); memring could not start"),
        "{stderr}"
    );
    // --offline asks nothing.
    let (ok, stdout, stderr) = memring(&["check", "--offline", path.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("ok (0 servers"), "{stdout}");
}

/// Three memcacheds on 127.0.0.1, named s1..s3.test.local.
fn three_servers() -> (Vec<Loopback>, String) {
    let servers: Vec<Loopback> = (0..3).map(|_| Loopback::start("127.0.0.1")).collect();
    let hosts = (1..=3)
        .map(|i| format!("127.0.0.1 s{i}.test.local\n"))
        .collect();
    (servers, hosts)
}

fn srv_of(servers: &[Loopback], which: &[usize]) -> Vec<Srv> {
    which
        .iter()
        .map(|&i| (format!("s{}.test.local", i + 1), servers[i].port, 1))
        .collect()
}

fn discovery_config(dns: &Dnsmasq, interval_ms: u64, extra: &str) -> String {
    format!(
        "{extra}\n[discovery]\nsrv = \"{SRV_NAME}\"\ninterval_ms = {interval_ms}\nresolver = \"{}\"\n",
        dns.resolver()
    )
}

/// GET `path` from the admin listener at `addr`: the body.
fn http_get(addr: &str, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(DEADLINE)).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    reply
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default()
}

#[test]
fn discovery_adds_and_removes_servers_with_hand_off_under_reads() {
    let dir = TempDir::new("dns", "membership");
    let (servers, hosts) = three_servers();
    let mut dns = Dnsmasq::start(&dir, &hosts, &srv_of(&servers, &[0, 1]));
    let admin = format!("127.0.0.1:{}", free_port());
    let daemon = Daemon::start(
        &dir,
        &discovery_config(&dns, 100, &format!("admin_listen = \"{admin}\"")),
    );
    let name = |i: usize| format!("s{}.test.local:{}", i + 1, servers[i].port);
    assert_eq!(
        daemon.stat("discovery_server_list"),
        Some(format!("{},{}", name(0), name(1)))
    );
    let keys = keys("member-", 2000);
    let mut client = daemon.client();
    for key in &keys {
        assert_eq!(client.set(key, b"v"), b"STORED\r\n");
    }
    let (mut hits, mut reads) = (0usize, 0usize);
    let mut read_until = |client: &mut Client, line: &str| {
        let start = Instant::now();
        let mut passes_after = 0;
        // Reads go on through the change and one full pass after it.
        while passes_after < 1 {
            let seen = daemon.count(line) > 0;
            for key in &keys {
                reads += 1;
                hits += usize::from(client.get(key).is_some());
            }
            passes_after += usize::from(seen);
            assert!(start.elapsed() < DEADLINE, "no `{line}`:\n{}", daemon.log());
        }
    };

    dns.set_srv(&srv_of(&servers, &[0, 1, 2]), &[]);
    let added = format!("+1 server ({})", name(2));
    read_until(&mut client, &added);
    dns.set_srv(&srv_of(&servers, &[1, 2]), &[]);
    let removed = format!("-1 server ({})", name(0));
    read_until(&mut client, &removed);

    let ratio = hits as f64 / reads as f64;
    println!("hit ratio through two discovery changes: {hits}/{reads} = {ratio:.4}");
    assert!(ratio >= 0.995, "{hits} of {reads} reads hit");
    // The same line as a config edit: the moved share and the window.
    for line in [daemon.line(&added), daemon.line(&removed)] {
        assert!(
            line.contains("% of keyspace moves; hand-off window 300s"),
            "{line}"
        );
        assert!(
            line.contains(&format!("(discovery: srv {SRV_NAME})")),
            "{line}"
        );
    }
    let share: f64 = daemon
        .line(&added)
        .split(", ")
        .nth(1)
        .and_then(|rest| rest.split('%').next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!(
        (20.0..45.0).contains(&share),
        "a third of the keyspace moves: {share}"
    );
    // stats and /metrics show the list and when it changed.
    assert_eq!(
        daemon.stat("discovery_server_list"),
        Some(format!("{},{}", name(1), name(2)))
    );
    assert_eq!(daemon.stat("discovery_servers").as_deref(), Some("2"));
    assert_eq!(daemon.stat("discovery_changes").as_deref(), Some("2"));
    let changed: u64 = daemon
        .stat("discovery_last_change")
        .unwrap()
        .parse()
        .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(now.abs_diff(changed) < 120, "{changed} {now}");
    let metrics = http_get(&admin, "/metrics");
    assert!(
        metrics.contains("memring_discovery_servers 2\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!(
            "memring_discovery_server{{server=\"{}\"}} 1",
            name(2)
        )),
        "{metrics}"
    );
    assert!(!metrics.contains(&format!(
        "memring_discovery_server{{server=\"{}\"}}",
        name(0)
    )));
    assert!(metrics.contains(&format!("memring_discovery_last_change_seconds {changed}")));
}

#[test]
fn discovery_keeps_the_last_good_list_when_dns_goes_away_or_answers_empty() {
    let dir = TempDir::new("dns", "outage");
    let (servers, hosts) = three_servers();
    let mut dns = Dnsmasq::start(&dir, &hosts, &srv_of(&servers, &[0, 1]));
    let daemon = Daemon::start(&dir, &discovery_config(&dns, 100, ""));
    let keys = keys("outage-", 200);
    let mut client = daemon.client();
    for key in &keys {
        assert_eq!(client.set(key, b"v"), b"STORED\r\n");
    }
    let version = daemon.stat("ring_version");
    let failures = || -> u64 {
        daemon
            .stat("discovery_lookup_failures")
            .and_then(|v| v.parse().ok())
            .unwrap()
    };

    // The DNS server goes away: many rounds fail, the ring stays.
    dns.kill();
    // A DNS server that is gone costs a round its lookup timeouts.
    wait_for("two failed rounds", || failures() >= 2);
    assert_eq!(daemon.stat("ring_version"), version);
    assert_eq!(daemon.stat("discovery_servers").as_deref(), Some("2"));
    assert_eq!(daemon.stat("discovery_failing").as_deref(), Some("1"));
    assert_eq!(
        daemon.count("keeping the last good list of 2 servers"),
        1,
        "{}",
        daemon.log()
    );
    for key in &keys {
        assert!(client.get(key).is_some(), "{key}");
    }

    // Back, then an empty answer: the name exists with no SRV record.
    dns.set_srv(&[], &[SRV_NAME]);
    daemon.wait_for_log("has no SRV records");
    let before = failures();
    wait_for("three more failed rounds", || failures() >= before + 3);
    assert_eq!(daemon.stat("ring_version"), version);
    let empty = daemon.line(&format!("`{SRV_NAME}` has no SRV records"));
    assert!(
        empty.contains("keeping the last good list of 2 servers"),
        "{}",
        daemon.log()
    );
    assert_eq!(daemon.count("has no SRV records"), 1, "{}", daemon.log());
    for key in &keys {
        assert!(client.get(key).is_some(), "{key}");
    }
    // Records again: a change like any other.
    dns.set_srv(&srv_of(&servers, &[0, 1, 2]), &[]);
    daemon.wait_for_log("+1 server (s3.test.local:");
    assert_eq!(daemon.stat("discovery_failing").as_deref(), Some("0"));
    daemon.wait_for_log("answers again");
}

#[test]
fn discovery_keeps_every_server_when_dns_says_no_name_exists_or_answers_empty() {
    let dir = TempDir::new("dns", "every-name");
    let (servers, hosts) = three_servers();
    let mut dns = Dnsmasq::start(&dir, &hosts, &srv_of(&servers, &[0, 1, 2]));
    // Generous timeouts: a lookup that DNS fails answers at once, and only a
    // loaded machine (a CI run) makes a connect or a get take long; this test
    // is about DNS answers, not about load.
    let timeouts = "connect_timeout_ms = 5000\nrequest_timeout_ms = 5000";
    let daemon = Daemon::start(&dir, &discovery_config(&dns, 100, timeouts));
    let keys = keys("every-name-", 300);
    let mut client = daemon.client();
    for key in &keys {
        assert_eq!(client.set(key, b"v"), b"STORED\r\n");
    }
    let version = daemon.stat("ring_version");
    let failures = || -> u64 {
        daemon
            .stat("discovery_lookup_failures")
            .and_then(|v| v.parse().ok())
            .unwrap()
    };
    let outage = "taken for a DNS outage or a bad zone";
    // A bad zone push: the SRV name and every server's name are NXDOMAIN,
    // then (names kept, with no records) an empty answer for each.
    let no_records: Vec<&str> = vec![SRV_NAME, "s1.test.local", "s2.test.local", "s3.test.local"];
    for (phase, txt) in [("NXDOMAIN", vec![]), ("empty", no_records)] {
        dns.write_hosts("");
        dns.set_srv(&[], &txt);
        let before = failures();
        wait_for(&format!("{phase}: five failed rounds"), || {
            failures() >= before + 5
        });
        // Every key is served all along: no server failed.
        for key in &keys {
            assert_eq!(
                client.get(key).as_deref(),
                Some(&b"v"[..]),
                "{phase}: {key}"
            );
        }
        assert_eq!(daemon.stat("ring_version"), version, "{phase}");
        assert_eq!(daemon.count("-> DEAD"), 0, "{phase}: {}", daemon.log());
        assert_eq!(daemon.count("readdressed"), 0, "{phase}: {}", daemon.log());
        daemon.wait_for_log(outage);
        // Back to normal between the phases.
        dns.write_hosts(&hosts);
        dns.set_srv(&srv_of(&servers, &[0, 1, 2]), &[]);
        daemon.wait_for_log("server host names resolve again");
        wait_for("the episode to end", || {
            daemon.count("server host names resolve again") >= daemon.count(outage)
        });
    }
    // Logged once per episode, not once per name or round.
    assert_eq!(daemon.count(outage), 2, "{}", daemon.log());
    // A name that fails a round before the others is logged as its own
    // failure (right for one name alone) until every name fails and the
    // outage rule applies: such a line may come only before its episode's
    // outage line, never during the outage.
    let log = daemon.log();
    let (mut during, mut before_outage) = (false, 0);
    for line in log.lines() {
        if line.contains(outage) {
            during = true;
            before_outage = 0;
        } else if line.contains("server host names resolve again") {
            during = false;
        } else if line.contains("does not exist (NXDOMAIN):") {
            assert!(!during, "one name's failure logged in the outage: {log}");
            before_outage += 1;
        }
    }
    assert_eq!(
        before_outage, 0,
        "a name's failure with no outage after: {log}"
    );

    // A connection made while every name is missing goes to the last good
    // address.
    let target = memring::inputs::resolve::Target::new(
        &format!("s1.test.local:{}", servers[0].port),
        dns.dns(),
    );
    let first = memring::inputs::resolve::block_on(|| target.addresses("s1"));
    assert_eq!(first.as_ref().map(Vec::len), Ok(1));
    dns.write_hosts("");
    dns.set_srv(&[], &[]);
    assert!(dns.lookup("s1.test.local").is_err());
    assert_eq!(
        memring::inputs::resolve::block_on(|| target.addresses("s1")),
        first
    );
}

#[test]
fn plan_discovery_prints_the_plan_of_the_equal_config_edit() {
    let dir = TempDir::new("dns", "plan");
    let (servers, hosts) = three_servers();
    let mut dns = Dnsmasq::start(&dir, &hosts, &srv_of(&servers, &[0, 1]));
    // An interval long enough that memring itself does not apply the change.
    let daemon = Daemon::start(&dir, &discovery_config(&dns, 3_600_000, ""));
    dns.set_srv(&srv_of(&servers, &[0, 1, 2]), &[]);
    let config = dir.path("memring.toml");
    let (ok, stdout, stderr) = memring(&["plan", "--discovery", config.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    let (first, plan) = stdout.split_once('\n').unwrap();
    assert_eq!(
        first,
        format!(
            "discovery: srv {SRV_NAME}: 2 servers in use at {}, 3 listed now",
            daemon.addr
        )
    );
    // The same as `plan OLD NEW` for the config edit that lists the servers.
    let listed = |which: &[usize]| -> PathBuf {
        let mut text = format!(
            "listen = \"{}\"\n[discovery]\nresolver = \"{}\"\ninterval_ms = 3600000\n",
            daemon.addr,
            dns.resolver()
        );
        for &i in which {
            text.push_str(&format!(
                "[[servers]]\naddr = \"s{}.test.local:{}\"\n",
                i + 1,
                servers[i].port
            ));
        }
        let path = dir.path(&format!("servers-{}.toml", which.len()));
        std::fs::write(&path, text).unwrap();
        path
    };
    let (old, new) = (listed(&[0, 1]), listed(&[0, 1, 2]));
    let (ok, edit, stderr) = memring(&["plan", old.to_str().unwrap(), new.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    assert_eq!(plan, edit);
    assert!(plan.contains("change: +1 server (s3.test.local:"), "{plan}");
    // memring itself still runs on the two it had.
    assert_eq!(daemon.stat("discovery_servers").as_deref(), Some("2"));
    // No discovery in the config: a clear error.
    let (ok, _, stderr) = memring(&["plan", "--discovery", old.to_str().unwrap()]);
    assert!(!ok);
    assert!(stderr.contains("no [discovery] srv or a"), "{stderr}");
}

/// The config embedded in the StatefulSet example passes `memring check`:
/// on its own, and with DNS answering for the names the manifest defines.
#[test]
fn the_kubernetes_discovery_example_config_checks() {
    let (manifest, config) = crate::common::kubernetes_example("discovery.yaml");
    let srv = config
        .lines()
        .find_map(|l| l.strip_prefix("srv = \""))
        .and_then(|l| l.strip_suffix('"'))
        .expect("the config discovers by SRV");
    let dir = TempDir::new("dns", "kubernetes");
    let path = dir.path("memring.toml");
    std::fs::write(&path, &config).unwrap();
    let (ok, stdout, stderr) = memring(&["check", "--offline", path.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains(": ok ("), "{stdout}");

    // What the cluster's DNS would answer for the headless service: one SRV
    // record per pod of the StatefulSet, named <pod>.<service>.<namespace>.
    let domain = srv.splitn(3, '.').nth(2).unwrap();
    let pods: Vec<String> = (0..3).map(|i| format!("memcached-{i}.{domain}")).collect();
    let hosts: String = pods.iter().map(|p| format!("127.0.0.1 {p}\n")).collect();
    let records: Vec<Srv> = pods.iter().map(|p| (p.clone(), 11211, 1)).collect();
    assert!(manifest.contains("replicas: 3"));
    let dns = Dnsmasq::start_for(&dir, domain, srv, &hosts, &records);
    let text = config.replacen(
        "[discovery]\n",
        &format!("[discovery]\nresolver = \"{}\"\n", dns.resolver()),
        1,
    );
    std::fs::write(&path, &text).unwrap();
    let (ok, stdout, stderr) = memring(&["check", path.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains(&format!("lists 3 servers: {}:11211", pods[0])),
        "{stdout}"
    );
    assert!(!stderr.contains("does not resolve"), "{stderr}");
}

/// Three `memcached -Z` on 127.0.0.1 (each with a plain port to look behind
/// memring), named s1..s3.test.local, and the hosts lines for the names.
/// `certs[i]` is the certificate server i presents.
fn tls_servers(certs: [&Issued; 3]) -> (Vec<Memcached>, String) {
    let servers = certs
        .iter()
        .map(|cert| Memcached::start_tls(&cert.cert, &cert.key, None))
        .collect();
    let hosts = (1..=3)
        .map(|i| format!("127.0.0.1 s{i}.test.local\n"))
        .collect();
    (servers, hosts)
}

/// SRV records for the TLS ports of `which` servers.
fn tls_srv_of(servers: &[Memcached], which: &[usize]) -> Vec<Srv> {
    which
        .iter()
        .map(|&i| {
            let port = servers[i].tls_port.expect("started with TLS");
            (format!("s{}.test.local", i + 1), port, 1)
        })
        .collect()
}

/// `[discovery]` with `tls = true`, verified by `ca` (generous timeouts:
/// handshakes on a loaded 2-core machine take a while).
fn tls_discovery_config(dns: &Dnsmasq, ca: &std::path::Path) -> String {
    format!(
        "connect_timeout_ms = 3000\nrequest_timeout_ms = 3000\n\
         [backend_tls]\nca_file = \"{}\"\n\
         [discovery]\nsrv = \"{SRV_NAME}\"\ninterval_ms = 100\nresolver = \"{}\"\ntls = true\n",
        ca.display(),
        dns.resolver()
    )
}

#[test]
fn discovered_tls_servers_serve_and_change_membership_with_hand_off() {
    let pki = Pki::new("discovered");
    // One wildcard certificate for every server, as for the pods of a
    // StatefulSet (docs/kubernetes.md): each is verified by its SRV name.
    let cert = pki.issue("servers", &["*.test.local"], false);
    let (servers, hosts) = tls_servers([&cert, &cert, &cert]);
    let dir = TempDir::new("dns", "discovered-tls");
    let mut dns = Dnsmasq::start(&dir, &hosts, &tls_srv_of(&servers, &[0, 1]));
    let daemon = Daemon::start(&dir, &tls_discovery_config(&dns, &pki.ca_file));
    let name = |i: usize| {
        format!(
            "s{}.test.local:{}",
            i + 1,
            servers[i].tls_port.expect("TLS")
        )
    };
    assert_eq!(
        daemon.stat("discovery_server_list"),
        Some(format!("{},{}", name(0), name(1)))
    );
    let keys = keys("tls-member-", 1000);
    let mut client = daemon.client();
    for key in &keys {
        assert_eq!(client.set(key, key.as_bytes()), b"STORED\r\n", "{key}");
    }
    for key in &keys[..100] {
        assert_eq!(client.get(key).as_deref(), Some(key.as_bytes()), "{key}");
    }
    let some = &keys[..50];
    let reply = client.call(
        format!("get {}\r\n", some.join(" ")).as_bytes(),
        ReplyKind::Values,
    );
    let expected: String = some
        .iter()
        .map(|k| format!("VALUE {k} 0 {}\r\n{k}\r\n", k.len()))
        .chain(["END\r\n".to_string()])
        .collect();
    assert_eq!(show(&reply), show(expected.as_bytes()));
    client.send(b"ms tls-meta 2 T0\r\nhi\r\n");
    assert_eq!(client.meta_reply(), b"HD\r\n");
    client.send(b"mg tls-meta v\r\n");
    assert_eq!(show(&client.meta_reply()), show(b"VA 2\r\nhi\r\n"));
    // The records name the TLS ports, which speak nothing else: behind
    // memring, on the plain ports, both servers hold keys.
    let held = |i: usize| {
        let mut direct = servers[i].client();
        keys.iter().filter(|k| direct.get(k).is_some()).count()
    };
    let (first, second) = (held(0), held(1));
    assert_eq!(first + second, keys.len());
    assert!(first > 0 && second > 0, "{first} {second}");

    let (mut hits, mut reads) = (0usize, 0usize);
    let mut read_until = |client: &mut Client, line: &str| {
        let start = Instant::now();
        let mut passes_after = 0;
        // Reads go on through the change and one full pass after it.
        while passes_after < 1 {
            let seen = daemon.count(line) > 0;
            for key in &keys {
                reads += 1;
                hits += usize::from(client.get(key).is_some());
            }
            passes_after += usize::from(seen);
            assert!(start.elapsed() < DEADLINE, "no `{line}`:\n{}", daemon.log());
        }
    };
    dns.set_srv(&tls_srv_of(&servers, &[0, 1, 2]), &[]);
    let added = format!("+1 server ({})", name(2));
    read_until(&mut client, &added);
    // The newcomer was flushed over TLS before it joined, reached by its
    // name through the configured resolver as its connections are.
    let flushed: Vec<String> = daemon
        .log()
        .lines()
        .filter(|l| l.contains("joins") && l.contains(&name(2)))
        .map(str::to_string)
        .collect();
    assert!(
        flushed.len() == 1 && flushed[0].contains("joins: flushed first"),
        "{flushed:?}"
    );
    // Writes of the keys it owns now reach it over TLS.
    for key in &keys {
        assert_eq!(client.set(key, b"after"), b"STORED\r\n", "{key}");
    }
    assert!(held(2) > 0, "the new server got none of the keys");
    dns.set_srv(&tls_srv_of(&servers, &[1, 2]), &[]);
    let removed = format!("-1 server ({})", name(0));
    read_until(&mut client, &removed);

    let ratio = hits as f64 / reads as f64;
    println!("hit ratio through two TLS discovery changes: {hits}/{reads} = {ratio:.4}");
    assert!(ratio >= 0.995, "{hits} of {reads} reads hit");
    for line in [daemon.line(&added), daemon.line(&removed)] {
        assert!(
            line.contains("% of keyspace moves; hand-off window 300s"),
            "{line}"
        );
    }
    assert_eq!(daemon.count("TLS handshake failed"), 0, "{}", daemon.log());
    for key in &keys {
        assert_eq!(client.get(key).as_deref(), Some(&b"after"[..]), "{key}");
    }
}

#[test]
fn check_handshakes_with_every_discovered_tls_server() {
    let pki = Pki::new("check-discovered");
    let other_ca = Pki::new("check-discovered-other-ca");
    let good = pki.issue("good", &["s1.test.local"], false);
    let elsewhere = pki.issue("elsewhere", &["other.example"], false);
    let stranger = other_ca.issue("stranger", &["s3.test.local"], false);
    let (servers, hosts) = tls_servers([&good, &elsewhere, &stranger]);
    let dir = TempDir::new("dns", "check-discovered-tls");
    let mut dns = Dnsmasq::start(&dir, &hosts, &tls_srv_of(&servers, &[0]));
    let path = dir.path("check.toml");
    std::fs::write(
        &path,
        format!(
            "listen = \"127.0.0.1:22122\"\n{}",
            tls_discovery_config(&dns, &pki.ca_file)
        ),
    )
    .unwrap();
    let port = |i: usize| servers[i].tls_port.expect("TLS");
    let (ok, stdout, stderr) = memring(&["check", path.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains(&format!(
            "server `s1.test.local:{}` (from srv {SRV_NAME}): TLS ok (VERSION",
            port(0)
        )),
        "{stdout}"
    );
    assert!(!stderr.contains("not tested"), "{stderr}");

    // A certificate for another name and one from another CA: check fails
    // and says which server and why, as for a server in [[servers]].
    dns.set_srv(&tls_srv_of(&servers, &[0, 1, 2]), &[]);
    let (ok, stdout, stderr) = memring(&["check", path.to_str().unwrap()]);
    assert!(!ok, "check passed: {stdout}");
    assert!(stdout.contains("s1.test.local"), "{stdout}");
    let wrong_name = format!("server `s2.test.local:{}` (from srv {SRV_NAME}): ", port(1));
    let wrong_ca = format!("server `s3.test.local:{}` (from srv {SRV_NAME}): ", port(2));
    for (what, why) in [
        (&wrong_name, "not valid for name"),
        (&wrong_ca, "UnknownIssuer"),
    ] {
        let said = stderr
            .split(what.as_str())
            .nth(1)
            .unwrap_or_else(|| panic!("no `{what}` in {stderr}"));
        assert!(
            said.split("; server").next().unwrap_or("").contains(why),
            "{what}: {stderr}"
        );
    }

    // memring itself with these records: each failure is in its log once,
    // in the same words, for the server it is about.
    let config = tls_discovery_config(&dns, &pki.ca_file);
    let daemon = Daemon::start(&dir, &config);
    let mut client = daemon.client();
    let probe = keys("probe-", 60);
    wait_for("both TLS failures in the log", || {
        for key in &probe {
            let _ = client.get_raw(key);
        }
        daemon.count("not valid for name") > 0 && daemon.count("UnknownIssuer") > 0
    });
    for key in probe.iter().cycle().take(300) {
        let _ = client.get_raw(key);
    }
    for (why, server) in [("not valid for name", 1), ("UnknownIssuer", 2)] {
        let lines: Vec<String> = daemon
            .log()
            .lines()
            .filter(|l| l.contains(why))
            .map(str::to_string)
            .collect();
        assert_eq!(lines.len(), 1, "{lines:?}");
        let name = format!("s{}.test.local:{}", server + 1, port(server));
        assert!(lines[0].contains(&name), "{}", lines[0]);
    }
    drop(daemon);

    // A server of [[servers]] named by a host only the resolver knows.
    std::fs::write(
        &path,
        format!(
            "listen = \"127.0.0.1:22122\"\n[backend_tls]\nca_file = \"{}\"\n\
             [discovery]\nresolver = \"{}\"\n\
             [[servers]]\naddr = \"s1.test.local:{}\"\ntls = true\n",
            pki.ca_file.display(),
            dns.resolver(),
            port(0)
        ),
    )
    .unwrap();
    let (ok, stdout, stderr) = memring(&["check", path.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains(&format!(
            "server `s1.test.local:{0}` (s1.test.local:{0}): TLS ok (VERSION",
            port(0)
        )),
        "{stdout}"
    );
}

/// The ring digest does not say where the member list came from: a memring
/// on SRV records and one on a file that lists the same servers (in another
/// order) report the same `ring_digest`.
#[test]
fn the_ring_digest_is_the_same_for_servers_from_dns_or_from_the_file() {
    let dir = TempDir::new("dns", "digest");
    let file_dir = TempDir::new("dns", "digest-file");
    let (servers, hosts) = three_servers();
    let dns = Dnsmasq::start(&dir, &hosts, &srv_of(&servers, &[0, 1, 2]));
    let discovered = Daemon::start(&dir, &discovery_config(&dns, 3_600_000, ""));
    let mut listed = format!("[discovery]\nresolver = \"{}\"\n", dns.resolver());
    for i in [2, 0, 1] {
        listed.push_str(&format!(
            "[[servers]]\naddr = \"s{}.test.local:{}\"\n",
            i + 1,
            servers[i].port
        ));
    }
    let from_file = Daemon::start(&file_dir, &listed);
    assert_eq!(discovered.stat("discovery_servers").as_deref(), Some("3"));
    let digest = discovered.stat("ring_digest").expect("a ring_digest");
    assert_eq!(from_file.stat("ring_digest"), Some(digest.clone()));
    // `where --config` looks the records up as memring does at start.
    let config = dir.path("memring.toml");
    let (ok, stdout, stderr) =
        memring(&["where", "--json", "--config", config.to_str().unwrap(), "k"]);
    assert!(ok, "{stderr}");
    let location: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(location["ring_digest"], digest.as_str(), "{location}");
}

#[test]
fn servers_given_by_host_name_carry_their_zone_into_placement_and_local_reads() {
    // `[discovery] srv`/`a` carry no zone (docs/zones.md); `[[servers]]`
    // given by host name do, one zone per entry.
    let dir = TempDir::new("dns", "zones");
    let zones = ["a", "a", "b", "b", "c", "c"];
    let caches: Vec<Loopback> = zones.iter().map(|_| Loopback::start("127.0.0.2")).collect();
    let names: Vec<String> = (0..6).map(|i| format!("cache-{i}.test.local")).collect();
    let hosts: String = names.iter().map(|n| format!("127.0.0.2 {n}\n")).collect();
    let dns = Dnsmasq::start(&dir, &hosts, &[]);
    let mut config = format!(
        "replicas = 3\nzone = \"b\"\n[discovery]\nresolver = \"{}\"\n",
        dns.resolver()
    );
    for ((name, cache), zone) in names.iter().zip(&caches).zip(zones) {
        config.push_str(&format!(
            "[[servers]]\naddr = \"{name}:{}\"\nzone = \"{zone}\"\n",
            cache.port
        ));
    }
    let daemon = Daemon::start(&dir, &config);
    let keys = keys("dns-zoned:", 300);
    let mut client = daemon.client();
    for key in &keys {
        assert_eq!(client.set(key, key.as_bytes()), b"STORED\r\n");
    }
    let key_bytes: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
    let mut held: Vec<Vec<Option<Vec<u8>>>> = Vec::new();
    wait_for("every key on three servers", || {
        held = caches
            .iter()
            .map(|c| crate::common::held_values(&mut c.client(), &key_bytes))
            .collect();
        (0..keys.len()).all(|k| held.iter().filter(|h| h[k].is_some()).count() == 3)
    });
    for (k, key) in keys.iter().enumerate() {
        let mut in_zones: Vec<&str> = (0..6)
            .filter(|&s| held[s][k].is_some())
            .map(|s| zones[s])
            .collect();
        in_zones.sort_unstable();
        assert_eq!(in_zones, ["a", "b", "c"], "{key}");
    }
    let cmd_gets = || -> Vec<u64> { caches.iter().map(|c| c.client().stat("cmd_get")).collect() };
    let before = cmd_gets();
    for key in &keys {
        assert_eq!(client.get(key).as_deref(), Some(key.as_bytes()), "{key}");
    }
    let after = cmd_gets();
    let moved: Vec<u64> = (0..6).map(|s| after[s] - before[s]).collect();
    assert_eq!(moved[2] + moved[3], keys.len() as u64, "{moved:?}");
    assert_eq!(moved[0] + moved[1] + moved[4] + moved[5], 0, "{moved:?}");
    assert_eq!(
        daemon.stat("zone:b:reads_local"),
        Some(keys.len().to_string())
    );
}
