//! A real etcd (Debian's `etcd-server`, `/usr/bin/etcd`) on free loopback
//! ports with its own data directory, and `etcdctl` against it. The process
//! is killed by PID when the handle drops; `stop`/`restart` keep the data.

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::{free_port, TempDir, DEADLINE};

/// An etcd process owned by the test.
pub(crate) struct Etcd {
    pub client_port: u16,
    peer_port: u16,
    dir: TempDir,
    child: Option<Child>,
}

impl Etcd {
    /// Starts a one-node etcd for `test` and waits until it answers.
    pub(crate) fn start(test: &str) -> Etcd {
        let mut etcd = Etcd {
            client_port: free_port(),
            peer_port: free_port(),
            dir: TempDir::new("etcd", test),
            child: None,
        };
        etcd.spawn();
        etcd
    }

    /// `http://127.0.0.1:<client port>`, as `etcd_endpoints` lists it.
    pub(crate) fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    fn spawn(&mut self) {
        let client = self.endpoint();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::File::create(self.dir.path("etcd.log")).expect("etcd log");
        let child = Command::new("etcd")
            .args(["--name", "test"])
            .arg("--data-dir")
            .arg(self.dir.path("data"))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("test={peer}")])
            // Tests delete and expire keys quickly; nothing to keep.
            .args(["--snapshot-count", "10000"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("etcd must be installed (scripts/test installs etcd-server)");
        self.child = Some(child);
        let start = Instant::now();
        while !self.healthy() {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                let log = std::fs::read_to_string(self.dir.path("etcd.log")).unwrap_or_default();
                panic!("etcd exited ({status}): {log}");
            }
            assert!(start.elapsed() < DEADLINE, "etcd did not become healthy");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn healthy(&self) -> bool {
        self.try_ctl(&["endpoint", "health"])
            .map(|out| out.status.success())
            .unwrap_or(false)
    }

    /// Runs `etcdctl` (API v3) against this etcd.
    pub(crate) fn try_ctl(&self, args: &[&str]) -> std::io::Result<Output> {
        Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &self.endpoint(), "--command-timeout=5s"])
            .args(args)
            .stdin(Stdio::null())
            .output()
    }

    /// Runs `etcdctl` and returns its standard output; panics if it fails.
    pub(crate) fn ctl(&self, args: &[&str]) -> String {
        let out = self
            .try_ctl(args)
            .expect("etcdctl must be installed (etcd-client)");
        assert!(
            out.status.success(),
            "etcdctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `etcdctl put key value`.
    pub(crate) fn put(&self, key: &str, value: &str) {
        self.ctl(&["put", key, value]);
    }

    /// `etcdctl del key`.
    pub(crate) fn delete(&self, key: &str) {
        self.ctl(&["del", key]);
    }

    /// The value of `key`, if it exists.
    pub(crate) fn get(&self, key: &str) -> Option<String> {
        let out = self.ctl(&["get", "--print-value-only", key]);
        let value = out.trim_end_matches('\n');
        (!value.is_empty()).then(|| value.to_string())
    }

    /// Kills etcd (SIGKILL) and waits for it; the data directory stays.
    pub(crate) fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same ports with the same data.
    pub(crate) fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
    }
}
