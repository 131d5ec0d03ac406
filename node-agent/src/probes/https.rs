//! HTTPS readiness checks of a member's own server — the control-plane mode's
//! `GET /readyz` of the local kube-apiserver, verified with the cluster CA (and, where
//! the API server wants one, with a client certificate).

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Why an HTTPS check could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum HttpsCheckError {
    /// A PEM file could not be read or holds nothing usable.
    #[error("{what} {path}: {message}")]
    Pem {
        /// Which file.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
    /// The server name is neither a DNS name nor an IP address.
    #[error("serverName {0:?} is not a DNS name or an IP address")]
    ServerName(String),
}

/// How long a check may take unless set otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(500);

/// One HTTPS check: the path asked, the files the TLS client configuration is built from
/// (trusted CA, optional client certificate and key) and the name the server's
/// certificate must carry (`None`: the address connected to).
///
/// The files are read again whenever one of them changes (inode, size or modification
/// time):
/// `kubeadm certs renew` and CA rotations are picked up without a restart, and a file
/// that does not exist yet — an agent started as a systemd service before `kubeadm init`
/// wrote the cluster's certificates — only means "not ready" until it appears.
pub struct HttpsCheck {
    /// The path (`/readyz`).
    pub path: String,
    /// How long one check may take (TCP, TLS and the answer's status line).
    pub timeout: Duration,
    ca_file: PathBuf,
    client: Option<(PathBuf, PathBuf)>,
    server_name: Option<ServerName<'static>>,
    loaded: std::sync::Mutex<Loaded>,
}

/// The configuration last built and what it was built from.
#[derive(Default)]
struct Loaded {
    config: Option<Arc<rustls::ClientConfig>>,
    /// Inode, size and modification time of each file when it was last read.
    stamps: Vec<Option<(u64, u64, std::time::SystemTime)>>,
    /// The last failure reported (each distinct one is logged once).
    failure: Option<String>,
}

impl std::fmt::Debug for HttpsCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpsCheck")
            .field("path", &self.path)
            .field("ca_file", &self.ca_file)
            .field("client", &self.client)
            .field("server_name", &self.server_name)
            .finish()
    }
}

impl PartialEq for HttpsCheck {
    fn eq(&self, other: &Self) -> bool {
        self.path == other.path
            && self.ca_file == other.ca_file
            && self.client == other.client
            && self.server_name == other.server_name
    }
}

impl Eq for HttpsCheck {}

/// Reads an HTTP response's status line (at most 64 bytes) from `s`: whether its status
/// is 200 (`None`: nothing readable, or not a status line).
pub(super) async fn read_status_is_200<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> Option<bool> {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 64];
    let mut n = 0;
    while n < buf.len() {
        let read = s.read(&mut buf[n..]).await.ok()?;
        if read == 0 {
            break;
        }
        n += read;
        if buf[..n].contains(&b'\n') {
            break;
        }
    }
    status_is_200(&buf[..n])
}

/// Whether an HTTP response's first bytes are a status line with status 200 (`None`:
/// not a status line).
pub(super) fn status_is_200(first: &[u8]) -> Option<bool> {
    let line = std::str::from_utf8(first).ok()?;
    let mut words = line.split_whitespace();
    let version = words.next()?;
    Some(version.starts_with("HTTP/") && words.next() == Some("200"))
}

fn pem_error(what: &'static str, path: &Path, e: impl std::fmt::Display) -> HttpsCheckError {
    HttpsCheckError::Pem { what, path: path.to_owned(), message: e.to_string() }
}

/// A file's inode, size and modification time — what changes when it is rewritten or
/// replaced (`None`: it cannot be read). Also the standalone daemon's check of its files.
pub(crate) fn stamp(path: &Path) -> Option<(u64, u64, std::time::SystemTime)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.ino(), m.len(), m.modified().ok()?))
}

impl HttpsCheck {
    /// A check of `path` trusting the CA certificates in `ca_file`, presenting the client
    /// certificate in `client` (certificate chain file, key file) if given. Files that
    /// exist must be usable (a wrong path is found now); a file that does not exist yet is
    /// waited for (the check fails until it appears).
    pub fn new(
        path: &str,
        ca_file: &Path,
        client: Option<(&Path, &Path)>,
        server_name: Option<&str>,
    ) -> Result<HttpsCheck, HttpsCheckError> {
        let server_name = server_name
            .map(|s| ServerName::try_from(s.to_owned()).map_err(|_| HttpsCheckError::ServerName(s.to_owned())))
            .transpose()?;
        let check = HttpsCheck {
            path: path.to_owned(),
            timeout: DEFAULT_TIMEOUT,
            ca_file: ca_file.to_owned(),
            client: client.map(|(c, k)| (c.to_owned(), k.to_owned())),
            server_name,
            loaded: std::sync::Mutex::new(Loaded::default()),
        };
        if check.files().iter().all(|f| f.exists()) {
            let config = check.build()?;
            let mut l = check.loaded.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            l.stamps = check.files().iter().map(|f| stamp(f)).collect();
            l.config = Some(Arc::new(config));
        }
        Ok(check)
    }

