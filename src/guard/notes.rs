//! What the guard tells the cluster about a decision (docs/guard.md): one Event on each
//! evicted (dry-run: planned) victim pod and one on the Node. Pure: the enforcer shell
//! hands in the decision, the outcomes and the wall time, and sends what comes out.
//!
//! The notes are written for the person who opens `kubectl describe pod` after their CI
//! job vanished: which GPU was full, by how much, what their pod used, why it was chosen,
//! and which GitLab job it was.

use super::decision::{Decision, EvictionOutcome};
use super::policy::Mode;
use super::rank::{Victim, CI_JOB_ID_ANNOTATION, CI_JOB_URL_ANNOTATION};
use crate::model::pod::PodMap;
use crate::model::snapshot::MIB;
use std::fmt::Write as _;

/// `reportingController` of every Event the guard emits.
pub const REPORTING_CONTROLLER: &str = "gpu-warden.io/guard";
/// Reason of the Events of an enforced decision.
pub const REASON_PRESSURE: &str = "GPUMemoryPressure";
/// Reason of the Events of a dry-run decision.
pub const REASON_DRY_RUN: &str = "GPUMemoryPressureDryRun";
/// Action of an enforced decision's Events.
pub const ACTION_EVICT: &str = "Evict";
/// Action of a dry-run decision's Events: distinct from [`ACTION_EVICT`] so that anything
/// counting `action=Evict` counts only real evictions.
pub const ACTION_WOULD_EVICT: &str = "WouldEvict";
/// Namespace the Node Events are created in (a Node has none; kubelet uses `default`).
pub const NODE_EVENT_NAMESPACE: &str = "default";
/// `events.k8s.io/v1` rejects a longer `note` (bytes, as the API server counts).
pub const NOTE_LIMIT: usize = 1024;
/// GitLab Runner's job-name annotation, quoted next to the job ID when present.
pub const CI_JOB_NAME_ANNOTATION: &str = "job.runner.gitlab.com/name";

/// The API server rejects `action`, `reason` and `reportingInstance` longer than this.
const FIELD_LIMIT: usize = 128;
/// Room kept for the API server's generated suffix under the 253-byte name limit.
const NAME_PREFIX_LIMIT: usize = 200;
/// A CI annotation value is quoted at most this long, so one absurd URL cannot push the
/// GPU figures out of the note.
const CI_VALUE_LIMIT: usize = 256;
/// Outcome details quoted in the Node note are cut to this, for the same reason.
const DETAIL_LIMIT: usize = 160;

pub use crate::model::event::{EventDraft, EventType, Regarding};

/// The Events of one decision: in dry-run, a Normal Event on each planned victim; in
/// enforce, a Warning Event on each pod the Eviction API accepted (`outcomes`, in the order
/// tried); in both, exactly one Event on the Node, last. Mode `off` makes no decisions and
/// gets no Events.
pub fn drafts(
    decision: &Decision,
    outcomes: &[(String, EvictionOutcome)],
    pods: &PodMap,
    node: &str,
    request_key: &str,
) -> Vec<EventDraft> {
    let (type_, reason, action) = match decision.mode {
        Mode::Off => return Vec::new(),
        Mode::DryRun => (EventType::Normal, REASON_DRY_RUN, ACTION_WOULD_EVICT),
        Mode::Enforce => (EventType::Warning, REASON_PRESSURE, ACTION_EVICT),
    };
    let victims: Vec<(usize, &Victim)> = match decision.mode {
        Mode::DryRun => decision.planned_victims().iter().enumerate().collect(),
        _ => outcomes
            .iter()
            .filter(|(_, o)| *o == EvictionOutcome::Evicted)
            .filter_map(|(uid, _)| {
                decision
                    .candidates
                    .iter()
                    .enumerate()
                    .find(|(_, v)| v.uid == *uid)
            })
            .collect(),
    };
    let mut out: Vec<EventDraft> = victims
        .into_iter()
        .map(|(rank, v)| EventDraft {
            namespace: v.namespace.clone(),
            regarding: Regarding::Pod {
                namespace: v.namespace.clone(),
                name: v.name.clone(),
                uid: v.uid.clone(),
            },
            type_,
            reason,
            action,
            note: victim_note(decision, rank, v, pods, node, request_key),
        })
        .collect();
    out.push(EventDraft {
        namespace: NODE_EVENT_NAMESPACE.to_string(),
        regarding: Regarding::Node {
            name: node.to_string(),
        },
        type_: if decision.mode == Mode::DryRun {
            EventType::Normal
        } else {
            EventType::Warning
        },
        reason,
        action,
        note: node_note(decision, outcomes),
    });
    out
}

