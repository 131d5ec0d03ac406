//! `bench-report`: turns the benchmark JSON lines in `docs/bench/` into
//! `docs/benchmarks.md`.
//!
//! - `bench-report meta --name failover --command "…"` prints the first line of a
//!   results file: what ran, when, and on which machine (CPUs, kernel, CPU model, load).
//! - `bench-report render --dir docs/bench --out docs/benchmarks.md` reads every
//!   `<name>-<YYYY-MM-DD>[-N].jsonl` file and writes the report: for each kind of result
//!   the newest file that has it, with its command, date and machine, then a summary of
//!   the earlier files.
//!
//! The inputs are the JSON lines that `bench-failover`, `bench-k8s`, `bench-operator` and `bench-scale`
//! print; lines of unknown shape are ignored. Rows computed from other projects'
//! documented defaults (`computed_from_documented_defaults`) are labelled as such.
//! `make bench` runs every benchmark and then this.
//!
//! The report's sections live next to this file: [`runs`] (files and lines),
//! [`markdown`], one module per section ([`failover`], [`controlplane`], [`timeline`], [`idle`], [`api`],
//! [`operator`], [`scale`]) and [`render`](mod@render), which puts them together.

mod api;
mod controlplane;
mod failover;
mod idle;
mod markdown;
mod operator;
mod render;
mod runs;
mod scale;
#[cfg(test)]
mod tests;
mod timeline;

use clap::{Parser, Subcommand};
use render::render;
use runs::{Kind, load_dir, meta_line, newest};
use std::path::PathBuf;
use timeline::timeline_svg;

/// Renders docs/benchmarks.md from the JSON lines in docs/bench/.
#[derive(Parser, Debug)]
#[command(about)]
struct Args {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Print the metadata line that starts a results file.
    Meta {
        /// The benchmark's name (the file name's prefix).
        #[arg(long)]
        name: String,
        /// The command that produces the results.
        #[arg(long)]
        command: String,
    },
    /// Write the report from every results file in a directory.
    Render {
        /// Directory of the `<name>-<date>[-N].jsonl` files.
        #[arg(long, default_value = "docs/bench")]
        dir: PathBuf,
        /// The Markdown file to write.
        #[arg(long, default_value = "docs/benchmarks.md")]
        out: PathBuf,
    },
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    match args.command {
        Cmd::Meta { name, command } => {
            println!("{}", meta_line(&name, &command));
            std::process::ExitCode::SUCCESS
        }
        Cmd::Render { dir, out } => {
            let files = match load_dir(&dir) {
                Ok(f) => f,
                Err(e) => {
                    eprintln!("bench-report: {e}");
                    return std::process::ExitCode::FAILURE;
                }
            };
            let text = render(&files);
            if let Err(e) = std::fs::write(&out, text) {
                eprintln!("bench-report: failed to write {}: {e}", out.display());
                return std::process::ExitCode::FAILURE;
            }
            // The pictures the report links, next to their results files.
            if let Some((name, svg)) = newest(&files, Kind::Failover).and_then(timeline_svg) {
                let path = dir.join(&name);
                if let Err(e) = std::fs::write(&path, svg) {
                    eprintln!("bench-report: failed to write {}: {e}", path.display());
                    return std::process::ExitCode::FAILURE;
                }
            }
            eprintln!("bench-report: wrote {} from {} file(s) in {}", out.display(), files.len(), dir.display());
            std::process::ExitCode::SUCCESS
        }
    }
}
