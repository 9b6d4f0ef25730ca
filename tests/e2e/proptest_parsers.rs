//! Property tests of the scenario parser: `Scenario::parse` never panics —
//! on arbitrary text, on valid scenarios mutated at random, nor on generated scenarios with
//! out-of-range values — and every error it returns points somewhere: a field path
//! (`processes[0].gpu`), a key, or a line and column. A scenario it accepts plays in the
//! simulator without a panic and with consistent memory figures.
//!
//! `PROPTEST_CASES=N` changes the case count (default 1024 per property).

use gpu_warden::sample::scenario::{FaultSpec, Scenario, ScenarioError};
use gpu_warden::sample::sim::SimSource;
use gpu_warden::sample::{GpuSource, PollRequest};
use proptest::prelude::*;
use proptest::sample::Index;
use std::path::Path;
use std::time::{Duration, Instant};

/// A scenario using every section and every fault kind.
const FULL: &str = r#"
driver_version: "580.95.05"
repeat_every: 5m
gpus:
  - model: NVIDIA A10G
    uuid: GPU-3f5e2a8b-1c4d-4e6f-9a0b-7c8d9e0f1a2b
    pci_bus_id: "00000000:00:1E.0"
    memory_mib: 23028
    reserved_mib: 434
    base_used_mib: 10
    sm_clock_mhz: 1710
    mem_clock_mhz: 6251
    gpu_temp_c: 52
    power_w: 148.5
    energy_start_mj: 1000
    mem_copy_util_pct: 38
    enc_util_pct: 0
    dec_util_pct: 0
    pcie_replays: 0
    remapped_rows: {correctable: 1, uncorrectable: 0, pending: false, failure: false}
  - {model: NVIDIA H100, count: 2, memory_mib: 81559}
processes:
  - pid: 41021
    gpu: 0
    name: "py\"thon"
    memory: {constant: 4096}
    sm_util: 0.32
    start: 0s
    stop: 120s
    pod:
      namespace: ci
      name: runner-abc123-project-42-concurrent-0
      container: build
      priority: 0
      priority_class: ci-low
      labels: {workload-type: gpu-ci}
      annotations: {job.runner.gitlab.com/id: "123", gpu-warden.io/vram-request-mib: "4096"}
      owner_kind: Job
      created_at: "2026-11-30T10:00:00Z"
  - {pid: 7, gpu: 1, memory: {linear: {from: 512, per_second: 96, max: 20000}}}
  - {pid: 8, gpu: 2, memory: {steps: [{at: 0s, mib: 2048}, {at: 20s, mib: 5120}]}}
faults:
  - {kind: unsupported, gpu: 0, field: memory_temp}
  - {kind: error, gpu: 0, field: power, from: 10s, until: 20s}
  - {kind: lost, gpu: 1, at: 30s}
  - {kind: xid, gpu: 0, at: 15s, value: 79}
  - {kind: hang, gpu: 2, field: power, at: 40s, for: 5s}
"#;

/// The scenarios mutations start from: `FULL`, the shipped examples and the Prometheus one.
fn bases() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = vec![FULL.to_string()];
    for dir in ["examples", "tests/prometheus"] {
        let mut files: Vec<_> = std::fs::read_dir(root.join(dir))
            .unwrap()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
            .collect();
        files.sort();
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            if Scenario::parse(&text, "base").is_ok() {
                out.push(text);
            }
        }
    }
    assert!(out.len() >= 3, "expected the shipped scenarios");
    out
}

