//! The plugin's files outside the code: the krew manifest (`plugins/krew/havip.yaml`)
//! has the structure krew needs and agrees with the binary and the workspace version;
//! the exit-code table of `docs/plugin.md` is the one the code has.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use kubectl_havip::exit;
use std::collections::BTreeSet;
use std::path::Path;

fn repo_file(path: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn str_at<'a>(v: &'a serde_yaml::Value, path: &[&str]) -> &'a str {
    let mut cur = v;
    for k in path {
        cur = cur.get(*k).unwrap_or_else(|| panic!("missing {}", path.join(".")));
    }
    cur.as_str().unwrap_or_else(|| panic!("{} is not a string: {cur:?}", path.join(".")))
}

#[test]
fn the_krew_manifest_names_the_binary_on_every_platform() {
    let m: serde_yaml::Value = serde_yaml::from_str(&repo_file("plugins/krew/havip.yaml")).expect("valid YAML");
    assert_eq!(str_at(&m, &["apiVersion"]), "krew.googlecontainertools.github.com/v1alpha2");
    assert_eq!(str_at(&m, &["kind"]), "Plugin");
    let name = str_at(&m, &["metadata", "name"]);
    let bin = env!("CARGO_BIN_EXE_kubectl-havip");
    let bin_name = Path::new(bin).file_name().unwrap().to_str().unwrap();
    assert_eq!(format!("kubectl-{name}"), bin_name, "krew installs plugin NAME as kubectl-NAME");

    let version = str_at(&m, &["spec", "version"]);
    assert_eq!(version, format!("v{}", env!("CARGO_PKG_VERSION")), "the manifest's version is the workspace's");
    let homepage = str_at(&m, &["spec", "homepage"]);
    assert!(homepage.starts_with("https://"), "{homepage}");
    let short = str_at(&m, &["spec", "shortDescription"]);
    assert!(!short.is_empty() && short.len() <= 50, "krew-index wants a short one: {short:?}");
    let description = str_at(&m, &["spec", "description"]);
    assert!(description.contains("kubectl havip list"), "{description}");

    let platforms = m["spec"]["platforms"].as_sequence().expect("spec.platforms");
    let mut seen = BTreeSet::new();
    for p in platforms {
        let os = str_at(p, &["selector", "matchLabels", "os"]);
        let arch = str_at(p, &["selector", "matchLabels", "arch"]);
        assert!(seen.insert((os.to_owned(), arch.to_owned())), "{os}/{arch} twice");
        assert_eq!(str_at(p, &["bin"]), bin_name, "{os}/{arch}");
        let uri = str_at(p, &["uri"]);
        assert_eq!(
            uri,
            format!("{homepage}/releases/download/{version}/kubectl-havip-{version}-{os}-{arch}.tar.gz"),
            "the archive of {os}/{arch}"
        );
        let sha = str_at(p, &["sha256"]);
        assert!(
            sha.len() == 64 && sha.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()),
            "{os}/{arch}: sha256 must be 64 lowercase hex digits (64 zeros until a release): {sha:?}"
        );
        let files = p["files"].as_sequence().expect("files");
        assert!(
            files.iter().any(|f| f["from"].as_str() == Some(bin_name)),
            "{os}/{arch}: the archive's binary is installed"
        );
        // Every other file the archive must hold is in the repository, so that a release
        // can pack it (krew-index wants the licence in the archive).
        for f in files.iter().filter_map(|f| f["from"].as_str()).filter(|f| *f != bin_name) {
            assert!(!repo_file(f).trim().is_empty(), "{os}/{arch}: {f} is packed but the repository has none");
        }
    }
    // The licence the archives ship is the one every crate declares.
    let license = repo_file("LICENSE");
    assert!(
        license.contains("Apache License") && license.contains("Version 2.0, January 2004"),
        "LICENSE is the Apache License 2.0"
    );
    assert!(repo_file("Cargo.toml").contains("license = \"Apache-2.0\""), "the workspace declares Apache-2.0");
    let want: BTreeSet<(String, String)> =
        [("linux", "amd64"), ("linux", "arm64"), ("darwin", "amd64"), ("darwin", "arm64")]
            .iter()
            .map(|(o, a)| ((*o).to_owned(), (*a).to_owned()))
            .collect();
    assert_eq!(seen, want);
}

#[test]
fn the_docs_list_the_exit_codes_of_the_code() {
    let doc = repo_file("docs/plugin.md");
    let section = doc.split("\n## Exit codes\n").nth(1).expect("docs/plugin.md has an Exit codes section");
    let section = section.split("\n## ").next().unwrap_or(section);
    let rows: Vec<(u8, String)> = section
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.trim().trim_matches('|').split('|').map(str::trim).collect();
            Some((cells.first()?.parse().ok()?, (*cells.get(1)?).to_owned()))
        })
        .collect();
    let code: Vec<(u8, String)> = exit::ALL.iter().map(|(c, n)| (*c, (*n).to_owned())).collect();
    assert_eq!(rows, code, "docs/plugin.md's exit-code table and kubectl_havip::exit::ALL");
}
