//! `memring import twemproxy nutcracker.yml [POOL]`: translate twemproxy
//! pools into an equivalent memring config with `ring = "twemproxy"`, so the
//! switch keeps every key where it is: one pool (named, or the only one) as
//! a one-pool config, or every pool of the file as one config with a
//! `[[pools]]` entry for each pool after the first, so that one memring
//! replaces one nutcracker process. Pure text in, text out; `cli/import.rs` reads the
//! file and prints.
//!
//! nutcracker.yml uses a small part of YAML (a map of pools, each a map of
//! scalars plus a `servers:` list), so this reads that part line by line
//! rather than pulling in a YAML library; anything else is reported, not
//! guessed at.

use std::fmt::Write as _;

use memring::config::{
    DEFAULT_CONNECTIONS_PER_SERVER, DEFAULT_CONNECT_TIMEOUT_MS, DEFAULT_MAX_CLIENT_CONNECTIONS,
    DEFAULT_POOL, DEFAULT_REQUEST_TIMEOUT_MS, DEFAULT_RETRY_TIMEOUT_MS, TWEMPROXY_FAILURE_LIMIT,
};

/// memring's listen backlog (`server.rs`), for the `backlog:` note.
const LISTEN_BACKLOG: u32 = 4096;
/// The largest `connect_timeout_ms` memring accepts.
const MAX_CONNECT_TIMEOUT_MS: u64 = 60_000;
/// The largest `request_timeout_ms` memring accepts.
const MAX_REQUEST_TIMEOUT_MS: u64 = 600_000;
/// The largest `connections_per_server` memring accepts.
const MAX_CONNECTIONS_PER_SERVER: u64 = 64;
/// The largest `max_client_connections` memring accepts.
const MAX_CLIENT_CONNECTIONS: u64 = 1_000_000;

/// One pool of a nutcracker.yml, in file order.
#[derive(Debug, Default, PartialEq, Eq)]
struct Pool {
    name: String,
    /// `key: value` settings in file order, values unquoted.
    settings: Vec<(String, String)>,
    /// The `servers:` entries, unquoted.
    servers: Vec<String>,
}

/// Where a pool's settings are written in the config being made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// The only pool imported: a one-pool config.
    Alone,
    /// The top level of a config of every pool.
    Top,
    /// A `[[pools]]` entry, which takes from the top level every pool
    /// setting it does not write: so it writes them all.
    Entry,
}

/// One pool, translated: its listen address, its settings' lines (comments
/// saying how each maps, then the settings) and servers.
struct Translated {
    name: String,
    listen: String,
    /// A Unix socket's permissions (`listen: /path 0666`), as `0666`.
    listen_mode: Option<String>,
    lines: Vec<String>,
    servers: Vec<Server>,
    unmapped: Vec<String>,
    /// `client_connections`; 0 (nutcracker's default) is no limit.
    client_connections: u64,
}

/// The memring config for `pool` (or the only pool) of a nutcracker.yml, or
/// with no pool named and several in the file, for all of them; and the
/// settings that have no memring equivalent, one line each.
///
/// # Errors
/// The file is not the YAML twemproxy reads, the pool is missing, or a pool
/// imported uses something memring cannot reproduce (redis, servers on unix
/// sockets, a distribution other than ketama).
pub(crate) fn twemproxy(text: &str, pool: Option<&str>) -> Result<(String, Vec<String>), String> {
    let pools = parse_pools(text)?;
    let pool = match pool {
        Some(wanted) => pools.iter().find(|p| p.name == wanted).ok_or_else(|| {
            let names: Vec<&str> = pools.iter().map(|p| p.name.as_str()).collect();
            format!("no pool `{wanted}` (pools: {})", names.join(", "))
        })?,
        None if pools.len() == 1 => &pools[0],
        None => return every_pool(&pools),
    };
    let pool = translate(pool, Place::Alone)?;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Imported from twemproxy pool `{}` by memring import.",
        pool.name
    );
    let _ = writeln!(
        out,
        "# ring = \"twemproxy\" places every key on the server twemproxy chose."
    );
    write_pool(&mut out, &pool, "servers");
    Ok((out, pool.unmapped))
}

/// The lines for one pool, written for `place`.
fn translate(pool: &Pool, place: Place) -> Result<Translated, String> {
    let eject = match pool.setting("auto_eject_hosts") {
        Some(value) => boolean("auto_eject_hosts", value)?,
        None => false,
    };
    let mut lines = Lines::default();
    for (key, value) in &pool.settings {
        lines.setting(key, value, eject, place)?;
    }
    lines.unset(pool, place == Place::Entry);
    lines.ejection(pool, eject)?;
    lines.shared_with();
    let listen = lines.listen.ok_or("the pool has no listen:")?;
    if pool.servers.is_empty() {
        return Err("the pool has no servers:".to_string());
    }
    let servers = pool
        .servers
        .iter()
        .map(|entry| server_entry(entry))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Translated {
        name: pool.name.clone(),
        listen,
        listen_mode: lines.listen_mode,
        lines: lines.lines,
        servers,
        unmapped: lines.unmapped,
        client_connections: lines.client_connections,
    })
}

