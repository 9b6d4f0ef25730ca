//! Metric families from a snapshot: dcgm-exporter's device families (same names, types,
//! help, units and label order) and gpu-warden's per-container families. Pure: written
//! straight into the exposition buffer in the text format ([`super::text`]), with no family
//! objects in between; the label order is dcgm-exporter's (`gpu, UUID, pci_bus_id, device,
//! modelName, Hostname, DCGM_FI_DRIVER_VERSION`), part of the drop-in promise.

use super::dcgm_pod_labels::{pods_on, PodLabels};
use super::text::{self, Family, Kind};
use crate::model::snapshot::{GpuSample, Owner, ProcessSample, ProfSample, Snapshot, MIB};
use std::ops::Range;

/// Which hostname label the device families carry. dcgm-exporter used `Hostname` up to
/// 4.8.2 and `hostname` from 4.8.3; some users drop it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HostnameLabel {
    /// `Hostname` (dcgm-exporter ≤ 4.8.2, dashboard 12239).
    #[default]
    Hostname,
    /// `hostname` (dcgm-exporter ≥ 4.8.3).
    Lower,
    /// No hostname label.
    Off,
}

impl HostnameLabel {
    /// The label name, if any.
    pub fn name(self) -> Option<&'static str> {
        match self {
            HostnameLabel::Hostname => Some("Hostname"),
            HostnameLabel::Lower => Some("hostname"),
            HostnameLabel::Off => None,
        }
    }
}

/// What the rendering needs beyond the snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MetricsConfig {
    pub hostname_label: HostnameLabel,
    /// The node's name (the `Hostname` label's value).
    pub hostname: String,
    /// Also export `gpu_warden_process_gpu_memory_used_bytes{…,pid}`.
    pub per_process: bool,
    /// `--dcgm-pod-labels`: pod labels on the DCGM families, as dcgm-exporter's Kubernetes
    /// mode writes them.
    pub pod_labels: PodLabels,
}

const CUDA_FAMILY: &str = "DCGM_FI_CUDA_DRIVER_VERSION";
const CUDA_HELP: &str =
    "CUDA version the driver supports (1000 x major + 10 x minor: 12080 is 12.8).";

/// How a family reads its value off a GPU sample.
type Extract = fn(&GpuSample) -> Option<f64>;

/// dcgm-exporter's device families: name, type, help, value.
const DEVICE_FAMILIES: &[(&str, Kind, &str, Extract)] = &[
    (
        "DCGM_FI_DEV_SM_CLOCK",
        Kind::Gauge,
        "SM clock frequency (in MHz).",
        |g| g.sm_clock_mhz.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_MEM_CLOCK",
        Kind::Gauge,
        "Memory clock frequency (in MHz).",
        |g| g.mem_clock_mhz.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_MEMORY_TEMP",
        Kind::Gauge,
        "Memory temperature (in C).",
        |g| g.memory_temp_c.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_GPU_TEMP",
        Kind::Gauge,
        "GPU temperature (in C).",
        |g| g.gpu_temp_c.map(f64::from),
    ),
    // NVML reports milliwatts; DCGM exports watts with the fraction kept.
    (
        "DCGM_FI_DEV_POWER_USAGE",
        Kind::Gauge,
        "Power draw (in W).",
        |g| g.power_mw.map(|mw| f64::from(mw) / 1000.0),
    ),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        Kind::Counter,
        "Total energy consumption since boot (in mJ).",
        |g| g.energy_mj.map(|v| v as f64),
    ),
    (
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        Kind::Counter,
        "Total number of PCIe retries.",
        |g| g.pcie_replays.map(|v| v as f64),
    ),
    (
        "DCGM_FI_DEV_GPU_UTIL",
        Kind::Gauge,
        "GPU utilization (in %).",
        |g| g.gpu_util_pct.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        Kind::Gauge,
        "Memory utilization (in %).",
        |g| g.mem_copy_util_pct.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_ENC_UTIL",
        Kind::Gauge,
        "Encoder utilization (in %).",
        |g| g.enc_util_pct.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_DEC_UTIL",
        Kind::Gauge,
        "Decoder utilization (in %).",
        |g| g.dec_util_pct.map(f64::from),
    ),
    // Like dcgm-exporter: 0 until the first XID on a GPU whose XIDs are watched; absent
    // where the GPU cannot report XID events.
    (
        "DCGM_FI_DEV_XID_ERRORS",
        Kind::Gauge,
        "Value of the last XID error encountered.",
        |g| g.last_xid.map(|v| v as f64),
    ),
    // Whole MiB, truncated as DCGM does (it divides bytes by 1 MiB in integer arithmetic).
    (
        "DCGM_FI_DEV_FB_FREE",
        Kind::Gauge,
        "Framebuffer memory free (in MiB).",
        |g| g.memory.map(|m| (m.free / MIB) as f64),
    ),
    (
        "DCGM_FI_DEV_FB_USED",
        Kind::Gauge,
        "Framebuffer memory used (in MiB).",
        |g| g.memory.map(|m| (m.used / MIB) as f64),
    ),
    (
        "DCGM_FI_DEV_FB_RESERVED",
        Kind::Gauge,
        "Framebuffer memory reserved (in MiB).",
        |g| g.memory.map(|m| (m.reserved / MIB) as f64),
    ),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        Kind::Counter,
        "Number of remapped rows for uncorrectable errors",
        |g| g.remapped_rows.map(|r| r.uncorrectable as f64),
    ),
    (
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        Kind::Counter,
        "Number of remapped rows for correctable errors",
        |g| g.remapped_rows.map(|r| r.correctable as f64),
    ),
    // dcgm-exporter's default counters (etc/default-counters.csv). DCGM names no unit; the
    // value is NVML's NVLink payload KiB, sent plus received, over all links (README, "Metrics").
    (
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        Kind::Counter,
        "Total number of NVLink bandwidth counters for all lanes.",
        |g| g.nvlink_kib.map(|v| v as f64),
    ),
    (
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        Kind::Gauge,
        "Whether remapping of rows has failed",
        |g| g.remapped_rows.map(|r| if r.failure { 1.0 } else { 0.0 }),
    ),
];

