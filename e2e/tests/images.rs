//! The container images: where a Docker engine is reachable, `hack/images.sh` builds
//! them (static binaries on `scratch`) and each binary answers `--version` inside its
//! image. Without an engine the test says SKIPPED — unless `HAVIP_REQUIRE_DOCKER=1`
//! (CI starts one with `hack/dockerd.sh`), where a missing engine is a failure.

use std::path::PathBuf;
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn engine_reachable() -> bool {
    Command::new("docker")
        .args(["version", "--format", "{{.Server.Version}}"])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn images_build_and_each_binary_answers_version_inside_its_image() {
    if !engine_reachable() {
        assert!(
            std::env::var("HAVIP_REQUIRE_DOCKER").as_deref() != Ok("1"),
            "HAVIP_REQUIRE_DOCKER=1 but no Docker engine is reachable (DOCKER_HOST={:?})",
            std::env::var("DOCKER_HOST")
        );
        eprintln!("SKIPPED: no Docker engine reachable (start one with `eval \"$(hack/dockerd.sh start)\"`)");
        return;
    }
    let tag = format!("test-{}", std::process::id());
    let out = Command::new("bash")
        .arg(repo().join("hack/images.sh"))
        .env("IMAGE_PREFIX", "havip-test")
        .env("TAG", &tag)
        .output()
        .expect("run hack/images.sh");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "hack/images.sh failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let version = env!("CARGO_PKG_VERSION");
    for (image, bin) in
        [("havip-operator", "havip-operator"), ("havip-agent", "havip-agent"), ("havip-e2e-tools", "e2e-tool")]
    {
        let reference = format!("havip-test/{image}:{tag}");
        assert!(stdout.contains(&reference), "{reference} not reported built:\n{stdout}");
        let run = Command::new("docker")
            .args(["run", "--rm", "--network", "none", &reference, "--version"])
            .output()
            .expect("docker run");
        let said = String::from_utf8_lossy(&run.stdout).into_owned();
        assert!(run.status.success(), "{reference} --version: {said}{}", String::from_utf8_lossy(&run.stderr));
        assert_eq!(said.trim(), format!("{bin} {version}"), "{reference}");
        let size: u64 = Command::new("docker")
            .args(["image", "inspect", "-f", "{{.Size}}", &reference])
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .expect("image size");
        assert!(size < 64 << 20, "{reference} is {size} bytes: a static binary on scratch should be far smaller");
        let _ = Command::new("docker").args(["rmi", "-f", &reference]).output();
    }
}