/// The CI/CD variable a job sets its declared need with: GitLab Runner's Kubernetes executor
/// turns every `KUBERNETES_POD_ANNOTATIONS_<suffix>: "key=value"` variable into a pod
/// annotation (when the runner's `pod_annotations_overwrite_allowed` lets that key through).
pub const JOB_ANNOTATION_VARIABLE: &str = "KUBERNETES_POD_ANNOTATIONS_VRAM";

/// The note on a victim pod. `rank` is its 0-based place among the candidates;
/// `request_key` is the annotation a pod declares its VRAM with (`<prefix>/vram-request-mib`).
///
/// Written for the job log first (docs/guard.md, "What the job's author sees"): GitLab
/// Runner prints a failed job pod's Warning Events as `WARNING: Event retrieved from the
/// cluster: <note>`, the note alone, no reason or type. So the note opens with one sentence
/// a developer can act on: what happened, what the job used against what it declared, and
/// the exact variable to declare next time; the figures an operator wants follow after
/// "Details:".
pub fn victim_note(
    decision: &Decision,
    rank: usize,
    victim: &Victim,
    pods: &PodMap,
    node: &str,
    request_key: &str,
) -> String {
    let job = ci_job(victim, pods);
    let who = if job.is_some() { "job" } else { "pod" };
    let (used, declared) = (mib(victim.use_bytes), mib(victim.request_bytes));
    let mut s = String::new();
    // `write!` into a String cannot fail; the results are ignored for that reason.
    let _ = match decision.mode {
        Mode::Enforce => write!(s, "gpu-warden evicted this {who} to keep GPU {} from running out of memory for every job on it", decision.gpu),
        _ => write!(s, "Dry run, nothing was done: gpu-warden would have evicted this {who} to keep GPU {} from running out of memory for every job on it", decision.gpu),
    };
    let _ = match (declared, victim.use_bytes > victim.request_bytes) {
        (0, _) => write!(s, ": it used {used} MiB of GPU memory and declared none."),
        (_, true) => write!(
            s,
            ": it used {used} MiB of GPU memory, {} MiB more than the {declared} MiB it declared.",
            used - declared
        ),
        (_, false) => write!(
            s,
            ": it used {used} MiB of GPU memory, within the {declared} MiB it declared."
        ),
    };
    let key = clean(request_key, FIELD_LIMIT);
    let _ = if victim.use_bytes > victim.request_bytes {
        // Its use when stopped, rounded up to a GiB: a lower bound, since it was growing.
        let next = used.div_ceil(1024).max(1) * 1024;
        write!(s, " Next time declare what it needs, e.g. the CI/CD variable {JOB_ANNOTATION_VARIABLE}: \"{key}={next}\" (its use when stopped, rounded up to a GiB; it was still growing, so it may need more).")
    } else {
        write!(s, " Retry it; if it needs more, declare it with the CI/CD variable {JOB_ANNOTATION_VARIABLE}: \"{key}=<MiB>\".")
    };
    let _ = write!(
        s,
        " Details: GPU {} ({}) on node {}: {} of {} MiB used, {} MiB free (soft {} MiB, hard {} \
         MiB; trigger {}). Ranked {} of {}: {}.",
        decision.gpu,
        clean(&decision.uuid, CI_VALUE_LIMIT),
        clean(node, FIELD_LIMIT),
        mib(decision.used),
        mib(decision.total),
        mib(decision.free),
        mib(decision.levels.soft),
        mib(decision.levels.hard),
        decision.trigger.as_str(),
        rank + 1,
        decision.candidates.len(),
        clean(&victim.reason, NOTE_LIMIT),
    );
    if let Some(job) = job {
        let _ = write!(s, " {job}.");
    }
    let _ = write!(s, " Decision {}.", decision.id);
    truncate_note(s, NOTE_LIMIT)
}

