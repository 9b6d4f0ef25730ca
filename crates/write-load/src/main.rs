//! `write-load`: the API-server write load of the agents beside the kubelets' own, as the
//! Markdown table of docs/annotations.md ("Write load").

use std::process::ExitCode;
use write_load::{markdown, table, Model};

const USAGE: &str = "usage: write-load [--nodes 1000,5000,10000] [--seeds 1,2] [--hours H] [--warmup-min M] [--node-kib K] [--extra-watchers W]";

fn parse() -> Result<(Model, Vec<u64>, u64), String> {
    let mut m = Model::default();
    let mut sizes = vec![1000, 5000, 10000];
    let mut extra = 3;
    let mut argv = std::env::args().skip(1);
    while let Some(flag) = argv.next() {
        if flag == "--help" || flag == "-h" {
            return Err(USAGE.into());
        }
        let value = argv
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let bad = |e: &dyn std::fmt::Display| format!("{flag} {value:?}: {e}\n{USAGE}");
        let list = |v: &str| -> Result<Vec<u64>, String> {
            v.split(',')
                .map(|x| x.trim().parse::<u64>().map_err(|e| bad(&e)))
                .collect()
        };
        match flag.as_str() {
            "--nodes" => sizes = list(&value)?,
            "--seeds" => m.seeds = list(&value)?,
            "--hours" => {
                let h: f64 = value.parse().map_err(|e| bad(&e))?;
                if !(h > 0.5 && h <= 48.0) {
                    return Err(bad(&"must be more than 0.5 and at most 48"));
                }
                m.horizon_s = (h * 3600.0).round() as u64;
            }
            "--warmup-min" => m.warmup_s = value.parse::<u64>().map_err(|e| bad(&e))? * 60,
            "--node-kib" => m.node_bytes = value.parse::<u64>().map_err(|e| bad(&e))? * 1024,
            "--extra-watchers" => extra = value.parse().map_err(|e| bad(&e))?,
            _ => return Err(format!("unknown flag {flag}\n{USAGE}")),
        }
    }
    if m.warmup_s + 600 > m.horizon_s {
        return Err(format!(
            "--warmup-min leaves less than 10 minutes to measure\n{USAGE}"
        ));
    }
    if sizes.is_empty() || sizes.contains(&0) || m.seeds.is_empty() {
        return Err(format!(
            "--nodes and --seeds need at least one value, nodes above 0\n{USAGE}"
        ));
    }
    Ok((m, sizes, extra))
}

fn main() -> ExitCode {
    let (m, sizes, extra) = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    match table(&m, &sizes, extra) {
        Ok(rows) => {
            println!("{}", markdown(&rows, extra));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("write-load: {e}");
            ExitCode::FAILURE
        }
    }
}
