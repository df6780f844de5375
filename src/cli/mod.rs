//! The subcommands of the `memring` binary, one file each; `main.rs` parses
//! the command line and calls one of them. They take the clap definition and
//! their arguments from `main` rather than importing it, so nothing here
//! points back up at `main`.

use anyhow::Context as _;

pub(crate) mod check;
pub(crate) mod completions;
pub(crate) mod healthcheck;
pub(crate) mod hints;
pub(crate) mod import;
pub(crate) mod logging;
pub(crate) mod man;
pub(crate) mod member;
pub(crate) mod plan;
pub(crate) mod run;
pub(crate) mod send;
pub(crate) mod r#where;

/// The addresses `addr` (`host:port`) stands for, with what went wrong in
/// words when there are none.
fn resolve(addr: &str) -> anyhow::Result<Vec<std::net::SocketAddr>> {
    use std::net::ToSocketAddrs;
    let found: Vec<_> = addr
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve {addr} (DNS, or not host:port)"))?
        .collect();
    anyhow::ensure!(!found.is_empty(), "{addr} resolves to no address");
    Ok(found)
}

/// The error and its causes on one line, each cause once: an error whose
/// message already quotes its source (`cannot read: No such file or
/// directory`) does not get the source appended a second time.
pub(crate) fn error_chain(error: &anyhow::Error) -> String {
    let mut text = error.to_string();
    for cause in error.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use memring::config::Config;

    use super::*;

    #[test]
    fn each_cause_is_printed_once() {
        let missing = Config::load(Path::new("/nonexistent/memring.toml")).unwrap_err();
        let text = error_chain(&anyhow::Error::new(missing));
        assert_eq!(
            text.matches("No such file or directory").count(),
            1,
            "{text}"
        );
        let wrapped = anyhow::anyhow!("inner").context("outer");
        assert_eq!(error_chain(&wrapped), "outer: inner");
    }
}
