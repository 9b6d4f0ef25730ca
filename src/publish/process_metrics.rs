//! The standard Prometheus process families for the agent itself (`process_cpu_seconds_total`,
//! `process_open_fds`, …), named, typed and described exactly as Prometheus's Go client
//! writes them, so dashboards and alerts written for any exporter work unchanged.
//!
//! Unlike the per-poll families they are read when `/metrics` is scraped: the bytes rendered
//! once per poll are copied and these few lines appended. The reading is behind
//! [`ProcessSource`]; `publish::process_reader` is the shell that reads `/proc/self`,
//! tests inject fixed facts.

use bytes::Bytes;
use std::io::Write;

/// What one read of the agent's own process found. A field the platform does not report
/// is `None` and its family is left out (absent, not zero).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcessFacts {
    /// User plus system CPU time, seconds.
    pub cpu_seconds: f64,
    /// Open file descriptors.
    pub open_fds: Option<u64>,
    /// The soft limit on open file descriptors.
    pub max_fds: Option<u64>,
    /// Resident set size, bytes.
    pub resident_bytes: u64,
    /// When the process started, seconds since the Unix epoch.
    pub start_time_seconds: u64,
    /// Virtual memory size, bytes.
    pub virtual_bytes: u64,
}

/// Reads the agent's process facts at scrape time. `None` when the read fails; the scrape
/// then carries the per-poll families alone, as Go's collector does without `ReportErrors`.
pub trait ProcessSource: Send + Sync {
    /// One fresh read.
    fn read(&self) -> Option<ProcessFacts>;
}

/// The families this module writes, in the order it writes them (Go's registry sorts
/// families by name; so does this list).
pub const FAMILIES: [&str; 6] = [
    "process_cpu_seconds_total",
    "process_max_fds",
    "process_open_fds",
    "process_resident_memory_bytes",
    "process_start_time_seconds",
    "process_virtual_memory_bytes",
];

/// Appends the families of `facts` to `out` in the text exposition format.
pub fn render(facts: &ProcessFacts, out: &mut Vec<u8>) {
    // Writing into a Vec cannot fail.
    let _ = render_into(facts, out);
}

fn render_into(f: &ProcessFacts, out: &mut Vec<u8>) -> std::io::Result<()> {
    family(
        out,
        FAMILIES[0],
        "Total user and system CPU time spent in seconds.",
        "counter",
    )?;
    writeln!(out, "{} {}", FAMILIES[0], f.cpu_seconds)?;
    if let Some(n) = f.max_fds {
        family(
            out,
            FAMILIES[1],
            "Maximum number of open file descriptors.",
            "gauge",
        )?;
        writeln!(out, "{} {n}", FAMILIES[1])?;
    }
    if let Some(n) = f.open_fds {
        family(
            out,
            FAMILIES[2],
            "Number of open file descriptors.",
            "gauge",
        )?;
        writeln!(out, "{} {n}", FAMILIES[2])?;
    }
    family(out, FAMILIES[3], "Resident memory size in bytes.", "gauge")?;
    writeln!(out, "{} {}", FAMILIES[3], f.resident_bytes)?;
    family(
        out,
        FAMILIES[4],
        "Start time of the process since unix epoch in seconds.",
        "gauge",
    )?;
    writeln!(out, "{} {}", FAMILIES[4], f.start_time_seconds)?;
    family(out, FAMILIES[5], "Virtual memory size in bytes.", "gauge")?;
    writeln!(out, "{} {}", FAMILIES[5], f.virtual_bytes)
}

fn family(out: &mut Vec<u8>, name: &str, help: &str, kind: &str) -> std::io::Result<()> {
    writeln!(out, "# HELP {name} {help}")?;
    writeln!(out, "# TYPE {name} {kind}")
}

/// The `/metrics` body: the exposition rendered with the poll, followed by a fresh read of
/// the process families when there is a source and the read succeeds. Without one the
/// poll's bytes are served as they are (no copy).
pub fn metrics_body(rendered: &Bytes, source: Option<&dyn ProcessSource>) -> Bytes {
    let Some(facts) = source.and_then(ProcessSource::read) else {
        return rendered.clone();
    };
    let mut out = Vec::with_capacity(rendered.len() + 1024);
    out.extend_from_slice(rendered);
    render(&facts, &mut out);
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> ProcessFacts {
        ProcessFacts {
            cpu_seconds: 1.25,
            open_fds: Some(17),
            max_fds: Some(1_048_576),
            resident_bytes: 12_345_678,
            start_time_seconds: 1_780_000_000,
            virtual_bytes: 987_654_321,
        }
    }

    struct Fixed(Option<ProcessFacts>);
    impl ProcessSource for Fixed {
        fn read(&self) -> Option<ProcessFacts> {
            self.0
        }
    }

    #[test]
    fn renders_go_client_names_types_and_help() {
        let mut out = Vec::new();
        render(&facts(), &mut out);
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n\
             # TYPE process_cpu_seconds_total counter\n\
             process_cpu_seconds_total 1.25\n\
             # HELP process_max_fds Maximum number of open file descriptors.\n\
             # TYPE process_max_fds gauge\n\
             process_max_fds 1048576\n\
             # HELP process_open_fds Number of open file descriptors.\n\
             # TYPE process_open_fds gauge\n\
             process_open_fds 17\n\
             # HELP process_resident_memory_bytes Resident memory size in bytes.\n\
             # TYPE process_resident_memory_bytes gauge\n\
             process_resident_memory_bytes 12345678\n\
             # HELP process_start_time_seconds Start time of the process since unix epoch in seconds.\n\
             # TYPE process_start_time_seconds gauge\n\
             process_start_time_seconds 1780000000\n\
             # HELP process_virtual_memory_bytes Virtual memory size in bytes.\n\
             # TYPE process_virtual_memory_bytes gauge\n\
             process_virtual_memory_bytes 987654321\n"
        );
    }

    #[test]
    fn an_unreported_fd_count_leaves_its_family_out() {
        let mut out = Vec::new();
        render(
            &ProcessFacts {
                open_fds: None,
                max_fds: None,
                ..facts()
            },
            &mut out,
        );
        let text = String::from_utf8(out).unwrap();
        assert!(!text.contains("process_open_fds"), "{text}");
        assert!(!text.contains("process_max_fds"), "{text}");
        assert!(text.contains("process_resident_memory_bytes 12345678"));
    }

    #[test]
    fn the_body_is_the_poll_bytes_then_the_process_families() {
        let rendered = Bytes::from_static(b"# TYPE a gauge\na 1\n");
        let same = metrics_body(&rendered, None);
        assert_eq!(same.as_ptr(), rendered.as_ptr(), "no source: no copy");
        assert_eq!(metrics_body(&rendered, Some(&Fixed(None))), rendered);
        let body = metrics_body(&rendered, Some(&Fixed(Some(facts()))));
        let text = std::str::from_utf8(&body).unwrap();
        assert!(text.starts_with("# TYPE a gauge\na 1\n# HELP process_cpu_seconds_total"));
        assert!(text.ends_with("process_virtual_memory_bytes 987654321\n"));
    }
}
