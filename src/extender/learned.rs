//! Needs learned from the cluster: for each GitLab project, the p95 of its CI jobs' VRAM
//! peaks, read from the histogram the agents export (`gpu_warden_ci_job_gpu_memory_peak_bytes`,
//! `publish::job_peaks`) through Prometheus's HTTP API. Pure: the shell
//! (`extender::prometheus`) fetches the query result; this reads it.
//!
//! The query is `sum by (namespace, project, le) (increase(<histogram>_bucket[<window>]))`:
//! every job peak of the window, by project. The p95 is taken as the *upper bound* of the
//! bucket holding the 95th percentile, not interpolated inside it (`histogram_quantile`
//! would): a need is a promise of room, so rounding up is the safe side.

use std::time::Duration;

use serde::Deserialize;
use std::collections::HashMap;

/// The histogram the agents export.
pub const HISTOGRAM: &str = "gpu_warden_ci_job_gpu_memory_peak_bytes";

/// A project's learned need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LearnedNeed {
    /// The p95 of its jobs' peaks, rounded up to a bucket bound, MiB.
    pub mib: u64,
    /// How many job peaks it was learned from (rounded down).
    pub jobs: u64,
    /// The lower bound of the p95's bucket (the bucket below's upper bound; 0 for the
    /// first), MiB: the p95 lies in `(floor_mib, mib]`.
    pub floor_mib: u64,
}

/// Learned needs by `(namespace, project)`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LearnedNeeds {
    by_project: HashMap<(String, String), LearnedNeed>,
}

impl LearnedNeeds {
    /// The need learned for `project` in `namespace`.
    pub fn get(&self, namespace: &str, project: &str) -> Option<LearnedNeed> {
        // A lookup without allocating a key: the table is small (one entry per project).
        self.by_project
            .iter()
            .find(|((ns, p), _)| ns == namespace && p == project)
            .map(|(_, n)| *n)
    }

    /// How many projects have a need.
    pub fn len(&self) -> usize {
        self.by_project.len()
    }

    /// Whether none has.
    pub fn is_empty(&self) -> bool {
        self.by_project.is_empty()
    }

    /// A table from `(namespace, project, need)` entries (tests, the simulation).
    pub fn from_entries(entries: impl IntoIterator<Item = (String, String, LearnedNeed)>) -> Self {
        LearnedNeeds {
            by_project: entries.into_iter().map(|(ns, p, n)| ((ns, p), n)).collect(),
        }
    }
}

/// The PromQL the shell sends.
pub fn query(window: &str) -> String {
    format!("sum by (namespace, project, le) (increase({HISTOGRAM}_bucket[{window}]))")
}

/// Why a query result cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LearnError {
    /// Not the JSON of Prometheus's `/api/v1/query`.
    #[error("not a Prometheus query response: {0}")]
    Json(String),
    /// `status` is not `success`.
    #[error("Prometheus answered {status}: {error}")]
    Failed {
        /// `status`.
        status: String,
        /// `errorType: error`.
        error: String,
    },
    /// A result that is not an instant vector.
    #[error("expected resultType vector, got {0}")]
    NotVector(String),
}

#[derive(Deserialize)]
struct Response {
    status: String,
    #[serde(default)]
    data: Option<Data>,
    #[serde(default, rename = "errorType")]
    error_type: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
struct Data {
    #[serde(rename = "resultType")]
    result_type: String,
    #[serde(default)]
    result: Vec<Sample>,
}

#[derive(Deserialize)]
struct Sample {
    #[serde(default)]
    metric: HashMap<String, String>,
    /// `[<unix seconds>, "<value>"]`.
    value: (serde_json::Value, String),
}

/// `le` as Prometheus writes it: `+Inf`, or a number (Prometheus 3 normalises `8589934592`
/// to `8.589934592e+09`, so both spellings are read as floats).
fn bound(le: &str) -> Option<f64> {
    match le.trim() {
        "+Inf" | "Inf" | "inf" | "+inf" => Some(f64::INFINITY),
        s => s.parse::<f64>().ok().filter(|b| b.is_finite() && *b >= 0.0),
    }
}

/// Reads a query response into needs: projects with fewer than `min_jobs` peaks in the
/// window, or whose p95 lies past the largest finite bucket, get none. Series without a
/// `project` label, and the agents' `_other` overflow series, are skipped.
pub fn learn(body: &[u8], min_jobs: u64) -> Result<LearnedNeeds, LearnError> {
    let r: Response = serde_json::from_slice(body).map_err(|e| LearnError::Json(e.to_string()))?;
    if r.status != "success" {
        return Err(LearnError::Failed {
            status: r.status,
            error: format!(
                "{}: {}",
                r.error_type.unwrap_or_default(),
                r.error.unwrap_or_default()
            ),
        });
    }
    let data = r.data.ok_or_else(|| LearnError::Json("no data".into()))?;
    if data.result_type != "vector" {
        return Err(LearnError::NotVector(data.result_type));
    }
    let mut buckets: HashMap<(String, String), Vec<(f64, f64)>> = HashMap::new();
    for s in data.result {
        let (Some(ns), Some(project), Some(le)) = (
            s.metric.get("namespace"),
            s.metric.get("project"),
            s.metric.get("le").and_then(|l| bound(l)),
        ) else {
            continue;
        };
        if project.is_empty() || project == crate::publish::job_peaks::OTHER {
            continue;
        }
        let Ok(count) = s.value.1.parse::<f64>() else {
            continue;
        };
        if !count.is_finite() {
            continue;
        }
        buckets
            .entry((ns.clone(), project.clone()))
            .or_default()
            .push((le, count.max(0.0)));
    }
    let mut by_project = HashMap::new();
    for (key, mut b) in buckets {
        b.sort_by(|x, y| x.0.total_cmp(&y.0));
        // increase() extrapolates each bucket on its own: force the cumulative counts to be
        // monotone so a rounding dip cannot pick a lower bucket.
        let mut running = 0.0_f64;
        for x in &mut b {
            running = running.max(x.1);
            x.1 = running;
        }
        let Some(&(last_le, total)) = b.last() else {
            continue;
        };
        if !last_le.is_infinite() || total < min_jobs as f64 || total <= 0.0 {
            continue;
        }
        let target = 0.95 * total;
        let Some(at) = b.iter().position(|(_, c)| *c >= target - 1e-9) else {
            continue;
        };
        let le = b[at].0;
        let floor = at.checked_sub(1).map(|i| b[i].0).unwrap_or(0.0);
        if le.is_infinite() {
            continue;
        }
        let mib = (le / (1024.0 * 1024.0)).ceil() as u64;
        by_project.insert(
            key,
            LearnedNeed {
                mib,
                jobs: total.floor() as u64,
                floor_mib: (floor / (1024.0 * 1024.0)).floor() as u64,
            },
        );
    }
    Ok(LearnedNeeds { by_project })
}

/// The learned-needs source, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LearnedSource {
    /// `http://host:port` (path prefix allowed).
    pub url: String,
    /// PromQL range.
    pub window: String,
    /// Fewest jobs.
    pub min_jobs: u64,
    /// Query interval.
    pub refresh: Duration,
    /// Longest use of a table Prometheus no longer confirms.
    pub max_age: Duration,
    /// How to reach it: the CA for `https://`, and credentials.
    pub transport: LearnedTransport,
}

