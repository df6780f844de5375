//! TLS on both sides, with rustls (the `ring` provider, TLS 1.2 and 1.3
//! only): the client config memring verifies servers with (`[backend_tls]`),
//! the server config clients are verified with (`[tls_listen]`), both built
//! from PEM files, and the watcher that swaps the listener's certificate
//! when its files change. No protocol here: connections only get a TLS
//! stream from this module, and everything else treats it as a byte stream.

use std::io;
use std::net::{IpAddr, TcpStream as StdTcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::client::Resumption;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{CertificateError, ClientConfig, RootCertStore, ServerConfig};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

pub use crate::error::TlsFailure;

/// TLS sessions kept to resume with: enough for every connection of a
/// large pool to reconnect with an abbreviated handshake.
const CLIENT_SESSIONS: usize = 4096;
/// Client sessions the listener remembers for resumption. A reload starts
/// a new cache: a session of the old certificate is not resumed after it,
/// so every connection from then on is made with the new one.
const SERVER_SESSIONS: usize = 16_384;
/// Quiet time after a change to the listener's files before they are read:
/// a certificate and its key are usually written one after the other.
const RELOAD_DEBOUNCE: Duration = Duration::from_millis(200);

/// The files of `[tls_listen]` (paths as resolved against the config file's
/// directory).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenFiles {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// Clients must present a certificate issued by one of these.
    pub client_ca_file: Option<PathBuf>,
}

/// The settings of `[backend_tls]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendFiles {
    pub ca_file: PathBuf,
    /// A client certificate and its key, both or neither.
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// The name verified and sent as SNI instead of the host of `addr`.
    pub server_name: Option<String>,
}

/// A TLS file that cannot be used: which file and why.
#[derive(Debug, thiserror::Error)]
#[error("{}: {what}", path.display())]
pub struct TlsError {
    pub path: PathBuf,
    pub what: String,
}

impl TlsError {
    fn new(path: &Path, what: impl Into<String>) -> TlsError {
        TlsError {
            path: path.to_path_buf(),
            what: what.into(),
        }
    }
}

impl From<TlsError> for io::Error {
    fn from(error: TlsError) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidInput, error.to_string())
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

const VERSIONS: &[&rustls::SupportedProtocolVersion] =
    &[&rustls::version::TLS13, &rustls::version::TLS12];

/// A PEM file: a regular file of at most [`MAX_TLS_FILE_BYTES`] (a FIFO or
/// `/dev/zero` in its place is refused at once).
///
/// [`MAX_TLS_FILE_BYTES`]: crate::inputs::regular_file::MAX_TLS_FILE_BYTES
fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    crate::inputs::regular_file::read(path, crate::inputs::regular_file::MAX_TLS_FILE_BYTES)
        .map_err(|e| TlsError::new(path, format!("cannot read: {e}")))
}

/// The certificates of a PEM file: at least one, or an error saying so.
pub fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    certificates_in(path, &read(path)?)
}

fn certificates_in(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = rustls_pemfile::certs(&mut &pem[..])
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::new(path, format!("not a PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(TlsError::new(
            path,
            "holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
        ));
    }
    Ok(certs)
}

/// The private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    private_key_in(path, &read(path)?)
}

fn private_key_in(path: &Path, pem: &[u8]) -> Result<PrivateKeyDer<'static>, TlsError> {
    match rustls_pemfile::private_key(&mut &pem[..]) {
        Ok(Some(key)) => Ok(key),
        Ok(None) => Err(TlsError::new(
            path,
            "holds no PEM private key (-----BEGIN PRIVATE KEY-----)",
        )),
        Err(e) => Err(TlsError::new(path, format!("not a PEM key file: {e}"))),
    }
}

fn roots(path: &Path, pem: &[u8]) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in certificates_in(path, pem)? {
        roots
            .add(cert)
            .map_err(|e| TlsError::new(path, format!("not a usable CA certificate: {e}")))?;
    }
    Ok(roots)
}

/// Reads and checks every file of `[backend_tls]`, as connecting will.
///
/// # Errors
/// A file is missing or unreadable, holds no certificate or key, or the
/// key does not belong to the certificate.
pub fn check_backend(files: &BackendFiles) -> Result<(), TlsError> {
    Connector::new(files).map(drop)
}

