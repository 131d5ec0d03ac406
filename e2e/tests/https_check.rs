//! The control-plane mode's readiness check (`apiServer:`): `GET /readyz` over HTTPS,
//! against a real TLS server on loopback — ready only on status 200 from a server whose
//! certificate the configured CA signed for the expected name; a client certificate is
//! presented where the server asks for one; certificate files that appear or change
//! later are picked up without a restart (an agent started before `kubeadm init`, a
//! `kubeadm certs renew`), and a file caught half-written keeps the last good set-up.

use havip_e2e::certs::{Ca, Pem};
use havip_node_agent::probes::https::HttpsCheck;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls;

const TIMEOUT: Duration = Duration::from_secs(2);

/// A TLS server on 127.0.0.1 answering every request with `status`, with the serving
/// certificate `serving`; with `client_ca` it requires a client certificate signed by it.
async fn server(serving: &Pem, client_ca: Option<&Ca>, status: &'static str) -> SocketAddr {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain = vec![CertificateDer::from_pem_slice(serving.cert.as_bytes()).expect("serving cert")];
    let key = PrivateKeyDer::from_pem_slice(serving.key.as_bytes()).expect("serving key");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("versions");
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(CertificateDer::from_pem_slice(ca.cert_pem.as_bytes()).expect("ca")).expect("root");
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .expect("client verifier");
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = Arc::new(builder.with_single_cert(chain, key).expect("server config"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut s) = acceptor.accept(tcp).await else { return };
                let mut buf = vec![0u8; 1024];
                let mut n = 0;
                while !buf[..n].windows(4).any(|w| w == b"\r\n\r\n") && n < buf.len() {
                    match s.read(&mut buf[n..]).await {
                        Ok(0) | Err(_) => return,
                        Ok(r) => n += r,
                    }
                }
                let body = if status.starts_with("200") { "ok" } else { "not ready" };
                let reply = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\n\r\n{body}", body.len());
                let _ = s.write_all(reply.as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
    addr
}

fn loopback() -> IpAddr {
    IpAddr::V4(Ipv4Addr::LOCALHOST)
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).expect("write");
}

#[tokio::test]
async fn ready_only_on_200_from_a_server_the_ca_vouches_for() {
    let ca = Ca::new().expect("ca");
    let other = Ca::new().expect("other ca");
    let dir = tempfile::tempdir().expect("dir");
    let ca_file = dir.path().join("ca.crt");
    write(&ca_file, &ca.cert_pem);
    let good = server(&ca.serving(&[loopback()]).expect("serving"), None, "200 OK").await;
    let failing = server(&ca.serving(&[loopback()]).expect("serving"), None, "500 Internal Server Error").await;
    let stranger = server(&other.serving(&[loopback()]).expect("serving"), None, "200 OK").await;
    // Signed by the CA, but not for 127.0.0.1: only for other addresses.
    let misnamed =
        server(&ca.serving(&[IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1))]).expect("serving"), None, "200 OK").await;

    let check = HttpsCheck::new("/readyz", &ca_file, None, None).expect("check");
    assert!(check.probe(good, TIMEOUT).await, "a ready API server the CA signed for 127.0.0.1");
    assert!(!check.probe(failing, TIMEOUT).await, "status 500 is not ready");
    assert!(!check.probe(stranger, TIMEOUT).await, "a certificate of another CA");
    assert!(!check.probe(misnamed, TIMEOUT).await, "a certificate for another address");
    // serverName: the certificate is checked for that name instead of the address.
    let by_name = HttpsCheck::new("/readyz", &ca_file, None, Some("kubernetes.default.svc")).expect("check");
    assert!(by_name.probe(misnamed, TIMEOUT).await, "serverName kubernetes.default.svc is in every serving cert");
    let wrong_name = HttpsCheck::new("/readyz", &ca_file, None, Some("elsewhere.example")).expect("check");
    assert!(!wrong_name.probe(good, TIMEOUT).await, "a name the certificate does not carry");
    // Nothing listening.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };
    assert!(!check.probe(closed, TIMEOUT).await, "refused is not ready");
}

