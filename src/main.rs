//! The `gpu-warden` binary: parse the command line, set up logging, run the agent
//! (`agent::build::run`), and turn the outcome into an exit code and one line on stderr.

use anyhow::Context;
use clap::Parser;
use gpu_warden::config::{Cli, LogFormat};
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    if let Err(e) = cli.validate() {
        eprintln!("gpu-warden: error: {e}");
        return ExitCode::from(2);
    }
    if let Err(e) = init_logging(&cli) {
        eprintln!("gpu-warden: error: {}", chain(&e));
        return ExitCode::from(2);
    }
    match gpu_warden::agent::build::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        // One line on stderr, whatever the log format: the cause chain, each cause once.
        Err(e) => {
            eprintln!("gpu-warden: error: {}", chain(&e.into()));
            ExitCode::FAILURE
        }
    }
}

/// `e` and its causes joined with ": ", skipping a cause whose text the previous one
/// already ends with (thiserror messages often quote their source).
fn chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        // Some causes (kube's YAML errors) span lines with a caret under the column.
        let text = cause
            .to_string()
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.chars().all(|c| "|^ ".contains(c)))
            .collect::<Vec<_>>()
            .join(" ");
        if !out.ends_with(&text) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
    }
    out
}

fn init_logging(cli: &Cli) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(&cli.log).with_context(|| {
        format!(
            "--log {:?} is not a valid filter (e.g. info, gpu_warden=debug)",
            cli.log
        )
    })?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match cli.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    }
    .map_err(|e| anyhow::anyhow!("cannot set up logging: {e}"))
}
