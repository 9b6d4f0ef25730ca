//! What the enforcer tests (`enforce_e2e`, `guard_stop`) hand the real enforcer and guard:
//! the API double's node, GPU 0 as one poll saw it, a pod's process on it, and the real kube
//! clients on the double.

use apiserver_double::ApiServer;
use gpu_warden::act::client::KubeClients;
use gpu_warden::model::snapshot::{
    GpuHealth, GpuIdentity, GpuSample, MemoryInfo, Owner, PodRef, ProcessSample, Snapshot, MIB,
};
use std::time::{Duration, SystemTime};

/// The node every pod is bound to.
pub const NODE: &str = "gpu-node-1";
/// MiB of the test GPU: with the default policy hard is 500, soft 1000, target 1200 MiB.
pub const TOTAL: u64 = 10_000;

/// The double with [`NODE`], and the real kube clients on it.
pub async fn double() -> Result<(ApiServer, KubeClients), Box<dyn std::error::Error>> {
    let server = ApiServer::start().await?;
    server.add_node(serde_json::json!({"metadata": {"name": NODE}}))?;
    let clients =
        gpu_warden::act::client::from_config(kube::Config::new(server.url().parse()?), "test")?;
    Ok((server, clients))
}

/// Who a process belongs to: the pod's namespace, name and UID.
pub struct Pod<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
}

/// Process `pid` (`name`, in container `container` of `pod`) using `mib` MiB of GPU 0.
pub fn process(pid: u32, name: &str, pod: Pod<'_>, container: &str, mib: u64) -> ProcessSample {
    ProcessSample {
        pid,
        gpu: 0,
        used_bytes: Some(mib * MIB),
        sm_util: None,
        name: name.into(),
        owner: Owner::Pod(PodRef {
            namespace: pod.namespace.into(),
            pod: pod.name.into(),
            container: container.into(),
            uid: pod.uid.into(),
        }),
    }
}

/// The first poll: GPU 0, an A10G of [`TOTAL`] MiB with `used` MiB in use, and `processes`.
pub fn snapshot(used: u64, processes: Vec<ProcessSample>) -> Snapshot {
    let mut gpu = GpuSample::empty(
        GpuIdentity {
            index: 0,
            uuid: "GPU-8f1b2c3d-0000-1111-2222-333344445555".into(),
            pci_bus_id: "00000000:06:00.0".into(),
            device: "nvidia0".into(),
            model: "NVIDIA A10G".into(),
        },
        GpuHealth::Ok,
    );
    gpu.memory = Some(MemoryInfo {
        total: TOTAL * MIB,
        used: used * MIB,
        free: (TOTAL - used) * MIB,
        reserved: 0,
    });
    Snapshot {
        seq: 1,
        at: Duration::ZERO,
        wall: SystemTime::UNIX_EPOCH,
        driver_version: "580.159.04".into(),
        cuda_driver_version: None,
        gpus: vec![gpu],
        processes,
        util_fresh: true,
        errors: vec![],
    }
}
