//! The memring binary run as a daemon, as an operator runs it: `memring
//! --config FILE` with `RUST_LOG=info`. Its log (stderr) is read by a thread
//! of its own, so the daemon never blocks on a full pipe and a wait for a
//! log line has the harness's deadline; the process is killed by PID when
//! the handle drops.

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::Instant;

use super::{wait_for, DEADLINE};

/// A running `memring --config FILE`.
pub(crate) struct Daemon {
    child: Child,
    log: Receiver<String>,
}

impl Daemon {
    /// Starts the daemon on the config file at `config`.
    pub(crate) fn start(config: &Path) -> Daemon {
        let mut child = Command::new(env!("CARGO_BIN_EXE_memring"))
            .arg("--config")
            .arg(config)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run memring");
        let stderr = child.stderr.take().expect("piped stderr");
        let (lines, log) = mpsc::channel();
        std::thread::spawn(move || {
            // Read to the end even once nobody listens: the pipe stays empty.
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = lines.send(line);
            }
        });
        Daemon { child, log }
    }

    /// The daemon's process id.
    pub(crate) fn id(&self) -> u32 {
        self.child.id()
    }

    /// The next log line that contains `text` (earlier lines are skipped).
    ///
    /// # Panics
    /// The daemon exits, or logs no such line within the deadline.
    pub(crate) fn log_line(&mut self, text: &str) -> String {
        let start = Instant::now();
        loop {
            let left = DEADLINE.saturating_sub(start.elapsed());
            match self.log.recv_timeout(left) {
                Ok(line) if line.contains(text) => return line,
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => panic!("timed out waiting for log line `{text}`"),
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("memring exited without logging `{text}`")
                }
            }
        }
    }

    /// Sends SIGTERM, as a service manager stops the daemon.
    pub(crate) fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM {}", self.id());
    }

    /// Waits for the daemon to exit (within the deadline); its status.
    pub(crate) fn wait_exit(&mut self, what: &str) -> ExitStatus {
        let mut exit = None;
        wait_for(what, || {
            exit = self.child.try_wait().expect("wait for memring");
            exit.is_some()
        });
        exit.expect("exited")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
