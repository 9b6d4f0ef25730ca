//! `cluster-sim`: runs the policies at several `replicas` settings and seeds and writes the
//! Markdown table (stdout or `--out`), and optionally a CSV and an SVG plot.

use cluster_sim::scenario::SHIPPED_EXTENDER_POLICY;
use cluster_sim::{report, simulate, OnDecision, PolicyKind, Scenario};
use std::process::ExitCode;

const USAGE: &str = "usage: cluster-sim [--seeds 1,2,3,4,5] [--hours H] [--replicas 2,4,8] [--policies device-plugin,guard,extender-guard] [--on-decision stop|evict,stop,kill] [--arrivals-per-min X] [--declared-share P] [--under-declared-share P] [--small-nodes N] [--big-nodes N] [--extender-policy FILE.yaml] [--out FILE.md] [--csv FILE.csv] [--svg FILE.svg]";

struct Args {
    scenario: Scenario,
    seeds: Vec<u64>,
    replicas: Vec<u32>,
    policies: Vec<PolicyKind>,
    on_decision: Vec<OnDecision>,
    out: Option<String>,
    csv: Option<String>,
    svg: Option<String>,
}

fn list<T>(value: &str, one: impl Fn(&str) -> Option<T>) -> Option<Vec<T>> {
    let v: Option<Vec<T>> = value.split(',').map(|s| one(s.trim())).collect();
    v.filter(|v| !v.is_empty())
}

fn parse(mut argv: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut a = Args {
        scenario: Scenario::default(),
        seeds: vec![1],
        replicas: vec![2, 4, 8],
        policies: PolicyKind::ALL.to_vec(),
        on_decision: vec![OnDecision::Stop],
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
            "--seeds" => {
                a.seeds =
                    list(&value, |s| s.parse().ok()).ok_or_else(|| bad(&"seeds like 1,2,3"))?
            }
            "--hours" => {
                let h: f64 = value.parse().map_err(|e| bad(&e))?;
                if !(h > 0.5 && h <= 24.0 * 30.0) {
                    return Err(bad(&"must be more than 0.5 and at most 720"));
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
                a.replicas = list(&value, |s| s.parse::<u32>().ok().filter(|r| *r > 0))
                    .ok_or_else(|| bad(&"settings of at least 1, like 2,4,8"))?
            }
            "--policies" => {
                a.policies = list(&value, |s| {
                    PolicyKind::ALL.into_iter().find(|p| p.key() == s)
                })
                .ok_or_else(|| bad(&"device-plugin, guard, extender-guard"))?
            }
            "--on-decision" => {
                a.on_decision =
                    list(&value, OnDecision::parse).ok_or_else(|| bad(&"evict, stop, kill"))?
            }
            "--extender-policy" => {
                a.scenario.extender_policy = std::fs::read_to_string(&value).map_err(|e| bad(&e))?
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
        let mut outcomes = Vec::new();
        for p in &a.policies {
            let actions: Vec<OnDecision> = if p.guard() {
                a.on_decision.clone()
            } else {
                vec![a.on_decision[0]]
            };
            for on in actions {
                for r in &a.replicas {
                    for seed in &a.seeds {
                        let sc = Scenario {
                            seed: *seed,
                            on_decision: on,
                            ..a.scenario.clone()
                        };
                        let o = simulate(&sc, *p, *r).map_err(|e| e.to_string())?;
                        eprintln!(
                            "cluster-sim: {} {} replicas {} seed {}: {:.2} % OOM, {:.2} jobs/GPU-h",
                            p.key(),
                            on.key(),
                            r,
                            seed,
                            o.oom_share() * 100.0,
                            o.jobs_per_gpu_hour
                        );
                        eprintln!(
                            "cluster-sim:   idle replicas while jobs waited: {:.1} % of replica-time after the warm-up ({:.1} % on GPUs the extender sees under 4 GiB of room; {:.1} % counted as taken in its view)",
                            o.idle_replicas * 100.0,
                            o.idle_short_of_room * 100.0,
                            o.idle_counted_taken * 100.0
                        );
                        for (cause, k) in &o.oom_causes {
                            eprintln!("cluster-sim:   OOM kills: {k} {cause}");
                        }
                        outcomes.push(o);
                    }
                }
            }
        }
        let shipped = if a.scenario.extender_policy == SHIPPED_EXTENDER_POLICY {
            "the shipped extender policy (deploy/components/scheduler/extender.yaml)"
        } else {
            "the extender policy of --extender-policy"
        };
        let table = format!(
            "{}With {shipped}.\n\n{}",
            report::heading(&a.scenario, &a.seeds),
            report::markdown(&outcomes)
        );
        match &a.out {
            Some(p) => write(p, &table)?,
            None => print!("{table}"),
        }
        if let Some(p) = &a.csv {
            write(p, &report::csv(&outcomes))?;
        }
        if let Some(p) = &a.svg {
            let caption = format!(
                "cluster-sim seeds {:?}, {} h",
                a.seeds,
                a.scenario.horizon_s as f64 / 3600.0
            );
            write(p, &report::svg(&caption, &outcomes))?;
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
