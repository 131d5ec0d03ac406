//! The kind suite's tooling on a machine where kind cannot create a cluster (no image
//! can be pulled): kind builds from Go modules and runs; the chart renders with the
//! exact values the kind provider installs it with (its own images, never pulled);
//! the suite's kind config parses. The provider's commands are unit-tested in
//! `e2e/src/harness/kind/commands.rs`; the scenarios are the ones `make e2e` runs.

use havip_e2e::kind::KindConfig;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn testbin(what: &str) -> Option<PathBuf> {
    let out = Command::new("bash").arg(repo().join("hack/testbin.sh")).arg(what).output().ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout).lines().last().map(PathBuf::from)
}

fn cfg(kind: PathBuf, helm: PathBuf) -> KindConfig {
    KindConfig {
        cluster: "havip-e2e".to_owned(),
        workers: 3,
        image_prefix: "havip".to_owned(),
        tag: "dev".to_owned(),
        kubeconfig: PathBuf::from("/tmp/havip-kind/kubeconfig"),
        kind,
        helm,
        kubectl: PathBuf::from("kubectl"),
        repo: repo(),
        node_image: Some("havip/kind-node:v1.37.2".to_owned()),
        previous: None,
    }
}

#[test]
fn kind_builds_from_go_modules_and_knows_the_suite_config() {
    if std::env::var_os("HAVIP_SKIP_KIND_BUILD").is_some() {
        eprintln!("SKIPPED: HAVIP_SKIP_KIND_BUILD is set");
        return;
    }
    let dir = testbin("kind").expect("hack/testbin.sh kind");
    let kind = dir.join("kind");
    let out = Command::new(&kind).arg("version").output().expect("kind version");
    let v = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success() && v.starts_with("kind v0.33.0"), "{v}");
    // The command the provider builds is accepted by this kind (flags exist).
    let c = cfg(kind.clone(), PathBuf::from("helm"));
    let argv = c.create_cluster();
    let help = Command::new(&kind).args(["create", "cluster", "--help"]).output().expect("help");
    let help = String::from_utf8_lossy(&help.stdout).into_owned();
    for flag in argv.iter().filter(|a| a.starts_with("--")) {
        assert!(help.contains(flag.as_str()), "kind create cluster has no {flag}:\n{help}");
    }
    let load = Command::new(&kind).args(["load", "docker-image", "--help"]).output().expect("help");
    assert!(String::from_utf8_lossy(&load.stdout).contains("--name"));
    // The suite's cluster config: one control plane, three workers.
    let y: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(repo().join("e2e/kind/cluster.yaml")).expect("read"))
            .expect("cluster.yaml");
    let roles: Vec<&str> = y["nodes"].as_sequence().expect("nodes").iter().filter_map(|n| n["role"].as_str()).collect();
    assert_eq!(roles, ["control-plane", "worker", "worker", "worker"]);
    assert_eq!(y["name"].as_str(), Some(c.cluster.as_str()));
}

#[test]
fn the_chart_renders_with_the_values_the_kind_provider_installs_it_with() {
    let Some(dir) = testbin("helm") else { panic!("hack/testbin.sh helm") };
    let helm = dir.join("helm");
    let c = cfg(PathBuf::from("kind"), helm.clone());
    let text = template_of(&helm, &c.install_chart());
    assert!(text.contains("image: havip/havip-agent:dev"), "{text}");
    assert!(text.contains("image: havip/havip-operator:dev"), "{text}");
    assert!(text.contains("imagePullPolicy: Never"), "{text}");
}

/// `helm upgrade --install NAME CHART <flags…>` run as `helm template NAME CHART <the same
/// --set/--set-string/--namespace>`: the rendered manifests (the test fails when helm does).
fn template_of(helm: &Path, install: &[String]) -> String {
    let mut args = vec!["template".to_owned(), "havip".to_owned(), install[4].clone()];
    let mut it = install.iter().skip(5);
    while let Some(a) = it.next() {
        if a == "--set" || a == "--set-string" || a == "--namespace" {
            args.push(a.clone());
            args.push(it.next().expect("value").clone());
        }
    }
    let out = Command::new(helm).args(&args).output().expect("helm template");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The upgrade scenario's previous release is in this clone's history (CI's clone is a full
/// one; a shallow clone fails here, in `make test`, rather than in the kind suite) and its
/// chart takes the values the suite installs it with, its images tagged `prev`.
#[test]
fn the_previous_release_is_in_the_history_and_its_chart_takes_the_suites_values() {
    let Some(dir) = testbin("helm") else { panic!("hack/testbin.sh helm") };
    let helm = dir.join("helm");
    let out = Command::new("bash").arg(repo().join("hack/previous-release.sh")).arg("commit").output().expect("run");
    let commit = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(out.status.success() && commit.len() == 40, "hack/previous-release.sh commit: {commit}");
    let tmp = tempfile::tempdir().expect("tempdir");
    let archive = Command::new("bash")
        .arg("-c")
        .arg(format!("git -C {} archive {commit} charts/havip | tar -x -C {}", repo().display(), tmp.path().display()))
        .output()
        .expect("git archive");
    assert!(
        archive.status.success(),
        "the previous release {commit} is not in this clone's history: {}",
        String::from_utf8_lossy(&archive.stderr)
    );
    let c = cfg(PathBuf::from("kind"), helm.clone());
    let text = template_of(&helm, &c.install_chart_from(&tmp.path().join("charts/havip"), "prev", false));
    assert!(text.contains("image: havip/havip-agent:prev"), "{text}");
    assert!(text.contains("image: havip/havip-operator:prev"), "{text}");
}

/// The recipe lines of `target` in the Makefile.
fn recipe(makefile: &str, target: &str) -> Vec<String> {
    let head = format!("{target}:");
    makefile
        .lines()
        .skip_while(|l| !l.starts_with(&head))
        .skip(1)
        .take_while(|l| l.starts_with('\t'))
        .map(|l| l.trim().to_owned())
        .collect()
}

#[test]
fn every_kind_entry_point_installs_what_it_needs_first() {
    let makefile = std::fs::read_to_string(repo().join("Makefile")).expect("Makefile");
    for target in ["kind-e2e", "kind-up", "kind-node-image"] {
        let lines = recipe(&makefile, target);
        assert_eq!(
            lines.first().map(String::as_str),
            Some("@bash hack/prereqs.sh kind"),
            "make {target} installs the kind suite's packages before anything else: {lines:?}"
        );
    }
    // What the kind mode installs: Docker and what builds the offline node image.
    let out = Command::new("bash")
        .arg(repo().join("hack/prereqs.sh"))
        .args(["list", "kind"])
        .output()
        .expect("prereqs.sh runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let listed = String::from_utf8_lossy(&out.stdout);
    for pkg in ["docker.io", "mmdebstrap", "libseccomp-dev", "zstd", "jq", "keepalived"] {
        assert!(listed.lines().any(|l| l == pkg), "the kind mode installs {pkg}: {listed}");
    }
}
