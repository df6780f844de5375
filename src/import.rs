//! `memring import twemproxy nutcracker.yml [POOL]`: translate one twemproxy
//! pool into an equivalent memring config with `ring = "twemproxy"`, so the
//! switch keeps every key where it is. Pure text in, text out; `main` reads the
//! file and prints.
//!
//! nutcracker.yml uses a small part of YAML (a map of pools, each a map of
//! scalars plus a `servers:` list), so this reads that part line by line
//! rather than pulling in a YAML library; anything else is reported, not
//! guessed at.

use std::fmt::Write as _;

/// One pool of a nutcracker.yml, in file order.
#[derive(Debug, Default, PartialEq, Eq)]
struct Pool {
    name: String,
    /// `key: value` settings in file order, values unquoted.
    settings: Vec<(String, String)>,
    /// The `servers:` entries, unquoted.
    servers: Vec<String>,
}

/// The memring config for `pool` (or the only pool) of a nutcracker.yml, and
/// the settings that have no memring equivalent, one line each.
///
/// # Errors
/// The file is not the YAML twemproxy reads, the pool is missing or ambiguous,
/// or it uses something memring cannot reproduce (redis, unix sockets, a
/// distribution other than ketama).
pub(crate) fn twemproxy(text: &str, pool: Option<&str>) -> Result<(String, Vec<String>), String> {
    let pools = parse_pools(text)?;
    let names = || {
        pools
            .iter()
            .map(|p| p.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let pool = match pool {
        Some(wanted) => pools
            .iter()
            .find(|p| p.name == wanted)
            .ok_or_else(|| format!("no pool `{wanted}` (pools: {})", names()))?,
        None if pools.len() == 1 => &pools[0],
        None => {
            return Err(format!(
                "{} pools; name the one to import (pools: {})",
                pools.len(),
                names()
            ))
        }
    };
    translate(pool)
}

fn translate(pool: &Pool) -> Result<(String, Vec<String>), String> {
    let mut lines: Vec<String> = Vec::new();
    let mut unmapped: Vec<String> = Vec::new();
    let mut listen = None;
    for (key, value) in &pool.settings {
        let number = || {
            value
                .parse::<u64>()
                .map_err(|_| format!("{key}: `{value}` is not a number"))
        };
        let boolean = || match value.as_str() {
            "true" => Ok(true),
            "false" => Ok(false),
            _ => Err(format!("{key}: `{value}` is not true or false")),
        };
        match key.as_str() {
            "listen" => {
                if value.starts_with('/') {
                    return Err(format!(
                        "listen: unix socket `{value}` is not supported; memring listens on TCP"
                    ));
                }
                // twemproxy allows `host:port:permissions`; only host:port maps.
                let parts: Vec<&str> = value.rsplitn(3, ':').collect();
                let addr = match parts.as_slice() {
                    [port, host] => format!("{host}:{port}"),
                    [_mode, port, host] if value.matches(':').count() == 2 => {
                        unmapped.push(format!("listen permissions in `{value}`"));
                        format!("{host}:{port}")
                    }
                    _ => value.clone(),
                };
                listen = Some(addr);
            }
            "hash" => lines.push(format!("hash = \"{value}\"")),
            "hash_tag" => lines.push(format!("hash_tag = \"{}\"", escape(value))),
            "distribution" if value == "ketama" => {}
            "distribution" => {
                return Err(format!(
                    "distribution: {value} cannot be reproduced; memring reproduces ketama only"
                ))
            }
            "timeout" => lines.push(format!("request_timeout_ms = {}", number()?)),
            "server_connections" => {
                let n = number()?;
                lines.push(format!(
                    "# server_connections: {n} -> connections_per_server, which is per worker: \
                     with the default one worker, {n} connection(s) to each server, as nutcracker"
                ));
                lines.push(format!("connections_per_server = {n}"));
            }
            "auto_eject_hosts" => lines.push(format!("auto_eject = {}", boolean()?)),
            "server_failure_limit" => lines.push(format!("failure_limit = {}", number()?)),
            "client_connections" => match number()? {
                0 => {}
                n => lines.push(format!("max_client_connections = {n}")),
            },
            "redis" if boolean()? => {
                return Err("redis: true; memring proxies memcached only".to_string())
            }
            "redis" => {}
            "server_retry_timeout" => unmapped.push(format!(
                "server_retry_timeout: {value} (memring probes a DEAD server and restores it as soon as it answers)"
            )),
            "backlog" => unmapped.push(format!("backlog: {value} (memring listens with a 4096 backlog)")),
            "preconnect" => unmapped.push(format!(
                "preconnect: {value} (memring connects to every server at start)"
            )),
            _ => unmapped.push(format!("{key}: {value}")),
        }
    }
    let listen = listen.ok_or("the pool has no listen:")?;
    if pool.servers.is_empty() {
        return Err("the pool has no servers:".to_string());
    }

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
    for note in &unmapped {
        let _ = writeln!(out, "# no memring equivalent: {note}");
    }
    let _ = writeln!(out, "listen = \"{}\"", escape(&listen));
    let _ = writeln!(out, "ring = \"twemproxy\"");
    for line in &lines {
        let _ = writeln!(out, "{line}");
    }
    for entry in &pool.servers {
        let server = server_entry(entry)?;
        let _ = writeln!(out, "\n[[servers]]");
        let _ = writeln!(out, "addr = \"{}\"", escape(&server.addr));
        if server.weight != 1 {
            let _ = writeln!(out, "weight = {}", server.weight);
        }
        if let Some(name) = &server.name {
            let _ = writeln!(out, "name = \"{}\"", escape(name));
        }
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
        assert_eq!(unmapped.len(), 1, "{unmapped:?}");
        assert!(unmapped[0].starts_with("server_retry_timeout"));
        assert!(toml.contains("# no memring equivalent: server_retry_timeout"));
    }

    #[test]
    fn several_pools_need_a_name_and_modula_is_refused() {
        let error = twemproxy(NUTCRACKER, None).unwrap_err();
        assert!(error.contains("alpha, beta"), "{error}");
        let error = twemproxy(NUTCRACKER, Some("beta")).unwrap_err();
        assert!(error.contains("modula"), "{error}");
        let error = twemproxy(NUTCRACKER, Some("gamma")).unwrap_err();
        assert!(error.contains("no pool `gamma`"), "{error}");
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