/// Reads and checks every file of `[tls_listen]`, as the listener will.
///
/// # Errors
/// As [`check_backend`].
pub fn check_listen(files: &ListenFiles) -> Result<(), TlsError> {
    server_config_of(files, &ListenContents::read(files)?).map(drop)
}

/// How memring opens TLS to servers marked `tls = true`. One for the whole
/// process: every worker's connections share its session cache, so a
/// reconnect resumes the last session instead of a full handshake.
pub struct Connector {
    config: Arc<ClientConfig>,
    server_name: Option<ServerName<'static>>,
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl Connector {
    /// Builds the client config from `[backend_tls]`'s files.
    ///
    /// # Errors
    /// As [`check_backend`]; also a `server_name` that is not a DNS name or
    /// an IP address.
    pub fn new(files: &BackendFiles) -> Result<Connector, TlsError> {
        let roots = roots(&files.ca_file, &read(&files.ca_file)?)?;
        let builder = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(VERSIONS)
            .map_err(|e| TlsError::new(&files.ca_file, e.to_string()))?
            .with_root_certificates(roots);
        let mut config = match &files.client_cert {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => builder
                .with_client_auth_cert(certificates(cert)?, private_key(key)?)
                .map_err(|e| {
                    TlsError::new(
                        key,
                        format!("does not fit the certificate {}: {e}", cert.display()),
                    )
                })?,
        };
        config.resumption = Resumption::in_memory_sessions(CLIENT_SESSIONS);
        let server_name = match &files.server_name {
            None => None,
            Some(name) => Some(ServerName::try_from(name.clone()).map_err(|_| {
                TlsError::new(
                    &files.ca_file,
                    format!("server_name `{name}` is neither a DNS name nor an IP address"),
                )
            })?),
        };
        Ok(Connector {
            config: Arc::new(config),
            server_name,
        })
    }

    /// The name verified for a server at `addr` (`host:port`): the
    /// configured `server_name`, else the host as written.
    fn name_for(&self, addr: &str) -> Result<ServerName<'static>, TlsFailure> {
        if let Some(name) = &self.server_name {
            return Ok(name.clone());
        }
        let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(ServerName::IpAddress(ip.into()));
        }
        ServerName::try_from(host.to_string()).map_err(|_| TlsFailure::BadName)
    }

    /// The TLS handshake over a connected socket, within `timeout`.
    ///
    /// # Errors
    /// The kind of failure, and rustls's words for it (for the log).
    pub(crate) async fn connect(
        &self,
        addr: &str,
        stream: TcpStream,
        timeout: Duration,
    ) -> Result<tokio_rustls::client::TlsStream<TcpStream>, (TlsFailure, String)> {
        let name = self
            .name_for(addr)
            .map_err(|kind| (kind, format!("`{addr}` has no host name to verify")))?;
        let connector = tokio_rustls::TlsConnector::from(self.config.clone());
        match tokio::time::timeout(timeout, connector.connect(name, stream)).await {
            Err(_) => Err((
                TlsFailure::Timeout,
                "no TLS handshake within connect_timeout_ms (is the server speaking TLS?)".into(),
            )),
            Ok(Err(e)) => Err(explain(&e)),
            Ok(Ok(stream)) => Ok(stream),
        }
    }

    /// A blocking TLS connection to `addr` (for `check` and the flush of a
    /// joining server, both off the request path). A host name is looked up
    /// through `dns`, where the backends' connections look it up (a
    /// `[discovery] resolver` knows names the system's resolver does not),
    /// and each of its addresses is tried in turn.
    ///
    /// # Errors
    /// The server cannot be reached, or the handshake failed.
    pub fn connect_blocking(
        &self,
        addr: &str,
        dns: crate::inputs::resolve::Dns,
        timeout: Duration,
    ) -> Result<rustls::StreamOwned<rustls::ClientConnection, StdTcpStream>, ConnectError> {
        use std::net::ToSocketAddrs;
        let unreachable = ConnectError::Unreachable;
        let targets: Vec<std::net::SocketAddr> = match crate::inputs::resolve::host_name(addr) {
            Some((host, port)) => crate::inputs::resolve::block_on(|| dns.addresses(host, port))
                .map_err(|e| unreachable(io::Error::other(e.detail)))?,
            None => addr.to_socket_addrs().map_err(unreachable)?.collect(),
        };
        let mut failure = io::Error::other("the address resolves to nothing");
        let mut connected = None;
        for target in targets {
            match StdTcpStream::connect_timeout(&target, timeout) {
                Ok(tcp) => {
                    connected = Some(tcp);
                    break;
                }
                Err(e) => failure = e,
            }
        }
        let mut tcp = connected.ok_or_else(|| unreachable(failure))?;
        tcp.set_read_timeout(Some(timeout)).map_err(unreachable)?;
        tcp.set_write_timeout(Some(timeout)).map_err(unreachable)?;
        let name = self.name_for(addr).map_err(|kind| {
            ConnectError::Handshake(kind, format!("`{addr}` has no host name to verify"))
        })?;
        let mut conn = rustls::ClientConnection::new(self.config.clone(), name)
            .map_err(|e| ConnectError::Handshake(TlsFailure::Handshake, e.to_string()))?;
        while conn.is_handshaking() {
            if let Err(e) = conn.complete_io(&mut tcp) {
                let (kind, words) = explain(&e);
                let kind = match e.kind() {
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => TlsFailure::Timeout,
                    _ => kind,
                };
                return Err(ConnectError::Handshake(kind, words));
            }
        }
        Ok(rustls::StreamOwned::new(conn, tcp))
    }
}

