//! `memring send ADDR LINE...`: send memcached commands and print the
//! replies, for trying memring (or any memcached) without nc or telnet.
//! ADDR is `host:port` or `unix:PATH` (a Unix-socket listener).

use std::io::{Read, Write};
use std::time::Duration;

use anyhow::Context as _;

use super::resolve;

pub(crate) fn run(addr: &str, lines: &[String]) -> anyhow::Result<()> {
    let timeout = Duration::from_secs(5);
    let mut stream = Conn::open(addr, timeout)?;
    let mut request = Vec::new();
    for line in lines {
        request.extend_from_slice(line.as_bytes());
        request.extend_from_slice(b"\r\n");
    }
    stream.write_all(&request)?;
    // The server answers everything sent before the half-close, then closes.
    stream.shutdown_write()?;
    let mut reply = Vec::new();
    stream
        .read_to_end(&mut reply)
        .with_context(|| format!("no complete answer from {addr} within {timeout:?}"))?;
    std::io::stdout().write_all(&reply)?;
    Ok(())
}

/// A connection to memring or a memcached: TCP to `host:port` (each address
/// of a host name tried in turn) or a Unix socket (`unix:PATH`), reads
/// bounded by the timeout given.
pub(crate) enum Conn {
    Tcp(std::net::TcpStream),
    Unix(std::os::unix::net::UnixStream),
}

impl Conn {
    pub(crate) fn open(addr: &str, timeout: Duration) -> anyhow::Result<Conn> {
        if let Some(path) = addr.strip_prefix("unix:") {
            let stream = std::os::unix::net::UnixStream::connect(path)
                .with_context(|| format!("cannot connect to {addr}"))?;
            stream.set_read_timeout(Some(timeout))?;
            return Ok(Conn::Unix(stream));
        }
        let mut last = None;
        for target in resolve(addr)? {
            match std::net::TcpStream::connect_timeout(&target, timeout) {
                Ok(stream) => {
                    stream.set_read_timeout(Some(timeout))?;
                    return Ok(Conn::Tcp(stream));
                }
                Err(e) => last = Some((target, e)),
            }
        }
        match last {
            Some((target, e)) => {
                Err(e).with_context(|| format!("cannot connect to {addr} ({target})"))
            }
            None => anyhow::bail!("{addr} resolves to no address"),
        }
    }

    /// Half-closes: no more requests.
    pub(crate) fn shutdown_write(&self) -> std::io::Result<()> {
        match self {
            Conn::Tcp(stream) => stream.shutdown(std::net::Shutdown::Write),
            Conn::Unix(stream) => stream.shutdown(std::net::Shutdown::Write),
        }
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Conn::Tcp(stream) => stream.read(buf),
            Conn::Unix(stream) => stream.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Conn::Tcp(stream) => stream.write(buf),
            Conn::Unix(stream) => stream.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Conn::Tcp(stream) => stream.flush(),
            Conn::Unix(stream) => stream.flush(),
        }
    }
}