#[tokio::test]
async fn a_client_certificate_is_presented_where_the_server_wants_one() {
    let ca = Ca::new().expect("ca");
    let dir = tempfile::tempdir().expect("dir");
    let ca_file = dir.path().join("ca.crt");
    write(&ca_file, &ca.cert_pem);
    let client = ca.client("havip-readyz", None).expect("client cert");
    let (cert_file, key_file) = (dir.path().join("client.crt"), dir.path().join("client.key"));
    write(&cert_file, &client.cert);
    write(&key_file, &client.key);
    let strict = server(&ca.serving(&[loopback()]).expect("serving"), Some(&ca), "200 OK").await;

    let anonymous = HttpsCheck::new("/readyz", &ca_file, None, None).expect("check");
    assert!(!anonymous.probe(strict, TIMEOUT).await, "the server refuses a client without a certificate");
    let with_cert = HttpsCheck::new("/readyz", &ca_file, Some((&cert_file, &key_file)), None).expect("check");
    assert!(with_cert.probe(strict, TIMEOUT).await, "with the client certificate");

    // A certificate of another CA is refused by the server.
    let other = Ca::new().expect("other").client("stranger", None).expect("client");
    let (oc, ok) = (dir.path().join("other.crt"), dir.path().join("other.key"));
    write(&oc, &other.cert);
    write(&ok, &other.key);
    let stranger = HttpsCheck::new("/readyz", &ca_file, Some((&oc, &ok)), None).expect("check");
    assert!(!stranger.probe(strict, TIMEOUT).await, "a client certificate the server's CA did not sign");
}

#[tokio::test]
async fn certificates_that_appear_or_change_later_are_picked_up() {
    let ca = Ca::new().expect("ca");
    let renewed_ca = Ca::new().expect("renewed ca");
    let dir = tempfile::tempdir().expect("dir");
    let ca_file = dir.path().join("pki").join("ca.crt");
    let server_a = server(&ca.serving(&[loopback()]).expect("serving"), None, "200 OK").await;
    let server_b = server(&renewed_ca.serving(&[loopback()]).expect("serving"), None, "200 OK").await;

    // Before `kubeadm init`: no CA file yet — accepted, not ready.
    let check = HttpsCheck::new("/readyz", &ca_file, None, None).expect("a missing file is waited for");
    assert!(!check.probe(server_a, TIMEOUT).await, "not ready without the CA");
    std::fs::create_dir_all(ca_file.parent().expect("parent")).expect("mkdir");
    write(&ca_file, &ca.cert_pem);
    assert!(check.probe(server_a, TIMEOUT).await, "the CA written later is read");

    // Half-written: the last good CA stays in use.
    write(&ca_file, "-----BEGIN CERTIFICATE-----\nMIIB");
    assert!(check.probe(server_a, TIMEOUT).await, "a half-written CA file keeps the last good one");

    // Rotated to another CA: the new one is trusted, the old one no longer.
    write(&ca_file, &renewed_ca.cert_pem);
    assert!(check.probe(server_b, TIMEOUT).await, "the rotated CA is read");
    assert!(!check.probe(server_a, TIMEOUT).await, "the old CA is no longer trusted");
}

#[test]
fn unusable_files_that_exist_are_refused_at_start() {
    let dir = tempfile::tempdir().expect("dir");
    let ca_file = dir.path().join("ca.crt");
    write(&ca_file, "not a certificate\n");
    let e = HttpsCheck::new("/readyz", &ca_file, None, None).expect_err("a CA file without a certificate");
    assert!(e.to_string().contains("caFile") && e.to_string().contains("ca.crt"), "{e}");
    let e = HttpsCheck::new("/readyz", &ca_file, None, Some("not a name!")).expect_err("a bad server name");
    assert!(e.to_string().contains("serverName"), "{e}");
}