impl Connector {
    /// Connects as [`Connector::connect_blocking`] does and asks `version`:
    /// a server that wants a client certificate refuses it only after the
    /// handshake (TLS 1.3), at the first read. Returns the server's answer.
    ///
    /// # Errors
    /// As [`Connector::connect_blocking`]; a refusal after the handshake is
    /// a [`ConnectError::Handshake`].
    pub fn probe_blocking(
        &self,
        addr: &str,
        dns: crate::inputs::resolve::Dns,
        timeout: Duration,
    ) -> Result<String, ConnectError> {
        use std::io::{Read, Write};
        let mut stream = self.connect_blocking(addr, dns, timeout)?;
        let failed = |e: io::Error| match tls_error(&e) {
            Some((kind, words)) => ConnectError::Handshake(kind, words),
            None => ConnectError::Handshake(
                TlsFailure::Closed,
                format!("TLS session ended before the server answered `version`: {e}"),
            ),
        };
        stream.write_all(b"version\r\n").map_err(failed)?;
        stream.flush().map_err(failed)?;
        let mut reply = Vec::new();
        let mut chunk = [0u8; 256];
        while !reply.ends_with(b"\r\n") && reply.len() < 1024 {
            match stream.read(&mut chunk) {
                Ok(0) => return Err(failed(io::ErrorKind::UnexpectedEof.into())),
                Ok(n) => reply.extend_from_slice(&chunk[..n]),
                Err(e) => return Err(failed(e)),
            }
        }
        Ok(String::from_utf8_lossy(&reply).trim_end().to_string())
    }
}

/// Why [`Connector::connect_blocking`] failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// No TCP connection (the server is down, or the name does not resolve).
    #[error("cannot connect: {0}")]
    Unreachable(io::Error),
    /// Connected, but no TLS session: rustls's words.
    #[error("{1}")]
    Handshake(TlsFailure, String),
}

/// What a TLS error on an established connection means, when it is one: a
/// server that wants a client certificate (TLS 1.3) says so only after the
/// handshake, with an alert on the first read.
pub(crate) fn tls_error(error: &io::Error) -> Option<(TlsFailure, String)> {
    error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .map(|_| explain(error))
}

/// What a failed handshake means, and rustls's words for it.
fn explain(error: &io::Error) -> (TlsFailure, String) {
    let Some(tls) = error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    else {
        let kind = match error.kind() {
            io::ErrorKind::UnexpectedEof => TlsFailure::Closed,
            _ => TlsFailure::Handshake,
        };
        return (kind, format!("TLS handshake failed: {error}"));
    };
    let kind = match tls {
        rustls::Error::InvalidCertificate(cert) => match cert {
            CertificateError::UnknownIssuer => TlsFailure::UnknownIssuer,
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                TlsFailure::WrongName
            }
            CertificateError::Expired
            | CertificateError::ExpiredContext { .. }
            | CertificateError::NotValidYet
            | CertificateError::NotValidYetContext { .. } => TlsFailure::Expired,
            _ => TlsFailure::BadCertificate,
        },
        rustls::Error::AlertReceived(_) => TlsFailure::Refused,
        _ => TlsFailure::Handshake,
    };
    let hint = match kind {
        TlsFailure::UnknownIssuer => " (not issued by a CA of backend_tls.ca_file)",
        TlsFailure::WrongName => {
            " (set backend_tls.server_name to the name the certificate is for)"
        }
        TlsFailure::Refused => {
            " (does the server require a client certificate? backend_tls.cert_file)"
        }
        _ => "",
    };
    (kind, format!("TLS handshake failed: {tls}{hint}"))
}

