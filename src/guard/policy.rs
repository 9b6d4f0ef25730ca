//! The guard's policy: what the operator configures (docs/guard.md), parsed from the
//! `--config` YAML file and validated before anything runs.
//!
//! Keys are camelCase, like Kubernetes configuration files, and unknown keys are refused
//! (a misspelt `sfot:` must fail at start, not leave the default silently in force).
//! Every key is optional; an absent key takes the default documented on its field.
//!
//! ```yaml
//! mode: enforce            # off | dry-run | enforce
//! hard: 5%                 # or "2048Mi", "2Gi", or a bare integer of MiB
//! soft: 10%
//! grace: 10s               # durations: whole numbers with units ns, us/µs, ms, s, m, h, d: "500ms", "10s", "1m 30s"
//! horizon: 5s
//! fastInterval: 100ms     # the fast watch's calm interval
//! fastIntervalMin: 5ms     # its interval under risk
//! watchRate: 256Gi         # growth per second the calm interval is sized to catch (unset: 200 % of the GPU's memory, at least 256Gi)
//! actBudget: 100ms         # decision → memory freed; growth crossing hard sooner is acted on at once
//! excludedNamespaces: [kube-system]
//! priorityCeiling: 2000000000
//! selector: workload-type=gpu-ci,team!=infra
//! reclaimMargin: 2%
//! cooldownTimeout: 30s
//! inDoubtTimeout: 60s
//! rateLimit: { maxEvictions: 5, per: 60s }
//! evictionGracePeriodSeconds: 5
//! annotationPrefix: gpu-warden.io   # must equal --annotation-prefix (one prefix for all keys)
//! ```

use super::selector::Selector;
use crate::model::snapshot::MIB;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::time::Duration;

const KIB: u64 = 1024;
const GIB: u64 = 1024 * MIB;
const TIB: u64 = 1024 * GIB;
/// The shortest `fastInterval` a policy may ask for.
pub const MIN_FAST_INTERVAL: Duration = Duration::from_millis(5);

/// What the guard does when it decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Computes pressure (metrics, annotations) but never decides.
    Off,
    /// Decides, logs and emits Events and metrics, but evicts nothing: the safe way to
    /// watch what `enforce` would do on a real fleet before trusting it.
    #[default]
    DryRun,
    /// Decides and evicts through the Eviction API.
    Enforce,
}

impl Mode {
    /// The configuration spelling (`off`, `dry-run`, `enforce`), also used in logs and /state.
    pub const fn as_str(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::DryRun => "dry-run",
            Mode::Enforce => "enforce",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the guard does to the victim's GPU processes when it decides (policy `onDecision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnDecision {
    /// Evict only: the processes run (and grow) until the kubelet kills them.
    Evict,
    /// SIGSTOP them, then evict; SIGCONT whenever the eviction does not happen.
    #[default]
    Stop,
    /// SIGKILL them once the fresh read agrees, then evict (for the Event, the pod's
    /// status and the cleanup). Not undoable: a pod whose eviction is then refused (its
    /// PodDisruptionBudget) has lost its processes all the same.
    Kill,
}

impl OnDecision {
    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            OnDecision::Evict => "evict",
            OnDecision::Stop => "stop",
            OnDecision::Kill => "kill",
        }
    }

    /// Whether the action signals processes (and so needs CAP_KILL).
    pub fn signals(self) -> bool {
        self != OnDecision::Evict
    }
}

impl fmt::Display for OnDecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A free-memory level, either relative to the GPU's total or absolute, so one policy
/// serves a node group that mixes 24 GiB and 141 GiB GPUs.
///
/// Written as `"5%"`, `"2048Mi"`, `"2Gi"` (binary suffixes `Ki`, `Mi`, `Gi`, `Ti`, optionally
/// followed by `B`; decimals allowed, e.g. `"1.5Gi"`), or a bare integer meaning MiB
/// (the unit dcgm-exporter and `nvidia-smi` show).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Threshold {
    /// Percent of the GPU's total framebuffer, in (0, 100).
    Percent(f64),
    /// An absolute number of bytes.
    Bytes(u64),
}

/// A threshold that does not parse; the message says which spellings are accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ThresholdError {
    #[error("invalid threshold {0:?}: expected a percentage like \"5%\", a size like \"2048Mi\" or \"2Gi\", or a bare integer of MiB")]
    Invalid(String),
    #[error("invalid threshold {input:?}: decimal suffix `{unit}` is ambiguous next to NVML's binary units; write `{unit}i` (e.g. \"2Gi\")")]
    Decimal { input: String, unit: String },
    #[error("invalid threshold {0:?}: too large")]
    TooLarge(String),
}

