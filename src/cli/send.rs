//! `memring send ADDR LINE...`: send memcached commands and print the
//! replies, for trying memring (or any memcached) without nc or telnet.

use anyhow::Context as _;

use super::resolve;

pub(crate) fn run(addr: &str, lines: &[String]) -> anyhow::Result<()> {
    use std::io::{Read, Write};
    let timeout = std::time::Duration::from_secs(5);
    let mut last = None;
    let mut connected = None;
    for target in resolve(addr)? {
        match std::net::TcpStream::connect_timeout(&target, timeout) {
            Ok(stream) => {
                connected = Some(stream);
                break;
            }
            Err(e) => last = Some((target, e)),
        }
    }
    let mut stream = match (connected, last) {
        (Some(stream), _) => stream,
        (None, Some((target, e))) => {
            return Err(e).with_context(|| format!("cannot connect to {addr} ({target})"))
        }
        (None, None) => anyhow::bail!("{addr} resolves to no address"),
    };
    stream.set_read_timeout(Some(timeout))?;
    let mut request = Vec::new();
    for line in lines {
        request.extend_from_slice(line.as_bytes());
        request.extend_from_slice(b"\r\n");
    }
    stream.write_all(&request)?;
    // The server answers everything sent before the half-close, then closes.
    stream.shutdown(std::net::Shutdown::Write)?;
    let mut reply = Vec::new();
    stream
        .read_to_end(&mut reply)
        .with_context(|| format!("no complete answer from {addr} within {timeout:?}"))?;
    std::io::stdout().write_all(&reply)?;
    Ok(())
}
