//! `gpu-warden check-config`: the agent's and the extender's own validation of their
//! configuration files, run before an install (like `promtool check config`). Each file is
//! read by the very parser the program uses at start, so a file this accepts starts, and
//! one it refuses would crash-loop every agent. The Helm chart's values schema and its
//! template checks are tested against this (deploy/tests/check_config_agreement.py).

use crate::guard::policy::{Policy, PolicyError};
use clap::Parser;
use std::path::{Path, PathBuf};

/// gpu-warden check-config: validates guard policy files (`--guard-config` of the agent)
/// and extender policy files (`--config` of `gpu-warden extender`) without starting
/// anything. Prints one line per file, `FILE: ok` or `FILE: <problem>`; exits 0 when
/// every file is valid, 1 otherwise.
#[derive(Debug, Clone, Parser)]
#[command(name = "gpu-warden check-config", version, long_about = None)]
pub struct CheckConfigCli {
    /// A guard policy file, as the agent's --guard-config reads it (repeatable).
    #[arg(long = "guard-policy", value_name = "FILE")]
    pub guard_policies: Vec<PathBuf>,

    /// An extender policy file, as `gpu-warden extender --config` reads it (repeatable).
    #[arg(long = "extender-config", value_name = "FILE")]
    pub extender_configs: Vec<PathBuf>,

    /// The agents' annotation prefix (their --annotation-prefix): a policy's
    /// `annotationPrefix` must equal it, as the agent requires at start and the extender
    /// needs to read what the agents write.
    #[arg(
        long,
        default_value = crate::model::units::DEFAULT_ANNOTATION_PREFIX,
        env = "GPU_WARDEN_ANNOTATION_PREFIX"
    )]
    pub annotation_prefix: String,
}

/// Why a configuration file would not start its program.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The guard policy's own validation refused it.
    #[error("guard policy: {0}")]
    Guard(#[from] PolicyError),
    /// The extender's policy parser refused it.
    #[error("extender policy: {0}")]
    Extender(String),
    /// A policy names another annotation prefix than the agents'.
    #[error("{what}: annotationPrefix {policy:?} differs from the agents' --annotation-prefix {agents:?} (one prefix names the Node keys the agents write and the pod keys the guard and the extender read)")]
    Prefix {
        /// Which policy.
        what: &'static str,
        /// The policy's prefix.
        policy: String,
        /// The agents' prefix.
        agents: String,
    },
    /// The file cannot be read.
    #[error("cannot read: {0}")]
    Read(String),
    /// Neither kind of file was named.
    #[error("no file given (--guard-policy FILE, --extender-config FILE)")]
    NoFile,
}

/// How one kind of file is judged: its text and the agents' prefix. The extender's
/// (`check_policy` of src/extender/config.rs) is handed in by src/main.rs: this room sits
/// below the extender's.
pub type Check = fn(&str, &str) -> Result<(), CheckError>;

/// What `check-config` prints and how it ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// One line per file, in the order given, guard policies first: `FILE: ok`, or
    /// `FILE: <problem>` on one line whatever the parser's message looks like.
    pub lines: Vec<String>,
    /// How many files were refused (exit 1 when any).
    pub refused: usize,
}

/// Every file through the parser its program uses at start: `read` gives a file's text,
/// `extender` judges an extender policy. [`CheckError::NoFile`] when none was named.
pub fn check_files(
    cli: &CheckConfigCli,
    read: impl Fn(&Path) -> std::io::Result<String>,
    extender: Check,
) -> Result<Report, CheckError> {
    let guards = cli
        .guard_policies
        .iter()
        .map(|p| (p, check_guard_policy as Check));
    let extenders = cli.extender_configs.iter().map(|p| (p, extender));
    let mut report = Report {
        lines: Vec::new(),
        refused: 0,
    };
    for (path, check) in guards.chain(extenders) {
        let verdict = read(path.as_path())
            .map_err(|e| CheckError::Read(e.to_string()))
            .and_then(|text| check(&text, &cli.annotation_prefix));
        let shown = path.display();
        report.lines.push(match verdict {
            Ok(()) => format!("{shown}: ok"),
            Err(e) => {
                report.refused += 1;
                let text = e
                    .to_string()
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ");
                format!("{shown}: {text}")
            }
        });
    }
    if report.lines.is_empty() {
        return Err(CheckError::NoFile);
    }
    Ok(report)
}

/// Checks a guard policy's text as the agent does at start (`Policy::from_yaml_str`, then
/// the one-prefix rule of `Cli::unify_annotation_prefix`).
pub fn check_guard_policy(text: &str, agents_prefix: &str) -> Result<(), CheckError> {
    let policy = Policy::from_yaml_str(text)?;
    check_prefix(
        "guard policy",
        policy.annotation_prefix.as_deref(),
        agents_prefix,
    )
}