/// Pieces of YAML and values that break things: structure characters, anchors and tags,
/// numbers past every integer width, NaN and infinities, bad durations, control characters
/// and bidirectional overrides, and keys that are almost right.
const TOKENS: &[&str] = &[
    "",
    "-",
    ":",
    ": ",
    "{",
    "}",
    "[",
    "]",
    ",",
    "\"",
    "'",
    "\n",
    "  ",
    "\t",
    "#",
    "&a ",
    "*a",
    "!!binary ",
    "!!str ",
    "? ",
    "|",
    ">",
    "~",
    "null",
    "-1",
    "0",
    "1e309",
    "-0.0",
    ".nan",
    ".inf",
    "-.inf",
    "18446744073709551616",
    "4294967296",
    "9223372036854775808",
    "99999999999999999999999s",
    "-5s",
    "10s",
    "0s",
    "1ns",
    "soon",
    "\u{202e}",
    "é",
    "\u{0}",
    "\u{7f}",
    "\r",
    "kind: hang",
    "kind: lost",
    "gpu: 99",
    "gpu: 4294967295",
    "field: power",
    "field: warp_drive",
    "memory: {constant: 1}",
    "count: 4000000000",
    "memory_mib: 18446744073709551615",
    "reserved_mib: 18446744073709551615",
    "until: 0s",
    "for: 0s",
    "steps: []",
    "<<: *a",
];

#[derive(Debug, Clone)]
enum Mutation {
    Delete(Index, usize),
    Insert(Index, String),
    ReplaceLine(Index, String),
    DuplicateLine(Index),
    SwapLines(Index, Index),
    Truncate(Index),
    Indent(Index, i8),
    /// Replace the value after the n-th `: ` with a token.
    ReplaceValue(Index, String),
}

fn token() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(TOKENS).prop_map(str::to_string),
        1 => "\\PC{0,12}",
        1 => any::<u64>().prop_map(|n| n.to_string()),
        1 => any::<f64>().prop_map(|f| f.to_string()),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<Index>(), 1usize..40).prop_map(|(i, n)| Mutation::Delete(i, n)),
        (any::<Index>(), token()).prop_map(|(i, t)| Mutation::Insert(i, t)),
        (any::<Index>(), token()).prop_map(|(i, t)| Mutation::ReplaceLine(i, t)),
        any::<Index>().prop_map(Mutation::DuplicateLine),
        (any::<Index>(), any::<Index>()).prop_map(|(a, b)| Mutation::SwapLines(a, b)),
        any::<Index>().prop_map(Mutation::Truncate),
        (any::<Index>(), -4i8..5).prop_map(|(i, d)| Mutation::Indent(i, d)),
        (any::<Index>(), token()).prop_map(|(i, t)| Mutation::ReplaceValue(i, t)),
    ]
}

/// The nearest char boundary at or below `i`.
fn floor(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn apply(text: &str, m: &Mutation) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let n = lines.len().max(1);
    match m {
        Mutation::Delete(i, len) => {
            let a = floor(text, i.index(text.len() + 1));
            let b = floor(text, a + len);
            format!("{}{}", &text[..a], &text[b..])
        }
        Mutation::Insert(i, t) => {
            let a = floor(text, i.index(text.len() + 1));
            format!("{}{t}{}", &text[..a], &text[a..])
        }
        Mutation::ReplaceLine(i, t) => {
            if !lines.is_empty() {
                lines[i.index(n)] = t.clone();
            }
            lines.join("\n")
        }
        Mutation::DuplicateLine(i) => {
            if !lines.is_empty() {
                let l = lines[i.index(n)].clone();
                lines.insert(i.index(n), l);
            }
            lines.join("\n")
        }
        Mutation::SwapLines(a, b) => {
            if !lines.is_empty() {
                lines.swap(a.index(n), b.index(n));
            }
            lines.join("\n")
        }
        Mutation::Truncate(i) => text[..floor(text, i.index(text.len() + 1))].to_string(),
        Mutation::Indent(i, d) => {
            if !lines.is_empty() {
                let l = &mut lines[i.index(n)];
                if *d >= 0 {
                    l.insert_str(0, &" ".repeat(*d as usize));
                } else {
                    let strip = l.len() - l.trim_start_matches(' ').len();
                    l.drain(..strip.min(d.unsigned_abs() as usize));
                }
            }
            lines.join("\n")
        }
        Mutation::ReplaceValue(i, t) => {
            let spots: Vec<usize> = text.match_indices(": ").map(|(p, _)| p + 2).collect();
            if spots.is_empty() {
                return text.to_string();
            }
            let at = spots[i.index(spots.len())];
            let end = text[at..]
                .find([',', '}', '\n'])
                .map_or(text.len(), |e| at + e);
            format!("{}{t}{}", &text[..at], &text[end..])
        }
    }
}

