//! A node's liveness, from its agent's Lease (docs/annotations.md, "Liveness").
//!
//! Pure. Each agent keeps a `coordination.k8s.io/v1` Lease named after its node, in the
//! agent's namespace, renewed every few seconds and carrying the same annotation values as
//! the Node (every key of `PerKey`, `src/publish/annotations/schema.rs`); the Node itself is written on a slow cadence. [`effective`] turns a node's
//! annotations and its Lease into the annotations the verdicts read:
//!
//! - **No Lease** (an agent from before Leases, or none at all): the Node's annotations as
//!   they are; staleness follows their `vram-observed-at` (the fallback of the upgrade path).
//! - **A Lease**: the Lease is the truth, whatever the Node says. Its figures replace the
//!   Node's, every key of the set (one the Lease lacks is not taken from the Node either),
//!   and `vram-observed-at` becomes the older of the figures' own time and the
//!   Lease's `renewTime`, so an agent that stopped renewing goes stale by the extender's
//!   `staleAfter` even while its Node still shows recent figures.
//! - **A Lease without figures** (taken off at the agent's graceful shutdown): the Node's
//!   annotations, as without a Lease. The stopping agent removed those too, so the node reads
//!   as missing; an older agent started there afterwards (a downgrade) is read by its Node.

use crate::publish::annotations::owned_keys;
use std::collections::BTreeMap;
use std::time::SystemTime;

/// The name of the Lease of `node`'s agent (in the agents' namespace): the node's own.
pub fn lease_name(node: &str) -> &str {
    node
}

/// What the extender needs of a Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseView {
    /// `spec.renewTime`; `None` reads as never renewed.
    pub renew_time: Option<SystemTime>,
    /// `metadata.annotations`.
    pub annotations: BTreeMap<String, String>,
}