impl Pool {
    /// The value of the setting `name`, if the pool sets it.
    fn setting(&self, name: &str) -> Option<&str> {
        self.settings
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    /// `key`'s number as the pool sets it, or nutcracker's `default`: the
    /// value, and where it came from (for the comment).
    fn number_or_default(&self, key: &str, default: u64) -> Result<(u64, String), String> {
        Ok(match self.setting(key) {
            Some(value) => (number(key, value)?, key.to_string()),
            None => (default, format!("nutcracker's default {key}")),
        })
    }
}

/// A setting's value as a number, or what is wrong with it.
fn number(key: &str, value: &str) -> Result<u64, String> {
    value
        .parse::<u64>()
        .map_err(|_| format!("{key}: `{value}` is not a number"))
}

/// A setting's value as `true` or `false`, or what is wrong with it.
fn boolean(key: &str, value: &str) -> Result<bool, String> {
    match value {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(format!("{key}: `{value}` is not true or false")),
    }
}

/// One pool's translation as it is made: each setting's lines (comments
/// saying how it maps, then the settings), what has no equivalent, and the
/// settings written elsewhere.
#[derive(Default)]
struct Lines {
    lines: Vec<String>,
    unmapped: Vec<String>,
    listen: Option<String>,
    listen_mode: Option<String>,
    client_connections: u64,
}

impl Lines {
    /// One `key: value` of the pool, in file order.
    fn setting(&mut self, key: &str, value: &str, eject: bool, place: Place) -> Result<(), String> {
        match key {
            "listen" => self.listen = Some(self.listen_addr(value)?),
            "hash" | "hash_tag" | "distribution" => self.placement(key, value)?,
            "timeout" => self.timeout(number(key, value)?),
            "server_connections" => self.server_connections(number(key, value)?),
            "auto_eject_hosts" | "server_failure_limit" | "server_retry_timeout" => {
                self.ejection_setting(key, value, eject)?
            }
            "client_connections" => self.client_connections(number(key, value)?, value, place),
            _ => self.without_equivalent(key, value)?,
        }
        Ok(())
    }

    /// `listen`: TCP `host:port` (twemproxy's `host:port:permissions` loses
    /// its permissions), or a Unix socket's `/path [permissions]` as
    /// `unix:/path` and `listen_mode`.
    fn listen_addr(&mut self, value: &str) -> Result<String, String> {
        if value.starts_with('/') {
            let (path, mode) = match value.rsplit_once(' ') {
                Some((path, mode)) => (path.trim_end(), Some(mode)),
                None => (value, None),
            };
            if let Some(mode) = mode {
                // nutcracker reads it as octal, at most 0777.
                let bits = u32::from_str_radix(mode, 8)
                    .ok()
                    .filter(|&bits| bits <= 0o777)
                    .ok_or_else(|| {
                        format!("listen: `{value}`: `{mode}` is not a file permission (octal, at most 0777)")
                    })?;
                self.listen_mode = Some(format!("{bits:04o}"));
            }
            return Ok(format!("unix:{path}"));
        }
        // twemproxy allows `host:port:permissions`; only host:port maps.
        let parts: Vec<&str> = value.rsplitn(3, ':').collect();
        Ok(match parts.as_slice() {
            [port, host] => format!("{host}:{port}"),
            [_mode, port, host] if value.matches(':').count() == 2 => {
                self.unmapped
                    .push(format!("listen permissions in `{value}`"));
                format!("{host}:{port}")
            }
            _ => value.to_string(),
        })
    }

    /// `hash`, `hash_tag` and `distribution`: where keys go.
    fn placement(&mut self, key: &str, value: &str) -> Result<(), String> {
        let lines = &mut self.lines;
        match key {
            "hash" => {
                lines.push(format!("# hash: {value} -> hash, the same function"));
                lines.push(format!("hash = \"{value}\""));
            }
            "hash_tag" => {
                lines.push(format!(
                    "# hash_tag: \"{}\" -> hash_tag: keys are placed by the part between the two, as in twemproxy",
                    escape(value)
                ));
                lines.push(format!("hash_tag = \"{}\"", escape(value)));
            }
            _ if value == "ketama" => lines.push(
                "# distribution: ketama -> ring = \"twemproxy\" (its ketama, point for point)"
                    .into(),
            ),
            _ => {
                return Err(format!(
                    "distribution: {value} cannot be reproduced; memring reproduces ketama only"
                ))
            }
        }
        Ok(())
    }

    /// `timeout`: both memring's request and connect timeouts.
    fn timeout(&mut self, ms: u64) {
        let request = ms.clamp(1, MAX_REQUEST_TIMEOUT_MS);
        let connect = ms.clamp(1, MAX_CONNECT_TIMEOUT_MS);
        let limited = |kept: u64, max: u64| {
            if kept == ms {
                String::new()
            } else {
                format!(" (at most {max} ms in memring)")
            }
        };
        self.lines.push(format!(
            "# timeout: {ms} -> request_timeout_ms{} (how long a server may make no progress on what it owes),",
            limited(request, MAX_REQUEST_TIMEOUT_MS)
        ));
        self.lines.push(format!(
            "# and connect_timeout_ms{}: twemproxy's timeout also covers the connect a request waits for",
            limited(connect, MAX_CONNECT_TIMEOUT_MS)
        ));
        self.lines.push(format!("request_timeout_ms = {request}"));
        self.lines.push(format!("connect_timeout_ms = {connect}"));
    }

    /// `server_connections`: `connections_per_server`, which is per worker.
    fn server_connections(&mut self, n: u64) {
        let kept = n.clamp(1, MAX_CONNECTIONS_PER_SERVER);
        self.lines.push(format!(
            "# server_connections: {n} -> connections_per_server, which is per worker: with the default"
        ));
        self.lines.push(format!(
            "# workers = 1, {kept} connection(s) to each server as in nutcracker; with workers = W, W x {kept}{}",
            if kept == n {
                String::new()
            } else {
                format!(" (memring allows at most {MAX_CONNECTIONS_PER_SERVER})")
            }
        ));
        self.lines.push(format!("connections_per_server = {kept}"));
    }

