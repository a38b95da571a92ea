//! [`HumanDuration`]: a duration written the way people write them
//! (`300ms`, `2s`, `1m30s`), parsed and printed by humantime, the one
//! duration parser of the workspace (the plugin's and the load tools' flags
//! use it too).
//!
//! humantime has no dependencies of its own, so the contract stays small.
//! The printed form is humantime's without spaces: a ConfigMap the operator
//! rendered with an earlier release reads the same now, and renders to the
//! same bytes (so its hash, and the pods, do not change on upgrade).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// A duration written the way people write them: `300ms`, `2s`, `1m30s`.
///
/// Serialised back in the same human form, so `/config` and the operator's
/// ConfigMap stay readable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct HumanDuration(pub Duration);

impl HumanDuration {
    pub const fn from_millis(ms: u64) -> Self {
        Self(Duration::from_millis(ms))
    }
    pub const fn from_secs(s: u64) -> Self {
        Self(Duration::from_secs(s))
    }
    pub const fn get(self) -> Duration {
        self.0
    }
}

impl From<Duration> for HumanDuration {
    fn from(d: Duration) -> Self {
        Self(d)
    }
}

impl From<HumanDuration> for Duration {
    fn from(d: HumanDuration) -> Self {
        d.0
    }
}

impl FromStr for HumanDuration {
    type Err = String;

    /// humantime's parser: `1m30s`, `1m 30s`, `1.5s`, `300ms`, a bare `0`.
    /// Every other number needs a unit: `5` could mean seconds or
    /// milliseconds.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let trimmed = s.trim();
        humantime::parse_duration(trimmed).map(Self).map_err(|e| {
            format!("{trimmed:?} is not a duration ({e}); write it like 300ms, 2s or 1m30s")
        })
    }
}

impl fmt::Display for HumanDuration {
    /// The compact form people type into YAML and the operator's CRD
    /// accepts: `1m30s`, `1h5m`, `2days3h`, `0s`: humantime's, without its
    /// spaces.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let spaced = humantime::format_duration(self.0).to_string();
        f.write_str(&spaced.replace(' ', ""))
    }
}

// A bare number is ambiguous (seconds? milliseconds?), so only strings
// are accepted and the error says how to write one.
serde_as_text!(HumanDuration);

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> Duration {
        text.parse::<HumanDuration>()
            .unwrap_or_else(|e| panic!("{text}: {e}"))
            .get()
    }

    #[test]
    fn durations_parse_and_print_in_human_form() {
        let d: HumanDuration = "1m30s".parse().expect("valid");
        assert_eq!(d.get(), Duration::from_secs(90));
        assert_eq!(d.to_string(), "1m30s");
        assert_eq!(
            "300ms".parse::<HumanDuration>().expect("valid").to_string(),
            "300ms"
        );
        assert!("3 parsecs".parse::<HumanDuration>().is_err());
    }

    #[test]
    fn spellings_people_write_are_accepted() {
        assert_eq!(parsed("0"), Duration::ZERO);
        assert_eq!(parsed(" 2s "), Duration::from_secs(2));
        assert_eq!(parsed("1m 30s"), Duration::from_secs(90));
        assert_eq!(parsed("1.5s"), Duration::from_millis(1500));
        assert_eq!(parsed("2 minutes"), Duration::from_secs(120));
        assert_eq!(parsed("1h2m3s4ms"), Duration::new(3723, 4_000_000));
        assert_eq!(parsed("1d"), Duration::from_secs(86_400));
        assert_eq!(parsed("250us"), Duration::from_micros(250));
    }

    #[test]
    fn numbers_without_units_and_junk_are_refused_with_a_hint() {
        for bad in [
            "",
            "5",
            "1.s",
            "s",
            "-1s",
            "1s!",
            "3 parsecs",
            "1.0000000001ns",
        ] {
            let err = bad.parse::<HumanDuration>().expect_err(bad);
            assert!(err.contains("300ms"), "{bad}: {err}");
        }
        assert!("99999999999999999999999y".parse::<HumanDuration>().is_err());
    }

    #[test]
    fn printing_is_compact_and_reads_back() {
        for (d, text) in [
            (Duration::ZERO, "0s"),
            (Duration::from_millis(300), "300ms"),
            (Duration::from_secs(50), "50s"),
            (Duration::from_secs(3_600 + 300), "1h5m"),
            (Duration::from_secs(2 * 86_400 + 3 * 3_600), "2days3h"),
            (Duration::new(1, 500), "1s500ns"),
        ] {
            assert_eq!(HumanDuration(d).to_string(), text);
            assert_eq!(parsed(text), d, "{text}");
        }
    }

    #[test]
    fn prints_the_bytes_earlier_releases_rendered() {
        // Printed by the hand-written formatter of releases before this
        // one: a changed byte here changes every rendered ConfigMap's hash
        // and rolls every injected pod on upgrade.
        for (d, text) in [
            (Duration::new(0, 1), "1ns"),
            (Duration::new(90_061, 1_001_001), "1day1h1m1s1ms1us1ns"),
            (Duration::from_secs(59), "59s"),
            (Duration::from_secs(61), "1m1s"),
            (Duration::from_secs(3_599), "59m59s"),
            (Duration::from_secs(86_399), "23h59m59s"),
            (Duration::from_secs(2_630_016), "1month"),
            (Duration::from_secs(31_557_601), "1year1s"),
            (Duration::from_millis(1_500), "1s500ms"),
            (Duration::from_millis(60_250), "1m250ms"),
        ] {
            assert_eq!(HumanDuration(d).to_string(), text);
            assert_eq!(parsed(text), d, "{text}");
        }
        for (text, d) in [
            ("1 min 30 sec", Duration::from_secs(90)),
            ("2.5h", Duration::from_secs(9_000)),
            ("1w", Duration::from_secs(604_800)),
            ("3days", Duration::from_secs(259_200)),
            ("1M", Duration::from_secs(2_630_016)),
            ("1y", Duration::from_secs(31_557_600)),
            ("0.5ms", Duration::from_micros(500)),
        ] {
            assert_eq!(parsed(text), d, "{text}");
        }
    }
}
