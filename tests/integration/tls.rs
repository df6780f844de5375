//! TLS on both sides against real `memcached -Z` servers: certificates made
//! by `common::pki` (a CA, server certificates for 127.0.0.1 / localhost and
//! for another name, client certificates), a blocking rustls client for
//! `tls_listen`, and the `memring check` binary for the connectivity test.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use memring::backend::health::HealthState;
use memring::protocol::{frame_reply, ReplyKind};
use rustls::pki_types::{CertificateDer, ServerName};

use crate::common::pki::{Issued, Pki};
use crate::common::{
    replace_by_rename, show, wait_for, Client, Memcached, Proxy, TempDir, DEADLINE,
};

const BIN: &str = env!("CARGO_BIN_EXE_memring");
/// Handshakes on a loaded 2-core machine can take a while; a server that
/// fails must not turn DEAD before the test has read why.
const SETTINGS: &str =
    "connect_timeout_ms = 3000\nrequest_timeout_ms = 3000\nfailure_limit = 1000\n";

/// Config text: `settings` at the top, then `tables`, then one TLS server
/// per entry of `servers`.
fn config(settings: &str, tables: &str, servers: &[&Memcached]) -> String {
    let mut text = format!("listen = \"127.0.0.1:0\"\n{SETTINGS}{settings}\n{tables}\n");
    for server in servers {
        text.push_str(&format!(
            "[[servers]]\naddr = \"{}\"\ntls = true\n",
            server.tls_addr()
        ));
    }
    text
}

fn backend_tls(ca: &Path, extra: &str) -> String {
    format!("[backend_tls]\nca_file = \"{}\"\n{extra}\n", ca.display())
}

fn tls_listen(cert: &Issued, extra: &str) -> String {
    format!(
        "[tls_listen]\naddr = \"127.0.0.1:0\"\ncert_file = \"{}\"\nkey_file = \"{}\"\n{extra}\n",
        cert.cert.display(),
        cert.key.display()
    )
}

/// A rustls client config trusting `ca`, with an optional client
/// certificate.
pub(crate) fn client_config(ca: &Path, client: Option<&Issued>) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in memring::tls::certificates(ca).expect("CA file") {
        roots.add(cert).expect("CA");
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots);
    Arc::new(match client {
        None => builder.with_no_client_auth(),
        Some(issued) => builder
            .with_client_auth_cert(
                memring::tls::certificates(&issued.cert).expect("client cert"),
                memring::tls::private_key(&issued.key).expect("client key"),
            )
            .expect("client auth"),
    })
}

/// A blocking memcached client over TLS.
pub(crate) struct TlsClient {
    stream: rustls::StreamOwned<rustls::ClientConnection, TcpStream>,
    buffer: Vec<u8>,
}

impl TlsClient {
    /// Connects and completes the handshake.
    pub(crate) fn connect(
        addr: SocketAddr,
        config: &Arc<rustls::ClientConfig>,
    ) -> std::io::Result<TlsClient> {
        let mut tcp = TcpStream::connect(addr)?;
        tcp.set_read_timeout(Some(DEADLINE))?;
        tcp.set_nodelay(true)?;
        let name = ServerName::IpAddress(addr.ip().into());
        let mut conn =
            rustls::ClientConnection::new(config.clone(), name).map_err(std::io::Error::other)?;
        while conn.is_handshaking() {
            conn.complete_io(&mut tcp)?;
        }
        Ok(TlsClient {
            stream: rustls::StreamOwned::new(conn, tcp),
            buffer: Vec::new(),
        })
    }

    /// The certificate the server presented.
    pub(crate) fn peer(&self) -> CertificateDer<'static> {
        self.stream
            .conn
            .peer_certificates()
            .expect("a peer certificate")[0]
            .clone()
    }

    fn call(&mut self, request: &[u8], kind: ReplyKind) -> std::io::Result<Vec<u8>> {
        self.stream.write_all(request)?;
        self.stream.flush()?;
        self.reply(kind)
    }

    fn reply(&mut self, kind: ReplyKind) -> std::io::Result<Vec<u8>> {
        self.reply_or_end(kind)?
            .ok_or_else(|| std::io::Error::other("closed (close_notify) before a reply"))
    }

    /// One reply, or `None` when the server ended the session cleanly (TLS
    /// `close_notify`; rustls reports a bare TCP close as an error).
    fn reply_or_end(&mut self, kind: ReplyKind) -> std::io::Result<Option<Vec<u8>>> {
        loop {
            if let Some(len) = frame_reply(&self.buffer, kind).expect("well-formed reply") {
                return Ok(Some(self.buffer.drain(..len).collect()));
            }
            let mut chunk = [0u8; 16 * 1024];
            match self.stream.read(&mut chunk)? {
                0 => return Ok(None),
                n => self.buffer.extend_from_slice(&chunk[..n]),
            }
        }
    }

    pub(crate) fn set(&mut self, key: &str, value: &str) -> std::io::Result<Vec<u8>> {
        let request = format!("set {key} 0 0 {}\r\n{value}\r\n", value.len());
        self.call(request.as_bytes(), ReplyKind::Line)
    }

    pub(crate) fn get(&mut self, key: &str) -> std::io::Result<Vec<u8>> {
        self.call(format!("get {key}\r\n").as_bytes(), ReplyKind::Values)
    }
}