    /// `auto_eject_hosts`, and `server_failure_limit` and
    /// `server_retry_timeout` where they mean nothing (with ejection on,
    /// [`Lines::ejection`] writes them).
    fn ejection_setting(&mut self, key: &str, value: &str, eject: bool) -> Result<(), String> {
        match key {
            "auto_eject_hosts" => {
                self.lines.push(format!(
                    "# auto_eject_hosts: {value} -> auto_eject{}",
                    if eject {
                        ": a failing server's keys go to the next server clockwise"
                    } else {
                        ": a failing server's keys are not moved"
                    }
                ));
                self.lines.push(format!("auto_eject = {eject}"));
            }
            _ if eject => {
                number(key, value)?;
            }
            "server_failure_limit" => {
                number(key, value)?;
                self.lines.push(format!(
                    "# server_failure_limit: {value} is not carried: without auto_eject_hosts twemproxy ignores it, and so"
                ));
                self.lines.push(
                    "# does ejection = \"twemproxy\" with auto_eject = false: no server is ever DEAD, each request tries it"
                        .into(),
                );
            }
            _ => {
                number(key, value)?;
                self.lines.push(format!(
                    "# server_retry_timeout: {value} is not carried: it matters only with auto_eject_hosts: true"
                ));
            }
        }
        Ok(())
    }

    /// `client_connections`: `max_client_connections` for a pool alone; a
    /// comment in a config of several pools (the limit is per process).
    fn client_connections(&mut self, n: u64, value: &str, place: Place) {
        if place != Place::Alone {
            self.client_connections = n;
            self.lines.push(format!(
                "# client_connections: {value}{}: memring limits clients for the whole process only (max_client_connections at the top)",
                if n == 0 { " (no limit)" } else { "" }
            ));
            return;
        }
        match n {
            0 => self.lines.push(format!(
                "# client_connections: 0 (no limit) -> memring's default max_client_connections = {}",
                memring::config::DEFAULT_MAX_CLIENT_CONNECTIONS
            )),
            n => {
                self.lines
                    .push(format!("# client_connections: {n} -> max_client_connections"));
                self.lines.push(format!("max_client_connections = {n}"));
            }
        }
    }

    /// `redis`, `backlog`, `preconnect` and settings memring does not know:
    /// a comment, and a note for what has no equivalent.
    fn without_equivalent(&mut self, key: &str, value: &str) -> Result<(), String> {
        match key {
            "redis" if boolean(key, value)? => {
                return Err("redis: true; memring proxies memcached only".to_string())
            }
            "redis" => self
                .lines
                .push("# redis: false -> memcached is all memring speaks".into()),
            "backlog" => {
                number(key, value)?;
                self.not_carried(
                    format!("# backlog: {value} has no setting: memring listens with a backlog of {LISTEN_BACKLOG} (the kernel caps it at net.core.somaxconn)"),
                    format!("backlog: {value} (memring listens with a {LISTEN_BACKLOG} backlog)"),
                );
            }
            "preconnect" => {
                boolean(key, value)?;
                self.not_carried(
                    format!("# preconnect: {value} has no setting: memring always connects to every server at start and after each change"),
                    format!("preconnect: {value} (memring connects to every server at start)"),
                );
            }
            _ => self.not_carried(
                format!("# {key}: {value} has no memring equivalent"),
                format!("{key}: {value}"),
            ),
        }
        Ok(())
    }

    /// A setting with no equivalent: `comment` in the config, and `note` in
    /// the list of what the import did not carry.
    fn not_carried(&mut self, comment: String, note: String) {
        self.lines.push(comment);
        self.unmapped.push(note);
    }

    /// What twemproxy's defaults mean in memring, for settings the pool
    /// does not set. A `[[pools]]` entry (`entry`) writes out what it
    /// leaves at the default, since it would take the top level's value
    /// otherwise.
    fn unset(&mut self, pool: &Pool, entry: bool) {
        let lines = &mut self.lines;
        if pool.setting("auto_eject_hosts").is_none() {
            lines.push(
                "# auto_eject_hosts: not set, false in twemproxy as auto_eject in memring: a failing server's keys are not moved"
                    .to_string(),
            );
            if entry {
                lines.push("auto_eject = false".into());
            }
        }
        if pool.setting("timeout").is_none() {
            lines.push(
                "# timeout: not set, so nutcracker waits for a server as long as it takes; memring cannot: it uses its".to_string());
            lines.push(format!(
                "# defaults request_timeout_ms = {DEFAULT_REQUEST_TIMEOUT_MS} and connect_timeout_ms = {DEFAULT_CONNECT_TIMEOUT_MS}"
            ));
            if entry {
                lines.push(format!("request_timeout_ms = {DEFAULT_REQUEST_TIMEOUT_MS}"));
                lines.push(format!("connect_timeout_ms = {DEFAULT_CONNECT_TIMEOUT_MS}"));
            }
        }
        if entry && pool.setting("server_connections").is_none() {
            lines.push(format!(
                "# server_connections: not set, 1 in twemproxy -> connections_per_server = {DEFAULT_CONNECTIONS_PER_SERVER} (per worker)"
            ));
            lines.push(format!(
                "connections_per_server = {DEFAULT_CONNECTIONS_PER_SERVER}"
            ));
        }
    }