/// The one-prefix rule: an absent key means the agents' prefix.
pub fn check_prefix(
    what: &'static str,
    policy: Option<&str>,
    agents_prefix: &str,
) -> Result<(), CheckError> {
    match policy {
        Some(p) if p != agents_prefix => Err(CheckError::Prefix {
            what,
            policy: p.to_string(),
            agents: agents_prefix.to_string(),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The refusal's text as `check-config` prints it, None when the policy passes.
    fn guard(text: &str) -> Option<String> {
        check_guard_policy(text, "gpu-warden.io")
            .err()
            .map(|e| e.to_string())
    }

    #[test]
    fn the_agents_own_rules_refuse_with_the_key_named() {
        assert_eq!(guard(""), None);
        assert_eq!(guard("hard: 5%\nsoft: 10%\ngrace: 10s\n"), None);
        for (text, key) in [
            ("selector: workload-type in (gpu-ci)\n", "selector"),
            ("selector: \"===\"\n", "selector"),
            ("grace: 0s\n", "grace"),
            ("rateLimit: {per: 0s}\n", "rateLimit.per"),
            ("grace: 50ms\n", "fastInterval"),
            ("actBudget: 6s\n", "actBudget"),
            ("fastIntervalMin: 200ms\n", "fastIntervalMin"),
            ("fastInterval: 1ms\n", "fastInterval"),
            ("hard: 150%\nsoft: 160%\n", "hard"),
            ("watchRate: 0%\n", "watchRate"),
            ("sotf: 10%\n", "sotf"),
        ] {
            let e = guard(text).unwrap_or_default();
            assert!(e.starts_with("guard policy: "), "{text:?}: {e}");
            assert!(e.contains(key), "{text:?}: {e}");
        }
    }

    #[test]
    fn one_line_per_file_in_the_order_given() {
        let cli = CheckConfigCli::try_parse_from([
            "check-config",
            "--guard-policy",
            "good.yaml",
            "--extender-config",
            "ext.yaml",
            "--guard-policy",
            "gone.yaml",
            "--guard-policy",
            "bad.yaml",
        ])
        .unwrap();
        let read = |p: &Path| match p.to_str() {
            Some("good.yaml") | Some("ext.yaml") => Ok("grace: 10s\n".to_string()),
            Some("bad.yaml") => Ok("grace: 0s\n".to_string()),
            _ => Err(std::io::Error::from(std::io::ErrorKind::NotFound)),
        };
        let extender: Check = |text, _| {
            Err(CheckError::Extender(format!(
                "refused\n  over   lines: {}",
                text.trim()
            )))
        };
        let report = check_files(&cli, read, extender).unwrap();
        assert_eq!(report.refused, 3);
        assert_eq!(report.lines.len(), 4);
        assert_eq!(report.lines[0], "good.yaml: ok");
        assert!(
            report.lines[1].starts_with("gone.yaml: cannot read: "),
            "{report:?}"
        );
        assert!(
            report.lines[2].starts_with("bad.yaml: guard policy: ")
                && report.lines[2].contains("grace"),
            "{report:?}"
        );
        assert_eq!(
            report.lines[3],
            "ext.yaml: extender policy: refused over lines: grace: 10s"
        );
        let none = CheckConfigCli::try_parse_from(["check-config"]).unwrap();
        let e = check_files(&none, read, extender).unwrap_err();
        assert_eq!(
            e.to_string(),
            "no file given (--guard-policy FILE, --extender-config FILE)"
        );
    }

    #[test]
    fn one_prefix_as_the_agent_requires() {
        assert_eq!(guard("annotationPrefix: gpu-warden.io\n"), None);
        let e = guard("annotationPrefix: example.com\n").unwrap_or_default();
        assert!(
            e.contains("annotationPrefix \"example.com\"") && e.contains("\"gpu-warden.io\""),
            "{e}"
        );
        assert!(check_guard_policy("annotationPrefix: example.com\n", "example.com").is_ok());
        assert!(check_prefix("extender policy", None, "example.com").is_ok());
    }
}

/// The chart's values schema knows every key of the agent's guard policy: a key the agent
/// gains (g-agent's `onDecision`, …) cannot be forgotten by the chart, which refuses keys it
/// does not list.
#[cfg(test)]
mod schema_tests {
    use super::*;

    const SCHEMA: &str = include_str!("../../deploy/helm/gpu-warden/values.schema.json");

    fn keys(v: &serde_json::Value) -> Vec<String> {
        v.as_object()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default()
    }

    #[test]
    fn every_policy_key_is_in_the_values_schema() {
        let schema: serde_json::Value = serde_json::from_str(SCHEMA).unwrap();
        let props = &schema["properties"]["guard"]["properties"]["policy"]["properties"];
        let policy = Policy {
            annotation_prefix: Some("gpu-warden.io".into()),
            ..Policy::default()
        };
        let value = serde_json::to_value(&policy).unwrap();
        let mut missing = Vec::new();
        for key in keys(&value) {
            // The mode is guard.mode in the chart (GPU_WARDEN_GUARD_MODE), never a policy key.
            if key == "mode" {
                continue;
            }
            if props.get(&key).is_none() {
                missing.push(key.clone());
            }
            for nested in keys(&value[&key]) {
                if props[&key]["properties"].get(&nested).is_none() {
                    missing.push(format!("{key}.{nested}"));
                }
            }
        }
        assert!(
            missing.is_empty(),
            "guard policy keys missing from values.schema.json guard.policy: {missing:?}"
        );
    }
}
