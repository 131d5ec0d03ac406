//! Certificates for the local control plane: a CA, the API server's serving
//! certificate, client certificates, and the service-account signing key.

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use std::net::IpAddr;

/// A certificate and its private key, both PEM.
#[derive(Clone, Debug)]
pub struct Pem {
    /// The certificate.
    pub cert: String,
    /// The private key (PKCS#8).
    pub key: String,
}

/// Errors while generating certificates.
#[derive(Debug, thiserror::Error)]
#[error("failed to generate the {what} certificate: {source}")]
pub struct CertError {
    what: &'static str,
    #[source]
    source: rcgen::Error,
}

fn err(what: &'static str) -> impl FnOnce(rcgen::Error) -> CertError {
    move |source| CertError { what, source }
}

/// A certificate authority that signs the control plane's certificates.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    /// The CA certificate (PEM), for `--client-ca-file` and kubeconfigs.
    pub cert_pem: String,
}

impl Ca {
    /// A new self-signed CA.
    pub fn new() -> Result<Self, CertError> {
        let key = KeyPair::generate().map_err(err("CA"))?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(err("CA"))?;
        params.distinguished_name = dn("havip-e2e-ca", None);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let cert = params.self_signed(&key).map_err(err("CA"))?;
        Ok(Self { issuer: Issuer::new(params, key), cert_pem: cert.pem() })
    }

    /// A serving certificate for the API server, valid for `localhost`, the
    /// in-cluster service names and every address in `ips`.
    pub fn serving(&self, ips: &[IpAddr]) -> Result<Pem, CertError> {
        let key = KeyPair::generate().map_err(err("serving"))?;
        let mut params = CertificateParams::new(vec![
            "localhost".to_owned(),
            "kubernetes".to_owned(),
            "kubernetes.default".to_owned(),
            "kubernetes.default.svc".to_owned(),
        ])
        .map_err(err("serving"))?;
        params.subject_alt_names.extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
        params.distinguished_name = dn("kube-apiserver", None);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params.signed_by(&key, &self.issuer).map_err(err("serving"))?;
        Ok(Pem { cert: cert.pem(), key: key.serialize_pem() })
    }

    /// A client certificate for user `cn` in group `group` (e.g. `system:masters`).
    pub fn client(&self, cn: &str, group: Option<&str>) -> Result<Pem, CertError> {
        let key = KeyPair::generate().map_err(err("client"))?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(err("client"))?;
        params.distinguished_name = dn(cn, group);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &self.issuer).map_err(err("client"))?;
        Ok(Pem { cert: cert.pem(), key: key.serialize_pem() })
    }
}

/// A fresh key pair for signing service-account tokens: (private PKCS#8 PEM,
/// public SPKI PEM).
pub fn service_account_key() -> Result<(String, String), CertError> {
    let key = KeyPair::generate().map_err(err("service-account key"))?;
    Ok((key.serialize_pem(), key.public_key_pem()))
}

fn dn(cn: &str, org: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    if let Some(org) = org {
        dn.push(DnType::OrganizationName, org);
    }
    dn
}
