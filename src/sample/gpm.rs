//! Pure helpers for NVML GPM (GPU Performance Monitoring, Hopper and newer): which GPM
//! metrics feed which dcgm-exporter profiling family, their unit conversions, and the ring
//! of two samples a GPU keeps between polls. No NVML calls here, so all of it is unit-tested
//! on machines without a GPU; `nvml.rs` does the calls.
//!
//! Units. NVML's header (`nvmlGpmMetricId_t` in `nvml.h`) documents every `*_UTIL` and
//! `SM_OCCUPANCY` metric as a percentage "0.0 - 100.0", and `PCIE_TX_PER_SEC` /
//! `PCIE_RX_PER_SEC` as "PCIe traffic from/to this GPU in MiB/sec". dcgm-exporter's
//! `DCGM_FI_PROF_*` families are ratios 0..1 and bytes per second, so percentages are divided
//! by 100 and MiB/s multiplied by 1 048 576. These conversions follow the documentation;
//! the H200 run of `hw/gpm_h200.py` must confirm them empirically (idle vs a saturating
//! bf16 matmul vs a device-memory copy loop), and `docs/gpm.md` records the verdict.

use crate::model::snapshot::ProfSample;
use nvml_wrapper::enums::gpm::GpmMetricId;
use std::time::Duration;

/// The unit NVML reports a GPM metric in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpmUnit {
    /// 0.0 – 100.0; exported as a ratio 0..1.
    Percent,
    /// MiB per second; exported as bytes per second.
    MibPerSecond,
}

impl GpmUnit {
    /// The unit string NVML is expected to report in `metricInfo.unit` (for a one-time
    /// consistency check in the logs; the conversion never depends on it).
    pub fn expected_token(self) -> &'static str {
        match self {
            GpmUnit::Percent => "%",
            GpmUnit::MibPerSecond => "MiB",
        }
    }

    /// Converts a raw GPM value into the DCGM family's unit. Non-finite or negative values
    /// give `None` (no series); ratios are clamped to 1.0 since NVML's arithmetic can
    /// overshoot 100 % by a rounding error.
    pub fn convert(self, raw: f64) -> Option<f64> {
        if !raw.is_finite() || raw < 0.0 {
            return None;
        }
        Some(match self {
            GpmUnit::Percent => (raw / 100.0).min(1.0),
            GpmUnit::MibPerSecond => raw * 1_048_576.0,
        })
    }
}

/// One GPM metric and the profiling family it feeds.
#[derive(Debug, Clone, Copy)]
pub struct ProfMetric {
    pub id: GpmMetricId,
    /// NVML's name, without the `NVML_GPM_METRIC_` prefix (logs, docs).
    pub nvml_name: &'static str,
    /// dcgm-exporter's family.
    pub family: &'static str,
    pub unit: GpmUnit,
    set: fn(&mut ProfSample, f64),
}

impl ProfMetric {
    /// Stores an already converted value into its field of `p`.
    pub fn store(&self, p: &mut ProfSample, value: f64) {
        (self.set)(p, value)
    }
}

