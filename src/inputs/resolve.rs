//! Host names to addresses, and SRV records, through hickory-resolver: the
//! system's resolver (`/etc/resolv.conf`, `/etc/hosts`) or the one DNS server
//! named by `[discovery] resolver`. Every lookup asks afresh (a resolver is
//! made per lookup and nothing is cached here), so an address that changed
//! is seen by the next connect or the next round of `control/discovery.rs`.
//!
//! Also [`Target`]: what one backend knows about its address between
//! lookups. No policy here: what a failure means for a server is decided by
//! `backend/conn.rs` (connects) and `control/discovery.rs` (the periodic rounds).

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use hickory_resolver::config::{
    LookupIpStrategy, NameServerConfigGroup, ResolveHosts, ResolverConfig,
};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::proto::op::ResponseCode;
use hickory_resolver::proto::ProtoErrorKind;
use hickory_resolver::{ResolveError, TokioResolver};

/// How long one DNS question may take, per try: a DNS server on the same
/// network answers in milliseconds, and one that does not answer makes a
/// connect or a discovery round wait this long (twice, with the retry).
pub const DNS_TIMEOUT: Duration = Duration::from_millis(500);
/// Retries after a question timed out: one covers a lost UDP datagram.
const DNS_ATTEMPTS: usize = 1;

/// Why a lookup found no address, in a form small enough to travel in a
/// `BackendErrorKind` (the words are in [`DnsError::detail`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DnsFailure {
    /// NXDOMAIN: DNS says the name does not exist.
    #[error("no such name")]
    NoSuchName,
    /// The name exists but has no record of the type asked for.
    #[error("no address records")]
    NoRecords,
    /// No DNS server answered, or one answered with an error (SERVFAIL,
    /// REFUSED): nothing is known about the name.
    #[error("DNS did not answer")]
    Unanswered,
}

impl DnsFailure {
    /// DNS answered that the name has no records: the server it names is
    /// gone, unlike a DNS outage, which says nothing about the server.
    pub fn is_authoritative(self) -> bool {
        matches!(self, DnsFailure::NoSuchName | DnsFailure::NoRecords)
    }
}

/// A failed lookup: its kind and what the resolver said, in words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{detail}")]
pub struct DnsError {
    pub failure: DnsFailure,
    pub detail: String,
}

impl DnsError {
    fn of(name: &str, what: &str, error: &ResolveError) -> DnsError {
        let failure = classify(error);
        let detail = match failure {
            DnsFailure::NoSuchName => format!("`{name}` does not exist (NXDOMAIN)"),
            DnsFailure::NoRecords => format!("`{name}` has no {what} records"),
            DnsFailure::Unanswered => format!("cannot ask DNS about `{name}`: {error}"),
        };
        DnsError { failure, detail }
    }
}

fn classify(error: &ResolveError) -> DnsFailure {
    match error.proto().map(|p| p.kind()) {
        Some(ProtoErrorKind::NoRecordsFound { response_code, .. }) => match *response_code {
            ResponseCode::NXDomain => DnsFailure::NoSuchName,
            ResponseCode::NoError => DnsFailure::NoRecords,
            _ => DnsFailure::Unanswered,
        },
        _ => DnsFailure::Unanswered,
    }
}

/// One SRV record: a server `host:port` and its weight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SrvTarget {
    /// The target name, without the root's trailing dot.
    pub host: String,
    pub port: u16,
    pub weight: u16,
}

/// Where questions go: the system's resolver, or one DNS server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Dns {
    /// `[discovery] resolver`; `None` is the system's configuration.
    pub server: Option<SocketAddr>,
}