fn value_reply(key: &str, value: &str) -> Vec<u8> {
    format!("VALUE {key} 0 {}\r\n{value}\r\nEND\r\n", value.len()).into_bytes()
}

/// Runs `memring check` on `text` written to a file; (success, stdout, stderr).
fn check(dir: &TempDir, text: &str) -> (bool, String, String) {
    let path = dir.path("check.toml");
    std::fs::write(&path, text).expect("write config");
    let output = Command::new(BIN)
        .arg("check")
        .arg(&path)
        .output()
        .expect("run memring check");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn get_set_multi_get_and_meta_reach_tls_servers() {
    let pki = Pki::new("roundtrip");
    let server = pki.issue("server", &["127.0.0.1", "localhost"], false);
    let pool = [
        Memcached::start_tls(&server.cert, &server.key, None),
        Memcached::start_tls(&server.cert, &server.key, None),
    ];
    let proxy = Proxy::start_text(&config(
        "",
        &backend_tls(&pki.ca_file, ""),
        &pool.iter().collect::<Vec<_>>(),
    ));
    let mut client = proxy.client();
    let keys: Vec<String> = (0..40).map(|i| format!("tls:{i}")).collect();
    for key in &keys {
        assert_eq!(client.set(key, key.as_bytes()), b"STORED\r\n", "{key}");
    }
    for key in &keys {
        assert_eq!(client.get(key), Some(key.clone().into_bytes()));
    }
    let multi = format!("get {}\r\n", keys.join(" "));
    let reply = client.call(multi.as_bytes(), ReplyKind::Values);
    let expected: String = keys
        .iter()
        .map(|k| format!("VALUE {k} 0 {}\r\n{k}\r\n", k.len()))
        .chain(["END\r\n".to_string()])
        .collect();
    assert_eq!(show(&reply), show(expected.as_bytes()));
    client.send(b"ms meta:1 5 T0\r\nhello\r\n");
    assert_eq!(client.meta_reply(), b"HD\r\n");
    client.send(b"mg meta:1 v\r\n");
    assert_eq!(show(&client.meta_reply()), show(b"VA 5\r\nhello\r\n"));
    client.send(b"mg meta:none v q\r\nmn\r\n");
    assert_eq!(client.meta_reply(), b"MN\r\n");
    // The values went through TLS to both servers: read them behind memring,
    // on each server's plain port.
    let mut held = [0usize; 2];
    for (i, server) in pool.iter().enumerate() {
        let mut direct = Client::connect(&server.addr());
        for key in &keys {
            if direct.get(key).is_some() {
                held[i] += 1;
            }
        }
    }
    assert_eq!(held[0] + held[1], keys.len(), "{held:?}");
    assert!(
        held.iter().all(|&n| n > 0),
        "both servers got keys: {held:?}"
    );
}

#[test]
fn a_certificate_for_another_name_or_from_another_ca_is_refused_with_the_reason() {
    let pki = Pki::new("names");
    let other_ca = Pki::new("names-other-ca");
    let elsewhere = pki.issue("elsewhere", &["other.example"], false);
    let stranger = other_ca.issue("stranger", &["127.0.0.1"], false);
    let wrong_name = Memcached::start_tls(&elsewhere.cert, &elsewhere.key, None);
    let wrong_ca = Memcached::start_tls(&stranger.cert, &stranger.key, None);

    let text = config("", &backend_tls(&pki.ca_file, ""), &[&wrong_name]);
    let proxy = Proxy::start_text(&text);
    let reply = String::from_utf8_lossy(&proxy.client().get_raw("k")).into_owned();
    assert!(
        reply.starts_with("SERVER_ERROR")
            && reply.contains("certificate not valid for the server's name"),
        "{reply}"
    );
    // Pipelined, each request gets its one error and the client stays in
    // step (memring's own `version` answer comes next).
    let mut client = proxy.client();
    client.send(b"get a\r\nset b 0 0 1\r\nx\r\nget a b c\r\ndelete d\r\nversion\r\n");
    for kind in [
        ReplyKind::Values,
        ReplyKind::Line,
        ReplyKind::Values,
        ReplyKind::Line,
    ] {
        let reply = client.reply(kind);
        assert!(
            reply.starts_with(b"SERVER_ERROR backend "),
            "{}",
            show(&reply)
        );
    }
    assert_eq!(
        show(&client.reply(ReplyKind::Line)),
        show(memring::VERSION_REPLY)
    );
    let (ok, _, stderr) = check(&pki.dir, &text);
    assert!(!ok, "check passed a server with another name's certificate");
    assert!(
        stderr.contains("not valid for name") && stderr.contains("server_name"),
        "{stderr}"
    );

    let text = config("", &backend_tls(&pki.ca_file, ""), &[&wrong_ca]);
    let proxy = Proxy::start_text(&text);
    let reply = proxy.client().get_raw("k");
    assert!(
        show(&reply).contains("not issued by a CA of backend_tls.ca_file"),
        "{}",
        show(&reply)
    );
    let (ok, _, stderr) = check(&pki.dir, &text);
    assert!(!ok, "check passed a server from another CA");
    assert!(stderr.contains("UnknownIssuer"), "{stderr}");

    // server_name verifies (and sends as SNI) the name the certificate is for.
    let text = config(
        "",
        &backend_tls(&pki.ca_file, "server_name = \"other.example\""),
        &[&wrong_name],
    );
    let proxy = Proxy::start_text(&text);
    let mut client = proxy.client();
    assert_eq!(client.set("k", b"v"), b"STORED\r\n");
    assert_eq!(client.get("k"), Some(b"v".to_vec()));
    let (ok, stdout, stderr) = check(&pki.dir, &text);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("TLS ok (VERSION"), "{stdout}");
}

