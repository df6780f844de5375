//! Unix-socket listeners (`listen = "unix:PATH"`, `listen_mode`): clients
//! over the socket (pymemcache, `memring send`) get what TCP clients get;
//! the socket file is made at start with its mode, a stale one replaced, a
//! live one or a regular file refused, and removed at exit; a pool's own
//! listener can be one too; `memring check` says what start would.

use std::io::{Read as _, Write as _};
use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};
use std::path::Path;
use std::process::{Command, Stdio};

use crate::common::daemon::Daemon;
use crate::common::{memring_plan, wait_for, Memcached, Proxy, TempDir};

const BIN: &str = env!("CARGO_BIN_EXE_memring");

fn config(sock: &Path, settings: &str, server: &Memcached) -> String {
    format!(
        "listen = \"unix:{}\"\n{settings}\n[[servers]]\naddr = \"{}\"\n",
        sock.display(),
        server.addr()
    )
}

/// Runs `script` with pymemcache's `client` connected to the Unix socket
/// at `sock`; its stdout.
fn pymemcache(sock: &Path, script: &str) -> String {
    let program = format!(
        "import sys\nfrom pymemcache.client.base import Client\nclient = Client(sys.argv[1], timeout=5)\n{script}"
    );
    let output = Command::new("/usr/bin/python3")
        .args(["-c", &program])
        .arg(sock)
        .output()
        .expect("python3 must be installed");
    assert!(
        output.status.success(),
        "pymemcache failed (install python3-pymemcache): {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `memring send unix:PATH LINE...`'s stdout.
fn send(sock: &Path, lines: &[&str]) -> String {
    let output = Command::new(BIN)
        .arg("send")
        .arg(format!("unix:{}", sock.display()))
        .args(lines)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// One `STAT name value` of `stats`, asked over the Unix socket.
fn stat_over(sock: &Path, name: &str) -> u64 {
    let text = send(sock, &["stats"]);
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("STAT {name} ")))
        .unwrap_or_else(|| panic!("no STAT {name} in {text}"))
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn clients_over_a_unix_socket_get_both_dialects_and_are_counted() {
    let backend = Memcached::start();
    let dir = TempDir::new("unix", "serve");
    let sock = dir.path("memring.sock");
    let proxy = Proxy::start_text(&config(&sock, "listen_mode = \"0600\"", &backend));
    assert_eq!(proxy.running().local_path.as_deref(), Some(sock.as_path()));
    let meta = std::fs::symlink_metadata(&sock).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);

    // pymemcache over the socket: single keys, and a multi-key get.
    let got = pymemcache(
        &sock,
        "assert client.set('py:1', b'one')\n\
         assert client.get('py:1') == b'one'\n\
         client.set_many({'py:2': b'two', 'py:3': b'three'})\n\
         got = client.get_many(['py:1', 'py:2', 'py:3', 'py:none'])\n\
         print(sorted((k, v.decode()) for k, v in got.items()))\n",
    );
    assert_eq!(
        got.trim(),
        "[('py:1', 'one'), ('py:2', 'two'), ('py:3', 'three')]"
    );
    // It landed on the server.
    assert_eq!(backend.client().get("py:2"), Some(b"two".to_vec()));

    // The meta dialect and pipelining, through `memring send unix:PATH`.
    assert_eq!(
        send(
            &sock,
            &["ms meta:1 2 T0", "hi", "mg meta:1 v", "mn", "get py:1"]
        ),
        "HD\r\nVA 2\r\nhi\r\nMN\r\nVALUE py:1 0 3\r\none\r\nEND\r\n"
    );
    // Counted as clients like any other: pymemcache, the send above, this one.
    assert_eq!(stat_over(&sock, "total_connections"), 3);
}

/// A socket file nobody listens on (left by a process that was killed) is
/// replaced; a socket another process listens on and a file that is not a
/// socket are refused, saying why, and the file is left as it was.
#[test]
fn a_stale_socket_is_replaced_and_a_live_one_or_a_regular_file_refused() {
    let backend = Memcached::start();
    let dir = TempDir::new("unix", "stale");
    let sock = dir.path("memring.sock");
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    assert!(sock.exists(), "the stale socket file stays");
    let proxy = Proxy::start_text(&config(&sock, "", &backend));
    assert_eq!(send(&sock, &["set k 0 0 1", "v"]), "STORED\r\n");
    drop(proxy);

    let start = |text: &str| {
        let config = memring::config::Config::parse(text, "test.toml").unwrap();
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let shutdown = tokio_util::sync::CancellationToken::new();
        let started = runtime.block_on(memring::server::start(&config, shutdown.clone()));
        shutdown.cancel();
        started.err().map(|e| e.to_string())
    };
    let live = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let error = start(&config(&sock, "", &backend)).expect("refused");
    let expected = format!(
        "cannot listen on unix:{}, the address of `listen`: in use: another process listens on this socket",
        sock.display()
    );
    assert_eq!(error, expected);
    assert!(sock.exists(), "the other process's socket is left alone");
    drop(live);
    std::fs::remove_file(&sock).unwrap();

    std::fs::write(&sock, b"precious").unwrap();
    let error = start(&config(&sock, "", &backend)).expect("refused");
    assert!(
        error.contains("exists and is not a socket; memring does not remove it"),
        "{error}"
    );
    assert_eq!(std::fs::read(&sock).unwrap(), b"precious");
    std::fs::remove_file(&sock).unwrap();

    let error = start(&config(&dir.path("no/such/dir.sock"), "", &backend)).expect("refused");
    assert!(error.contains("does not exist"), "{error}");
}

/// The daemon makes the socket at start with `listen_mode` and removes it
/// when it exits on SIGTERM.
#[test]
fn the_daemon_removes_its_socket_at_exit() {
    let backend = Memcached::start();
    let dir = TempDir::new("unix", "exit");
    let sock = dir.path("memring.sock");
    let path = dir.path("memring.toml");
    std::fs::write(&path, config(&sock, "listen_mode = \"0666\"", &backend)).unwrap();
    let mut daemon = Daemon::start(&path);
    let said = daemon.log_line("listening on a Unix socket");
    assert!(said.contains(&sock.display().to_string()), "{said}");
    let mode = std::fs::symlink_metadata(&sock)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o666);
    assert_eq!(
        send(&sock, &["set k 0 0 1", "v", "get k"]),
        "STORED\r\nVALUE k 0 1\r\nv\r\nEND\r\n"
    );
    daemon.terminate();
    let status = daemon.wait_exit("memring to exit after SIGTERM");
    assert!(status.success(), "{status}");
    assert!(!sock.exists(), "the socket file is removed at exit");
}

