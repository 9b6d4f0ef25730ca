//! Builders so tests read like tables: GPUs in MiB, processes by pod UID, pods with
//! chained attributes (and, for the API double, the same pod as a Kubernetes object).

use crate::model::pod::PodInfo;
use crate::model::snapshot::{
    GpuHealth, GpuIdentity, GpuSample, MemoryInfo, Owner, PodRef, ProcessSample, Snapshot, MIB,
};
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime};

/// Framebuffer figures in MiB, with nothing reserved.
pub fn mem(total_mib: u64, used_mib: u64) -> MemoryInfo {
    mem_reserved(total_mib, used_mib, 0)
}

/// Framebuffer figures in MiB; `free = total - used - reserved`, as NVML v2 reports it.
pub fn mem_reserved(total_mib: u64, used_mib: u64, reserved_mib: u64) -> MemoryInfo {
    MemoryInfo {
        total: total_mib * MIB,
        used: used_mib * MIB,
        free: (total_mib - used_mib - reserved_mib) * MIB,
        reserved: reserved_mib * MIB,
    }
}

/// A healthy GPU with `used_mib` of `total_mib` in use.
pub fn gpu(index: u32, total_mib: u64, used_mib: u64) -> GpuSample {
    gpu_mem(index, mem(total_mib, used_mib))
}

/// A healthy GPU with these memory figures.
pub fn gpu_mem(index: u32, memory: MemoryInfo) -> GpuSample {
    let mut g = GpuSample::empty(
        GpuIdentity {
            index,
            uuid: format!("GPU-{index:08}"),
            pci_bus_id: format!("00000000:{:02x}:00.0", index + 6),
            device: format!("nvidia{index}"),
            model: "NVIDIA A10G".into(),
        },
        GpuHealth::Ok,
    );
    g.memory = Some(memory);
    g
}

/// A stable fake PID per pod UID, so a test can drop "that pod's process" by UID.
pub fn pid_of(uid: &str) -> u32 {
    1000 + (crate::model::ids::fnv64(&[uid]) % 1_000_000) as u32
}

/// A process of pod `uid` (container `main`) holding `mib` on `gpu`.
pub fn proc_in(uid: &str, gpu: u32, mib: u64) -> ProcessSample {
    proc_pid(pid_of(uid), uid, gpu, mib)
}

/// Like [`proc_in`] with an explicit PID.
pub fn proc_pid(pid: u32, uid: &str, gpu: u32, mib: u64) -> ProcessSample {
    ProcessSample {
        pid,
        gpu,
        used_bytes: Some(mib * MIB),
        sm_util: None,
        name: "python".into(),
        owner: Owner::Pod(PodRef {
            namespace: "ci".into(),
            pod: uid.into(),
            container: "main".into(),
            uid: uid.into(),
        }),
    }
}

/// A process of pod `uid` whose memory NVML could not tell.
pub fn proc_unknown_mem(uid: &str, gpu: u32) -> ProcessSample {
    ProcessSample {
        used_bytes: None,
        ..proc_in(uid, gpu, 0)
    }
}

/// A host process (no pod) holding `mib` on `gpu`.
pub fn host_proc(pid: u32, gpu: u32, mib: u64) -> ProcessSample {
    ProcessSample {
        owner: Owner::Host,
        name: "Xorg".into(),
        ..proc_pid(pid, "host", gpu, mib)
    }
}

/// A snapshot of these GPUs and processes.
pub fn snap(gpus: Vec<GpuSample>, processes: Vec<ProcessSample>) -> Snapshot {
    Snapshot {
        seq: 0,
        at: Duration::ZERO,
        wall: SystemTime::UNIX_EPOCH,
        driver_version: "580.159.04".into(),
        cuda_driver_version: None,
        gpus,
        processes,
        util_fresh: true,
        errors: vec![],
    }
}

/// Seconds as a monotonic instant.
pub fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// Milliseconds as a monotonic instant.
pub fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