#[test]
fn memcached_requiring_a_client_certificate_gets_memrings() {
    let pki = Pki::new("mtls-backend");
    let server = pki.issue("server", &["127.0.0.1"], false);
    let client_cert = pki.issue("memring", &["memring.client"], true);
    let strict = Memcached::start_tls(&server.cert, &server.key, Some(&pki.ca_file));

    let without = config("", &backend_tls(&pki.ca_file, ""), &[&strict]);
    let proxy = Proxy::start_text(&without);
    // memcached refuses after the handshake (TLS 1.3): on the first read.
    let reply = String::from_utf8_lossy(&proxy.client().get_raw("k")).into_owned();
    assert!(
        reply.starts_with("SERVER_ERROR") && reply.contains("refused the handshake"),
        "{reply}"
    );
    drop(proxy);
    let (ok, _, stderr) = check(&pki.dir, &without);
    assert!(
        !ok,
        "check passed without the client certificate memcached wants"
    );
    assert!(
        stderr.contains("CertificateRequired") && stderr.contains("backend_tls.cert_file"),
        "{stderr}"
    );

    let with = config(
        "",
        &backend_tls(
            &pki.ca_file,
            &format!(
                "cert_file = \"{}\"\nkey_file = \"{}\"",
                client_cert.cert.display(),
                client_cert.key.display()
            ),
        ),
        &[&strict],
    );
    let proxy = Proxy::start_text(&with);
    let mut client = proxy.client();
    assert_eq!(client.set("k", b"mutual"), b"STORED\r\n");
    assert_eq!(client.get("k"), Some(b"mutual".to_vec()));
    let (ok, _, stderr) = check(&pki.dir, &with);
    assert!(ok, "{stderr}");
}

#[test]
fn clients_on_tls_listen_with_and_without_a_client_certificate() {
    let pki = Pki::new("listen");
    let server = pki.issue("listener", &["127.0.0.1"], false);
    let client_cert = pki.issue("client", &["client.example"], true);
    let backend = Memcached::start();
    let plain_server = format!("[[servers]]\naddr = \"{}\"\n", backend.addr());
    let proxy = Proxy::start_text(&format!(
        "listen = \"127.0.0.1:0\"\n{}{plain_server}",
        tls_listen(&server, "")
    ));
    let tls_addr = proxy.running().tls_addr.expect("tls_listen bound");
    let trusting = client_config(&pki.ca_file, None);
    let mut tls = TlsClient::connect(tls_addr, &trusting).expect("TLS client");
    assert_eq!(tls.peer(), server.der);
    assert_eq!(tls.set("k", "over-tls").unwrap(), b"STORED\r\n");
    // The plain listener still serves, the same data.
    assert_eq!(proxy.client().get("k"), Some(b"over-tls".to_vec()));
    assert_eq!(tls.get("k").unwrap(), value_reply("k", "over-tls"));

    // A plain-text client on the TLS port is closed, not answered.
    let mut plain = TcpStream::connect(tls_addr).unwrap();
    plain.set_read_timeout(Some(DEADLINE)).unwrap();
    plain.write_all(b"get k\r\n").unwrap();
    let mut got = Vec::new();
    let _ = plain.read_to_end(&mut got);
    assert!(!got.windows(5).any(|w| w == b"VALUE"), "{}", show(&got));
    // A TLS client on the plain port fails its handshake.
    assert!(TlsClient::connect(proxy.addr, &trusting).is_err());
    // A handshake cut off halfway: the first bytes of a ClientHello.
    let mut cut = TcpStream::connect(tls_addr).unwrap();
    cut.write_all(&[0x16, 0x03, 0x01, 0x00, 0xc8, 0x01])
        .unwrap();
    drop(cut);
    // Nothing of that disturbed memring or the data.
    assert_eq!(tls.get("k").unwrap(), value_reply("k", "over-tls"));
    assert_eq!(
        TlsClient::connect(tls_addr, &trusting)
            .unwrap()
            .get("k")
            .unwrap(),
        value_reply("k", "over-tls")
    );
    drop(proxy);

    // With client_ca_file, only clients with a certificate it issued.
    let proxy = Proxy::start_text(&format!(
        "listen = \"127.0.0.1:0\"\n{}{plain_server}",
        tls_listen(
            &server,
            &format!("client_ca_file = \"{}\"", pki.ca_file.display())
        )
    ));
    let tls_addr = proxy.running().tls_addr.expect("tls_listen bound");
    let refused = TlsClient::connect(tls_addr, &trusting).and_then(|mut c| c.get("k"));
    assert!(
        refused.is_err(),
        "a client without a certificate was served"
    );
    let with_cert = client_config(&pki.ca_file, Some(&client_cert));
    let mut tls = TlsClient::connect(tls_addr, &with_cert).expect("mTLS client");
    assert_eq!(tls.get("k").unwrap(), value_reply("k", "over-tls"));
}

