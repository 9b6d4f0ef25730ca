//! The `gpu-warden` binary: parse the command line, set up logging, run the agent
//! (`agent::build::run`) or, as `gpu-warden extender`, the scheduler extender
//! (`extender::run`), and turn the outcome into an exit code and one line on stderr.
//! `gpu-warden check-config` validates configuration files with both parsers and exits.

use anyhow::Context;
use clap::{Parser, Subcommand};
use gpu_warden::config::check::{check_files, CheckConfigCli};
use gpu_warden::config::{Cli, LogArgs, LogFormat};
use gpu_warden::extender::config::ExtenderCli;
use std::process::ExitCode;

/// gpu-warden: GPU metrics, free-VRAM node annotations and an OOM guard for Kubernetes nodes.
///
/// Without a subcommand it runs the per-node agent with the options below.
// The agent's flags and the two subcommands in one clap command, so `--help` lists the
// subcommands and each subcommand's `--help` prints its own usage line (issue 39: argv was
// dispatched by hand and neither was listed). Agent flags and a subcommand exclude each
// other: `gpu-warden --backend sim extender` is refused rather than half applied.
#[derive(Debug, Parser)]
#[command(
    name = "gpu-warden",
    version,
    long_about = None,
    args_conflicts_with_subcommands = true
)]
struct Top {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    agent: Cli,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// kube-scheduler's HTTP extender: places GPU pods by the free VRAM the agents publish.
    Extender(ExtenderCli),
    /// Validate guard and extender policy files with the programs' own parsers, then exit.
    CheckConfig(CheckConfigCli),
}

fn main() -> ExitCode {
    let top = Top::parse();
    match top.command {
        Some(Command::Extender(cli)) => extender(cli),
        Some(Command::CheckConfig(cli)) => check_config(&cli),
        None => agent(top.agent),
    }
}

fn agent(cli: Cli) -> ExitCode {
    if let Err(e) = cli.validate() {
        return fail("gpu-warden", &e.into(), 2);
    }
    if let Err(e) = init_logging(&cli.logging) {
        return fail("gpu-warden", &e, 2);
    }
    match gpu_warden::agent::build::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail("gpu-warden", &e.into(), 1),
    }
}

fn extender(cli: ExtenderCli) -> ExitCode {
    if let Err(e) = init_logging(&cli.logging) {
        return fail("gpu-warden extender", &e, 2);
    }
    let shutdown = gpu_warden::agent::build::shutdown_signal();
    match gpu_warden::extender::run(cli, shutdown) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail("gpu-warden extender", &e.into(), 1),
    }
}

/// `FILE: ok` or `FILE: <problem>` per file on stdout (src/config/check.rs); exit 1 when
/// any was refused.
fn check_config(cli: &CheckConfigCli) -> ExitCode {
    let read = |path: &std::path::Path| std::fs::read_to_string(path);
    match check_files(cli, read, gpu_warden::extender::config::check_policy) {
        Ok(report) => {
            report.lines.iter().for_each(|line| println!("{line}"));
            if report.refused == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => fail("gpu-warden check-config", &e.into(), 2),
    }
}

/// One line on stderr, whatever the log format: `e` and its causes joined with ": ", a cause
/// skipped when the text before already ends with it (thiserror messages often quote their
/// source), multi-line causes (kube's YAML errors, with a caret) folded onto the line.
fn fail(who: &str, e: &anyhow::Error, code: u8) -> ExitCode {
    let mut out = String::new();
    for cause in e.chain() {
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
    eprintln!("{who}: error: {out}");
    ExitCode::from(code)
}

fn init_logging(LogArgs { log, log_format }: &LogArgs) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(log).with_context(|| {
        format!("--log {log:?} is not a valid filter (e.g. info, gpu_warden=debug)")
    })?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    }
    .map_err(|e| anyhow::anyhow!("cannot set up logging: {e}"))
}