/// Every error must say where: a field path or key, or a line and column.
fn assert_error_points_somewhere(text: &str, e: &ScenarioError) {
    let shown = e.to_string();
    assert!(
        shown.starts_with("t.yaml: "),
        "error names the file: {shown}"
    );
    match e {
        ScenarioError::Invalid { field, message, .. } => {
            let root = field.split(['[', '.']).next().unwrap_or("");
            assert!(
                ["gpus", "processes", "faults"].contains(&root),
                "field path {field:?} ({message}) for:\n{text}"
            );
            assert!(!message.is_empty());
        }
        ScenarioError::Parse { message, .. } => {
            let has_position = message.contains("line ") && message.contains("column ");
            let names_key = message.contains('`') || message.contains("key \"");
            assert!(
                has_position || names_key,
                "no position nor key in {message:?} for:\n{text:?}"
            );
        }
        ScenarioError::Read { .. } => panic!("parse never reads"),
    }
}

const ALL: PollRequest = PollRequest {
    process_utilization: true,
    slow_counters: true,
};

/// Plays an accepted scenario a little: no panic, consistent memory. Hang faults are
/// dropped first (they block for real time by design).
fn play(mut sc: Scenario) {
    sc.faults.retain(|f| !matches!(f, FaultSpec::Hang { .. }));
    let gpus = sc.gpu_count() as usize;
    let mut src = SimSource::new(sc);
    for t in [0u64, 1, 17, 3600, 86_400 * 365] {
        let now = Duration::from_secs(t);
        let p = src.poll(now, ALL);
        assert_eq!(p.gpus.len(), gpus);
        for g in &p.gpus {
            if let Some(m) = g.memory {
                assert_eq!(m.total, m.used + m.free + m.reserved, "{m:?}");
            }
        }
        assert_eq!(src.memory(now).len(), gpus);
    }
}