#[test]
fn the_listener_certificate_rotates_under_load_without_errors() {
    let pki = Pki::new("rotate");
    let old = pki.issue("listener", &["127.0.0.1"], false);
    let new = pki.issue("listener-next", &["127.0.0.1"], false);
    let backend = Memcached::start();
    let proxy = Proxy::start_text(&format!(
        "listen = \"127.0.0.1:0\"\n{}[[servers]]\naddr = \"{}\"\n",
        tls_listen(&old, ""),
        backend.addr()
    ));
    let tls_addr = proxy.running().tls_addr.expect("tls_listen bound");
    let config = client_config(&pki.ca_file, None);
    let mut before = TlsClient::connect(tls_addr, &config).unwrap();
    assert_eq!(before.peer(), old.der);

    let stop = Arc::new(AtomicBool::new(false));
    let (done, saw_new, errors) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(std::sync::Mutex::new(Vec::<String>::new())),
    );
    let workers: Vec<_> = (0..3)
        .map(|worker| {
            let (stop, done, saw_new, errors, config) = (
                stop.clone(),
                done.clone(),
                saw_new.clone(),
                errors.clone(),
                config.clone(),
            );
            let new_der = new.der.clone();
            std::thread::spawn(move || {
                let mut round = 0;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("w{worker}:{round}");
                    let result = TlsClient::connect(tls_addr, &config).and_then(|mut c| {
                        let stored = c.set(&key, &key)?;
                        let got = c.get(&key)?;
                        Ok((c.peer(), stored, got))
                    });
                    match result {
                        Ok((peer, stored, got))
                            if stored == b"STORED\r\n" && got == value_reply(&key, &key) =>
                        {
                            if peer == new_der {
                                saw_new.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Ok((_, stored, got)) => errors.lock().unwrap().push(format!(
                            "{key}: {} / {}",
                            show(&stored),
                            show(&got)
                        )),
                        Err(e) => errors.lock().unwrap().push(format!("{key}: {e}")),
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                    round += 1;
                }
            })
        })
        .collect();
    wait_for("connections before the rotation", || {
        done.load(Ordering::Relaxed) >= 30
    });
    // Rewritten in place, the certificate first: a reload may see the new
    // certificate with the old key, and must keep the old pair then.
    std::fs::write(&old.cert, &new.cert_pem).unwrap();
    std::fs::write(&old.key, &new.key_pem).unwrap();
    wait_for("a new connection to get the new certificate", || {
        saw_new.load(Ordering::Relaxed) > 0
    });
    let after = done.load(Ordering::Relaxed);
    wait_for("connections after the rotation", || {
        done.load(Ordering::Relaxed) >= after + 30
    });
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.join().unwrap();
    }
    let errors = errors.lock().unwrap();
    assert!(
        errors.is_empty(),
        "{} errors: {:?}",
        errors.len(),
        &errors[..errors.len().min(5)]
    );
    // A connection from before keeps its session and certificate.
    assert_eq!(before.peer(), old.der);
    assert_eq!(before.set("before", "still").unwrap(), b"STORED\r\n");
    assert_eq!(
        TlsClient::connect(tls_addr, &config).unwrap().peer(),
        new.der
    );
}

#[test]
fn a_bad_certificate_file_keeps_the_certificate_in_force() {
    let pki = Pki::new("bad-cert");
    let good = pki.issue("listener", &["127.0.0.1"], false);
    let next = pki.issue("listener-next", &["127.0.0.1"], false);
    let backend = Memcached::start();
    let proxy = Proxy::start_text(&format!(
        "listen = \"127.0.0.1:0\"\n{}[[servers]]\naddr = \"{}\"\n",
        tls_listen(&good, ""),
        backend.addr()
    ));
    let tls_addr = proxy.running().tls_addr.expect("tls_listen bound");
    let acceptor = proxy.running().tls_acceptor.clone().expect("acceptor");
    let config = client_config(&pki.ca_file, None);
    std::fs::write(
        &good.cert,
        "-----BEGIN CERTIFICATE-----\nnot base64 at all\n",
    )
    .unwrap();
    wait_for("the bad file to be read and rejected", || {
        acceptor.reloads().1 >= 1
    });
    assert_eq!(acceptor.reloads().0, 0);
    let mut client = TlsClient::connect(tls_addr, &config).expect("still serving");
    assert_eq!(client.peer(), good.der);
    assert_eq!(client.set("k", "v").unwrap(), b"STORED\r\n");
    // A good pair afterwards is taken.
    std::fs::write(&good.key, &next.key_pem).unwrap();
    std::fs::write(&good.cert, &next.cert_pem).unwrap();
    wait_for("the good pair to be applied", || acceptor.reloads().0 >= 1);
    assert_eq!(
        TlsClient::connect(tls_addr, &config).unwrap().peer(),
        next.der
    );
}

