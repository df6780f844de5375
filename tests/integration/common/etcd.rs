//! A real etcd (Debian's `etcd-server`, `/usr/bin/etcd`) on free loopback
//! ports with its own data directory, and `etcdctl` against it. The process
//! is killed by PID when the handle drops; `stop`/`restart` keep the data.
//! It can serve TLS with client certificates required, and have
//! authentication enabled (`etcdctl` then logs in as root).

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::{free_port, TempDir, DEADLINE};

/// An etcd process owned by the test.
pub(crate) struct Etcd {
    pub client_port: u16,
    peer_port: u16,
    dir: TempDir,
    child: Option<Child>,
    tls: Option<EtcdTls>,
    /// `root:<password>` once authentication is enabled.
    user: Option<String>,
}

/// The files of an etcd that serves TLS and requires client certificates.
pub(crate) struct EtcdTls {
    pub(crate) ca: PathBuf,
    /// Its server certificate and key (for 127.0.0.1).
    pub(crate) server: (PathBuf, PathBuf),
    /// A client certificate and key that etcdctl uses.
    pub(crate) client: (PathBuf, PathBuf),
}

impl Etcd {
    /// Starts a one-node etcd for `test` and waits until it answers.
    pub(crate) fn start(test: &str) -> Etcd {
        Etcd::start_with(test, None)
    }

    /// Starts a one-node etcd serving TLS with `tls`'s files,
    /// `--client-cert-auth`: a client must show a certificate of its CA.
    pub(crate) fn start_tls(test: &str, tls: EtcdTls) -> Etcd {
        Etcd::start_with(test, Some(tls))
    }

    fn start_with(test: &str, tls: Option<EtcdTls>) -> Etcd {
        let mut etcd = Etcd {
            client_port: free_port(),
            peer_port: free_port(),
            dir: TempDir::new("etcd", test),
            child: None,
            tls,
            user: None,
        };
        etcd.spawn();
        etcd
    }

    /// `http://127.0.0.1:<client port>` (`https://` with TLS), as
    /// `etcd_endpoints` lists it.
    pub(crate) fn endpoint(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    /// Adds the user root with `password` and enables authentication:
    /// from then on a client must log in (etcdctl here does).
    pub(crate) fn enable_auth(&mut self, password: &str) {
        let user = format!("root:{password}");
        self.ctl(&["user", "add", &user, "--interactive=false"]);
        // etcdctl grants root its role when it is missing.
        self.ctl(&["auth", "enable"]);
        self.user = Some(user);
    }

    /// The store's revision now.
    pub(crate) fn revision(&self) -> i64 {
        let out = self.ctl(&["get", "--write-out=json", "/"]);
        let at = out.find("\"revision\":").expect("a header revision") + "\"revision\":".len();
        let digits: String = out[at..].chars().take_while(char::is_ascii_digit).collect();
        digits.parse().expect("a revision")
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
            .args(self.tls.iter().flat_map(|tls| {
                [
                    "--cert-file".into(),
                    tls.server.0.clone().into_os_string(),
                    "--key-file".into(),
                    tls.server.1.clone().into_os_string(),
                    "--trusted-ca-file".into(),
                    tls.ca.clone().into_os_string(),
                    "--client-cert-auth".into(),
                ]
            }))
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
        let mut command = Command::new("etcdctl");
        command.env("ETCDCTL_API", "3").args([
            "--endpoints",
            &self.endpoint(),
            "--command-timeout=5s",
        ]);
        if let Some(tls) = &self.tls {
            command
                .arg("--cacert")
                .arg(&tls.ca)
                .arg("--cert")
                .arg(&tls.client.0)
                .arg("--key")
                .arg(&tls.client.1);
        }
        if let Some(user) = &self.user {
            command.args(["--user", user]);
        }
        command.args(args).stdin(Stdio::null()).output()
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