impl Dns {
    fn resolver(&self) -> Result<TokioResolver, DnsError> {
        let mut builder = match self.server {
            Some(server) => {
                let group =
                    NameServerConfigGroup::from_ips_clear(&[server.ip()], server.port(), true);
                TokioResolver::builder_with_config(
                    ResolverConfig::from_parts(None, Vec::new(), group),
                    TokioConnectionProvider::default(),
                )
            }
            None => TokioResolver::builder_tokio().map_err(|e| DnsError {
                failure: DnsFailure::Unanswered,
                detail: format!("cannot read the system's resolver configuration: {e}"),
            })?,
        };
        let options = builder.options_mut();
        options.timeout = DNS_TIMEOUT;
        options.attempts = DNS_ATTEMPTS;
        options.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
        // A named DNS server is the only source: /etc/hosts would answer
        // for it otherwise. The system's way includes /etc/hosts.
        options.use_hosts_file = if self.server.is_some() {
            ResolveHosts::Never
        } else {
            ResolveHosts::Always
        };
        options.cache_size = 0;
        Ok(builder.build())
    }

    /// A name as asked: fully qualified for a named DNS server (no search
    /// list applies), as written for the system's resolver, whose search
    /// domains complete short names (`cache-0.cache` in Kubernetes).
    fn query(&self, host: &str) -> String {
        if self.server.is_some() && !host.ends_with('.') {
            format!("{host}.")
        } else {
            host.to_string()
        }
    }

    /// The addresses of `host` (A and AAAA), with `port`, IPv4 first, each
    /// once. An IP address is its own answer.
    ///
    /// # Errors
    /// DNS has no address for the name, or did not answer.
    pub async fn addresses(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, DnsError> {
        if let Ok(ip) = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
        {
            return Ok(vec![SocketAddr::new(ip, port)]);
        }
        let resolver = self.resolver()?;
        let found = resolver
            .lookup_ip(self.query(host))
            .await
            .map_err(|e| DnsError::of(host, "A or AAAA", &e))?;
        let mut addresses: Vec<SocketAddr> = Vec::new();
        for ip in found.iter() {
            let address = SocketAddr::new(ip, port);
            if !addresses.contains(&address) {
                addresses.push(address);
            }
        }
        addresses.sort_by_key(|a| a.is_ipv6());
        if addresses.is_empty() {
            return Err(DnsError {
                failure: DnsFailure::NoRecords,
                detail: format!("`{host}` has no A or AAAA records"),
            });
        }
        Ok(addresses)
    }

    /// The SRV records of `name` with the lowest priority value (the others
    /// are backups by RFC 2782, and a cache pool has no use for backups),
    /// sorted by target.
    ///
    /// # Errors
    /// DNS has no SRV record for the name, or did not answer.
    pub async fn srv(&self, name: &str) -> Result<Vec<SrvTarget>, DnsError> {
        let resolver = self.resolver()?;
        let found = resolver
            .srv_lookup(self.query(name))
            .await
            .map_err(|e| DnsError::of(name, "SRV", &e))?;
        let lowest = found.iter().map(|r| r.priority()).min();
        let mut targets: Vec<SrvTarget> = found
            .iter()
            .filter(|r| Some(r.priority()) == lowest)
            .map(|r| SrvTarget {
                host: r.target().to_utf8().trim_end_matches('.').to_string(),
                port: r.port(),
                weight: r.weight(),
            })
            .collect();
        targets.sort_by(|a, b| (&a.host, a.port).cmp(&(&b.host, b.port)));
        targets.dedup_by(|a, b| a.host == b.host && a.port == b.port);
        Ok(targets)
    }
}

/// A TCP connection to `addr` (`host:port`) with its host name looked up
/// through `dns`, each address tried in turn: for memring's own short-lived
/// connections (flushes, sweeps), which must ask the DNS server the
/// backends' connections ask.
///
/// # Errors
/// The name has no address, or no address accepts the connection.
pub async fn connect(dns: Dns, addr: &str) -> std::io::Result<tokio::net::TcpStream> {
    let Some((host, port)) = host_name(addr) else {
        return tokio::net::TcpStream::connect(addr).await;
    };
    let addresses = dns
        .addresses(host, port)
        .await
        .map_err(|e| std::io::Error::other(e.detail))?;
    let mut failure = std::io::Error::from(std::io::ErrorKind::AddrNotAvailable);
    for address in addresses {
        match tokio::net::TcpStream::connect(address).await {
            Ok(stream) => return Ok(stream),
            Err(e) => failure = e,
        }
    }
    Err(failure)
}

/// Runs `make()`'s future to completion on a runtime of its own, on a thread
/// of its own, so that blocking code (config checks, the CLI, a reload on
/// the runtime's thread) can ask DNS.
pub fn block_on<T, F, Fut>(make: F) -> T
where
    F: FnOnce() -> Fut + Send,
    Fut: std::future::Future<Output = T>,
    T: Send,
{
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map(|runtime| runtime.block_on(make()))
            })
            .join()
            .expect("a lookup does not panic")
            .expect("a current-thread runtime starts")
    })
}