impl Threshold {
    /// A threshold of `mib` MiB.
    pub const fn mib(mib: u64) -> Threshold {
        Threshold::Bytes(mib * MIB)
    }

    /// Parses the configuration spelling; the error says which spellings are accepted.
    pub fn parse(input: &str) -> Result<Threshold, ThresholdError> {
        // ASCII whitespace only: the chart's schema (`\s`, RE2's ASCII class) refuses a
        // no-break space, so the agent must too (issue 39).
        let ascii = |c: char| c.is_ascii_whitespace();
        let s = input.trim_matches(ascii);
        let bad = || ThresholdError::Invalid(input.to_string());
        if let Some(num) = s.strip_suffix('%') {
            let p: f64 = num.trim_matches(ascii).parse().map_err(|_| bad())?;
            if !p.is_finite() {
                return Err(bad());
            }
            return Ok(Threshold::Percent(p));
        }
        if let Ok(mib) = s.parse::<u64>() {
            return mib
                .checked_mul(MIB)
                .map(Threshold::Bytes)
                .ok_or_else(|| ThresholdError::TooLarge(input.to_string()));
        }
        let split = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let (num, unit) = s.split_at(split);
        let unit = unit.trim_matches(ascii);
        let unit = unit
            .strip_suffix('B')
            .filter(|u| !u.is_empty())
            .unwrap_or(unit);
        let scale = match unit {
            "B" => 1,
            "Ki" => KIB,
            "Mi" => MIB,
            "Gi" => GIB,
            "Ti" => TIB,
            "K" | "k" | "M" | "G" | "T" => {
                return Err(ThresholdError::Decimal {
                    input: input.to_string(),
                    unit: unit.to_string(),
                })
            }
            _ => return Err(bad()),
        };
        let n: f64 = num.parse().map_err(|_| bad())?;
        let bytes = (n * scale as f64).round();
        if !bytes.is_finite() || bytes > u64::MAX as f64 {
            return Err(ThresholdError::TooLarge(input.to_string()));
        }
        Ok(Threshold::Bytes(bytes as u64))
    }

    /// The threshold in bytes on a GPU with `total` bytes of framebuffer.
    pub fn resolve(&self, total: u64) -> u64 {
        match *self {
            Threshold::Percent(p) => (total as f64 * p / 100.0).round().max(0.0) as u64,
            Threshold::Bytes(b) => b,
        }
    }
}

impl fmt::Display for Threshold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Threshold::Percent(p) => write!(f, "{p}%"),
            Threshold::Bytes(b) => {
                for (scale, unit) in [(TIB, "Ti"), (GIB, "Gi"), (MIB, "Mi"), (KIB, "Ki")] {
                    if b > 0 && b % scale == 0 {
                        return write!(f, "{}{unit}", b / scale);
                    }
                }
                if b == 0 {
                    f.write_str("0Mi")
                } else {
                    write!(f, "{b}B")
                }
            }
        }
    }
}

impl Serialize for Threshold {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Threshold {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Threshold;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a threshold like \"5%\", \"2048Mi\", \"2Gi\" or a bare integer of MiB")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Threshold, E> {
                Threshold::parse(v).map_err(E::custom)
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Threshold, E> {
                v.checked_mul(MIB)
                    .map(Threshold::Bytes)
                    .ok_or_else(|| E::custom(format!("invalid threshold {v}: too large")))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Threshold, E> {
                u64::try_from(v)
                    .map_err(|_| E::custom(format!("invalid threshold {v}: must not be negative")))
                    .and_then(|v| self.visit_u64(v))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Threshold, E> {
                Err(E::custom(format!(
                    "invalid threshold {v}: a bare number means whole MiB; write \"{v}%\" for a percentage or \"{v}Gi\" for a size"
                )))
            }
        }
        d.deserialize_any(V)
    }
}

// The one duration adapter of the files (src/model/units.rs), under its old name here.
use crate::model::units::duration_serde as human_duration;

/// The global safety valve on evictions, across all GPUs of the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct RateLimit {
    /// At most this many pods evicted per window (default 5).
    pub max_evictions: u32,
    /// The sliding window (default 60s).
    #[serde(with = "human_duration")]
    pub per: Duration,
}

impl Default for RateLimit {
    fn default() -> Self {
        RateLimit {
            max_evictions: 5,
            per: Duration::from_secs(60),
        }
    }
}

