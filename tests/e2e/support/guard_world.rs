//! The guard's binary on the API double: the real agent (simulated GPU, guard in enforce
//! mode, 250 ms polls) on one node whose scenario pods the double holds, for the tests that
//! inject API faults while a GPU fills up (`guard_api_faults`, `guard_refusals`,
//! `pod_view_guard`).

use super::{get, Agent, AgentArgs};
use apiserver_double::{ApiServer, EvictionOutcome, Method, RecordedRequest};
use std::time::{Duration, Instant};

/// The node the scenario's pods are bound to.
pub const NODE: &str = "gpu-node-1";

/// The GPU most of these tests fill: 22.6 GiB usable; a trainer (priority 1000000, 8 GiB),
/// two CI jobs (3 GiB each) and a greedy CI job growing 1 GiB/s from 1 s: soft pressure at
/// ≈6 s, hard at ≈7.5 s.
pub const SCENARIO: &str = r#"
driver_version: "580.95.05"
gpus:
  - model: NVIDIA A10G
    uuid: GPU-3f5e2a8b-1c4d-4e6f-9a0b-7c8d9e0f1a2b
    pci_bus_id: "00000000:00:1E.0"
    memory_mib: 23028
    reserved_mib: 434
processes:
  - pid: 500
    gpu: 0
    name: torchrun
    memory: {constant: 8192}
    pod: {namespace: ml-train, name: trainer, container: main, priority: 1000000}
  - pid: 501
    gpu: 0
    name: pytest
    memory: {constant: 3072}
    pod: {namespace: ci, name: ci-a, container: build, priority: 0}
  - pid: 502
    gpu: 0
    name: pytest
    memory: {constant: 3072}
    pod: {namespace: ci, name: ci-b, container: build, priority: 0}
  - pid: 503
    gpu: 0
    name: python3
    start: 1s
    memory: {linear: {from: 512, per_second: 1024}}
    pod: {namespace: ci, name: greedy, container: build, priority: 0}
"#;

/// The guard policy these tests run: with grace 0 the API server deletes an evicted pod at
/// once (as the generic store does), and the kubelet's signals reach no process — the
/// simulated processes live in the agent — so the cooldown (60 s) keeps the guard from
/// deciding twice.
pub const POLICY: &str = "mode: enforce\nevictionGracePeriodSeconds: 0\ncooldownTimeout: 60s\n";

/// Which of the evictions the double recorded [`GuardWorld::evicted`] lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    /// Every eviction it answered (its faults refuse none of them).
    Every,
    /// Only those it carried out (its faults refuse some).
    Accepted,
}

/// The double, the node, the scenario's pods and the agent.
pub struct GuardWorld {
    _rt: tokio::runtime::Runtime,
    pub server: ApiServer,
    agent: Option<Agent>,
    /// The agent's command line and extra environment, for [`GuardWorld::restart`].
    args: Vec<String>,
    env: Vec<(String, std::ffi::OsString)>,
    /// Just before the agent was started.
    pub started: Instant,
    counted: Counted,
    _dir: tempfile::TempDir,
}

/// The agent's `/state`, fetched only when a wait fails.
struct StateOf<'a>(&'a GuardWorld);

impl std::fmt::Display for StateOf<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0.state())
    }
}

impl GuardWorld {
    /// The double with the node and the pods of `scenario` (named `name`), the agent on it
    /// with the guard policy `policy`; `before` runs before the agent starts (to inject the
    /// faults its first requests meet). [`GuardWorld::evicted`] lists every eviction.
    pub fn start(
        scenario: &str,
        name: &str,
        policy: &str,
        before: impl FnOnce(&ApiServer),
    ) -> GuardWorld {
        GuardWorld::start_env(scenario, name, policy, &[], before)
    }

