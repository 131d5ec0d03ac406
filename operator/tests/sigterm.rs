//! The operator binary starts, parses its flags and exits cleanly on SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

#[test]
fn exits_cleanly_on_sigterm() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_havip-operator"))
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .args(["--log-format", "json"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("starts");
    // Wait for the start-up log line: then the signal handlers are installed.
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let first = lines.next().expect("a log line").expect("utf-8");
    assert!(first.contains("havip-operator starting"), "{first}");
    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().expect("kill");
    assert!(status.success());
    let exit = child.wait().expect("exits");
    assert!(exit.success(), "exit status {exit}");
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(rest.iter().any(|l| l.contains("shutting down") && l.contains("SIGTERM")), "{rest:?}");
}

#[test]
fn refuses_bad_flags() {
    let out = Command::new(env!("CARGO_BIN_EXE_havip-operator"))
        .args(["--metrics-address", "not-an-address"])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--metrics-address"));
}