/// The OOM guard's configuration. Construct with [`Policy::default`] or
/// [`Policy::from_yaml_str`]; call [`Policy::validate`] after changing fields by hand.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct Policy {
    /// `off`, `dry-run` (default) or `enforce`.
    pub mode: Mode,
    /// Free memory below this acts at once (default 5%).
    pub hard: Threshold,
    /// Free memory below this acts after `grace`, or earlier if the trend projects the GPU
    /// full within `horizon` (default 10%). With mixed units (`hard: 2Gi`, `soft: 5%`) the
    /// order cannot be checked until a GPU's total is known; on a GPU where `hard` resolves
    /// at or above `soft` there is simply no soft band (none goes straight to hard).
    pub soft: Threshold,
    /// How long soft pressure must hold without a break before acting (default 10s).
    #[serde(with = "human_duration")]
    pub grace: Duration,
    /// Act on soft pressure early if the growth trend projects the GPU full within this
    /// (default 5s).
    #[serde(with = "human_duration")]
    pub horizon: Duration,
    /// The fast watch's longest interval between memory-only reads, used while every GPU
    /// is calm and far from `hard` (default 100ms). Closer to `hard`, or under pressure,
    /// the watch reads more often (docs/guard.md, "The fast watch").
    #[serde(with = "human_duration")]
    pub fast_interval: Duration,
    /// The fast watch's shortest interval, used below soft and when growth at `watchRate`
    /// would reach `hard` within a few intervals (default 5ms).
    #[serde(with = "human_duration")]
    pub fast_interval_min: Duration,
    /// The growth rate, per second, the fast watch is sized to catch on a calm GPU: the
    /// interval is a quarter of the time growth at this rate takes to reach `hard`. A
    /// percentage is of the GPU's memory, or a size such as `256Gi`. Unset (`None`, the
    /// default): twice the GPU's memory per second, and at least [`WATCH_RATE_FLOOR`]
    /// ([`Policy::watch_rate_for`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub watch_rate: Option<Threshold>,
    /// How long, from a decision, until the victim's memory is back with the driver
    /// (the eviction request, the kubelet's kill, the CUDA context's teardown). Sustained
    /// growth that would cross `hard` sooner than this is acted on at once, even above
    /// soft (default 100ms; about 70 ms was measured on the H200, docs/validation.md).
    #[serde(with = "human_duration")]
    pub act_budget: Duration,
    /// Pods in these namespaces are never evicted (default `[kube-system]`).
    pub excluded_namespaces: Vec<String>,
    /// Pods whose `spec.priority` is at or above this are never evicted (default
    /// 2000000000, the value of `system-cluster-critical`; `system-node-critical` is above it).
    pub priority_ceiling: i32,
    /// When set, only pods matching this equality-based label selector may be evicted.
    pub selector: Option<Selector>,
    /// Evict until projected free is back at `soft` plus this (default 2%), so the GPU does
    /// not sit right at the threshold and trigger again on the next allocation.
    pub reclaim_margin: Threshold,
    /// Longest wait, after a decision, for the victims' processes to leave the GPU before
    /// the guard may decide again for that GPU; also how long a pod whose eviction was
    /// refused is skipped (default 30s).
    #[serde(with = "human_duration")]
    pub cooldown_timeout: Duration,
    /// How long an eviction whose outcome is unknown (a timeout, a connection lost after
    /// the request was sent) stays in doubt when the pod is still seen running: no further
    /// eviction on that GPU before the pod is seen gone or this has passed on a pod view
    /// proven current (default 60s, kube-apiserver's default `--request-timeout`, after
    /// which the server has abandoned the request).
    #[serde(with = "human_duration")]
    pub in_doubt_timeout: Duration,
    /// Global limit on evictions (default 5 per 60s).
    pub rate_limit: RateLimit,
    /// `deleteOptions.gracePeriodSeconds` sent with each eviction (default 5).
    pub eviction_grace_period_seconds: i64,
    /// What is done to the victim's GPU processes when the guard decides, before the
    /// eviction (default `stop`; docs/guard.md, "Stopping the growth at decision"). Only in
    /// enforce mode; dry-run never signals.
    pub on_decision: OnDecision,
    /// Prefix of the pod annotations the guard reads: `<prefix>/evict: "never"` and
    /// `<prefix>/vram-request-mib: "<int>"`. The agent has one prefix for node and pod
    /// annotations, `--annotation-prefix`: the agent's configuration fills this in from the
    /// flag, and refuses a file whose key says otherwise. Absent (`None`) means the default,
    /// `gpu-warden.io`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub annotation_prefix: Option<String>,
}

