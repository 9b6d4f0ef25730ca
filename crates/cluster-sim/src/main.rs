//! `cluster-sim`: runs the three policies at several `replicas` settings and writes the
//! Markdown table (stdout or `--out`), and optionally a CSV and an SVG plot.

use cluster_sim::{report, run_all, Scenario};
use std::process::ExitCode;

const USAGE: &str = "usage: cluster-sim [--seed N] [--hours H] [--replicas 2,4,8] [--arrivals-per-min X] [--declared-share P] [--under-declared-share P] [--small-nodes N] [--big-nodes N] [--out FILE.md] [--csv FILE.csv] [--svg FILE.svg]";

struct Args {
    scenario: Scenario,
    replicas: Vec<u32>,
    out: Option<String>,
    csv: Option<String>,
    svg: Option<String>,
}

fn parse(mut argv: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut a = Args {
        scenario: Scenario::default(),
        replicas: vec![2, 4, 8],
        out: None,
        csv: None,
        svg: None,
    };
    while let Some(flag) = argv.next() {
        if flag == "--help" || flag == "-h" {
            return Err(USAGE.into());
        }
        let value = argv
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let bad = |e: &dyn std::fmt::Display| format!("{flag} {value:?}: {e}");
        match flag.as_str() {
            "--seed" => a.scenario.seed = value.parse().map_err(|e| bad(&e))?,
            "--hours" => {
                let h: f64 = value.parse().map_err(|e| bad(&e))?;
                if !(h > 0.0 && h <= 24.0 * 30.0) {
                    return Err(bad(&"must be more than 0 and at most 720"));
                }
                a.scenario.horizon_s = (h * 3600.0).round() as u64;
            }
            "--arrivals-per-min" => {
                let x: f64 = value.parse().map_err(|e| bad(&e))?;
                if !(x > 0.0 && x.is_finite()) {
                    return Err(bad(&"must be more than 0"));
                }
                a.scenario.workload.arrivals_per_min = x;
            }
            "--declared-share" | "--under-declared-share" => {
                let p: f64 = value.parse().map_err(|e| bad(&e))?;
                if !(0.0..=1.0).contains(&p) {
                    return Err(bad(&"must be between 0 and 1"));
                }
                if flag == "--declared-share" {
                    a.scenario.workload.declared_share = p;
                } else {
                    a.scenario.workload.under_declared_share = p;
                }
            }
            "--small-nodes" => {
                a.scenario.cluster.small_nodes = value.parse().map_err(|e| bad(&e))?
            }
            "--big-nodes" => a.scenario.cluster.big_nodes = value.parse().map_err(|e| bad(&e))?,
            "--replicas" => {
                a.replicas = value
                    .split(',')
                    .map(|r| r.trim().parse::<u32>())
                    .collect::<Result<_, _>>()
                    .map_err(|e| bad(&e))?;
                if a.replicas.is_empty() || a.replicas.contains(&0) {
                    return Err(bad(&"each setting must be at least 1"));
                }
            }
            "--out" => a.out = Some(value),
            "--csv" => a.csv = Some(value),
            "--svg" => a.svg = Some(value),
            _ => return Err(format!("unknown flag {flag}\n{USAGE}")),
        }
    }
    Ok(a)
}

fn write(path: &str, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("{path}: {e}"))
}

fn main() -> ExitCode {
    let result = parse(std::env::args().skip(1)).and_then(|a| {
        let outcomes = run_all(&a.scenario, &a.replicas).map_err(|e| e.to_string())?;
        let table = report::markdown(&a.scenario, &outcomes);
        match &a.out {
            Some(p) => write(p, &table)?,
            None => print!("{table}"),
        }
        if let Some(p) = &a.csv {
            write(p, &report::csv(&outcomes))?;
        }
        if let Some(p) = &a.svg {
            write(p, &report::svg(&a.scenario, &outcomes))?;
        }
        Ok(())
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cluster-sim: {e}");
            ExitCode::from(2)
        }
    }
}