/// A pool's own listener on a Unix socket: its clients use that pool for
/// every key.
#[test]
fn a_pool_listens_on_a_unix_socket_of_its_own() {
    let main = Memcached::start();
    let other = Memcached::start();
    let dir = TempDir::new("unix", "pool");
    let sock = dir.path("sessions.sock");
    let text = format!(
        "listen = \"127.0.0.1:0\"\n[[servers]]\naddr = \"{}\"\n[[pools]]\nname = \"sessions\"\nlisten = \"unix:{}\"\nlisten_mode = \"0640\"\n[[pools.servers]]\naddr = \"{}\"\n",
        main.addr(),
        sock.display(),
        other.addr()
    );
    let proxy = Proxy::start_text(&text);
    assert_eq!(
        proxy.running().pool_paths,
        vec![("sessions".to_string(), sock.clone())]
    );
    let mode = std::fs::symlink_metadata(&sock)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o640);
    pymemcache(&sock, "assert client.set('s:1', b'pool')\n");
    assert_eq!(other.client().get("s:1"), Some(b"pool".to_vec()));
    assert_eq!(main.client().get("s:1"), None);
    // The main listener still serves the default pool over TCP.
    let mut client = proxy.client();
    assert_eq!(client.set("d:1", b"main"), b"STORED\r\n");
    assert_eq!(main.client().get("d:1"), Some(b"main".to_vec()));
    drop(proxy);
    wait_for("the pool's socket removed", || !sock.exists());
}