/// Every GPM metric gpu-warden asks for, in request order.
pub const PROF_METRICS: [ProfMetric; 10] = [
    ProfMetric {
        id: GpmMetricId::GraphicsUtil,
        nvml_name: "GRAPHICS_UTIL",
        family: "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        unit: GpmUnit::Percent,
        set: |p, v| p.gr_engine_active = Some(v),
    },
    ProfMetric {
        id: GpmMetricId::SmUtil,
        nvml_name: "SM_UTIL",
        family: "DCGM_FI_PROF_SM_ACTIVE",
        unit: GpmUnit::Percent,
        set: |p, v| p.sm_active = Some(v),
    },
    ProfMetric {
        id: GpmMetricId::SmOccupancy,
        nvml_name: "SM_OCCUPANCY",
        family: "DCGM_FI_PROF_SM_OCCUPANCY",
        unit: GpmUnit::Percent,
        set: |p, v| p.sm_occupancy = Some(v),
    },
    ProfMetric {
        id: GpmMetricId::AnyTensorUtil,
        nvml_name: "ANY_TENSOR_UTIL",
        family: "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        unit: GpmUnit::Percent,
        set: |p, v| p.pipe_tensor_active = Some(v),
    },
    ProfMetric {
        id: GpmMetricId::DramBwUtil,
        nvml_name: "DRAM_BW_UTIL",
        family: "DCGM_FI_PROF_DRAM_ACTIVE",
        unit: GpmUnit::Percent,
        set: |p, v| p.dram_active = Some(v),
    },
    ProfMetric {
        id: GpmMetricId::Fp64Util,
        nvml_name: "FP64_UTIL",
        family: "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
        unit: GpmUnit::Percent,
        set: |p, v| p.pipe_fp64_active = Some(v),
    },
    ProfMetric {
        id: GpmMetricId::Fp32Util,
        nvml_name: "FP32_UTIL",
        family: "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
        unit: GpmUnit::Percent,
        set: |p, v| p.pipe_fp32_active = Some(v),
    },
    ProfMetric {
        id: GpmMetricId::Fp16Util,
        nvml_name: "FP16_UTIL",
        family: "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
        unit: GpmUnit::Percent,
        set: |p, v| p.pipe_fp16_active = Some(v),
    },
    ProfMetric {
        id: GpmMetricId::PcieTxPerSec,
        nvml_name: "PCIE_TX_PER_SEC",
        family: "DCGM_FI_PROF_PCIE_TX_BYTES",
        unit: GpmUnit::MibPerSecond,
        set: |p, v| p.pcie_tx_bytes_per_second = Some(v),
    },
    ProfMetric {
        id: GpmMetricId::PcieRxPerSec,
        nvml_name: "PCIE_RX_PER_SEC",
        family: "DCGM_FI_PROF_PCIE_RX_BYTES",
        unit: GpmUnit::MibPerSecond,
        set: |p, v| p.pcie_rx_bytes_per_second = Some(v),
    },
];

/// The metric ids to pass to `gpm_metrics_get`, in [`PROF_METRICS`] order.
pub fn metric_ids() -> [GpmMetricId; 10] {
    PROF_METRICS.map(|m| m.id)
}

/// Builds a [`ProfSample`] from raw per-metric results in [`PROF_METRICS`] order (`None`
/// where NVML failed that one metric). A metric whose value cannot be converted stays
/// absent; the others are still reported. `None` when no metric at all has a value.
pub fn prof_from_raw(raw: &[Option<f64>]) -> Option<ProfSample> {
    let mut p = ProfSample::default();
    let mut any = false;
    for (m, v) in PROF_METRICS.iter().zip(raw) {
        if let Some(v) = v.and_then(|v| m.unit.convert(v)) {
            m.store(&mut p, v);
            any = true;
        }
    }
    any.then_some(p)
}

/// Shortest window GPM metrics are computed over. A full poll that comes sooner after the
/// previous GPM sample (the guard's `PollNow`, or a sub-100 ms `--poll-interval`) takes no
/// new sample and reports the last computed figures, so the window keeps growing and the
/// series never flaps.
pub const MIN_WINDOW: Duration = Duration::from_millis(100);

/// The shortest window a sample is computed over when samples are wanted every `interval`.
///
/// Some slack — a tenth, at most 100 ms — because full polls land a few milliseconds early
/// or late: with a 1 s interval and 1 s polls every poll still samples, and a 10 s interval
/// samples on the tenth poll (neither the ninth nor the eleventh). Never below
/// [`MIN_WINDOW`], so the guard's immediate poll never takes a sample.
pub fn window_for(interval: Duration) -> Duration {
    let slack = (interval / 10).min(Duration::from_millis(100));
    interval.saturating_sub(slack).max(MIN_WINDOW)
}

/// The sampling interval to apply now: `interval` once metrics have been computed (or
/// tried), and the shortest window before that, so the DCGM_FI_PROF_* series appear at the
/// first poll after start instead of one whole `--gpm-interval` later.
pub fn interval_now(interval: Duration, computed_once: bool) -> Duration {
    if computed_once {
        interval
    } else {
        Duration::ZERO
    }
}

/// The ring of two GPM samples one GPU keeps: the previous sample stays until the next one
/// is taken, then the metrics are computed over the pair and the older one is dropped (an
/// NVML GPM sample frees its buffer on drop). Times are monotonic offsets.
#[derive(Debug)]
pub struct SampleRing<S> {
    prev: Option<(Duration, S)>,
}

impl<S> Default for SampleRing<S> {
    fn default() -> Self {
        SampleRing { prev: None }
    }
}

