//! One extender call, pure: the pod's need, each candidate's verdict, and the reply. The
//! shell hands in the candidates' annotations, the ledger and the time.

use super::judge::{judge, next_gpu, priorities, JudgePolicy, Reason, Verdict};
use super::ledger::{Ledger, Reservation};
use super::need::{Need, NeedRules};
use super::nodes::{read_node, NodeState};
use super::wire::{ExtenderArgs, ExtenderFilterResult, HostPriority, NodeList, PodView};
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

/// The extender's whole policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtenderPolicy {
    /// The annotation prefix the agents write under (`gpu-warden.io`).
    pub prefix: String,
    /// How a pod's need is found.
    pub needs: NeedRules,
    /// How a node is judged and scored.
    pub judge: JudgePolicy,
    /// How long a reservation lives at most.
    pub ledger_ttl: Duration,
    /// The extended resource a GPU pod asks for; other pods pass unchecked.
    pub resource: String,
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

impl Candidates {
    /// `(name, annotations)` of each candidate; `lookup` reads the node cache for names
    /// (`None`: not in the cache).
    pub fn annotated(
        &self,
        lookup: &dyn Fn(&str) -> Option<BTreeMap<String, String>>,
    ) -> Vec<(String, Option<BTreeMap<String, String>>)> {
        match self {
            Candidates::Names(names) => names.iter().map(|n| (n.clone(), lookup(n))).collect(),
            Candidates::Objects(list) => list
                .items
                .iter()
                .map(|o| {
                    (
                        super::wire::node_name(o).unwrap_or_default().to_string(),
                        Some(super::wire::node_annotations(o)),
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
    /// `(node, verdict)` in the candidates' order.
    pub verdicts: Vec<(String, Verdict)>,
}

/// Judges every candidate. Settles the ledger for the nodes it reads first (a reservation
/// the node now shows must not be counted twice).
pub fn evaluate(
    policy: &ExtenderPolicy,
    pod: &PodView,
    candidates: &[(String, Option<BTreeMap<String, String>>)],
    ledger: &mut Ledger,
    now: Duration,
    wall: SystemTime,
) -> Evaluation {
    let need = if pod.requests_resource(&policy.resource) {
        policy.needs.need(pod)
    } else {
        Ok(Need {
            mib: None,
            source: super::need::NeedSource::UnknownPassed,
        })
    };
    let verdicts = candidates
        .iter()
        .map(|(name, ann)| {
            let verdict = match &need {
                Err(bad) => Verdict {
                    pass: false,
                    reason: Reason::BadDeclaration,
                    message: bad.to_string(),
                    gpu: None,
                },
                Ok(need) => {
                    let state = match ann {
                        Some(a) => read_node(a, &policy.prefix),
                        None => NodeState::Missing,
                    };
                    ledger.settle(name, &state, now);
                    judge(&state, ledger.pending(name), need.mib, &policy.judge, wall)
                }
            };
            (name.clone(), verdict)
        })
        .collect();
    Evaluation {
        need: need.ok(),
        verdicts,
    }
}

/// The filter reply. Refused nodes go to `FailedAndUnresolvableNodes`: this extender has no
/// preempt verb, so the scheduler could not tell whether evicting pods there makes room, and
/// would preempt blindly.
pub fn filter_result(candidates: &Candidates, e: &Evaluation) -> ExtenderFilterResult {
    let passed: std::collections::BTreeSet<&str> = e
        .verdicts
        .iter()
        .filter(|(_, v)| v.pass)
        .map(|(n, _)| n.as_str())
        .collect();
    let failed = e
        .verdicts
        .iter()
        .filter(|(_, v)| !v.pass)
        .map(|(n, v)| (n.clone(), v.message.clone()))
        .collect();
    let (nodes, node_names) = match candidates {
        Candidates::Names(names) => (
            None,
            Some(
                names
                    .iter()
                    .filter(|n| passed.contains(n.as_str()))
                    .cloned()
                    .collect(),
            ),
        ),
        Candidates::Objects(list) => (
            Some(NodeList {
                metadata: list.metadata.clone(),
                items: list
                    .items
                    .iter()
                    .filter(|o| super::wire::node_name(o).is_some_and(|n| passed.contains(n)))
                    .cloned()
                    .collect(),
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

/// The prioritize reply.
pub fn prioritize_result(policy: &ExtenderPolicy, e: &Evaluation) -> Vec<HostPriority> {
    priorities(
        e.verdicts.iter().map(|(n, v)| (n.as_str(), v)),
        policy.judge.score,
    )
}

/// The reservation for a pod this scheduler bound to a node, or `None` when its need is
/// unknown (nothing to reserve) or unreadable.
pub fn reservation_for(
    policy: &ExtenderPolicy,
    pod: &PodView,
    node_annotations: Option<&BTreeMap<String, String>>,
    pending: &[Reservation],
    now: Duration,
    wall: SystemTime,
) -> Option<Reservation> {
    let mib = policy.needs.need(pod).ok()?.mib?;
    let state = node_annotations.map(|a| read_node(a, &policy.prefix));
    let (gpu, baseline) = match &state {
        Some(NodeState::Known(v)) if v.has_replicas() => (
            next_gpu(v, pending).map(|g| g.uuid.clone()),
            v.replicas_allocated(),
        ),
        _ => (None, None),
    };
    Some(Reservation {
        pod: pod.key(),
        mib,
        gpu,
        at: now,
        at_wall: wall,
        baseline,
    })
}