    /// `ejection = "twemproxy"`, and with `auto_eject_hosts` its failure
    /// limit and retry timeout, from the pool or nutcracker's defaults.
    fn ejection(&mut self, pool: &Pool, eject: bool) -> Result<(), String> {
        let lines = &mut self.lines;
        // Ejection follows nutcracker's clock, so that both proxies eject and
        // return a server at the same moment while they run side by side.
        lines.push(
            "# ejection = \"twemproxy\": a server is ejected and tried again on nutcracker's clock, and not flushed when it comes back".into(),
        );
        lines.push("ejection = \"twemproxy\"".into());
        if !eject {
            return Ok(());
        }
        let (limit, limit_from) =
            pool.number_or_default("server_failure_limit", TWEMPROXY_FAILURE_LIMIT)?;
        let (retry, retry_from) =
            pool.number_or_default("server_retry_timeout", DEFAULT_RETRY_TIMEOUT_MS)?;
        if !(1..=1000).contains(&limit) {
            return Err(format!(
                "server_failure_limit: {limit}; memring counts 1 to 1000 failures"
            ));
        }
        if retry > 86_400_000 {
            return Err(format!(
                "server_retry_timeout: {retry}; memring waits at most 86400000 ms (a day)"
            ));
        }
        lines.push(format!(
            "# {limit_from}: {limit} -> failure_limit: ejected after {limit} failures with no answer between"
        ));
        lines.push(format!("failure_limit = {limit}"));
        lines.push(format!(
            "# {retry_from}: {retry} -> retry_timeout_ms: back in the ring {retry} ms after its ejection"
        ));
        lines.push(format!("retry_timeout_ms = {retry}"));
        Ok(())
    }

    /// `shared_with = "writers"`: nutcracker (and its clients) write these
    /// servers too: a hand-off read-through could bring back what they
    /// deleted on a key's new owner, and a copy's lease would reach them as
    /// a value.
    fn shared_with(&mut self) {
        self.lines.push(
            "# shared_with = \"writers\": nutcracker writes these servers too, so in a hand-off window a moved key".into(),
        );
        self.lines.push(
            "# is read on its new owner only (a miss, as in nutcracker) and never copied (docs/handoff.md)".into(),
        );
        self.lines.push("shared_with = \"writers\"".into());
        self.lines.push(
            "# flush_new_servers = \"never\": a server added to [[servers]] joins as it is, never flushed: nutcracker may be using it".into(),
        );
        self.lines.push("flush_new_servers = \"never\"".into());
    }
}

/// `listen`, the ring, the pool's lines and its servers as `[[table]]`s.
fn write_pool(out: &mut String, pool: &Translated, table: &str) {
    let _ = writeln!(out, "listen = \"{}\"", escape(&pool.listen));
    if let Some(mode) = &pool.listen_mode {
        let _ = writeln!(
            out,
            "# listen: its permissions {mode} -> listen_mode, the socket file's mode"
        );
        let _ = writeln!(out, "listen_mode = \"{mode}\"");
    }
    let _ = writeln!(out, "ring = \"twemproxy\"");
    for line in &pool.lines {
        let _ = writeln!(out, "{line}");
    }
    for server in &pool.servers {
        let _ = writeln!(out, "\n[[{table}]]");
        let _ = writeln!(out, "addr = \"{}\"", escape(&server.addr));
        if server.weight != 1 {
            let _ = writeln!(out, "weight = {}", server.weight);
        }
        if let Some(name) = &server.name {
            let _ = writeln!(out, "name = \"{}\"", escape(name));
        }
    }
}

/// Every pool of the file in one config: one at the top level (the one
/// named `default`, memring's name for the top level, or else the first),
/// each other one a `[[pools]]` entry with its own listen.
fn every_pool(pools: &[Pool]) -> Result<(String, Vec<String>), String> {
    let top_at = pools
        .iter()
        .position(|p| p.name == DEFAULT_POOL)
        .unwrap_or(0);
    let mut translated = Vec::new();
    for (at, pool) in pools.iter().enumerate() {
        let place = if at == top_at {
            Place::Top
        } else {
            Place::Entry
        };
        let mut pool = translate(pool, place).map_err(|e| format!("pool `{}`: {e}", pool.name))?;
        let name = pool.name.clone();
        for note in &mut pool.unmapped {
            *note = format!("pool `{name}`: {note}");
        }
        translated.push(pool);
    }
    let top = translated.remove(top_at);
    let names: Vec<String> = pools.iter().map(|p| format!("`{}`", p.name)).collect();
    let mut unmapped = top.unmapped.clone();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Imported from twemproxy pools {} by memring import: one memring for the whole nutcracker.",
        names.join(", ")
    );
    let _ = writeln!(
        out,
        "# The top level is pool `{}` ({}):\n# its listen, settings and [[servers]].",
        top.name,
        if top.name == DEFAULT_POOL {
            "named `default`, as memring names its top-level pool".to_string()
        } else {
            format!("the first in the file; memring names it `{DEFAULT_POOL}` in stats and metrics")
        }
    );
    let _ = writeln!(
        out,
        "# Each other pool is a [[pools]] entry below, and its listen sends it every key."
    );
    let _ = writeln!(
        out,
        "# ring = \"twemproxy\" places every key on the server twemproxy chose, in every pool."
    );
    // memring limits client connections for the whole process: the
    // pools' limits add up, or there is none to add up to when a pool has
    // no limit.
    let every: Vec<&Translated> = std::iter::once(&top).chain(&translated).collect();
    let limited: Vec<String> = every
        .iter()
        .filter(|p| p.client_connections > 0)
        .map(|p| format!("{} {}", p.name, p.client_connections))
        .collect();
    let mut top_lines = top.lines.clone();
    if limited.len() == every.len() {
        let sum: u64 = every.iter().map(|p| p.client_connections).sum();
        let kept = sum.min(MAX_CLIENT_CONNECTIONS);
        top_lines.push(format!(
            "# client_connections: {} -> max_client_connections = {sum}{}, for the whole process:",
            limited.join(" + "),
            if kept == sum {
                String::new()
            } else {
                format!(" (at most {MAX_CLIENT_CONNECTIONS} in memring)")
            }
        ));
        top_lines.push(
            "# memring has no per-pool limit, so one pool's clients may take more than its share"
                .into(),
        );
        top_lines.push(format!("max_client_connections = {kept}"));
        unmapped.push(format!(
            "client_connections per pool (memring limits all pools' clients together: max_client_connections = {kept})"
        ));
    } else if !limited.is_empty() {
        top_lines.push(format!(
            "# client_connections: {} and no limit elsewhere -> memring's default max_client_connections = {DEFAULT_MAX_CLIENT_CONNECTIONS},",
            limited.join(", ")
        ));
        top_lines.push(
            "# for the whole process: memring has no per-pool limit, so those are not carried"
                .into(),
        );
        unmapped.push(format!(
            "client_connections of {} (memring limits the whole process only)",
            limited.join(", ")
        ));
    }
    let top = Translated {
        lines: top_lines,
        ..top
    };
    write_pool(&mut out, &top, "servers");
    for pool in &translated {
        let _ = writeln!(out, "\n[[pools]]");
        let _ = writeln!(
            out,
            "# Pool `{}`: every pool setting is written out, so that none is taken from the top level.",
            pool.name
        );
        let _ = writeln!(out, "name = \"{}\"", escape(&pool.name));
        write_pool(&mut out, pool, "pools.servers");
        unmapped.extend(pool.unmapped.iter().cloned());
    }
    Ok((out, unmapped))
}

