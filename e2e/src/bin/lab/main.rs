//! `lab`: a local havip lab on this machine.
//!
//! `lab up` starts a real control plane (etcd + kube-apiserver) in the background
//! and prints the line to `export KUBECONFIG=…`; `lab down` stops and removes
//! everything; `lab status` tells whether one runs; `lab demo` is the guided tour that
//! `make demo` runs (see `demo.rs`).

mod demo;
mod democp;
mod lifecycle;

use clap::{Parser, Subcommand};
use lifecycle::{alive, down, read_state, serve, start};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

/// A local havip lab: a real kube-apiserver and etcd on this machine.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Directory holding the lab's state, certificates, data and logs.
    #[arg(long, env = "HAVIP_LAB_DIR", default_value = "/tmp/havip-lab", global = true)]
    dir: PathBuf,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Start the lab in the background and print the `export KUBECONFIG=…` line.
    Up {
        /// How long to wait for the control plane to become ready, in seconds.
        #[arg(long, default_value_t = 120)]
        timeout: u64,
        /// Also create N node namespaces (plus a client namespace) with registered Node
        /// objects, an agent each, and the operator (root only; 0 = control plane only).
        #[arg(long, default_value_t = 0)]
        nodes: usize,
        /// A routed lab: a router namespace running FRR in front of the nodes, FRR on
        /// every node peering with it (eBGP, BFD), and a client behind the router in
        /// another subnet (needs --nodes; FRR from Debian's `frr` package).
        #[arg(long)]
        bgp: bool,
    },
    /// Stop the lab and remove everything it created.
    Down,
    /// Print whether a lab runs, and its KUBECONFIG.
    Status,
    /// The guided tour `make demo` runs after building havip (its step 1): builds or
    /// reuses the test binaries, starts a lab with two nodes, applies
    /// examples/hapair.yaml adapted to the lab, cuts the active node, fails back with a
    /// planned failover, and leaves the lab running (root only).
    Demo {
        /// How long to wait for the lab to start, in seconds.
        #[arg(long, default_value_t = 180)]
        timeout: u64,
        /// The routed tour (`make demo-bgp`): a router with FRR in front of the nodes,
        /// examples/hapair-bgp.yaml, and a client in another subnet.
        #[arg(long)]
        bgp: bool,
    },
    /// The control-plane VIP's tour (`make demo-control-plane`, root): three node
    /// namespaces with etcd, kube-apiserver and havip in control-plane mode; kills and
    /// cuts, kubectl through the VIP; removes everything at the end.
    DemoControlPlane,
    /// Run the lab in the foreground until SIGTERM or SIGINT (what `up` starts).
    #[command(hide = true)]
    Serve {
        /// Node namespaces.
        #[arg(long, default_value_t = 0)]
        nodes: usize,
        /// Routed (see `up --bgp`).
        #[arg(long)]
        bgp: bool,
    },
}

fn main() -> ExitCode {
    let args = Args::parse();
    if matches!(args.command, Cmd::Demo { .. } | Cmd::DemoControlPlane) {
        demo::init_tracing();
    } else {
        havip_e2e::host::logging::init_tracing();
    }
    let result = match args.command {
        Cmd::Up { timeout, nodes, bgp } => up(&args.dir, Duration::from_secs(timeout), nodes, bgp),
        Cmd::Down => down(&args.dir),
        Cmd::Status => status(&args.dir),
        Cmd::Demo { timeout, bgp } => demo::run(&args.dir, Duration::from_secs(timeout), bgp),
        Cmd::DemoControlPlane => democp::run(),
        Cmd::Serve { nodes, bgp } => serve(&args.dir, nodes, bgp),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lab: {e}");
            ExitCode::FAILURE
        }
    }
}

fn up(dir: &Path, timeout: Duration, nodes: usize, bgp: bool) -> Result<(), String> {
    if let Some(state) = read_state(dir).filter(|s| alive(s.pid)) {
        println!("# a lab is already running (pid {})", state.pid);
        println!("export KUBECONFIG={}", state.kubeconfig.display());
        return Ok(());
    }
    eprintln!("starting etcd and kube-apiserver (log: {}) …", dir.join("lab.log").display());
    let state = start(dir, timeout, nodes, bgp, None)?;
    println!("export KUBECONFIG={}", state.kubeconfig.display());
    eprintln!("lab is up: API server {}; `lab down` removes it", state.server);
    for (i, ns) in state.nodes.iter().enumerate() {
        eprintln!(
            "  node n{i}: ip netns exec {ns} …   (cut its cables: ip -n {} link set n{i}-data down)",
            state.switch.as_deref().unwrap_or("?")
        );
    }
    if let Some(c) = &state.client {
        eprintln!("  client: ip netns exec {c} …");
    }
    if let Some(r) = &state.routed {
        eprintln!(
            "  router: ip netns exec {} vtysh --vty_socket {} -c 'show bgp summary'",
            r.router,
            r.router_vty.display()
        );
        eprintln!("  client behind the router ({}): ip netns exec {} …", r.client_ip, r.client);
        let vips: Vec<String> = r.vips.iter().map(|v| format!("{v}/32")).collect();
        eprintln!("  routed VIPs (announceMode: BGP): {}", vips.join(", "));
    }
    Ok(())
}

fn status(dir: &Path) -> Result<(), String> {
    match read_state(dir) {
        Some(s) if alive(s.pid) => {
            println!("running (pid {}), API server {}", s.pid, s.server);
            println!("export KUBECONFIG={}", s.kubeconfig.display());
            Ok(())
        }
        Some(_) => Err("a lab state file exists but its process is gone: run `lab down`".to_owned()),
        None => Err("no lab is running: run `lab up`".to_owned()),
    }
}
