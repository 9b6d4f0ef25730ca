//! The Prometheus text format 0.0.4, written straight into a caller's byte buffer: `# HELP` /
//! `# TYPE` headers, samples, label-value escaping and number formatting exactly as the
//! `prometheus` crate's `TextEncoder` writes them (the golden expositions pin the bytes), but
//! with no intermediate family objects, so a poll's exposition costs no allocation once the
//! buffers have grown to size.

use std::io::Write;

/// A family's type, as its `# TYPE` line names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// Appends `v` escaped as the text format wants it: `\` → `\\` and newline → `\n`, and with
/// `quote` (label values) also `"` → `\"`. Everything else, invalid-looking Unicode included,
/// is copied as it is.
pub fn escape_into(out: &mut Vec<u8>, v: &str, quote: bool) {
    let mut rest = v.as_bytes();
    loop {
        let next = rest
            .iter()
            .position(|&b| b == b'\\' || b == b'\n' || (quote && b == b'"'));
        let Some(i) = next else {
            out.extend_from_slice(rest);
            return;
        };
        out.extend_from_slice(&rest[..i]);
        out.extend_from_slice(match rest[i] {
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            _ => b"\\\"",
        });
        rest = &rest[i + 1..];
    }
}

/// Appends `v` as Rust's `Display` writes an `f64` (`1`, `0.5`, `123.456`, `NaN`, `inf`): the
/// encoder's `value.to_string()`, without the string.
pub fn write_f64(out: &mut Vec<u8>, v: f64) {
    // Writing into a Vec cannot fail.
    let _ = write!(out, "{v}");
}

/// Appends the decimal digits of `v`.
pub fn write_u64(out: &mut Vec<u8>, v: u64) {
    let _ = write!(out, "{v}");
}

/// Appends `,name="value"` (or `name="value"` as the first label) with the value escaped.
pub fn label(out: &mut Vec<u8>, first: bool, name: &str, value: &str) {
    if !first {
        out.push(b',');
    }
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"=\"");
    escape_into(out, value, true);
    out.push(b'"');
}

/// As [`label`], for a number.
pub fn label_u64(out: &mut Vec<u8>, first: bool, name: &str, value: u64) {
    if !first {
        out.push(b',');
    }
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"=\"");
    write_u64(out, value);
    out.push(b'"');
}

/// One family being written into `out`. Its header goes out when the family is opened; a
/// family closed without a sample is taken back out again, since the text format (and
/// Prometheus' registry) has no empty families.
pub struct Family<'a> {
    out: &'a mut Vec<u8>,
    name: &'a str,
    start: usize,
    samples: usize,
}

impl<'a> Family<'a> {
    /// Opens family `name` with its help text and type.
    pub fn open(out: &'a mut Vec<u8>, name: &'a str, help: &str, kind: Kind) -> Family<'a> {
        let start = out.len();
        if !help.is_empty() {
            out.extend_from_slice(b"# HELP ");
            out.extend_from_slice(name.as_bytes());
            out.push(b' ');
            escape_into(out, help, false);
            out.push(b'\n');
        }
        out.extend_from_slice(b"# TYPE ");
        out.extend_from_slice(name.as_bytes());
        out.push(b' ');
        out.extend_from_slice(kind.as_str().as_bytes());
        out.push(b'\n');
        Family {
            out,
            name,
            start,
            samples: 0,
        }
    }

    /// A sample whose label pairs are already rendered (`a="x",b="y"`, escaped, no braces;
    /// empty for none).
    pub fn sample(&mut self, labels: &[u8], value: f64) {
        self.sample_with(None, labels, |_| {}, value);
    }

    /// The general sample: the family name plus `suffix` (`_bucket`, `_sum`, `_count`),
    /// the pre-rendered `labels`, then whatever `more` appends as further label pairs (it is
    /// told whether its first pair opens the label set), then the value.
    pub fn sample_with(
        &mut self,
        suffix: Option<&str>,
        labels: &[u8],
        more: impl FnOnce(&mut LabelTail<'_>),
        value: f64,
    ) {
        let out = &mut *self.out;
        out.extend_from_slice(self.name.as_bytes());
        if let Some(s) = suffix {
            out.extend_from_slice(s.as_bytes());
        }
        let open = out.len();
        out.push(b'{');
        out.extend_from_slice(labels);
        let mut tail = LabelTail {
            out,
            first: labels.is_empty(),
        };
        more(&mut tail);
        if tail.first {
            // No label at all: the format writes the bare name.
            out.truncate(open);
        } else {
            out.push(b'}');
        }
        out.push(b' ');
        write_f64(out, value);
        out.push(b'\n');
        self.samples += 1;
    }

    /// Finishes the family: takes the header back out if no sample was written. Returns
    /// whether the family stays.
    pub fn close(self) -> bool {
        if self.samples == 0 {
            self.out.truncate(self.start);
        }
        self.samples > 0
    }
}

/// Label pairs appended after a sample's pre-rendered ones.
pub struct LabelTail<'a> {
    out: &'a mut Vec<u8>,
    first: bool,
}

impl LabelTail<'_> {
    /// Appends `name="value"`, escaped.
    pub fn label(&mut self, name: &str, value: &str) {
        label(self.out, self.first, name, value);
        self.first = false;
    }

    /// Appends `name="value"` for a number.
    pub fn label_u64(&mut self, name: &str, value: u64) {
        label_u64(self.out, self.first, name, value);
        self.first = false;
    }

    /// Appends `name="value"` with the value written as an `f64` (histogram bounds).
    pub fn label_f64(&mut self, name: &str, value: f64) {
        if !self.first {
            self.out.push(b',');
        }
        self.out.extend_from_slice(name.as_bytes());
        self.out.extend_from_slice(b"=\"");
        write_f64(self.out, value);
        self.out.push(b'"');
        self.first = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn esc(v: &str, quote: bool) -> String {
        let mut out = Vec::new();
        escape_into(&mut out, v, quote);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn escapes_like_the_text_format() {
        assert_eq!(esc("plain", true), "plain");
        assert_eq!(esc("a\\b", true), "a\\\\b");
        assert_eq!(esc("a\nb", true), "a\\nb");
        assert_eq!(esc("a\"b", true), "a\\\"b");
        assert_eq!(esc("a\"b", false), "a\"b");
        assert_eq!(esc("\\\n\"", true), "\\\\\\n\\\"");
        assert_eq!(esc("ü\u{0}\t", true), "ü\u{0}\t");
    }

    #[test]
    fn empty_families_leave_nothing_and_bare_samples_have_no_braces() {
        let mut out = b"keep\n".to_vec();
        assert!(!Family::open(&mut out, "x", "help", Kind::Gauge).close());
        assert_eq!(out, b"keep\n");
        let mut f = Family::open(&mut out, "x", "a\\b\nc \"q\"", Kind::Counter);
        f.sample(b"", 1.0);
        f.sample(b"a=\"1\"", 0.5);
        f.sample_with(Some("_sum"), b"", |t| t.label_f64("le", 2.5), 3.0);
        assert!(f.close());
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "keep\n# HELP x a\\\\b\\nc \"q\"\n# TYPE x counter\nx 1\nx{a=\"1\"} 0.5\nx_sum{le=\"2.5\"} 3\n"
        );
    }
}
