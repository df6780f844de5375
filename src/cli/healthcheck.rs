//! `memring healthcheck [ADDR]`: exit 0 when memring's admin listener
//! reports ready; for container health checks (the image has no curl).
//! With `--digest HEX`, also only when its ring digest is HEX.

use std::process::ExitCode;

use super::resolve;

pub(crate) fn run(addr: &str, digest: Option<&str>) -> ExitCode {
    let timeout = std::time::Duration::from_secs(2);
    let digest = match digest.map(|d| (d, memring::ring::digest::parse_hex(d))) {
        None => None,
        Some((_, Some(digest))) => Some(digest),
        Some((text, None)) => {
            eprintln!("memring: --digest {text:?} is not a ring digest: want 16 hex digits, as `stats` shows `ring_digest`");
            return ExitCode::from(2);
        }
    };
    let target = match resolve(addr) {
        Ok(found) => found[0],
        Err(e) => {
            eprintln!("memring: {e:#}");
            return ExitCode::from(1);
        }
    };
    match memring::control::admin::probe_ready_with(target, digest, timeout) {
        Ok((true, reason)) => {
            println!("memring: {reason}");
            ExitCode::SUCCESS
        }
        Ok((false, reason)) => {
            eprintln!("memring: {reason}");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("memring: cannot reach the admin listener at {addr}: {e}");
            ExitCode::from(1)
        }
    }
}