/// `memring check` takes the socket path as start would: a missing
/// directory, a regular file, or another process's socket fail it, naming
/// the setting; a stale socket passes; `--offline` skips the test.
#[test]
fn check_tests_a_unix_listen_path_as_start_would() {
    let backend = Memcached::start();
    let dir = TempDir::new("unix", "check");
    let sock = dir.path("memring.sock");
    let path = dir.path("memring.toml");
    let check = |offline: bool| {
        let mut command = Command::new(BIN);
        command.arg("check").arg(&path);
        if offline {
            command.arg("--offline");
        }
        let output = command.output().unwrap();
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned()
                + &String::from_utf8_lossy(&output.stderr),
        )
    };
    std::fs::write(&path, config(&sock, "listen_mode = \"0660\"", &backend)).unwrap();
    let (ok, text) = check(false);
    assert!(ok, "{text}");
    assert!(
        text.contains(&format!("listen unix:{}", sock.display())),
        "{text}"
    );

    std::fs::write(&sock, b"not a socket").unwrap();
    let (ok, text) = check(false);
    assert!(!ok);
    assert!(
        text.contains(&format!(
            "cannot listen on unix:{}, the address of `listen`: {} exists and is not a socket",
            sock.display(),
            sock.display()
        )),
        "{text}"
    );
    assert!(check(true).0, "--offline skips it");
    std::fs::remove_file(&sock).unwrap();

    let live = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let (ok, text) = check(false);
    assert!(!ok);
    assert!(
        text.contains("in use: another process listens on this socket"),
        "{text}"
    );
    drop(live);
    let (ok, text) = check(false);
    assert!(ok, "a stale socket is replaced at start: {text}");

    std::fs::write(&path, config(&dir.path("none/m.sock"), "", &backend)).unwrap();
    let (ok, text) = check(false);
    assert!(!ok);
    assert!(text.contains("does not exist"), "{text}");
    // What a running memring answers on its socket passes.
    std::fs::write(&path, config(&sock, "", &backend)).unwrap();
    std::fs::remove_file(&sock).unwrap();
    let _proxy = Proxy::start_text(&config(&sock, "", &backend));
    let (ok, text) = check(false);
    assert!(ok, "{text}");
    let mut stream = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    stream.write_all(b"version\r\n").unwrap();
    let mut reply = [0u8; 64];
    let n = stream.read(&mut reply).unwrap();
    assert!(reply[..n].starts_with(b"VERSION "));
}

/// A Unix listener and its mode are read at start, as a TCP `listen` is;
/// `flush_new_servers` applies on reload. `memring plan` says which.
#[test]
fn plan_says_a_socket_change_needs_a_restart_and_flush_new_servers_does_not() {
    let dir = TempDir::new("unix", "plan");
    let servers = "[[servers]]\naddr = \"127.0.0.1:11211\"\n";
    let old = dir.path("old.toml");
    let new = dir.path("new.toml");
    std::fs::write(&old, format!("listen = \"127.0.0.1:22122\"\n{servers}")).unwrap();
    std::fs::write(
        &new,
        format!("listen = \"unix:/run/m.sock\"\nlisten_mode = \"0660\"\nflush_new_servers = \"never\"\n{servers}"),
    )
    .unwrap();
    let text = memring_plan(&old, &new);
    for expected in [
        "setting: listen 127.0.0.1:22122 -> unix:/run/m.sock (needs a restart)",
        "setting: listen_mode - -> 0660 (needs a restart)",
        "setting: flush_new_servers auto -> never (applied on reload)",
        "restart needed: listen, listen_mode are read only at start",
    ] {
        assert!(text.contains(expected), "lacks `{expected}`: {text}");
    }
}

