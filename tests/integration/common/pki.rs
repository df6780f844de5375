//! Certificates for the TLS tests, made here with rcgen: a CA per test and
//! the server and client certificates it issues, as PEM files in a
//! temporary directory (removed with it).

use std::path::PathBuf;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::CertificateDer;

use super::TempDir;

/// A certificate authority with its files in a temporary directory.
pub(crate) struct Pki {
    pub(crate) dir: TempDir,
    issuer: Issuer<'static, KeyPair>,
    pub(crate) ca_file: PathBuf,
}

/// One issued certificate: its files and its DER (to tell which one a
/// server presented).
pub(crate) struct Issued {
    pub(crate) cert: PathBuf,
    pub(crate) key: PathBuf,
    pub(crate) der: CertificateDer<'static>,
    pub(crate) cert_pem: String,
    pub(crate) key_pem: String,
}

impl Pki {
    /// A new CA, its certificate in `ca.pem` of a directory for `test`.
    pub(crate) fn new(test: &str) -> Pki {
        let dir = TempDir::new("tls", test);
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("memring test CA {test}"));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key).expect("CA certificate");
        let ca_file = dir.path("ca.pem");
        std::fs::write(&ca_file, cert.pem()).expect("write CA");
        Pki {
            dir,
            issuer: Issuer::new(params, key),
            ca_file,
        }
    }

    /// A certificate for `names` (DNS names or IP addresses) written as
    /// `<file>.pem` and `<file>.key`; a client certificate when `client`.
    pub(crate) fn issue(&self, file: &str, names: &[&str], client: bool) -> Issued {
        let key = KeyPair::generate().expect("key");
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<String>>())
                .expect("params");
        params.distinguished_name.push(DnType::CommonName, file);
        params.extended_key_usages = vec![if client {
            ExtendedKeyUsagePurpose::ClientAuth
        } else {
            ExtendedKeyUsagePurpose::ServerAuth
        }];
        let cert = params.signed_by(&key, &self.issuer).expect("sign");
        let (cert_path, key_path) = (
            self.dir.path(&format!("{file}.pem")),
            self.dir.path(&format!("{file}.key")),
        );
        let issued = Issued {
            cert: cert_path,
            key: key_path,
            der: cert.der().clone(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        };
        std::fs::write(&issued.cert, &issued.cert_pem).expect("write cert");
        std::fs::write(&issued.key, &issued.key_pem).expect("write key");
        issued
    }
}
