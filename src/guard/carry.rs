//! What of the guard's state must outlive the agent's process, as a plain value: the
//! evictions in doubt and the cooldowns in force (docs/guard.md, "What survives a restart").
//! An agent restarted while an eviction is in doubt (a rollout, an OOM kill of the agent)
//! would otherwise decide again and evict a second pod for one pod's worth of memory.
//!
//! The shell keeps it in the agent's own Lease, under `<prefix>/guard-doubts`, and hands it
//! back at start. Times are wall-clock (RFC 3339): the monotonic clock starts again with the
//! process. Pure: parsing and checking only; the content is read from the API server and
//! anyone allowed to write that Lease can write it, so it is checked as hostile input.

use crate::model::units::{check_dns_label, check_dns_subdomain};
use serde::{Deserialize, Serialize};
use std::time::{Duration, SystemTime};

/// The Lease annotation's name under the annotation prefix.
pub const CARRY_KEY: &str = "guard-doubts";

/// Longest annotation value read back (a node's doubts and cooldowns take a few hundred
/// bytes); anything longer is refused unread.
pub const MAX_CARRY_BYTES: usize = 16 * 1024;

/// Most entries of each kind read back (a node has a handful of GPUs, one decision each).
pub const MAX_ENTRIES: usize = 32;

/// Most PIDs of one entry read back.
pub const MAX_PIDS: usize = 64;

/// How long past `inDoubtTimeout` a doubt is still restored: kube-apiserver's default
/// request timeout, after which a request it held has been carried out or abandoned.
pub const RESTORE_MARGIN: Duration = Duration::from_secs(60);

/// The carried state: its JSON is the annotation's value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Carried {
    /// Format version: 1.
    pub v: u32,
    /// Evictions in doubt.
    #[serde(default)]
    pub doubts: Vec<CarriedDoubt>,
    /// Cooldowns in force.
    #[serde(default)]
    pub cooldowns: Vec<CarriedCooldown>,
}

/// One eviction in doubt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CarriedDoubt {
    /// The GPU's UUID (indices can change across a reboot; UUIDs do not).
    pub gpu: String,
    /// The pod's UID when it was chosen.
    pub uid: String,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its processes on that GPU when it was chosen.
    #[serde(default)]
    pub pids: Vec<u32>,
    /// When the doubt began.
    #[serde(with = "humantime_serde_rfc3339")]
    pub since: SystemTime,
    /// The decision it belonged to, in the process that took it (for logs).
    pub decision: u64,
    /// What the API server answered (or did not).
    #[serde(default)]
    pub detail: String,
}

/// One cooldown in force.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CarriedCooldown {
    /// The GPU's UUID.
    pub gpu: String,
    /// When it ends at the latest.
    #[serde(with = "humantime_serde_rfc3339")]
    pub until: SystemTime,
    /// The victims' UIDs.
    #[serde(default)]
    pub victims: Vec<String>,
    /// Their processes: the cooldown ends early once all have left the GPU.
    #[serde(default)]
    pub pids: Vec<u32>,
    /// The decision it cools down from, in the process that took it (for logs).
    pub decision: u64,
}

/// Why the annotation's content was not used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CarryError {
    /// Longer than [`MAX_CARRY_BYTES`].
    #[error("{0} bytes, more than the {MAX_CARRY_BYTES} read")]
    TooLong(usize),
    /// Not the JSON this agent writes.
    #[error("not the guard's JSON: {0}")]
    Json(String),
    /// Another format version.
    #[error("format version {0}, this agent reads 1")]
    Version(u32),
    /// Valid JSON with a value no agent writes.
    #[error("{0}")]
    Invalid(String),
}

impl Carried {
    /// Whether there is nothing to carry.
    pub fn is_empty(&self) -> bool {
        self.doubts.is_empty() && self.cooldowns.is_empty()
    }