type ProfExtract = fn(&ProfSample) -> Option<f64>;

/// dcgm-exporter's profiling families, from NVML GPM on Hopper and newer.
const PROF_FAMILIES: &[(&str, &str, ProfExtract)] = &[
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active.", |p| p.gr_engine_active),
    ("DCGM_FI_PROF_SM_ACTIVE", "The ratio of cycles an SM has at least 1 warp assigned.", |p| p.sm_active),
    ("DCGM_FI_PROF_SM_OCCUPANCY", "The ratio of number of warps resident on an SM.", |p| p.sm_occupancy),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor (HMMA) pipe is active.", |p| p.pipe_tensor_active),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of cycles the device memory interface is active sending or receiving data.", |p| p.dram_active),
    ("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "Ratio of cycles the fp64 pipes are active.", |p| p.pipe_fp64_active),
    ("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "Ratio of cycles the fp32 pipes are active.", |p| p.pipe_fp32_active),
    ("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "Ratio of cycles the fp16 pipes are active.", |p| p.pipe_fp16_active),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second.", |p| p.pcie_tx_bytes_per_second),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second.", |p| p.pcie_rx_bytes_per_second),
];

/// dcgm-exporter's label set for one GPU, in its order, rendered (`gpu="0",UUID="…",…`).
pub fn write_device_labels(out: &mut Vec<u8>, g: &GpuSample, driver: &str, cfg: &MetricsConfig) {
    text::label_u64(out, true, "gpu", u64::from(g.id.index));
    text::label(out, false, "UUID", &g.id.uuid);
    text::label(out, false, "pci_bus_id", &g.id.pci_bus_id);
    text::label(out, false, "device", &g.id.device);
    text::label(out, false, "modelName", &g.id.model);
    if let Some(name) = cfg.hostname_label.name() {
        text::label(out, false, name, &cfg.hostname);
    }
    text::label(out, false, "DCGM_FI_DRIVER_VERSION", driver);
}

/// Reused scratch space of the snapshot families: each GPU's rendered label set and the
/// processes' order by container. Kept across polls, so rendering allocates nothing once
/// they have grown to the node's size.
#[derive(Debug, Default)]
pub struct Scratch {
    labels: Vec<u8>,
    spans: Vec<Range<usize>>,
    /// The GPU (its place in the snapshot) each span's series reads its value from.
    gpu_of: Vec<usize>,
    order: Vec<usize>,
    line: Vec<u8>,
}

/// Device families (DCGM names) for every GPU in the snapshot, appended to `out`. Families
/// with no value on any GPU are left out entirely (absent, not zero).
pub fn write_device_families(
    out: &mut Vec<u8>,
    scratch: &mut Scratch,
    snap: &Snapshot,
    cfg: &MetricsConfig,
) {
    scratch.labels.clear();
    scratch.spans.clear();
    scratch.gpu_of.clear();
    // Stays empty (no allocation) with pod labels off.
    let mut pods = Vec::new();
    for (i, g) in snap.gpus.iter().enumerate() {
        pods.clear();
        pods_on(snap, g.id.index, cfg.pod_labels, &mut pods);
        // One label set per pod named on the GPU, or one without pod labels.
        for pod in pods.iter().map(Some).chain(pods.is_empty().then_some(None)) {
            let start = scratch.labels.len();
            write_device_labels(&mut scratch.labels, g, &snap.driver_version, cfg);
            if let Some(p) = pod {
                text::label(&mut scratch.labels, false, "container", &p.container);
                text::label(&mut scratch.labels, false, "namespace", &p.namespace);
                text::label(&mut scratch.labels, false, "pod", &p.pod);
            }
            scratch.spans.push(start..scratch.labels.len());
            scratch.gpu_of.push(i);
        }
    }
    let labels = &scratch.labels;
    let series = || {
        scratch
            .spans
            .iter()
            .zip(&scratch.gpu_of)
            .map(|(span, &i)| (&snap.gpus[i], span))
    };
    for (name, kind, help, extract) in DEVICE_FAMILIES {
        let mut f = Family::open(out, name, help, *kind);
        for (g, span) in series() {
            if let Some(v) = extract(g) {
                f.sample(&labels[span.clone()], v);
            }
        }
        f.close();
    }
    // The driver's CUDA version as DCGM encodes its field 5 (`DCGM_FI_CUDA_DRIVER_VERSION`,
    // 12.8 = 12080): dcgm-exporter exports it under this name when a counters CSV lists it as
    // a gauge. Repeated per GPU with the device labels, like every device family, so one
    // alert rule (`< 12080`) reads either exporter. Absent when the driver's figure is unknown.
    if let Some(cuda) = snap.cuda_driver_version {
        let mut f = Family::open(out, CUDA_FAMILY, CUDA_HELP, Kind::Gauge);
        for span in &scratch.spans {
            f.sample(&labels[span.clone()], cuda.as_nvml() as f64);
        }
        f.close();
    }
    for (name, help, extract) in PROF_FAMILIES {
        let mut f = Family::open(out, name, help, Kind::Gauge);
        for (g, span) in series() {
            if let Some(v) = g.prof.as_ref().and_then(extract) {
                f.sample(&labels[span.clone()], v);
            }
        }
        f.close();
    }
}

/// The pod-label triple of a process: empty strings for processes outside any pod, so the
/// per-GPU sum over containers equals the sum over processes.
fn owner_labels(p: &ProcessSample) -> (&str, &str, &str) {
    match &p.owner {
        Owner::Pod(r) => (&r.namespace, &r.pod, &r.container),
        _ => ("", "", ""),
    }
}

/// (gpu index, namespace, pod, container): one per-container series.
type ContainerKey<'a> = (u32, &'a str, &'a str, &'a str);

