//! How memring reaches etcd: the connection (timeouts, keep-alive), TLS
//! with a CA and a client certificate, and the password login, read from
//! their files at each connection.

use std::path::Path;
use std::time::Duration;

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};

use super::REQUEST_TIMEOUT;
use crate::config::{EtcdAccess, EtcdSource};

pub(super) async fn connect(etcd: &EtcdSource) -> Result<Client, String> {
    let options = connect_options(&etcd.access)?
        .with_connect_timeout(REQUEST_TIMEOUT)
        // etcd refuses pings more often than every 5 s (and closes the
        // connection: "too many pings"), and pings without a stream.
        .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5));
    tokio::time::timeout(
        REQUEST_TIMEOUT,
        Client::connect(&etcd.endpoints, Some(options)),
    )
    .await
    .map_err(|_| "connect timed out".to_string())?
    .map_err(|e| chain(&e))
}

/// An error with its causes, `a: b: c` (a TLS failure is a transport
/// error whose cause says which certificate was refused).
pub fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        let more = e.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = e.source();
    }
    text
}

/// What the files of [`EtcdAccess`] hold, read and checked.
#[derive(Default)]
pub struct AccessFiles {
    ca: Option<Vec<u8>>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
    user: Option<(String, String)>,
}

/// The largest certificate, key or password file read.
const ACCESS_FILE_BYTES: u64 = 1 << 20;

/// Reads the CA, the client certificate and key, and the password of
/// `access` (each PEM file must hold what its setting names).
///
/// # Errors
/// A file that cannot be read, or does not hold a certificate, a key or a
/// password; the message names the setting and the file.
pub fn read_access(access: &EtcdAccess) -> Result<AccessFiles, String> {
    let read = |setting: &str, path: &Path| {
        crate::inputs::regular_file::read(path, ACCESS_FILE_BYTES)
            .map_err(|e| format!("{setting} {}: {e}", path.display()))
    };
    let certificates = |setting: &str, path: &Path| {
        let pem = read(setting, path)?;
        let found = rustls_pemfile::certs(&mut &pem[..])
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("{setting} {}: {e}", path.display()))?;
        if found.is_empty() {
            return Err(format!(
                "{setting} {}: no PEM certificate in it",
                path.display()
            ));
        }
        Ok(pem)
    };
    let mut files = AccessFiles::default();
    if let Some(ca) = &access.ca_file {
        files.ca = Some(certificates("etcd_ca_file", ca)?);
    }
    if let Some((cert, key)) = &access.identity {
        let cert = certificates("etcd_cert_file", cert)?;
        let pem = read("etcd_key_file", key)?;
        match rustls_pemfile::private_key(&mut &pem[..]) {
            Ok(Some(_)) => {}
            Ok(None) => {
                return Err(format!(
                    "etcd_key_file {}: no PEM private key in it",
                    key.display()
                ))
            }
            Err(e) => return Err(format!("etcd_key_file {}: {e}", key.display())),
        }
        files.identity = Some((cert, pem));
    }
    if let Some((name, file)) = &access.user {
        let bytes = read("etcd_password_file", file)?;
        let text = String::from_utf8(bytes)
            .map_err(|_| format!("etcd_password_file {}: not UTF-8", file.display()))?;
        // One line; its line end is not part of the password.
        let password = text.trim_end_matches(['\n', '\r']);
        if password.is_empty() {
            return Err(format!("etcd_password_file {}: empty", file.display()));
        }
        files.user = Some((name.clone(), password.to_string()));
    }
    Ok(files)
}

/// The connection options of `access`: TLS with its CA (and client
/// certificate), and the user. The files are read now, at each connection.
///
/// # Errors
/// As [`read_access`].
pub fn connect_options(access: &EtcdAccess) -> Result<ConnectOptions, String> {
    let files = read_access(access)?;
    let mut options = ConnectOptions::new();
    if files.ca.is_some() || files.identity.is_some() {
        let mut tls = TlsOptions::new();
        if let Some(ca) = files.ca {
            tls = tls.ca_certificate(Certificate::from_pem(ca));
        }
        if let Some((cert, key)) = files.identity {
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        options = options.with_tls(tls);
    }
    if let Some((name, password)) = files.user {
        options = options.with_user(name, password);
    }
    Ok(options)
}