fn check(text: &str) {
    match Scenario::parse(text, "t.yaml") {
        Ok(sc) => play(sc),
        Err(e) => assert_error_points_somewhere(text, &e),
    }
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1024),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    /// Any printable text, YAML-looking or not.
    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,300}") {
        check(&text);
    }

    /// Any bytes, as the lossy UTF-8 a file read would fail on or produce.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        check(&String::from_utf8_lossy(&bytes));
    }

    /// Valid scenarios with one to four random mutations.
    #[test]
    fn mutated_scenarios_never_panic_and_errors_point_somewhere(
        base in any::<Index>(),
        muts in prop::collection::vec(mutation(), 1..5),
    ) {
        let bases = bases();
        let mut text = bases[base.index(bases.len())].clone();
        for m in &muts {
            text = apply(&text, m);
        }
        check(&text);
    }

    /// Structurally right scenarios with values from the edges of every type's range: each
    /// is accepted and plays, or is refused with the field named.
    #[test]
    fn generated_scenarios_validate_or_name_the_field(
        count in prop_oneof![Just(0u64), 1u64..4, Just(65), Just(4_294_967_295), Just(4_294_967_296)],
        memory_mib in prop_oneof![Just(0u64), 1u64..100_000, Just(1u64 << 24), Just((1u64 << 24) + 1), Just(u64::MAX)],
        reserved_mib in prop_oneof![Just(0u64), 0u64..1000, Just(u64::MAX)],
        base_used_mib in prop_oneof![Just(0u64), 0u64..1000, Just(u64::MAX)],
        power_w in prop_oneof![Just(None), (-1.0f64..20_000.0).prop_map(Some), Just(Some(f64::NAN))],
        energy_start_mj in prop_oneof![Just(0u64), Just(u64::MAX)],
        util in prop_oneof![Just(None), (0u32..200).prop_map(Some)],
        procs in prop::collection::vec(
            (
                prop_oneof![Just(0u32), 1u32..50, Just(u32::MAX)],
                0u32..5,
                prop_oneof![
                    any::<u64>().prop_map(|c| format!("{{constant: {c}}}")),
                    (any::<u64>(), prop_oneof![Just(f64::NAN), Just(f64::INFINITY), -1e12f64..1e12], prop::option::of(any::<u64>()))
                        .prop_map(|(f, p, m)| match m {
                            Some(m) => format!("{{linear: {{from: {f}, per_second: {p:?}, max: {m}}}}}"),
                            None => format!("{{linear: {{from: {f}, per_second: {p:?}}}}}"),
                        }),
                    prop::collection::vec((0u64..100, any::<u64>()), 0..3).prop_map(|s| format!(
                        "{{steps: [{}]}}",
                        s.iter().map(|(at, mib)| format!("{{at: {at}s, mib: {mib}}}")).collect::<Vec<_>>().join(", ")
                    )),
                ],
                prop_oneof![Just(None), (-1.0f64..2.0).prop_map(Some)],
                prop_oneof![Just("0s"), Just("5s"), Just("18446744073709551615s")],
                prop::option::of(prop_oneof![Just("1s"), Just("10s"), Just("5s")]),
            ),
            0..4,
        ),
        faults in prop::collection::vec(
            (
                0u32..5,
                prop::sample::select(vec!["power", "memory", "processes", "gpu_temp", "warp_drive"]),
                prop::sample::select(vec!["unsupported", "error", "lost", "xid", "hang"]),
                prop_oneof![Just("0s"), Just("1s"), Just("18446744073709551615s")],
                prop::option::of(prop_oneof![Just("0s"), Just("2s"), Just("18446744073709551615s")]),
                any::<bool>(),
            ),
            0..4,
        ),
    ) {
        let mut y = format!(
            "gpus:\n  - {{model: X, count: {count}, memory_mib: {memory_mib}, reserved_mib: {reserved_mib}, base_used_mib: {base_used_mib}, energy_start_mj: {energy_start_mj}"
        );
        if let Some(p) = power_w {
            y.push_str(&format!(", power_w: {p:?}"));
        }
        if let Some(u) = util {
            y.push_str(&format!(", gpu_util_pct: {u}"));
        }
        y.push_str("}\nprocesses:\n");
        for (pid, gpu, memory, sm, start, stop) in &procs {
            y.push_str(&format!("  - {{pid: {pid}, gpu: {gpu}, memory: {memory}, start: {start}"));
            if let Some(s) = sm {
                y.push_str(&format!(", sm_util: {s:?}"));
            }
            if let Some(s) = stop {
                y.push_str(&format!(", stop: {s}"));
            }
            y.push_str("}\n");
        }
        y.push_str("faults:\n");
        for (gpu, field, kind, at, end, use_until) in &faults {
            let f = match *kind {
                "unsupported" => format!("{{kind: unsupported, gpu: {gpu}, field: {field}}}"),
                "error" => match end {
                    Some(e) => format!("{{kind: error, gpu: {gpu}, field: {field}, from: {at}, until: {e}}}"),
                    None => format!("{{kind: error, gpu: {gpu}, field: {field}, from: {at}}}"),
                },
                "lost" => format!("{{kind: lost, gpu: {gpu}, at: {at}}}"),
                "xid" => format!("{{kind: xid, gpu: {gpu}, at: {at}, value: 79}}"),
                _ => match end {
                    Some(e) if *use_until => format!("{{kind: hang, gpu: {gpu}, field: {field}, at: {at}, until: {e}}}"),
                    Some(e) => format!("{{kind: hang, gpu: {gpu}, field: {field}, at: {at}, for: {e}}}"),
                    None => format!("{{kind: hang, gpu: {gpu}, field: {field}, at: {at}}}"),
                },
            };
            y.push_str(&format!("  - {f}\n"));
        }
        check(&y);
    }
}