/// The least growth per second the fast watch is sized for by default (`watchRate` unset).
/// Why: twice a card's memory per second is 48 GiB/s on an A10G's 24 GiB, and at issue 38's
/// headroom there (8.4 GiB free) that reads every 32 ms until growth is seen, time for a job
/// allocating 2 GiB every 10 ms to take a neighbour's room between two readings (unit
/// `state::need_tests::a_job_climbing_in_2_gib_steps_is_stopped_before_it_takes_a_workspaces_room`:
/// 13 of 40 phases in time at 48 GiB/s, 40 of 40 at the floor). On the H100 the agent's
/// CPU with the guard armed at an A10G's headroom was 0.4 % of one core idle and 0.73 % calm
/// at 48 GiB/s, 1.0 % and 1.93 % at 256 (docs/validation.md §9m). An H200's own 200 % is
/// above it (282 GiB/s): unchanged there.
pub const WATCH_RATE_FLOOR: u64 = 256 << 30;

/// `watchRate` unset: this share of the GPU's memory per second, at least
/// [`WATCH_RATE_FLOOR`].
const WATCH_RATE_DEFAULT: Threshold = Threshold::Percent(200.0);

impl Default for Policy {
    fn default() -> Self {
        Policy {
            mode: Mode::DryRun,
            hard: Threshold::Percent(5.0),
            soft: Threshold::Percent(10.0),
            grace: Duration::from_secs(10),
            horizon: Duration::from_secs(5),
            fast_interval: Duration::from_millis(100),
            fast_interval_min: MIN_FAST_INTERVAL,
            watch_rate: None,
            act_budget: Duration::from_millis(100),
            excluded_namespaces: vec!["kube-system".to_string()],
            priority_ceiling: 2_000_000_000,
            selector: None,
            reclaim_margin: Threshold::Percent(2.0),
            cooldown_timeout: Duration::from_secs(30),
            in_doubt_timeout: Duration::from_secs(60),
            rate_limit: RateLimit::default(),
            eviction_grace_period_seconds: 5,
            on_decision: OnDecision::Stop,
            annotation_prefix: None,
        }
    }
}

/// Why a policy was refused. Every message names the field and what it accepts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// The file is not YAML at all (unclosed bracket or quote, bad indentation).
    #[error("not valid YAML: {0}")]
    Syntax(String),
    /// The YAML did not parse or did not fit the schema: unknown key, wrong type, bad
    /// threshold, duration or selector spelling. The message starts with the key path.
    #[error("invalid guard policy: {0}")]
    Parse(String),
    /// A field parsed but its value is not allowed.
    #[error("policy field `{field}`: {reason}")]
    Invalid {
        /// The key as written in YAML, e.g. `soft` or `rateLimit.maxEvictions`.
        field: &'static str,
        /// What is wrong and what is allowed.
        reason: String,
    },
}

impl PolicyError {
    /// The offending field, when the error is about one validated field.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            PolicyError::Invalid { field, .. } => Some(field),
            PolicyError::Parse(_) | PolicyError::Syntax(_) => None,
        }
    }
}

fn invalid(field: &'static str, reason: impl Into<String>) -> PolicyError {
    PolicyError::Invalid {
        field,
        reason: reason.into(),
    }
}

impl Policy {
    /// The growth per second the fast watch is sized for on a GPU of `total` bytes:
    /// `watchRate`, or unset, twice the GPU's memory and at least [`WATCH_RATE_FLOOR`].
    pub fn watch_rate_for(&self, total: u64) -> u64 {
        match self.watch_rate {
            Some(rate) => rate.resolve(total),
            None => WATCH_RATE_DEFAULT.resolve(total).max(WATCH_RATE_FLOOR),
        }
    }

    /// Parses and validates a policy file. An empty document means every default.
    pub fn from_yaml_str(yaml: &str) -> Result<Policy, PolicyError> {
        // Syntax first: serde reports a broken flow sequence under `mode:` as a type error.
        serde_yaml_ng::from_str::<serde_yaml_ng::Value>(yaml)
            .map_err(|e| PolicyError::Syntax(e.to_string()))?;
        let parsed: Option<Policy> =
            serde_yaml_ng::from_str(yaml).map_err(|e| PolicyError::Parse(e.to_string()))?;
        let policy = parsed.unwrap_or_default();
        policy.validate()?;
        Ok(policy)
    }

