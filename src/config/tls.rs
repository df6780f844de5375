//! `[tls_listen]`, `[backend_tls]` and the servers' `tls`: checked as text
//! when the file is parsed, and the files they name read when it is loaded.

use std::net::SocketAddr;
use std::ops::Range;
use std::path::Path;

use toml::Spanned;

use super::addr::binds_overlap;
use super::raw::RawConfig;
use super::TlsListen;
use crate::error::ConfigError;

/// `[tls_listen]`, `[backend_tls]` and the servers' `tls`, checked without
/// reading the files. Relative paths are taken from the config file's
/// directory, so a config and its certificates move together.
pub(super) fn tls_settings(
    raw: &RawConfig,
    at: &dyn Fn(Range<usize>, String) -> ConfigError,
    path: &str,
    listen: Option<SocketAddr>,
    admin_listen: Option<SocketAddr>,
) -> Result<(Option<TlsListen>, Option<crate::tls::BackendFiles>), ConfigError> {
    let base = Path::new(path).parent().unwrap_or(Path::new(""));
    let file = |value: &Spanned<String>, key: &str| -> Result<std::path::PathBuf, ConfigError> {
        let text = value.get_ref().trim();
        if text.is_empty() {
            return Err(at(value.span(), format!("{key} must name a file")));
        }
        Ok(base.join(text))
    };
    let tls_listen = match &raw.tls_listen {
        None => None,
        Some(section) => {
            let section = section.get_ref();
            let addr = section.addr.get_ref().parse::<SocketAddr>().map_err(|_| {
                at(
                    section.addr.span(),
                    format!(
                        "tls_listen.addr: `{}` is not an IP:port address",
                        section.addr.get_ref()
                    ),
                )
            })?;
            for (other, name) in [(listen, "listen"), (admin_listen, "admin_listen")] {
                if other.is_some_and(|other| binds_overlap(addr, other)) {
                    return Err(at(
                        section.addr.span(),
                        format!(
                            "tls_listen.addr = \"{addr}\" takes the port of {name}: the TLS listener needs an address of its own"
                        ),
                    ));
                }
            }
            Some(TlsListen {
                addr,
                files: crate::tls::ListenFiles {
                    cert_file: file(&section.cert_file, "tls_listen.cert_file")?,
                    key_file: file(&section.key_file, "tls_listen.key_file")?,
                    client_ca_file: section
                        .client_ca_file
                        .as_ref()
                        .map(|f| file(f, "tls_listen.client_ca_file"))
                        .transpose()?,
                },
            })
        }
    };
    let backend_tls = match &raw.backend_tls {
        None => None,
        Some(section) => {
            let span = section.span();
            let section = section.get_ref();
            // Roots from the system's store would make verification depend
            // on the machine (and many containers have none): say which.
            let Some(ca_file) = &section.ca_file else {
                return Err(at(
                    span,
                    "[backend_tls] needs ca_file: the PEM file of the CA certificates that issued the servers' certificates (memring does not use the system's roots)".into(),
                ));
            };
            let client_cert = match (&section.cert_file, &section.key_file) {
                (None, None) => None,
                (Some(cert), Some(key)) => Some((
                    file(cert, "backend_tls.cert_file")?,
                    file(key, "backend_tls.key_file")?,
                )),
                (Some(cert), None) => {
                    return Err(at(
                        cert.span(),
                        "backend_tls.cert_file needs key_file too (the client certificate's private key)".into(),
                    ))
                }
                (None, Some(key)) => {
                    return Err(at(
                        key.span(),
                        "backend_tls.key_file needs cert_file too (the client certificate)".into(),
                    ))
                }
            };
            if let Some(name) = &section.server_name {
                let text = name.get_ref();
                if rustls::pki_types::ServerName::try_from(text.as_str()).is_err() {
                    return Err(at(
                        name.span(),
                        format!("backend_tls.server_name `{text}` is neither a DNS name nor an IP address"),
                    ));
                }
            }
            Some(crate::tls::BackendFiles {
                ca_file: file(ca_file, "backend_tls.ca_file")?,
                client_cert,
                server_name: section.server_name.as_ref().map(|n| n.get_ref().clone()),
            })
        }
    };
    if backend_tls.is_none() {
        let tls_server = raw.servers.iter().find_map(|s| {
            s.get_ref()
                .tls
                .as_ref()
                .filter(|t| *t.get_ref())
                .map(|t| (t.span(), s.get_ref().addr.get_ref().clone()))
        });
        if let Some((span, addr)) = tls_server {
            return Err(at(
                span,
                format!("server `{addr}` has tls = true but there is no [backend_tls] with the ca_file to verify it by"),
            ));
        }
        let discovered = raw
            .discovery
            .as_ref()
            .and_then(|d| d.get_ref().tls.as_ref());
        if let Some(tls) = discovered.filter(|t| *t.get_ref()) {
            return Err(at(
                tls.span(),
                "[discovery] has tls = true but there is no [backend_tls] with the ca_file to verify the servers by".into(),
            ));
        }
    }
    Ok((tls_listen, backend_tls))
}

/// Reads every TLS file named in the config, as start-up will, and says
/// which one is unusable, at the line that names it.
pub(super) fn check_tls_files(
    raw: &RawConfig,
    at: &dyn Fn(Range<usize>, String) -> ConfigError,
    listen: Option<&TlsListen>,
    backend: Option<&crate::tls::BackendFiles>,
) -> Result<(), ConfigError> {
    // The key that names the file the error is about.
    let span_of = |error: &crate::tls::TlsError| -> Range<usize> {
        let mut spans: Vec<(std::path::PathBuf, Range<usize>)> = Vec::new();
        if let (Some(files), Some(raw)) = (listen, &raw.tls_listen) {
            let raw = raw.get_ref();
            spans.push((files.files.cert_file.clone(), raw.cert_file.span()));
            spans.push((files.files.key_file.clone(), raw.key_file.span()));
            if let (Some(ca), Some(raw_ca)) = (&files.files.client_ca_file, &raw.client_ca_file) {
                spans.push((ca.clone(), raw_ca.span()));
            }
        }
        if let (Some(files), Some(raw)) = (backend, &raw.backend_tls) {
            let section = raw.get_ref();
            if let Some(ca) = &section.ca_file {
                spans.push((files.ca_file.clone(), ca.span()));
            }
            if let (Some((cert, key)), Some(raw_cert), Some(raw_key)) =
                (&files.client_cert, &section.cert_file, &section.key_file)
            {
                spans.push((cert.clone(), raw_cert.span()));
                spans.push((key.clone(), raw_key.span()));
            }
        }
        spans
            .into_iter()
            .find(|(path, _)| *path == error.path)
            .map_or(0..0, |(_, span)| span)
    };
    if let Some(listen) = listen {
        crate::tls::check_listen(&listen.files)
            .map_err(|e| at(span_of(&e), format!("tls_listen: {e}")))?;
    }
    if let Some(backend) = backend {
        crate::tls::check_backend(backend)
            .map_err(|e| at(span_of(&e), format!("backend_tls: {e}")))?;
    }
    Ok(())
}