    fn files(&self) -> Vec<&Path> {
        let mut f = vec![self.ca_file.as_path()];
        if let Some((c, k)) = &self.client {
            f.push(c);
            f.push(k);
        }
        f
    }

    fn build(&self) -> Result<rustls::ClientConfig, HttpsCheckError> {
        let ca_file = &self.ca_file;
        let mut roots = rustls::RootCertStore::empty();
        let cas = CertificateDer::pem_file_iter(ca_file).map_err(|e| pem_error("caFile", ca_file, e))?;
        for c in cas {
            roots.add(c.map_err(|e| pem_error("caFile", ca_file, e))?).map_err(|e| pem_error("caFile", ca_file, e))?;
        }
        if roots.is_empty() {
            return Err(pem_error("caFile", ca_file, "holds no certificate"));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots);
        Ok(match &self.client {
            None => builder.with_no_client_auth(),
            Some((cert_file, key_file)) => {
                let chain = CertificateDer::pem_file_iter(cert_file)
                    .map_err(|e| pem_error("clientCertFile", cert_file, e))?
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| pem_error("clientCertFile", cert_file, e))?;
                if chain.is_empty() {
                    return Err(pem_error("clientCertFile", cert_file, "holds no certificate"));
                }
                let key =
                    PrivateKeyDer::from_pem_file(key_file).map_err(|e| pem_error("clientKeyFile", key_file, e))?;
                builder.with_client_auth_cert(chain, key)?
            }
        })
    }

    /// The configuration to probe with: rebuilt when a file changed. A failure keeps the
    /// last good configuration (a file caught half-written) and is logged at `warn` once;
    /// `None` while no configuration could be built yet.
    fn config(&self) -> Option<Arc<rustls::ClientConfig>> {
        let stamps: Vec<_> = self.files().iter().map(|f| stamp(f)).collect();
        let mut l = self.loaded.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if l.config.is_some() && l.stamps == stamps {
            return l.config.clone();
        }
        let built = if stamps.iter().all(Option::is_some) {
            self.build()
        } else {
            let missing = self.files().into_iter().find(|f| !f.exists()).unwrap_or(&self.ca_file);
            Err(pem_error("file", missing, "does not exist (yet)"))
        };
        match built {
            Ok(c) => {
                if l.failure.take().is_some() || l.config.is_some() {
                    tracing::info!(ca_file = %self.ca_file.display(), "HTTPS check: certificates (re)loaded");
                }
                l.config = Some(Arc::new(c));
                l.stamps = stamps;
            }
            Err(e) => {
                let message = e.to_string();
                if l.failure.as_deref() != Some(message.as_str()) {
                    tracing::warn!(error = %message, kept_previous = l.config.is_some(), "HTTPS check: certificates unusable; the API server counts as not ready until they are");
                    l.failure = Some(message);
                }
                // Keep the previous configuration if there is one, until the files are
                // usable again (the stamps stay old, so they are read again next time).
            }
        }
        l.config.clone()
    }

    /// `GET <path>` over HTTPS at `addr` within `timeout`: healthy on status 200 from a
    /// server whose certificate the CA signed for the expected name.
    pub async fn probe(&self, addr: SocketAddr, timeout: Duration) -> bool {
        use tokio::io::AsyncWriteExt;
        let Some(config) = self.config() else { return false };
        let name = self.server_name.clone().unwrap_or_else(|| ServerName::IpAddress(addr.ip().into()));
        let connector = tokio_rustls::TlsConnector::from(config);
        let path = &self.path;
        let exchange = async {
            let tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
            let mut s = match connector.connect(name, tcp).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!(address = %addr, error = %e, "HTTPS check: TLS handshake failed");
                    return None;
                }
            };
            let request =
                format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: havip-agent\r\nConnection: close\r\n\r\n");
            s.write_all(request.as_bytes()).await.ok()?;
            read_status_is_200(&mut s).await
        };
        matches!(tokio::time::timeout(timeout, exchange).await, Ok(Some(true)))
    }
}
