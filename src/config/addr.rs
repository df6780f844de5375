//! Addresses as the config writes them: whether a server address or a
//! name is acceptable, what an address reaches (to tell two spellings of one
//! memcached apart, as `getaddrinfo` would read them), and whether two
//! listeners would take the same port.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::ops::Range;

/// Letters, digits, `-`, `_` and dots between labels: the names memring asks
/// DNS about.
pub(super) fn is_dns_name(name: &str) -> bool {
    !name.is_empty()
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// Whether binding both addresses would fail with "address in use": the same
/// port (0 means any free port, so never) on the same address or where one
/// is a wildcard that covers the other (`0.0.0.0` every IPv4 address, `::`
/// every address, as memring's IPv6 sockets are dual-stack).
pub(super) fn binds_overlap(a: SocketAddr, b: SocketAddr) -> bool {
    let (a, b) = (canonical(a), canonical(b));
    let covers = |wide: SocketAddr, narrow: SocketAddr| {
        wide.ip().is_unspecified() && (wide.is_ipv6() || narrow.is_ipv4())
    };
    a.port() != 0 && a.port() == b.port() && (a.ip() == b.ip() || covers(a, b) || covers(b, a))
}

/// Looks up a host name and port, as connecting would.
pub(super) type Lookup<'a> = &'a dyn Fn(&str, u16) -> std::io::Result<Vec<SocketAddr>>;

/// What a server address reaches, to tell two spellings of one memcached
/// apart.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum Endpoint {
    /// An IP address and port; an IPv4-mapped IPv6 address as its IPv4
    /// address (a dual-stack socket reaches the same listener).
    Ip(SocketAddr),
    /// A host name, lowercase (DNS names are case-insensitive), and port.
    Name(String, u16),
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Ip(socket) => write!(f, "{socket}"),
            Endpoint::Name(host, port) => write!(f, "{host}:{port}"),
        }
    }
}

/// The endpoint of an address that [`check_server_addr`] accepted, without
/// looking anything up. The port is read as decimal (`011211` is 11211), as
/// the resolver reads it.
pub(super) fn endpoint_of(addr: &str) -> Option<Endpoint> {
    if let Ok(socket) = addr.parse::<SocketAddr>() {
        return Some(Endpoint::Ip(canonical(socket)));
    }
    let (host, port) = addr.rsplit_once(':')?;
    let port = port.parse::<u16>().ok()?;
    Some(match numeric_ipv4(host) {
        Some(ip) => Endpoint::Ip(SocketAddr::new(IpAddr::V4(ip), port)),
        None => Endpoint::Name(host.to_ascii_lowercase(), port),
    })
}

/// IPv4-mapped IPv6 (`::ffff:a.b.c.d`) as the IPv4 address it maps.
pub(super) fn canonical(socket: SocketAddr) -> SocketAddr {
    match socket.ip() {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), socket.port()),
            None => socket,
        },
        IpAddr::V4(_) => socket,
    }
}

/// The IPv4 address that glibc's `getaddrinfo` reads from a numeric host
/// before it would ask DNS (its `inet_aton`): one to four parts, each
/// decimal, octal (a leading `0`) or hex (`0x`), the last filling the bytes
/// left. So `127.0.0.01` and `127.1` are 127.0.0.1, and `0127.0.0.1` is
/// 87.0.0.1. A backend address Rust's parser refuses (it reads only dotted
/// decimal without leading zeros) is connected to through `getaddrinfo`, so
/// this is the address memring would reach.
pub(super) fn numeric_ipv4(host: &str) -> Option<Ipv4Addr> {
    let parts = host
        .split('.')
        .map(inet_part)
        .collect::<Option<Vec<u32>>>()?;
    let (last, leading) = parts.split_last()?;
    if leading.len() > 3 || leading.iter().any(|&part| part > 0xff) {
        return None;
    }
    let last_bits = 32 - 8 * leading.len() as u32;
    if last_bits < 32 && *last >> last_bits != 0 {
        return None;
    }
    let value = leading.iter().enumerate().fold(*last, |value, (i, part)| {
        value | part << (24 - 8 * i as u32)
    });
    Some(Ipv4Addr::from(value))
}