/// The bytes of the listener's files, read once per reload.
#[derive(PartialEq, Eq)]
struct ListenContents {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

impl ListenContents {
    fn read(files: &ListenFiles) -> Result<ListenContents, TlsError> {
        Ok(ListenContents {
            cert: read(&files.cert_file)?,
            key: read(&files.key_file)?,
            client_ca: files.client_ca_file.as_deref().map(read).transpose()?,
        })
    }
}

fn server_config_of(
    files: &ListenFiles,
    contents: &ListenContents,
) -> Result<ServerConfig, TlsError> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(VERSIONS)
        .map_err(|e| TlsError::new(&files.cert_file, e.to_string()))?;
    let builder = match (&files.client_ca_file, &contents.client_ca) {
        (Some(path), Some(pem)) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots(path, pem)?),
                provider(),
            )
            .build()
            .map_err(|e| TlsError::new(path, e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
        _ => builder.with_no_client_auth(),
    };
    let certs = certificates_in(&files.cert_file, &contents.cert)?;
    let key = private_key_in(&files.key_file, &contents.key)?;
    let mut config = builder.with_single_cert(certs, key).map_err(|e| {
        TlsError::new(
            &files.key_file,
            format!(
                "does not fit the certificate {}: {e}",
                files.cert_file.display()
            ),
        )
    })?;
    config.session_storage = rustls::server::ServerSessionMemoryCache::new(SERVER_SESSIONS);
    Ok(config)
}

/// The listener's TLS config: the one in force, swapped whole when its
/// files change. A connection takes the config in force when it is
/// accepted and keeps it.
pub struct Acceptor {
    files: ListenFiles,
    current: ArcSwap<ServerConfig>,
    /// What the config in force was built from, and the last bad contents
    /// or read error seen, so that a bad file is logged once.
    seen: Mutex<(ListenContents, Option<Rejected>)>,
    /// Reloads applied and rejected since start.
    applied: AtomicU64,
    rejected: AtomicU64,
}

impl std::fmt::Debug for Acceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acceptor")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

/// The last files a reload rejected.
#[derive(PartialEq, Eq)]
enum Rejected {
    Contents(ListenContents),
    /// A file could not be read, in these words.
    Read(String),
}

/// What a reload of the listener's files did.
#[derive(Debug)]
pub enum Reloaded {
    /// The files are as they were.
    Unchanged,
    /// New connections get the new certificate.
    Applied,
    /// The files are unusable; the config in force stays.
    Rejected(TlsError),
}

impl Acceptor {
    /// Reads the listener's files.
    ///
    /// # Errors
    /// As [`check_listen`].
    pub fn new(files: &ListenFiles) -> Result<Arc<Acceptor>, TlsError> {
        let contents = ListenContents::read(files)?;
        let config = server_config_of(files, &contents)?;
        Ok(Arc::new(Acceptor {
            files: files.clone(),
            current: ArcSwap::from_pointee(config),
            seen: Mutex::new((contents, None)),
            applied: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
        }))
    }

