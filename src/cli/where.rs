//! `memring where (--admin ADDR | --config FILE) KEY...`: where each key
//! lives, for people (or as JSON with `--json`): asked of a running
//! memring's `/route`, or worked out from a config file alone.

use std::io::{Read, Write};

use anyhow::Context as _;
use serde_json::Value;

use super::resolve;

/// Where to ask.
pub(crate) enum Source<'a> {
    Admin(&'a str),
    Config(&'a std::path::Path),
}

/// Prints where each of `keys` lives; an error once every key is printed
/// when one was refused.
pub(crate) fn run(
    source: Source<'_>,
    keys: &[String],
    base64: bool,
    json: bool,
) -> anyhow::Result<()> {
    let config = match source {
        Source::Config(path) => Some(load(path)?),
        Source::Admin(_) => None,
    };
    let mut refused = 0;
    for key in keys {
        let answer = match (&source, &config) {
            (Source::Admin(addr), _) => ask_admin(addr, key, base64)?,
            (_, Some(config)) => {
                let bytes = if base64 {
                    memring::control::locate::key_of_base64(key)
                } else {
                    memring::control::locate::check_key(key.as_bytes())
                        .map(|()| key.clone().into_bytes())
                };
                match bytes {
                    Ok(bytes) => Ok(memring::control::locate::offline_location(config, &bytes)),
                    Err(reason) => Err(reason),
                }
            }
            _ => unreachable!("a config is loaded for Source::Config"),
        };
        match answer {
            Ok(location) if json => println!("{location}"),
            Ok(location) => print!("{}", for_people(&location)),
            Err(reason) => {
                refused += 1;
                let shown: String = key.chars().take(40).collect();
                let more = if shown.len() < key.len() { "…" } else { "" };
                eprintln!("memring: key {shown:?}{more}: {reason}");
            }
        }
    }
    anyhow::ensure!(refused == 0, "{refused} of {} keys refused", keys.len());
    Ok(())
}

/// The config at `path`, with the servers its `[discovery]` records list
/// now when it has them (as memring would start with).
fn load(path: &std::path::Path) -> anyhow::Result<memring::config::Config> {
    let config = memring::config::Config::load(path)?;
    let Some(source) = &config.discovery.source else {
        return Ok(config);
    };
    let found = memring::control::discovery::servers_blocking(
        source,
        config.discovery.dns,
        config.discovery.tls,
    )
    .map_err(|e| anyhow::anyhow!("{}: [discovery] {source}: {e}", path.display()))?;
    Ok(config.with_servers(found))
}

/// `GET /route` of the admin listener at `addr`: the location, or why the
/// key was refused.
fn ask_admin(addr: &str, key: &str, base64: bool) -> anyhow::Result<Result<Value, String>> {
    let timeout = std::time::Duration::from_secs(2);
    let target = resolve(addr)?[0];
    let mut stream = std::net::TcpStream::connect_timeout(&target, timeout)
        .with_context(|| format!("cannot reach the admin listener at {addr}"))?;
    stream.set_read_timeout(Some(timeout))?;
    let name = if base64 { "key_b64" } else { "key" };
    let query = format!("{name}={}", percent_encode(key.as_bytes()));
    write!(
        stream,
        "GET /route?{query} HTTP/1.1\r\nHost: memring\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .with_context(|| format!("no answer from {addr} within {timeout:?}"))?;
    let response = String::from_utf8_lossy(&response);
    let (head, body) = response
        .split_once("\r\n\r\n")
        .with_context(|| format!("{addr} sent no HTTP response"))?;
    let status = head.split(' ').nth(1).unwrap_or("");
    let value: Value = serde_json::from_str(body.trim()).with_context(|| {
        format!("{addr} answered /route with {status}, not JSON (a memring without /route?)")
    })?;
    Ok(match (status, value.get("error")) {
        ("200", _) => Ok(value),
        (_, Some(Value::String(reason))) => Err(reason.clone()),
        _ => Err(format!("{addr} answered {status}: {value}")),
    })
}

/// Every byte but the URL's unreserved ones as `%XX`.
fn percent_encode(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|&b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A location as lines for people.
fn for_people(location: &Value) -> String {
    let text = |v: &Value| v.as_str().unwrap_or("-").to_string();
    let server = |v: &Value| match v {
        Value::Null => "-".to_string(),
        v => {
            // An unnamed server is named by its address: shown once.
            let (name, addr) = (text(&v["name"]), text(&v["addr"]));
            let mut s = if name == addr {
                addr
            } else {
                format!("{name} {addr}")
            };
            if let Some(state) = v["state"].as_str() {
                s.push(' ');
                s.push_str(state);
            }
            s
        }
    };
    let key = match &location["key"] {
        Value::String(key) => key.clone(),
        _ => format!("(base64) {}", text(&location["key_b64"])),
    };
    let replicas: Vec<String> = location["replicas"]
        .as_array()
        .map(|r| r.iter().map(server).collect())
        .unwrap_or_default();
    let gutter = match &location["gutter"] {
        Value::Null => "-".to_string(),
        g => format!("pool {}: {}", text(&g["pool"]), server(&g["owner"])),
    };
    format!(
        "{key}\n  pool         {}\n  owner        {}\n  replicas     {}\n  previous     {}\n  gutter       {gutter}\n  ring_digest  {}\n",
        text(&location["pool"]),
        server(&location["owner"]),
        replicas.join(", "),
        server(&location["previous_owner"]),
        text(&location["ring_digest"]),
    )
}