/// The note on the Node: the decision's summary, then what became of each attempt (or,
/// when nobody could be chosen, why not).
pub fn node_note(decision: &Decision, outcomes: &[(String, EvictionOutcome)]) -> String {
    let mut s = String::new();
    if decision.mode == Mode::DryRun {
        s.push_str("Dry run: ");
    }
    s.push_str(&clean(&decision.summary(), NOTE_LIMIT));
    s.push('.');
    match decision.mode {
        Mode::DryRun => s.push_str(" Nothing was evicted."),
        _ if outcomes.is_empty() => s.push_str(" Nothing was evicted."),
        _ => {
            s.push_str(" Results:");
            for (i, (uid, outcome)) in outcomes.iter().enumerate() {
                let who = decision
                    .candidates
                    .iter()
                    .find(|v| v.uid == *uid)
                    .map_or_else(
                        || clean(uid, FIELD_LIMIT),
                        |v| {
                            format!(
                                "{}/{}",
                                clean(&v.namespace, FIELD_LIMIT),
                                clean(&v.name, FIELD_LIMIT)
                            )
                        },
                    );
                let sep = if i == 0 { " " } else { "; " };
                let _ = write!(s, "{sep}{who} {}", outcome.as_str());
                if let Some(d) = outcome.detail() {
                    let _ = write!(s, " ({})", clean(d, DETAIL_LIMIT));
                }
            }
            s.push('.');
        }
    }
    if decision.candidates.is_empty() && !decision.excluded.is_empty() {
        s.push_str(" No eligible pod:");
        for (i, e) in decision.excluded.iter().enumerate() {
            let sep = if i == 0 { " " } else { "; " };
            let _ = write!(
                s,
                "{sep}{}/{} ({})",
                clean(&e.namespace, FIELD_LIMIT),
                clean(&e.name, FIELD_LIMIT),
                clean(&e.exclusion.to_string(), DETAIL_LIMIT)
            );
        }
        s.push('.');
    }
    truncate_note(s, NOTE_LIMIT)
}

/// "GitLab CI job 123 "name" (url)" from the victim's annotations, when it has any.
fn ci_job(victim: &Victim, pods: &PodMap) -> Option<String> {
    let annotations = pods.get(&victim.uid).map(|p| &p.annotations);
    let from_pod = |key: &str| annotations.and_then(|a| a.get(key)).cloned();
    let id = victim
        .ci_job_id
        .clone()
        .or_else(|| from_pod(CI_JOB_ID_ANNOTATION));
    let url = victim
        .ci_job_url
        .clone()
        .or_else(|| from_pod(CI_JOB_URL_ANNOTATION));
    let name = from_pod(CI_JOB_NAME_ANNOTATION);
    if id.is_none() && url.is_none() {
        return None;
    }
    let mut s = String::from("GitLab CI job");
    if let Some(id) = &id {
        let _ = write!(s, " {}", clean(id, CI_VALUE_LIMIT));
    }
    if let Some(name) = &name {
        let _ = write!(s, " {:?}", clean(name, CI_VALUE_LIMIT));
    }
    if let Some(url) = &url {
        let _ = write!(s, " ({})", clean(url, CI_VALUE_LIMIT));
    }
    Some(s)
}

fn mib(bytes: u64) -> u64 {
    bytes / MIB
}

/// Makes foreign text (annotation values, names) safe to quote on one line: control
/// characters become spaces, and it is cut to `max` bytes on a character boundary.
pub fn clean(s: &str, max: usize) -> String {
    let one_line: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    truncate_note(one_line, max)
}