/// `host` and port of a `host:port` whose host is a name, not an IP address
/// (`None` for an IP address or anything that is not `host:port`).
pub fn host_name(addr: &str) -> Option<(&str, u16)> {
    if addr.parse::<SocketAddr>().is_ok() {
        return None;
    }
    let (host, port) = addr.rsplit_once(':')?;
    let port = port.parse::<u16>().ok()?;
    if host.parse::<IpAddr>().is_ok() || host.starts_with('[') {
        return None;
    }
    Some((host, port))
}

/// What one backend knows about its address: the host name to look up
/// (none for an IP address), the last good answer, and the addresses its
/// connections use, which the periodic rounds compare with DNS.
#[derive(Debug)]
pub struct Target {
    addr: String,
    dns: Dns,
    /// The latest answer with at least one address.
    last: Mutex<Vec<SocketAddr>>,
    /// Addresses connected to since this backend was made.
    in_use: Mutex<Vec<SocketAddr>>,
    /// The last lookup at connect failed (its words were logged).
    failing: AtomicBool,
    /// DNS now gives other addresses, or none: this backend's connections
    /// are to be replaced by a new backend's.
    readdressed: AtomicBool,
}

impl Target {
    pub fn new(addr: &str, dns: Dns) -> Target {
        Target {
            addr: addr.to_string(),
            dns,
            last: Mutex::new(Vec::new()),
            in_use: Mutex::new(Vec::new()),
            failing: AtomicBool::new(false),
            readdressed: AtomicBool::new(false),
        }
    }

    /// The host name of the address, if it has one.
    pub fn host_name(&self) -> Option<(&str, u16)> {
        host_name(&self.addr)
    }

    /// Where to connect now: for a host name, a fresh lookup; when it fails,
    /// the last good answer (a DNS outage, or a bad zone that drops every
    /// name, is no reason to stop reaching a server; a name that is really
    /// gone is found by the discovery round, which replaces this backend by
    /// one with no last answer). The words of a failure are logged once
    /// until a lookup succeeds again.
    ///
    /// # Errors
    /// The lookup failed and no lookup of this backend ever succeeded.
    pub async fn addresses(&self, server: &str) -> Result<Vec<SocketAddr>, DnsFailure> {
        let Some((host, port)) = self.host_name() else {
            // Not a name: what the socket layer makes of it (IP addresses,
            // and the numeric forms getaddrinfo reads).
            return tokio::net::lookup_host(self.addr.as_str())
                .await
                .map(Iterator::collect)
                .map_err(|_| DnsFailure::NoSuchName);
        };
        match self.dns.addresses(host, port).await {
            Ok(found) => {
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!(server, addr = %self.addr, "`{host}` resolves again: {}", list(&found));
                }
                *self.last.lock().unwrap_or_else(|e| e.into_inner()) = found.clone();
                Ok(found)
            }
            Err(error) => {
                let last = self.last.lock().unwrap_or_else(|e| e.into_inner()).clone();
                let fallback = !last.is_empty();
                if !self.failing.swap(true, Ordering::Relaxed) {
                    if fallback {
                        tracing::warn!(server, addr = %self.addr, "{error}; connecting to its last known addresses {}", list(&last));
                    } else {
                        tracing::warn!(server, addr = %self.addr, "cannot connect: {error}");
                    }
                }
                if fallback {
                    Ok(last)
                } else {
                    Err(error.failure)
                }
            }
        }
    }

    /// A connection to `address` was made.
    pub fn connected(&self, address: SocketAddr) {
        let mut in_use = self.in_use.lock().unwrap_or_else(|e| e.into_inner());
        if !in_use.contains(&address) {
            in_use.push(address);
        }
    }

    /// Compares a fresh answer with the addresses in use: true (and from
    /// then on) when a connection is to an address DNS no longer gives, or
    /// DNS says the name has none at all.
    pub fn compare(&self, answer: &Result<Vec<SocketAddr>, DnsError>) -> bool {
        let gone = match answer {
            Ok(found) => {
                *self.last.lock().unwrap_or_else(|e| e.into_inner()) = found.clone();
                self.in_use
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .iter()
                    .any(|a| !found.contains(a))
            }
            Err(error) => {
                error.failure.is_authoritative()
                    && !self
                        .in_use
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .is_empty()
            }
        };
        if gone {
            self.readdressed.store(true, Ordering::Relaxed);
        }
        gone || self.is_readdressed()
    }

    /// Whether this backend's connections are to be replaced.
    pub fn is_readdressed(&self) -> bool {
        self.readdressed.load(Ordering::Relaxed)
    }

    /// The addresses connections use now.
    pub fn in_use(&self) -> Vec<SocketAddr> {
        self.in_use
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Where questions about this address go.
    pub fn dns(&self) -> Dns {
        self.dns
    }
}

