//! The `memring` binary: help and version, `check`, `plan`, `send`,
//! `healthcheck`, `completions` and `man`, the open-file-limit check, running
//! the daemon until SIGTERM, and the files the Debian package ships (its
//! config and the unit's limits).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use crate::common::daemon::Daemon;
use crate::common::{memring_plan, wait_for, Client, Memcached};

const BIN: &str = env!("CARGO_BIN_EXE_memring");

fn write_config(dir: &std::path::Path, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write config");
    path
}

fn temp_dir(test: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("memring-cli-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

#[test]
fn help_and_version_work() {
    let help = Command::new(BIN).arg("--help").output().unwrap();
    assert!(help.status.success());
    let text = String::from_utf8_lossy(&help.stdout);
    for word in ["--config", "check", "plan", "--log-level"] {
        assert!(text.contains(word), "help lacks {word}: {text}");
    }
    let version = Command::new(BIN).arg("--version").output().unwrap();
    assert!(version.status.success());
    let version = String::from_utf8_lossy(&version.stdout);
    assert!(
        version.starts_with(&format!("memring {} (commit ", env!("CARGO_PKG_VERSION"))),
        "{version}"
    );
    // Every subcommand and argument has help text.
    for (args, words) in [
        (
            &["check", "--help"][..],
            &["FILE", "The config file to validate"][..],
        ),
        (
            &["plan", "--help"],
            &["The config running now", "The config you intend"],
        ),
        (
            &["healthcheck", "--help"],
            &["admin listener", "[default: 127.0.0.1:9100]"],
        ),
        (&["send", "--help"], &["ADDR", "LINE", "Protocol lines"]),
    ] {
        let output = Command::new(BIN).args(args).output().unwrap();
        assert!(output.status.success(), "{args:?}");
        let text = String::from_utf8_lossy(&output.stdout);
        for word in words {
            assert!(text.contains(word), "{args:?} lacks {word}: {text}");
        }
    }
    let help = String::from_utf8_lossy(&Command::new(BIN).arg("--help").output().unwrap().stdout)
        .to_string();
    let commands: Vec<&str> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .collect();
    assert!(commands.len() >= 5, "{help}");
    for line in commands {
        assert!(
            line.split_whitespace().count() > 1,
            "a subcommand without help: `{line}`"
        );
    }
}

#[test]
fn a_missing_config_names_its_cause_once() {
    let output = Command::new(BIN)
        .args(["check", "/nonexistent/memring.toml"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        stderr.trim(),
        "memring: /nonexistent/memring.toml: cannot read: No such file or directory (os error 2)"
    );
}

#[test]
fn check_warns_about_more_replicas_than_servers_and_plan_flags_restarts() {
    let dir = temp_dir("warn");
    let one = "listen = \"127.0.0.1:22122\"\n[[servers]]\naddr = \"127.0.0.1:11211\"\n";
    let old = write_config(&dir, "old.toml", one);
    let three = write_config(&dir, "three.toml", &format!("replicas = 3\n{one}"));
    let output = Command::new(BIN).arg("check").arg(&three).output().unwrap();
    assert!(output.status.success(), "a warning is not an error");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("warning") && stderr.contains("replicas = 3 but only 1 server"),
        "{stderr}"
    );
    let new = write_config(
        &dir,
        "new.toml",
        &one.replace("22122", "22123").replace(
            "[[servers]]",
            "admin_listen = \"127.0.0.1:9100\"\nrequest_timeout_ms = 300\n[[servers]]",
        ),
    );
    let text = memring_plan(&old, &new);
    for expected in [
        "setting: listen 127.0.0.1:22122 -> 127.0.0.1:22123 (needs a restart)",
        "setting: admin_listen (off) -> 127.0.0.1:9100 (needs a restart)",
        "setting: request_timeout_ms 1000 -> 300 (applied on reload)",
        "restart needed: listen, admin_listen are read only at start",
    ] {
        assert!(text.contains(expected), "plan lacks `{expected}`: {text}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn send_talks_to_memcached_without_nc() {
    let backend = Memcached::start();
    let output = Command::new(BIN)
        .args(["send", &backend.addr(), "set k 0 0 2", "hi", "get k"])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "STORED\r\nVALUE k 0 2\r\nhi\r\nEND\r\n"
    );
}

#[test]
fn a_low_open_file_limit_lowers_the_client_limit_and_says_so() {
    let backend = Memcached::start();
    let dir = temp_dir("nofile");
    let config = write_config(
        &dir,
        "memring.toml",
        &format!(
            "listen = \"127.0.0.1:0\"\nmax_client_connections = 5000\n[[servers]]\naddr = \"{}\"\n",
            backend.addr()
        ),
    );
    // bash's `ulimit -n` sets the soft and the hard limit, so memring cannot
    // raise it.
    let child = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "ulimit -n 256 && exec {BIN} --config {}",
            config.display()
        ))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut guard = ChildGuard(child);
    let stderr = guard.0.stderr.take().unwrap();
    let mut warning = None;
    for line in BufReader::new(stderr).lines() {
        let line = line.unwrap();
        if line.contains("open file limit") {
            warning = Some(line);
            break;
        }
        assert!(!line.contains("listening"), "no warning before listening");
    }
    let warning = warning.expect("a warning about the open file limit");
    assert!(
        warning.contains("open file limit 256 is below max_client_connections 5000")
            && warning.contains("serving at most"),
        "{warning}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn healthcheck_prints_the_reason_it_got() {
    let mut backend = Memcached::start();
    let dir = temp_dir("health");
    let admin = format!("127.0.0.1:{}", crate::common::free_port());
    let config = write_config(
        &dir,
        "memring.toml",
        &format!(
            "listen = \"127.0.0.1:0\"\nadmin_listen = \"{admin}\"\nconnect_timeout_ms = 200\nfailure_limit = 1\n[[servers]]\naddr = \"{}\"\n",
            backend.addr()
        ),
    );
    let child = Command::new(BIN)
        .arg("--config")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _guard = ChildGuard(child);
    let healthcheck = || {
        Command::new(BIN)
            .args(["healthcheck", &admin])
            .output()
            .unwrap()
    };
    wait_for("ready", || healthcheck().status.success());
    assert_eq!(
        String::from_utf8_lossy(&healthcheck().stdout).trim(),
        "memring: ready"
    );
    backend.kill();
    let mut reason = String::new();
    wait_for("not ready once the only server is DEAD", || {
        let output = healthcheck();
        reason = String::from_utf8_lossy(&output.stderr).trim().to_string();
        !output.status.success()
    });
    assert_eq!(reason, "memring: not ready: every server is DEAD");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn no_config_is_a_usage_error() {
    let output = Command::new(BIN).output().unwrap();
    assert_eq!(output.status.code(), Some(2));
}

#[test]
fn check_accepts_a_good_file_and_names_the_place_of_a_bad_one() {
    let dir = temp_dir("check");
    let good = write_config(
        &dir,
        "good.toml",
        "listen = \"127.0.0.1:22122\"\n[[servers]]\naddr = \"127.0.0.1:11211\"\n",
    );
    let output = Command::new(BIN).arg("check").arg(&good).output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    let bad = write_config(
        &dir,
        "bad.toml",
        "listen = \"127.0.0.1:22122\"\n[[servers]]\naddr = \"127.0.0.1:11211\"\nweight = 0\n",
    );
    let output = Command::new(BIN).arg("check").arg(&bad).output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("bad.toml:4:10:"), "{stderr}");
    assert!(stderr.contains("weight 0"), "{stderr}");

    // The daemon refuses the same file with the same message.
    let output = Command::new(BIN)
        .arg("--config")
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("bad.toml:4:10:"));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn check_warns_about_two_spellings_of_one_server_and_refuses_them_with_replicas() {
    let dir = temp_dir("alias");
    let servers = "[[servers]]\naddr = \"127.0.0.1:11211\"\n[[servers]]\naddr = \"localhost:11211\"\n[[servers]]\naddr = \"127.0.0.01:11211\"\n";
    let one = write_config(
        &dir,
        "one.toml",
        &format!("listen = \"127.0.0.1:22122\"\n{servers}"),
    );
    let output = Command::new(BIN).arg("check").arg(&one).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "a warning with replicas = 1: {stderr}"
    );
    for pair in [
        "servers `127.0.0.1:11211` (line 3) and `localhost:11211` (line 5) are the same memcached (127.0.0.1:11211)",
        "servers `127.0.0.1:11211` (line 3) and `127.0.0.01:11211` (line 7) are the same memcached (127.0.0.1:11211)",
    ] {
        assert!(
            stderr.contains(&format!("memring: warning: {}: {pair}", one.display())),
            "lacks `{pair}`: {stderr}"
        );
    }

    let two = write_config(
        &dir,
        "two.toml",
        &format!("listen = \"127.0.0.1:22122\"\nreplicas = 2\n{servers}"),
    );
    let expected =
        "two.toml:6:8: server `localhost:11211` is the same memcached as `127.0.0.1:11211`";
    let output = Command::new(BIN).arg("check").arg(&two).output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(expected), "{stderr}");
    // The daemon refuses the same file with the same message.
    let output = Command::new(BIN)
        .arg("--config")
        .arg(&two)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains(expected));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn admin_listen_on_the_listen_address_is_refused() {
    let dir = temp_dir("admin-same");
    let config = write_config(
        &dir,
        "same.toml",
        "listen = \"127.0.0.1:22122\"\nadmin_listen = \"127.0.0.1:22122\"\n[[servers]]\naddr = \"127.0.0.1:11211\"\n",
    );
    let expected = "same.toml:2:16: admin_listen = \"127.0.0.1:22122\" takes the port of listen = \"127.0.0.1:22122\" (line 1)";
    for args in [&["check"][..], &["--config"]] {
        let output = Command::new(BIN).args(args).arg(&config).output().unwrap();
        assert_eq!(output.status.code(), Some(1), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_port_in_use_at_start_names_the_setting_that_holds_it() {
    let dir = temp_dir("in-use");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_addr = taken.local_addr().unwrap();
    let free = || std::net::SocketAddr::from(([127, 0, 0, 1], crate::common::free_port()));
    let server = "[[servers]]\naddr = \"127.0.0.1:11211\"\n";
    for (setting, listen, admin) in [
        ("listen", taken_addr, free()),
        ("admin_listen", free(), taken_addr),
    ] {
        let config = write_config(
            &dir,
            &format!("{setting}.toml"),
            &format!("listen = \"{listen}\"\nadmin_listen = \"{admin}\"\n{server}"),
        );
        let child = Command::new(BIN)
            .arg("--config")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut guard = ChildGuard(child);
        let mut exit = None;
        wait_for("memring to give up on a port in use", || {
            exit = guard.0.try_wait().unwrap();
            exit.is_some()
        });
        assert_eq!(exit.unwrap().code(), Some(1), "{setting}");
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut guard.0.stderr.take().unwrap(), &mut stderr).unwrap();
        let expected = format!(
            "memring: cannot start: cannot listen on {taken_addr}, the address of `{setting}`: Address already in use"
        );
        assert!(stderr.contains(&expected), "lacks `{expected}`: {stderr}");
    }
    drop(taken);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn plan_reports_shares_and_the_moved_keyspace() {
    let dir = temp_dir("plan");
    let mut four = String::from("listen = \"127.0.0.1:22122\"\n");
    for i in 1..=4 {
        four.push_str(&format!(
            "[[servers]]\naddr = \"10.0.0.{i}:11211\"\nname = \"cache-0{i}\"\n"
        ));
    }
    let five = format!("{four}[[servers]]\naddr = \"10.0.0.5:11211\"\nname = \"cache-05\"\n");
    let old = write_config(&dir, "old.toml", &four);
    let new = write_config(&dir, "new.toml", &five);
    let text = memring_plan(&old, &new);
    assert!(text.contains("cache-05"), "{text}");
    let moved: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("keyspace that moves: "))
        .and_then(|v| v.trim_end_matches('%').parse().ok())
        .unwrap_or_else(|| panic!("no moved share in {text}"));
    assert!((15.0..25.0).contains(&moved), "moved {moved}%");
    let expected = "hand-off: for 300 s, reads of moved keys";
    assert!(text.contains(expected), "{text}");
    let expected = "flush: flush_all on cache-05 before it joins the ring (flush_new_servers = \"auto\", shared_with = \"memring\")";
    assert!(text.contains(expected), "{text}");
    // Beside clients that write, or with flushes off, the newcomer keeps
    // what it holds.
    for setting in ["shared_with = \"writers\"", "flush_new_servers = \"never\""] {
        let with = |text: &str| text.replacen("\n", &format!("\n{setting}\n"), 1);
        let old = write_config(&dir, "old.toml", &with(&four));
        let new = write_config(&dir, "new.toml", &with(&five));
        let text = memring_plan(&old, &new);
        assert!(
            text.contains("flush: none; cache-05 joins the ring with what it holds"),
            "{setting}: {text}"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Kills a child by PID if the test fails before it exits.
struct ChildGuard(std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn daemon_serves_and_exits_zero_on_sigterm() {
    let backend = Memcached::start();
    let dir = temp_dir("daemon");
    let config = write_config(
        &dir,
        "memring.toml",
        &format!(
            "listen = \"127.0.0.1:0\"\n[[servers]]\naddr = \"{}\"\n",
            backend.addr()
        ),
    );
    let mut daemon = Daemon::start(&config);
    // The log line names the bound address (the config asks for port 0).
    let line = daemon.log_line("local_addr=");
    let listen = line
        .split("local_addr=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .expect("memring logs its listen address")
        .trim_matches(|c: char| !c.is_ascii_digit() && c != '.' && c != ':')
        .to_string();
    let mut client = Client::connect(&listen);
    assert_eq!(client.set("cli", b"ok"), b"STORED\r\n");
    assert_eq!(client.get("cli"), Some(b"ok".to_vec()));
    drop(client);
    // `memring send` through memring: replies to everything sent before its
    // half-close.
    let output = Command::new(BIN)
        .args([
            "send",
            &listen,
            "get cli",
            "set sent 0 0 1",
            "y",
            "get sent",
        ])
        .output()
        .unwrap();
    assert!(output.status.success());
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "VALUE cli 0 2\r\nok\r\nEND\r\nSTORED\r\nVALUE sent 0 1\r\ny\r\nEND\r\n"
    );

    // Clients keep working while SIGTERM arrives: each request gets its whole
    // reply or the connection closes before any byte of it.
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let mut client = Client::connect(&listen);
            let answered = answered.clone();
            std::thread::spawn(move || {
                for round in 0..1_000_000 {
                    client.send(format!("set sig:{w}:{round} 0 0 1\r\nx\r\n").as_bytes());
                    match client.try_reply(memring::protocol::ReplyKind::Line) {
                        Some(reply) => assert_eq!(reply, b"STORED\r\n"),
                        None => return,
                    }
                    answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            })
        })
        .collect();
    wait_for("load to run", || {
        answered.load(std::sync::atomic::Ordering::Relaxed) > 500
    });

    daemon.terminate();
    let exit = daemon.wait_exit("memring to exit after SIGTERM");
    assert_eq!(exit.code(), Some(0));
    for worker in workers {
        worker.join().expect("no reply was cut off");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// The subcommands `memring --help` lists, without clap's `help`.
fn subcommands() -> Vec<String> {
    let help = Command::new(BIN).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout).to_string();
    let names: Vec<String> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect();
    assert!(names.len() >= 7, "{help}");
    names
}

#[test]
fn completions_and_man_pages_cover_every_subcommand() {
    let names = subcommands();
    for shell in ["bash", "zsh", "fish"] {
        let output = Command::new(BIN)
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(output.status.success(), "{shell}: {output:?}");
        let script = String::from_utf8_lossy(&output.stdout);
        for name in &names {
            assert!(script.contains(name.as_str()), "{shell} lacks {name}");
        }
        // fish spells a long option `-l config`.
        let config = if shell == "fish" {
            "-l config"
        } else {
            "--config"
        };
        assert!(script.contains(config), "{shell} lacks --config");
    }
    let output = Command::new(BIN).arg("man").output().unwrap();
    assert!(output.status.success(), "{output:?}");
    let page = String::from_utf8_lossy(&output.stdout);
    assert!(page.contains(".TH memring 1"), "{page}");
    for name in &names {
        assert!(
            page.contains(&format!("memring\\-{name}(1)")),
            "man lacks {name}"
        );
    }
    assert!(!page.contains("memring\\-help"), "clap's help has no page");
    assert!(
        page.contains("/etc/memring/memring.toml"),
        "no FILES section"
    );

    // `--dir` writes the pages memring(1) refers to.
    let dir = temp_dir("man");
    let output = Command::new(BIN)
        .args(["man", "--dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let mut expected: Vec<String> = names.iter().map(|n| format!("memring-{n}.1")).collect();
    expected.push("memring.1".to_string());
    expected.sort();
    let mut written: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    written.sort();
    assert_eq!(written, expected);
    let check = std::fs::read_to_string(dir.join("memring-check.1")).unwrap();
    assert!(check.contains("The config file to validate"), "{check}");
    let _ = std::fs::remove_dir_all(dir);
}

/// The file the Debian package installs as /etc/memring/memring.toml.
const PACKAGED_CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/config/debian.toml");

#[test]
fn the_packaged_config_passes_check_and_fronts_the_local_memcached() {
    let output = Command::new(BIN)
        .args(["check", PACKAGED_CONFIG])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains(": ok (1 server, listen 127.0.0.1:22122, ring memring)"),
        "{stdout}"
    );
    assert!(output.stderr.is_empty(), "warnings: {output:?}");
    let config = memring::config::Config::load(std::path::Path::new(PACKAGED_CONFIG)).unwrap();
    assert_eq!(config.servers.len(), 1);
    assert_eq!(
        config.servers[0].addr, "127.0.0.1:11211",
        "Debian's memcached"
    );
}

/// Commented settings (`# name = value`) of a config file, and the ones it
/// sets (`name = value`: the packaged config sets `state_file`).
fn documented_settings(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.strip_prefix("# ").unwrap_or(l))
        .filter_map(|l| l.split_once(" = "))
        .map(|(name, _)| name)
        .filter(|name| name.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
        .map(str::to_string)
        .collect()
}

#[test]
fn the_packaged_config_documents_every_setting_the_reference_does() {
    let reference =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config/memring.toml"))
            .unwrap();
    let packaged = std::fs::read_to_string(PACKAGED_CONFIG).unwrap();
    let reference = documented_settings(&reference);
    assert!(reference.len() > 20, "{reference:?}");
    let packaged = documented_settings(&packaged);
    for name in &reference {
        assert!(
            packaged.contains(name),
            "config/debian.toml lacks `# {name} = ...` (copy it from config/memring.toml)"
        );
    }
}

#[test]
fn the_unit_file_descriptor_limit_covers_the_packaged_defaults() {
    let unit = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/debian/memring.service"
    ))
    .unwrap();
    let limit: u64 = unit
        .lines()
        .find_map(|l| l.strip_prefix("LimitNOFILE="))
        .expect("the unit sets LimitNOFILE")
        .parse()
        .unwrap();
    let config = memring::config::Config::load(std::path::Path::new(PACKAGED_CONFIG)).unwrap();
    // memring's own arithmetic, for a large machine (one worker per CPU) with
    // the admin listener turned on: every configured client still fits.
    let budget = memring::control::fd_budget::FdBudget {
        nofile: limit,
        fixed: memring::control::fd_budget::BASE_FDS
            + memring::control::admin::MAX_CONNECTIONS as u64,
        workers: 256,
    };
    let backends = budget.config_backend_fds(&config);
    assert_eq!(
        budget.client_limit(config.max_client_connections, backends),
        config.max_client_connections,
        "LimitNOFILE={limit} leaves too little for {} clients",
        config.max_client_connections
    );
    assert!(
        unit.contains("ExecReload=/bin/kill -HUP $MAINPID"),
        "{unit}"
    );
}

/// `send` and `healthcheck` take host names as well as addresses, and say in
/// words when a name does not resolve; `memring help import twemproxy` shows
/// the import's own help.
#[test]
fn send_takes_host_names_and_import_has_help_of_its_own() {
    let server = Memcached::start();
    let output = Command::new(BIN)
        .args(["send", &format!("localhost:{}", server.port), "version"])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).starts_with("VERSION "));
    for command in ["send", "healthcheck"] {
        let mut args = vec![command, "nosuchhost.invalid:11211"];
        if command == "send" {
            args.push("version");
        }
        let output = Command::new(BIN).args(&args).output().unwrap();
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("cannot resolve nosuchhost.invalid:11211"),
            "{command}: {stderr}"
        );
    }
    let output = Command::new(BIN)
        .args(["help", "import", "twemproxy"])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("Usage: memring import twemproxy"));
}

/// The config embedded in the Kubernetes example passes `memring check` as
/// shipped, and keeps its reply buffers within the container's memory limit.
#[test]
fn the_kubernetes_example_config_checks_and_fits_its_memory_limit() {
    let (manifest, config) = crate::common::kubernetes_example("sidecar.yaml");
    let dir = crate::common::TempDir::new("cli", "kubernetes");
    let path = dir.path("memring.toml");
    std::fs::write(&path, &config).unwrap();
    let output = Command::new(BIN)
        .args(["check", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let parsed = memring::config::Config::parse(&config, "sidecar.toml").unwrap();
    // The memring container's `limits: memory:`.
    let container = &manifest[manifest
        .find("- name: memring\n")
        .expect("the memring container")..];
    let limits = &container[container.find("limits:").expect("its limits")..];
    let limit: usize = limits
        .lines()
        .find_map(|l| l.trim().strip_prefix("memory: "))
        .and_then(|v| v.strip_suffix("Mi")?.parse().ok())
        .expect("a memory limit in Mi");
    assert!(
        parsed.max_buffer_bytes <= limit * 1024 * 1024 / 2,
        "max_buffer_bytes {} does not fit half of the {limit} Mi limit",
        parsed.max_buffer_bytes
    );
}

/// A drop-in ring usually means other clients use the servers too: `check`
/// says which `shared_with` is safe, and is quiet once it is set.
#[test]
fn check_warns_about_a_drop_in_ring_without_shared_with() {
    let dir = temp_dir("shared-with");
    let servers = "[[servers]]\naddr = \"127.0.0.1:11211\"\n";
    for (settings, warned) in [
        ("ring = \"twemproxy\"\n", true),
        ("ring = \"libmemcached\"\n", true),
        ("ring = \"rendezvous\"\n", true),
        ("ring = \"dalli\"\n", true),
        ("ring = \"php-memcache\"\n", true),
        ("ring = \"twemproxy\"\nshared_with = \"writers\"\n", false),
        ("ring = \"twemproxy\"\nshared_with = \"memring\"\n", false),
        ("shared_with = \"readers\"\n", false),
        ("", false),
    ] {
        let file = write_config(
            &dir,
            "shared.toml",
            &format!("listen = \"127.0.0.1:22122\"\n{settings}{servers}"),
        );
        let output = Command::new(BIN)
            .args(["check", "--offline"])
            .arg(&file)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{settings}: {stderr}");
        assert_eq!(
            stderr.contains("shared_with is not set")
                && stderr.contains(
                    "set shared_with = \"writers\" if they write, \"readers\" if they only read"
                ),
            warned,
            "{settings}: {stderr}"
        );
    }
    let bad = write_config(
        &dir,
        "bad.toml",
        &format!("listen = \"127.0.0.1:22122\"\nshared_with = \"everyone\"\n{servers}"),
    );
    let output = Command::new(BIN).arg("check").arg(&bad).output().unwrap();
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr).contains(
            "bad.toml:2:15: shared_with = \"everyone\" is not who shares the servers (one of: memring, readers, writers)"
        ),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// `check` binds every address memring would listen on: one taken by
/// another process fails it, naming the setting, unless `--offline`.
#[test]
fn check_fails_on_a_listen_address_that_cannot_be_bound() {
    let taken = Memcached::start();
    let server = Memcached::start();
    let dir = temp_dir("check-bind");
    let free = || format!("127.0.0.1:{}", crate::common::free_port());
    let servers = format!("[[servers]]\naddr = \"{}\"\n", server.addr());
    for (setting, text) in [
        (
            "`listen`",
            format!("listen = \"{}\"\n{servers}", taken.addr()),
        ),
        (
            "`admin_listen`",
            format!(
                "listen = \"{}\"\nadmin_listen = \"{}\"\n{servers}",
                free(),
                taken.addr()
            ),
        ),
        (
            "`listen of pool sessions`",
            format!(
                "listen = \"{}\"\n{servers}[[pools]]\nname = \"sessions\"\nlisten = \"{}\"\n[[pools.servers]]\naddr = \"{}\"\n",
                free(),
                taken.addr(),
                server.addr()
            ),
        ),
    ] {
        let config = write_config(&dir, "memring.toml", &text);
        let output = Command::new(BIN).arg("check").arg(&config).output().unwrap();
        let said = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{setting}: {said}");
        assert!(
            said.contains(&format!(
                "cannot listen on {}, the address of {setting}: Address already in use",
                taken.addr()
            )),
            "{said}"
        );
        let offline = Command::new(BIN)
            .args(["check", "--offline"])
            .arg(&config)
            .output()
            .unwrap();
        assert!(offline.status.success(), "{setting}: {offline:?}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// The check of a config for the memring running on it (before a reload or
/// a restart) passes: its own listener holds the port.
#[test]
fn check_passes_when_a_running_memring_holds_the_address() {
    let server = Memcached::start();
    let proxy = crate::common::Proxy::start(&[&server], "admin_listen = \"127.0.0.1:0\"\n");
    let admin = proxy.running().admin_addr.expect("admin listener");
    let dir = temp_dir("check-running");
    let config = write_config(
        &dir,
        "memring.toml",
        &format!(
            "listen = \"{}\"\nadmin_listen = \"{admin}\"\n[[servers]]\naddr = \"{}\"\n",
            proxy.addr,
            server.addr()
        ),
    );
    let output = Command::new(BIN)
        .arg("check")
        .arg(&config)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let _ = std::fs::remove_dir_all(dir);
}

/// nutcracker's flags and its YAML config get the memring way in one line.
#[test]
fn nutcracker_flags_and_yaml_get_a_hint() {
    for (args, hint) in [
        (&["-t", "-c", "nutcracker.yml"][..], "`memring check FILE`"),
        (&["-s", "22222"], "admin_listen"),
        (&["-v", "6"], "--log-level"),
        (&["-d"], "does not daemonize"),
    ] {
        let output = Command::new(BIN).args(args).output().unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let said = String::from_utf8_lossy(&output.stderr);
        let hints: Vec<&str> = said
            .lines()
            .filter(|l| l.starts_with("memring: hint: "))
            .collect();
        assert_eq!(hints.len(), 1, "{args:?}: {said}");
        assert!(hints[0].contains(hint), "{args:?}: {said}");
    }
    let dir = temp_dir("nutcracker-yaml");
    let yaml = write_config(
        &dir,
        "nutcracker.yml",
        "alpha:\n  listen: 127.0.0.1:22121\n  hash: fnv1a_64\n  distribution: ketama\n  servers:\n   - 127.0.0.1:11211:1\n",
    );
    for args in [vec!["check"], vec!["--config"], vec!["-c"]] {
        let output = Command::new(BIN).args(&args).arg(&yaml).output().unwrap();
        assert_eq!(output.status.code(), Some(1), "{args:?}");
        let said = String::from_utf8_lossy(&output.stderr);
        let expected = format!(
            "memring: hint: {0} looks like a twemproxy (nutcracker) YAML config; `memring import twemproxy {0} > memring.toml` writes the memring equivalent",
            yaml.display()
        );
        assert!(said.lines().any(|l| l == expected), "{args:?}: {said}");
    }
    let _ = std::fs::remove_dir_all(dir);
}
