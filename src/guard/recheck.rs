//! The fresh read just before an eviction, judged against the plan: the pod view the plan
//! was made on may be behind, so the enforcer reads the victim again and asks the ranking's
//! own exclusion rules whether it is still one.

use super::decision::EvictionOutcome;
use super::policy::Policy;
use super::rank::{exclusion, Victim};
use crate::model::pod::PodInfo;
use std::collections::HashMap;

/// Judges a victim's fresh state, read just before its eviction, against the plan: `None`
/// to go ahead; `AlreadyGone` for a pod that is re-created under its name (another UID),
/// terminating or finished (its memory is going away without us); `Skipped` for a pod now
/// bound to another node (`spec_node` is not `node`) or that the policy now excludes.
pub fn recheck(
    policy: &Policy,
    victim: &Victim,
    fresh: &PodInfo,
    spec_node: Option<&str>,
    node: &str,
    phase: Option<&str>,
) -> Option<EvictionOutcome> {
    if fresh.uid != victim.uid || fresh.terminating {
        return Some(EvictionOutcome::AlreadyGone);
    }
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return Some(EvictionOutcome::AlreadyGone);
    }
    if let Some(other) = spec_node.filter(|n| *n != node) {
        return Some(EvictionOutcome::Skipped(format!(
            "changed since the plan: bound to node {other:?}, not this one"
        )));
    }
    let evict_key = policy.evict_annotation();
    exclusion(
        policy,
        &evict_key,
        fresh,
        victim.use_bytes.max(1),
        &HashMap::new(),
    )
    .map(|e| EvictionOutcome::Skipped(format!("changed since the plan: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::rank::rank;
    use crate::testkit::fixtures::*;

    /// The fresh read before an eviction, judged against the plan.
    #[test]
    fn recheck_table() {
        let policy = Policy {
            selector: Some("workload-type=gpu-ci".parse().unwrap()),
            ..Policy::default()
        };
        let base = || pod("v").label("workload-type", "gpu-ci");
        let victim = {
            let pods = pods([base()]);
            rank(&policy, 0, &[proc_in("v", 0, 3000)], &pods, &HashMap::new())
                .candidates
                .remove(0)
        };
        let info = |b: PodBuilder| pods([b]).remove("v").unwrap();
        let mut other_uid = info(base());
        other_uid.uid = "someone-else".into();
        // (case, fresh pod, spec.nodeName, phase, want: None or the outcome label and a fragment)
        type Row<'a> = (
            &'a str,
            PodInfo,
            Option<&'a str>,
            Option<&'a str>,
            Option<(&'a str, &'a str)>,
        );
        let rows: Vec<Row> = vec![
            ("unchanged", info(base()), Some("n1"), Some("Running"), None),
            ("no node or phase yet", info(base()), None, None, None),
            (
                "re-created under its name",
                other_uid,
                Some("n1"),
                Some("Running"),
                Some(("already_gone", "")),
            ),
            (
                "terminating",
                info(base().terminating()),
                Some("n1"),
                Some("Running"),
                Some(("already_gone", "")),
            ),
            (
                "finished",
                info(base()),
                Some("n1"),
                Some("Succeeded"),
                Some(("already_gone", "")),
            ),
            (
                "failed",
                info(base()),
                Some("n1"),
                Some("Failed"),
                Some(("already_gone", "")),
            ),
            (
                "moved",
                info(base()),
                Some("n2"),
                Some("Running"),
                Some(("skipped", "node \"n2\"")),
            ),
            (
                "now exempt",
                info(base().annotation("gpu-warden.io/evict", "never")),
                Some("n1"),
                None,
                Some(("skipped", "evict: never")),
            ),
            (
                "priority raised",
                info(base().priority(2_000_000_000)),
                Some("n1"),
                None,
                Some(("skipped", "ceiling")),
            ),
            (
                "label removed",
                info(pod("v")),
                Some("n1"),
                None,
                Some(("skipped", "selector")),
            ),
            (
                "now a DaemonSet pod",
                info(base().owner("DaemonSet")),
                Some("n1"),
                None,
                Some(("skipped", "DaemonSet")),
            ),
            (
                "now in an excluded namespace",
                info(base().ns("kube-system")),
                Some("n1"),
                None,
                Some(("skipped", "namespace")),
            ),
        ];
        for (name, fresh, node, phase, want) in rows {
            let got = recheck(&policy, &victim, &fresh, node, "n1", phase);
            match (want, &got) {
                (None, None) => {}
                (Some((label, frag)), Some(o)) => {
                    assert_eq!(o.as_str(), label, "{name}: {o:?}");
                    assert!(o.detail().unwrap_or("").contains(frag), "{name}: {o:?}");
                }
                _ => panic!("{name}: got {got:?}, want {want:?}"),
            }
        }
    }
}