/// One part of an `inet_aton` address: `0x1f`, `017` or `15`.
pub(super) fn inet_part(part: &str) -> Option<u32> {
    let (digits, radix) = match part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
        Some(hex) => (hex, 16),
        None if part.len() > 1 && part.starts_with('0') => (&part[1..], 8),
        None => (part, 10),
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u32::from_str_radix(digits, radix).ok()
}

/// Pairs of servers (first, second, in config order) that reach a common
/// endpoint, each pair once, with the endpoint they share.
pub(super) fn aliases(reaches: &[(Range<usize>, Vec<Endpoint>)]) -> Vec<(usize, usize, Endpoint)> {
    let mut first_reacher: HashMap<&Endpoint, usize> = HashMap::new();
    let mut pairs: Vec<(usize, usize, Endpoint)> = Vec::new();
    for (index, (_, endpoints)) in reaches.iter().enumerate() {
        for endpoint in endpoints {
            match first_reacher.get(endpoint) {
                Some(&first) if first != index => {
                    if !pairs.iter().any(|&(a, b, _)| (a, b) == (first, index)) {
                        pairs.push((first, index, endpoint.clone()));
                    }
                }
                Some(_) => {}
                None => {
                    first_reacher.insert(endpoint, index);
                }
            }
        }
    }
    pairs
}

/// `host:port:weight` or `host:port:weight name`, twemproxy's way of writing
/// a server, as the memring lines that say the same.
pub(super) fn twemproxy_server(addr: &str) -> Option<String> {
    let (server, name) = match addr.split_once(char::is_whitespace) {
        Some((server, name)) => (server, Some(name.trim())),
        None => (addr, None),
    };
    let (host_port, weight) = server.rsplit_once(':')?;
    if weight.is_empty() || !weight.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    check_server_addr(host_port).ok()?;
    let mut lines = format!("addr = \"{host_port}\", weight = {weight}");
    match name {
        Some(name) if !name.is_empty() && !name.contains(char::is_whitespace) => {
            lines.push_str(&format!(", name = \"{name}\""));
        }
        Some(_) => return None,
        None => {}
    }
    Some(lines)
}

/// The first character that may not appear in a server's name or address,
/// described for a person. Names and addresses are printed in `stats`
/// replies, metric labels and log lines, where a quote, a backslash or a
/// control byte would break the line or its quoting.
pub(super) fn refused_char(text: &str) -> Option<String> {
    text.chars().find_map(|c| match c {
        '"' => Some("a double quote (\")".to_string()),
        '\\' => Some("a backslash (\\)".to_string()),
        '\0' => Some("a NUL byte (0x00)".to_string()),
        '\x7f' => Some("a DEL byte (0x7f)".to_string()),
        c if (c as u32) < 0x20 => Some(format!("a control byte (0x{:02x})", c as u32)),
        _ => None,
    })
}

/// `host:port` with a port from 1 to 65535 and a plausible host (an IP address,
/// `[v6]`, or a DNS name resolved at connect time).
pub(super) fn check_server_addr(addr: &str) -> Result<(), &'static str> {
    if let Ok(socket) = addr.parse::<SocketAddr>() {
        return if socket.port() == 0 {
            Err("port must be a number from 1 to 65535")
        } else {
            Ok(())
        };
    }
    let (host, port) = addr.rsplit_once(':').ok_or("expected host:port")?;
    match port.parse::<u16>() {
        Ok(p) if p > 0 => {}
        _ => return Err("port must be a number from 1 to 65535"),
    }
    let host_ok = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'_');
    if host_ok {
        Ok(())
    } else {
        Err("host must be an IP address or a DNS name")
    }
}

/// Where a client listener (`listen`, a pool's `listen`) takes clients: an
/// IP:port, or a Unix socket's path (`unix:PATH`) with the file mode
/// `listen_mode` gives it (`None`: what the umask leaves).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    Tcp(SocketAddr),
    Unix {
        path: std::path::PathBuf,
        mode: Option<u32>,
    },
}

