//! memring beside a real nutcracker (twemproxy 0.5) through a server's
//! failure and return, as during a migration: both proxies serve the same
//! memcached servers from the same nutcracker.yml (memring's config is what
//! `memring import` prints for it), one server is killed and later restarted
//! on its port, and every second keys written through one proxy are read
//! through the other, in both directions.
//!
//! With `ejection = "twemproxy"` both eject the server, put it back and eject
//! it again on the same clock, so the only keys that may be missed are those
//! of the failing server while one proxy has moved them and the other not
//! yet: the windows between the two proxies' ejections (and returns), which
//! are measured here (nutcracker's `server_ejected_at` stat, memring's
//! published topology) and must be short. With memring's own timing the
//! same check fails: memring restores a restarted server within about a
//! second while nutcracker waits out `server_retry_timeout`.
//!
//! A nutcracker.yml of two pools, imported whole, places every key of both
//! pools as nutcracker does, through each pool's own listener.
//!
//! Every process is started here on free loopback ports and killed by PID.

use std::io::Read as _;
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::{free_port, Client, Memcached, Proxy, TempDir, DEADLINE};
use memring::protocol::ReplyKind;

/// nutcracker's `server_retry_timeout` here: short, so the test is bounded.
const RETRY_MS: u64 = 3000;
/// nutcracker's `server_failure_limit` here.
const FAILURE_LIMIT: u32 = 2;
/// Keys written per direction every second.
const KEYS_PER_SECOND: usize = 80;
/// Servers behind both proxies.
const SERVERS: usize = 4;
/// Which one is killed and restarted.
const VICTIM: usize = 1;
/// How far apart the two proxies' ejections (or returns) of one server may
/// be: both see the failure through the same traffic, within milliseconds
/// on a quiet machine; this leaves room for a loaded one, where a thread may
/// wait for a core: at a load average of 7 memring's control plane woke for
/// a retry 0.8 s late and published the return 0.45 s after that (1.26 s).
/// memring's own timing returns the server up to 2 s before nutcracker
/// here, or after it when the restart falls just after one of memring's
/// probes (the disagreement test below checks that without this bound).
const MAX_GAP: Duration = Duration::from_millis(1_750);
/// Slack around a measured window for the test's own clock readings (the
/// watcher polls memring's topology every 2 ms).
const SLACK: Duration = Duration::from_millis(50);
/// The whole scenario must end within this.
const SCENARIO_DEADLINE: Duration = Duration::from_secs(40);

/// One nutcracker pool over `servers`, ejecting on twemproxy's clock.
fn yaml(port: u16, servers: &[Memcached]) -> String {
    let mut text = format!(
        "side:\n  listen: 127.0.0.1:{port}\n  hash: md5\n  distribution: ketama\n  timeout: 400\n  \
         auto_eject_hosts: true\n  server_failure_limit: {FAILURE_LIMIT}\n  server_retry_timeout: {RETRY_MS}\n  servers:\n"
    );
    for server in servers {
        text.push_str(&format!("   - {}:1\n", server.addr()));
    }
    text
}

/// A nutcracker with its stats port, killed by PID on drop.
pub(crate) struct Nutcracker {
    child: Child,
    port: u16,
    stats_port: u16,
    log: std::path::PathBuf,
}

