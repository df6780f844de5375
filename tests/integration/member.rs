//! `memring member`, the agent beside each memcached, against a real etcd
//! and real memcached: its record appears JOINING under a lease, turns
//! ACTIVE after `--warm-ms`, goes LEAVING then away on SIGTERM (exit 0),
//! waits for a memcached that starts late, comes back under a new lease when
//! its lease is lost, and vanishes with its lease when the agent is killed.

use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::common::etcd::Etcd;
use crate::common::{wait_for, Memcached, TempDir, DEADLINE};
use memring::control::member_record::{MemberRecord, MemberState};

const PREFIX: &str = "/memring/test/";

/// The agent process, killed (SIGKILL) when dropped.
struct Agent {
    child: Child,
    log: std::path::PathBuf,
    _dir: TempDir,
}

impl Agent {
    fn start(test: &str, etcd: &Etcd, addr: &str, extra: &[&str]) -> Agent {
        let dir = TempDir::new("member", test);
        let log = dir.path("agent.log");
        let child = Command::new(env!("CARGO_BIN_EXE_memring"))
            .args(["member", "--etcd", &etcd.endpoint(), "--prefix", PREFIX])
            .args(["--name", "cache-01", "--addr", addr])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Agent {
            child,
            log,
            _dir: dir,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Its exit status, waited for with the deadline.
    fn exited(&mut self) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "the agent did not exit: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn key() -> String {
    format!("{PREFIX}members/cache-01")
}

fn record(etcd: &Etcd) -> Option<MemberRecord> {
    etcd.get(&key())
        .map(|v| MemberRecord::parse(v.as_bytes()).expect("a valid record"))
}

fn state(etcd: &Etcd) -> Option<MemberState> {
    record(etcd).map(|r| r.state)
}

/// The lease the key is stored under (0: none), from `etcdctl get -w json`.
fn lease_of(etcd: &Etcd) -> i64 {
    let json = etcd.ctl(&["get", "-w", "json", &key()]);
    let value: serde_json::Value = serde_json::from_str(&json).unwrap();
    value["kvs"][0]["lease"].as_i64().unwrap_or(0)
}

#[test]
fn the_agent_registers_joining_under_a_lease_then_active_and_leaves_on_sigterm() {
    let etcd = Etcd::start("member-lifecycle");
    let server = Memcached::start();
    let mut agent = Agent::start(
        "lifecycle",
        &etcd,
        &server.addr(),
        &[
            "--warm-ms",
            "2000",
            "--drain-ms",
            "1500",
            "--weight",
            "3",
            "--zone",
            "b",
        ],
    );
    wait_for("the record", || record(&etcd).is_some());
    let first = record(&etcd).unwrap();
    assert_eq!(
        first,
        MemberRecord {
            addr: server.addr(),
            weight: 3,
            state: MemberState::Joining,
            zone: Some("b".into()),
            tls: false,
        }
    );
    assert_ne!(lease_of(&etcd), 0, "stored under a lease");
    wait_for("ACTIVE after --warm-ms", || {
        state(&etcd) == Some(MemberState::Active)
    });

    agent.signal("TERM");
    wait_for("LEAVING on SIGTERM", || {
        state(&etcd) == Some(MemberState::Leaving)
    });
    wait_for("the key deleted after the drain", || {
        record(&etcd).is_none()
    });
    let status = agent.exited();
    assert!(status.success(), "{status:?}: {}", agent.log());
    let leases = etcd.ctl(&["lease", "list"]);
    assert!(leases.contains("found 0 leases"), "revoked: {leases}");
}

#[test]
fn the_agent_waits_for_a_memcached_that_starts_late() {
    let etcd = Etcd::start("member-late");
    let mut server = Memcached::start();
    server.kill();
    let agent = Agent::start("late", &etcd, &server.addr(), &["--warm-ms", "0"]);
    wait_for("the agent to say it waits", || {
        agent.log().contains("waiting for memcached to answer")
    });
    assert_eq!(
        record(&etcd),
        None,
        "nothing registered before memcached answers"
    );
    server.restart();
    wait_for("the record, ACTIVE at once", || {
        state(&etcd) == Some(MemberState::Active)
    });
}

#[test]
fn a_lost_lease_is_replaced_and_a_killed_agents_key_expires_with_its_lease() {
    let etcd = Etcd::start("member-lease");
    let server = Memcached::start();
    let mut agent = Agent::start(
        "lease",
        &etcd,
        &server.addr(),
        &["--warm-ms", "0", "--lease-ttl-s", "2"],
    );
    wait_for("the record", || state(&etcd) == Some(MemberState::Active));
    let lease = lease_of(&etcd);
    // The lease is lost (revoked, as when etcd expired it): the key goes
    // with it, and the agent registers again under a new one.
    etcd.ctl(&["lease", "revoke", &format!("{lease:x}")]);
    wait_for("the record back under a new lease", || {
        record(&etcd).is_some() && lease_of(&etcd) != lease && lease_of(&etcd) != 0
    });
    assert_eq!(state(&etcd), Some(MemberState::Active));

    // Killed: no LEAVING, no delete; the key stays until the lease expires.
    agent.signal("KILL");
    agent.exited();
    let killed = Instant::now();
    assert_eq!(state(&etcd), Some(MemberState::Active));
    wait_for("the key to expire with its lease", || {
        record(&etcd).is_none()
    });
    assert!(
        killed.elapsed() >= Duration::from_millis(500),
        "it went with the lease, not at once"
    );
}

#[test]
fn the_agent_refuses_bad_flags_clearly() {
    let run = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_memring"))
            .arg("member")
            .args(args)
            .output()
            .unwrap();
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let base = [
        "--etcd",
        "http://127.0.0.1:1",
        "--name",
        "cache-01",
        "--addr",
        "127.0.0.1:1",
    ];
    // clap's own errors: exit 2, naming the flag.
    let (code, stderr) = run(&base);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--prefix"), "{stderr}");
    let (code, stderr) = run(&[&base[..], &["--prefix", "/p/", "--weight", "0"]].concat());
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--weight"), "{stderr}");
    // What clap cannot check: exit 1 with the reason.
    let (code, stderr) = run(&[&base[..], &["--prefix", "p"]].concat());
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("--prefix \"p\" must start and end with `/`"),
        "{stderr}"
    );
    let (code, stderr) = run(&[
        "--etcd",
        "http://127.0.0.1:1",
        "--prefix",
        "/p/",
        "--name",
        "a/b",
        "--addr",
        "nowhere",
    ]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("--name \"a/b\""), "{stderr}");
    // A record every sidecar would ignore is refused before memcached is
    // waited for (nothing listens on port 1: a wait would never end).
    let zone = "z".repeat(5000);
    let (code, stderr) = run(&[&base[..], &["--prefix", "/p/", "--zone", &zone]].concat());
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("a member record is at most 4096"),
        "{stderr}"
    );
}

#[test]
fn the_agent_registers_again_when_etcd_comes_back() {
    let mut etcd = Etcd::start("member-outage");
    let server = Memcached::start();
    let agent = Agent::start(
        "outage",
        &etcd,
        &server.addr(),
        &["--warm-ms", "0", "--lease-ttl-s", "2"],
    );
    wait_for("the record", || state(&etcd) == Some(MemberState::Active));
    let lease = lease_of(&etcd);
    etcd.stop();
    wait_for("the agent to notice", || {
        agent.log().contains("registering again")
    });
    etcd.restart();
    wait_for("the record under a new lease", || {
        state(&etcd) == Some(MemberState::Active) && lease_of(&etcd) != lease
    });
    assert!(
        agent.log().matches("registered").count() >= 2,
        "{}",
        agent.log()
    );
}
