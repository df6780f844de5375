//! Error types that say which side failed: a backend (memcached failed or timed
//! out) or the configuration (file, place, problem). Client mistakes are
//! [`crate::protocol::ParseError`]s, which carry memcached's own reply.

use std::sync::Arc;

use crate::protocol::ReplyError;

/// What went wrong talking to one backend. Small and `Copy`: it is built on the
/// request path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BackendErrorKind {
    #[error("connect failed ({0})")]
    Connect(std::io::ErrorKind),
    #[error("connect timed out")]
    ConnectTimeout,
    #[error("request timed out")]
    Timeout,
    #[error("connection closed by server")]
    Closed,
    #[error("connection error ({0})")]
    Io(std::io::ErrorKind),
    #[error("bad reply ({0})")]
    Protocol(ReplyError),
    #[error("backend removed from the pool")]
    Gone,
    #[error("server is DEAD, failing fast while it is probed")]
    Dead,
    /// Its host name has no address (the words are logged once).
    #[error("cannot resolve its host name ({0})")]
    Resolve(crate::inputs::resolve::DnsFailure),
    #[error("TLS handshake failed ({0})")]
    Tls(TlsFailure),
    /// `max_server_inflight` requests are already in flight on this
    /// worker's connections to the server: refused at once, not queued.
    #[error("server busy")]
    Busy,
}

/// Why a TLS handshake with a server failed, in a word; the log line of the
/// failure has rustls's full words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TlsFailure {
    #[error("certificate not issued by a CA of backend_tls.ca_file")]
    UnknownIssuer,
    #[error("certificate not valid for the server's name")]
    WrongName,
    #[error("certificate expired or not yet valid")]
    Expired,
    #[error("certificate refused")]
    BadCertificate,
    #[error("the server refused the handshake")]
    Refused,
    #[error("connection closed during the handshake")]
    Closed,
    #[error("no handshake within connect_timeout_ms")]
    Timeout,
    #[error("the address has no name to verify; set backend_tls.server_name")]
    BadName,
    #[error("tls = true but memring started without [backend_tls]")]
    NotConfigured,
    #[error("protocol error")]
    Handshake,
}

impl BackendErrorKind {
    /// Metric labels of the kinds, in [`BackendErrorKind::index`] order.
    pub const LABELS: [&'static str; 10] = [
        "connect",
        "connect_timeout",
        "timeout",
        "closed",
        "io",
        "protocol",
        "gone",
        "dead",
        "resolve",
        "tls",
    ];

    /// A dense index for per-kind counters. [`BackendErrorKind::Busy`] is
    /// not a failure of the server but memring's refusal, counted as a
    /// rejection: its index is past [`BackendErrorKind::LABELS`].
    pub fn index(self) -> usize {
        match self {
            BackendErrorKind::Connect(_) => 0,
            BackendErrorKind::ConnectTimeout => 1,
            BackendErrorKind::Timeout => 2,
            BackendErrorKind::Closed => 3,
            BackendErrorKind::Io(_) => 4,
            BackendErrorKind::Protocol(_) => 5,
            BackendErrorKind::Gone => 6,
            BackendErrorKind::Dead => 7,
            BackendErrorKind::Resolve(_) => 8,
            BackendErrorKind::Tls(_) => 9,
            BackendErrorKind::Busy => Self::LABELS.len(),
        }
    }
}

/// A request failed on a named backend; the client sees `SERVER_ERROR <this>`:
/// `backend <name>: <kind>`, except a refusal for `max_server_inflight`,
/// which is `server busy` whichever server it is (the server is named in
/// `/metrics` and `stats`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendError {
    pub server: Arc<str>,
    pub kind: BackendErrorKind,
}

impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            BackendErrorKind::Busy => write!(f, "{}", self.kind),
            kind => write!(f, "backend {}: {kind}", self.server),
        }
    }
}

impl std::error::Error for BackendError {}

/// A configuration file that cannot be used, with the place of the problem.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: cannot read: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// `[discovery]` names records that list no server (for a new file).
    #[error("{path}: [discovery] {message}")]
    Discovery { path: String, message: String },
    /// A valid file that cannot be applied safely now; nothing changed.
    #[error("{path}: {message}")]
    Refused { path: String, message: String },
    #[error("{path}:{line}:{column}: {message}")]
    Invalid {
        path: String,
        line: usize,
        column: usize,
        message: String,
    },
}