/// `127.0.0.2:11211, [::1]:11211`
pub fn list(addresses: &[SocketAddr]) -> String {
    addresses
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_host_names_are_looked_up() {
        assert_eq!(
            host_name("cache-0.cache:11211"),
            Some(("cache-0.cache", 11211))
        );
        assert_eq!(host_name("127.0.0.1:11211"), None);
        assert_eq!(host_name("[::1]:11211"), None);
        assert_eq!(host_name("cache"), None);
    }

    #[test]
    fn an_ip_address_is_its_own_answer_without_asking_dns() {
        // A DNS server on a port nobody listens on would fail the lookup.
        let dns = Dns {
            server: Some("127.0.0.1:9".parse().unwrap()),
        };
        let found = block_on(|| async { dns.addresses("127.0.0.7", 11211).await });
        assert_eq!(found, Ok(vec!["127.0.0.7:11211".parse().unwrap()]));
    }

    #[test]
    fn a_dns_server_that_does_not_answer_is_unanswered_not_a_missing_name() {
        // Nothing listens on the discard port of loopback: refused or
        // timed out, either way DNS did not answer.
        let dns = Dns {
            server: Some("127.0.0.1:9".parse().unwrap()),
        };
        let error =
            block_on(|| async { dns.addresses("cache.test.local", 11211).await }).unwrap_err();
        assert_eq!(error.failure, DnsFailure::Unanswered, "{error}");
        assert!(!error.failure.is_authoritative());
        assert!(error.detail.contains("cache.test.local"), "{error}");
    }

    #[test]
    fn a_connection_to_an_address_dns_no_longer_gives_is_readdressed() {
        let target = Target::new("cache.test.local:11211", Dns::default());
        let a: SocketAddr = "127.0.0.2:11211".parse().unwrap();
        let b: SocketAddr = "127.0.0.3:11211".parse().unwrap();
        assert!(!target.compare(&Ok(vec![a])), "nothing in use yet");
        target.connected(a);
        assert!(!target.compare(&Ok(vec![a, b])), "a still given");
        let outage = Err(DnsError {
            failure: DnsFailure::Unanswered,
            detail: "x".into(),
        });
        assert!(!target.compare(&outage), "an outage is no news");
        assert!(target.compare(&Ok(vec![b])));
        assert!(target.is_readdressed());
    }

    #[test]
    fn a_name_that_dns_says_is_gone_readdresses_a_connected_backend() {
        let target = Target::new("cache.test.local:11211", Dns::default());
        target.connected("127.0.0.2:11211".parse().unwrap());
        let gone = Err(DnsError {
            failure: DnsFailure::NoSuchName,
            detail: "x".into(),
        });
        assert!(target.compare(&gone));
    }
}