    /// The config for a connection accepted now.
    pub(crate) fn current(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.current.load_full())
    }

    /// Reads the files again and swaps the config if they changed and are
    /// usable.
    pub fn reload(&self) -> Reloaded {
        let read = ListenContents::read(&self.files);
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let contents = match read {
            Ok(contents) => contents,
            Err(e) => {
                let rejected = Some(Rejected::Read(e.to_string()));
                if seen.1 == rejected {
                    return Reloaded::Unchanged;
                }
                seen.1 = rejected;
                return Reloaded::Rejected(e);
            }
        };
        if contents == seen.0 {
            seen.1 = None;
            return Reloaded::Unchanged;
        }
        match server_config_of(&self.files, &contents) {
            Ok(config) => {
                self.current.store(Arc::new(config));
                *seen = (contents, None);
                Reloaded::Applied
            }
            Err(e) => {
                let rejected = Some(Rejected::Contents(contents));
                if seen.1 == rejected {
                    return Reloaded::Unchanged;
                }
                seen.1 = rejected;
                Reloaded::Rejected(e)
            }
        }
    }

    /// Certificate reloads (applied, rejected) since start.
    pub fn reloads(&self) -> (u64, u64) {
        (
            self.applied.load(Ordering::Relaxed),
            self.rejected.load(Ordering::Relaxed),
        )
    }

    /// Reloads and logs the outcome once.
    pub fn reload_and_log(&self) {
        let outcome = self.reload();
        let counter = match outcome {
            Reloaded::Unchanged => None,
            Reloaded::Applied => Some(&self.applied),
            Reloaded::Rejected(_) => Some(&self.rejected),
        };
        match outcome {
            Reloaded::Unchanged => {}
            Reloaded::Applied => tracing::info!(
                cert = %self.files.cert_file.display(),
                "tls_listen: certificate reloaded; new connections get it"
            ),
            Reloaded::Rejected(e) => tracing::error!(
                "tls_listen: certificate reload rejected, keeping the one in force: {e}"
            ),
        }
        if let Some(counter) = counter {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The directories holding the listener's files.
    fn directories(&self) -> Vec<PathBuf> {
        let mut dirs: Vec<PathBuf> = Vec::new();
        let files = [
            Some(&self.files.cert_file),
            Some(&self.files.key_file),
            self.files.client_ca_file.as_ref(),
        ];
        for file in files.into_iter().flatten() {
            let dir = match file.parent() {
                Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
                _ => PathBuf::from("."),
            };
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
        dirs
    }
}

/// Watches the directories of the listener's files (a whole directory, so
/// that a Kubernetes secret's symlink swap is seen too) and reloads after
/// each burst of changes, until `shutdown`. If they cannot be watched, says
/// so once: the certificate then stays as it was read at start.
pub fn watch(acceptor: Arc<Acceptor>, shutdown: CancellationToken) {
    use notify::{EventKind, RecursiveMode, Watcher};
    let (events, mut receiver) = tokio::sync::mpsc::channel::<()>(16);
    let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let relevant = match event {
            Ok(event) => !matches!(event.kind, EventKind::Access(_)),
            Err(_) => true,
        };
        if relevant {
            // A full channel already holds a wake-up.
            let _ = events.try_send(());
        }
    });
    let mut watcher = match watcher {
        Ok(watcher) => watcher,
        Err(e) => {
            tracing::error!(
                "tls_listen: cannot watch the certificate files ({e}); they are not reloaded"
            );
            return;
        }
    };
    for dir in acceptor.directories() {
        if let Err(e) = watcher.watch(&dir, RecursiveMode::NonRecursive) {
            tracing::error!(
                "tls_listen: cannot watch {} ({e}); its files are not reloaded",
                dir.display()
            );
        }
    }
    tokio::spawn(async move {
        let _watcher = watcher;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                event = receiver.recv() => if event.is_none() { return },
            }
            // Until the writes stop.
            while let Ok(Some(())) = tokio::time::timeout(RELOAD_DEBOUNCE, receiver.recv()).await {}
            // Off the runtime that accepts every listener's clients: a file
            // that is slow to read (a network file system) must stall no
            // accept. One reload at a time; a FIFO or a device in a file's
            // place is refused without blocking (inputs/regular_file.rs).
            let reloading = acceptor.clone();
            let (done, reloaded) = tokio::sync::oneshot::channel();
            let started = std::thread::Builder::new()
                .name("memring-cert-reload".into())
                .spawn(move || {
                    reloading.reload_and_log();
                    let _ = done.send(());
                });
            if let Err(e) = started {
                tracing::error!(
                    "tls_listen: cannot start a thread to reload the certificate ({e}); the certificate in force stays"
                );
                continue;
            }
            let _ = reloaded.await;
        }
    });
}

/// A write half that may hold bytes back until flushed: a TLS stream keeps
/// what it could not send yet in its own buffer, which only a flush (or a
/// further write) pushes out. For a plain socket this is `false` and the
/// flush disappears at compile time.
pub(crate) trait Flush: tokio::io::AsyncWrite + Unpin {
    const BUFFERS: bool;
}

impl Flush for tokio::net::tcp::WriteHalf<'_> {
    const BUFFERS: bool = false;
}