#[test]
fn a_killed_tls_server_goes_dead_and_comes_back_like_a_plain_one() {
    let pki = Pki::new("health");
    let server = pki.issue("server", &["127.0.0.1"], false);
    let mut pool = [
        Memcached::start_tls(&server.cert, &server.key, None),
        Memcached::start_tls(&server.cert, &server.key, None),
    ];
    let text = format!(
        "listen = \"127.0.0.1:0\"\nconnect_timeout_ms = 3000\nrequest_timeout_ms = 3000\nfailure_limit = 2\n{}{}",
        backend_tls(&pki.ca_file, ""),
        pool.iter()
            .map(|m| format!("[[servers]]\naddr = \"{}\"\ntls = true\n", m.tls_addr()))
            .collect::<String>()
    );
    let proxy = Proxy::start_text(&text);
    let mut client = proxy.client();
    let keys: Vec<String> = (0..40).map(|i| format!("h:{i}")).collect();
    for key in &keys {
        assert_eq!(client.set(key, key.as_bytes()), b"STORED\r\n");
    }
    let backend = proxy.running().topology.load().backends[1].clone();
    assert_eq!(backend.state(), HealthState::Active);
    let theirs: Vec<&String> = keys.iter().filter(|k| proxy.owner_now(k) == 1).collect();
    let ours: Vec<&String> = keys.iter().filter(|k| proxy.owner_now(k) == 0).collect();
    assert!(!theirs.is_empty() && !ours.is_empty());
    pool[1].kill();
    wait_for("the killed TLS server to be DEAD", || {
        let _ = client.get_raw(theirs[0]);
        backend.state() == HealthState::Dead
    });
    let reply = client.get_raw(theirs[0]);
    assert!(show(&reply).starts_with("SERVER_ERROR"), "{}", show(&reply));
    for key in &ours {
        assert_eq!(client.get(key), Some(key.as_bytes().to_vec()));
    }
    pool[1].restart();
    // Probed back to SUSPECT, then ACTIVE on the first request it answers.
    wait_for("its keys to be served again", || {
        client.set(theirs[0], b"again") == b"STORED\r\n"
    });
    assert_eq!(client.get(theirs[0]), Some(b"again".to_vec()));
    assert_eq!(backend.state(), HealthState::Active);
}

#[test]
fn shutdown_ends_tls_clients_with_close_notify_after_their_replies() {
    let pki = Pki::new("drain");
    let server = pki.issue("listener", &["127.0.0.1"], false);
    let backend = Memcached::start();
    let mut proxy = Proxy::start_text(&format!(
        "listen = \"127.0.0.1:0\"\n{}[[servers]]\naddr = \"{}\"\n",
        tls_listen(&server, ""),
        backend.addr()
    ));
    let tls_addr = proxy.running().tls_addr.expect("tls_listen bound");
    let mut client = TlsClient::connect(tls_addr, &client_config(&pki.ca_file, None)).unwrap();
    assert_eq!(client.set("k", "v").unwrap(), b"STORED\r\n");
    let burst: Vec<u8> = (0..200).flat_map(|_| b"get k\r\n".to_vec()).collect();
    client.stream.write_all(&burst).unwrap();
    client.stream.flush().unwrap();
    // The first reply is owed before shutdown starts.
    assert_eq!(
        client.reply(ReplyKind::Values).unwrap(),
        value_reply("k", "v")
    );
    std::thread::scope(|scope| {
        scope.spawn(|| proxy.shutdown());
        let mut replies = 1;
        loop {
            match client.reply_or_end(ReplyKind::Values) {
                Ok(Some(reply)) => {
                    assert_eq!(reply, value_reply("k", "v"));
                    replies += 1;
                }
                Ok(None) => {
                    assert!(client.buffer.is_empty(), "a reply was cut off");
                    break;
                }
                // A bare TCP close, without close_notify, lands here.
                Err(e) => panic!("after {replies} replies: {e}"),
            }
        }
        assert!(replies >= 1);
    });
}

