//! The Prometheus text exposition format (0.0.4): the one writer of
//! metric families and the one label-value escaper that the sidecar's and
//! the operator's `/metrics` both use.
//!
//! Hand-written rather than the `prometheus-client` crate: the sidecar
//! records a request with a few relaxed atomic adds and no label lookup
//! (sidecar/src/metrics.rs), and reads most numbers from state it keeps
//! anyway at scrape time; a registry of metric objects would sit on the
//! request path or hold every number twice. What such a crate would add
//! is the format, which is the few lines here.

use std::fmt::{self, Write as _};

/// The `Content-Type` of a text exposition, as Prometheus 3 requires it.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A label value written escaped (backslash, double quote and newline, as
/// the format says) without allocating: `format_args!("route=\"{}\"",
/// Escaped(name))`.
#[derive(Debug, Clone, Copy)]
pub struct Escaped<T>(pub T);

impl<T: fmt::Display> fmt::Display for Escaped<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        /// Passes text through, escaping as it goes.
        struct Escaper<'a, 'b>(&'a mut fmt::Formatter<'b>);
        impl fmt::Write for Escaper<'_, '_> {
            fn write_str(&mut self, s: &str) -> fmt::Result {
                let mut rest = s;
                while let Some(at) = rest.find(['\\', '"', '\n']) {
                    self.0.write_str(&rest[..at])?;
                    self.0.write_str(match rest.as_bytes()[at] {
                        b'\\' => "\\\\",
                        b'"' => "\\\"",
                        _ => "\\n",
                    })?;
                    rest = &rest[at + 1..];
                }
                self.0.write_str(rest)
            }
        }
        write!(Escaper(f), "{}", self.0)
    }
}

/// One metric family: its HELP and TYPE lines once, then its series.
pub struct Family<'a> {
    out: &'a mut String,
    name: &'a str,
}

impl<'a> Family<'a> {
    /// Writes the HELP and TYPE lines; `kind` is `counter`, `gauge` or
    /// `histogram`.
    pub fn new(out: &'a mut String, name: &'a str, kind: &str, help: &str) -> Self {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        Family { out, name }
    }

    /// The family's one series, without labels.
    pub fn value(self, value: impl fmt::Display) {
        let _ = writeln!(self.out, "{} {value}", self.name);
    }

    /// One series; `labels` as they go between the braces (`a="x",b="y"`),
    /// each value written through [`Escaped`] (or a fixed word).
    pub fn series(&mut self, labels: fmt::Arguments<'_>, value: impl fmt::Display) {
        let _ = writeln!(self.out, "{}{{{labels}}} {value}", self.name);
    }

    /// One series per (label value, value) under the one label `label`;
    /// the label values are escaped here.
    pub fn by<L: fmt::Display, V: fmt::Display>(
        mut self,
        label: &str,
        series: impl IntoIterator<Item = (L, V)>,
    ) {
        for (label_value, value) in series {
            self.series(format_args!("{label}=\"{}\"", Escaped(label_value)), value);
        }
    }

    /// A series of a histogram's parts: `{name}{suffix}` (`_bucket`, `_sum`,
    /// `_count`), with `labels` between braces when there are any.
    pub fn part(
        &mut self,
        suffix: &str,
        labels: Option<fmt::Arguments<'_>>,
        value: impl fmt::Display,
    ) {
        let _ = match labels {
            Some(labels) => writeln!(self.out, "{}{suffix}{{{labels}}} {value}", self.name),
            None => writeln!(self.out, "{}{suffix} {value}", self.name),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_escape_backslash_quote_and_newline_only() {
        assert_eq!(Escaped("plain").to_string(), "plain");
        assert_eq!(
            Escaped("a\\b\"c\nd").to_string(),
            "a\\\\b\\\"c\\nd",
            "each of the three, once"
        );
        assert_eq!(Escaped("\\\\").to_string(), "\\\\\\\\");
        assert_eq!(Escaped("é\t{}=,").to_string(), "é\t{}=,");
        assert_eq!(Escaped(42).to_string(), "42");
    }

    #[test]
    fn a_family_writes_help_and_type_once_then_its_series() {
        let mut out = String::new();
        Family::new(&mut out, "x_total", "counter", "Things.").by("kind", [("a\"b", 1), ("c", 2)]);
        Family::new(&mut out, "y", "gauge", "One.").value(7);
        let mut h = Family::new(&mut out, "z_seconds", "histogram", "Time.");
        h.part("_bucket", Some(format_args!("le=\"+Inf\"")), 3);
        h.part("_sum", None, 0.5);
        assert_eq!(
            out,
            "# HELP x_total Things.\n# TYPE x_total counter\n\
             x_total{kind=\"a\\\"b\"} 1\nx_total{kind=\"c\"} 2\n\
             # HELP y One.\n# TYPE y gauge\ny 7\n\
             # HELP z_seconds Time.\n# TYPE z_seconds histogram\n\
             z_seconds_bucket{le=\"+Inf\"} 3\nz_seconds_sum 0.5\n"
        );
    }
}