/// The annotations to judge `node_annotations` by, given the node's Lease (if any).
pub fn effective(
    node_annotations: &BTreeMap<String, String>,
    lease: Option<&LeaseView>,
    prefix: &str,
) -> BTreeMap<String, String> {
    let keys = owned_keys(prefix);
    let Some(lease) = lease.filter(|l| l.annotations.contains_key(&keys.vram)) else {
        return node_annotations.clone();
    };
    let mut out = node_annotations.clone();
    for k in keys.iter() {
        out.remove(k);
        if let Some(v) = lease.annotations.get(k) {
            out.insert(k.clone(), v.clone());
        }
    }
    let observed_key = &keys.observed_at;
    let figures_at = lease
        .annotations
        .get(observed_key)
        .and_then(|t| humantime::parse_rfc3339(t).ok());
    // The older of the two: fresh figures on a Lease nobody renews are not fresh, and a
    // renewal never makes older figures newer than they are.
    let at = match (figures_at, lease.renew_time) {
        (Some(f), Some(r)) => Some(f.min(r)),
        _ => None,
    };
    let at = at.unwrap_or(SystemTime::UNIX_EPOCH);
    out.insert(
        observed_key.clone(),
        humantime::format_rfc3339_seconds(at).to_string(),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extender::judge::{judge, JudgePolicy, Reason};
    use crate::extender::nodes::{read_node, NodeState};
    use std::time::{Duration, UNIX_EPOCH};

    const P: &str = "gpu-warden.io";
    const T0: u64 = 1_780_000_000;

    fn at(s: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(T0 + s)
    }

    /// The four keys as an agent writes them: `free` MiB on one 24 GiB GPU, observed at `t`.
    fn figures(free: u64, t: u64) -> BTreeMap<String, String> {
        let ts = humantime::format_rfc3339_seconds(at(t)).to_string();
        let vram = format!(
            r#"{{"v":1,"observedAt":"{ts}","gpus":[{{"index":0,"uuid":"GPU-0","totalMiB":24576,"usedMiB":{},"freeMiB":{free},"pressure":"none"}}]}}"#,
            24576 - free
        );
        BTreeMap::from([
            (format!("{P}/vram-free-mib"), free.to_string()),
            (format!("{P}/vram-max-free-mib"), free.to_string()),
            (format!("{P}/vram"), vram),
            (format!("{P}/vram-observed-at"), ts),
        ])
    }

    fn with_other(mut m: BTreeMap<String, String>) -> BTreeMap<String, String> {
        m.insert("node.alpha.kubernetes.io/ttl".into(), "0".into());
        m
    }

    /// The judge as the extender runs it, 4 GiB wanted, at `now`.
    fn verdict(ann: &BTreeMap<String, String>, now: u64) -> Reason {
        judge(
            &read_node(ann, P),
            &[],
            Some(4096),
            1,
            &JudgePolicy::default(),
            at(now),
        )
        .reason
    }

    #[test]
    fn without_a_lease_the_node_is_read_as_before() {
        // An old agent: Node heartbeat every 60 s, no Lease.
        let node = with_other(figures(8192, 0));
        assert_eq!(effective(&node, None, P), node);
        assert_eq!(verdict(&effective(&node, None, P), 100), Reason::Fits);
        assert_eq!(verdict(&effective(&node, None, P), 121), Reason::Stale);
    }

    #[test]
    fn a_fresh_lease_vouches_for_its_figures_over_an_old_node() {
        // A new agent: the Node was written 4 minutes ago (its slow cadence) with 8 GiB
        // free; the Lease, renewed 10 s ago, says 2 GiB.
        let node = with_other(figures(8192, 0));
        let lease = LeaseView {
            renew_time: Some(at(240)),
            annotations: figures(2048, 239),
        };
        let eff = effective(&node, Some(&lease), P);
        assert_eq!(
            eff["node.alpha.kubernetes.io/ttl"], "0",
            "others' keys stay"
        );
        assert_eq!(eff[&format!("{P}/vram-free-mib")], "2048");
        let NodeState::Known(v) = read_node(&eff, P) else {
            panic!("{eff:?}")
        };
        assert_eq!(v.observed_at, at(239));
        assert_eq!(v.gpus[0].free_mib, 2048);
        assert_eq!(
            verdict(&eff, 250),
            Reason::NoRoom,
            "the Lease's figures, not the Node's"
        );
    }

    #[test]
    fn a_stale_lease_means_stale_figures_whatever_the_node_says() {
        // The agent stopped renewing at 100 s; the Node (written by someone at 290 s) looks new.
        let node = with_other(figures(20480, 290));
        let lease = LeaseView {
            renew_time: Some(at(100)),
            annotations: figures(20480, 300),
        };
        let eff = effective(&node, Some(&lease), P);
        let NodeState::Known(v) = read_node(&eff, P) else {
            panic!()
        };
        assert_eq!(
            v.observed_at,
            at(100),
            "the renewal bounds the figures' age"
        );
        assert_eq!(verdict(&eff, 300), Reason::Stale);
        // Never renewed at all: stale too.
        let never = LeaseView {
            renew_time: None,
            annotations: figures(20480, 300),
        };
        assert_eq!(
            verdict(&effective(&node, Some(&never), P), 300),
            Reason::Stale
        );
    }

    #[test]
    fn a_lease_without_figures_falls_back_to_the_node() {
        // Taken off at the agent's shutdown, which removed the Node's keys too: missing.
        let lease = LeaseView {
            renew_time: Some(at(5)),
            annotations: BTreeMap::new(),
        };
        let bare = with_other(BTreeMap::new());
        assert_eq!(
            read_node(&effective(&bare, Some(&lease), P), P),
            NodeState::Missing
        );
        // An agent from before Leases started there later (a downgrade): read by its Node.
        let node = with_other(figures(8192, 100));
        assert_eq!(effective(&node, Some(&lease), P), node);
        assert_eq!(
            verdict(&effective(&node, Some(&lease), P), 110),
            Reason::Fits
        );
    }

    /// An extender from before Leases reads only the Node, which new agents write at most
    /// every 5½ minutes (the real planner, its default configuration, a steady GPU, 20 min).
    #[test]
    fn an_old_extender_with_new_agents_needs_a_longer_stale_after() {
        use crate::model::snapshot::{
            GpuHealth, GpuIdentity, GpuSample, MemoryInfo, Snapshot, MIB,
        };
        use crate::publish::annotations::{AnnotationConfig, AnnotationPlanner};
        let mut g = GpuSample::empty(
            GpuIdentity {
                index: 0,
                uuid: "GPU-0".into(),
                pci_bus_id: "00000000:1E:00.0".into(),
                device: "nvidia0".into(),
                model: "NVIDIA A10G".into(),
            },
            GpuHealth::Ok,
        );
        g.memory = Some(MemoryInfo {
            total: 23028 * MIB,
            used: 4096 * MIB,
            free: 18932 * MIB,
            reserved: 0,
        });
        let mut planner = AnnotationPlanner::new(AnnotationConfig {
            pressure_rise_at_once: false,
            ..AnnotationConfig::default()
        });
        let mut node = BTreeMap::new();
        let (mut stale_by_default, mut stale_at_12m, mut polls) = (0, 0, 0);
        let old_default = JudgePolicy::default();
        let widened = JudgePolicy {
            stale_after: Duration::from_secs(720),
            ..JudgePolicy::default()
        };
        for t in 0..1200u64 {
            let snap = Snapshot {
                seq: t + 1,
                at: Duration::from_secs(t),
                wall: at(t),
                driver_version: "570".into(),
                cuda_driver_version: None,
                gpus: vec![g.clone()],
                processes: vec![],
                util_fresh: true,
                errors: vec![],
            };
            if let Some(p) = planner.plan(&snap, &BTreeMap::new(), snap.at) {
                planner.patch_succeeded(snap.at);
                node = p.values.to_annotations(P);
            }
            // The old extender: the Node's annotations, no Lease.
            let state = read_node(&node, P);
            polls += 1;
            stale_by_default += usize::from(
                judge(&state, &[], Some(4096), 1, &old_default, at(t)).reason == Reason::Stale,
            );
            stale_at_12m += usize::from(
                judge(&state, &[], Some(4096), 1, &widened, at(t)).reason == Reason::Stale,
            );
        }
        assert!(
            stale_by_default > polls / 2,
            "{stale_by_default} of {polls}: 120 s is too short for a 5-minute Node"
        );
        assert_eq!(
            stale_at_12m, 0,
            "staleAfter: 12m (docs/deploy.md, Upgrade) accepts every poll"
        );
    }

    /// Every key the agent owns, as its own writer puts it on a Lease, reaches the verdicts
    /// from the Lease and not from the Node's older copy; a key the Lease lacks is not taken
    /// from the Node either. A key added to the set is checked here without a change.
    #[test]
    fn every_owned_key_is_read_from_the_lease() {
        use crate::model::cuda::CudaVersion;
        use crate::publish::annotations::{owned_keys, AnnotationValues};
        let values = |free: u64, t: u64, cuda: Option<CudaVersion>| AnnotationValues {
            observed_at: at(t),
            gpus: vec![crate::extender::judge::tests::gpu(0, free, 4096, None)],
            free_mib: free,
            max_free_mib: free,
            next_gpu: None,
            cuda_driver_version: cuda,
        };
        let old = Some(CudaVersion {
            major: 12,
            minor: 2,
        });
        let new = Some(CudaVersion {
            major: 12,
            minor: 8,
        });
        let node = with_other(values(8192, 0, old).to_annotations(P));
        let written = values(2048, 239, new).to_annotations(P);
        let keys = owned_keys(P);
        for k in keys.iter() {
            assert!(written.contains_key(k), "the agent writes {k}");
            assert_ne!(
                node.get(k),
                written.get(k),
                "{k}: the test tells them apart"
            );
        }
        let lease = LeaseView {
            renew_time: Some(at(240)),
            annotations: written.clone(),
        };
        let eff = effective(&node, Some(&lease), P);
        for k in keys.iter() {
            assert_eq!(eff.get(k), written.get(k), "{k} comes from the Lease");
        }
        assert_eq!(eff["node.alpha.kubernetes.io/ttl"], "0");
        let NodeState::Known(v) = read_node(&eff, P) else {
            panic!("{eff:?}")
        };
        assert_eq!(v.cuda, new, "the extender's CUDA check reads the Lease's");

        let unknown = values(2048, 239, None).to_annotations(P);
        let lease = LeaseView {
            renew_time: Some(at(240)),
            annotations: unknown,
        };
        let eff = effective(&node, Some(&lease), P);
        assert_eq!(eff.get(&keys.cuda_driver_version), None, "not the Node's");
    }

    #[test]
    fn the_lease_name_is_the_node_name() {
        assert_eq!(
            lease_name("ip-10-0-1-7.ec2.internal"),
            "ip-10-0-1-7.ec2.internal"
        );
    }
}