/// What one bench/tls run hung on: requests pipelined to a TLS server that
/// stops answering. Each gets exactly one reply, in order, and every
/// client's connection stays open and in step: memring sends nothing more
/// and nothing less. (memtier's memcache_text parser is what stops at a
/// `SERVER_ERROR` reply, with or without TLS; docs/tls.md.)
#[test]
fn pipelined_requests_to_a_stalled_tls_server_each_get_one_reply_in_order() {
    let pki = Pki::new("stall");
    let server = pki.issue("server", &["127.0.0.1"], false);
    let mut stalled = Memcached::start_tls(&server.cert, &server.key, None);
    let listener = pki.issue("listener", &["127.0.0.1"], false);
    let proxy = Proxy::start_text(&format!(
        "listen = \"127.0.0.1:0\"\nconnect_timeout_ms = 3000\nrequest_timeout_ms = 300\n\
         failure_limit = 1000\n{}{}[[servers]]\naddr = \"{}\"\ntls = true\n",
        tls_listen(&listener, ""),
        backend_tls(&pki.ca_file, ""),
        stalled.tls_addr()
    ));
    let mut clients: Vec<Client> = (0..4).map(|_| proxy.client()).collect();
    // And a client over TLS, as memtier --tls is.
    let tls_addr = proxy.running().tls_addr.expect("tls_listen bound");
    let mut tls_client =
        TlsClient::connect(tls_addr, &client_config(&pki.ca_file, None)).expect("TLS client");
    assert_eq!(clients[0].set("k", b"v"), b"STORED\r\n");
    stalled.pause();
    let batch: &[u8] = b"get k\r\nset s 0 0 1\r\nx\r\nget k k2 k3\r\nmg k v\r\ndelete k9\r\nincr n 1\r\nversion\r\n";
    for client in &mut clients {
        client.send(batch);
    }
    tls_client
        .stream
        .write_all(b"get k\r\nset s 0 0 1\r\nx\r\nget k k2\r\nversion\r\n")
        .unwrap();
    tls_client.stream.flush().unwrap();
    for kind in [ReplyKind::Values, ReplyKind::Line, ReplyKind::Values] {
        let reply = tls_client.reply(kind).unwrap();
        assert!(
            reply.starts_with(b"SERVER_ERROR backend "),
            "{}",
            show(&reply)
        );
    }
    assert_eq!(
        show(&tls_client.reply(ReplyKind::Line).unwrap()),
        show(memring::VERSION_REPLY)
    );
    for client in &mut clients {
        let replies = [
            client.reply(ReplyKind::Values),
            client.reply(ReplyKind::Line),
            client.reply(ReplyKind::Values),
            client.meta_reply(),
            client.reply(ReplyKind::Line),
            client.reply(ReplyKind::Line),
        ];
        for reply in &replies {
            assert!(
                reply.starts_with(b"SERVER_ERROR backend "),
                "{}",
                show(reply)
            );
            assert!(reply.ends_with(b"\r\n"), "{}", show(reply));
        }
        // memring's own answer comes next: nothing was left out or added.
        assert_eq!(
            show(&client.reply(ReplyKind::Line)),
            show(memring::VERSION_REPLY)
        );
    }
    stalled.resume();
    wait_for("the resumed TLS server to answer", || {
        clients[0].get_raw("k") == value_reply("k", "v")
    });
    for client in &mut clients {
        assert_eq!(client.get("k"), Some(b"v".to_vec()));
    }
    assert_eq!(tls_client.get("k").unwrap(), value_reply("k", "v"));

    // Killed with requests in flight (the harness resumes it for the kill,
    // so it may answer some first): one reply each, its answer or an error.
    stalled.pause();
    for client in &mut clients {
        client.send(b"get k\r\nget k k2\r\nversion\r\n");
    }
    stalled.kill();
    for client in &mut clients {
        for _ in 0..2 {
            let reply = client.reply(ReplyKind::Values);
            assert!(
                reply == value_reply("k", "v") || reply.starts_with(b"SERVER_ERROR backend "),
                "{}",
                show(&reply)
            );
        }
        assert_eq!(
            show(&client.reply(ReplyKind::Line)),
            show(memring::VERSION_REPLY)
        );
    }
    stalled.restart();
    wait_for("the restarted TLS server to answer", || {
        clients[0].set("k", b"again") == b"STORED\r\n"
    });
    for client in &mut clients {
        assert_eq!(client.get("k"), Some(b"again".to_vec()));
    }
}

/// Hand-off over TLS to its end: when a window ends, memring lists each TLS
/// server's keys and deletes those it no longer owns, over TLS as its
/// connections speak (the server's port speaks nothing else), so a later
/// change that gives a key back cannot read the old copy.
#[test]
fn a_hand_off_window_ends_with_a_sweep_of_the_tls_servers() {
    let pki = Pki::new("sweep");
    let server = pki.issue("server", &["127.0.0.1"], false);
    let pool: Vec<Memcached> = (0..3)
        .map(|_| Memcached::start_tls(&server.cert, &server.key, None))
        .collect();
    let text = |n: usize| {
        // Long enough for 600 reads over TLS on a loaded machine (they must
        // fall in the window), short enough to wait for its end.
        config(
            "handoff_ms = 4000",
            &backend_tls(&pki.ca_file, ""),
            &pool[..n].iter().collect::<Vec<_>>(),
        )
    };
    let path = pki.dir.path("memring.toml");
    std::fs::write(&path, text(2)).unwrap();
    let proxy = Proxy::start_file(&path);
    let mut client = proxy.client();
    let keys: Vec<String> = (0..600).map(|i| format!("sweep:{i}")).collect();
    for key in &keys {
        assert_eq!(client.set(key, b"v1"), b"STORED\r\n", "{key}");
    }
    replace_by_rename(&path, &text(3));
    wait_for("ring version 2", || proxy.ring_version() >= 2);
    // Read in the window: each moved key is copied to the new server.
    let hits = keys.iter().filter(|k| client.get(k).is_some()).count();
    assert!(hits >= keys.len() * 995 / 1000, "{hits} of {}", keys.len());
    wait_for("the sweep of 3 servers, then the window's end", || {
        proxy.client().stat("handoff_sweeps") >= 3
            && proxy.running().topology.load().previous.is_none()
    });
    let deleted = proxy.client().stat("handoff_leftovers_deleted");
    assert!(
        deleted > 60,
        "the old owners' copies were deleted: {deleted}"
    );
    // Behind memring, on the plain ports: every key is on its owner alone.
    let mut holders = vec![0usize; keys.len()];
    for server in &pool {
        let mut direct = server.client();
        for (i, key) in keys.iter().enumerate() {
            holders[i] += usize::from(direct.get(key).is_some());
        }
    }
    let doubled = holders.iter().filter(|&&n| n > 1).count();
    assert_eq!(doubled, 0, "keys on more than one server after the sweep");
}