    /// Checks every rule a YAML parse cannot; returns the first violation.
    pub fn validate(&self) -> Result<(), PolicyError> {
        check_level("hard", &self.hard, false)?;
        check_level("soft", &self.soft, false)?;
        check_level("reclaimMargin", &self.reclaim_margin, true)?;
        let ordered = match (self.hard, self.soft) {
            (Threshold::Percent(h), Threshold::Percent(s)) => h < s,
            (Threshold::Bytes(h), Threshold::Bytes(s)) => h < s,
            // Mixed units: only a GPU's total can order them (see `Policy::soft`).
            _ => true,
        };
        if !ordered {
            return Err(invalid(
                "soft",
                format!(
                    "must be above `hard` ({}); got {} (soft pressure is the early warning before hard)",
                    self.hard, self.soft
                ),
            ));
        }
        if let (Threshold::Percent(s), Threshold::Percent(m)) = (self.soft, self.reclaim_margin) {
            if s + m >= 100.0 {
                return Err(invalid(
                    "reclaimMargin",
                    format!("`soft` ({s}%) plus `reclaimMargin` ({m}%) must stay below 100%"),
                ));
            }
        }
        for (field, d) in [
            ("grace", self.grace),
            ("horizon", self.horizon),
            ("fastInterval", self.fast_interval),
            ("fastIntervalMin", self.fast_interval_min),
            ("actBudget", self.act_budget),
            ("cooldownTimeout", self.cooldown_timeout),
            ("inDoubtTimeout", self.in_doubt_timeout),
            ("rateLimit.per", self.rate_limit.per),
        ] {
            if d.is_zero() {
                return Err(invalid(
                    field,
                    "must be a duration above zero, like \"10s\" or \"500ms\"",
                ));
            }
        }
        // The trend keeps 256 readings: at 5 ms that is 1.28 s, enough for the 1 s lead-in
        // before a soft crossing; shorter would also read NVML hundreds of times a second.
        if self.fast_interval < MIN_FAST_INTERVAL {
            return Err(invalid(
                "fastInterval",
                format!(
                    "must be at least {}; got {}",
                    humantime::format_duration(MIN_FAST_INTERVAL),
                    humantime::format_duration(self.fast_interval)
                ),
            ));
        }
        if self.fast_interval_min < MIN_FAST_INTERVAL || self.fast_interval_min > self.fast_interval
        {
            return Err(invalid(
                "fastIntervalMin",
                format!(
                    "must be at least {} and at most `fastInterval` ({}); got {}",
                    humantime::format_duration(MIN_FAST_INTERVAL),
                    humantime::format_duration(self.fast_interval),
                    humantime::format_duration(self.fast_interval_min)
                ),
            ));
        }
        if let Some(rate) = self.watch_rate {
            let rate_ok = match rate {
                Threshold::Percent(p) => p > 0.0 && p <= 10_000.0,
                Threshold::Bytes(b) => b >= MIB,
            };
            if !rate_ok {
                return Err(invalid(
                    "watchRate",
                    format!(
                        "must be a share of the GPU's memory per second in (0%, 10000%], like \"200%\", or a size of at least 1Mi, like \"256Gi\"; got {rate}"
                    ),
                ));
            }
        }
        if self.act_budget > self.horizon {
            return Err(invalid(
                "actBudget",
                format!(
                    "must not exceed `horizon` ({}); got {}",
                    humantime::format_duration(self.horizon),
                    humantime::format_duration(self.act_budget)
                ),
            ));
        }
        if self.fast_interval > self.grace {
            return Err(invalid(
                "fastInterval",
                format!(
                    "must not exceed `grace` ({}); got {} (the fast watch must sample within the grace period)",
                    humantime::format_duration(self.grace),
                    humantime::format_duration(self.fast_interval)
                ),
            ));
        }
        if self.rate_limit.max_evictions < 1 {
            return Err(invalid(
                "rateLimit.maxEvictions",
                "must be at least 1 (use `mode: dry-run` or `mode: off` to evict nothing)",
            ));
        }
        if self.eviction_grace_period_seconds < 0 {
            return Err(invalid(
                "evictionGracePeriodSeconds",
                format!(
                    "must be 0 or more seconds; got {}",
                    self.eviction_grace_period_seconds
                ),
            ));
        }
        for ns in &self.excluded_namespaces {
            if crate::model::units::check_dns_label(ns).is_err() {
                return Err(invalid(
                    "excludedNamespaces",
                    format!("{ns:?} is not a namespace name (lowercase letters, digits and `-`, at most 63)"),
                ));
            }
        }
        if let Some(prefix) = &self.annotation_prefix {
            if crate::model::units::check_dns_subdomain(prefix).is_err() {
                return Err(invalid(
                    "annotationPrefix",
                    format!(
                        "{prefix:?} is not a DNS subdomain like `gpu-warden.io` (lowercase letters, digits, `-` and `.`; no `/`)"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The prefix of the pod annotations: the key's, or the default.
    pub fn annotation_prefix(&self) -> &str {
        self.annotation_prefix
            .as_deref()
            .unwrap_or(crate::model::units::DEFAULT_ANNOTATION_PREFIX)
    }

    /// The annotation that opts a pod out of eviction when set to `"never"`.
    pub fn evict_annotation(&self) -> String {
        format!("{}/evict", self.annotation_prefix())
    }

    /// The annotation declaring a pod's expected VRAM use in MiB.
    pub fn vram_request_annotation(&self) -> String {
        crate::model::vram_request::key(self.annotation_prefix())
    }
}

fn check_level(field: &'static str, t: &Threshold, zero_ok: bool) -> Result<(), PolicyError> {
    match *t {
        Threshold::Percent(p) => {
            let low_ok = if zero_ok { p >= 0.0 } else { p > 0.0 };
            if !(low_ok && p < 100.0) {
                let range = if zero_ok { "[0%, 100%)" } else { "(0%, 100%)" };
                return Err(invalid(
                    field,
                    format!("a percentage must be in {range}; got {p}%"),
                ));
            }
        }
        Threshold::Bytes(0) if !zero_ok => {
            return Err(invalid(
                field,
                "must be above zero, like \"5%\", \"2048Mi\" or \"2Gi\"",
            ))
        }
        Threshold::Bytes(_) => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threshold_spellings() {
        let cases: &[(&str, Threshold)] = &[
            ("5%", Threshold::Percent(5.0)),
            ("2.5 %", Threshold::Percent(2.5)),
            ("2048Mi", Threshold::Bytes(2048 * MIB)),
            ("2Gi", Threshold::Bytes(2 * GIB)),
            ("2GiB", Threshold::Bytes(2 * GIB)),
            ("1.5Gi", Threshold::Bytes(1536 * MIB)),
            ("512Ki", Threshold::Bytes(512 * KIB)),
            ("1Ti", Threshold::Bytes(TIB)),
            ("100B", Threshold::Bytes(100)),
            ("2048", Threshold::Bytes(2048 * MIB)),
            (" 7 ", Threshold::Bytes(7 * MIB)),
        ];
        for (s, want) in cases {
            assert_eq!(Threshold::parse(s).as_ref(), Ok(want), "{s}");
        }
        for bad in [
            "",
            "%",
            "five%",
            "2GB",
            "2G",
            "2 Mo",
            "Gi",
            "-5",
            "1e3",
            "inf%",
            "1.2.3Gi",
            // A no-break space: the chart's `\s` does not take it (issue 39).
            "5\u{a0}%",
            "\u{a0}5%",
            "2\u{a0}Gi",
        ] {
            let r = Threshold::parse(bad);
            assert!(r.is_err(), "{bad:?} parsed as {r:?}");
        }
        assert!(Threshold::parse("2G")
            .unwrap_err()
            .to_string()
            .contains("`Gi`"));
        // "-5%" parses so that validation can refuse it naming the field.
        assert_eq!(Threshold::parse("-5%"), Ok(Threshold::Percent(-5.0)));
    }

    #[test]
    fn threshold_resolves_against_total() {
        let total = 24 * GIB;
        assert_eq!(Threshold::Percent(5.0).resolve(total), 1_288_490_189);
        assert_eq!(Threshold::Percent(50.0).resolve(total), 12 * GIB);
        assert_eq!(Threshold::mib(2048).resolve(total), 2 * GIB);
        assert_eq!(Threshold::Percent(10.0).resolve(0), 0);
    }

    #[test]
    fn threshold_display_round_trips() {
        for s in ["5%", "2.5%", "2Gi", "2047Mi", "512Ki", "1Ti", "100B"] {
            let t = Threshold::parse(s).unwrap();
            assert_eq!(t.to_string(), s);
            assert_eq!(Threshold::parse(&t.to_string()).unwrap(), t);
        }
        assert_eq!(Threshold::parse("2048").unwrap().to_string(), "2Gi");
    }

    #[test]
    fn defaults_match_the_design() {
        let p = Policy::default();
        assert_eq!(p.mode, Mode::DryRun);
        assert_eq!(p.hard, Threshold::Percent(5.0));
        assert_eq!(p.soft, Threshold::Percent(10.0));
        assert_eq!(p.grace, Duration::from_secs(10));
        assert_eq!(p.horizon, Duration::from_secs(5));
        assert_eq!(p.fast_interval, Duration::from_millis(100));
        assert_eq!(p.excluded_namespaces, vec!["kube-system".to_string()]);
        assert_eq!(p.priority_ceiling, 2_000_000_000);
        assert_eq!(p.selector, None);
        assert_eq!(p.reclaim_margin, Threshold::Percent(2.0));
        assert_eq!(p.cooldown_timeout, Duration::from_secs(30));
        assert_eq!(p.rate_limit.max_evictions, 5);
        assert_eq!(p.rate_limit.per, Duration::from_secs(60));
        assert_eq!(p.eviction_grace_period_seconds, 5);
        assert_eq!(p.annotation_prefix(), "gpu-warden.io");
        assert_eq!(p.evict_annotation(), "gpu-warden.io/evict");
        assert_eq!(
            p.vram_request_annotation(),
            "gpu-warden.io/vram-request-mib"
        );
        p.validate().unwrap();
    }

    #[test]
    fn empty_documents_mean_defaults() {
        for doc in ["", "\n", "# only a comment\n", "{}", "---\n"] {
            assert_eq!(
                Policy::from_yaml_str(doc).unwrap(),
                Policy::default(),
                "{doc:?}"
            );
        }
    }

    #[test]
    fn full_file_parses() {
        let yaml = r#"
mode: enforce
hard: 2Gi
soft: 4096
grace: 3s
horizon: 1500ms
fastInterval: 50ms
excludedNamespaces: [kube-system, monitoring]
priorityCeiling: 1000
selector: "workload-type=gpu-ci,!keep"
reclaimMargin: 512Mi
cooldownTimeout: 1m
rateLimit:
  maxEvictions: 2
  per: 5m
evictionGracePeriodSeconds: 0
annotationPrefix: example.com
"#;
        let p = Policy::from_yaml_str(yaml).unwrap();
        assert_eq!(p.mode, Mode::Enforce);
        assert_eq!(p.hard, Threshold::Bytes(2 * GIB));
        assert_eq!(p.soft, Threshold::Bytes(4 * GIB));
        assert_eq!(p.grace, Duration::from_secs(3));
        assert_eq!(p.horizon, Duration::from_millis(1500));
        assert_eq!(p.fast_interval, Duration::from_millis(50));
        assert_eq!(p.excluded_namespaces, vec!["kube-system", "monitoring"]);
        assert_eq!(p.priority_ceiling, 1000);
        assert_eq!(
            p.selector.as_ref().map(ToString::to_string).as_deref(),
            Some("workload-type=gpu-ci,!keep")
        );
        assert_eq!(p.reclaim_margin, Threshold::mib(512));
        assert_eq!(p.cooldown_timeout, Duration::from_secs(60));
        assert_eq!(
            p.rate_limit,
            RateLimit {
                max_evictions: 2,
                per: Duration::from_secs(300)
            }
        );
        assert_eq!(p.eviction_grace_period_seconds, 0);
        assert_eq!(p.vram_request_annotation(), "example.com/vram-request-mib");
        // What /state shows parses back to the same policy.
        let back = serde_yaml_ng::to_string(&p).unwrap();
        assert_eq!(Policy::from_yaml_str(&back).unwrap(), p);
    }

    #[test]
    fn partial_rate_limit_keeps_the_other_default() {
        let p = Policy::from_yaml_str("rateLimit: {maxEvictions: 1}").unwrap();
        assert_eq!(p.rate_limit.max_evictions, 1);
        assert_eq!(p.rate_limit.per, Duration::from_secs(60));
    }

    /// Parse errors: each message names the key path and what is accepted.
    #[test]
    fn parse_errors_name_the_field() {
        let cases: &[(&str, &[&str])] = &[
            (
                "sfot: 10%",
                &["unknown field `sfot`", "expected one of", "`soft`"],
            ),
            (
                "rateLimit: {maxEvictons: 3}",
                &["rateLimit", "unknown field `maxEvictons`", "`maxEvictions`"],
            ),
            (
                "mode: enforcing",
                &[
                    "mode",
                    "unknown variant `enforcing`",
                    "`off`",
                    "`dry-run`",
                    "`enforce`",
                ],
            ),
            ("soft: ten", &["soft", "invalid threshold", "\"5%\"", "MiB"]),
            ("hard: 2GB", &["hard", "invalid threshold"]),
            ("hard: 2G", &["hard", "`Gi`"]),
            ("hard: 5.5", &["hard", "whole MiB", "\"5.5%\""]),
            ("grace: 10", &["grace", "unit is required", "\"10s\""]),
            (
                "horizon: soon",
                &["horizon", "invalid duration", "\"500ms\""],
            ),
            ("fastInterval: -1", &["fastInterval", "invalid duration"]),
            ("selector: 'a in (b)'", &["selector", "set-based"]),
            ("selector: 'a=b,,c'", &["selector", "empty term"]),
            ("rateLimit: {maxEvictions: -1}", &["rateLimit.maxEvictions"]),
            ("priorityCeiling: high", &["priorityCeiling"]),
            ("excludedNamespaces: kube-system", &["excludedNamespaces"]),
            ("- a\n- b", &["invalid guard policy"]),
        ];
        for (yaml, needles) in cases {
            let e = Policy::from_yaml_str(yaml).unwrap_err();
            assert!(matches!(e, PolicyError::Parse(_)), "{yaml}: {e:?}");
            let msg = e.to_string();
            for n in *needles {
                assert!(msg.contains(n), "{yaml}: {msg:?} lacks {n:?}");
            }
        }
    }

    /// Validation errors: one row per rule, each naming its field.
    #[test]
    fn validation_errors_name_the_field() {
        let cases: &[(&str, &str, &[&str])] = &[
            ("soft: 4%", "soft", &["must be above `hard` (5%)", "4%"]),
            ("hard: 10%", "soft", &["must be above `hard` (10%)"]),
            ("hard: 2Gi\nsoft: 2048Mi", "soft", &["above `hard` (2Gi)"]),
            ("hard: 0%", "hard", &["(0%, 100%)"]),
            ("hard: 0", "hard", &["above zero"]),
            ("soft: 100%", "soft", &["(0%, 100%)", "100%"]),
            ("soft: 0%\nhard: 1Gi", "soft", &["(0%, 100%)"]),
            ("hard: -5%", "hard", &["(0%, 100%)"]),
            ("reclaimMargin: 100%", "reclaimMargin", &["[0%, 100%)"]),
            (
                "soft: 60%\nreclaimMargin: 40%",
                "reclaimMargin",
                &["below 100%"],
            ),
            ("grace: 0s", "grace", &["above zero"]),
            ("horizon: 0ms", "horizon", &["above zero"]),
            ("fastInterval: 0s", "fastInterval", &["above zero"]),
            (
                "fastInterval: 2ms",
                "fastInterval",
                &["at least 5ms", "2ms"],
            ),
            ("cooldownTimeout: 0s", "cooldownTimeout", &["above zero"]),
            ("rateLimit: {per: 0s}", "rateLimit.per", &["above zero"]),
            (
                "grace: 1s\nfastInterval: 2s",
                "fastInterval",
                &["must not exceed `grace` (1s)", "2s"],
            ),
            (
                "rateLimit: {maxEvictions: 0}",
                "rateLimit.maxEvictions",
                &["at least 1"],
            ),
            (
                "evictionGracePeriodSeconds: -1",
                "evictionGracePeriodSeconds",
                &["0 or more", "-1"],
            ),
            (
                "excludedNamespaces: ['Kube_System']",
                "excludedNamespaces",
                &["\"Kube_System\""],
            ),
            (
                "annotationPrefix: 'gpu-warden.io/'",
                "annotationPrefix",
                &["DNS subdomain"],
            ),
            (
                "annotationPrefix: ''",
                "annotationPrefix",
                &["DNS subdomain"],
            ),
        ];
        for (yaml, field, needles) in cases {
            let e = Policy::from_yaml_str(yaml).unwrap_err();
            assert_eq!(e.field(), Some(*field), "{yaml}: {e}");
            let msg = e.to_string();
            assert!(
                msg.starts_with(&format!("policy field `{field}`: ")),
                "{msg}"
            );
            for n in *needles {
                assert!(msg.contains(n), "{yaml}: {msg:?} lacks {n:?}");
            }
        }
    }

    #[test]
    fn mixed_units_and_zero_margin_are_accepted() {
        // Mixed units: the order is only known per GPU (see `Policy::soft`).
        Policy::from_yaml_str("hard: 8Gi\nsoft: 10%").unwrap();
        Policy::from_yaml_str("reclaimMargin: 0%").unwrap();
        Policy::from_yaml_str("reclaimMargin: 0").unwrap();
        Policy::from_yaml_str("evictionGracePeriodSeconds: 0").unwrap();
        Policy::from_yaml_str("grace: 100ms\nfastInterval: 100ms").unwrap();
    }
}