impl Nutcracker {
    pub(crate) fn start(conf: &std::path::Path, port: u16, log: std::path::PathBuf) -> Nutcracker {
        let stats_port = free_port();
        let child = Command::new("nutcracker")
            .arg("-c")
            .arg(conf)
            .arg("-o")
            .arg(&log)
            // Stats aggregated every 50 ms, so an ejection shows soon.
            .args(["-a", "127.0.0.1", "-s", &stats_port.to_string(), "-i", "50"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nutcracker must be installed (scripts/test installs it)");
        let mut nutcracker = Nutcracker {
            child,
            port,
            stats_port,
            log,
        };
        let start = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err()
            || TcpStream::connect(("127.0.0.1", stats_port)).is_err()
        {
            if let Ok(Some(status)) = nutcracker.child.try_wait() {
                panic!("nutcracker exited ({status}): {}", nutcracker.log());
            }
            assert!(
                start.elapsed() < DEADLINE,
                "nutcracker did not listen: {}",
                nutcracker.log()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        nutcracker
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub(crate) fn client(&self) -> Client {
        Client::connect(&format!("127.0.0.1:{}", self.port))
    }

    /// `server_ejected_at` of the server `addr` (µs since the epoch; 0 if
    /// never ejected), from the stats port.
    fn ejected_at(stats_port: u16, addr: &str) -> Option<u64> {
        let mut stream = TcpStream::connect(("127.0.0.1", stats_port)).ok()?;
        stream.set_read_timeout(Some(DEADLINE)).ok()?;
        let mut json = String::new();
        stream.read_to_string(&mut json).ok()?;
        // The server's object is keyed by its `host:port` (its name when it
        // has one).
        let server = json.find(&format!("\"{addr}\": {{"))?;
        let field = "\"server_ejected_at\":";
        let at = server + json[server..].find(field)? + field.len();
        let digits: String = json[at..]
            .trim_start()
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    }
}

impl Drop for Nutcracker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The config `memring import` prints for the file, listening anywhere;
/// without the twemproxy timing lines when `own_timing` (memring's own probe,
/// flush and restore, with the same auto_eject and failure_limit).
fn imported(conf: &std::path::Path, own_timing: bool) -> String {
    let text = import_listening_anywhere(conf);
    assert!(text.contains("\nejection = \"twemproxy\"\n"), "{text}");
    assert!(
        text.contains(&format!("\nretry_timeout_ms = {RETRY_MS}\n")),
        "{text}"
    );
    text.lines()
        .filter(|l| !(own_timing && (l.starts_with("ejection") || l.starts_with("retry_timeout"))))
        .collect::<Vec<_>>()
        .join("\n")
}

/// What `memring import twemproxy` prints for `conf`, every `listen` (the
/// top level's and each pool's) moved to a free port.
pub(crate) fn import_listening_anywhere(conf: &std::path::Path) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_memring"))
        .args(["import".as_ref(), "twemproxy".as_ref(), conf.as_os_str()])
        .output()
        .expect("run memring import");
    assert!(
        output.status.success(),
        "memring import: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .expect("utf-8 config")
        .lines()
        .map(|l| {
            if l.starts_with("listen = ") {
                "listen = \"127.0.0.1:0\"\n".to_string()
            } else {
                format!("{l}\n")
            }
        })
        .collect()
}

/// When each proxy left the victim out of its ring and put it back, as
/// seen by a watcher thread.
#[derive(Debug, Default, Clone)]
struct Timeline {
    /// memring: the victim out of the ring (true) or in it (false), from
    /// each change seen.
    memring: Vec<(Instant, bool)>,
    /// nutcracker: each distinct `server_ejected_at`, as an `Instant`.
    nutcracker_ejections: Vec<Instant>,
}

impl Timeline {
    fn memring_ejections(&self) -> Vec<Instant> {
        self.memring
            .iter()
            .filter(|(_, out)| *out)
            .map(|(t, _)| *t)
            .collect()
    }

    fn memring_returns(&self) -> Vec<Instant> {
        self.memring
            .iter()
            .filter(|(_, out)| !*out)
            .map(|(t, _)| *t)
            .collect()
    }

    /// nutcracker puts the server back `server_retry_timeout` after each
    /// ejection (at the first request after it; traffic flows all along).
    fn nutcracker_returns(&self) -> Vec<Instant> {
        self.nutcracker_ejections
            .iter()
            .map(|t| *t + Duration::from_millis(RETRY_MS))
            .collect()
    }

    fn memring_out(&self) -> bool {
        self.memring.last().is_some_and(|(_, out)| *out)
    }
}

/// An `Instant` for a time in µs since the epoch.
fn instant_of(epoch_us: u64) -> Instant {
    let now_instant = Instant::now();
    let now_us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after the epoch")
        .as_micros() as u64;
    if epoch_us <= now_us {
        now_instant - Duration::from_micros(now_us - epoch_us)
    } else {
        now_instant + Duration::from_micros(epoch_us - now_us)
    }
}

/// One second's check in one direction.
#[derive(Debug, Clone, Copy, Default)]
struct Direction {
    /// Keys the writing proxy stored.
    stored: usize,
    /// Of those, found through the other proxy.
    found: usize,
    /// Of those not found, how many the victim owns in the full ring.
    missed_on_victim: usize,
    /// Writes the writing proxy failed (SERVER_ERROR).
    write_errors: usize,
}

#[derive(Debug, Clone, Copy)]
struct Second {
    /// Seconds since the kill (negative: before it).
    at: f64,
    started: Instant,
    ended: Instant,
    memring_to_nutcracker: Direction,
    nutcracker_to_memring: Direction,
}

struct Outcome {
    seconds: Vec<Second>,
    timeline: Timeline,
    killed: Instant,
}

impl Outcome {
    /// Pairs of (memring's moment, nutcracker's moment) for each ejection and
    /// each return, in order.
    fn pairs(&self) -> Vec<(&'static str, Instant, Instant)> {
        let mut pairs = Vec::new();
        let t = &self.timeline;
        for (m, n) in t
            .memring_ejections()
            .into_iter()
            .zip(t.nutcracker_ejections.clone())
        {
            pairs.push(("ejection", m, n));
        }
        for (m, n) in t.memring_returns().into_iter().zip(t.nutcracker_returns()) {
            pairs.push(("return", m, n));
        }
        pairs.sort_by_key(|(_, m, n)| (*m).min(*n));
        pairs
    }

    fn since_kill(&self, t: Instant) -> f64 {
        if t >= self.killed {
            (t - self.killed).as_secs_f64()
        } else {
            -(self.killed - t).as_secs_f64()
        }
    }

    /// Whether a second's check overlaps a window in which the two proxies
    /// were allowed to disagree (between their two moments of one pair).
    fn in_window(&self, second: &Second) -> bool {
        self.pairs().iter().any(|(_, m, n)| {
            let (from, to) = ((*m).min(*n), (*m).max(*n));
            second.started <= to + SLACK && second.ended + SLACK >= from
        })
    }

    fn report(&self) -> String {
        let mut text = String::new();
        for (what, m, n) in self.pairs() {
            text.push_str(&format!(
                "{what}: memring at {:+.3} s, nutcracker at {:+.3} s\n",
                self.since_kill(m),
                self.since_kill(n)
            ));
        }
        for s in &self.seconds {
            let d = |d: &Direction| {
                format!(
                    "{}/{} found ({} missed on the victim, {} writes failed)",
                    d.found, d.stored, d.missed_on_victim, d.write_errors
                )
            };
            text.push_str(&format!(
                "{:+5.1} s{}: memring->nutcracker {}; nutcracker->memring {}\n",
                s.at,
                if self.in_window(s) { " (window)" } else { "" },
                d(&s.memring_to_nutcracker),
                d(&s.nutcracker_to_memring)
            ));
        }
        text
    }

    /// Every problem with the run: a second outside the windows in which a
    /// stored key was not found on the other side, a miss that is not the
    /// victim's, or two moments of a pair too far apart.
    fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for (what, m, n) in self.pairs() {
            let gap = if m > n { m - n } else { n - m };
            if gap > MAX_GAP {
                problems.push(format!("{what} {gap:?} apart"));
            }
        }
        for s in &self.seconds {
            for (name, d) in [
                ("memring->nutcracker", &s.memring_to_nutcracker),
                ("nutcracker->memring", &s.nutcracker_to_memring),
            ] {
                let missed = d.stored - d.found;
                if missed > 0 && !self.in_window(s) {
                    problems.push(format!("{:+.1} s {name}: {missed} missed", s.at));
                }
                if missed > d.missed_on_victim {
                    problems.push(format!(
                        "{:+.1} s {name}: {} missed keys the victim does not own",
                        s.at,
                        missed - d.missed_on_victim
                    ));
                }
            }
        }
        problems
    }
}

fn set(client: &mut Client, key: &str) -> bool {
    match client.set(key, key.as_bytes()).as_slice() {
        b"STORED\r\n" => true,
        reply if reply.starts_with(b"SERVER_ERROR") => false,
        reply => panic!("set {key}: {}", crate::common::show(reply)),
    }
}

fn found(client: &mut Client, key: &str) -> bool {
    holds_itself(&client.get_raw(key), key)
}

/// True when `reply`, to a get of `key`, is the value `set` stored.
fn holds_itself(reply: &[u8], key: &str) -> bool {
    if reply.starts_with(b"SERVER_ERROR") {
        return false;
    }
    match crate::common::parse_single_value(reply) {
        Some(value) => value.as_deref() == Some(key.as_bytes()),
        None => panic!("get {key}: {}", crate::common::show(reply)),
    }
}

/// Writes fresh keys through `writer`, reads them through `reader`.
fn check(
    writer: &mut Client,
    reader: &mut Client,
    prefix: &str,
    victim_owns: &dyn Fn(&str) -> bool,
) -> Direction {
    let mut d = Direction::default();
    for i in 0..KEYS_PER_SECOND {
        let key = format!("{prefix}-{i}");
        if !set(writer, &key) {
            d.write_errors += 1;
            continue;
        }
        d.stored += 1;
        if found(reader, &key) {
            d.found += 1;
        } else if victim_owns(&key) {
            d.missed_on_victim += 1;
        }
    }
    d
}

/// Production traffic: gets through both proxies without pause, so that
/// each notices a failure (and a retry) within milliseconds, as under load.
/// `keys` include some of every server's. Returns the number of requests.
fn traffic(
    addrs: [String; 2],
    keys: Vec<String>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut clients: Vec<Client> = addrs.iter().map(|a| Client::connect(a)).collect();
        let mut requests = 0u64;
        while !stop.load(Ordering::Relaxed) {
            for (client, addr) in clients.iter_mut().zip(&addrs) {
                let key = &keys[requests as usize % keys.len()];
                client.send(format!("get {key}\r\n").as_bytes());
                if client.try_reply(ReplyKind::Values).is_none() {
                    // nutcracker closes a client whose request it could
                    // not forward: connect again, as a client would.
                    *client = Client::connect(addr);
                }
            }
            requests += 1;
        }
        requests
    })
}

/// Records when memring and nutcracker eject and return the victim: one
/// thread for each, so that a slow answer from nutcracker's stats port
/// cannot delay what is seen of memring.
fn watch(
    topology: memring::pools::topology::SharedTopology,
    victim: String,
    stats_port: u16,
    timeline: Arc<Mutex<Timeline>>,
    stop: Arc<AtomicBool>,
) -> [std::thread::JoinHandle<()>; 2] {
    let memring = {
        let (victim, timeline, stop) = (victim.clone(), timeline.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut last_version = topology.load().version;
            while !stop.load(Ordering::Relaxed) {
                let (version, out) = {
                    let now = topology.load();
                    (now.version, now.ejected.contains(&victim))
                };
                // Only the victim's ejections and returns publish here, one
                // version each: a return and a second ejection between two
                // polls show as two versions with no change of state.
                let now = Instant::now();
                let mut t = timeline.lock().expect("timeline");
                for step in (0..version - last_version).rev() {
                    t.memring
                        .push((now, if step % 2 == 0 { out } else { !out }));
                }
                drop(t);
                last_version = version;
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    let nutcracker = std::thread::spawn(move || {
        let mut last_ejected_at = 0;
        while !stop.load(Ordering::Relaxed) {
            // The stats carry the ejection's own time: polling late does not
            // make it later.
            if let Some(at) = Nutcracker::ejected_at(stats_port, &victim) {
                if at != 0 && at != last_ejected_at {
                    last_ejected_at = at;
                    timeline
                        .lock()
                        .expect("timeline")
                        .nutcracker_ejections
                        .push(instant_of(at));
                }
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    });
    [memring, nutcracker]
}

/// How long the victim stays down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outage {
    /// Restarted as soon as both ejected it: back long before its retry.
    Short,
    /// Restarted only after both retried it, found it still down and
    /// ejected it a second time.
    PastRetry,
}

/// Runs the scenario and returns what was seen each second.
fn side_by_side(outage: Outage, own_timing: bool, test: &str) -> Outcome {
    let dir = TempDir::new("twemproxy", test);
    let mut servers: Vec<Memcached> = (0..SERVERS).map(|_| Memcached::start()).collect();
    let port = free_port();
    let conf = dir.path("nutcracker.yml");
    std::fs::write(&conf, yaml(port, &servers)).expect("write nutcracker.yml");
    let nutcracker = Nutcracker::start(&conf, port, dir.path("nutcracker.log"));
    let config = imported(&conf, own_timing);
    let proxy = Proxy::start_text(&config);
    let ring = proxy.config.build_ring();
    let victim = servers[VICTIM].addr();
    let victim_owns = |key: &str| ring.owner(key.as_bytes()) == Some(VICTIM);

    let stop = Arc::new(AtomicBool::new(false));
    let timeline = Arc::new(Mutex::new(Timeline::default()));
    let traffic_keys: Vec<String> = (0..)
        .map(|i| format!("traffic-{i}"))
        .filter(|k| ring.owner(k.as_bytes()).is_some())
        .take(400)
        .collect();
    for server in 0..SERVERS {
        assert!(
            traffic_keys
                .iter()
                .any(|k| ring.owner(k.as_bytes()) == Some(server)),
            "traffic for server {server}"
        );
    }
    let load = traffic(
        [proxy.addr.to_string(), format!("127.0.0.1:{port}")],
        traffic_keys,
        stop.clone(),
    );
    let watchers = watch(
        proxy.running().topology.clone(),
        victim.clone(),
        nutcracker.stats_port,
        timeline.clone(),
        stop.clone(),
    );
    let mut mem = proxy.client();
    let mut nut = nutcracker.client();

    let begun = Instant::now();
    let mut seconds = Vec::new();
    let mut killed: Option<Instant> = None;
    let mut restarted: Option<Instant> = None;
    let mut second = 0u32;
    loop {
        let now = Instant::now();
        assert!(
            now - begun < SCENARIO_DEADLINE,
            "the scenario did not finish: {:?}\nnutcracker log: {}",
            timeline.lock().expect("timeline"),
            nutcracker.log()
        );
        let seen = timeline.lock().expect("timeline").clone();
        let both_out = seen.memring_out()
            && seen
                .nutcracker_ejections
                .last()
                .is_some_and(|at| Instant::now() < *at + Duration::from_millis(RETRY_MS));
        match (killed, restarted) {
            (None, _) if second >= 1 => {
                killed = Some(Instant::now());
                servers[VICTIM].kill();
            }
            (Some(_), None) => {
                let ejections = seen.nutcracker_ejections.len();
                let ready = match outage {
                    Outage::Short => ejections >= 1 && seen.memring_out(),
                    // memring's own timing never puts the server back untried.
                    Outage::PastRetry => ejections >= 2 && (own_timing || both_out),
                };
                if ready {
                    servers[VICTIM].restart();
                    restarted = Some(Instant::now());
                }
            }
            _ => {}
        }
        // Done two seconds after the last return nutcracker makes.
        if let Some(restarted_at) = restarted {
            let back = seen
                .nutcracker_returns()
                .into_iter()
                .filter(|t| *t >= restarted_at - Duration::from_millis(RETRY_MS))
                .max();
            if back.is_some_and(|t| now > t + Duration::from_secs(2)) && !seen.memring_out() {
                break;
            }
        }
        let returns = |timeline: &Timeline| {
            timeline.memring_returns().len() + timeline.nutcracker_returns().len()
        };
        let returns_before = returns(&seen);
        let started = Instant::now();
        let m2n = check(
            &mut mem,
            &mut nut,
            &format!("{test}-{second}-m"),
            &victim_owns,
        );
        let n2m = check(
            &mut nut,
            &mut mem,
            &format!("{test}-{second}-n"),
            &victim_owns,
        );
        let ended = Instant::now();
        seconds.push((second, started, ended, m2n, n2m));
        second += 1;
        // Paced by the clock: one check per second of the scenario. With
        // memring's own timing, also one as soon as either proxy puts the
        // server back after this check began: the proxies disagree from the
        // first return until the second, and on a loaded machine that can
        // be well under a second (memring's probe backoff may have grown to
        // 2 s by the restart), between two checks of the grid, or begin
        // just after a check that a late schedule started just before it.
        let next = begun + Duration::from_secs(u64::from(second));
        let returned = || returns(&timeline.lock().expect("timeline")) > returns_before;
        if !(own_timing && returned()) {
            while Instant::now() < next {
                if own_timing && returned() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let requests = load.join().expect("traffic thread");
    for watcher in watchers {
        watcher.join().expect("watcher thread");
    }
    let killed = killed.expect("killed");
    let timeline = timeline.lock().expect("timeline").clone();
    let outcome = Outcome {
        seconds: seconds
            .into_iter()
            .map(|(_, started, ended, m2n, n2m)| Second {
                at: if started >= killed {
                    (started - killed).as_secs_f64()
                } else {
                    -(killed - started).as_secs_f64()
                },
                started,
                ended,
                memring_to_nutcracker: m2n,
                nutcracker_to_memring: n2m,
            })
            .collect(),
        timeline,
        killed,
    };
    println!(
        "{test} ({}, {outage:?} outage, {requests} gets of traffic through each proxy):\n{}",
        if own_timing {
            "memring's own timing"
        } else {
            "ejection = \"twemproxy\""
        },
        outcome.report()
    );
    outcome
}

#[test]
fn with_twemproxy_timing_both_proxies_agree_through_a_short_outage() {
    let outcome = side_by_side(Outage::Short, false, "short");
    // Once, unless a loaded machine held the restart back past a retry
    // (then both eject again, together).
    let ejections = outcome.timeline.nutcracker_ejections.len();
    assert!(ejections >= 1, "{}", outcome.report());
    assert_eq!(
        outcome.timeline.memring_ejections().len(),
        ejections,
        "{}",
        outcome.report()
    );
    let problems = outcome.problems();
    assert!(problems.is_empty(), "{problems:?}\n{}", outcome.report());
}

#[test]
fn with_twemproxy_timing_both_proxies_agree_when_a_retry_finds_the_server_down() {
    let outcome = side_by_side(Outage::PastRetry, false, "past-retry");
    assert_eq!(
        outcome.timeline.nutcracker_ejections.len(),
        2,
        "{}",
        outcome.report()
    );
    assert_eq!(outcome.timeline.memring_ejections().len(), 2);
    let problems = outcome.problems();
    assert!(problems.is_empty(), "{problems:?}\n{}", outcome.report());
}

/// The check above is not vacuous: with memring's own timing (probe, flush,
/// restore at once) the same run disagrees outside any short window.
#[test]
fn with_memrings_own_timing_the_proxies_disagree_after_a_return() {
    let outcome = side_by_side(Outage::Short, true, "own-timing");
    // memring probes the stopped server with a backoff (20 ms doubling to
    // 2 s) and nutcracker retries it after its `server_retry_timeout`, so
    // which returns it first depends on when the restart falls between
    // memring's probes, which a loaded machine moves; that they return it
    // at different moments does not.
    let t = &outcome.timeline;
    let apart = t
        .memring_returns()
        .into_iter()
        .zip(t.nutcracker_returns())
        .any(|(m, n)| (if m > n { m - n } else { n - m }) > Duration::from_millis(100));
    assert!(
        apart,
        "memring's return and nutcracker's should be apart:\n{}",
        outcome.report()
    );
    let missed: usize = outcome
        .seconds
        .iter()
        .map(|s| s.memring_to_nutcracker.stored - s.memring_to_nutcracker.found)
        .sum();
    assert!(missed > 0, "{}", outcome.report());
}

/// `memring import` says, for each setting of the pool at hand, what it
/// becomes, in comments of a config that loads; what has no equivalent is
/// also said on stderr.
#[test]
fn import_prints_how_each_setting_of_the_pool_maps() {
    let dir = TempDir::new("twemproxy", "import-mapping");
    let conf = dir.path("nutcracker.yml");
    std::fs::write(
        &conf,
        "web:\n  listen: 127.0.0.1:22121\n  hash: murmur\n  hash_tag: \"{}\"\n  distribution: ketama\n  \
         timeout: 250\n  server_connections: 3\n  preconnect: true\n  backlog: 2048\n  client_connections: 500\n  \
         redis: false\n  auto_eject_hosts: true\n  server_failure_limit: 4\n  servers:\n   - 127.0.0.1:11211:1\n   \
         - 127.0.0.1:11212:1\n\
         sessions:\n  listen: 127.0.0.1:22122\n  server_failure_limit: 3\n  server_retry_timeout: 5000\n  \
         servers:\n   - 127.0.0.1:11213:1\n",
    )
    .expect("write nutcracker.yml");
    let run = |pool: &str| {
        let output = Command::new(env!("CARGO_BIN_EXE_memring"))
            .args([
                "import".as_ref(),
                "twemproxy".as_ref(),
                conf.as_os_str(),
                pool.as_ref(),
            ])
            .output()
            .expect("run memring import");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        (
            String::from_utf8(output.stdout).expect("utf-8"),
            String::from_utf8(output.stderr).expect("utf-8"),
        )
    };

    let (web, web_stderr) = run("web");
    let config = memring::config::Config::parse(&web, "web.toml").expect("stdout is a config");
    for line in [
        "# hash: murmur -> hash, the same function\nhash = \"murmur\"\n",
        "# hash_tag: \"{}\" -> hash_tag: keys are placed by the part between the two, as in twemproxy\n",
        "# distribution: ketama -> ring = \"twemproxy\" (its ketama, point for point)\n",
        "# timeout: 250 -> request_timeout_ms (how long a server may make no progress on what it owes),\n\
         # and connect_timeout_ms: twemproxy's timeout also covers the connect a request waits for\n\
         request_timeout_ms = 250\nconnect_timeout_ms = 250\n",
        "# server_connections: 3 -> connections_per_server, which is per worker: with the default\n\
         # workers = 1, 3 connection(s) to each server as in nutcracker; with workers = W, W x 3\n",
        "# preconnect: true has no setting: memring always connects to every server at start and after each change\n",
        "# backlog: 2048 has no setting: memring listens with a backlog of 4096",
        "# client_connections: 500 -> max_client_connections\nmax_client_connections = 500\n",
        "# redis: false -> memcached is all memring speaks\n",
        "# auto_eject_hosts: true -> auto_eject: a failing server's keys go to the next server clockwise\n",
        "ejection = \"twemproxy\"\n",
        "# server_failure_limit: 4 -> failure_limit: ejected after 4 failures with no answer between\nfailure_limit = 4\n",
        "# nutcracker's default server_retry_timeout: 30000 -> retry_timeout_ms: back in the ring 30000 ms after its ejection\n",
    ] {
        assert!(web.contains(line), "missing {line:?} in\n{web}");
    }
    assert_eq!(
        (
            config.connections_per_server,
            config.max_client_connections,
            config.failure_limit
        ),
        (3, 500, 4)
    );
    assert_eq!(
        config.ejection,
        memring::config::Ejection::Twemproxy {
            retry: Duration::from_millis(30_000)
        }
    );
    assert!(
        web_stderr.contains("memring import: no equivalent for preconnect: true")
            && web_stderr.contains("memring import: no equivalent for backlog: 2048"),
        "{web_stderr}"
    );

    // Without auto_eject_hosts twemproxy ignores server_failure_limit: the
    // import must not make memring fail keys fast.
    let (sessions, _) = run("sessions");
    let config =
        memring::config::Config::parse(&sessions, "sessions.toml").expect("stdout is a config");
    assert!(!config.auto_eject);
    assert_eq!(
        memring::backend::timing_for(&config),
        memring::backend::health::Timing::Twemproxy {
            eject: false,
            retry: Duration::from_millis(30_000)
        }
    );
    for line in [
        "# server_failure_limit: 3 is not carried: without auto_eject_hosts twemproxy ignores it",
        "# server_retry_timeout: 5000 is not carried: it matters only with auto_eject_hosts: true\n",
        "# auto_eject_hosts: not set, false in twemproxy as auto_eject in memring",
        "# timeout: not set, so nutcracker waits for a server as long as it takes; memring cannot: it uses its\n\
         # defaults request_timeout_ms = 1000 and connect_timeout_ms = 500\n",
    ] {
        assert!(sessions.contains(line), "missing {line:?} in\n{sessions}");
    }
    assert!(!sessions.contains("\nfailure_limit ="), "{sessions}");
}

/// Keys written per pool and direction in the two-pool comparison.
const KEYS_PER_POOL: usize = 3000;

/// One nutcracker process with two pools that place keys differently, and
/// one memring from `memring import` of the whole file (no pool named):
/// every key written through a nutcracker pool is found through memring's
/// listener for that pool, and every key written through memring is found
/// through nutcracker. `tagged` is ketama with fnv1a_64 and a hash tag, so
/// keys with the same tag share a server; `plain` is ketama with murmur over
/// named servers, one of weight 2 (names and weights change the points).
#[test]
fn every_pool_imported_in_one_step_places_every_key_as_nutcracker_does() {
    let dir = TempDir::new("twemproxy", "every-pool");
    let tagged: Vec<Memcached> = (0..3).map(|_| Memcached::start()).collect();
    let plain: Vec<Memcached> = (0..3).map(|_| Memcached::start()).collect();
    let (tagged_port, plain_port) = (free_port(), free_port());
    let mut yaml = format!(
        "tagged:\n  listen: 127.0.0.1:{tagged_port}\n  hash: fnv1a_64\n  hash_tag: \"{{}}\"\n  \
         distribution: ketama\n  timeout: 2000\n  auto_eject_hosts: true\n  servers:\n"
    );
    // (A timeout well above a loaded machine's round trips: this test is
    // about where keys go, and an ejection would move them.)
    for server in &tagged {
        yaml.push_str(&format!("   - {}:1\n", server.addr()));
    }
    yaml.push_str(&format!(
        "plain:\n  listen: 127.0.0.1:{plain_port}\n  hash: murmur\n  distribution: ketama\n  servers:\n"
    ));
    for (i, server) in plain.iter().enumerate() {
        let weight = if i == 1 { 2 } else { 1 };
        yaml.push_str(&format!("   - {}:{weight} plain-{i}\n", server.addr()));
    }
    let conf = dir.path("nutcracker.yml");
    std::fs::write(&conf, &yaml).expect("write nutcracker.yml");
    let nutcracker = Nutcracker::start(&conf, tagged_port, dir.path("nutcracker.log"));
    crate::common::wait_for("nutcracker's second pool to listen", || {
        TcpStream::connect(("127.0.0.1", plain_port)).is_ok()
    });

    let config = import_listening_anywhere(&conf);
    let proxy = Proxy::start_text(&config);
    let plain_addr = match proxy.running().pool_addrs.as_slice() {
        [(name, addr)] if name == "plain" => addr.to_string(),
        other => panic!("one listener for pool `plain`, not {other:?}\n{config}"),
    };
    let to_nutcracker = |port: u16| Client::connect(&format!("127.0.0.1:{port}"));
    let pools = [
        ("tagged", &tagged, tagged_port, proxy.addr.to_string()),
        ("plain", &plain, plain_port, plain_addr),
    ];
    for (pool, servers, port, memring_addr) in pools {
        // Tagged keys spread by their tag alone (300 tags).
        let key_of = |i: usize| match pool {
            "tagged" => format!("user:{{{:x}}}:{i}", (i % 300) * 2_654_435_761),
            _ => format!("item:{i}"),
        };
        let mut through_nutcracker = to_nutcracker(port);
        let mut through_memring = Client::connect(&memring_addr);
        for direction in ["nutcracker -> memring", "memring -> nutcracker"] {
            let (writer, reader) = if direction.starts_with("nutcracker") {
                (&mut through_nutcracker, &mut through_memring)
            } else {
                (&mut through_memring, &mut through_nutcracker)
            };
            let keys: Vec<String> = (0..KEYS_PER_POOL)
                .map(|i| format!("{direction}:{}", key_of(i)).replace(' ', ""))
                .collect();
            // Pipelined, 50 requests at a time: where a key goes does not
            // depend on how requests are batched, and 12 000 round trips one
            // by one were most of this test's time.
            let mut missing: Vec<&String> = Vec::new();
            for chunk in keys.chunks(50) {
                let sets: String = chunk
                    .iter()
                    .map(|key| format!("set {key} 0 0 {}\r\n{key}\r\n", key.len()))
                    .collect();
                writer.send(sets.as_bytes());
                for key in chunk {
                    let reply = writer.reply(ReplyKind::Line);
                    assert!(
                        reply == b"STORED\r\n",
                        "{pool}, {direction}: set {key}: {}",
                        crate::common::show(&reply)
                    );
                }
            }
            for chunk in keys.chunks(50) {
                let gets: String = chunk.iter().map(|key| format!("get {key}\r\n")).collect();
                reader.send(gets.as_bytes());
                for key in chunk {
                    if !holds_itself(&reader.reply(ReplyKind::Values), key) {
                        missing.push(key);
                    }
                }
            }
            assert!(
                missing.is_empty(),
                "{pool}, {direction}: {} of {KEYS_PER_POOL} keys not found, such as {:?}: {}",
                missing.len(),
                &missing[..missing.len().min(5)],
                nutcracker.log()
            );
            // Each key is on one server of its own pool, and every server
            // has its share: the keys did not all go to one place.
            let asked: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
            let held: Vec<usize> = servers
                .iter()
                .map(|server| {
                    let values = crate::common::held_values(&mut server.client(), &asked);
                    values.iter().filter(|v| v.is_some()).count()
                })
                .collect();
            assert_eq!(
                held.iter().sum::<usize>(),
                KEYS_PER_POOL,
                "{pool}, {direction}: {held:?}"
            );
            assert!(
                held.iter().all(|&n| n > KEYS_PER_POOL / 20),
                "{pool}, {direction}: {held:?}"
            );
        }
    }
}

/// With `auto_eject_hosts: false` nutcracker tries a killed server on every
/// request and serves it again the moment it is back; so does memring with
/// the imported config: its keys fail while it is down (no server is DEAD,
/// nothing moves) and are served as soon as it answers again.
#[test]
fn without_auto_eject_a_failed_server_is_tried_again_on_the_next_requests() {
    let dir = TempDir::new("twemproxy", "no-eject");
    let mut servers: Vec<Memcached> = (0..2).map(|_| Memcached::start()).collect();
    let conf = dir.path("nutcracker.yml");
    std::fs::write(
        &conf,
        format!(
            "p:\n  listen: 127.0.0.1:1\n  hash: md5\n  server_failure_limit: 1\n  servers:\n   - {}:1\n   - {}:1\n",
            servers[0].addr(),
            servers[1].addr()
        ),
    )
    .expect("write nutcracker.yml");
    let output = Command::new(env!("CARGO_BIN_EXE_memring"))
        .args(["import".as_ref(), "twemproxy".as_ref(), conf.as_os_str()])
        .output()
        .expect("run memring import");
    assert!(output.status.success());
    let config = String::from_utf8(output.stdout)
        .expect("utf-8")
        .replace("listen = \"127.0.0.1:1\"", "listen = \"127.0.0.1:0\"");
    let proxy = Proxy::start_text(&config);
    let ring = proxy.config.build_ring();
    let key = (0..)
        .map(|i| format!("k{i}"))
        .find(|k| ring.owner(k.as_bytes()) == Some(0))
        .expect("a key of server 0");
    let mut client = proxy.client();
    servers[0].kill();
    // Failures far beyond failure_limit, for long enough that memring's own
    // reconnect backoff reaches its 2 s (attempts about 2.5 s and 4.5 s
    // after the kill, so a restart at 3.2 s would wait 1.3 s for the next):
    // the server never turns DEAD.
    let down = Instant::now();
    let mut failed = 0;
    while down.elapsed() < Duration::from_millis(3200) {
        let reply = client.set(&key, b"x");
        assert!(
            reply.starts_with(b"SERVER_ERROR"),
            "{}",
            crate::common::show(&reply)
        );
        failed += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(failed > 20, "{failed}");
    let backend = proxy.running().topology.load().backends[0].clone();
    assert_ne!(backend.state(), memring::backend::health::HealthState::Dead);
    assert!(proxy.running().topology.load().ejected.is_empty());
    servers[0].restart();
    // Back on the next requests, not after a probe's backoff: each failed
    // request has memring connect again, as nutcracker does.
    let started = Instant::now();
    while client.set(&key, b"back") != b"STORED\r\n" {
        assert!(started.elapsed() < DEADLINE, "never served again");
        std::thread::sleep(Duration::from_millis(5));
    }
    println!("served again {:?} after the restart", started.elapsed());
    // memring's own reconnect backoff would have waited up to 2 s.
    assert!(started.elapsed() < Duration::from_millis(500));
    assert_eq!(servers[0].client().get(&key).as_deref(), Some(&b"back"[..]));
}

/// `ejection` applies on reload: the servers get the new timing, and a
/// killed server then comes back into the ring when its retry is due, still
/// down (memring's own timing keeps a server out until it answers).
#[test]
fn a_reload_switches_to_twemproxy_timing_live() {
    let dir = TempDir::new("twemproxy", "reload");
    let mut servers: Vec<Memcached> = (0..2).map(|_| Memcached::start()).collect();
    let body: String = servers
        .iter()
        .map(|s| format!("[[servers]]\naddr = \"{}\"\n", s.addr()))
        .collect();
    let path = dir.path("memring.toml");
    let head =
        "listen = \"127.0.0.1:0\"\nring = \"twemproxy\"\nauto_eject = true\nfailure_limit = 2\n";
    std::fs::write(&path, format!("{head}{body}")).expect("write");
    let proxy = Proxy::start_file(&path);
    std::fs::write(
        &path,
        format!("{head}ejection = \"twemproxy\"\nretry_timeout_ms = 800\n{body}"),
    )
    .expect("write");
    crate::common::wait_for("the reload", || {
        proxy.running().topology.load().config.ejection
            == memring::config::Ejection::Twemproxy {
                retry: Duration::from_millis(800),
            }
    });
    let topology = proxy.running().topology.load_full();
    assert!(topology.backends.iter().all(|b| matches!(
        b.timing(),
        memring::backend::health::Timing::Twemproxy { eject: true, .. }
    )));
    let victim = topology.backends[0].name().to_string();
    drop(topology);
    servers[0].kill();
    let ejected = || proxy.running().topology.load().ejected.contains(&victim);
    crate::common::wait_for("the ejection", ejected);
    let retry_at = proxy.running().topology.load().backends[0]
        .retry_at()
        .expect("a DEAD server waits for its retry");
    crate::common::wait_for("the return on time, still down", || !ejected());
    assert!(Instant::now() >= retry_at);
    assert_eq!(crate::common::answering_pid(servers[0].port), None);
}