/// Session resumption: memring's one `Connector` (shared by every backend
/// connection) remembers the session a server gave it, so the next
/// connection, a reconnect after a broken one say, resumes it with an
/// abbreviated handshake instead of a full one. memcached issues TLS 1.3
/// tickets by default.
#[test]
fn a_new_connection_to_a_tls_server_resumes_the_last_session() {
    use std::time::Duration;
    let pki = Pki::new("resume");
    let server = pki.issue("server", &["127.0.0.1"], false);
    let cache = Memcached::start_tls(&server.cert, &server.key, None);
    let connector = memring::tls::Connector::new(&memring::tls::BackendFiles {
        ca_file: pki.ca_file.clone(),
        client_cert: None,
        server_name: None,
    })
    .expect("backend_tls");
    let dns = memring::inputs::resolve::Dns::default();
    let timeout = Duration::from_secs(5);
    let mut kinds = Vec::new();
    for _ in 0..3 {
        let mut stream = connector
            .connect_blocking(&cache.tls_addr(), dns, timeout)
            .expect("TLS connection");
        kinds.push(stream.conn.handshake_kind());
        // A TLS 1.3 ticket comes after the handshake: read it with a reply.
        stream.write_all(b"version\r\n").unwrap();
        stream.flush().unwrap();
        let mut reply = Vec::new();
        let mut chunk = [0u8; 256];
        while !reply.ends_with(b"\r\n") {
            let n = stream.read(&mut chunk).expect("version reply");
            assert!(n > 0, "closed before the version reply");
            reply.extend_from_slice(&chunk[..n]);
        }
        assert!(reply.starts_with(b"VERSION "), "{}", show(&reply));
        assert_eq!(
            stream.conn.protocol_version(),
            Some(rustls::ProtocolVersion::TLSv1_3)
        );
    }
    use rustls::HandshakeKind::{Full, Resumed};
    assert_eq!(kinds, [Some(Full), Some(Resumed), Some(Resumed)]);
}

/// `auto_eject` over TLS: a dead TLS server is ejected, and when it answers
/// again it is flushed before it is put back, over TLS (its port speaks
/// nothing else), then serves its keys again.
#[test]
fn an_ejected_tls_server_is_flushed_over_tls_and_put_back() {
    let pki = Pki::new("eject");
    let server = pki.issue("server", &["127.0.0.1"], false);
    let mut pool: Vec<Memcached> = (0..3)
        .map(|_| Memcached::start_tls(&server.cert, &server.key, None))
        .collect();
    let text = format!(
        "listen = \"127.0.0.1:0\"\nconnect_timeout_ms = 3000\nrequest_timeout_ms = 3000\n\
         failure_limit = 2\nauto_eject = true\n{}{}",
        backend_tls(&pki.ca_file, ""),
        pool.iter()
            .map(|m| format!("[[servers]]\naddr = \"{}\"\ntls = true\n", m.tls_addr()))
            .collect::<String>()
    );
    let proxy = Proxy::start_text(&text);
    let mut client = proxy.client();
    let keys: Vec<String> = (0..300).map(|i| format!("eject:{i}")).collect();
    for key in &keys {
        assert_eq!(client.set(key, b"v"), b"STORED\r\n");
    }
    let victims: Vec<&String> = keys.iter().filter(|k| proxy.owner_now(k) == 0).collect();
    assert!(!victims.is_empty());
    pool[0].kill();
    wait_for("the dead TLS server to be ejected", || {
        let _ = client.get_raw(victims[0]);
        proxy.running().topology.load().ejected.len() == 1
    });
    pool[0].restart();
    wait_for("the TLS server to be put back", || {
        let _ = client.get_raw(victims[0]);
        proxy.running().topology.load().ejected.is_empty()
    });
    assert_eq!(proxy.owner_now(victims[0]), 0);
    assert_eq!(client.set(victims[0], b"home"), b"STORED\r\n");
    assert_eq!(pool[0].client().get(victims[0]), Some(b"home".to_vec()));
}

