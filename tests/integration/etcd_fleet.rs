//! Every sidecar switches together (issue 49): with etcd, a membership
//! change that moves reads is staged (writes reach the old and the new
//! owners, reads stay) until every live sidecar under `<prefix>proxies/`
//! staged it. Real etcd, real memcached, sidecars in this process and as
//! processes of their own.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::etcd::Etcd;
use crate::common::{free_port, wait_for, Client, Daemon, Memcached, Proxy, TempDir};
use memring::protocol::ReplyKind;

use crate::common::link::Link;
use crate::etcd::{etcd_config, key_of, record, stat_text, PREFIX};

/// The servers `proxy` reads from now (the ring in force), sorted.
pub(crate) fn reads_from(proxy: &Proxy) -> Vec<String> {
    let mut names: Vec<String> = proxy
        .running()
        .topology
        .load()
        .ring_servers()
        .into_iter()
        .map(|s| s.name)
        .collect();
    names.sort();
    names
}

pub(crate) fn stat(proxy: &Proxy, name: &str) -> i64 {
    stat_text(&mut proxy.client(), name)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no STAT {name}"))
}

/// The sidecars registered under the prefix.
fn registered(etcd: &Etcd) -> usize {
    registered_under(etcd, PREFIX)
}

/// The sidecars registered under `prefix`.
pub(crate) fn registered_under(etcd: &Etcd, prefix: &str) -> usize {
    etcd.ctl(&[
        "get",
        "--prefix",
        "--keys-only",
        &format!("{prefix}proxies/"),
    ])
    .lines()
    .filter(|l| !l.trim().is_empty())
    .count()
}

/// The set-up most tests here start from: etcd, a state dir for each of
/// two sidecars (`<test>` and `<test>-b`), three memcached, and a and b
/// registered as ACTIVE members (c is not a member yet). A test binds it
/// and then moves out the parts it uses (`let Fleet { etcd, c, .. } =
/// fleet;`): the parts left in `fleet` still live until the test ends.
struct Fleet {
    etcd: Etcd,
    dir_a: TempDir,
    dir_b: TempDir,
    a: Memcached,
    b: Memcached,
    c: Memcached,
}

impl Fleet {
    fn start(test: &str) -> Fleet {
        let etcd = Etcd::start(test);
        let (dir_a, dir_b) = (
            TempDir::new("fleet", test),
            TempDir::new("fleet", &format!("{test}-b")),
        );
        let (a, b, c) = (Memcached::start(), Memcached::start(), Memcached::start());
        etcd.put(&key_of("a"), &record(&a, "ACTIVE"));
        etcd.put(&key_of("b"), &record(&b, "ACTIVE"));
        Fleet {
            etcd,
            dir_a,
            dir_b,
            a,
            b,
            c,
        }
    }
}

/// Two sidecars over a and b, where a's replies go through a relay that
/// can hold them (`slow`) and the second sidecar's etcd through one that
/// can cut it (`link`): for work a request leaves behind on a, which the
/// drain must count until a answers.
struct SlowA {
    first: Proxy,
    held: Proxy,
    link: Link,
    slow: Link,
    fleet: Fleet,
}