fn container_key(p: &ProcessSample) -> ContainerKey<'_> {
    let (ns, pod, ctr) = owner_labels(p);
    (p.gpu, ns, pod, ctr)
}

/// `gpu="…",UUID="…",namespace="…",pod="…",container="…"` of one container series.
fn write_container_labels(out: &mut Vec<u8>, snap: &Snapshot, key: ContainerKey<'_>) {
    let (gpu, ns, pod, ctr) = key;
    let uuid = snap.gpu(gpu).map_or("", |g| g.id.uuid.as_str());
    text::label_u64(out, true, "gpu", u64::from(gpu));
    text::label(out, false, "UUID", uuid);
    text::label(out, false, "namespace", ns);
    text::label(out, false, "pod", pod);
    text::label(out, false, "container", ctr);
}

/// gpu-warden's per-container families (and the optional per-process one), appended to
/// `out`: one series per (GPU, namespace, pod, container), in that order, summing the
/// container's processes.
pub fn write_container_families(
    out: &mut Vec<u8>,
    scratch: &mut Scratch,
    snap: &Snapshot,
    cfg: &MetricsConfig,
) {
    let procs = &snap.processes;
    if cfg.per_process {
        let mut f = Family::open(
            out,
            "gpu_warden_process_gpu_memory_used_bytes",
            "GPU memory held by one process on this GPU, in bytes.",
            Kind::Gauge,
        );
        for p in procs {
            if let Some(b) = p.used_bytes {
                scratch.line.clear();
                write_container_labels(&mut scratch.line, snap, container_key(p));
                f.sample_with(
                    None,
                    &scratch.line,
                    |t| {
                        t.label_u64("pid", u64::from(p.pid));
                        t.label("process_name", &p.name);
                    },
                    b as f64,
                );
            }
        }
        f.close();
    }
    // The processes grouped by container key; within a group in snapshot order, so the
    // utilization sums add up in the same order every time.
    scratch.order.clear();
    scratch.order.extend(0..procs.len());
    scratch.order.sort_unstable_by(|&a, &b| {
        container_key(&procs[a])
            .cmp(&container_key(&procs[b]))
            .then(a.cmp(&b))
    });
    let groups = || {
        let order = &scratch.order;
        let mut i = 0;
        std::iter::from_fn(move || {
            let first = *order.get(i)?;
            let key = container_key(&procs[first]);
            let (mut bytes, mut util) = (0u64, None::<f64>);
            while let Some(&j) = order.get(i) {
                let p = &procs[j];
                if container_key(p) != key {
                    break;
                }
                bytes += p.used_bytes.unwrap_or(0);
                if let Some(u) = p.sm_util {
                    util = Some(util.unwrap_or(0.0) + u);
                }
                i += 1;
            }
            Some((key, bytes, util))
        })
    };
    let mut line = std::mem::take(&mut scratch.line);
    let mut f = Family::open(
        out,
        "gpu_warden_container_gpu_memory_used_bytes",
        "GPU memory held by the container's processes on this GPU, in bytes. Processes outside any pod have empty pod labels.",
        Kind::Gauge,
    );
    for (key, bytes, _) in groups() {
        line.clear();
        write_container_labels(&mut line, snap, key);
        f.sample(&line, bytes as f64);
    }
    f.close();
    let mut f = Family::open(
        out,
        "gpu_warden_container_gpu_sm_utilization_ratio",
        "Share of the GPU's SM time used by the container's processes over the last sampling window (0..1).",
        Kind::Gauge,
    );
    for (key, _, util) in groups() {
        if let Some(u) = util {
            line.clear();
            write_container_labels(&mut line, snap, key);
            f.sample(&line, u.min(1.0));
        }
    }
    f.close();
    scratch.line = line;
}

