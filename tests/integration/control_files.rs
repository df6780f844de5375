//! The control plane's files against the real binary: a certificate, key or
//! config file swapped for a FIFO (which blocks a plain reader until a
//! writer appears), for `/dev/zero` (endless) or for a file over the size
//! cap is refused with a log line naming the file, while every listener
//! keeps accepting, memory stays flat, and later good files and SIGHUP are
//! still applied.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

use crate::common::pki::Pki;
use crate::common::{free_port, wait_for, Client, Daemon, Memcached, TempDir};
use crate::tls::{client_config, TlsClient};

/// Replaces `path` by a FIFO nobody writes to.
fn fifo_in_place_of(path: &Path) {
    let _ = std::fs::remove_file(path);
    let made = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(made.success(), "mkfifo {}", path.display());
}

/// Replaces `path` by a symlink to `/dev/zero` (as a secret's mount swaps a
/// link).
fn dev_zero_in_place_of(path: &Path) {
    let _ = std::fs::remove_file(path);
    std::os::unix::fs::symlink("/dev/zero", path).unwrap();
}

/// A new plain client is served at once.
fn plain_client_served(listen: &str, round: &str) {
    let mut client = Client::connect(listen);
    assert_eq!(client.set(round, b"v"), b"STORED\r\n", "{round}");
    assert_eq!(client.get(round).as_deref(), Some(&b"v"[..]), "{round}");
}

#[test]
fn a_certificate_swapped_for_a_fifo_or_dev_zero_stalls_no_listener() {
    let pki = Pki::new("control-files");
    let listener = pki.issue("listener", &["127.0.0.1"], false);
    let next = pki.issue("listener-next", &["127.0.0.1"], false);
    let backend = Memcached::start();
    let dir = TempDir::new("control-files", "cert");
    let listen = format!("127.0.0.1:{}", free_port());
    let tls_addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let config = dir.path("memring.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"{listen}\"\n[tls_listen]\naddr = \"{tls_addr}\"\ncert_file = \"{}\"\nkey_file = \"{}\"\n\
             [[servers]]\naddr = \"{}\"\n",
            listener.cert.display(),
            listener.key.display(),
            backend.addr()
        ),
    )
    .unwrap();
    let daemon = Daemon::start(&config, &dir.path("memring.log"), &[]);
    daemon.wait_for_log("memring started");
    let tls = client_config(&pki.ca_file, None);
    plain_client_served(&listen, "before");
    let baseline = daemon.rss_kib();
    let cert = listener.cert.display().to_string();

    // A FIFO: refused at once, logged with the file; both listeners accept.
    fifo_in_place_of(&listener.cert);
    wait_for("the FIFO refused", || {
        daemon.log().lines().any(|l| {
            l.contains("certificate reload rejected") && l.contains(&cert) && l.contains("a FIFO")
        })
    });
    plain_client_served(&listen, "fifo");
    let mut client = TlsClient::connect(tls_addr, &tls).expect("TLS accepts beside a FIFO");
    assert_eq!(
        client.peer(),
        listener.der,
        "the certificate in force stays"
    );
    assert_eq!(client.set("fifo-tls", "v").unwrap(), b"STORED\r\n");

    // /dev/zero: refused before a byte is read; memory stays flat.
    dev_zero_in_place_of(&listener.cert);
    wait_for("/dev/zero refused", || {
        daemon.count("a character device") > 0
    });
    plain_client_served(&listen, "zero");
    let mut client = TlsClient::connect(tls_addr, &tls).expect("TLS accepts beside /dev/zero");
    assert_eq!(client.set("zero-tls", "v").unwrap(), b"STORED\r\n");

    // A regular file over the cap: refused with the cap in words.
    std::fs::remove_file(&listener.cert).unwrap();
    let cap = memring::inputs::regular_file::MAX_TLS_FILE_BYTES;
    std::fs::write(&listener.cert, vec![b'x'; cap as usize + 1]).unwrap();
    wait_for("the large file refused", || {
        daemon
            .log()
            .lines()
            .any(|l| l.contains(&cert) && l.contains(&format!("limit of {cap} bytes")))
    });
    plain_client_served(&listen, "large");
    let rss = daemon.rss_kib();
    assert!(
        rss < baseline + 32 * 1024,
        "RSS {baseline} KiB -> {rss} KiB"
    );

    // A good pair afterwards is taken.
    std::fs::write(&listener.key, &next.key_pem).unwrap();
    std::fs::write(&listener.cert, &next.cert_pem).unwrap();
    wait_for("the good pair applied", || {
        TlsClient::connect(tls_addr, &tls).is_ok_and(|c| c.peer() == next.der)
    });
    // Each refusal logged once, though the directory kept changing.
    assert_eq!(daemon.count("a FIFO"), 1, "{}", daemon.log());
    assert_eq!(daemon.count("a character device"), 1, "{}", daemon.log());
}

#[test]
fn a_config_swapped_for_a_fifo_or_dev_zero_is_refused_and_later_reloads_work() {
    let backend = Memcached::start();
    let dir = TempDir::new("control-files", "config");
    let listen = format!("127.0.0.1:{}", free_port());
    let config = dir.path("memring.toml");
    let text = format!(
        "listen = \"{listen}\"\n[[servers]]\naddr = \"{}\"\n",
        backend.addr()
    );
    std::fs::write(&config, &text).unwrap();
    // The log beside the config: a refusal logged in a loop would show.
    let daemon = Daemon::start(&config, &dir.path("memring.log"), &[]);
    daemon.wait_for_log("memring started");
    daemon.wait_for_log("watching config for changes");
    plain_client_served(&listen, "before");
    let baseline = daemon.rss_kib();
    let shown = config.display().to_string();
    let refused = |what: &str| {
        daemon
            .log()
            .lines()
            .filter(|l| l.contains("reload rejected") && l.contains(&shown) && l.contains(what))
            .count()
    };

    fifo_in_place_of(&config);
    wait_for("the FIFO refused", || refused("a FIFO") == 1);
    plain_client_served(&listen, "fifo");
    // SIGHUP still reloads: the same refusal, said again once.
    daemon.hang_up();
    wait_for("SIGHUP re-read the FIFO", || refused("a FIFO") == 2);

    dev_zero_in_place_of(&config);
    wait_for("/dev/zero refused", || refused("a character device") == 1);
    plain_client_served(&listen, "zero");

    std::fs::remove_file(&config).unwrap();
    let cap = memring::inputs::regular_file::MAX_CONFIG_FILE_BYTES;
    let padding = format!("# {}\n", "x".repeat(cap as usize));
    std::fs::write(&config, format!("{text}{padding}")).unwrap();
    wait_for("the large file refused", || {
        refused(&format!("limit of {cap} bytes")) == 1
    });
    let rss = daemon.rss_kib();
    assert!(
        rss < baseline + 32 * 1024,
        "RSS {baseline} KiB -> {rss} KiB"
    );

    // A good file afterwards is applied, and so is a SIGHUP after it.
    std::fs::write(
        &config,
        text.replace("[[servers]]", "request_timeout_ms = 1500\n[[servers]]"),
    )
    .unwrap();
    daemon.wait_for_log("request_timeout_ms 1000 -> 1500");
    plain_client_served(&listen, "after");
    let hangups = daemon.count("SIGHUP: reloading config");
    daemon.hang_up();
    wait_for("a later SIGHUP", || {
        daemon.count("SIGHUP: reloading config") > hangups
    });
    assert_eq!(refused("a FIFO"), 2, "{}", daemon.log());
    assert_eq!(refused("a character device"), 1, "{}", daemon.log());
}