impl SlowA {
    fn start(test: &str, settings: &str) -> SlowA {
        let fleet = Fleet::start(test);
        // Its record names the relay before any sidecar starts.
        let slow = Link::start(fleet.a.port);
        fleet.etcd.put(
            &key_of("a"),
            &format!(r#"{{"addr":"127.0.0.1:{}","state":"ACTIVE"}}"#, slow.port),
        );
        let link = Link::start(fleet.etcd.client_port);
        let first = Proxy::start_text(&etcd_config(&fleet.etcd.endpoint(), &fleet.dir_a, settings));
        let held = Proxy::start_text(&etcd_config(&link.endpoint(), &fleet.dir_b, settings));
        wait_for("both sidecars registered", || registered(&fleet.etcd) == 2);
        wait_for("both sidecars on a and b", || {
            reads_from(&first) == ["a", "b"] && reads_from(&held) == ["a", "b"]
        });
        SlowA {
            first,
            held,
            link,
            slow,
            fleet,
        }
    }

    /// With a's replies to `left` (what was left behind) held: c joins while
    /// the second sidecar is cut off from etcd; the first must not say it
    /// staged the change until a answers, then does within the bound, and
    /// both switch without a forced switch.
    fn staged_only_once_a_answers(&self, left: &str) {
        let (first, held, etcd) = (&self.first, &self.held, &self.fleet.etcd);
        self.link.cut(true);
        etcd.put(&key_of("c"), &record(&self.fleet.c, "ACTIVE"));
        wait_for(
            "the first sidecar stages c, waiting on the held-back one",
            || stat(first, "fleet_sidecars_waited_on") == 1,
        );
        let held_since = Instant::now();
        while held_since.elapsed() < Duration::from_millis(1_000) {
            assert_eq!(
                stat(first, "membership_staged_revision"),
                0,
                "said staged while {left} planned before was unanswered"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        self.slow.hold(false);
        wait_for("said staged once a answered", || {
            stat(first, "membership_staged_revision") > 0
        });
        assert!(
            held_since.elapsed() < Duration::from_secs(4),
            "not by the bound"
        );
        self.link.cut(false);
        wait_for("both sidecars read from a, b, c", || {
            reads_from(first) == ["a", "b", "c"] && reads_from(held) == ["a", "b", "c"]
        });
        assert_eq!(stat(first, "fleet_forced_switches"), 0);
    }
}

/// One writer alternating between two sidecars, and one reader on each,
/// over `keys` keys: each value is a number larger than any written
/// before, and a read that returns a number smaller than the largest one
/// acknowledged before the read began is stale.
struct StaleCheck {
    stop: Arc<AtomicBool>,
    writes: Arc<AtomicU64>,
    reads: Arc<AtomicU64>,
    stale: Arc<AtomicU64>,
    errors: Arc<AtomicU64>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl StaleCheck {
    fn start(proxies: [&Proxy; 2], keys: usize) -> StaleCheck {
        let addrs = proxies.map(|p| p.addr.to_string());
        let acked: Arc<Vec<AtomicU64>> = Arc::new((0..keys).map(|_| AtomicU64::new(0)).collect());
        let [stop, _] = [(); 2].map(|()| Arc::new(AtomicBool::new(false)));
        let [writes, reads, stale, errors] = [(); 4].map(|()| Arc::new(AtomicU64::new(0)));
        let mut threads = Vec::new();
        {
            let (addrs, acked, stop) = (addrs.clone(), acked.clone(), stop.clone());
            let (writes, errors) = (writes.clone(), errors.clone());
            threads.push(std::thread::spawn(move || {
                let mut clients = addrs.map(|a| Client::connect(&a));
                let mut i = 1u64;
                while !stop.load(Ordering::Relaxed) {
                    let k = (i / 2) as usize % acked.len();
                    let reply = clients[(i % 2) as usize]
                        .set(&format!("fleet:{k}"), i.to_string().as_bytes());
                    if reply == b"STORED\r\n" {
                        acked[k].fetch_max(i, Ordering::SeqCst);
                        writes.fetch_add(1, Ordering::Relaxed);
                    } else {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                    i += 1;
                }
            }));
        }
        for addr in addrs {
            let (acked, stop) = (acked.clone(), stop.clone());
            let (reads, stale) = (reads.clone(), stale.clone());
            threads.push(std::thread::spawn(move || {
                let mut client = Client::connect(&addr);
                let mut j = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let k = j % acked.len();
                    let floor = acked[k].load(Ordering::SeqCst);
                    if let Some(value) = client.get(&format!("fleet:{k}")) {
                        let value: u64 = String::from_utf8_lossy(&value).parse().unwrap();
                        if value < floor {
                            stale.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    reads.fetch_add(1, Ordering::Relaxed);
                    j += 7;
                }
            }));
        }
        StaleCheck {
            stop,
            writes,
            reads,
            stale,
            errors,
            threads,
        }
    }

    fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    /// Waits for `n` more acknowledged writes.
    fn more_writes(&self, what: &str, n: u64) {
        let from = self.writes();
        wait_for(what, || self.writes() >= from + n);
    }

    /// Waits for `n` more acknowledged writes, or `most` if they are slow
    /// (under load), whichever comes first.
    fn more_writes_within(&self, n: u64, most: Duration) {
        let (from, start) = (self.writes(), Instant::now());
        while self.writes() < from + n && start.elapsed() < most {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Stops: writes, reads, stale reads, failed writes.
    fn finish(mut self) -> (u64, u64, u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            t.join().unwrap();
        }
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        (
            get(&self.writes),
            get(&self.reads),
            get(&self.stale),
            get(&self.errors),
        )
    }
}

/// The change a held-back sidecar misses.
#[derive(Clone, Copy, PartialEq)]
enum Change {
    /// c joins a and b.
    Join,
    /// b leaves a, b and c.
    Leave,
    /// b's weight goes from 1 to 3 (a and b).
    Reweight,
}

/// The servers `proxy` reads from now with their weights, sorted.
fn weights(proxy: &Proxy) -> Vec<(String, u32)> {
    let topology = proxy.running().topology.load();
    let mut servers: Vec<(String, u32)> = topology
        .ring_servers()
        .into_iter()
        .map(|s| (s.name, s.weight))
        .collect();
    servers.sort();
    servers
}

/// Two sidecars over a and b (and c, see [`Change`]); the second's link to
/// etcd is cut while the change is made, and restored after 1 000 more
/// writes (4 s at most); clients write through both and read through both
/// meanwhile. `discovery`: more `[discovery]` keys. Returns (writes,
/// reads, stale, errors).
fn a_sidecar_held_back(
    test: &str,
    discovery: &str,
    gated: bool,
    change: Change,
) -> (u64, u64, u64, u64) {
    let fleet = Fleet::start(test);
    let Fleet {
        etcd,
        dir_a,
        dir_b,
        b,
        c,
        ..
    } = fleet;
    let (before, after): (&[&str], &[&str]) = match change {
        Change::Leave => {
            etcd.put(&key_of("c"), &record(&c, "ACTIVE"));
            (&["a", "b", "c"], &["a", "c"])
        }
        Change::Join => (&["a", "b"], &["a", "b", "c"]),
        Change::Reweight => (&["a", "b"], &["a", "b"]),
    };
    let new_weights = |proxy: &Proxy| {
        change != Change::Reweight || weights(proxy) == [("a".to_string(), 1), ("b".to_string(), 3)]
    };
    let link = Link::start(etcd.client_port);
    // [discovery] is the config's last table: its keys are appended.
    let first = Proxy::start_text(&(etcd_config(&etcd.endpoint(), &dir_a, "") + discovery));
    let held = Proxy::start_text(&(etcd_config(&link.endpoint(), &dir_b, "") + discovery));
    wait_for("both sidecars registered", || registered(&etcd) == 2);
    wait_for("both sidecars on the first ring", || {
        reads_from(&first) == before && reads_from(&held) == before
    });
    let check = StaleCheck::start([&first, &held], 300);
    check.more_writes("traffic before the change", 500);

    link.cut(true);
    let cut = Instant::now();
    match change {
        Change::Leave => etcd.put(&key_of("b"), &record(&b, "LEAVING")),
        Change::Join => etcd.put(&key_of("c"), &record(&c, "ACTIVE")),
        Change::Reweight => etcd.put(
            &key_of("b"),
            &format!(r#"{{"addr":"{}","weight":3,"state":"ACTIVE"}}"#, b.addr()),
        ),
    }
    if gated {
        wait_for("the first sidecar stages the change", || {
            stat(&first, "membership_staged_revision") > 0
        });
    } else {
        wait_for("the first sidecar reads from the new ring", || {
            reads_from(&first) == after && new_weights(&first)
        });
    }
    // Held back well within its lease (10 s, renewed every 3.3 s): it
    // still counts.
    check.more_writes_within(1_000, Duration::from_secs(4));
    assert_eq!(reads_from(&held), before, "held back: it cannot know");
    if change == Change::Reweight {
        assert!(weights(&held).iter().all(|(_, w)| *w == 1), "held back");
    }
    if gated {
        assert_eq!(
            reads_from(&first),
            before,
            "waits for the held-back sidecar"
        );
        if change == Change::Reweight {
            assert!(weights(&first).iter().all(|(_, w)| *w == 1), "staged");
        }
        assert_eq!(stat(&first, "fleet_sidecars_waited_on"), 1);
    }
    assert_eq!(
        registered(&etcd),
        2,
        "the held-back sidecar's lease outlived the cut"
    );
    link.cut(false);
    wait_for("both sidecars read from the new ring", || {
        reads_from(&first) == after
            && reads_from(&held) == after
            && new_weights(&first)
            && new_weights(&held)
    });
    let took = cut.elapsed();
    check.more_writes("traffic after the switch", 1_500);
    let figures = check.finish();
    eprintln!("{test}: cut for {took:?}; writes, reads, stale, errors: {figures:?}");
    assert_eq!(stat(&first, "membership_staged_revision"), 0);
    assert_eq!(stat(&first, "fleet_forced_switches"), 0);
    figures
}

/// [`a_sidecar_held_back`] with the gating on: no errors, no stale read.
fn gated_no_read_is_stale(test: &str, change: Change) {
    let (writes, reads, stale, errors) = a_sidecar_held_back(test, "", true, change);
    assert_eq!(errors, 0);
    assert!(
        writes > 3_000 && reads > 3_000,
        "{writes} writes, {reads} reads"
    );
    assert_eq!(
        stale, 0,
        "{stale} of {reads} reads older than an acknowledged write"
    );
}

/// [`a_sidecar_held_back`] with `fleet_switch_ms = 0`, each sidecar
/// switching as soon as it learns of the change (as before the gating,
/// and as with the file or DNS): no errors, but stale reads. Returns the
/// writes.
fn ungated_reads_are_stale(test: &str, change: Change) -> u64 {
    let (writes, reads, stale, errors) =
        a_sidecar_held_back(test, "fleet_switch_ms = 0\n", false, change);
    assert_eq!(errors, 0);
    assert!(
        stale > 0,
        "0 of {reads} reads stale: the scenario does not show the race"
    );
    writes
}

#[test]
fn a_sidecar_held_back_from_etcd_holds_the_others_back_and_no_read_is_stale() {
    gated_no_read_is_stale("held-back", Change::Join);
}

#[test]
fn reads_move_once_the_requests_planned_before_are_over_not_after_request_timeout() {
    // request_timeout_ms = 5000: a fixed wait of request_timeout after
    // staging (the cap) would move reads 5 s after the change at least.
    let test = "drained";
    let fleet = Fleet::start(test);
    let Fleet {
        etcd,
        dir_a,
        dir_b,
        c,
        ..
    } = fleet;
    let settings = "request_timeout_ms = 5000";
    let first = Proxy::start_text(&etcd_config(&etcd.endpoint(), &dir_a, settings));
    let second = Proxy::start_text(&etcd_config(&etcd.endpoint(), &dir_b, settings));
    wait_for("both sidecars registered", || registered(&etcd) == 2);
    let check = StaleCheck::start([&first, &second], 300);
    check.more_writes("traffic before the change", 500);
    let put = Instant::now();
    etcd.put(&key_of("c"), &record(&c, "ACTIVE"));
    let mut took = [None, None];
    while took.contains(&None) && put.elapsed() < Duration::from_secs(20) {
        for (i, proxy) in [&first, &second].into_iter().enumerate() {
            if took[i].is_none() && reads_from(proxy) == ["a", "b", "c"] {
                took[i] = Some(put.elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    check.more_writes("traffic after the switch", 500);
    let (writes, reads, stale, errors) = check.finish();
    eprintln!("{test}: switched after {took:?}; writes, reads, stale, errors: {writes}, {reads}, {stale}, {errors}");
    let slowest = took.iter().map(|t| t.expect("switched within 20 s")).max();
    assert!(
        slowest < Some(Duration::from_millis(2_500)),
        "reads moved {slowest:?} after the change"
    );
    assert_eq!((stale, errors), (0, 0));
    assert_eq!(stat(&first, "fleet_forced_switches"), 0);
    assert_eq!(stat(&second, "fleet_forced_switches"), 0);
}

#[test]
fn a_deletion_one_sidecar_watched_and_another_read_when_it_started_switches_without_the_bound() {
    // The first sidecar dates c's deletion by the deletion's revision; the
    // second, started after it, never saw c and dates what it read (a and
    // b) by their last writes, earlier: by revisions, the first would wait
    // for the second until fleet_switch_ms.
    let test = "deleted";
    let fleet = Fleet::start(test);
    let Fleet {
        etcd,
        dir_a,
        dir_b,
        c,
        ..
    } = fleet;
    etcd.put(&key_of("c"), &record(&c, "ACTIVE"));
    // c's grace, then one more: it still answers (damping).
    let discovery = "member_grace_ms = 1500\nfleet_switch_ms = 60000\n";
    let first = Proxy::start_text(&(etcd_config(&etcd.endpoint(), &dir_a, "") + discovery));
    wait_for("the first sidecar registered on a, b, c", || {
        registered(&etcd) == 1 && reads_from(&first) == ["a", "b", "c"]
    });
    etcd.delete(&key_of("c"));
    let deleted = Instant::now();
    let second = Proxy::start_text(&(etcd_config(&etcd.endpoint(), &dir_b, "") + discovery));
    wait_for("both sidecars registered", || registered(&etcd) == 2);
    assert_eq!(reads_from(&second), ["a", "b"]);
    assert_eq!(
        reads_from(&first),
        ["a", "b", "c"],
        "c is SUSPECT on the first sidecar until its grace is over"
    );
    while reads_from(&first) != ["a", "b"] && deleted.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let took = deleted.elapsed();
    eprintln!("{test}: the first sidecar left c {took:?} after its deletion");
    assert_eq!(reads_from(&first), ["a", "b"], "after {took:?}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert_eq!(stat(&first, "fleet_forced_switches"), 0);
    assert_eq!(stat(&second, "fleet_forced_switches"), 0);
}

#[test]
fn without_the_gating_a_held_back_sidecar_makes_reads_stale() {
    let writes = ungated_reads_are_stale("ungated", Change::Join);
    assert!(writes > 3_000, "{writes} writes");
}

#[test]
fn a_sidecar_held_back_while_a_member_leaves_holds_the_others_back_and_no_read_is_stale() {
    gated_no_read_is_stale("held-back-leave", Change::Leave);
}

#[test]
fn a_sidecar_held_back_while_a_member_is_reweighted_holds_the_others_back_and_no_read_is_stale() {
    gated_no_read_is_stale("held-back-reweight", Change::Reweight);
}

#[test]
fn without_the_gating_a_reweight_makes_reads_through_a_held_back_sidecar_stale() {
    ungated_reads_are_stale("ungated-reweight", Change::Reweight);
}

#[test]
fn without_the_gating_a_member_leaving_makes_reads_through_a_held_back_sidecar_stale() {
    ungated_reads_are_stale("ungated-leave", Change::Leave);
}

#[test]
fn a_sidecar_started_while_a_change_waits_for_a_held_back_one_starts_on_the_ring_in_force() {
    let test = "started-staged";
    let fleet = Fleet::start(test);
    let Fleet {
        etcd,
        dir_a,
        dir_b,
        c,
        ..
    } = fleet;
    let dir_c = TempDir::new("fleet", &format!("{test}-c"));
    let link = Link::start(etcd.client_port);
    let first = Proxy::start_text(&etcd_config(&etcd.endpoint(), &dir_a, ""));
    let held = Proxy::start_text(&etcd_config(&link.endpoint(), &dir_b, ""));
    wait_for("both sidecars registered", || registered(&etcd) == 2);
    link.cut(true);
    let cut = Instant::now();
    etcd.put(&key_of("c"), &record(&c, "ACTIVE"));
    wait_for("the first sidecar stages the change", || {
        stat(&first, "membership_staged_revision") > 0
    });
    // A third sidecar starts while the fleet waits for the held-back one.
    let third = Proxy::start_text(&etcd_config(&etcd.endpoint(), &dir_c, ""));
    wait_for("the third sidecar registered", || registered(&etcd) == 3);
    assert_eq!(reads_from(&third), ["a", "b"], "the ring the others read");
    assert_eq!(reads_from(&held), ["a", "b"]);
    // Writes through the held-back one, reads through the third (and the
    // reverse), while the held-back one cannot know of c.
    let check = StaleCheck::start([&held, &third], 300);
    check.more_writes_within(600, Duration::from_millis(2_500));
    assert_eq!(reads_from(&first), ["a", "b"], "still waits");
    assert_eq!(reads_from(&third), ["a", "b"], "waits too");
    assert!(cut.elapsed() < Duration::from_secs(6), "within the lease");
    link.cut(false);
    wait_for("every sidecar reads from a, b, c", || {
        [&first, &held, &third]
            .iter()
            .all(|p| reads_from(p) == ["a", "b", "c"])
    });
    check.more_writes("traffic after the switch", 1_000);
    let (writes, reads, stale, errors) = check.finish();
    eprintln!("{test}: writes, reads, stale, errors: {writes}, {reads}, {stale}, {errors}");
    assert_eq!((stale, errors), (0, 0), "of {reads} reads");
    for proxy in [&first, &held, &third] {
        assert_eq!(stat(proxy, "fleet_forced_switches"), 0);
    }
    assert_eq!(
        etcd.ctl(&["get", "--print-value-only", &format!("{PREFIX}staged")])
            .trim(),
        "",
        "the staged record is gone once switched"
    );
}

/// A sidecar as a process of its own, over `etcd`, listening on `port`
/// (its state file beside its config, `other.toml.handoff-state`).
fn sidecar_process(etcd: &Etcd, dir: &TempDir, port: u16) -> Daemon {
    let config = dir.path("other.toml");
    let text = etcd_config(&etcd.endpoint(), dir, "")
        .replace("members.json", "other.json")
        .replacen("127.0.0.1:0", &format!("127.0.0.1:{port}"), 1);
    std::fs::write(&config, text).unwrap();
    Daemon::start(&config, &dir.path("other.log"), &[])
}

#[test]
fn a_killed_sidecar_holds_a_change_back_only_until_its_lease_expires() {
    let fleet = Fleet::start("killed");
    let Fleet {
        etcd,
        dir_a: dir,
        c,
        ..
    } = fleet;
    let proxy = Proxy::start_text(&etcd_config(&etcd.endpoint(), &dir, ""));
    let other = sidecar_process(&etcd, &dir, free_port());
    wait_for("both sidecars registered", || registered(&etcd) == 2);
    // SIGKILL: its registration stays until its lease (10 s) expires.
    drop(other);
    let killed = Instant::now();
    etcd.put(&key_of("c"), &record(&c, "ACTIVE"));
    wait_for("c staged", || {
        stat(&proxy, "membership_staged_revision") > 0
    });
    assert_eq!(reads_from(&proxy), ["a", "b"]);
    wait_for("the staged change waits for the killed sidecar", || {
        stat(&proxy, "fleet_sidecars_waited_on") == 1
    });
    wait_for("the killed sidecar's lease expires", || {
        registered(&etcd) == 1
    });
    wait_for("reads move to c", || {
        reads_from(&proxy) == ["a", "b", "c"] && stat(&proxy, "membership_staged_revision") == 0
    });
    let took = killed.elapsed();
    assert!(took < Duration::from_secs(15), "{took:?}");
    assert_eq!(stat(&proxy, "fleet_forced_switches"), 0, "not by the bound");
}

#[test]
fn a_sidecar_that_never_stages_holds_a_change_back_for_fleet_switch_ms_at_most() {
    let etcd = Etcd::start("stuck");
    let dir = TempDir::new("fleet", "stuck");
    let (a, b) = (Memcached::start(), Memcached::start());
    etcd.put(&key_of("a"), &record(&a, "ACTIVE"));
    // A registration without a lease that never moves: a sidecar stuck
    // on revision 1 that etcd keeps for ever.
    etcd.put(
        &format!("{PREFIX}proxies/stuck"),
        r#"{"revision":1,"staged":0}"#,
    );
    let proxy =
        Proxy::start_text(&(etcd_config(&etcd.endpoint(), &dir, "") + "fleet_switch_ms = 1500\n"));
    let staged = Instant::now();
    etcd.put(&key_of("b"), &record(&b, "ACTIVE"));
    wait_for("b staged", || {
        stat(&proxy, "membership_staged_revision") > 0
    });
    wait_for("reads move to b", || {
        reads_from(&proxy) == ["a", "b"] && stat(&proxy, "membership_staged_revision") == 0
    });
    assert!(staged.elapsed() >= Duration::from_millis(1_500));
    assert_eq!(stat(&proxy, "fleet_forced_switches"), 1);
}

fn client_stat(addr: &str, name: &str) -> i64 {
    stat_text(&mut Client::connect(addr), name)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no STAT {name}"))
}

#[test]
fn a_sidecar_restarted_mid_change_without_its_state_file_resurrects_no_delete() {
    let fleet = Fleet::start("restart");
    let Fleet {
        etcd,
        dir_a: dir,
        c,
        ..
    } = fleet;
    let stays = Proxy::start_text(&etcd_config(&etcd.endpoint(), &dir, ""));
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let other = sidecar_process(&etcd, &dir, port);
    wait_for("both sidecars registered", || registered(&etcd) == 2);
    let keys: Vec<String> = (0..1_000).map(|i| format!("resurrect:{i}")).collect();
    let mut client = stays.client();
    for key in &keys {
        assert_eq!(client.set(key, b"old"), b"STORED\r\n");
    }
    // c joins: both switch and open the hand-off window.
    let before = stat(&stays, "membership_revision");
    etcd.put(&key_of("c"), &record(&c, "ACTIVE"));
    wait_for("both sidecars applied c", || {
        let revision = stat(&stays, "membership_revision");
        revision > before
            && reads_from(&stays) == ["a", "b", "c"]
            && client_stat(&addr, "membership_revision") == revision
    });
    // The other is killed and starts again without its state file, as a
    // new pod would, while the window is in force.
    drop(other);
    std::fs::remove_file(dir.path("other.toml.handoff-state")).unwrap();
    let restarted = sidecar_process(&etcd, &dir, port);
    wait_for("the restarted sidecar answers", || {
        std::net::TcpStream::connect(&addr).is_ok()
    });
    let start = Instant::now();
    while client_stat(&addr, "handoff_until") == 0 && start.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(10));
    }
    // Every key deleted through it, then read through the first sidecar.
    let mut through_restarted = Client::connect(&addr);
    for key in &keys {
        let reply = through_restarted.call(format!("delete {key}\r\n").as_bytes(), ReplyKind::Line);
        // NOT_FOUND where only the previous owner held it and the window
        // is not known.
        assert!(
            reply == b"DELETED\r\n" || reply == b"NOT_FOUND\r\n",
            "{key}"
        );
    }
    let resurrected = keys.iter().filter(|k| client.get(k).is_some()).count();
    assert_eq!(
        resurrected, 0,
        "{resurrected} of 1000 deleted keys read back"
    );
    assert!(
        client_stat(&addr, "handoff_until") > 0,
        "the window taken up"
    );
    assert_eq!(restarted.count("joining the fleet's hand-off window"), 1);
}

#[test]
fn a_noreply_write_still_unanswered_holds_the_staged_change_back_until_it_is_answered() {
    // Work a request leaves behind counts in the drain: a `noreply` write
    // planned on the ring in force has no client waiting for it, but until
    // its server answered it may still be landing on a key's previous
    // owner, so the sidecar must not say it staged the change yet.
    // The drain's bound (request_timeout, capped at 5 s) is far off.
    let run = SlowA::start("left-behind", "request_timeout_ms = 5000");
    run.slow.hold(true);
    let mut client = run.first.client();
    let keys: Vec<String> = (0..64).map(|i| format!("behind:{i}")).collect();
    for key in &keys {
        client.send(format!("set {key} 0 0 1 noreply\r\nx\r\n").as_bytes());
    }
    // The writes reach a (only its replies are held).
    let mut on_a = run.fleet.a.client();
    wait_for("a noreply write landed on a, its reply held", || {
        keys.iter().any(|k| on_a.get(k).is_some())
    });
    run.staged_only_once_a_answers("a noreply write");
}

/// Two sidecars over a and b, each reaching etcd through a link of its
/// own, with clients writing and reading through both; c has joined while
/// the second's link was cut (since `cut`), and the first has staged it at
/// revision `joined`. The parts drop in this order: the clients stop
/// before the sidecars and the sidecars before the servers and etcd.
struct CStagedWhileTheSecondIsCut {
    check: StaleCheck,
    first: Proxy,
    held: Proxy,
    link_first: Link,
    link: Link,
    cut: Instant,
    joined: i64,
    fleet: Fleet,
}

impl CStagedWhileTheSecondIsCut {
    fn start(fleet: Fleet) -> CStagedWhileTheSecondIsCut {
        let etcd = &fleet.etcd;
        let (link_first, link) = (Link::start(etcd.client_port), Link::start(etcd.client_port));
        let first = Proxy::start_text(&etcd_config(&link_first.endpoint(), &fleet.dir_a, ""));
        let held = Proxy::start_text(&etcd_config(&link.endpoint(), &fleet.dir_b, ""));
        wait_for("both sidecars registered", || registered(etcd) == 2);
        wait_for("both sidecars on a and b", || {
            reads_from(&first) == ["a", "b"] && reads_from(&held) == ["a", "b"]
        });
        let check = StaleCheck::start([&first, &held], 300);
        check.more_writes("traffic before the changes", 500);
        link.cut(true);
        let cut = Instant::now();
        etcd.put(&key_of("c"), &record(&fleet.c, "ACTIVE"));
        wait_for("the first sidecar stages c", || {
            stat(&first, "membership_staged_revision") > 0
        });
        let joined = stat(&first, "membership_staged_revision");
        check.more_writes_within(300, Duration::from_secs(1));
        CStagedWhileTheSecondIsCut {
            check,
            first,
            held,
            link_first,
            link,
            cut,
            joined,
            fleet,
        }
    }
}

/// c joins, then b leaves, while the second sidecar cannot hear of either
/// (its link to etcd cut); with `first_misses_the_second`, the first's
/// link is cut too before b leaves and mended after the second's, so the
/// second stages both changes at once before the first hears of b. Clients
/// write and read through both meanwhile. Returns (writes, reads, stale,
/// errors).
fn a_second_change_while_one_is_staged(
    test: &str,
    first_misses_the_second: bool,
) -> (u64, u64, u64, u64) {
    let run = CStagedWhileTheSecondIsCut::start(Fleet::start(test));
    let (first, held, etcd) = (&run.first, &run.held, &run.fleet.etcd);
    let (check, joined) = (&run.check, run.joined);
    if first_misses_the_second {
        run.link_first.cut(true);
    }
    etcd.put(&key_of("b"), &record(&run.fleet.b, "LEAVING"));
    if first_misses_the_second {
        run.link.cut(false);
        wait_for("the second sidecar stages both changes", || {
            stat(held, "membership_staged_revision") > joined
        });
        check.more_writes_within(500, Duration::from_secs(1));
        assert_eq!(reads_from(held), ["a", "b"], "waits for the first");
        run.link_first.cut(false);
    } else {
        wait_for("the first sidecar stages b's leaving on top", || {
            stat(first, "membership_staged_revision") > joined
        });
        check.more_writes_within(1_000, Duration::from_secs(3));
        assert_eq!(reads_from(first), ["a", "b"], "still waits");
        assert_eq!(reads_from(held), ["a", "b"], "held back: it cannot know");
        assert_eq!(stat(first, "fleet_sidecars_waited_on"), 1);
        run.link.cut(false);
    }
    assert!(
        run.cut.elapsed() < Duration::from_secs(8),
        "within the lease"
    );
    wait_for("both sidecars read from a and c", || {
        reads_from(first) == ["a", "c"] && reads_from(held) == ["a", "c"]
    });
    check.more_writes("traffic after the switch", 1_500);
    let figures = run.check.finish();
    eprintln!("{test}: writes, reads, stale, errors: {figures:?}");
    for proxy in [&run.first, &run.held] {
        assert_eq!(stat(proxy, "fleet_forced_switches"), 0);
        assert_eq!(stat(proxy, "membership_staged_revision"), 0);
    }
    assert_eq!(
        run.fleet
            .etcd
            .ctl(&["get", "--print-value-only", &format!("{PREFIX}staged")])
            .trim(),
        "",
        "the staged record is gone once switched"
    );
    figures
}

#[test]
fn a_second_change_while_the_first_waits_for_a_held_back_sidecar_reads_nothing_stale() {
    let (_, reads, stale, errors) = a_second_change_while_one_is_staged("chained", false);
    assert_eq!((stale, errors), (0, 0), "of {reads} reads");
}

#[test]
fn a_held_back_sidecar_that_stages_two_changes_at_once_before_the_other_hears_of_the_second_reads_nothing_stale(
) {
    let (_, reads, stale, errors) = a_second_change_while_one_is_staged("chained-both", true);
    assert_eq!((stale, errors), (0, 0), "of {reads} reads");
}

#[test]
fn a_sidecar_that_staged_a_later_change_in_place_of_the_first_holds_the_first_back() {
    // c joins (the first sidecar stages it; the second is cut off), then c
    // leaves and d joins while the first is cut off too: the second learns
    // both at once and stages a, b, d over a, b, never writing c. Its
    // registration's revision is later than c's join, but it does not
    // write c: the first must not read a, b, c. Were it to, it would read
    // c while writes through the second reach a, b and d only; the first's
    // link is then cut again for 2 s to show what it reads meanwhile.
    let test = "in-place";
    let fleet = Fleet::start(test);
    let d = Memcached::start();
    let run = CStagedWhileTheSecondIsCut::start(fleet);
    let (first, held, etcd) = (&run.first, &run.held, &run.fleet.etcd);
    let (check, link_first) = (&run.check, &run.link_first);
    link_first.cut(true);
    etcd.put(&key_of("c"), &record(&run.fleet.c, "LEAVING"));
    etcd.put(&key_of("d"), &record(&d, "ACTIVE"));
    run.link.cut(false);
    wait_for("the second sidecar stages a, b, d", || {
        stat(held, "membership_staged_revision") > run.joined
    });
    check.more_writes_within(500, Duration::from_secs(1));
    assert_eq!(reads_from(held), ["a", "b"], "waits for the first");
    link_first.cut(false);
    let mended = Instant::now();
    let mut read_c = false;
    while mended.elapsed() < Duration::from_secs(15) {
        if reads_from(first) == ["a", "b", "c"] {
            read_c = true;
            link_first.cut(true);
            check.more_writes_within(2_000, Duration::from_secs(2));
            link_first.cut(false);
            break;
        }
        if reads_from(first) == ["a", "b", "d"] {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    wait_for("both sidecars read from a, b, d", || {
        reads_from(first) == ["a", "b", "d"] && reads_from(held) == ["a", "b", "d"]
    });
    check.more_writes("traffic after the switch", 1_500);
    let (writes, reads, stale, errors) = run.check.finish();
    eprintln!(
        "{test}: read c: {read_c}; writes, reads, stale, errors: {writes}, {reads}, {stale}, {errors}"
    );
    assert_eq!(
        (stale, errors),
        (0, 0),
        "of {reads} reads (read c: {read_c})"
    );
    assert!(!read_c, "the first read c, which the second never wrote");
    for proxy in [first, held] {
        assert_eq!(stat(proxy, "fleet_forced_switches"), 0);
    }
}

#[test]
fn a_replicated_cas_copy_still_unanswered_holds_the_staged_change_back_until_it_is_answered() {
    // A replicated `cas` is answered by its owner; its copies to the other
    // replicas want no reply, but until a replica answered, its copy may
    // still be landing there, on a ring the fleet is leaving: the drain
    // counts it as it counts a `noreply` write.
    let run = SlowA::start("copy-behind", "request_timeout_ms = 5000\nreplicas = 2");
    // Keys b owns: the cas goes to b, which answers; the copy to a.
    let topology = run.first.running().topology.load_full();
    let keys: Vec<String> = (0..200)
        .map(|i| format!("copied:{i}"))
        .filter(|k| {
            let owner = topology.owner_index(k.as_bytes()).expect("an owner");
            topology.config.servers[owner].name == "b"
        })
        .take(16)
        .collect();
    assert_eq!(keys.len(), 16);
    let mut client = run.first.client();
    let mut unique = Vec::new();
    for key in &keys {
        assert_eq!(client.set(key, b"old"), b"STORED\r\n");
        let reply = client.call(format!("gets {key}\r\n").as_bytes(), ReplyKind::Values);
        let header = String::from_utf8_lossy(&reply)
            .lines()
            .next()
            .unwrap_or("")
            .to_string();
        let cas: u64 = header
            .split(' ')
            .nth(4)
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("gets {key}: {header}"));
        unique.push(cas);
    }
    run.slow.hold(true);
    for (key, cas) in keys.iter().zip(&unique) {
        let request = format!("cas {key} 0 0 3 {cas}\r\nnew\r\n");
        assert_eq!(
            client.call(request.as_bytes(), ReplyKind::Line),
            b"STORED\r\n"
        );
    }
    // The copies reach a (only its replies are held).
    let mut on_a = run.fleet.a.client();
    wait_for("the copies landed on a, their replies held", || {
        keys.iter()
            .all(|k| on_a.get(k).as_deref() == Some(&b"new"[..]))
    });
    run.staged_only_once_a_answers("a cas copy");
}

#[test]
fn a_joining_member_held_back_by_a_stuck_sidecar_warms_after_fleet_switch_ms_and_no_forced_switch_is_counted(
) {
    // A JOINING member moves no reads: when a sidecar that never stages
    // holds its JOINING back, fleet_switch_ms lets it take writes, which is
    // not a switch of reads (fleet_forced_switches stays 0).
    let test = "stuck-joining";
    let etcd = Etcd::start(test);
    let dir = TempDir::new("fleet", test);
    let (a, j) = (Memcached::start(), Memcached::start());
    etcd.put(&key_of("a"), &record(&a, "ACTIVE"));
    etcd.put(
        &format!("{PREFIX}proxies/stuck"),
        r#"{"revision":1,"staged":0}"#,
    );
    let proxy =
        Proxy::start_text(&(etcd_config(&etcd.endpoint(), &dir, "") + "fleet_switch_ms = 1500\n"));
    wait_for("registered beside the stuck one", || registered(&etcd) == 2);
    let keys: Vec<String> = (0..40).map(|i| format!("warm:{i}")).collect();
    let mut client = proxy.client();
    let mut on_j = j.client();
    let written_to_j = |client: &mut Client, on_j: &mut Client| {
        for key in &keys {
            assert_eq!(client.set(key, b"v"), b"STORED\r\n");
        }
        keys.iter().filter(|k| on_j.get(k).is_some()).count()
    };
    let put = Instant::now();
    etcd.put(&key_of("j"), &record(&j, "JOINING"));
    wait_for("j's JOINING staged", || {
        stat(&proxy, "membership_staged_revision") > 0
    });
    if put.elapsed() < Duration::from_millis(1_200) {
        assert_eq!(
            written_to_j(&mut client, &mut on_j),
            0,
            "deletes only until fleet_switch_ms"
        );
    }
    wait_for("j takes writes after fleet_switch_ms", || {
        stat(&proxy, "membership_staged_revision") == 0 && written_to_j(&mut client, &mut on_j) > 0
    });
    assert!(put.elapsed() >= Duration::from_millis(1_500));
    assert_eq!(reads_from(&proxy), ["a"], "no reads moved");
    assert_eq!(
        stat(&proxy, "fleet_forced_switches"),
        0,
        "no reads were switched"
    );
}
