//! [`HumanDuration`]: a duration written the way people write them
//! (`300ms`, `2s`, `1m30s`), parsed and printed here so the contract needs
//! no parsing library.
//!
//! The accepted spellings and the printed form are humantime 2's, which the
//! sidecar used before this crate existed: a ConfigMap the operator rendered
//! then reads the same now, and renders to the same bytes (so its hash, and
//! the pods, do not change on upgrade).

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

const NANOS_PER_SEC: u128 = 1_000_000_000;
/// humantime's calendar: a month is 30.44 days, a year 365.25 days.
const MONTH_SECS: u64 = 2_630_016;
const YEAR_SECS: u64 = 31_557_600;

/// Nanoseconds in one of `unit`, or `None` for a unit nobody spells so.
fn unit_nanos(unit: &str) -> Option<u128> {
    let secs: u64 = match unit {
        "nanos" | "nsec" | "ns" => return Some(1),
        "usec" | "us" | "µs" => return Some(1_000),
        "millis" | "msec" | "ms" => return Some(1_000_000),
        "seconds" | "second" | "secs" | "sec" | "s" => 1,
        "minutes" | "minute" | "min" | "mins" | "m" => 60,
        "hours" | "hour" | "hr" | "hrs" | "h" => 3_600,
        "days" | "day" | "d" => 86_400,
        "weeks" | "week" | "wk" | "wks" | "w" => 7 * 86_400,
        "months" | "month" | "M" => MONTH_SECS,
        "years" | "year" | "yr" | "yrs" | "y" => YEAR_SECS,
        _ => return None,
    };
    Some(u128::from(secs) * NANOS_PER_SEC)
}

/// Parses `1m30s`, `1m 30s`, `1.5s`, `300ms`; a bare `0` is zero. Every
/// other number needs a unit: `5` could mean seconds or milliseconds.
fn parse(text: &str) -> Result<Duration, String> {
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let mut rest = text.trim_start();
    if rest.is_empty() {
        return Err("it is empty".into());
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(format!("expected a number at {:?}", rest));
        }
        let (whole, after) = rest.split_at(digits);
        let (fraction, after) = match after.strip_prefix('.') {
            Some(after) => {
                let n = after.bytes().take_while(u8::is_ascii_digit).count();
                if n == 0 {
                    return Err(format!("{whole}. needs digits after the point"));
                }
                after.split_at(n)
            }
            None => ("", after),
        };
        let after = after.trim_start();
        let unit_len: usize = after
            .chars()
            .take_while(|c| c.is_ascii_alphabetic() || *c == 'µ')
            .map(char::len_utf8)
            .sum();
        let (unit, after) = after.split_at(unit_len);
        if unit.is_empty() {
            return Err(format!(
                "{whole}{fraction} needs a unit, like {whole}s or {whole}ms"
            ));
        }
        let per_unit = unit_nanos(unit).ok_or_else(|| {
            format!("unknown unit {unit:?}; use ns, us, ms, s, m, h, d, w, M or y")
        })?;
        let overflow = || "it is too long".to_string();
        let whole: u128 = whole.parse().map_err(|_| overflow())?;
        let mut nanos = whole.checked_mul(per_unit).ok_or_else(overflow)?;
        if !fraction.is_empty() {
            let scale = 10u128
                .checked_pow(u32::try_from(fraction.len()).map_err(|_| overflow())?)
                .ok_or_else(overflow)?;
            let numerator: u128 = fraction.parse().map_err(|_| overflow())?;
            let part = numerator.checked_mul(per_unit).ok_or_else(overflow)?;
            if part % scale != 0 {
                return Err(format!(
                    "{whole}.{fraction}{unit} is finer than a nanosecond"
                ));
            }
            nanos = nanos.checked_add(part / scale).ok_or_else(overflow)?;
        }
        total = total.checked_add(nanos).ok_or_else(overflow)?;
        rest = after.trim_start();
    }
    let secs = u64::try_from(total / NANOS_PER_SEC).map_err(|_| "it is too long".to_string())?;
    // The remainder of a division by 1e9 always fits.
    let subsec = u32::try_from(total % NANOS_PER_SEC).unwrap_or(0);
    Ok(Duration::new(secs, subsec))
}

impl FromStr for HumanDuration {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let trimmed = s.trim();
        parse(trimmed).map(Self).map_err(|e| {
            format!("{trimmed:?} is not a duration ({e}); write it like 300ms, 2s or 1m30s")
        })
    }
}

impl fmt::Display for HumanDuration {
    /// The compact form people type into YAML and the operator's CRD
    /// accepts: `1m30s`, `1h5m`, `2days3h`, `0s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (secs, nanos) = (self.0.as_secs(), self.0.subsec_nanos());
        if secs == 0 && nanos == 0 {
            return f.write_str("0s");
        }
        let (years, rest) = (secs / YEAR_SECS, secs % YEAR_SECS);
        let (months, rest) = (rest / MONTH_SECS, rest % MONTH_SECS);
        let (days, rest) = (rest / 86_400, rest % 86_400);
        // Calendar units are spelt out and pluralised, the rest are symbols.
        for (value, name) in [(years, "year"), (months, "month"), (days, "day")] {
            if value > 0 {
                write!(f, "{value}{name}{}", if value > 1 { "s" } else { "" })?;
            }
        }
        let parts = [
            (rest / 3_600, "h"),
            (rest % 3_600 / 60, "m"),
            (rest % 60, "s"),
            (u64::from(nanos / 1_000_000), "ms"),
            (u64::from(nanos / 1_000 % 1_000), "us"),
            (u64::from(nanos % 1_000), "ns"),
        ];
        for (value, unit) in parts {
            if value > 0 {
                write!(f, "{value}{unit}")?;
            }
        }
        Ok(())
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
    fn reads_and_prints_what_humantime_did() {
        let mut samples = vec![Duration::new(0, 1), Duration::new(90_061, 1_001_001)];
        for secs in [
            1, 59, 60, 61, 3_599, 3_600, 86_399, 86_400, 2_630_016, 31_557_601,
        ] {
            samples.push(Duration::from_secs(secs));
        }
        for ms in [1, 250, 999, 1_500, 60_250] {
            samples.push(Duration::from_millis(ms));
        }
        for d in samples {
            let theirs = humantime::format_duration(d).to_string();
            assert_eq!(HumanDuration(d).to_string(), theirs.replace(' ', ""));
            assert_eq!(parsed(&theirs), d, "{theirs}");
        }
        for text in [
            "1m30s",
            "1 min 30 sec",
            "2.5h",
            "1w",
            "3days",
            "1M",
            "1y",
            "0.5ms",
        ] {
            let theirs = humantime::parse_duration(text).expect(text);
            assert_eq!(parsed(text), theirs, "{text}");
        }
    }
}