/// A pod under construction; defaults: namespace `ci`, name = UID, priority 0, a Job
/// owner, created at an unknown time.
#[derive(Debug, Clone)]
pub struct PodBuilder(pub PodInfo);

/// Starts a pod with this UID.
pub fn pod(uid: &str) -> PodBuilder {
    PodBuilder(PodInfo {
        uid: uid.into(),
        namespace: "ci".into(),
        name: uid.into(),
        priority: 0,
        priority_class: None,
        owner_kind: Some("Job".into()),
        is_mirror: false,
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        created_at: None,
        terminating: false,
        phase: None,
        containers: vec![],
    })
}

impl PodBuilder {
    /// The pod as the API server would serve it, bound to `node` (for the API double).
    pub fn api_object(&self, node: &str) -> serde_json::Value {
        let p = &self.0;
        let mut o = serde_json::json!({
            "metadata": {
                "name": p.name, "namespace": p.namespace, "uid": p.uid,
                "labels": p.labels, "annotations": p.annotations,
            },
            "spec": {"nodeName": node, "priority": p.priority},
        });
        if !p.containers.is_empty() {
            let containers: Vec<serde_json::Value> = p
                .containers
                .iter()
                .map(|c| {
                    let limits = if c.gpu {
                        serde_json::json!({"nvidia.com/gpu": "1"})
                    } else {
                        serde_json::json!({})
                    };
                    serde_json::json!({"name": c.name, "image": c.image, "resources": {"limits": limits}})
                })
                .collect();
            o["spec"]["containers"] = containers.into();
        }
        o
    }

    /// Adds a container `name` running `image`; `gpu`: it asks for `nvidia.com/gpu: 1`.
    pub fn container(mut self, name: &str, image: &str, gpu: bool) -> Self {
        self.0.containers.push(crate::model::pod::ContainerInfo {
            name: name.into(),
            container_id: None,
            image: Some(image.into()),
            gpu,
        });
        self
    }

    /// Sets the namespace.
    pub fn ns(mut self, ns: &str) -> Self {
        self.0.namespace = ns.into();
        self
    }
    /// Sets the pod name.
    pub fn name(mut self, name: &str) -> Self {
        self.0.name = name.into();
        self
    }
    /// Sets `spec.priority`.
    pub fn priority(mut self, p: i32) -> Self {
        self.0.priority = p;
        self
    }
    /// Sets the controlling owner's kind.
    pub fn owner(mut self, kind: &str) -> Self {
        self.0.owner_kind = Some(kind.into());
        self
    }
    /// Marks it a static pod's mirror.
    pub fn mirror(mut self) -> Self {
        self.0.is_mirror = true;
        self
    }
    /// Marks it terminating (deletionTimestamp set).
    pub fn terminating(mut self) -> Self {
        self.0.terminating = true;
        self
    }
    /// Adds a label.
    pub fn label(mut self, k: &str, v: &str) -> Self {
        self.0.labels.insert(k.into(), v.into());
        self
    }
    /// Adds an annotation.
    pub fn annotation(mut self, k: &str, v: &str) -> Self {
        self.0.annotations.insert(k.into(), v.into());
        self
    }
    /// Sets `gpu-warden.io/vram-request-mib`.
    pub fn request_mib(self, mib: u64) -> Self {
        let key = crate::model::vram_request::key(crate::model::units::DEFAULT_ANNOTATION_PREFIX);
        self.annotation(&key, &mib.to_string())
    }
    /// Created this many seconds after the epoch (larger is younger).
    pub fn created(mut self, secs: u64) -> Self {
        self.0.created_at = Some(SystemTime::UNIX_EPOCH + Duration::from_secs(secs));
        self
    }
}

/// The pod map keyed by UID, as the guard receives it.
pub fn pods(list: impl IntoIterator<Item = PodBuilder>) -> HashMap<String, PodInfo> {
    list.into_iter()
        .map(|PodBuilder(p)| (p.uid.clone(), p))
        .collect()
}