    /// As [`GuardWorld::start`], with extra environment variables for the agent (e.g.
    /// `POD_NAMESPACE`, which gives it a Lease).
    pub fn start_env(
        scenario: &str,
        name: &str,
        policy: &str,
        extra_env: &[(&str, &str)],
        before: impl FnOnce(&ApiServer),
    ) -> GuardWorld {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let server = rt.block_on(ApiServer::start()).unwrap();
        let parsed = gpu_warden::sample::scenario::Scenario::parse(scenario, name).unwrap();
        server
            .add_node(serde_json::json!({"metadata": {"name": NODE}}))
            .unwrap();
        for pod in gpu_warden::sample::sim::scenario_pods(&parsed, NODE) {
            server.add_pod(pod).unwrap();
        }
        before(&server);
        let dir = tempfile::tempdir().unwrap();
        let scenario_path = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&scenario_path, scenario).unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        server.write_kubeconfig(&kubeconfig).unwrap();
        let policy_path = dir.path().join("policy.yaml");
        std::fs::write(&policy_path, policy).unwrap();
        let args = AgentArgs::sim()
            .scenario(&scenario_path)
            .node(NODE)
            .poll("250ms")
            .guard_config(&policy_path);
        let args: Vec<String> = args.args().into_iter().map(String::from).collect();
        let mut env: Vec<(String, std::ffi::OsString)> =
            vec![("KUBECONFIG".into(), kubeconfig.into_os_string())];
        env.extend(extra_env.iter().map(|(k, v)| (k.to_string(), v.into())));
        let started = Instant::now();
        let agent = spawn_agent(&args, &env);
        GuardWorld {
            _rt: rt,
            server,
            agent: Some(agent),
            args,
            env,
            started,
            counted: Counted::Every,
            _dir: dir,
        }
    }

    /// Which evictions [`GuardWorld::evicted`] lists.
    #[must_use]
    pub fn counting(mut self, counted: Counted) -> GuardWorld {
        self.counted = counted;
        self
    }

    pub fn port(&self) -> u16 {
        self.agent.as_ref().map_or(0, |a| a.port)
    }

    /// The eviction POSTs the double received, in order.
    pub fn posts(&self) -> Vec<RecordedRequest> {
        self.server
            .requests()
            .into_iter()
            .filter(|r| r.method == Method::POST && r.path.ends_with("/eviction"))
            .collect()
    }

    /// The pods evicted (as [`Counted`] says), in order.
    pub fn evicted(&self) -> Vec<String> {
        self.server
            .evictions()
            .into_iter()
            .filter(|e| self.counted == Counted::Every || e.outcome == EvictionOutcome::Accepted)
            .map(|e| format!("{}/{}", e.namespace, e.name))
            .collect()
    }

    /// The notes of the Events about the Node, in order (events.k8s.io's `note`, or core/v1's
    /// `message`).
    pub fn node_notes(&self) -> Vec<String> {
        self.server
            .events()
            .into_iter()
            .filter_map(|e| {
                let about = e
                    .object
                    .get("regarding")
                    .or_else(|| e.object.get("involvedObject"))?;
                (about["kind"] == "Node").then(|| {
                    e.object["note"]
                        .as_str()
                        .or_else(|| e.object["message"].as_str())
                        .unwrap_or("")
                        .to_string()
                })
            })
            .collect()
    }

    pub fn state(&self) -> serde_json::Value {
        get(self.port(), "/state")
            .ok()
            .and_then(|r| serde_json::from_str(&r.body).ok())
            .unwrap_or_default()
    }

    /// Waits for `f`; a timeout shows the agent's `/state` (read only then).
    pub fn wait(&self, what: &str, within: Duration, mut f: impl FnMut(&GuardWorld) -> bool) {
        gpu_warden_testkit::wait_for_seen(what, within, || {
            if f(self) {
                Ok(())
            } else {
                Err(StateOf(self))
            }
        });
    }

    /// Stops the agent (SIGTERM, exit 0 expected) and starts a new process of it with the
    /// same command line, as a rollout does; returns the old process's log.
    pub fn restart(&mut self) -> String {
        let log = self.stop();
        self.agent = Some(spawn_agent(&self.args, &self.env));
        log
    }

    /// Stops the agent (exit 0 expected) and returns its log.
    pub fn stop(&mut self) -> String {
        let (status, _, log) = self.agent.take().map(Agent::terminate).unwrap();
        assert!(status.success(), "{log}");
        log
    }
}

fn spawn_agent(args: &[String], env: &[(String, std::ffi::OsString)]) -> Agent {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let env: Vec<(&str, &std::ffi::OsStr)> = env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_os_str()))
        .collect();
    Agent::start_with_env(&args, &env)
}