impl Flush for tokio::net::unix::WriteHalf<'_> {
    const BUFFERS: bool = false;
}

impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite> Flush for tokio::io::WriteHalf<T> {
    const BUFFERS: bool = true;
}

/// A read half that can wait for input with no buffer to read into, so
/// that an idle session holds none. A TLS stream cannot: rustls reads and
/// decrypts into buffers of its own, so its session keeps its read buffer
/// (and rustls its own) while idle.
pub(crate) trait Readable: tokio::io::AsyncRead + Unpin {
    const WAITS_WITHOUT_BUFFER: bool;

    /// Ready once input (or end of stream, or an error) is there to read.
    fn readable(&self) -> impl std::future::Future<Output = io::Result<()>>;

    /// Whether the runtime has reported no input (nor end of stream) since
    /// this half's own reads last found the socket empty: one atomic load,
    /// no system call, and the readiness it reads is left as it is. `false`
    /// when it cannot tell (TLS): the caller then polls the read.
    fn read_readiness_clear(&self) -> bool {
        false
    }
}

impl Readable for tokio::net::tcp::ReadHalf<'_> {
    const WAITS_WITHOUT_BUFFER: bool = true;

    fn readable(&self) -> impl std::future::Future<Output = io::Result<()>> {
        tokio::net::tcp::ReadHalf::readable(self)
    }

    fn read_readiness_clear(&self) -> bool {
        // tokio calls the closure only while the read readiness is set; a
        // closure that does no I/O and succeeds leaves it set.
        self.as_ref()
            .try_io(tokio::io::Interest::READABLE, || Ok(()))
            .is_err()
    }
}

impl Readable for tokio::net::unix::ReadHalf<'_> {
    const WAITS_WITHOUT_BUFFER: bool = true;

    fn readable(&self) -> impl std::future::Future<Output = io::Result<()>> {
        tokio::net::unix::ReadHalf::readable(self)
    }

    fn read_readiness_clear(&self) -> bool {
        self.as_ref()
            .try_io(tokio::io::Interest::READABLE, || Ok(()))
            .is_err()
    }
}

impl<T: tokio::io::AsyncRead> Readable for tokio::io::ReadHalf<T> {
    const WAITS_WITHOUT_BUFFER: bool = false;

    fn readable(&self) -> impl std::future::Future<Output = io::Result<()>> {
        std::future::pending()
    }
}

/// Writes some of `buf`, or, with nothing left to write, flushes what a
/// buffering stream holds back. One future for both, as the I/O loops
/// select on one use of the write half at a time. `Some(bytes written)`, or
/// `None` for a flush.
///
/// # Errors
/// The stream's write error.
pub(crate) async fn write_or_flush<W: Flush, B: bytes::Buf>(
    writer: &mut W,
    buf: &mut B,
) -> io::Result<Option<usize>> {
    use tokio::io::AsyncWriteExt;
    if !buf.has_remaining() {
        return writer.flush().await.map(|()| None);
    }
    if !writer.is_write_vectored() {
        return writer.write_buf(buf).await.map(Some);
    }
    // What tokio's `write_buf` does for a vectored writer, without filling
    // its 64 slices on every call: a reply is a few pieces, so a few slices
    // are gathered first, and all of them only when those are full.
    std::future::poll_fn(|cx| {
        let mut few = [io::IoSlice::new(&[]); FEW_WRITE_SLICES];
        let gathered = buf.chunks_vectored(&mut few);
        let written = if gathered < FEW_WRITE_SLICES {
            std::task::ready!(
                std::pin::Pin::new(&mut *writer).poll_write_vectored(cx, &few[..gathered])
            )?
        } else {
            let mut all = [io::IoSlice::new(&[]); MAX_WRITE_SLICES];
            let gathered = buf.chunks_vectored(&mut all);
            std::task::ready!(
                std::pin::Pin::new(&mut *writer).poll_write_vectored(cx, &all[..gathered])
            )?
        };
        buf.advance(written);
        std::task::Poll::Ready(Ok(Some(written)))
    })
    .await
}

/// Slices gathered for a write first (see [`write_or_flush`]): more than
/// the pieces of a one-key reply.
const FEW_WRITE_SLICES: usize = 8;
/// The most slices one write takes, as tokio's `write_buf`.
const MAX_WRITE_SLICES: usize = 64;
