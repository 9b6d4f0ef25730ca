//! The report: Markdown tables, a CSV and an SVG plot, all plain text written here so the
//! output is byte-identical for a seed and the docs need nothing at build time. Rows group
//! the runs of one (policy, onDecision, replicas) over the seeds.

use crate::outcome::Outcome;
use crate::scenario::{OnDecision, PolicyKind, Scenario};
use std::fmt::Write as _;

/// A `replicas` setting is *safe* for a policy when GPU OOM kills stay at or below this
/// share of submitted jobs on every seed.
pub const SAFE_OOM_SHARE: f64 = 0.001;

/// The runs of one row.
pub struct Row<'a> {
    /// The policy.
    pub policy: PolicyKind,
    /// The guard's action.
    pub on_decision: OnDecision,
    /// `replicas`.
    pub replicas: u32,
    /// One outcome per seed, in seed order.
    pub runs: Vec<&'a Outcome>,
}

impl Row<'_> {
    /// The worst seed's OOM share.
    pub fn worst_oom_share(&self) -> f64 {
        self.runs.iter().map(|o| o.oom_share()).fold(0.0, f64::max)
    }

    /// Mean of `f` over the seeds.
    pub fn mean(&self, f: impl Fn(&Outcome) -> f64) -> f64 {
        self.runs.iter().map(|o| f(o)).sum::<f64>() / self.runs.len().max(1) as f64
    }

    /// Whether the row is safe (every seed at or under [`SAFE_OOM_SHARE`]).
    pub fn safe(&self) -> bool {
        self.worst_oom_share() <= SAFE_OOM_SHARE
    }
}

/// Groups `outcomes` into rows, in the order their keys first appear.
pub fn rows(outcomes: &[Outcome]) -> Vec<Row<'_>> {
    let mut rows: Vec<Row<'_>> = Vec::new();
    for o in outcomes {
        match rows.iter_mut().find(|r| {
            (r.policy, r.on_decision, r.replicas) == (o.policy, o.on_decision, o.replicas)
        }) {
            Some(r) => r.runs.push(o),
            None => rows.push(Row {
                policy: o.policy,
                on_decision: o.on_decision,
                replicas: o.replicas,
                runs: vec![o],
            }),
        }
    }
    for r in &mut rows {
        r.runs.sort_by_key(|o| o.seed);
    }
    rows
}

fn pct(x: f64) -> String {
    format!("{:.2} %", x * 100.0)
}

fn minutes(s: f64) -> String {
    if s < 60.0 {
        format!("{s:.0} s")
    } else {
        format!("{:.1} min", s / 60.0)
    }
}

fn label(r: &Row<'_>) -> String {
    if r.policy.guard() {
        format!("{} ({})", r.policy.label(), r.on_decision.key())
    } else {
        r.policy.label().to_string()
    }
}

/// The heading line naming the scenario.
pub fn heading(sc: &Scenario, seeds: &[u64]) -> String {
    let c = &sc.cluster;
    format!(
        "Seeds {}; {} h each (throughput after the first {} min); {} × 1-GPU + {} × {}-GPU nodes ({} GPUs of {} MiB); {} jobs/min (a row whose queue wait is 0 kept up with the arrivals: its throughput is not a saturated figure).\n",
        seeds.iter().map(u64::to_string).collect::<Vec<_>>().join(", "),
        sc.horizon_s as f64 / 3600.0,
        sc.warmup_s / 60,
        c.small_nodes,
        c.big_nodes,
        c.big_gpus,
        c.gpus(),
        c.gpu_total_mib,
        sc.workload.arrivals_per_min
    )
}

/// The Markdown table of `outcomes`.
pub fn markdown(outcomes: &[Outcome]) -> String {
    let mut s = String::new();
    s.push_str("| policy | replicas | OOM-killed, % of jobs, per seed | worst seed | OOM-killed within their declaration (all seeds) | jobs finished per GPU-hour (mean; min–max) | queue wait p95 (mean) | evictions per hour (mean) | evicted while not growing (all seeds; within their declaration) |\n");
    s.push_str("|---|---:|---|---:|---:|---:|---:|---:|---:|\n");
    for r in rows(outcomes) {
        let per_seed = r
            .runs
            .iter()
            .map(|o| format!("{:.2}", o.oom_share() * 100.0))
            .collect::<Vec<_>>()
            .join(" / ");
        let within: usize = r.runs.iter().map(|o| o.oom_within_declared).sum();
        let tput: Vec<f64> = r.runs.iter().map(|o| o.jobs_per_gpu_hour).collect();
        let (lo, hi) = tput
            .iter()
            .fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(*x), b.max(*x)));
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {:.2} ({:.2}–{:.2}) | {} | {:.0} | {} ({}) |",
            label(&r),
            r.replicas,
            per_seed,
            pct(r.worst_oom_share()),
            within,
            r.mean(|o| o.jobs_per_gpu_hour),
            lo,
            hi,
            minutes(r.mean(|o| o.wait_p95_s)),
            r.mean(|o| o.evictions_per_hour),
            r.runs.iter().map(|o| o.evicted_not_growing).sum::<usize>(),
            r.runs
                .iter()
                .map(|o| o.evicted_not_growing_within_declared)
                .sum::<usize>(),
        );
    }
    s
}

