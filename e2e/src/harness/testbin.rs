//! Where the pinned test binaries (kube-apiserver, etcd, kubectl; MetalLB) live.
//!
//! Built by `hack/testbin.sh` (`make testbin`) into `$HAVIP_CACHE/testbin/…`
//! (default `~/.cache/havip`), or provided by the user in `$KUBEBUILDER_ASSETS`
//! (the layout `setup-envtest` produces). MetalLB's controller, speaker and CRDs
//! ([`MetalLbBin`]) come from `hack/testbin.sh metallb` only.

use std::path::{Path, PathBuf};

/// The Kubernetes version the harness is pinned to (must match `hack/testbin.sh`).
pub const K8S_VERSION: &str = "1.37.2";
/// The etcd version the harness is pinned to (must match `hack/testbin.sh`).
pub const ETCD_VERSION: &str = "3.7.0";

/// The MetalLB version the harness is pinned to (must match `hack/testbin.sh`).
pub const METALLB_VERSION: &str = "0.15.2";

/// `$HAVIP_CACHE`, else `~/.cache/havip`.
fn cache_dir() -> PathBuf {
    std::env::var_os("HAVIP_CACHE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/havip")))
        .unwrap_or_else(|| PathBuf::from("/root/.cache/havip"))
}

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
        candidates.push(cache_dir().join(format!("testbin/k8s-{K8S_VERSION}-etcd-{ETCD_VERSION}")));
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

/// MetalLB's binaries or CRDs are not in the cache.
#[derive(Debug, thiserror::Error)]
#[error(
    "MetalLB v{METALLB_VERSION} is not built ({missing} missing in {dir}): build it with `bash hack/testbin.sh metallb`"
)]
pub struct MetalLbNotFound {
    missing: String,
    dir: String,
}

/// MetalLB's `controller` and `speaker` and its CRDs, as `hack/testbin.sh metallb` leaves
/// them in `$HAVIP_CACHE/testbin/metallb-<version>/` (`controller`, `speaker`,
/// `crds/*.yaml` copied from the module's `config/crd/bases`).
#[derive(Clone, Debug)]
pub struct MetalLbBin {
    dir: PathBuf,
}

impl MetalLbBin {
    /// Finds them: `$HAVIP_METALLB_DIR` (same layout), else the cache.
    pub fn find() -> Result<Self, MetalLbNotFound> {
        let dir = std::env::var_os("HAVIP_METALLB_DIR")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| cache_dir().join(format!("testbin/metallb-{METALLB_VERSION}")));
        let bin = Self { dir };
        let missing = |what: &str| MetalLbNotFound { missing: what.to_owned(), dir: bin.dir.display().to_string() };
        for (what, path) in [("controller", bin.controller()), ("speaker", bin.speaker())] {
            if !path.is_file() {
                return Err(missing(what));
            }
        }
        if !bin.crds_dir().join(".complete").is_file() {
            return Err(missing("crds/"));
        }
        Ok(bin)
    }

    /// The controller (IP address allocation).
    pub fn controller(&self) -> PathBuf {
        self.dir.join("controller")
    }

    /// The speaker (memberlist, ARP/NDP answers).
    pub fn speaker(&self) -> PathBuf {
        self.dir.join("speaker")
    }

    /// The directory of the CRD YAML files.
    pub fn crds_dir(&self) -> PathBuf {
        self.dir.join("crds")
    }

    /// The CRD YAML files, sorted.
    pub fn crd_files(&self) -> std::io::Result<Vec<PathBuf>> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(self.crds_dir())?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
            .collect();
        files.sort();
        Ok(files)
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}