/// A TLS front for a plain server: it accepts TLS with `cert` and relays
/// each session's bytes to and from a connection of its own to `upstream`,
/// so that `common::faulty`'s scripted server misbehaves over TLS. Stopped
/// and joined on drop.
struct TlsFront {
    addr: String,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TlsFront {
    fn start(cert: &Issued, upstream: String) -> TlsFront {
        let config = Arc::new(
            rustls::ServerConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(
                memring::tls::certificates(&cert.cert).expect("cert"),
                memring::tls::private_key(&cert.key).expect("key"),
            )
            .expect("server config"),
        );
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("addr").to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut sessions = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((tcp, _)) => {
                            let (config, upstream, stop) =
                                (config.clone(), upstream.clone(), stop.clone());
                            sessions.push(std::thread::spawn(move || {
                                relay(tcp, &upstream, config, &stop)
                            }));
                        }
                        Err(_) => std::thread::sleep(std::time::Duration::from_millis(5)),
                    }
                }
                for session in sessions {
                    let _ = session.join();
                }
            })
        };
        TlsFront {
            addr,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One TLS session of a [`TlsFront`], until either side closes or `stop`.
fn relay(tcp: TcpStream, upstream: &str, config: Arc<rustls::ServerConfig>, stop: &AtomicBool) {
    use std::io::ErrorKind::{TimedOut, WouldBlock};
    // One thread serves both directions, waiting on each in turn: every
    // handshake flight and every reply that comes in two pieces waits out
    // one poll, so it is short (10 ms made the framing test spend most of
    // its 12 s here).
    let poll = Some(std::time::Duration::from_millis(1));
    let Ok(mut plain) = TcpStream::connect(upstream) else {
        return;
    };
    let setup = tcp
        .set_nonblocking(false)
        .and_then(|()| tcp.set_nodelay(true))
        .and_then(|()| plain.set_nodelay(true))
        .and_then(|()| tcp.set_read_timeout(poll))
        .and_then(|()| plain.set_read_timeout(poll));
    let Ok(conn) = rustls::ServerConnection::new(config) else {
        return;
    };
    if setup.is_err() {
        return;
    }
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let mut chunk = [0u8; 16 * 1024];
    while !stop.load(Ordering::Relaxed) {
        match tls.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => {
                if plain.write_all(&chunk[..n]).is_err() {
                    return;
                }
            }
            Err(e) if matches!(e.kind(), WouldBlock | TimedOut) => {}
            Err(_) => return,
        }
        match plain.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => {
                if tls
                    .write_all(&chunk[..n])
                    .and_then(|()| tls.flush())
                    .is_err()
                {
                    return;
                }
            }
            Err(e) if matches!(e.kind(), WouldBlock | TimedOut) => {}
            Err(_) => return,
        }
    }
}

/// Strict framing over TLS: a TLS server that answers out of step (garbage,
/// an extra `END`, a value nobody asked for) is a server fault exactly as in
/// plain text (tests/integration/hostile.rs): its connection is dropped and
/// its requests fail with `SERVER_ERROR`, no client ever gets another
/// key's value, and the TLS server beside it is untouched.
#[test]
fn a_tls_server_out_of_step_is_dropped_and_no_reply_reaches_the_wrong_request() {
    use crate::common::faulty::{FaultyServer, Misbehaviour};
    let pki = Pki::new("framing");
    let cert = pki.issue("server", &["127.0.0.1"], false);
    let real = Memcached::start_tls(&cert.cert, &cert.key, None);
    for behaviour in [
        Misbehaviour::GarbageLine,
        Misbehaviour::ExtraEnd,
        Misbehaviour::ExtraValue,
    ] {
        let faulty = FaultyServer::start(behaviour);
        let front = TlsFront::start(&cert, faulty.addr());
        let proxy = Proxy::start_text(&format!(
            "listen = \"127.0.0.1:0\"\n{SETTINGS}{}\
             [[servers]]\naddr = \"{}\"\ntls = true\n[[servers]]\naddr = \"{}\"\ntls = true\n",
            backend_tls(&pki.ca_file, ""),
            real.tls_addr(),
            front.addr
        ));
        let keys: Vec<String> = (0..40).map(|i| format!("{behaviour:?}:{i}")).collect();
        let mut client = proxy.client();
        let mut faults = 0;
        for round in 0..6 {
            for key in &keys {
                let set = client.set(key, key.as_bytes());
                let got = client.get_raw(key);
                if proxy.owner_now(key) == 0 {
                    assert_eq!(show(&set), show(b"STORED\r\n"), "{behaviour:?} {key}");
                    assert_eq!(show(&got), show(&value_reply(key, key)), "{key}");
                    continue;
                }
                for reply in [&set, &got] {
                    if reply.starts_with(b"SERVER_ERROR backend ") {
                        faults += 1;
                    }
                }
                let fine = got == value_reply(key, key)
                    || got == b"END\r\n"
                    || got.starts_with(b"SERVER_ERROR backend ");
                assert!(fine, "{behaviour:?} round {round} {key}: {}", show(&got));
            }
        }
        let backends = proxy.running().topology.load_full().backends.clone();
        assert!(faults > 0, "{behaviour:?}: no fault reached a client");
        assert!(backends[1].metrics().error_count() > 0, "{behaviour:?}");
        assert_eq!(backends[0].metrics().error_count(), 0, "{behaviour:?}");
        // It was dropped and connected to again, each time over TLS.
        assert!(faulty.probes() >= 2, "{behaviour:?}: {}", faulty.probes());
    }
}