/// Nesting far beyond any scenario: refused by the YAML parser's recursion limit (128), not
/// a stack overflow. (The scanner is quadratic in flow nesting before the limit applies:
/// measured in a debug build, 10 000 `[` take 0.4 s and 100 000 take 33 s — a scenario file
/// is the operator's own input, so this is noted in docs/reliability.md, not guarded.)
#[test]
fn deep_nesting_is_refused_without_overflowing_the_stack() {
    for open in ["[", "{a: ", "- "] {
        let text = format!("gpus: {}", open.repeat(3_000));
        let e = Scenario::parse(&text, "t.yaml").unwrap_err();
        assert_error_points_somewhere(&text, &e);
    }
}

/// Alias expansion ("billion laughs") is bounded: refused quickly, memory untouched.
#[test]
fn alias_bombs_are_refused_quickly() {
    let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..12 {
        let p = i - 1;
        text.push_str(&format!(
            "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
        ));
    }
    text.push_str("gpus: *a11\n");
    let t0 = Instant::now();
    let r = Scenario::parse(&text, "t.yaml");
    assert!(r.is_err());
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t0.elapsed()
    );
}

/// Scanner errors that serde_yaml_ng reports without a line get one.
#[test]
fn scanner_errors_get_a_line_and_column() {
    for (text, want) in [
        ("\tgpus: []\n", "line 1 column 1"),
        ("gpus:\n  - model: a\u{5}b\n", "line 2 column 13"),
        ("gpus:\n  - model: éé\u{5}\n", "line 2 column 14"),
    ] {
        let e = Scenario::parse(text, "t.yaml").unwrap_err().to_string();
        assert!(e.contains(want), "{want} not in {e}");
    }
}

/// Each of the mutation families, once, so a regression in one shows by name.
#[test]
fn known_bad_inputs_name_the_field() {
    let cases = [
        (
            "gpus:\n  - {model: X, count: 4294967295, memory_mib: 1}\n  - {model: X, count: 4294967295, memory_mib: 1}\n",
            "gpus",
        ),
        (
            "gpus:\n  - {model: X, memory_mib: 18446744073709551615}\n",
            "gpus[0].memory_mib",
        ),
        (
            "gpus:\n  - {model: X, memory_mib: 10, reserved_mib: 18446744073709551615, base_used_mib: 1}\n",
            "gpus[0].reserved_mib",
        ),
        (
            "gpus:\n  - {model: X, memory_mib: 10}\nfaults:\n  - {kind: hang, gpu: 0, field: power, at: 5s, until: 1s}\n",
            "faults[0].until",
        ),
        (
            "gpus:\n  - {model: X, memory_mib: 10}\nfaults:\n  - {kind: meltdown, gpu: 0}\n",
            "meltdown",
        ),
        ("gpus:\n  - {model: X, memory_mib: -1}\n", "memory_mib"),
        ("gpus:\n  - {model: X, memory_mib: 1e309}\n", "memory_mib"),
    ];
    for (text, needle) in cases {
        let e = Scenario::parse(text, "t.yaml").unwrap_err();
        assert_error_points_somewhere(text, &e);
        assert!(e.to_string().contains(needle), "{needle} not in {e}");
    }
    // Accepted at the edge, and plays.
    let sc = Scenario::parse(
        "gpus:\n  - {model: X, memory_mib: 16777216, power_w: 10000, energy_start_mj: 18446744073709551615}\nfaults:\n  - {kind: hang, gpu: 0, field: power, at: 18446744073709551615s, for: 18446744073709551615s}\n",
        "t.yaml",
    )
    .unwrap();
    play(sc);
}