/// `max_client_connections` counts Unix-socket clients with TCP ones: past
/// the limit a socket client waits in the backlog until a slot frees.
#[test]
fn unix_socket_clients_count_against_the_connection_limit() {
    use std::os::unix::net::UnixStream;
    let backend = Memcached::start();
    let dir = TempDir::new("unix", "limit");
    let sock = dir.path("memring.sock");
    let _proxy = Proxy::start_text(&config(&sock, "max_client_connections = 2", &backend));
    let ask = |stream: &mut UnixStream| {
        stream.write_all(b"version\r\n").unwrap();
        let mut reply = [0u8; 64];
        let n = stream.read(&mut reply).unwrap();
        assert!(reply[..n].starts_with(b"VERSION "));
    };
    // Two clients: the limit is reached.
    let mut first = UnixStream::connect(&sock).unwrap();
    ask(&mut first);
    let mut second = UnixStream::connect(&sock).unwrap();
    ask(&mut second);
    let mut waiting = UnixStream::connect(&sock).unwrap();
    waiting
        .set_read_timeout(Some(std::time::Duration::from_millis(300)))
        .unwrap();
    waiting.write_all(b"version\r\n").unwrap();
    let mut buffer = [0u8; 64];
    let early = waiting.read(&mut buffer);
    assert!(
        matches!(&early, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the third client must wait, got {early:?}"
    );
    ask(&mut second);
    drop(first);
    waiting
        .set_read_timeout(Some(crate::common::DEADLINE))
        .unwrap();
    let n = waiting.read(&mut buffer).unwrap();
    assert!(buffer[..n].starts_with(b"VERSION "), "{:?}", &buffer[..n]);
}

/// nutcracker on a Unix socket (`listen: PATH 0666`, as PHP sites run it),
/// imported: memring listens on a socket with the same mode, and keys
/// written through either proxy's socket by pymemcache are read through
/// the other's. The import used to refuse the socket.
#[test]
fn an_imported_nutcracker_socket_listen_serves_beside_nutcracker() {
    let servers: Vec<Memcached> = (0..3).map(|_| Memcached::start()).collect();
    let dir = TempDir::new("unix", "import");
    let nut_sock = dir.path("nutcracker.sock");
    let mut yaml = format!(
        "web:\n  listen: {} 0666\n  hash: fnv1a_64\n  distribution: ketama\n  servers:\n",
        nut_sock.display()
    );
    for server in &servers {
        yaml.push_str(&format!("   - {}:1\n", server.addr()));
    }
    let conf = dir.path("nutcracker.yml");
    std::fs::write(&conf, &yaml).unwrap();
    let stats_port = crate::common::free_port();
    let mut nutcracker = Command::new("nutcracker")
        .arg("-c")
        .arg(&conf)
        .args(["-a", "127.0.0.1", "-s", &stats_port.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("nutcracker must be installed (scripts/test installs it)");
    struct Kill<'a>(&'a mut std::process::Child);
    impl Drop for Kill<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _kill = Kill(&mut nutcracker);
    wait_for("nutcracker's socket", || {
        std::os::unix::net::UnixStream::connect(&nut_sock).is_ok()
    });

    let output = Command::new(BIN)
        .args(["import".as_ref(), "twemproxy".as_ref(), conf.as_os_str()])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let imported = String::from_utf8(output.stdout).unwrap();
    let listen = format!("\nlisten = \"unix:{}\"\n", nut_sock.display());
    assert!(imported.contains(&listen), "{imported}");
    assert!(
        imported.contains("\nlisten_mode = \"0666\"\n"),
        "{imported}"
    );
    // A socket of its own beside nutcracker's (which answers: in use).
    let sock = dir.path("memring.sock");
    let _proxy = Proxy::start_text(&imported.replace(
        &listen,
        &format!("\nlisten = \"unix:{}\"\n", sock.display()),
    ));
    let mode = std::fs::symlink_metadata(&sock)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o666);

    let write = |sock: &Path, tag: &str| {
        pymemcache(
            sock,
            &format!("for i in range(200):\n    assert client.set('{tag}:%d' % i, b'v%d' % i)\n"),
        )
    };
    let missing = |sock: &Path, tag: &str| {
        pymemcache(
            sock,
            &format!(
                "print(sum(1 for i in range(200) if client.get('{tag}:%d' % i) != b'v%d' % i))\n"
            ),
        )
        .trim()
        .to_string()
    };
    write(&nut_sock, "via-nutcracker");
    assert_eq!(missing(&sock, "via-nutcracker"), "0");
    write(&sock, "via-memring");
    assert_eq!(missing(&nut_sock, "via-memring"), "0");
}