/// `learned.caFile`, `learned.bearerTokenFile`, `learned.basicAuth`: files, read at each query
/// so a rotated token, password or CA is used from the next query on (as Prometheus's own
/// `*_file` settings are).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LearnedTransport {
    /// PEM CA bundle that `https://` answers are verified against; the system's roots
    /// without it.
    pub ca_file: Option<std::path::PathBuf>,
    /// Credentials sent with each query.
    pub auth: Option<LearnedAuth>,
}

/// Credentials for the learned-needs source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LearnedAuth {
    /// `Authorization: Bearer <the file's content>`.
    BearerTokenFile(std::path::PathBuf),
    /// `Authorization: Basic` with the user and the password file's content.
    Basic {
        /// `learned.basicAuth.username`.
        username: String,
        /// `learned.basicAuth.passwordFile`.
        password_file: std::path::PathBuf,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(ns: &str, project: &str, le: &str, v: f64) -> serde_json::Value {
        serde_json::json!({"metric": {"namespace": ns, "project": project, "le": le},
            "value": [1780000000.123, v.to_string()]})
    }

    fn body(samples: Vec<serde_json::Value>) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({"status": "success",
            "data": {"resultType": "vector", "result": samples}}))
        .unwrap()
    }

    const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

    #[test]
    fn p95_is_the_upper_bound_of_its_bucket() {
        // 100 jobs: 90 under 4 GiB, 6 more under 6 GiB, 4 under 8 GiB. The 95th lies in
        // (4, 6] GiB: 6 GiB.
        let b = body(vec![
            sample("ci", "7", &(4.0 * GIB).to_string(), 90.0),
            // Prometheus 3's normalised spelling of 6442450944.
            sample("ci", "7", "6.442450944e+09", 96.0),
            sample("ci", "7", &(8.0 * GIB).to_string(), 100.0),
            sample("ci", "7", "+Inf", 100.0),
            // Too few jobs to learn from.
            sample("ci", "8", &(4.0 * GIB).to_string(), 3.0),
            sample("ci", "8", "+Inf", 3.0),
            // Past the largest bucket: unknown, not "huge".
            sample("ci", "9", &(256.0 * GIB).to_string(), 10.0),
            sample("ci", "9", "+Inf", 40.0),
            // The overflow series.
            sample("_other", "_other", "+Inf", 400.0),
        ]);
        let l = learn(&b, 20).unwrap();
        assert_eq!(
            l.get("ci", "7"),
            Some(LearnedNeed {
                mib: 6144,
                jobs: 100,
                floor_mib: 4096,
            })
        );
        assert_eq!(l.get("ci", "8"), None);
        assert_eq!(l.get("ci", "9"), None);
        assert_eq!(l.get("other-ns", "7"), None, "by namespace and project");
        assert_eq!(l.len(), 1);
    }

    #[test]
    fn increases_that_dip_do_not_lower_the_need() {
        // increase() extrapolates per series: 95.2 at 4 GiB, 94.9 at 6 GiB.
        let b = body(vec![
            sample("ci", "7", &(2.0 * GIB).to_string(), 50.0),
            sample("ci", "7", &(4.0 * GIB).to_string(), 95.2),
            sample("ci", "7", &(6.0 * GIB).to_string(), 94.9),
            sample("ci", "7", "+Inf", 100.1),
        ]);
        assert_eq!(
            learn(&b, 20).unwrap().get("ci", "7").map(|n| n.mib),
            Some(4096)
        );
    }

    #[test]
    fn errors_say_what_came_back() {
        let e = learn(
            br#"{"status":"error","errorType":"bad_data","error":"parse error"}"#,
            1,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "Prometheus answered error: bad_data: parse error"
        );
        let e = learn(
            br#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#,
            1,
        )
        .unwrap_err();
        assert!(matches!(e, LearnError::NotVector(_)));
        assert!(matches!(learn(b"<html>", 1), Err(LearnError::Json(_))));
        assert!(query("7d").starts_with("sum by (namespace, project, le) (increase("));
    }
}