/// The CSV, one row per run.
pub fn csv(outcomes: &[Outcome]) -> String {
    let mut s = String::from("policy,on_decision,replicas,seed,jobs,finished,oom_killed,oom_within_declared,oom_undeclared,oom_share,evictions,evictions_per_hour,jobs_per_gpu_hour,wait_p95_s,utilisation,evicted_not_growing,evicted_not_growing_within_declared\n");
    for o in outcomes {
        let _ = writeln!(
            s,
            "{},{},{},{},{},{},{},{},{},{:.5},{},{:.1},{:.3},{:.0},{:.5},{},{}",
            o.policy.key(),
            o.on_decision.key(),
            o.replicas,
            o.seed,
            o.jobs,
            o.finished,
            o.oom_killed,
            o.oom_within_declared,
            o.oom_undeclared,
            o.oom_share(),
            o.evictions,
            o.evictions_per_hour,
            o.jobs_per_gpu_hour,
            o.wait_p95_s,
            o.utilisation,
            o.evicted_not_growing,
            o.evicted_not_growing_within_declared
        );
    }
    s
}

const COLOURS: [&str; 6] = [
    "#c0392b", "#e69f00", "#0072b2", "#009e73", "#cc79a7", "#56b4e9",
];

/// One grouped bar panel: groups by replicas, a bar per row label.
fn panel(
    s: &mut String,
    x0: f64,
    title: &str,
    rows: &[Row<'_>],
    labels: &[String],
    value: &dyn Fn(&Row<'_>) -> f64,
    fmt: &dyn Fn(f64) -> String,
) {
    let (w, h, top) = (300.0, 220.0, 50.0);
    let mut replicas: Vec<u32> = rows.iter().map(|r| r.replicas).collect();
    replicas.sort_unstable();
    replicas.dedup();
    let max = rows.iter().map(value).fold(0.0_f64, f64::max).max(1e-9);
    let _ = writeln!(
        s,
        r#"<text x="{:.0}" y="30" font-size="14" text-anchor="middle">{title}</text>"#,
        x0 + w / 2.0
    );
    let _ = writeln!(
        s,
        r#"<line x1="{x0:.0}" y1="{:.0}" x2="{:.0}" y2="{:.0}" stroke="black"/>"#,
        top + h,
        x0 + w,
        top + h
    );
    let group = w / replicas.len().max(1) as f64;
    let bar = group / (labels.len() as f64 + 1.0);
    for (gi, rep) in replicas.iter().enumerate() {
        let gx = x0 + gi as f64 * group;
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.0}" font-size="12" text-anchor="middle">replicas {rep}</text>"#,
            gx + group / 2.0,
            top + h + 18.0
        );
        for (li, l) in labels.iter().enumerate() {
            let Some(r) = rows.iter().find(|r| r.replicas == *rep && label(r) == *l) else {
                continue;
            };
            let v = value(r);
            let bh = h * v / max;
            let bx = gx + bar * 0.5 + li as f64 * bar;
            let _ = writeln!(
                s,
                r#"<rect x="{bx:.1}" y="{:.1}" width="{:.1}" height="{bh:.1}" fill="{}"/>"#,
                top + h - bh,
                bar * 0.9,
                COLOURS[li % COLOURS.len()]
            );
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" font-size="9" text-anchor="middle">{}</text>"#,
                bx + bar * 0.45,
                top + h - bh - 3.0,
                fmt(v)
            );
        }
    }
}

/// The plot: worst seed's OOM kills, jobs per GPU-hour and evictions per hour, by policy
/// and `replicas`.
pub fn svg(caption: &str, outcomes: &[Outcome]) -> String {
    let rows = rows(outcomes);
    let mut labels: Vec<String> = Vec::new();
    for r in &rows {
        if !labels.contains(&label(r)) {
            labels.push(label(r));
        }
    }
    let mut s = String::new();
    s.push_str(r#"<svg xmlns="http://www.w3.org/2000/svg" width="1060" height="350" viewBox="0 0 1060 350" font-family="sans-serif">"#);
    s.push('\n');
    s.push_str(r#"<rect width="1060" height="350" fill="white"/>"#);
    s.push('\n');
    panel(
        &mut s,
        30.0,
        "Jobs killed by GPU OOM (% of jobs, worst seed)",
        &rows,
        &labels,
        &|r| r.worst_oom_share() * 100.0,
        &|v| format!("{v:.2}"),
    );
    panel(
        &mut s,
        380.0,
        "Jobs finished per GPU-hour (mean)",
        &rows,
        &labels,
        &|r| r.mean(|o| o.jobs_per_gpu_hour),
        &|v| format!("{v:.2}"),
    );
    panel(
        &mut s,
        730.0,
        "Evictions per hour (mean)",
        &rows,
        &labels,
        &|r| r.mean(|o| o.evictions_per_hour),
        &|v| format!("{v:.0}"),
    );
    for (i, l) in labels.iter().enumerate() {
        let x = 30.0 + i as f64 * 250.0;
        let _ = writeln!(
            s,
            r#"<rect x="{x:.0}" y="312" width="12" height="12" fill="{}"/><text x="{:.0}" y="322" font-size="12">{l}</text>"#,
            COLOURS[i % COLOURS.len()],
            x + 16.0,
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="1050" y="344" font-size="9" text-anchor="end">{caption}</text>"#
    );
    s.push_str("</svg>\n");
    s
}
