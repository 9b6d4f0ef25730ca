//! One extender call, pure: the pod's need, each candidate's verdict, and the reply. The
//! shell hands in the candidates' annotations, the ledger and the time.

use super::judge::{judge, next_gpu, priorities, JudgePolicy, Reason, Verdict, Why};
use super::learned::LearnedNeeds;
use super::ledger::{Ledger, Reservation};
use super::need::{Need, NeedRules};
use super::nodes::{read_node, NodeState};
use super::wire::{ExtenderArgs, ExtenderFilterResult, HostPriority, NodeList, PodView};
use crate::model::cuda::{self, CudaPolicy, CudaVerdict};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// The extender's whole policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtenderPolicy {
    /// The annotation prefix the agents write under (`gpu-warden.io`).
    pub prefix: String,
    /// How a pod's need is found.
    pub needs: NeedRules,
    /// Where needs are learned from, when configured.
    pub learned: Option<super::learned::LearnedSource>,
    /// How a node is judged and scored.
    pub judge: JudgePolicy,
    /// How long a reservation lives at most.
    pub ledger_ttl: Duration,
    /// The extended resource a GPU pod asks for; other pods pass unchecked.
    pub resource: String,
    /// Which rule refuses a node whose driver's CUDA is older than a pod's known need
    /// (`cudaCheck`, default the container toolkit's: docs/cuda.md).
    pub cuda: CudaPolicy,
}

/// Why a request cannot be answered at all (a 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadRequest {
    /// The body is not JSON of the expected shape.
    #[error("the body is not kube-scheduler ExtenderArgs JSON: {0}")]
    Json(String),
    /// No `Pod`.
    #[error("ExtenderArgs has no Pod")]
    NoPod,
    /// Neither `NodeNames` nor `Nodes`.
    #[error("ExtenderArgs has neither NodeNames nor Nodes")]
    NoNodes,
}

/// The candidates as they came.
#[derive(Debug, Clone, PartialEq)]
pub enum Candidates {
    /// `NodeNames` (`nodeCacheCapable: true`): annotations from the node cache.
    Names(Vec<String>),
    /// `Nodes` (full objects): annotations from the objects.
    Objects(NodeList),
}

/// A parsed request.
#[derive(Debug, Clone)]
pub struct Call {
    /// The pod.
    pub pod: PodView,
    /// The candidates.
    pub candidates: Candidates,
}

/// Parses an `ExtenderArgs` body.
pub fn parse_call(body: &[u8]) -> Result<Call, BadRequest> {
    let args: ExtenderArgs =
        serde_json::from_slice(body).map_err(|e| BadRequest::Json(e.to_string()))?;
    let pod = args.pod.ok_or(BadRequest::NoPod)?;
    let candidates = match (args.node_names, args.nodes) {
        (Some(n), _) => Candidates::Names(n),
        (None, Some(n)) => Candidates::Objects(n),
        (None, None) => return Err(BadRequest::NoNodes),
    };
    Ok(Call { pod, candidates })
}

/// One candidate as judged: its name and what its annotations say (`None`: the node is
/// not in the extender's cache).
pub type Judged<'a> = (&'a str, Option<Arc<NodeState>>);

/// Reads the node cache for all of a call's names at once, in their order.
pub type StatesLookup<'a> = dyn Fn(&[String]) -> Vec<Option<Arc<NodeState>>> + 'a;

impl Candidates {
    /// Each candidate's node state: `lookup` reads the node cache for all the names at once
    /// (parsed once per annotation change there, not per call); full objects are read here.
    pub fn states<'a>(&'a self, lookup: &StatesLookup<'_>, prefix: &str) -> Vec<Judged<'a>> {
        match self {
            Candidates::Names(names) => names
                .iter()
                .zip(lookup(names))
                .map(|(n, s)| (n.as_str(), s))
                .collect(),
            Candidates::Objects(list) => list
                .items
                .iter()
                .map(|o| {
                    (
                        super::wire::node_name(o).unwrap_or_default(),
                        Some(Arc::new(read_node(
                            &super::wire::node_annotations(o),
                            prefix,
                        ))),
                    )
                })
                .collect(),
        }
    }
}

/// Every candidate's verdict for one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evaluation {
    /// The pod's need (`None` when its declaration is unreadable).
    pub need: Option<Need>,
    /// GPUs the pod asks for (its effective request of the resource).
    pub gpus: u64,
    /// The verdicts, in the candidates' order.
    pub verdicts: Vec<Verdict>,
}

