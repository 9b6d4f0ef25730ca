//! The report: a Markdown table, a CSV and an SVG plot, all plain text written here so the
//! output is byte-identical for a seed and the docs need nothing at build time.

use crate::sim::{Outcome, PolicyKind, Scenario};
use std::fmt::Write as _;

/// A `replicas` setting is *safe* for a policy when GPU OOM kills stay at or below this
/// share of submitted jobs.
pub const SAFE_OOM_SHARE: f64 = 0.001;

/// The highest `replicas` of `outcomes` that is safe for `policy`, with every lower setting
/// safe too; `None` when even the lowest is not.
pub fn safe_replicas(outcomes: &[Outcome], policy: PolicyKind) -> Option<u32> {
    let mut rows: Vec<&Outcome> = outcomes.iter().filter(|o| o.policy == policy).collect();
    rows.sort_by_key(|o| o.replicas);
    let mut safe = None;
    for o in rows {
        if o.oom_share() > SAFE_OOM_SHARE {
            break;
        }
        safe = Some(o.replicas);
    }
    safe
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

/// The Markdown table, with a heading line naming the scenario.
pub fn markdown(sc: &Scenario, outcomes: &[Outcome]) -> String {
    let c = &sc.cluster;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Seed {}, {} h, {} × 1-GPU + {} × {}-GPU nodes ({} GPUs of {} MiB), {} jobs/min.\n",
        sc.seed,
        sc.horizon_s as f64 / 3600.0,
        c.small_nodes,
        c.big_nodes,
        c.big_gpus,
        c.gpus(),
        c.gpu_total_mib,
        sc.workload.arrivals_per_min
    );
    s.push_str("| policy | replicas | jobs | finished | OOM-killed (share; at start; declared enough) | evictions (retried) | jobs evicted | GPU memory utilisation | queue wait p50 | queue wait p99 |\n");
    s.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for o in outcomes {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} ({}; {} at start; {} declared enough) | {} | {} | {} | {} | {} |",
            o.policy.label(),
            o.replicas,
            o.jobs,
            o.finished,
            o.oom_killed,
            pct(o.oom_share()),
            o.oom_at_start,
            o.oom_declared_enough,
            o.evictions,
            o.jobs_evicted,
            pct(o.utilisation),
            minutes(o.wait_p50_s),
            minutes(o.wait_p99_s),
        );
    }
    let _ = writeln!(
        s,
        "\nSafe `replicas` (GPU OOM kills ≤ {} of jobs at that setting and every lower one):\n",
        pct(SAFE_OOM_SHARE)
    );
    for p in PolicyKind::ALL {
        let safe = match safe_replicas(outcomes, p) {
            Some(r) => r.to_string(),
            None => "none of those simulated".to_string(),
        };
        let _ = writeln!(s, "- {}: {safe}", p.label());
    }
    s
}

/// The CSV, one row per run.
pub fn csv(outcomes: &[Outcome]) -> String {
    let mut s = String::from("policy,replicas,jobs,finished,oom_killed,oom_at_start,oom_declared_enough,oom_share,evictions,jobs_evicted,utilisation,wait_p50_s,wait_p99_s\n");
    for o in outcomes {
        let _ = writeln!(
            s,
            "{},{},{},{},{},{},{},{:.5},{},{},{:.5},{:.0},{:.0}",
            o.policy.key(),
            o.replicas,
            o.jobs,
            o.finished,
            o.oom_killed,
            o.oom_at_start,
            o.oom_declared_enough,
            o.oom_share(),
            o.evictions,
            o.jobs_evicted,
            o.utilisation,
            o.wait_p50_s,
            o.wait_p99_s
        );
    }
    s
}

const COLOURS: [&str; 3] = ["#c0392b", "#e69f00", "#0072b2"];

/// One grouped bar panel: groups by replicas, a bar per policy.
fn panel(
    s: &mut String,
    x0: f64,
    title: &str,
    outcomes: &[Outcome],
    value: &dyn Fn(&Outcome) -> f64,
    fmt: &dyn Fn(f64) -> String,
) {
    let (w, h, top) = (300.0, 220.0, 50.0);
    let mut replicas: Vec<u32> = outcomes.iter().map(|o| o.replicas).collect();
    replicas.sort_unstable();
    replicas.dedup();
    let max = outcomes.iter().map(value).fold(0.0_f64, f64::max).max(1e-9);
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
    let bar = group / 4.0;
    for (gi, r) in replicas.iter().enumerate() {
        let gx = x0 + gi as f64 * group;
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.0}" font-size="12" text-anchor="middle">replicas {r}</text>"#,
            gx + group / 2.0,
            top + h + 18.0
        );
        for (pi, p) in PolicyKind::ALL.iter().enumerate() {
            let Some(o) = outcomes.iter().find(|o| o.replicas == *r && o.policy == *p) else {
                continue;
            };
            let v = value(o);
            let bh = h * v / max;
            let bx = gx + bar * 0.5 + pi as f64 * bar;
            let _ = writeln!(
                s,
                r#"<rect x="{bx:.1}" y="{:.1}" width="{:.1}" height="{bh:.1}" fill="{}"/>"#,
                top + h - bh,
                bar * 0.9,
                COLOURS[pi]
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

/// The plot: GPU OOM kills, evictions and queue wait p99 by policy and `replicas`.
pub fn svg(sc: &Scenario, outcomes: &[Outcome]) -> String {
    let mut s = String::new();
    s.push_str(r#"<svg xmlns="http://www.w3.org/2000/svg" width="1060" height="340" viewBox="0 0 1060 340" font-family="sans-serif">"#);
    s.push('\n');
    s.push_str(r#"<rect width="1060" height="340" fill="white"/>"#);
    s.push('\n');
    panel(
        &mut s,
        30.0,
        "Jobs killed by GPU OOM (% of jobs)",
        outcomes,
        &|o| o.oom_share() * 100.0,
        &|v| format!("{v:.2}"),
    );
    panel(
        &mut s,
        380.0,
        "Evictions, retried (% of jobs)",
        outcomes,
        &|o| o.evictions as f64 / o.jobs.max(1) as f64 * 100.0,
        &|v| format!("{v:.1}"),
    );
    panel(
        &mut s,
        730.0,
        "Queue wait p99 (min)",
        outcomes,
        &|o| o.wait_p99_s / 60.0,
        &|v| format!("{v:.1}"),
    );
    for (i, p) in PolicyKind::ALL.iter().enumerate() {
        let x = 250.0 + i as f64 * 200.0;
        let _ = writeln!(
            s,
            r#"<rect x="{x:.0}" y="312" width="12" height="12" fill="{}"/><text x="{:.0}" y="322" font-size="12">{}</text>"#,
            COLOURS[i],
            x + 16.0,
            p.label()
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="1050" y="336" font-size="9" text-anchor="end">cluster-sim seed {}, {} h</text>"#,
        sc.seed,
        sc.horizon_s as f64 / 3600.0
    );
    s.push_str("</svg>\n");
    s
}