/// Cuts `s` to at most `max` bytes on a character boundary, marking the cut with `…`.
pub fn truncate_note(mut s: String, max: usize) -> String {
    if s.len() <= max {
        return s;
    }
    const MARK: &str = "…";
    let mut end = max.saturating_sub(MARK.len());
    while end > 0 && !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    if s.len() + MARK.len() <= max {
        s.push_str(MARK);
    }
    s
}

/// `generateName` for an Event about `object`: a valid DNS-subdomain prefix however odd
/// the object's name (the API server appends a random suffix, so Events never collide).
pub fn event_name_prefix(object: &str) -> String {
    let mapped: String = object
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let mut base = mapped
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string();
    base.truncate(NAME_PREFIX_LIMIT);
    let base = base.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    if base.is_empty() {
        "gpu-warden.".to_string()
    } else {
        format!("{base}.")
    }
}

/// `reportingInstance`: `gpu-warden-<node>`, cut to the API's 128 characters.
pub fn reporting_instance(node: &str) -> String {
    truncate_bytes(format!("gpu-warden-{node}"), FIELD_LIMIT)
}

fn truncate_bytes(mut s: String, max: usize) -> String {
    let mut end = max.min(s.len());
    while end > 0 && !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    s
}

/// The name of the object an Event is about.
pub fn regarding_name(regarding: &Regarding) -> &str {
    match regarding {
        Regarding::Pod { name, .. } | Regarding::Node { name } => name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::policy::Policy;
    use crate::guard::state::Guard;
    use crate::testkit::fixtures::*;

    const TOTAL: u64 = 10_000;
    const KEY: &str = "gpu-warden.io/vram-request-mib";

    fn decide(
        mode: Mode,
        pods_: Vec<PodBuilder>,
        procs: Vec<crate::model::snapshot::ProcessSample>,
    ) -> (Decision, PodMap) {
        let mut g = Guard::new(Policy {
            mode,
            ..Policy::default()
        });
        let ps = pods(pods_);
        let mut ds = g.observe(
            &std::sync::Arc::new(snap(vec![gpu(0, TOTAL, 9600)], procs)),
            &std::sync::Arc::new(ps.clone()),
            secs(0.0),
        );
        assert_eq!(ds.len(), 1);
        (ds.remove(0), ps)
    }

    fn ci_pod() -> PodBuilder {
        pod("ci1")
            .name("build-123")
            .annotation(CI_JOB_ID_ANNOTATION, "4242")
            .annotation(
                CI_JOB_URL_ANNOTATION,
                "https://gitlab.example.com/g/p/-/jobs/4242",
            )
            .annotation(CI_JOB_NAME_ANNOTATION, "test:gpu")
            .request_mib(1000)
    }

    #[test]
    fn victim_note_names_gpu_memory_use_reason_and_job() {
        let (d, ps) = decide(
            Mode::Enforce,
            vec![ci_pod(), pod("train").priority(1000)],
            vec![proc_in("ci1", 0, 3000), proc_in("train", 0, 6000)],
        );
        let v = &d.candidates[0];
        let note = victim_note(&d, 0, v, &ps, "gpu-node-1", KEY);
        // (fragment, why it must be there)
        let rows = [
            (
                "gpu-warden evicted this job to keep GPU 0 from running out of memory",
                "what happened",
            ),
            ("GPU 0 (GPU-00000000)", "GPU index and UUID"),
            (
                "9600 of 10000 MiB used, 400 MiB free",
                "used/total/free MiB",
            ),
            (
                "soft 1000 MiB, hard 500 MiB; trigger hard",
                "thresholds and trigger",
            ),
            (
                "it used 3000 MiB of GPU memory, 2000 MiB more than the 1000 MiB it declared.",
                "the pod's own use against its request",
            ),
            (
                "KUBERNETES_POD_ANNOTATIONS_VRAM: \"gpu-warden.io/vram-request-mib=3072\"",
                "what to declare next time",
            ),
            (
                "Ranked 1 of 2: uses 2.9 GiB, 2.0 GiB over its request of 1000 MiB",
                "why first",
            ),
            (
                "GitLab CI job 4242 \"test:gpu\" (https://gitlab.example.com/g/p/-/jobs/4242)",
                "CI job",
            ),
            ("on node gpu-node-1", "the node"),
            ("Decision 1.", "the decision"),
        ];
        for (frag, why) in rows {
            assert!(note.contains(frag), "{why}: {frag:?} not in {note:?}");
        }
        assert!(note.len() <= NOTE_LIMIT);
    }

    /// The line a developer reads in the failed job's log: GitLab Runner (Kubernetes
    /// executor, `print_pod_warning_events`, on by default) lists the pod's Warning Events
    /// and prints each as `WARNING: Event retrieved from the cluster: <message>`; `message`
    /// is this note (the API server's core/v1 view of an events.k8s.io/v1 Event). Pinned
    /// whole: a change to what the job's author reads is a change to this test.
    #[test]
    fn the_job_log_line_is_pinned() {
        let (d, ps) = decide(
            Mode::Enforce,
            vec![ci_pod(), pod("train").priority(1000)],
            vec![proc_in("ci1", 0, 3000), proc_in("train", 0, 6000)],
        );
        let note = victim_note(&d, 0, &d.candidates[0], &ps, "gpu-node-1", KEY);
        let line = format!("WARNING: Event retrieved from the cluster: {note}");
        assert_eq!(
            line,
            "WARNING: Event retrieved from the cluster: gpu-warden evicted this job to keep GPU 0 \
             from running out of memory for every job on it: it used 3000 MiB of GPU memory, 2000 \
             MiB more than the 1000 MiB it declared. Next time declare what it needs, e.g. the \
             CI/CD variable KUBERNETES_POD_ANNOTATIONS_VRAM: \"gpu-warden.io/vram-request-mib=3072\" \
             (its use when stopped, rounded up to a GiB; it was still growing, so it may need \
             more). Details: GPU 0 (GPU-00000000) on node gpu-node-1: 9600 of 10000 MiB used, 400 \
             MiB free (soft 1000 MiB, hard 500 MiB; trigger hard). Ranked 1 of 2: uses 2.9 GiB, \
             2.0 GiB over its request of 1000 MiB; priority 0 (lowest on GPU 0); lower priority \
             than the next candidate (1000). GitLab CI job 4242 \"test:gpu\" \
             (https://gitlab.example.com/g/p/-/jobs/4242). Decision 1."
        );
        assert!(!line.contains('\n'), "one line in the job log");
        // A job that stayed within its declaration is told so, and not told to declare its use.
        let (d, ps) = decide(
            Mode::Enforce,
            vec![ci_pod().request_mib(4000)],
            vec![proc_in("ci1", 0, 3000)],
        );
        let note = victim_note(&d, 0, &d.candidates[0], &ps, "gpu-node-1", KEY);
        assert!(
            note.starts_with(
                "gpu-warden evicted this job to keep GPU 0 from running out of memory for every \
                 job on it: it used 3000 MiB of GPU memory, within the 4000 MiB it declared. Retry \
                 it; if it needs more, declare it with the CI/CD variable \
                 KUBERNETES_POD_ANNOTATIONS_VRAM: \"gpu-warden.io/vram-request-mib=<MiB>\"."
            ),
            "{note}"
        );
    }

    #[test]
    fn victim_note_without_ci_annotations_has_no_job() {
        let (d, ps) = decide(Mode::DryRun, vec![pod("a")], vec![proc_in("a", 0, 3000)]);
        let note = victim_note(&d, 0, &d.candidates[0], &ps, "n", KEY);
        assert!(
            note.starts_with("Dry run, nothing was done: gpu-warden would have evicted this pod"),
            "{note}"
        );
        assert!(!note.contains("GitLab"), "{note}");
        assert!(
            note.contains("it used 3000 MiB of GPU memory and declared none."),
            "{note}"
        );
    }

    #[test]
    fn ci_job_falls_back_to_the_pod_view_and_accepts_partial_annotations() {
        let (d, _) = decide(Mode::Enforce, vec![pod("a")], vec![proc_in("a", 0, 3000)]);
        let v = &d.candidates[0];
        type Row<'a> = (&'a [(&'a str, &'a str)], Option<&'a str>);
        let rows: [Row; 4] = [
            (&[], None),
            (&[(CI_JOB_ID_ANNOTATION, "7")], Some("GitLab CI job 7")),
            (
                &[(CI_JOB_URL_ANNOTATION, "https://x/7")],
                Some("GitLab CI job (https://x/7)"),
            ),
            (
                &[
                    (CI_JOB_ID_ANNOTATION, "7"),
                    (CI_JOB_NAME_ANNOTATION, "lint"),
                ],
                Some("GitLab CI job 7 \"lint\""),
            ),
        ];
        for (annotations, want) in rows {
            let mut p = pod("a");
            for (k, val) in annotations {
                p = p.annotation(k, val);
            }
            let ps = pods([p]);
            assert_eq!(ci_job(v, &ps).as_deref(), want, "{annotations:?}");
        }
    }

    #[test]
    fn hostile_input_stays_on_one_line_and_within_the_limit() {
        let long_url = format!("https://gitlab.example.com/{}", "é".repeat(5000));
        let p = pod("h")
            .name(&format!("x{}", "ü".repeat(300)))
            .annotation(CI_JOB_ID_ANNOTATION, "1\n2\r\u{1b}[31m3")
            .annotation(CI_JOB_URL_ANNOTATION, &long_url);
        let (d, ps) = decide(Mode::Enforce, vec![p], vec![proc_in("h", 0, 3000)]);
        let note = victim_note(&d, 0, &d.candidates[0], &ps, &"n".repeat(400), KEY);
        assert!(note.len() <= NOTE_LIMIT, "{}", note.len());
        assert!(!note.chars().any(char::is_control), "{note:?}");
        assert!(note.contains("GitLab CI job 1 2  [31m3"), "{note}");
        let outcomes = vec![(
            "h".to_string(),
            EvictionOutcome::Failed("boom\n".repeat(500)),
        )];
        let node = node_note(&d, &outcomes);
        assert!(node.len() <= NOTE_LIMIT);
        assert!(!node.chars().any(char::is_control));
    }

    #[test]
    fn truncation_keeps_char_boundaries() {
        // (input, limit, expected)
        let rows = [
            ("short", 10, "short"),
            ("exactly10!", 10, "exactly10!"),
            ("0123456789ab", 10, "0123456…"),
            ("ééééé", 6, "é…"), // é is 2 bytes, … is 3
            ("€€€", 5, "…"),
            ("abc", 2, ""),
        ];
        for (input, limit, want) in rows {
            let got = truncate_note(input.to_string(), limit);
            assert_eq!(got, want, "{input:?} @ {limit}");
            assert!(got.len() <= limit);
        }
    }

    #[test]
    fn event_names_are_valid_whatever_the_object_name() {
        let rows = [
            ("build-123", "build-123."),
            ("Build_123", "build-123."),
            ("..--weird--..", "weird."),
            ("ünïcödé", "n-c-d."),
            ("", "gpu-warden."),
            ("???", "gpu-warden."),
        ];
        for (name, want) in rows {
            assert_eq!(event_name_prefix(name), want, "{name:?}");
        }
        let long = event_name_prefix(&"a".repeat(400));
        assert_eq!(long.len(), NAME_PREFIX_LIMIT + 1);
        assert_eq!(reporting_instance(&"n".repeat(300)).len(), FIELD_LIMIT);
        assert_eq!(reporting_instance("gpu-1"), "gpu-warden-gpu-1");
    }

    #[test]
    fn drafts_per_mode_and_outcome() {
        let procs = vec![
            proc_in("a", 0, 300),
            proc_in("b", 0, 300),
            proc_in("c", 0, 300),
        ];
        let three = || vec![pod("a"), pod("b").priority(1), pod("c").priority(2)];
        // Dry-run: a Normal Event on each planned victim and one on the Node.
        let (d, ps) = decide(Mode::DryRun, three(), procs.clone());
        assert_eq!(d.planned, 3);
        let ds = drafts(&d, &[], &ps, "gpu-1", KEY);
        let kinds: Vec<_> = ds
            .iter()
            .map(|e| {
                (
                    e.type_,
                    e.reason,
                    e.action,
                    regarding_name(&e.regarding).to_string(),
                )
            })
            .collect();
        assert_eq!(
            kinds,
            vec![
                (
                    EventType::Normal,
                    REASON_DRY_RUN,
                    ACTION_WOULD_EVICT,
                    "a".to_string()
                ),
                (
                    EventType::Normal,
                    REASON_DRY_RUN,
                    ACTION_WOULD_EVICT,
                    "b".to_string()
                ),
                (
                    EventType::Normal,
                    REASON_DRY_RUN,
                    ACTION_WOULD_EVICT,
                    "c".to_string()
                ),
                (
                    EventType::Normal,
                    REASON_DRY_RUN,
                    ACTION_WOULD_EVICT,
                    "gpu-1".to_string()
                ),
            ]
        );
        assert!(
            ds[3].note.starts_with("Dry run: GPU 0 (GPU-00000000)"),
            "{}",
            ds[3].note
        );
        assert!(ds[3].note.contains("Nothing was evicted."));
        assert_eq!(ds[3].namespace, NODE_EVENT_NAMESPACE);

        // Enforce: Warning Events only on pods the API accepted; the Node note lists all.
        let (d, ps) = decide(Mode::Enforce, three(), procs);
        let outcomes = vec![
            (
                "a".to_string(),
                EvictionOutcome::Blocked("429: PDB ci/pdb".into()),
            ),
            ("b".to_string(), EvictionOutcome::Evicted),
            ("c".to_string(), EvictionOutcome::AlreadyGone),
        ];
        let ds = drafts(&d, &outcomes, &ps, "gpu-1", KEY);
        assert_eq!(ds.len(), 2);
        assert_eq!(ds[0].type_, EventType::Warning);
        assert_eq!(
            (ds[0].reason, ds[0].action),
            (REASON_PRESSURE, ACTION_EVICT)
        );
        assert_eq!(
            ds[0].regarding,
            Regarding::Pod {
                namespace: "ci".into(),
                name: "b".into(),
                uid: "b".into()
            }
        );
        assert!(ds[0].note.contains("Ranked 2 of 3"), "{}", ds[0].note);
        assert_eq!(
            ds[1].regarding,
            Regarding::Node {
                name: "gpu-1".into()
            }
        );
        assert_eq!(ds[1].type_, EventType::Warning);
        assert!(
            ds[1].note.contains(
                "Results: ci/a blocked (429: PDB ci/pdb); ci/b evicted; ci/c already_gone."
            ),
            "{}",
            ds[1].note
        );

        // Mode off never decides, but if handed a decision it says nothing.
        let mut off = d.clone();
        off.mode = Mode::Off;
        assert!(drafts(&off, &outcomes, &ps, "gpu-1", KEY).is_empty());
    }

    #[test]
    fn node_note_explains_an_empty_decision() {
        let (d, ps) = decide(
            Mode::Enforce,
            vec![pod("sys").ns("kube-system"), pod("ds").owner("DaemonSet")],
            vec![proc_in("sys", 0, 3000), proc_in("ds", 0, 1000)],
        );
        assert!(d.candidates.is_empty());
        let ds = drafts(&d, &[], &ps, "gpu-1", KEY);
        assert_eq!(ds.len(), 1, "only the Node Event");
        let note = &ds[0].note;
        assert!(note.contains("Nothing was evicted."), "{note}");
        assert!(note.contains("No eligible pod:"), "{note}");
        assert!(
            note.contains("kube-system/sys (namespace is excluded)"),
            "{note}"
        );
        assert!(note.contains("ci/ds (DaemonSet pod)"), "{note}");
    }
}