/// Judges every candidate. Settles the ledger for the nodes it reads first (a reservation
/// the node now shows must not be counted twice).
pub fn evaluate(
    policy: &ExtenderPolicy,
    pod: &PodView,
    learned: &LearnedNeeds,
    candidates: &[Judged<'_>],
    ledger: &mut Ledger,
    now: Duration,
    wall: SystemTime,
) -> Evaluation {
    let gpus = pod.units(&policy.resource);
    let need = if gpus > 0 {
        policy.needs.need(pod, learned)
    } else {
        Ok(Need {
            mib: None,
            source: super::need::NeedSource::UnknownPassed,
            floor_mib: None,
        })
    };
    let cuda_need = if gpus > 0 {
        cuda_need(pod, policy)
    } else {
        cuda::Need::Unknown { bad: None }
    };
    // One text for every node of the call, written only when some node is refused.
    let mut cuda_how: Option<Arc<str>> = None;
    let count = gpus.clamp(1, u32::MAX as u64) as u32;
    // One text for every node of the call.
    let bad: Option<Arc<str>> = need.as_ref().err().map(|b| b.to_string().into());
    let verdicts = candidates
        .iter()
        .map(|(name, state)| match &need {
            Err(_) => Verdict {
                pass: false,
                reason: Reason::BadDeclaration,
                why: Why::BadDeclaration(bad.clone().unwrap_or_default()),
                gpu: None,
            },
            Ok(need) => {
                let state: &NodeState = state.as_deref().unwrap_or(&NodeState::Missing);
                ledger.settle(name, state, now);
                let node_cuda = match state {
                    NodeState::Known(v) => v.cuda,
                    _ => None,
                };
                if let CudaVerdict::TooOld {
                    need,
                    node,
                    minor_compatible,
                } = cuda::judge(node_cuda, &cuda_need, policy.cuda)
                {
                    let prefix = &policy.prefix;
                    let how = cuda_how
                        .get_or_insert_with(|| cuda_need.how(&cuda::key(prefix)).into())
                        .clone();
                    return Verdict {
                        pass: false,
                        reason: Reason::CudaTooOld,
                        why: Why::CudaTooOld {
                            need,
                            node,
                            minor_compatible,
                            how,
                        },
                        gpu: None,
                    };
                }
                judge(
                    state,
                    ledger.pending(name),
                    need_on(need, state, policy.judge.margin_mib),
                    count,
                    &policy.judge,
                    wall,
                )
            }
        })
        .collect();
    Evaluation {
        need: need.ok(),
        gpus,
        verdicts,
    }
}

/// The pod's CUDA need: its `<prefix>/cuda-min`, else the images of the containers that ask
/// for the GPU resource (an unreadable declaration leaves it unknown: such a pod passes).
fn cuda_need(pod: &PodView, policy: &ExtenderPolicy) -> cuda::Need {
    let spec = pod.spec.as_ref();
    let containers = spec
        .and_then(|s| s.containers.as_ref())
        .into_iter()
        .chain(spec.and_then(|s| s.init_containers.as_ref()))
        .flatten();
    let images = containers
        .filter(|c| c.units(&policy.resource) > 0)
        .filter_map(|c| c.image.as_deref());
    let none = BTreeMap::new();
    let annotations = pod.metadata.annotations.as_ref().unwrap_or(&none);
    cuda::pod_need(annotations, &cuda::key(&policy.prefix), images)
}

/// The filter reply, owned (the simulation reads it; the server writes the same bytes
/// without the copies, [`super::reply::filter_reply`]). Refused nodes go to `FailedAndUnresolvableNodes`: this extender has no
/// preempt verb, so the scheduler could not tell whether evicting pods there makes room, and
/// would preempt blindly.
pub fn filter_result(candidates: &Candidates, e: &Evaluation) -> ExtenderFilterResult {
    let mut failed = BTreeMap::new();
    let mut passed = Vec::with_capacity(e.verdicts.len());
    let names: Vec<&str> = match candidates {
        Candidates::Names(n) => n.iter().map(String::as_str).collect(),
        Candidates::Objects(l) => l
            .items
            .iter()
            .map(|o| super::wire::node_name(o).unwrap_or_default())
            .collect(),
    };
    for (i, (name, v)) in names.iter().zip(&e.verdicts).enumerate() {
        if v.pass {
            passed.push(i);
        } else {
            failed.insert(name.to_string(), v.message());
        }
    }
    let (nodes, node_names) = match candidates {
        Candidates::Names(n) => (None, Some(passed.iter().map(|i| n[*i].clone()).collect())),
        Candidates::Objects(list) => (
            Some(NodeList {
                metadata: list.metadata.clone(),
                items: passed.iter().map(|i| list.items[*i].clone()).collect(),
            }),
            None,
        ),
    };
    ExtenderFilterResult {
        nodes,
        node_names,
        failed_nodes: BTreeMap::new(),
        failed_and_unresolvable: failed,
        error: String::new(),
    }
}

/// The filter reply while the extender cannot judge yet (its node cache or pod watch has
/// not synced): a whole-call `Error`. kube-scheduler's HTTPExtender.Filter turns a non-empty
/// `Error` into an error; with `ignorable: false` findNodesThatPassExtenders returns it, the
/// scheduling cycle fails with that error (not "unschedulable"), and the pod goes back to the
/// queue with backoff to be tried again — never a blind pass (kubernetes/kubernetes
/// pkg/scheduler/extender.go, `Filter`; pkg/scheduler/schedule_one.go,
/// `findNodesThatPassExtenders`).
pub fn not_ready_result(why: &str) -> ExtenderFilterResult {
    ExtenderFilterResult {
        error: format!("gpu-warden extender is not ready ({why}); retry"),
        ..ExtenderFilterResult::default()
    }
}

/// The prioritize reply.
pub fn prioritize_result(
    policy: &ExtenderPolicy,
    candidates: &[Judged<'_>],
    e: &Evaluation,
) -> Vec<HostPriority> {
    priorities(
        candidates.iter().map(|(n, _)| *n).zip(&e.verdicts),
        policy.judge.score,
    )
}

/// `need` on the GPUs of `state` ([`Need::on_gpus_of`]), "the whole GPU" being what one
/// with nothing on it gives: the memory it shows (free + used; the driver's reserved part
/// and the quantum's rounding are neither) less the margin, the smallest of the node's
/// GPUs (one model per node on EKS). As resolved where the node cannot be read.
fn need_on(need: &Need, state: &NodeState, margin_mib: u64) -> Option<u64> {
    // Only a need known to within a bucket can turn into the whole GPU: the others (most
    // pods, declared) skip the walk over the node's GPUs on every node of every call.
    if need.floor_mib.is_none() {
        return need.mib;
    }
    match state {
        NodeState::Known(v) => match v.gpus.iter().map(|g| g.free_mib + g.used_mib).min() {
            Some(shown) if shown > margin_mib => need.on_gpus_of(shown - margin_mib),
            _ => need.mib,
        },
        _ => need.mib,
    }
}

/// The reservation for a pod this scheduler bound to a node, or `None` when its need is
/// unknown (nothing to reserve) or unreadable.
pub fn reservation_for(
    policy: &ExtenderPolicy,
    pod: &PodView,
    learned: &LearnedNeeds,
    state: Option<&NodeState>,
    pending: &[Reservation],
    now: Duration,
    wall: SystemTime,
) -> Option<Reservation> {
    let mib = need_on(
        &policy.needs.need(pod, learned).ok()?,
        state.unwrap_or(&NodeState::Missing),
        policy.judge.margin_mib,
    )?;
    let single = pod.units(&policy.resource) <= 1;
    let (gpu, baseline, baseline_at) = match state {
        // A pod of several GPUs is reserved on every GPU (its GPUs are not known one by
        // one here): more conservative than the device plugin, never less.
        Some(NodeState::Known(v)) if v.has_replicas() => (
            next_gpu(v, pending)
                .filter(|_| single)
                .map(|g| g.uuid.clone()),
            v.replicas_allocated(),
            Some(v.observed_at),
        ),
        _ => (None, None, None),
    };
    let declared_mib = pod
        .annotation(&policy.needs.annotation)
        .and_then(crate::model::vram_request::parse_mib)
        .unwrap_or(0);
    let project = pod
        .labels()
        .get(&policy.needs.project_label)
        .map(|p| (pod.namespace().to_string(), p.to_string()));
    Some(Reservation {
        pod: pod.key(),
        mib,
        gpu,
        at: now,
        at_wall: wall,
        baseline,
        baseline_at,
        bumped: Vec::new(),
        declared_mib,
        shown: false,
        project,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extender::config::PolicyFile;
    use crate::extender::judge::tests::{at, gpu, node};

    fn pod(spec: serde_json::Value, ann: serde_json::Value) -> PodView {
        serde_json::from_value(
            serde_json::json!({"metadata": {"name": "p", "namespace": "ci",
            "annotations": ann}, "spec": spec}),
        )
        .unwrap()
    }

    fn verdicts(p: &PodView, states: Vec<NodeState>) -> Evaluation {
        let policy = PolicyFile::default().policy().unwrap();
        let names: Vec<String> = (0..states.len()).map(|i| format!("n{i}")).collect();
        let judged: Vec<Judged<'_>> = names
            .iter()
            .zip(states)
            .map(|(n, s)| (n.as_str(), Some(Arc::new(s))))
            .collect();
        let mut ledger = Ledger::new(policy.ledger_ttl);
        evaluate(
            &policy,
            p,
            &LearnedNeeds::default(),
            &judged,
            &mut ledger,
            Duration::ZERO,
            at(1),
        )
    }

    #[test]
    fn a_gpu_asked_for_by_an_init_container_is_judged() {
        let tight = || node(vec![gpu(0, 2048, 20000, None)], None);
        let need = serde_json::json!({"gpu-warden.io/vram-request-mib": "8192"});
        let init_only = pod(
            serde_json::json!({"containers": [{}], "initContainers": [
                {"resources": {"limits": {"nvidia.com/gpu": "1"}}}]}),
            need.clone(),
        );
        let e = verdicts(&init_only, vec![tight()]);
        assert_eq!(e.gpus, 1);
        assert_eq!(
            (e.verdicts[0].pass, e.verdicts[0].reason),
            (false, Reason::NoRoom)
        );
        // No GPU at all: none of the extender's business.
        let cpu = pod(serde_json::json!({"containers": [{}]}), need);
        let e = verdicts(&cpu, vec![tight()]);
        assert!(e.verdicts[0].pass);
    }

    #[test]
    fn a_pod_that_declares_nothing_is_judged_on_the_default_need_not_passed() {
        let p = pod(
            serde_json::json!({"containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]}),
            serde_json::json!({}),
        );
        let e = verdicts(&p, vec![node(vec![gpu(0, 4096, 18000, None)], None)]);
        assert_eq!(
            e.need.as_ref().map(|n| n.source.clone()),
            Some(crate::extender::need::NeedSource::UnknownWholeGpu)
        );
        assert!(!e.verdicts[0].pass, "{}", e.verdicts[0].message());
    }

    #[test]
    fn a_node_whose_driver_is_older_than_a_known_cuda_need_is_refused_with_the_reason() {
        let with_cuda = |cuda: Option<(u32, u32)>| {
            let NodeState::Known(mut v) = node(vec![gpu(0, 20000, 0, None)], None) else {
                panic!("a readable node");
            };
            v.cuda = cuda.map(|(major, minor)| cuda::CudaVersion { major, minor });
            NodeState::Known(v)
        };
        let states = || {
            vec![
                with_cuda(Some((12, 4))),
                with_cuda(Some((13, 0))),
                with_cuda(None),
            ]
        };
        let gpu_pod = |image: &str, ann: serde_json::Value| {
            pod(
                serde_json::json!({"containers": [
                    {"image": "gitlab/gitlab-runner-helper:x86_64-v17.0.0"},
                    {"image": image, "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}),
                ann,
            )
        };
        let vram = || serde_json::json!({"gpu-warden.io/vram-request-mib": "1024"});
        let e = verdicts(
            &gpu_pod("nvidia/cuda:12.8.1-cudnn-runtime-ubuntu22.04", vram()),
            states(),
        );
        let got: Vec<(bool, Reason)> = e.verdicts.iter().map(|v| (v.pass, v.reason)).collect();
        assert_eq!(
            got,
            [
                (false, Reason::CudaTooOld),
                (true, Reason::Fits),
                (true, Reason::Fits)
            ],
            "a node that publishes no CUDA version (an older agent) passes"
        );
        assert_eq!(
            e.verdicts[0].message(),
            "the pod needs CUDA 12.8 (read from the image nvidia/cuda:12.8.1-cudnn-runtime-ubuntu22.04 (the nvidia/cuda tag X.Y.Z-<flavor>)) but the node's driver supports CUDA 12.4 (CUDA minor-version compatibility may run some 12.x code on it, not PTX JIT or newer APIs, and the NVIDIA container toolkit's cuda>=12.8 check refuses it): use an image built for CUDA <= 12.4, or a node group with a newer driver"
        );
        // Unknown needs pass; a declaration wins over the image.
        let e = verdicts(&gpu_pod("myorg/cuda-tools:12.8", vram()), states());
        assert!(e.verdicts.iter().all(|v| v.pass));
        let declared = serde_json::json!({"gpu-warden.io/vram-request-mib": "1024",
            "gpu-warden.io/cuda-min": "13.0"});
        let e = verdicts(
            &gpu_pod("nvidia/cuda:12.8.1-base-ubuntu22.04", declared),
            states(),
        );
        let got: Vec<bool> = e.verdicts.iter().map(|v| v.pass).collect();
        assert_eq!(got, [false, true, true]);
        assert!(e.verdicts[0]
            .message()
            .contains("(declared in gpu-warden.io/cuda-min)"));
        // The CUDA image of a container that asks for no GPU is not the pod's need.
        let sidecar = pod(
            serde_json::json!({"containers": [
                {"image": "nvidia/cuda:13.0.0-base-ubuntu24.04"},
                {"image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}),
            vram(),
        );
        assert!(verdicts(&sidecar, states()).verdicts.iter().all(|v| v.pass));
    }

    #[test]
    fn the_cuda_rule_is_a_policy_switch() {
        let p = PolicyFile::parse("cudaCheck: minorCompatible\n")
            .unwrap()
            .policy()
            .unwrap();
        assert_eq!(p.cuda, CudaPolicy::MinorCompatible);
        assert_eq!(
            PolicyFile::default().policy().unwrap().cuda,
            CudaPolicy::Strict
        );
        assert!(PolicyFile::parse("cudaCheck: lenient\n").is_err());
    }

    #[test]
    fn not_ready_is_an_error_reply_with_no_node() {
        let r = not_ready_result("the node cache has not synced");
        assert!(r.error.contains("not ready") && r.error.contains("retry"));
        assert!(r.node_names.is_none() && r.nodes.is_none());
        let j = serde_json::to_value(&r).unwrap();
        assert_eq!(j["NodeNames"], serde_json::Value::Null);
    }

    #[test]
    fn a_project_learned_past_the_gpu_gets_an_empty_gpu_not_a_refusal_forever() {
        use crate::extender::learned::LearnedNeed;
        let policy = PolicyFile::default().policy().unwrap();
        // Its jobs peak 16-21 GiB: the p95's bucket is (16, 24] GiB, past an A10G's 23028.
        let learned = LearnedNeeds::from_entries([(
            "ci".to_string(),
            "9".to_string(),
            LearnedNeed {
                mib: 24576,
                jobs: 10,
                floor_mib: 16384,
            },
        )]);
        let p: PodView = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "big", "namespace": "ci",
                         "labels": {"project.runner.gitlab.com/id": "9"}},
            "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}))
        .unwrap();
        // An empty A10G as the agents show it (free rounded down to the quantum), and one
        // with a 1 GiB job on it.
        let empty = node(vec![gpu(0, 22784, 0, Some((0, 4, 0)))], None);
        let busy = node(vec![gpu(0, 21760, 1024, Some((1, 4, 0)))], None);
        let judged: Vec<Judged<'_>> = vec![
            ("empty", Some(Arc::new(empty.clone()))),
            ("busy", Some(Arc::new(busy))),
        ];
        let mut ledger = Ledger::new(policy.ledger_ttl);
        let e = evaluate(
            &policy,
            &p,
            &learned,
            &judged,
            &mut ledger,
            Duration::ZERO,
            at(1),
        );
        assert!(e.verdicts[0].pass, "{}", e.verdicts[0].message());
        assert!(!e.verdicts[1].pass, "{}", e.verdicts[1].message());
        // Reserved as the whole GPU (22784 shown less the 512 margin), so nothing joins it
        // until the node shows it.
        let r = reservation_for(
            &policy,
            &p,
            &learned,
            Some(&empty),
            &[],
            Duration::ZERO,
            at(1),
        )
        .unwrap();
        assert_eq!(r.mib, 22784 - 512);
        assert_eq!(r.project, Some(("ci".into(), "9".into())));
    }
}