#[derive(Debug, PartialEq, Eq)]
struct Server {
    addr: String,
    weight: u64,
    name: Option<String>,
}

/// `host:port:weight [name]`, as twemproxy reads it (from the end).
fn server_entry(entry: &str) -> Result<Server, String> {
    let (spec, name) = match entry.split_once(' ') {
        Some((spec, name)) => (spec, Some(name.trim().to_string())),
        None => (entry, None),
    };
    if spec.starts_with('/') {
        return Err(format!(
            "server `{entry}`: unix sockets are not supported; memring connects over TCP"
        ));
    }
    let (addr, weight) = spec
        .rsplit_once(':')
        .filter(|(addr, _)| addr.contains(':'))
        .ok_or_else(|| format!("server `{entry}`: expected host:port:weight [name]"))?;
    let weight = weight
        .parse::<u64>()
        .ok()
        .filter(|w| *w > 0)
        .ok_or_else(|| format!("server `{entry}`: weight `{weight}` is not a positive number"))?;
    if name.as_deref() == Some(addr) && addr.ends_with(":11211") {
        // memring reads a name equal to the address as "no name", and then
        // the port-11211 rule would name the points by the host alone.
        return Err(format!(
            "server `{entry}`: a name equal to its host:port on port 11211 cannot be expressed"
        ));
    }
    Ok(Server {
        addr: addr.to_string(),
        weight,
        name: name.filter(|n| !n.is_empty()),
    })
}

/// Escapes a value for a TOML basic string.
fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"")
}

fn parse_pools(text: &str) -> Result<Vec<Pool>, String> {
    let mut pools: Vec<Pool> = Vec::new();
    let mut in_servers = false;
    for (number, raw_line) in text.lines().enumerate() {
        let number = number + 1;
        let line = strip_comment(raw_line);
        if line.trim().is_empty() || line.trim() == "---" {
            continue;
        }
        let indented = line.starts_with([' ', '\t']);
        let line = line.trim();
        let problem = |what: &str| format!("line {number}: {what}: `{}`", raw_line.trim());
        if !indented {
            let name = line
                .strip_suffix(':')
                .ok_or_else(|| problem("expected a pool name followed by `:`"))?;
            pools.push(Pool {
                name: unquote(name.trim()).to_string(),
                ..Pool::default()
            });
            in_servers = false;
            continue;
        }
        let pool = pools
            .last_mut()
            .ok_or_else(|| problem("a setting before any pool"))?;
        if let Some(item) = line.strip_prefix('-') {
            if !in_servers {
                return Err(problem("a list item outside servers:"));
            }
            pool.servers.push(unquote(item.trim()).to_string());
            continue;
        }
        let (key, value) = line
            .split_once(':')
            .ok_or_else(|| problem("expected `key: value`"))?;
        let (key, value) = (key.trim(), value.trim());
        in_servers = key == "servers";
        if in_servers {
            if !value.is_empty() {
                return Err(problem(
                    "servers: must be followed by a list of `- host:port:weight`",
                ));
            }
            continue;
        }
        pool.settings
            .push((key.to_string(), unquote(value).to_string()));
    }
    if pools.is_empty() {
        return Err("no pools found".to_string());
    }
    Ok(pools)
}

/// The line without a `#` comment (one at the start or after a space, outside
/// quotes).
fn strip_comment(line: &str) -> &str {
    let mut quote = None;
    let mut previous = ' ';
    for (at, c) in line.char_indices() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == '"' || c == '\'' => quote = Some(c),
            None if c == '#' && previous.is_whitespace() => return &line[..at],
            None => {}
        }
        previous = c;
    }
    line
}