impl Listen {
    /// The IP:port, for a TCP listener.
    pub fn tcp(&self) -> Option<SocketAddr> {
        match self {
            Listen::Tcp(addr) => Some(*addr),
            Listen::Unix { .. } => None,
        }
    }

    /// The socket's path, for a Unix-socket listener.
    pub fn unix_path(&self) -> Option<&std::path::Path> {
        match self {
            Listen::Tcp(_) => None,
            Listen::Unix { path, .. } => Some(path),
        }
    }

    /// `listen_mode` as the file writes it (`0660`), or `-` when unset.
    pub fn mode_text(&self) -> String {
        match self {
            Listen::Unix {
                mode: Some(mode), ..
            } => format!("{mode:04o}"),
            _ => "-".to_string(),
        }
    }

    /// Whether the two would take the same port or the same socket file.
    pub(super) fn overlaps(&self, other: &Listen) -> bool {
        match (self, other) {
            (Listen::Tcp(a), Listen::Tcp(b)) => binds_overlap(*a, *b),
            (Listen::Unix { path: a, .. }, Listen::Unix { path: b, .. }) => a == b,
            _ => false,
        }
    }
}

impl fmt::Display for Listen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Listen::Tcp(addr) => write!(f, "{addr}"),
            Listen::Unix { path, .. } => write!(f, "unix:{}", path.display()),
        }
    }
}

impl std::str::FromStr for Listen {
    type Err = String;

    /// `127.0.0.1:22122` or `unix:/run/memring/memring.sock` (no mode).
    fn from_str(text: &str) -> Result<Listen, String> {
        parse_listen("listen", text, None).map_err(|e| match e {
            ListenError::Addr(message) | ListenError::Mode(message) => message,
        })
    }
}

/// The longest Unix socket path the kernel takes (`sun_path` is 108 bytes,
/// with its terminating NUL).
const MAX_UNIX_PATH: usize = 107;

/// A client listener's address as the file writes it (`127.0.0.1:22122` or
/// `unix:/run/memring/memring.sock`) and its `listen_mode`; the error says
/// what is wrong, for the caller to place. `setting` names the address's
/// key in messages.
pub(super) fn parse_listen(
    setting: &str,
    text: &str,
    mode: Option<&str>,
) -> Result<Listen, ListenError> {
    let Some(path) = text.strip_prefix("unix:") else {
        if mode.is_some() {
            return Err(ListenError::Mode(format!(
                "listen_mode applies to a Unix socket only, and {setting} = \"{text}\" is an IP:port address"
            )));
        }
        return text.parse::<SocketAddr>().map(Listen::Tcp).map_err(|_| {
            ListenError::Addr(format!(
                "{setting}: `{text}` is not an IP:port address or unix:PATH"
            ))
        });
    };
    if !path.starts_with('/') {
        return Err(ListenError::Addr(format!(
            "{setting}: `{text}`: a Unix socket's path must be absolute (unix:/run/memring/memring.sock)"
        )));
    }
    if path.len() > MAX_UNIX_PATH || path.contains('\0') {
        return Err(ListenError::Addr(format!(
            "{setting}: `{text}`: a Unix socket's path has at most {MAX_UNIX_PATH} bytes and no NUL"
        )));
    }
    let mode = match mode {
        None => None,
        Some(mode) => Some(parse_mode(mode).ok_or_else(|| {
            ListenError::Mode(format!(
                "listen_mode = \"{mode}\" is not a file mode: octal digits from \"0000\" to \"0777\", e.g. \"0660\""
            ))
        })?),
    };
    Ok(Listen::Unix {
        path: std::path::PathBuf::from(path),
        mode,
    })
}

/// `0660` or `660` (octal) up to `0777`.
fn parse_mode(text: &str) -> Option<u32> {
    if text.is_empty() || text.len() > 4 || !text.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
        return None;
    }
    u32::from_str_radix(text, 8).ok().filter(|&m| m <= 0o777)
}

/// What is wrong with a listener's address or its mode: each is placed at
/// the line of its own key.
#[derive(Debug)]
pub(super) enum ListenError {
    Addr(String),
    Mode(String),
}
