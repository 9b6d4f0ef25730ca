//! The standard Prometheus process families for the agent itself (`process_cpu_seconds_total`,
//! `process_open_fds`, …), named, typed and described exactly as Prometheus's Go client
//! writes them, so dashboards and alerts written for any exporter work unchanged.
//!
//! They are read when `/metrics` is scraped, at most once per poll: the first scrape of a
//! publication reads the process, appends these few lines to the bytes rendered with the
//! poll and keeps the result ([`ScrapeBodies`]); later scrapes of the same publication share
//! it. The reading is behind [`ProcessSource`]; `publish::process_reader` is the shell that
//! reads `/proc/self`, tests inject fixed facts.

use bytes::Bytes;
use std::io::Write;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

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

/// Reads the agent's process facts when a poll is first scraped. `None` when the read fails;
/// the scrape then carries the per-poll families alone, as Go's collector does without
/// `ReportErrors`.
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

/// The `/metrics` bodies served: the latest publication's bytes with the process families
/// appended, built by the first scrape of each publication and shared by the scrapes after it.
///
/// Why not a read per scrape: one read of `/proc/self` is several files and a directory
/// listing, which made a scrape several times dearer than the copy it serves, and under 64
/// concurrent scrapers it took `/metrics` p99 on the H200 to 5 ms (docs/performance.md).
/// Prometheus scrapes every 15–60 s, far slower than the poll, so it always sees a read of
/// its own; the figures are at most one poll interval (`max_age`) old.
pub struct ScrapeBodies {
    source: Option<Arc<dyn ProcessSource>>,
    max_age: Duration,
    last: Mutex<Option<Kept>>,
}

/// The body built for one publication.
struct Kept {
    /// The publication: its poll sequence number and when it was published.
    poll: (u64, Duration),
    /// When the process was read (monotonic).
    read_at: Duration,
    body: Bytes,
}

impl ScrapeBodies {
    /// Bodies with the families of `source` (none: the poll's bytes are served as they are),
    /// each read at most `max_age` before it is served.
    pub fn new(source: Option<Arc<dyn ProcessSource>>, max_age: Duration) -> ScrapeBodies {
        ScrapeBodies {
            source,
            max_age,
            last: Mutex::new(None),
        }
    }

    /// The body for the publication `poll` (sequence number, publication time) whose
    /// exposition is `rendered`, scraped at monotonic time `now`.
    pub fn body(&self, rendered: &Bytes, poll: (u64, Duration), now: Duration) -> Bytes {
        let Some(source) = self.source.as_deref() else {
            return rendered.clone();
        };
        // Held across the read on purpose: concurrent scrapes of a new publication wait for
        // the one read instead of each making their own.
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(kept) = last.as_ref() {
            if kept.poll == poll && now.saturating_sub(kept.read_at) < self.max_age {
                return kept.body.clone();
            }
        }
        let body = metrics_body(rendered, Some(source));
        *last = Some(Kept {
            poll,
            read_at: now,
            body: body.clone(),
        });
        body
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

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

    /// Counts its reads; each read reports one more CPU second.
    struct Counting(AtomicU32);
    impl ProcessSource for Counting {
        fn read(&self) -> Option<ProcessFacts> {
            let n = self.0.fetch_add(1, Ordering::SeqCst) + 1;
            Some(ProcessFacts {
                cpu_seconds: f64::from(n),
                ..facts()
            })
        }
    }

    #[test]
    fn one_read_per_publication_shared_by_its_scrapes() {
        let source = Arc::new(Counting(AtomicU32::new(0)));
        let bodies = ScrapeBodies::new(Some(source.clone()), Duration::from_secs(1));
        let poll1 = Bytes::from_static(b"a 1\n");
        let at = Duration::from_secs(10);
        let first = bodies.body(&poll1, (1, at), at);
        let again = bodies.body(&poll1, (1, at), at + Duration::from_millis(900));
        assert_eq!(
            source.0.load(Ordering::SeqCst),
            1,
            "the second scrape reads nothing"
        );
        assert_eq!(first.as_ptr(), again.as_ptr(), "and copies nothing");
        assert!(std::str::from_utf8(&first)
            .unwrap()
            .contains("process_cpu_seconds_total 1\n"));

        // A new publication is read afresh and carries its own bytes.
        let poll2 = Bytes::from_static(b"a 2\n");
        let later = at + Duration::from_secs(1);
        let next = bodies.body(&poll2, (2, later), later);
        assert_eq!(source.0.load(Ordering::SeqCst), 2);
        let text = std::str::from_utf8(&next).unwrap();
        assert!(text.starts_with("a 2\n"), "{text}");
        assert!(text.contains("process_cpu_seconds_total 2\n"), "{text}");
    }

    #[test]
    fn a_publication_older_than_max_age_is_read_again() {
        // The sampler is stuck: the publication does not change, the process figures do.
        let source = Arc::new(Counting(AtomicU32::new(0)));
        let bodies = ScrapeBodies::new(Some(source.clone()), Duration::from_secs(1));
        let poll = Bytes::from_static(b"a 1\n");
        let at = Duration::from_secs(10);
        bodies.body(&poll, (1, at), at);
        let body = bodies.body(&poll, (1, at), at + Duration::from_secs(1));
        assert_eq!(source.0.load(Ordering::SeqCst), 2);
        assert!(std::str::from_utf8(&body)
            .unwrap()
            .contains("process_cpu_seconds_total 2\n"));
    }

    #[test]
    fn without_a_source_the_poll_bytes_are_served_uncopied() {
        let bodies = ScrapeBodies::new(None, Duration::from_secs(1));
        let poll = Bytes::from_static(b"a 1\n");
        let body = bodies.body(&poll, (1, Duration::ZERO), Duration::ZERO);
        assert_eq!(body.as_ptr(), poll.as_ptr());
    }
}
