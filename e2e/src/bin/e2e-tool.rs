//! `e2e-tool`: the kind suite's helpers, shipped in the `havip-e2e-tools` image.
//!
//! `e2e-tool respond --port 8080 --name NODE` answers `NODE\n` to every connection
//! (the service behind the VIP, run on every node with hostNetwork);
//! `e2e-tool probe --target VIP:8080` connects every 20 ms and prints one JSON line
//! per probe (`{"start_ms":…,"end_ms":…,"outcome":{"Ok":"node"}}`), which the kind
//! provider turns into the same report as the local client's.

use clap::{Parser, Subcommand};
use havip_e2e::traffic::{ProberConfig, probe_stream, respond};
use std::io::Write;
use std::net::{Ipv6Addr, SocketAddr};
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(name = "e2e-tool", version, about)]
struct Args {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Answer `<name>\n` to every TCP connection on `[::]:<port>`.
    Respond {
        /// Port.
        #[arg(long, default_value_t = 8080)]
        port: u16,
        /// The name to answer with (the node's).
        #[arg(long)]
        name: String,
    },
    /// Connect to `target` every `interval-ms`, one JSON line per probe.
    Probe {
        /// VIP:port.
        #[arg(long)]
        target: SocketAddr,
        /// Milliseconds between connects.
        #[arg(long, default_value_t = 20)]
        interval_ms: u64,
        /// Milliseconds an accepted connection may take to deliver the responder's name
        /// before the probe counts as failed (`read_timeout`).
        #[arg(long, default_value_t = 50)]
        read_timeout_ms: u64,
    },
}

fn main() -> ExitCode {
    let args = Args::parse();
    let stop = AtomicBool::new(false);
    match args.command {
        Cmd::Respond { port, name } => match respond(SocketAddr::from((Ipv6Addr::UNSPECIFIED, port)), &name, &stop) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("e2e-tool respond: {e}");
                ExitCode::FAILURE
            }
        },
        Cmd::Probe { target, interval_ms, read_timeout_ms } => {
            let config = ProberConfig::new(target)
                .interval(Duration::from_millis(interval_ms.max(1)))
                .read_timeout(Duration::from_millis(read_timeout_ms.max(1)));
            let mut out = std::io::stdout().lock();
            probe_stream(&config, &stop, &mut |p| {
                if let Ok(line) = serde_json::to_string(p) {
                    let _ = writeln!(out, "{line}");
                    let _ = out.flush();
                }
            });
            ExitCode::SUCCESS
        }
    }
}
