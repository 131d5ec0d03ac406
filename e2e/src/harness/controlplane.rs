//! A real local control plane: etcd and kube-apiserver processes on this machine,
//! with generated certificates, a service-account signing key, RBAC authorization
//! and an admin kubeconfig.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let cp = havip_e2e::controlplane::ControlPlane::start(Default::default())?;
//! println!("export KUBECONFIG={}", cp.kubeconfig().display());
//! # Ok(()) }
//! ```
//!
//! Everything lives in one directory (a fresh temporary one unless given) that is
//! removed, with every process, when the `ControlPlane` is dropped — also when a
//! test panics. Start it from a thread that lives as long as you need it: the
//! processes are tied to the starting thread (`--pdeathsig`), so that they die even
//! when the harness is killed.

use crate::harness::certs::{self, Ca, CertError};
use crate::harness::testbin::{NotFound, TestBin};
use crate::host::process::{ManagedProcess, ProcessError, free_port, tail};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Errors of the control plane harness.
#[derive(Debug, thiserror::Error)]
pub enum ControlPlaneError {
    /// Test binaries missing.
    #[error(transparent)]
    NotFound(#[from] NotFound),
    /// Certificates could not be made.
    #[error(transparent)]
    Cert(#[from] CertError),
    /// A process could not be started.
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// A file could not be written.
    #[error("failed to write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A process did not become ready in time.
    #[error("{what} did not become ready within {timeout:?}; last log lines:\n{log}")]
    NotReady {
        /// etcd or kube-apiserver.
        what: &'static str,
        /// How long we waited.
        timeout: Duration,
        /// Its log tail.
        log: String,
    },
    /// A process exited while we waited for it.
    #[error("{what} exited during start-up; last log lines:\n{log}")]
    Exited {
        /// etcd or kube-apiserver.
        what: &'static str,
        /// Its log tail.
        log: String,
    },
    /// Other I/O.
    #[error("failed to {op}: {source}")]
    Io {
        /// What was attempted.
        op: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The kubeconfig could not be loaded into a client.
    #[error("failed to build a client from {path}: {message}")]
    Client {
        /// The kubeconfig.
        path: PathBuf,
        /// Why.
        message: String,
    },
}

/// How to start the control plane.
#[derive(Clone, Debug)]
pub struct ControlPlaneOptions {
    /// Address the API server listens on (and advertises). Default 127.0.0.1.
    pub bind_address: IpAddr,
    /// Further addresses the serving certificate must be valid for (e.g. the address
    /// network-namespace nodes reach the API server on).
    pub extra_sans: Vec<IpAddr>,
    /// A directory to keep everything in (created if missing, NOT removed on drop);
    /// default: a fresh temporary directory that is removed on drop.
    pub dir: Option<PathBuf>,
    /// The API server's secure port; default: a free port.
    pub api_port: Option<u16>,
    /// How long to wait for readiness.
    pub ready_timeout: Duration,
}

impl Default for ControlPlaneOptions {
    fn default() -> Self {
        Self {
            bind_address: IpAddr::V4(Ipv4Addr::LOCALHOST),
            extra_sans: Vec::new(),
            dir: None,
            api_port: None,
            ready_timeout: Duration::from_secs(90),
        }
    }
}

enum Dir {
    Temp(tempfile::TempDir),
    Kept(PathBuf),
}

impl Dir {
    fn path(&self) -> &Path {
        match self {
            Dir::Temp(t) => t.path(),
            Dir::Kept(p) => p,
        }
    }
}

/// A running etcd + kube-apiserver.
pub struct ControlPlane {
    // Field order matters: processes drop (stop) before the directory is removed.
    apiserver: Option<ManagedProcess>,
    etcd: Option<ManagedProcess>,
    etcd_args: Vec<String>,
    etcd_health: SocketAddr,
    testbin: TestBin,
    apiserver_args: Vec<String>,
    api_port: u16,
    bind_address: IpAddr,
    ca: Ca,
    ready_timeout: Duration,
    dir: Dir,
}

impl ControlPlane {
    /// Starts etcd and kube-apiserver and waits until the API server is ready.
    pub fn start(opts: ControlPlaneOptions) -> Result<Self, ControlPlaneError> {
        let testbin = TestBin::find()?;
        let dir =
            match &opts.dir {
                Some(p) => {
                    std::fs::create_dir_all(p)
                        .map_err(|source| ControlPlaneError::Io { op: format!("create {}", p.display()), source })?;
                    Dir::Kept(p.clone())
                }
                None => Dir::Temp(tempfile::Builder::new().prefix("havip-cp-").tempdir().map_err(|source| {
                    ControlPlaneError::Io { op: "create a temporary directory".to_owned(), source }
                })?),
            };
        let root = dir.path().to_owned();
        let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);

        // Certificates and keys.
        let ca = Ca::new()?;
        let mut sans = vec![loopback, IpAddr::V4(Ipv4Addr::new(10, 96, 0, 1))];
        if !opts.bind_address.is_unspecified() {
            sans.push(opts.bind_address);
        }
        sans.extend(opts.extra_sans.iter().copied());
        let serving = ca.serving(&sans)?;
        let admin = ca.client("havip-admin", Some("system:masters"))?;
        let (sa_key, sa_pub) = certs::service_account_key()?;
        let pki = root.join("pki");
        mkdir(&pki)?;
        write(&pki.join("ca.crt"), &ca.cert_pem)?;
        write(&pki.join("apiserver.crt"), &serving.cert)?;
        write(&pki.join("apiserver.key"), &serving.key)?;
        write(&pki.join("sa.key"), &sa_key)?;
        write(&pki.join("sa.pub"), &sa_pub)?;

        // etcd.
        let etcd_port = free_port(loopback)
            .map_err(|source| ControlPlaneError::Io { op: "find a free port for etcd".to_owned(), source })?;
        let peer_port = free_port(loopback)
            .map_err(|source| ControlPlaneError::Io { op: "find a free port for etcd peers".to_owned(), source })?;
        let etcd_args = vec![
            "--name=havip-e2e".to_owned(),
            format!("--data-dir={}", root.join("etcd").display()),
            format!("--listen-client-urls=http://127.0.0.1:{etcd_port}"),
            format!("--advertise-client-urls=http://127.0.0.1:{etcd_port}"),
            format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
            format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
            format!("--initial-cluster=havip-e2e=http://127.0.0.1:{peer_port}"),
            "--unsafe-no-fsync".to_owned(),
            "--log-level=warn".to_owned(),
        ];
        let mut etcd = ManagedProcess::spawn("etcd", &testbin.etcd(), &etcd_args, &[], &root.join("etcd.log"))?;
        wait_http_ok(&mut etcd, "etcd", SocketAddr::new(loopback, etcd_port), "/health", opts.ready_timeout)?;

        // kube-apiserver.
        let api_port = match opts.api_port {
            Some(p) => p,
            None => free_port(opts.bind_address).map_err(|source| ControlPlaneError::Io {
                op: "find a free port for kube-apiserver".to_owned(),
                source,
            })?,
        };
        let advertise = if opts.bind_address.is_unspecified() { loopback } else { opts.bind_address };
        let apiserver_args = vec![
            format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
            format!("--bind-address={}", opts.bind_address),
            format!("--advertise-address={advertise}"),
            format!("--secure-port={api_port}"),
            format!("--tls-cert-file={}", pki.join("apiserver.crt").display()),
            format!("--tls-private-key-file={}", pki.join("apiserver.key").display()),
            format!("--client-ca-file={}", pki.join("ca.crt").display()),
            format!("--service-account-key-file={}", pki.join("sa.pub").display()),
            format!("--service-account-signing-key-file={}", pki.join("sa.key").display()),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_owned(),
            "--api-audiences=https://kubernetes.default.svc.cluster.local".to_owned(),
            "--authorization-mode=RBAC".to_owned(),
            // Dual-stack, so that Services can ask for both families (the load-balancer tests).
            "--service-cluster-ip-range=10.96.0.0/12,fd00:10:96::/112".to_owned(),
            "--allow-privileged=true".to_owned(),
            // Nothing routes to the advertised address from pods here; do not maintain
            // the kubernetes Service endpoints.
            "--endpoint-reconciler-type=none".to_owned(),
            format!("--cert-dir={}", root.join("apiserver-certs").display()),
            "--profiling=false".to_owned(),
            "--v=1".to_owned(),
        ];
        write_kubeconfig(
            &root.join("kubeconfig"),
            &format!("https://{}", SocketAddr::new(advertise, api_port)),
            &ca.cert_pem,
            &admin,
            "havip-admin",
        )?;
        let mut cp = Self {
            apiserver: None,
            etcd: Some(etcd),
            etcd_args,
            etcd_health: SocketAddr::new(loopback, etcd_port),
            testbin,
            apiserver_args,
            api_port,
            bind_address: advertise,
            ca,
            ready_timeout: opts.ready_timeout,
            dir,
        };
        cp.start_apiserver()?;
        Ok(cp)
    }

    /// The directory that holds the certificates, data and logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The admin kubeconfig (user `havip-admin`, group `system:masters`).
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir().join("kubeconfig")
    }

    /// `https://<address>:<port>` of the API server.
    pub fn server_url(&self) -> String {
        format!("https://{}", SocketAddr::new(self.bind_address, self.api_port))
    }

    /// The API server's secure port.
    pub fn api_port(&self) -> u16 {
        self.api_port
    }

    /// The test binaries in use.
    pub fn testbin(&self) -> &TestBin {
        &self.testbin
    }

    /// The CA certificate (PEM).
    pub fn ca_pem(&self) -> &str {
        &self.ca.cert_pem
    }

    /// Writes a kubeconfig for user `cn` in `group`, authenticated by a client
    /// certificate signed by the cluster CA, and returns its path.
    pub fn kubeconfig_for(&self, cn: &str, group: Option<&str>) -> Result<PathBuf, ControlPlaneError> {
        let pem = self.ca.client(cn, group)?;
        let path = self.dir().join(format!("kubeconfig-{}", cn.replace([':', '/'], "_")));
        write_kubeconfig(&path, &self.server_url(), &self.ca.cert_pem, &pem, cn)?;
        Ok(path)
    }

    /// Writes a kubeconfig that authenticates with a bearer `token` (e.g. a
    /// service-account token) and returns its path.
    pub fn kubeconfig_with_token(&self, name: &str, token: &str) -> Result<PathBuf, ControlPlaneError> {
        use base64::Engine;
        let ca = base64::engine::general_purpose::STANDARD.encode(self.ca.cert_pem.as_bytes());
        let path = self.dir().join(format!("kubeconfig-{}", name.replace([':', '/'], "_")));
        let yaml = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: havip-lab\n  cluster:\n    server: {}\n    certificate-authority-data: {ca}\nusers:\n- name: {name}\n  user:\n    token: {token}\ncontexts:\n- name: havip-lab\n  context:\n    cluster: havip-lab\n    user: {name}\ncurrent-context: havip-lab\n",
            self.server_url()
        );
        write(&path, &yaml)?;
        Ok(path)
    }