    /// The annotation's value.
    pub fn to_json(&self) -> String {
        // Plain strings and numbers only: serialising cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads an annotation's value, refusing anything this agent would not have written.
    pub fn parse(text: &str) -> Result<Carried, CarryError> {
        if text.len() > MAX_CARRY_BYTES {
            return Err(CarryError::TooLong(text.len()));
        }
        let c: Carried = serde_json::from_str(text).map_err(|e| CarryError::Json(e.to_string()))?;
        if c.v != 1 {
            return Err(CarryError::Version(c.v));
        }
        if c.doubts.len() > MAX_ENTRIES || c.cooldowns.len() > MAX_ENTRIES {
            return Err(CarryError::Invalid(format!(
                "{} doubts and {} cooldowns, more than the {MAX_ENTRIES} read",
                c.doubts.len(),
                c.cooldowns.len()
            )));
        }
        for d in &c.doubts {
            check_gpu(&d.gpu)?;
            check_uid(&d.uid)?;
            check_dns_label(&d.namespace)
                .map_err(|e| CarryError::Invalid(format!("namespace {:?}: {e}", d.namespace)))?;
            check_dns_subdomain(&d.name)
                .map_err(|e| CarryError::Invalid(format!("pod name {:?}: {e}", d.name)))?;
            check_pids(&d.pids)?;
            if d.detail.len() > 1024 {
                return Err(CarryError::Invalid("a doubt's detail is over 1 KiB".into()));
            }
        }
        for c in &c.cooldowns {
            check_gpu(&c.gpu)?;
            if c.victims.len() > MAX_ENTRIES {
                return Err(CarryError::Invalid(
                    "a cooldown with too many victims".into(),
                ));
            }
            c.victims.iter().try_for_each(|u| check_uid(u))?;
            check_pids(&c.pids)?;
        }
        Ok(c)
    }
}

fn check_gpu(uuid: &str) -> Result<(), CarryError> {
    let ok = !uuid.is_empty()
        && uuid.len() <= 128
        && uuid
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b':');
    if ok {
        Ok(())
    } else {
        Err(CarryError::Invalid(format!("GPU UUID {uuid:?}")))
    }
}

fn check_uid(uid: &str) -> Result<(), CarryError> {
    let ok = !uid.is_empty()
        && uid.len() <= 64
        && uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(CarryError::Invalid(format!("pod UID {uid:?}")))
    }
}

fn check_pids(pids: &[u32]) -> Result<(), CarryError> {
    if pids.len() > MAX_PIDS || pids.contains(&0) {
        return Err(CarryError::Invalid(format!(
            "{} PIDs (at most {MAX_PIDS}, none 0)",
            pids.len()
        )));
    }
    Ok(())
}

/// RFC 3339 timestamps (seconds precision is enough for bounds of a minute).
mod humantime_serde_rfc3339 {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::SystemTime;

    pub fn serialize<S: Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&humantime::format_rfc3339_seconds(*t))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SystemTime, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_rfc3339(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    fn sample() -> Carried {
        let t = UNIX_EPOCH + Duration::from_secs(1_780_000_000);
        Carried {
            v: 1,
            doubts: vec![CarriedDoubt {
                gpu: "GPU-3f5e2a8b-1c4d-4e6f-9a0b-7c8d9e0f1a2b".into(),
                uid: "0b1c2d3e-0000-4000-8000-000000000503".into(),
                namespace: "ci".into(),
                name: "greedy".into(),
                pids: vec![503],
                since: t,
                decision: 1,
                detail: "500 Internal error occurred: etcdserver: request timed out".into(),
            }],
            cooldowns: vec![CarriedCooldown {
                gpu: "GPU-3f5e2a8b-1c4d-4e6f-9a0b-7c8d9e0f1a2b".into(),
                until: t + Duration::from_secs(30),
                victims: vec!["u-1".into()],
                pids: vec![501],
                decision: 2,
            }],
        }
    }

    #[test]
    fn what_is_written_reads_back_the_same() {
        let c = sample();
        let text = c.to_json();
        assert!(text.contains(r#""since":"2026-05-28T20:26:40Z""#), "{text}");
        assert_eq!(Carried::parse(&text), Ok(c));
        assert!(Carried::default().is_empty());
    }

    #[test]
    fn hostile_or_malformed_content_is_refused_whole() {
        let good = sample().to_json();
        let cases = [
            ("{".to_string(), "not the guard's JSON"),
            (good.replace(r#""v":1"#, r#""v":2"#), "format version 2"),
            (good.replace("greedy", "Greedy/../x"), "pod name"),
            (good.replace(r#""ci""#, r#""a b""#), "namespace"),
            (good.replace("[503]", "[0]"), "PIDs"),
            (
                good.replace(r#""decision":1"#, r#""decision":1,"extra":true"#),
                "unknown field",
            ),
            (
                good.replace("2026-05-28T20:26:40Z", "yesterday"),
                "not the guard's JSON",
            ),
            (good.replace("GPU-3f5e", "GPU 3f5e"), "GPU UUID"),
            (" ".repeat(MAX_CARRY_BYTES + 1), "more than the"),
        ];
        for (text, why) in cases {
            let e = Carried::parse(&text).expect_err(why).to_string();
            assert!(e.contains(why), "{why}: {e}");
        }
        let many = Carried {
            doubts: vec![sample().doubts[0].clone(); MAX_ENTRIES + 1],
            ..sample()
        };
        assert!(Carried::parse(&many.to_json()).is_err());
    }
}
