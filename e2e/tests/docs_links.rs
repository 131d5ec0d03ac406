//! The documentation's links: every relative link of the README, `docs/`, `e2e/README.md`
//! and the book's table of contents names a file of the repository, and every `#anchor`
//! a heading of its target (GitHub's slugs, which the book keeps). External links are not
//! followed (this machine cannot reach them).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The markdown files the documentation is made of.
fn documents() -> Vec<PathBuf> {
    let root = repo();
    let mut out = vec![root.join("README.md"), root.join("e2e/README.md")];
    let mut dirs = vec![root.join("docs")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("docs/ is readable").flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "md") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped, spaces
/// to `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a markdown file's headings (outside code blocks), with GitHub's `-1`,
/// `-2` suffixes for repeated ones.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let heading = line.trim_start_matches('#');
        let base = slug(&heading.replace('`', ""));
        let mut a = base.clone();
        let mut n = 1;
        while out.contains(&a) {
            a = format!("{base}-{n}");
            n += 1;
        }
        out.insert(a);
    }
    out
}

/// The targets of the inline links `[text](target)` of a markdown text, outside code.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Inline code spans are not links.
        let mut plain = String::new();
        for (i, part) in line.split('`').enumerate() {
            if i % 2 == 0 {
                plain.push_str(part);
            }
        }
        let mut rest = plain.as_str();
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            let target = after[..end].split_whitespace().next().unwrap_or("").to_owned();
            out.push(target);
            rest = &after[end..];
        }
    }
    out
}

fn broken_links() -> Vec<String> {
    let mut broken = Vec::new();
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).expect("readable");
        let name = doc.strip_prefix(repo()).unwrap_or(&doc).display().to_string();
        for target in links(&text) {
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let file = if path.is_empty() { doc.clone() } else { doc.parent().unwrap_or(Path::new(".")).join(path) };
            if !file.exists() {
                broken.push(format!("{name}: {target}: no such file"));
                continue;
            }
            if let Some(a) = anchor
                && file.extension().is_some_and(|x| x == "md")
            {
                let there = std::fs::read_to_string(&file).unwrap_or_default();
                if !anchors(&there).contains(a) {
                    broken.push(format!("{name}: {target}: no heading with that anchor"));
                }
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_of_the_documentation_resolves() {
    let broken = broken_links();
    assert!(broken.is_empty(), "{} broken link(s):\n{}", broken.len(), broken.join("\n"));
}

#[test]
fn the_checker_finds_what_is_broken() {
    assert_eq!(slug("The epoch's domain"), "the-epochs-domain");
    assert_eq!(slug("`kubectl havip` and Events"), "kubectl-havip-and-events");
    let a = anchors("# A\n## B b\n```\n# not a heading\n```\n## B b\n");
    assert_eq!(a, ["a", "b-b", "b-b-1"].iter().map(|s| (*s).to_owned()).collect());
    assert_eq!(links("see [x](a.md#b) and `[y](z.md)` and [w](https://e.org)"), ["a.md#b", "https://e.org"]);
}