    /// A `kubectl` command using the admin kubeconfig.
    pub fn kubectl(&self) -> Command {
        let mut c = Command::new(self.testbin.kubectl());
        c.env("KUBECONFIG", self.kubeconfig());
        c
    }

    /// A client using the admin kubeconfig.
    pub async fn client(&self) -> Result<kube::Client, ControlPlaneError> {
        client_from_kubeconfig(&self.kubeconfig()).await
    }

    /// Whether the API server process is running.
    pub fn apiserver_running(&mut self) -> bool {
        self.apiserver.as_mut().is_some_and(ManagedProcess::is_running)
    }

    /// Stops the API server (for API-outage scenarios); etcd keeps running.
    pub fn stop_apiserver(&mut self) {
        if let Some(mut p) = self.apiserver.take() {
            p.stop(Duration::from_secs(10));
        }
    }

    /// Starts the API server again (same port, certificates and data) and waits
    /// until it is ready. A no-op while it runs.
    pub fn start_apiserver(&mut self) -> Result<(), ControlPlaneError> {
        if self.apiserver_running() {
            return Ok(());
        }
        let log = self.dir().join("kube-apiserver.log");
        let mut p =
            ManagedProcess::spawn("kube-apiserver", &self.testbin.kube_apiserver(), &self.apiserver_args, &[], &log)?;
        let deadline = Instant::now() + self.ready_timeout;
        loop {
            if !p.is_running() {
                return Err(ControlPlaneError::Exited { what: "kube-apiserver", log: p.log_tail(30) });
            }
            let out = self.kubectl().args(["get", "--raw", "/readyz"]).output();
            if let Ok(out) = out
                && out.status.success()
                && String::from_utf8_lossy(&out.stdout).trim() == "ok"
            {
                break;
            }
            if Instant::now() > deadline {
                return Err(ControlPlaneError::NotReady {
                    what: "kube-apiserver",
                    timeout: self.ready_timeout,
                    log: p.log_tail(30),
                });
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        tracing::info!(url = %self.server_url(), "kube-apiserver ready");
        self.apiserver = Some(p);
        Ok(())
    }

    /// Stops etcd (SIGTERM; the API server keeps running and fails its requests).
    pub fn stop_etcd(&mut self) {
        if let Some(mut p) = self.etcd.take() {
            p.stop(Duration::from_secs(10));
        }
    }

    /// Starts etcd again (same data, ports and flags) and waits until it is healthy. A
    /// no-op while it runs.
    pub fn start_etcd(&mut self) -> Result<(), ControlPlaneError> {
        if self.etcd.as_mut().is_some_and(ManagedProcess::is_running) {
            return Ok(());
        }
        let log = self.dir().join("etcd.log");
        let mut p = ManagedProcess::spawn("etcd", &self.testbin.etcd(), &self.etcd_args, &[], &log)?;
        wait_http_ok(&mut p, "etcd", self.etcd_health, "/health", self.ready_timeout)?;
        self.etcd = Some(p);
        Ok(())
    }

    /// The last lines of the API server's and etcd's logs (for failure reports).
    pub fn logs_tail(&self, lines: usize) -> String {
        format!(
            "--- kube-apiserver ---\n{}\n--- etcd ---\n{}",
            tail(&self.dir().join("kube-apiserver.log"), lines),
            tail(&self.dir().join("etcd.log"), lines)
        )
    }

    /// Process ids of etcd and the API server (for `lab`'s state file).
    pub fn pids(&self) -> Vec<u32> {
        self.etcd
            .as_ref()
            .and_then(ManagedProcess::pid)
            .into_iter()
            .chain(self.apiserver.as_ref().and_then(ManagedProcess::pid))
            .collect()
    }
}

/// A client from a kubeconfig file.
pub async fn client_from_kubeconfig(path: &Path) -> Result<kube::Client, ControlPlaneError> {
    let err = |message: String| ControlPlaneError::Client { path: path.to_owned(), message };
    let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| err(e.to_string()))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .map_err(|e| err(e.to_string()))?;
    kube::Client::try_from(config).map_err(|e| err(e.to_string()))
}

fn mkdir(p: &Path) -> Result<(), ControlPlaneError> {
    std::fs::create_dir_all(p).map_err(|source| ControlPlaneError::Write { path: p.to_owned(), source })
}

fn write(p: &Path, content: &str) -> Result<(), ControlPlaneError> {
    std::fs::write(p, content).map_err(|source| ControlPlaneError::Write { path: p.to_owned(), source })
}

fn write_kubeconfig(
    path: &Path,
    server: &str,
    ca: &str,
    user: &certs::Pem,
    name: &str,
) -> Result<(), ControlPlaneError> {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
    let yaml = format!(
        "apiVersion: v1
kind: Config
clusters:
- name: havip-lab
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: {name}
  user:
    client-certificate-data: {cert}
    client-key-data: {key}
contexts:
- name: havip-lab
  context:
    cluster: havip-lab
    user: {name}
current-context: havip-lab
",
        ca = b64(ca),
        cert = b64(&user.cert),
        key = b64(&user.key),
    );
    write(path, &yaml)
}

/// Polls `GET path` over plain HTTP until it answers 200.
fn wait_http_ok(
    proc_: &mut ManagedProcess,
    what: &'static str,
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> Result<(), ControlPlaneError> {
    let deadline = Instant::now() + timeout;
    loop {
        if !proc_.is_running() {
            return Err(ControlPlaneError::Exited { what, log: proc_.log_tail(30) });
        }
        if http_get_ok(addr, path) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(ControlPlaneError::NotReady { what, timeout, log: proc_.log_tail(30) });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn http_get_ok(addr: SocketAddr, path: &str) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).is_err() {
        return false;
    }
    let mut buf = String::new();
    let _ = s.read_to_string(&mut buf);
    buf.starts_with("HTTP/1.0 200") || buf.starts_with("HTTP/1.1 200")
}