fn unquote(value: &str) -> &str {
    for q in ['"', '\''] {
        if let Some(inner) = value.strip_prefix(q).and_then(|v| v.strip_suffix(q)) {
            return inner;
        }
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    const NUTCRACKER: &str = r#"
# two pools
alpha:
  listen: 127.0.0.1:22121
  hash: fnv1a_64
  hash_tag: "{}"
  distribution: ketama
  auto_eject_hosts: true
  timeout: 400
  redis: false
  server_retry_timeout: 2000
  server_failure_limit: 1
  servers:
   - 127.0.0.1:11211:1
   - 127.0.0.1:11212:2 cache-b # named

beta:
  listen: 127.0.0.1:22122
  hash: md5
  distribution: modula
  servers:
   - 127.0.0.1:11213:1
"#;

    /// One of the import's notes of what it did not carry starts with `start`.
    fn assert_noted(unmapped: &[String], start: &str) {
        assert!(
            unmapped.iter().any(|note| note.starts_with(start)),
            "no note starting {start:?} in {unmapped:?}"
        );
    }

    #[test]
    fn a_pool_becomes_a_memring_config_that_loads() {
        let (toml, unmapped) = twemproxy(NUTCRACKER, Some("alpha")).unwrap();
        let config = memring::config::Config::parse(&toml, "imported.toml").unwrap();
        assert_eq!(config.ring.flavour, memring::ring::Flavour::Twemproxy);
        assert_eq!(config.ring.hash, memring::ring::HashFunction::Fnv1a64);
        assert_eq!(config.ring.hash_tag, Some(*b"{}"));
        assert!(config.auto_eject);
        assert_eq!(config.failure_limit, 1);
        assert_eq!(config.request_timeout.as_millis(), 400);
        assert_eq!(config.servers.len(), 2);
        assert_eq!(config.servers[0].name, "127.0.0.1:11211");
        assert_eq!(config.servers[1].name, "cache-b");
        assert_eq!(config.servers[1].weight, 2);
        assert!(unmapped.is_empty(), "{unmapped:?}");
        assert_eq!(
            config.ejection,
            memring::config::Ejection::Twemproxy {
                retry: std::time::Duration::from_millis(2000)
            }
        );
        assert_eq!(config.connect_timeout.as_millis(), 400);
        // Beside nutcracker, nothing is read through or copied.
        assert_eq!(config.shared_with, memring::config::SharedWith::Writers);
        // nor is a server flushed when it is added: nutcracker may use it.
        assert_eq!(
            config.flush_new_servers,
            memring::config::FlushNewServers::Never
        );
        assert!(toml.contains("\nflush_new_servers = \"never\"\n"), "{toml}");
        assert!(config.warnings().is_empty(), "{:?}", config.warnings());
        // Every setting of the pool says how it maps, in a comment.
        for key in [
            "hash",
            "hash_tag",
            "distribution",
            "auto_eject_hosts",
            "timeout",
            "redis",
            "server_retry_timeout",
            "server_failure_limit",
        ] {
            assert!(
                toml.lines().any(|l| l.starts_with(&format!("# {key}: "))),
                "{key}:\n{toml}"
            );
        }
    }

    /// The pool `p` with `settings` (YAML lines, indented) and one server.
    fn one_pool(settings: &str) -> String {
        format!("p:\n  listen: 127.0.0.1:22121\n{settings}  servers:\n   - 127.0.0.1:11211:1\n")
    }

    fn load(toml: &str) -> memring::config::Config {
        memring::config::Config::parse(toml, "imported.toml")
            .unwrap_or_else(|e| panic!("{e}\n{toml}"))
    }

    #[test]
    fn a_failure_limit_without_auto_eject_is_not_carried_and_no_server_is_ever_dead() {
        let (toml, _) = twemproxy(
            &one_pool("  server_failure_limit: 1\n  server_retry_timeout: 500\n"),
            None,
        )
        .unwrap();
        let config = load(&toml);
        assert!(!config.auto_eject);
        assert!(matches!(
            config.ejection,
            memring::config::Ejection::Twemproxy { .. }
        ));
        assert!(!toml.contains("failure_limit ="), "{toml}");
        assert!(!toml.contains("retry_timeout_ms ="), "{toml}");
        assert!(
            toml.contains("# server_failure_limit: 1 is not carried: without auto_eject_hosts twemproxy ignores it"),
            "{toml}"
        );
        let timing = memring::backend::timing_for(&config);
        assert_eq!(
            timing,
            memring::backend::health::Timing::Twemproxy {
                eject: false,
                retry: std::time::Duration::from_millis(30_000)
            }
        );
    }

    #[test]
    fn auto_eject_without_limits_gets_nutcrackers_defaults_written_out() {
        let (toml, _) = twemproxy(&one_pool("  auto_eject_hosts: true\n"), None).unwrap();
        let config = load(&toml);
        assert!(config.auto_eject);
        assert_eq!(config.failure_limit, 2);
        assert!(toml.contains("\nfailure_limit = 2\n"), "{toml}");
        assert!(toml.contains("\nretry_timeout_ms = 30000\n"), "{toml}");
        assert!(
            toml.contains("# nutcracker's default server_retry_timeout: 30000 -> retry_timeout_ms"),
            "{toml}"
        );
    }

    #[test]
    fn a_pool_without_timeout_is_told_memrings_defaults() {
        let (toml, _) = twemproxy(&one_pool(""), None).unwrap();
        let config = load(&toml);
        assert_eq!(config.request_timeout.as_millis(), 1000);
        assert!(
            toml.contains("# defaults request_timeout_ms = 1000 and connect_timeout_ms = 500"),
            "{toml}"
        );
    }

    #[test]
    fn values_beyond_memrings_limits_are_capped_and_said_so() {
        let (toml, _) = twemproxy(
            &one_pool("  timeout: 120000\n  server_connections: 100\n"),
            None,
        )
        .unwrap();
        let config = load(&toml);
        assert_eq!(config.request_timeout.as_millis(), 120_000);
        assert_eq!(config.connect_timeout.as_millis(), 60_000);
        assert_eq!(config.connections_per_server, 64);
        assert!(
            toml.contains("connect_timeout_ms (at most 60000 ms in memring)"),
            "{toml}"
        );
        assert!(toml.contains("(memring allows at most 64)"), "{toml}");
    }

    #[test]
    fn the_caps_are_memrings_own_limits() {
        let base = "listen = \"127.0.0.1:1\"\n[[servers]]\naddr = \"127.0.0.1:2\"\n";
        for (key, max) in [
            ("connect_timeout_ms", MAX_CONNECT_TIMEOUT_MS),
            ("request_timeout_ms", MAX_REQUEST_TIMEOUT_MS),
            ("connections_per_server", MAX_CONNECTIONS_PER_SERVER),
        ] {
            let at = |n: u64| memring::config::Config::parse(&format!("{key} = {n}\n{base}"), "m");
            assert!(at(max).is_ok(), "{key} = {max}");
            assert!(at(max + 1).is_err(), "{key} = {}", max + 1);
        }
    }

    #[test]
    fn settings_without_an_equivalent_are_listed_and_commented() {
        let (toml, unmapped) = twemproxy(
            &one_pool("  preconnect: true\n  backlog: 1024\n  client_connections: 0\n  tcpkeepalive: true\n"),
            None,
        )
        .unwrap();
        load(&toml);
        assert_eq!(unmapped.len(), 3, "{unmapped:?}");
        for expected in [
            "# preconnect: true has no setting: memring always connects to every server at start",
            "# backlog: 1024 has no setting: memring listens with a backlog of 4096",
            "# client_connections: 0 (no limit) -> memring's default max_client_connections = 16384",
            "# tcpkeepalive: true has no memring equivalent",
        ] {
            assert!(toml.contains(expected), "{expected}\n{toml}");
        }
    }

    #[test]
    fn a_pool_memring_cannot_reproduce_is_refused_by_name_or_among_all() {
        let error = twemproxy(NUTCRACKER, None).unwrap_err();
        assert!(
            error.starts_with("pool `beta`: distribution: modula"),
            "{error}"
        );
        let error = twemproxy(NUTCRACKER, Some("beta")).unwrap_err();
        assert!(error.contains("modula"), "{error}");
        let error = twemproxy(NUTCRACKER, Some("gamma")).unwrap_err();
        assert!(
            error.contains("no pool `gamma` (pools: alpha, beta)"),
            "{error}"
        );
    }

    /// Two pools whose settings differ in every way a pool setting can, the
    /// first with the settings the second leaves out.
    const TWO_POOLS: &str = r#"
alpha:
  listen: 127.0.0.1:22121
  hash: fnv1a_64
  hash_tag: "{}"
  distribution: ketama
  auto_eject_hosts: true
  timeout: 400
  server_connections: 3
  server_retry_timeout: 2000
  server_failure_limit: 1
  client_connections: 100
  servers:
   - 127.0.0.1:11211:1
   - 127.0.0.1:11212:2 cache-b

beta:
  listen: 127.0.0.1:22122
  hash: murmur
  distribution: ketama
  client_connections: 200
  backlog: 512
  servers:
   - 127.0.0.1:11213:1
   - 127.0.0.1:11214:1
"#;

    #[test]
    fn without_a_pool_name_every_pool_is_imported_and_keeps_its_own_settings() {
        let (toml, unmapped) = twemproxy(TWO_POOLS, None).unwrap();
        let config = load(&toml);
        let names: Vec<&str> = config.pools.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["default", "beta"]);
        assert_eq!(config.default_pool, "default");
        assert!(config.routes.is_empty());
        assert_eq!(config.listen, "127.0.0.1:22121".parse().unwrap());
        let alpha = &config.pools[0].config;
        assert_eq!(alpha.ring.hash, memring::ring::HashFunction::Fnv1a64);
        assert_eq!(alpha.ring.hash_tag, Some(*b"{}"));
        assert!(alpha.auto_eject);
        assert_eq!((alpha.failure_limit, alpha.connections_per_server), (1, 3));
        assert_eq!(alpha.servers.len(), 2);
        let beta = config.pool("beta").unwrap();
        assert_eq!(beta.listen, Some("127.0.0.1:22122".parse().unwrap()));
        let beta = &beta.config;
        assert_eq!(beta.ring.flavour, memring::ring::Flavour::Twemproxy);
        assert_eq!(beta.ring.hash, memring::ring::HashFunction::Murmur);
        assert_eq!(beta.ring.hash_tag, None, "not the top level's");
        assert!(!beta.auto_eject, "not the top level's");
        assert_eq!(beta.connections_per_server, 1);
        assert_eq!(beta.request_timeout.as_millis(), 1000);
        assert_eq!(beta.connect_timeout.as_millis(), 500);
        assert_eq!(
            beta.ejection,
            memring::config::Ejection::Twemproxy {
                retry: std::time::Duration::from_millis(30_000)
            }
        );
        let servers: Vec<&str> = beta.servers.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(servers, ["127.0.0.1:11213", "127.0.0.1:11214"]);
        // The pools' client limits add up: memring has one for the process.
        assert_eq!(config.max_client_connections, 300);
        assert!(
            toml.contains("# client_connections: alpha 100 + beta 200 -> max_client_connections = 300, for the whole process:"),
            "{toml}"
        );
        assert!(
            toml.contains("# The top level is pool `alpha` (the first in the file;"),
            "{toml}"
        );
        // Each pool's settings keep their comments, in its own part.
        let (top, entry) = toml.split_once("\n[[pools]]\n").unwrap();
        for line in [
            "# hash: fnv1a_64 -> hash, the same function",
            "# server_failure_limit: 1 -> failure_limit",
        ] {
            assert!(top.contains(line), "{line}\n{toml}");
        }
        for line in [
            "# hash: murmur -> hash, the same function",
            "# backlog: 512 has no setting",
            "# auto_eject_hosts: not set, false in twemproxy",
            "# timeout: not set, so nutcracker waits",
        ] {
            assert!(entry.contains(line), "{line}\n{toml}");
        }
        assert_noted(&unmapped, "pool `beta`: backlog: 512");
        assert_noted(&unmapped, "client_connections per pool");
    }

    #[test]
    fn a_pool_named_default_is_the_top_level_and_a_limit_with_an_unlimited_pool_is_not_carried() {
        let text = TWO_POOLS
            .replace("\nbeta:", "\ndefault:")
            .replace("  client_connections: 200\n", "");
        let (toml, unmapped) = twemproxy(&text, None).unwrap();
        let config = load(&toml);
        let names: Vec<&str> = config.pools.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["default", "alpha"]);
        assert_eq!(config.listen, "127.0.0.1:22122".parse().unwrap());
        assert_eq!(config.ring.hash, memring::ring::HashFunction::Murmur);
        assert_eq!(
            config.pool("alpha").unwrap().config.ring.hash_tag,
            Some(*b"{}")
        );
        assert_eq!(config.max_client_connections, 16_384);
        assert!(
            toml.contains(
                "# client_connections: alpha 100 and no limit elsewhere -> memring's default"
            ),
            "{toml}"
        );
        assert_noted(&unmapped, "client_connections of alpha 100");
    }

    #[test]
    fn one_pool_or_a_named_pool_is_imported_as_before() {
        let (named, _) = twemproxy(TWO_POOLS, Some("beta")).unwrap();
        assert!(!named.contains("[[pools]]"), "{named}");
        assert!(named.starts_with("# Imported from twemproxy pool `beta` by memring import.\n"));
        let (alone, _) = twemproxy(&TWO_POOLS[..TWO_POOLS.find("\nbeta:").unwrap()], None).unwrap();
        assert!(!alone.contains("[[pools]]"), "{alone}");
        assert!(
            alone.contains("\nmax_client_connections = 100\n"),
            "{alone}"
        );
    }

    /// nutcracker's `listen: /path 0666` (a Unix socket, with its
    /// permissions) becomes `listen = "unix:/path"` and `listen_mode`; a
    /// pool entry's too. The import used to refuse it.
    #[test]
    fn a_unix_socket_listen_is_carried_with_its_mode() {
        use memring::config::Listen;
        let text =
            "p:\n  listen: /var/run/nutcracker.sock 0666\n  servers:\n   - 127.0.0.1:11211:1\n";
        let (toml, unmapped) = twemproxy(text, None).unwrap();
        assert!(
            toml.contains("\nlisten = \"unix:/var/run/nutcracker.sock\"\n"),
            "{toml}"
        );
        assert!(toml.contains("\nlisten_mode = \"0666\"\n"), "{toml}");
        assert!(unmapped.is_empty(), "{unmapped:?}");
        assert_eq!(
            load(&toml).listen,
            Listen::Unix {
                path: "/var/run/nutcracker.sock".into(),
                mode: Some(0o666)
            }
        );
        // Without permissions: the umask's mode, no listen_mode.
        let text = text.replace(" 0666", "");
        let (toml, _) = twemproxy(&text, None).unwrap();
        assert!(!toml.contains("listen_mode"), "{toml}");
        assert_eq!(
            load(&toml).listen,
            Listen::Unix {
                path: "/var/run/nutcracker.sock".into(),
                mode: None
            }
        );
        // Two pools: the second one's socket is its [[pools]] entry's.
        let two = "a:\n  listen: 127.0.0.1:22121\n  servers:\n   - 127.0.0.1:11211:1\nb:\n  listen: /run/b.sock 0660\n  servers:\n   - 127.0.0.1:11212:1\n";
        let (toml, _) = twemproxy(two, None).unwrap();
        let config = load(&toml);
        let b = config.pools.iter().find(|p| p.name == "b").unwrap();
        assert_eq!(
            b.listen,
            Some(Listen::Unix {
                path: "/run/b.sock".into(),
                mode: Some(0o660)
            })
        );
        // nutcracker refuses a mode that is not octal up to 0777; so does import.
        for bad in ["0999", "01777", "rw"] {
            let text =
                format!("p:\n  listen: /run/x.sock {bad}\n  servers:\n   - 127.0.0.1:11211:1\n");
            let error = twemproxy(&text, None).unwrap_err();
            assert!(error.contains("is not a file permission"), "{bad}: {error}");
        }
    }

    #[test]
    fn bad_server_entries_are_reported() {
        for bad in [
            "127.0.0.1:11211",
            "127.0.0.1:11211:0",
            "/tmp/mc.sock:1",
            "127.0.0.1:11211:1 127.0.0.1:11211",
        ] {
            let text = format!("p:\n  listen: 127.0.0.1:1\n  servers:\n   - {bad}\n");
            assert!(twemproxy(&text, None).is_err(), "{bad}");
        }
        assert!(twemproxy("p:\n  listen 1\n", None)
            .unwrap_err()
            .contains("line 2"));
    }
}