/// `gpu_warden_gpu_memory_pressure{gpu,UUID}`: 0 none, 1 soft, 2 hard; appended to `out`
/// for the GPUs `pressure_of` knows, nothing when it knows none.
pub fn write_pressure_family(
    out: &mut Vec<u8>,
    snap: &Snapshot,
    pressure_of: impl Fn(u32) -> Option<u8>,
) {
    let mut f = Family::open(
        out,
        "gpu_warden_gpu_memory_pressure",
        "GPU memory pressure as the OOM guard sees it: 0 none, 1 soft (below the soft threshold), 2 hard.",
        Kind::Gauge,
    );
    for g in &snap.gpus {
        if let Some(p) = pressure_of(g.id.index) {
            f.sample_with(
                None,
                b"",
                |t| {
                    t.label_u64("gpu", u64::from(g.id.index));
                    t.label("UUID", &g.id.uuid);
                },
                f64::from(p),
            );
        }
    }
    f.close();
}

/// Test fixtures, shared with the sibling families' tests.
#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::snapshot::{GpuHealth, GpuIdentity, MemoryInfo, PodRef, RemappedRows};
    use proptest::prelude::*;
    use std::time::{Duration, SystemTime};

    /// The proto-building implementation the direct writer replaced, kept verbatim as the
    /// oracle the tests compare its bytes with (through the `prometheus` crate's encoder).
    pub(crate) mod oracle {
        use super::super::Kind;
        use super::super::{
            GpuSample, MetricsConfig, Owner, ProcessSample, Snapshot, DEVICE_FAMILIES,
            PROF_FAMILIES,
        };
        use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};
        use std::collections::BTreeMap;

        fn mt(k: Kind) -> MetricType {
            match k {
                Kind::Counter => MetricType::COUNTER,
                Kind::Gauge => MetricType::GAUGE,
                Kind::Histogram => MetricType::HISTOGRAM,
            }
        }

        /// One label pair.
        pub fn label(name: &str, value: &str) -> LabelPair {
            let mut l = LabelPair::default();
            l.set_name(name.to_string());
            l.set_value(value.to_string());
            l
        }

        /// A family with no metrics yet.
        pub fn family(name: &str, help: &str, kind: MetricType) -> MetricFamily {
            let mut mf = MetricFamily::default();
            mf.set_name(name.to_string());
            mf.set_help(help.to_string());
            mf.set_field_type(kind);
            mf
        }

        /// Adds one sample with these labels (in this order) to `mf`.
        pub fn push(mf: &mut MetricFamily, labels: Vec<LabelPair>, value: f64) {
            let mut m = Metric::default();
            m.set_label(labels);
            if mf.get_field_type() == MetricType::COUNTER {
                let mut c = Counter::default();
                c.set_value(value);
                m.set_counter(c);
            } else {
                let mut g = Gauge::default();
                g.set_value(value);
                m.set_gauge(g);
            }
            mf.mut_metric().push(m);
        }

        /// dcgm-exporter's label set for one GPU, in its order.
        pub fn device_labels(g: &GpuSample, driver: &str, cfg: &MetricsConfig) -> Vec<LabelPair> {
            let mut v = vec![
                label("gpu", &g.id.index.to_string()),
                label("UUID", &g.id.uuid),
                label("pci_bus_id", &g.id.pci_bus_id),
                label("device", &g.id.device),
                label("modelName", &g.id.model),
            ];
            if let Some(name) = cfg.hostname_label.name() {
                v.push(label(name, &cfg.hostname));
            }
            v.push(label("DCGM_FI_DRIVER_VERSION", driver));
            v
        }

        /// Device families (DCGM names) for every GPU in the snapshot. Families with no value on
        /// any GPU are left out entirely (absent, not zero).
        pub fn device_families(snap: &Snapshot, cfg: &MetricsConfig) -> Vec<MetricFamily> {
            let labels: Vec<Vec<LabelPair>> = snap
                .gpus
                .iter()
                .map(|g| device_labels(g, &snap.driver_version, cfg))
                .collect();
            let mut out = Vec::with_capacity(DEVICE_FAMILIES.len() + PROF_FAMILIES.len());
            for (name, kind, help, extract) in DEVICE_FAMILIES {
                let mut mf = family(name, help, mt(*kind));
                for (g, l) in snap.gpus.iter().zip(&labels) {
                    if let Some(v) = extract(g) {
                        push(&mut mf, l.clone(), v);
                    }
                }
                if !mf.get_metric().is_empty() {
                    out.push(mf);
                }
            }
            for (name, help, extract) in PROF_FAMILIES {
                let mut mf = family(name, help, MetricType::GAUGE);
                for (g, l) in snap.gpus.iter().zip(&labels) {
                    if let Some(v) = g.prof.as_ref().and_then(extract) {
                        push(&mut mf, l.clone(), v);
                    }
                }
                if !mf.get_metric().is_empty() {
                    out.push(mf);
                }
            }
            out
        }

        /// The pod-label triple of a process: empty strings for processes outside any pod, so the
        /// per-GPU sum over containers equals the sum over processes.
        fn owner_labels(p: &ProcessSample) -> (&str, &str, &str) {
            match &p.owner {
                Owner::Pod(r) => (&r.namespace, &r.pod, &r.container),
                _ => ("", "", ""),
            }
        }

        /// (gpu index, namespace, pod, container): one per-container series.
        type ContainerKey<'a> = (u32, &'a str, &'a str, &'a str);

        /// gpu-warden's per-container families (and the optional per-process one).
        pub fn container_families(snap: &Snapshot, cfg: &MetricsConfig) -> Vec<MetricFamily> {
            let mut per: BTreeMap<ContainerKey, (u64, Option<f64>)> = BTreeMap::new();
            for p in &snap.processes {
                let (ns, pod, ctr) = owner_labels(p);
                let e = per.entry((p.gpu, ns, pod, ctr)).or_insert((0, None));
                e.0 += p.used_bytes.unwrap_or(0);
                if let Some(u) = p.sm_util {
                    e.1 = Some(e.1.unwrap_or(0.0) + u);
                }
            }
            let uuid_of = |gpu: u32| snap.gpu(gpu).map_or("", |g| g.id.uuid.as_str());
            let base = |gpu: u32, ns: &str, pod: &str, ctr: &str| {
                vec![
                    label("gpu", &gpu.to_string()),
                    label("UUID", uuid_of(gpu)),
                    label("namespace", ns),
                    label("pod", pod),
                    label("container", ctr),
                ]
            };
            let mut mem = family(
                "gpu_warden_container_gpu_memory_used_bytes",
                "GPU memory held by the container's processes on this GPU, in bytes. Processes outside any pod have empty pod labels.",
                MetricType::GAUGE,
            );
            let mut util = family(
                "gpu_warden_container_gpu_sm_utilization_ratio",
                "Share of the GPU's SM time used by the container's processes over the last sampling window (0..1).",
                MetricType::GAUGE,
            );
            for ((gpu, ns, pod, ctr), (bytes, u)) in &per {
                push(&mut mem, base(*gpu, ns, pod, ctr), *bytes as f64);
                if let Some(u) = u {
                    push(&mut util, base(*gpu, ns, pod, ctr), u.min(1.0));
                }
            }
            let mut out = Vec::new();
            if cfg.per_process {
                let mut pm = family(
                    "gpu_warden_process_gpu_memory_used_bytes",
                    "GPU memory held by one process on this GPU, in bytes.",
                    MetricType::GAUGE,
                );
                for p in &snap.processes {
                    let (ns, pod, ctr) = owner_labels(p);
                    if let Some(b) = p.used_bytes {
                        let mut l = base(p.gpu, ns, pod, ctr);
                        l.push(label("pid", &p.pid.to_string()));
                        l.push(label("process_name", &p.name));
                        push(&mut pm, l, b as f64);
                    }
                }
                if !pm.get_metric().is_empty() {
                    out.push(pm);
                }
            }
            for mf in [mem, util] {
                if !mf.get_metric().is_empty() {
                    out.push(mf);
                }
            }
            out
        }

        /// `gpu_warden_gpu_memory_pressure{gpu,UUID}`: 0 none, 1 soft, 2 hard.
        pub fn pressure_family(
            snap: &Snapshot,
            pressure_of: impl Fn(u32) -> Option<u8>,
        ) -> Option<MetricFamily> {
            let mut mf = family(
                "gpu_warden_gpu_memory_pressure",
                "GPU memory pressure as the OOM guard sees it: 0 none, 1 soft (below the soft threshold), 2 hard.",
                MetricType::GAUGE,
            );
            for g in &snap.gpus {
                if let Some(p) = pressure_of(g.id.index) {
                    push(
                        &mut mf,
                        vec![
                            label("gpu", &g.id.index.to_string()),
                            label("UUID", &g.id.uuid),
                        ],
                        f64::from(p),
                    );
                }
            }
            (!mf.get_metric().is_empty()).then_some(mf)
        }

        /// Writes families in the Prometheus text format 0.0.4 (the crate's encoder escapes
        /// label values, which carry hostile process and pod names).
        pub fn encode(
            families: &[MetricFamily],
            out: &mut Vec<u8>,
        ) -> Result<(), prometheus::Error> {
            use prometheus::Encoder;
            prometheus::TextEncoder::new().encode(families, out)
        }
    }

    pub(crate) fn gpu(index: u32) -> GpuSample {
        let mut g = GpuSample::empty(
            GpuIdentity {
                index,
                uuid: format!("GPU-{index}"),
                pci_bus_id: format!("00000000:0{index}:00.0"),
                device: format!("nvidia{index}"),
                model: "NVIDIA H200".into(),
            },
            GpuHealth::Ok,
        );
        g.memory = Some(MemoryInfo {
            total: 1000 * MIB,
            used: 300 * MIB + 5,
            free: 600 * MIB,
            reserved: 100 * MIB,
        });
        g.power_mw = Some(123_456);
        g
    }

    fn proc(pid: u32, gpu: u32, mib: u64, owner: Owner) -> ProcessSample {
        ProcessSample {
            pid,
            gpu,
            used_bytes: Some(mib * MIB),
            sm_util: Some(0.25),
            name: "py\"th\\on\n".into(),
            owner,
        }
    }

    pub(crate) fn snap(gpus: Vec<GpuSample>, processes: Vec<ProcessSample>) -> Snapshot {
        Snapshot {
            seq: 1,
            at: Duration::ZERO,
            wall: SystemTime::UNIX_EPOCH,
            driver_version: "580.1".into(),
            cuda_driver_version: None,
            gpus,
            processes,
            util_fresh: true,
            errors: vec![],
        }
    }

    /// What `write` appends to an empty exposition, as text.
    pub(crate) fn text(write: impl FnOnce(&mut Vec<u8>)) -> String {
        let mut out = Vec::new();
        write(&mut out);
        String::from_utf8(out).unwrap()
    }

    fn device_text(s: &Snapshot, c: &MetricsConfig) -> String {
        text(|out| write_device_families(out, &mut Scratch::default(), s, c))
    }

    fn container_text(s: &Snapshot, c: &MetricsConfig) -> String {
        text(|out| write_container_families(out, &mut Scratch::default(), s, c))
    }

    fn cfg() -> MetricsConfig {
        MetricsConfig {
            hostname: "node-1".into(),
            ..MetricsConfig::default()
        }
    }

    #[test]
    fn device_labels_keep_dcgm_order_and_units() {
        let t = device_text(&snap(vec![gpu(0)], vec![]), &cfg());
        assert!(t.contains("DCGM_FI_DEV_FB_USED{gpu=\"0\",UUID=\"GPU-0\",pci_bus_id=\"00000000:00:00.0\",device=\"nvidia0\",modelName=\"NVIDIA H200\",Hostname=\"node-1\",DCGM_FI_DRIVER_VERSION=\"580.1\"} 300\n"), "{t}");
        assert!(
            t.contains("DCGM_FI_DEV_POWER_USAGE{") && t.contains("} 123.456\n"),
            "{t}"
        );
        assert!(t.contains("# TYPE DCGM_FI_DEV_FB_FREE gauge"));
    }

    #[test]
    fn the_cuda_driver_version_is_dcgms_field_5_per_gpu_and_absent_when_unknown() {
        let mut s = snap(vec![gpu(0), gpu(1)], vec![]);
        assert!(!device_text(&s, &cfg()).contains("DCGM_FI_CUDA_DRIVER_VERSION"));
        s.cuda_driver_version = Some(crate::model::cuda::CudaVersion {
            major: 12,
            minor: 8,
        });
        let t = device_text(&s, &cfg());
        assert!(
            t.contains("# TYPE DCGM_FI_CUDA_DRIVER_VERSION gauge\n"),
            "{t}"
        );
        assert!(t.contains("DCGM_FI_CUDA_DRIVER_VERSION{gpu=\"0\",UUID=\"GPU-0\",pci_bus_id=\"00000000:00:00.0\",device=\"nvidia0\",modelName=\"NVIDIA H200\",Hostname=\"node-1\",DCGM_FI_DRIVER_VERSION=\"580.1\"} 12080\n"), "{t}");
        assert_eq!(t.matches("DCGM_FI_CUDA_DRIVER_VERSION{").count(), 2, "{t}");
    }

    #[test]
    fn unsupported_fields_have_no_series() {
        let t = device_text(&snap(vec![gpu(0)], vec![]), &cfg());
        assert!(!t.contains("DCGM_FI_DEV_GPU_TEMP"), "{t}");
        assert!(!t.contains("DCGM_FI_DEV_XID_ERRORS"), "{t}");
    }

    #[test]
    fn hostname_label_is_configurable() {
        let mut c = cfg();
        c.hostname_label = HostnameLabel::Lower;
        let t = device_text(&snap(vec![gpu(0)], vec![]), &c);
        assert!(t.contains(",hostname=\"node-1\","), "{t}");
        c.hostname_label = HostnameLabel::Off;
        let t = device_text(&snap(vec![gpu(0)], vec![]), &c);
        assert!(!t.to_lowercase().contains("hostname="), "{t}");
    }

    #[test]
    fn containers_sum_processes_and_host_processes_have_empty_labels() {
        let pod = |name: &str| {
            Owner::Pod(PodRef {
                namespace: "ci".into(),
                pod: name.into(),
                container: "build".into(),
                uid: "u".into(),
            })
        };
        let s = snap(
            vec![gpu(0)],
            vec![
                proc(1, 0, 100, pod("a")),
                proc(2, 0, 50, pod("a")),
                proc(3, 0, 10, Owner::Host),
            ],
        );
        let t = container_text(&s, &cfg());
        assert!(t.contains("gpu_warden_container_gpu_memory_used_bytes{gpu=\"0\",UUID=\"GPU-0\",namespace=\"ci\",pod=\"a\",container=\"build\"} 157286400\n"), "{t}");
        assert!(t.contains("gpu_warden_container_gpu_memory_used_bytes{gpu=\"0\",UUID=\"GPU-0\",namespace=\"\",pod=\"\",container=\"\"} 10485760\n"), "{t}");
        assert!(t.contains("gpu_warden_container_gpu_sm_utilization_ratio{gpu=\"0\",UUID=\"GPU-0\",namespace=\"ci\",pod=\"a\",container=\"build\"} 0.5\n"), "{t}");
    }

    #[test]
    fn hostile_names_are_escaped() {
        let mut c = cfg();
        c.per_process = true;
        let s = snap(vec![gpu(0)], vec![proc(7, 0, 1, Owner::Host)]);
        let t = container_text(&s, &c);
        assert!(t.contains("process_name=\"py\\\"th\\\\on\\n\""), "{t}");
        assert_eq!(t.lines().filter(|l| l.contains("pid=\"7\"")).count(), 1);
    }

    #[test]
    fn pressure_family_skips_unknown_gpus() {
        let s = snap(vec![gpu(0), gpu(1)], vec![]);
        let t = text(|out| write_pressure_family(out, &s, |i| (i == 1).then_some(2)));
        assert!(
            t.contains("gpu_warden_gpu_memory_pressure{gpu=\"1\",UUID=\"GPU-1\"} 2\n"),
            "{t}"
        );
        assert!(!t.contains("gpu=\"0\""));
        assert!(text(|out| write_pressure_family(out, &s, |_| None)).is_empty());
    }

    /// The oracle's bytes: families built as `prometheus` protos, written by its encoder.
    fn oracle_text(s: &Snapshot, c: &MetricsConfig, pressure: &[(u32, u8)]) -> String {
        let mut fams = oracle::device_families(s, c);
        fams.extend(oracle::container_families(s, c));
        fams.extend(oracle::pressure_family(s, |i| {
            pressure.iter().find(|p| p.0 == i).map(|p| p.1)
        }));
        let mut out = Vec::new();
        oracle::encode(&fams, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    fn direct_text(
        scratch: &mut Scratch,
        s: &Snapshot,
        c: &MetricsConfig,
        pressure: &[(u32, u8)],
    ) -> String {
        text(|out| {
            write_device_families(out, scratch, s, c);
            write_container_families(out, scratch, s, c);
            write_pressure_family(out, s, |i| pressure.iter().find(|p| p.0 == i).map(|p| p.1));
        })
    }

    #[test]
    fn the_fixtures_render_byte_for_byte_as_the_encoder_did() {
        let mut c = cfg();
        let pod = |name: &str| {
            Owner::Pod(PodRef {
                namespace: "n\\s\"".into(),
                pod: name.into(),
                container: "c\nd".into(),
                uid: "u".into(),
            })
        };
        let mut g1 = gpu(1);
        g1.id.model = "H\"200\\\n".into();
        g1.gpu_temp_c = Some(41);
        g1.energy_mj = Some(u64::MAX);
        g1.prof = Some(ProfSample {
            sm_active: Some(0.1 + 0.2),
            ..ProfSample::default()
        });
        let s = snap(
            vec![gpu(0), g1],
            vec![
                proc(3, 1, 10, Owner::Host),
                proc(1, 0, 100, pod("a")),
                proc(2, 0, 50, pod("a")),
                proc(4, 1, 7, pod("b")),
                proc(5, 0, 1, Owner::Invisible),
            ],
        );
        let mut scratch = Scratch::default();
        for (label, per_process) in [
            (HostnameLabel::Hostname, true),
            (HostnameLabel::Lower, false),
            (HostnameLabel::Off, true),
        ] {
            c.hostname_label = label;
            c.per_process = per_process;
            let want = oracle_text(&s, &c, &[(1, 2)]);
            // Twice on the same scratch: nothing of one poll leaks into the next.
            for _ in 0..2 {
                assert_eq!(direct_text(&mut scratch, &s, &c, &[(1, 2)]), want);
            }
        }
        let empty = snap(vec![], vec![]);
        assert_eq!(direct_text(&mut scratch, &empty, &c, &[]), "");
        assert_eq!(oracle_text(&empty, &c, &[]), "");
    }

    fn hostile() -> impl Strategy<Value = String> {
        // Escaped characters, quotes, multi-byte text, controls and plain names.
        proptest::string::string_regex("[a-z\\\\\"\n\t {}=,ü✓\u{0}]{0,12}").unwrap()
    }

    fn arb_snapshot() -> impl Strategy<Value = Snapshot> {
        let g = (
            hostile(),
            proptest::option::of(any::<u32>()),
            proptest::option::of(any::<u64>()),
            proptest::option::of(-1e6f64..1e6),
            proptest::option::of((any::<u64>(), any::<u64>(), any::<bool>())),
        );
        let p = (
            0u32..3,
            any::<u32>(),
            proptest::option::of(any::<u64>()),
            proptest::option::of(0.0f64..0.7),
            hostile(),
            proptest::option::of((0u8..3, 0u8..3, 0u8..3, hostile())),
        );
        (
            hostile(),
            proptest::collection::vec(g, 0..3),
            proptest::collection::vec(p, 0..12),
        )
            .prop_map(|(driver, gs, ps)| {
                let gpus = gs
                    .into_iter()
                    .enumerate()
                    .map(|(i, (model, power, energy, ratio, rows))| {
                        let mut g = gpu(i as u32);
                        g.id.model = model;
                        g.power_mw = power;
                        g.energy_mj = energy;
                        g.memory_temp_c = power.map(|p| p % 120);
                        g.prof = ratio.map(|r| ProfSample {
                            dram_active: Some(r),
                            pcie_rx_bytes_per_second: Some(r * 1e3),
                            ..ProfSample::default()
                        });
                        g.remapped_rows = rows.map(|(c, u, f)| RemappedRows {
                            correctable: c,
                            uncorrectable: u,
                            pending: false,
                            failure: f,
                        });
                        g
                    })
                    .collect();
                let names = ["ci", "a\"b", "ns\\"];
                let processes = ps
                    .into_iter()
                    .map(|(gpu, pid, used, util, name, owner)| ProcessSample {
                        pid,
                        gpu,
                        used_bytes: used.map(|u| u >> 8),
                        sm_util: util,
                        name,
                        owner: match owner {
                            None => Owner::Host,
                            Some((2, 2, _, _)) => Owner::Unknown,
                            Some((ns, pod, ctr, extra)) => Owner::Pod(PodRef {
                                namespace: names[usize::from(ns)].into(),
                                pod: format!("{}{extra}", names[usize::from(pod)]),
                                container: names[usize::from(ctr)].into(),
                                uid: "u".into(),
                            }),
                        },
                    })
                    .collect();
                let mut s = snap(gpus, processes);
                s.driver_version = driver;
                s
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Any snapshot, hostile names included, renders to exactly the encoder's bytes.
        #[test]
        fn any_snapshot_renders_as_the_encoder_did(
            s in arb_snapshot(),
            host in hostile(),
            per_process in any::<bool>(),
            lower in any::<bool>(),
            pressure in proptest::collection::vec((0u32..4, 0u8..3), 0..3),
        ) {
            let c = MetricsConfig {
                hostname_label: if lower { HostnameLabel::Lower } else { HostnameLabel::Hostname },
                hostname: host,
                per_process,
                // The encoder oracle has no pod labels; dcgm_pod_labels and the e2e golden
                // test cover them.
                pod_labels: Default::default(),
            };
            let mut scratch = Scratch::default();
            prop_assert_eq!(
                direct_text(&mut scratch, &s, &c, &pressure),
                oracle_text(&s, &c, &pressure)
            );
        }
    }
}