impl<S> SampleRing<S> {
    /// Whether a new sample should be taken at `at` when samples are wanted every
    /// `interval`: there is no previous one, the window since it reached
    /// [`window_for`]`(interval)`, or the clock went backwards (start again).
    pub fn due(&self, at: Duration, interval: Duration) -> bool {
        match &self.prev {
            None => true,
            Some((t, _)) => at < *t || at - *t >= window_for(interval),
        }
    }

    /// Offers `new`, taken at `at`. With a previous sample, calls `compute(older, newer,
    /// window)` and returns its result; either way `new` becomes the previous sample.
    pub fn advance<R>(
        &mut self,
        at: Duration,
        new: S,
        compute: impl FnOnce(&S, &S, Duration) -> R,
    ) -> Option<R> {
        let out = match &self.prev {
            Some((t, old)) if at > *t => Some(compute(old, &new, at - *t)),
            _ => None,
        };
        self.prev = Some((at, new));
        out
    }

    /// Whether a previous sample is held.
    pub fn primed(&self) -> bool {
        self.prev.is_some()
    }

    /// Drops the held sample (after a failure that makes it suspect).
    pub fn clear(&mut self) {
        self.prev = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_covers_every_prof_field_once() {
        let mut p = ProfSample::default();
        for (i, m) in PROF_METRICS.iter().enumerate() {
            m.store(&mut p, i as f64 + 1.0);
        }
        let all = [
            p.gr_engine_active,
            p.sm_active,
            p.sm_occupancy,
            p.pipe_tensor_active,
            p.dram_active,
            p.pipe_fp64_active,
            p.pipe_fp32_active,
            p.pipe_fp16_active,
            p.pcie_tx_bytes_per_second,
            p.pcie_rx_bytes_per_second,
        ];
        let mut seen: Vec<f64> = all.iter().map(|v| v.expect("every field set")).collect();
        seen.sort_by(f64::total_cmp);
        assert_eq!(seen, (1..=10).map(f64::from).collect::<Vec<_>>());
        let ids = metric_ids();
        for (i, a) in ids.iter().enumerate() {
            assert!(!ids[i + 1..].contains(a), "{a:?} requested twice");
        }
        assert!(PROF_METRICS
            .iter()
            .all(|m| m.family.starts_with("DCGM_FI_PROF_")));
    }

    #[test]
    fn families_match_the_exporter() {
        // The families metrics.rs renders; each must be fed by exactly one GPM metric.
        let want = [
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            "DCGM_FI_PROF_SM_ACTIVE",
            "DCGM_FI_PROF_SM_OCCUPANCY",
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
            "DCGM_FI_PROF_DRAM_ACTIVE",
            "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
            "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
            "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
            "DCGM_FI_PROF_PCIE_TX_BYTES",
            "DCGM_FI_PROF_PCIE_RX_BYTES",
        ];
        let got: Vec<&str> = PROF_METRICS.iter().map(|m| m.family).collect();
        assert_eq!(got, want);
        assert_eq!(PROF_METRICS[3].id, GpmMetricId::AnyTensorUtil);
        assert_eq!(PROF_METRICS[4].id, GpmMetricId::DramBwUtil);
    }

    #[test]
    fn percentages_become_ratios() {
        let u = GpmUnit::Percent;
        assert_eq!(u.convert(0.0), Some(0.0));
        assert_eq!(u.convert(83.0), Some(0.83));
        assert_eq!(u.convert(100.0), Some(1.0));
        assert_eq!(
            u.convert(100.000_1),
            Some(1.0),
            "rounding overshoot is clamped"
        );
        assert_eq!(u.convert(-1.0), None);
        assert_eq!(u.convert(f64::NAN), None);
        assert_eq!(u.convert(f64::INFINITY), None);
    }

    #[test]
    fn mib_per_second_becomes_bytes_per_second() {
        let u = GpmUnit::MibPerSecond;
        assert_eq!(u.convert(1.0), Some(1_048_576.0));
        assert_eq!(u.convert(0.5), Some(524_288.0));
        assert_eq!(u.convert(0.0), Some(0.0));
        assert_eq!(u.convert(-3.0), None);
        assert_eq!(GpmUnit::MibPerSecond.expected_token(), "MiB");
        assert_eq!(GpmUnit::Percent.expected_token(), "%");
    }

    #[test]
    fn raw_results_fill_what_answered() {
        let raw = [
            Some(83.0),
            Some(76.0),
            None,
            Some(70.0),
            Some(8.0),
            Some(0.0),
            Some(f64::NAN),
            Some(5.0),
            Some(1000.0),
            None,
        ];
        let p = prof_from_raw(&raw).unwrap();
        assert_eq!(p.gr_engine_active, Some(0.83));
        assert_eq!(p.sm_active, Some(0.76));
        assert_eq!(p.sm_occupancy, None, "a failed metric stays absent");
        assert_eq!(p.pipe_tensor_active, Some(0.7));
        assert_eq!(p.dram_active, Some(0.08));
        assert_eq!(
            p.pipe_fp64_active,
            Some(0.0),
            "zero is a value, not absence"
        );
        assert_eq!(p.pipe_fp32_active, None, "NaN is not exported");
        assert_eq!(p.pipe_fp16_active, Some(0.05));
        assert_eq!(p.pcie_tx_bytes_per_second, Some(1000.0 * 1_048_576.0));
        assert_eq!(p.pcie_rx_bytes_per_second, None);
        assert_eq!(prof_from_raw(&[None; 10]), None);
        assert_eq!(prof_from_raw(&[]), None);
    }

    #[test]
    fn ring_computes_over_consecutive_pairs() {
        let mut r: SampleRing<u32> = SampleRing::default();
        let s = Duration::from_secs;
        assert!(r.due(s(0), s(1)));
        assert!(!r.primed());
        assert_eq!(r.advance(s(0), 1, |a, b, w| (*a, *b, w)), None);
        assert!(r.primed());
        assert_eq!(
            r.advance(s(1), 2, |a, b, w| (*a, *b, w)),
            Some((1, 2, s(1)))
        );
        assert_eq!(
            r.advance(s(3), 3, |a, b, w| (*a, *b, w)),
            Some((2, 3, s(2)))
        );
        r.clear();
        assert!(!r.primed());
        assert_eq!(r.advance(s(4), 4, |a, b, w| (*a, *b, w)), None);
        assert_eq!(
            r.advance(s(5), 5, |a, b, w| (*a, *b, w)),
            Some((4, 5, s(1)))
        );
    }

    #[test]
    fn ring_waits_for_a_minimum_window() {
        let mut r: SampleRing<u32> = SampleRing::default();
        let ms = Duration::from_millis;
        r.advance(ms(1000), 1, |_, _, _| ());
        let every_poll = ms(1);
        assert!(!r.due(ms(1000), every_poll));
        assert!(
            !r.due(ms(1050), every_poll),
            "a PollNow 50 ms later takes no sample"
        );
        assert!(r.due(ms(1100), every_poll));
        assert!(
            r.due(ms(900), every_poll),
            "a clock that went backwards starts again"
        );
        // --gpm-interval 1s with 1 s polls that land 50 ms early: every poll still samples.
        assert!(r.due(ms(1950), ms(1000)));
        // --gpm-interval 10s: the polls in between repeat the last figures.
        assert!(!r.due(ms(2000), ms(10_000)));
        assert!(!r.due(ms(9000), ms(10_000)));
        assert!(
            !r.due(ms(10_002), ms(10_000)),
            "the tenth 1 s poll, not the ninth"
        );
        assert!(
            r.due(ms(10_950), ms(10_000)),
            "… landing 50 ms early still samples"
        );
        assert_eq!(window_for(ms(10_000)), ms(9_900));
        assert_eq!(window_for(ms(1_000)), ms(900));
        // Before the first figures, the first poll 100 ms after the priming sample computes.
        assert!(r.due(ms(2000), interval_now(ms(10_000), false)));
        assert!(!r.due(ms(2000), interval_now(ms(10_000), true)));
        assert_eq!(window_for(ms(50)), MIN_WINDOW);
        // A sample offered at the same instant replaces the old one without a window.
        assert_eq!(r.advance(ms(1000), 2, |_, _, _| ()), None);
        assert_eq!(r.advance(ms(2000), 3, |a, b, _| (*a, *b)), Some((2, 3)));
    }

    #[test]
    fn dropping_the_older_sample_happens_on_advance() {
        use std::rc::Rc;
        let a = Rc::new(());
        let b = Rc::new(());
        let mut r = SampleRing::default();
        r.advance(Duration::ZERO, a.clone(), |_, _, _| ());
        assert_eq!(Rc::strong_count(&a), 2);
        r.advance(Duration::from_secs(1), b.clone(), |_, _, _| ());
        assert_eq!(Rc::strong_count(&a), 1, "the older sample is freed");
        assert_eq!(Rc::strong_count(&b), 2, "the newer one is kept");
    }
}
