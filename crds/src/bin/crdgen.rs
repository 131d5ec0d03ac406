//! Writes the havip CRDs (generated from the Rust types) into the Helm chart.

use clap::Parser;
use std::path::PathBuf;

/// Generate the HAPair and FloatingIP CustomResourceDefinitions.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Where to write the YAML; `-` for standard output.
    #[arg(long, env = "HAVIP_CRDS_OUT", default_value = havip_crds::CRDS_PATH)]
    out: PathBuf,
    /// Do not write: exit 1 when the file differs from what the types generate.
    #[arg(long)]
    check: bool,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let yaml = match havip_crds::crds_yaml() {
        Ok(y) => y,
        Err(e) => {
            eprintln!("failed to serialize the CRDs: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    if args.out.as_os_str() == "-" {
        print!("{yaml}");
        return std::process::ExitCode::SUCCESS;
    }
    if args.check {
        let current = std::fs::read_to_string(&args.out).unwrap_or_default();
        if current != yaml {
            eprintln!("{} is out of date: run `make crds`", args.out.display());
            return std::process::ExitCode::FAILURE;
        }
        return std::process::ExitCode::SUCCESS;
    }
    if let Some(dir) = args.out.parent()
        && let Err(e) = std::fs::create_dir_all(dir)
    {
        eprintln!("failed to create {}: {e}", dir.display());
        return std::process::ExitCode::FAILURE;
    }
    if let Err(e) = std::fs::write(&args.out, yaml) {
        eprintln!("failed to write {}: {e}", args.out.display());
        return std::process::ExitCode::FAILURE;
    }
    eprintln!("wrote {}", args.out.display());
    std::process::ExitCode::SUCCESS
}
