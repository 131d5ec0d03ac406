//! Where the pinned test binaries (kube-apiserver, etcd, kubectl) live.
//!
//! Built by `hack/testbin.sh` (`make testbin`) into `$HAVIP_CACHE/testbin/…`
//! (default `~/.cache/havip`), or provided by the user in `$KUBEBUILDER_ASSETS`
//! (the layout `setup-envtest` produces).

use std::path::{Path, PathBuf};

/// The Kubernetes version the harness is pinned to (must match `hack/testbin.sh`).
pub const K8S_VERSION: &str = "1.37.2";
/// The etcd version the harness is pinned to (must match `hack/testbin.sh`).
pub const ETCD_VERSION: &str = "3.7.0";

/// The test binaries could not be found.
#[derive(Debug, thiserror::Error)]
#[error(
    "failed to find {binary} in {searched}: run `make testbin` (builds kube-apiserver v{K8S_VERSION}, etcd v{ETCD_VERSION} and kubectl from Go modules), or set KUBEBUILDER_ASSETS to a directory that holds them"
)]
pub struct NotFound {
    binary: &'static str,
    searched: String,
}

/// The directory that holds kube-apiserver, etcd and kubectl.
#[derive(Clone, Debug)]
pub struct TestBin {
    dir: PathBuf,
}

impl TestBin {
    /// Finds the binaries: `$HAVIP_TESTBIN_DIR`, then `$KUBEBUILDER_ASSETS`, then the cache.
    pub fn find() -> Result<Self, NotFound> {
        let mut candidates = Vec::new();
        for var in ["HAVIP_TESTBIN_DIR", "KUBEBUILDER_ASSETS"] {
            if let Some(v) = std::env::var_os(var).filter(|v| !v.is_empty()) {
                candidates.push(PathBuf::from(v));
            }
        }
        let cache = std::env::var_os("HAVIP_CACHE")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/havip")))
            .unwrap_or_else(|| PathBuf::from("/root/.cache/havip"));
        candidates.push(cache.join(format!("testbin/k8s-{K8S_VERSION}-etcd-{ETCD_VERSION}")));
        for binary in ["kube-apiserver", "etcd", "kubectl"] {
            if !candidates.iter().any(|d| d.join(binary).is_file()) {
                return Err(NotFound {
                    binary,
                    searched: candidates.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", "),
                });
            }
        }
        // The first candidate that holds all three wins.
        let dir = candidates
            .into_iter()
            .find(|d| ["kube-apiserver", "etcd", "kubectl"].iter().all(|b| d.join(b).is_file()))
            .ok_or(NotFound {
                binary: "kube-apiserver, etcd and kubectl together",
                searched: "the candidate directories".to_owned(),
            })?;
        Ok(Self { dir })
    }

    /// Path of kube-apiserver.
    pub fn kube_apiserver(&self) -> PathBuf {
        self.dir.join("kube-apiserver")
    }
    /// Path of etcd.
    pub fn etcd(&self) -> PathBuf {
        self.dir.join("etcd")
    }
    /// Path of kubectl.
    pub fn kubectl(&self) -> PathBuf {
        self.dir.join("kubectl")
    }
    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}
