//! When the guard holds its decisions: while the pod view it would rank victims on cannot be
//! vouched for (docs/guard.md, "When the API server does not answer").

use crate::model::pod::PodViewStatus;

/// Why the guard must hold its decisions on a pod view in `status`, if it must: a view that
/// has not synced, or whose watch is failing, may be missing a deletion or a priority change.
pub fn hold_reason(status: &PodViewStatus) -> Option<String> {
    if !status.synced {
        Some("the pod view has not synced yet".to_string())
    } else if !status.healthy {
        Some(format!(
            "the pod watch is failing: {}",
            status.last_error.clone().unwrap_or_default()
        ))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_synced_healthy_view_is_decided_on() {
        let st = |synced, healthy, err: Option<&str>| PodViewStatus {
            synced,
            healthy,
            last_error: err.map(str::to_string),
            ..PodViewStatus::default()
        };
        assert_eq!(
            hold_reason(&st(false, false, None)).as_deref(),
            Some("the pod view has not synced yet")
        );
        assert_eq!(
            hold_reason(&st(true, false, Some("410 Gone"))).as_deref(),
            Some("the pod watch is failing: 410 Gone")
        );
        assert_eq!(hold_reason(&st(true, true, None)), None);
    }
}
